"""Disaggregation through vLLM's own NixlConnector: the messages kvplane exchanges (pure).

vLLM's protocol (both servers started with --kv-transfer-config '{"kv_connector":"NixlConnector",
"kv_role":"kv_both"}'): the prefill server gets the request with `max_tokens` 1 and
`kv_transfer_params` {"do_remote_decode": true}; it computes the prompt's KV, keeps the blocks,
and its response carries `kv_transfer_params` naming them (remote_engine_id, remote_block_ids,
remote_host, remote_port, ...). The decode server gets the request with exactly those
`kv_transfer_params`: its connector reads the blocks over NIXL from the prefill server, then it
decodes. kvplane's part: the decode agent asks the prefill agent (Agent.Prefill), whose adapter
makes the first call and returns the params as the handoff; the decode agent's adapter passes
them to the second. The handoff is the params as JSON, unchanged.
"""

from __future__ import annotations

import json

from kvplane.dataplane.engines.base import NativeHandoff
from kvplane.dataplane.engines.request import EngineInputError, EngineRequest
from kvplane.dataplane.engines.vllm.api import ApiError, completion_body

TRANSPORT = "engine:vllm-nixl"
# What the decode side's connector needs from the prefill side's response.
REQUIRED_PARAMS = ("remote_engine_id", "remote_block_ids", "remote_host", "remote_port")


def prefill_body(request: EngineRequest, model: str, cache_salt: str = "") -> dict:
    body = completion_body(request, model, stream=False, cache_salt=cache_salt)
    body["max_tokens"] = 1
    body["kv_transfer_params"] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    return body


def handoff_from_response(response: dict, num_prompt_tokens: int) -> NativeHandoff:
    """The handoff in the prefill server's (non-streamed) completion response."""
    params = response.get("kv_transfer_params")
    if not isinstance(params, dict):
        raise ApiError("the prefill response has no kv_transfer_params: is the server running NixlConnector (--kv-transfer-config)?")
    missing = [k for k in REQUIRED_PARAMS if params.get(k) is None]
    if missing:
        raise ApiError(f"the prefill response's kv_transfer_params lack {missing}")
    usage = response.get("usage") or {}
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return NativeHandoff(
        transport=TRANSPORT,
        params=json.dumps(params, sort_keys=True).encode(),
        num_prompt_tokens=int(usage.get("prompt_tokens") or num_prompt_tokens),
        num_cached_tokens=cached,
        num_blocks=count_blocks(params["remote_block_ids"]),
    )


def count_blocks(block_ids: object) -> int:
    """remote_block_ids is a list of ids, or one list per KV-cache group (newer vLLM)."""
    if isinstance(block_ids, list) and block_ids and isinstance(block_ids[0], list):
        return len(block_ids[0])
    return len(block_ids) if isinstance(block_ids, list) else 0


def decode_params(handoff: bytes) -> dict:
    """The kv_transfer_params for the decode server's request; EngineInputError if malformed."""
    try:
        params = json.loads(handoff)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise EngineInputError(f"the KV handoff is not vLLM kv_transfer_params JSON: {e}") from None
    if not isinstance(params, dict) or any(params.get(k) is None for k in REQUIRED_PARAMS):
        raise EngineInputError(f"the KV handoff lacks the vLLM kv_transfer_params {list(REQUIRED_PARAMS)}")
    return params
