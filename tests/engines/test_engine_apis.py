"""The vLLM and SGLang adapters' message logic against recorded messages: generate requests,
streamed chunks, finish reasons, load, and the disaggregation handoffs of both engines' own
connectors (vLLM NixlConnector's kv_transfer_params, SGLang's bootstrap host/port/room)."""

from __future__ import annotations

import json
import random

import pytest
from smg_grpc_proto import sglang_scheduler_pb2 as pb

from kvplane.dataplane.engines.request import EngineInputError, EngineRequest, SamplingParams
from kvplane.dataplane.engines.sglang import api as sglang_api
from kvplane.dataplane.engines.sglang import bootstrap
from kvplane.dataplane.engines.vllm import api as vllm_api
from kvplane.dataplane.engines.vllm import nixl
from tests.engines.recorded import PROMPT, VLLM_METRICS, VLLM_SSE


def request(**sampling) -> EngineRequest:
    return EngineRequest("r1", PROMPT, SamplingParams(**sampling), cache_salt="tenant")


def test_vllm_completion_body():
    body = vllm_api.completion_body(request(max_tokens=4, top_k=5, seed=7, stop_token_ids=(2,)), "tiny", stream=True, cache_salt="kv-alias")
    assert body == {
        "model": "tiny", "prompt": PROMPT, "max_tokens": 4, "temperature": 0.0, "top_p": 1.0, "ignore_eos": False,
        "stream": True, "return_token_ids": True, "stream_options": {"include_usage": True}, "top_k": 5, "seed": 7,
        "stop_token_ids": [2], "cache_salt": "kv-alias",
    }  # fmt: skip
    assert "top_k" not in vllm_api.completion_body(request(), "tiny", stream=False)  # 0 = off: not sent


def test_vllm_recorded_stream():
    chunks = [c for c in map(vllm_api.parse_sse_line, VLLM_SSE) if c is not None]
    assert [c.token_ids for c in chunks] == [[304], [204, 164], [80], [], []]
    assert chunks[2].finish_reason == "length"
    assert (chunks[3].num_prompt_tokens, chunks[3].num_cached_tokens) == (70, 64)
    assert chunks[4].done


def test_vllm_finish_reasons_and_errors():
    assert vllm_api.finish_reason("stop", None) == "eos"
    assert vllm_api.finish_reason("stop", 2) == "stop"
    assert vllm_api.finish_reason("length", None) == "length"
    error = vllm_api.parse_sse_line('data: {"error": {"message": "boom", "code": 500}}')
    assert (error.finish_reason, error.error) == ("error", "boom")
    with pytest.raises(vllm_api.ApiError, match="no token_ids"):
        vllm_api.parse_sse_line('data: {"choices": [{"text": "x", "finish_reason": null}]}')
    assert vllm_api.error_message(400, b'{"error": {"message": "too long"}}') == "HTTP 400: too long"


def test_vllm_recorded_metrics():
    m = vllm_api.parse_metrics(VLLM_METRICS)
    assert (m.num_running, m.num_waiting, m.block_size, m.num_total_blocks, m.cache_dtype, m.prefix_caching) == (
        0, 0, 32, 15780, "auto", True,
    )  # fmt: skip
    with pytest.raises(vllm_api.ApiError, match="no vllm:cache_config_info"):
        vllm_api.parse_metrics("up 1\n")


# What vLLM 0.32.0's NixlConnector returns from a prefill with do_remote_decode (the fields its
# request_finished builds: dict(do_remote_prefill=True, do_remote_decode=False, remote_block_ids,
# remote_engine_id, remote_request_id, remote_host, remote_port, tp_size)).
VLLM_PREFILL_RESPONSE = {
    "id": "cmpl-r1",
    "object": "text_completion",
    "model": "tiny",
    "choices": [{"index": 0, "text": "c", "token_ids": [304], "finish_reason": "length", "stop_reason": None}],
    "usage": {"prompt_tokens": 70, "total_tokens": 71, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 32}},
    "kv_transfer_params": {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [[11, 12, 13]],
        "remote_engine_id": "9c1f0e6a-engine",
        "remote_request_id": "cmpl-r1-0",
        "remote_host": "10.0.0.5",
        "remote_port": 5600,
        "tp_size": 1,
    },  # fmt: skip
}


def test_vllm_nixl_handoff_round_trip():
    body = nixl.prefill_body(request(max_tokens=8), "tiny")
    assert body["max_tokens"] == 1 and body["stream"] is False
    assert body["kv_transfer_params"]["do_remote_decode"] is True and body["kv_transfer_params"]["do_remote_prefill"] is False
    handoff = nixl.handoff_from_response(VLLM_PREFILL_RESPONSE, len(PROMPT))
    assert (handoff.transport, handoff.num_prompt_tokens, handoff.num_cached_tokens, handoff.num_blocks) == (
        "engine:vllm-nixl", 70, 32, 3,
    )  # fmt: skip
    # The decode side's request carries exactly the prefill side's params.
    assert nixl.decode_params(handoff.params) == VLLM_PREFILL_RESPONSE["kv_transfer_params"]


def test_vllm_nixl_refuses_what_it_cannot_use():
    with pytest.raises(vllm_api.ApiError, match="no kv_transfer_params"):
        nixl.handoff_from_response({"choices": []}, 3)
    with pytest.raises(vllm_api.ApiError, match=r"lack \['remote_host'\]"):
        params = dict(VLLM_PREFILL_RESPONSE["kv_transfer_params"], remote_host=None)
        nixl.handoff_from_response(dict(VLLM_PREFILL_RESPONSE, kv_transfer_params=params), 3)
    with pytest.raises(EngineInputError, match="not vLLM kv_transfer_params JSON"):
        nixl.decode_params(b"{nope")
    with pytest.raises(EngineInputError, match="lacks the vLLM kv_transfer_params"):
        nixl.decode_params(json.dumps({"remote_host": "h"}).encode())
    assert nixl.count_blocks([1, 2]) == 2


def test_sglang_generate_request_and_bootstrap_handoff():
    handoff = bootstrap.new_handoff("10.0.0.7", 8998, random.Random(0))
    params = bootstrap.decode(bootstrap.encode(handoff))
    assert params["bootstrap_host"] == "10.0.0.7" and params["bootstrap_port"] == 8998 and 0 <= params["bootstrap_room"] < 2**31
    message = sglang_api.generate_request(pb, request(max_tokens=4, stop_token_ids=(2,)), params)
    assert list(message.tokenized.input_ids) == PROMPT and message.stream
    assert (message.sampling_params.max_new_tokens, list(message.sampling_params.stop_token_ids)) == (4, [2])
    # Both sides' requests name the same room: the decode side's is built from the handoff alone.
    assert message.disaggregated_params.bootstrap_room == handoff["bootstrap_room"]
    assert message.disaggregated_params.bootstrap_host == "10.0.0.7" and message.disaggregated_params.bootstrap_port == 8998
    assert not sglang_api.generate_request(pb, request()).HasField("disaggregated_params")
    assert bootstrap.transport("mooncake") == "engine:sglang-mooncake"


@pytest.mark.parametrize(
    "bad",
    [b"[]", b"{}", b'{"bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": -1}', b"\xff"],
)
def test_sglang_bad_handoffs_are_refused(bad):
    with pytest.raises(EngineInputError):
        bootstrap.decode(bad)


def test_sglang_recorded_stream_and_finish_reasons():
    # The stream sglang 0.5.23 sent for PROMPT (max_new_tokens 5, the prefix cached the 2nd time).
    chunks = [pb.GenerateResponse(request_id="r1", chunk=pb.GenerateStreamChunk(token_ids=[t], prompt_tokens=70, completion_tokens=i + 1,
                                                                                 cached_tokens=64))
              for i, t in enumerate([304, 204, 164, 80, 266])]  # fmt: skip
    complete = pb.GenerateResponse(
        request_id="r1",
        complete=pb.GenerateComplete(output_ids=[266], finish_reason="length", prompt_tokens=70, completion_tokens=5, cached_tokens=64),
    )
    read = [sglang_api.read_response(m, eos_token_ids=(2,), stop_token_ids=()) for m in [*chunks, complete]]
    assert [t for c in read for t in c.token_ids] == [304, 204, 164, 80, 266]  # the Complete's repeat is not counted
    assert read[-1].finish_reason == "length" and read[-1].num_cached_tokens == 64

    def reason(**kw) -> str:
        return sglang_api.finish_reason(pb.GenerateComplete(finish_reason="stop", **kw), eos_token_ids=(2,), stop_token_ids=(7,))

    assert reason(matched_token_id=2) == "eos"
    assert reason(matched_token_id=7) == "stop"
    assert reason(matched_stop_str="END") == "stop"
