"""SGLang's gRPC scheduler API, as kvplane uses it (pure: builds and reads messages).

The service is `sglang.grpc.scheduler.SglangScheduler`, what `python -m sglang.launch_server
--smg-grpc-mode` serves; its Python stubs come from the published smg-grpc-proto package (pinned
to the version SGLang 0.5.23 installs). Generate takes token ids and streams chunks (new token
ids, prompt and cached token counts), then one Complete (finish reason, matched stop token) that
repeats the last chunk's tokens, so tokens are read from chunks only. Refusals end the stream
with a gRPC status. Finish reasons: "length"; "stop" with the matched token an end-of-sequence id
of the model (GetModelInfo.eos_token_ids) and not one the request asked to stop on is "eos";
"abort". GetServerInfo's server_args give the page size (kvplane's block size), the KV dtype,
the scheduler limits and the disaggregation mode, backend and bootstrap port.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from google.protobuf.json_format import MessageToDict

from kvplane.dataplane.engines.request import EngineRequest


@dataclass(frozen=True, slots=True)
class ServerArgs:
    page_size: int
    kv_cache_dtype: str
    context_length: int  # 0 = the model's
    max_running_requests: int
    chunked_prefill_size: int
    max_total_num_tokens: int
    disaggregation_mode: str  # "null" | "prefill" | "decode"
    disaggregation_transfer_backend: str  # "mooncake" | "nixl" | ...
    disaggregation_bootstrap_port: int


def server_args(server_info) -> ServerArgs:
    args = MessageToDict(server_info.server_args) if server_info.HasField("server_args") else {}

    def number(name: str) -> int:
        value = args.get(name)
        return int(value) if isinstance(value, int | float) else 0

    return ServerArgs(
        page_size=number("page_size") or 1,
        kv_cache_dtype=str(args.get("kv_cache_dtype") or "auto"),
        context_length=number("context_length"),
        max_running_requests=number("max_running_requests"),
        chunked_prefill_size=max(number("chunked_prefill_size"), 0),
        max_total_num_tokens=int(server_info.max_total_num_tokens) or number("max_total_tokens"),
        disaggregation_mode=str(args.get("disaggregation_mode") or "null"),
        disaggregation_transfer_backend=str(args.get("disaggregation_transfer_backend") or ""),
        disaggregation_bootstrap_port=number("disaggregation_bootstrap_port"),
    )


def generate_request(pb, request: EngineRequest, disaggregated: dict | None = None):
    """The GenerateRequest for `request` (pb: smg_grpc_proto's sglang_scheduler_pb2)."""
    sampling = request.sampling
    params = pb.SamplingParams(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,  # 0 = off, as in kvplane (the servicer maps an unset 0 to -1)
        max_new_tokens=sampling.max_tokens,
        stop_token_ids=list(sampling.stop_token_ids),
        ignore_eos=sampling.ignore_eos,
        no_stop_trim=True,
    )
    message = pb.GenerateRequest(
        request_id=request.request_id,
        tokenized=pb.TokenizedInput(input_ids=list(request.prompt_token_ids)),
        sampling_params=params,
        stream=True,
    )
    if disaggregated is not None:
        message.disaggregated_params.CopyFrom(pb.DisaggregatedParams(**disaggregated))
    return message


@dataclass(slots=True)
class Chunk:
    token_ids: list[int]
    num_prompt_tokens: int
    num_cached_tokens: int
    finish_reason: str | None = None  # set on the Complete only


def read_response(response, eos_token_ids: Sequence[int], stop_token_ids: Sequence[int]) -> Chunk:
    kind = response.WhichOneof("response")
    if kind == "chunk":
        c = response.chunk
        return Chunk(list(c.token_ids), c.prompt_tokens, c.cached_tokens)
    if kind == "complete":
        c = response.complete
        return Chunk([], c.prompt_tokens, c.cached_tokens, finish_reason(c, eos_token_ids, stop_token_ids))
    raise ValueError(f"a GenerateResponse with neither chunk nor complete: {response}")


def finish_reason(complete, eos_token_ids: Sequence[int], stop_token_ids: Sequence[int]) -> str:
    reason = complete.finish_reason
    if reason in ("length", "abort"):
        return reason
    if reason == "stop":
        matched = complete.matched_token_id if complete.WhichOneof("matched_stop") == "matched_token_id" else None
        if matched is not None and matched in eos_token_ids and matched not in stop_token_ids:
            return "eos"
        return "stop"
    return "error"


def used_blocks(loads_response, page_size: int) -> tuple[int, int, int]:
    """(running, waiting, used KV blocks) summed over the server's data-parallel ranks."""
    running = waiting = used_tokens = 0
    for load in loads_response.loads:
        running += load.num_running_reqs
        waiting += load.num_waiting_reqs
        used_tokens += load.num_used_tokens
    return running, waiting, -(-used_tokens // page_size)
