"""Protocol messages to engine types."""

from __future__ import annotations

from kvplane.dataplane.engines.request import SamplingParams
from kvplane.sampling import effective_temperature
from kvplane.v1 import common_pb2


def sampling_from_pb(msg: common_pb2.SamplingParams) -> SamplingParams:
    return SamplingParams(
        max_tokens=msg.max_tokens,
        temperature=effective_temperature(msg.temperature),
        top_p=msg.top_p if msg.top_p > 0 else 1.0,
        top_k=msg.top_k,
        seed=msg.seed if msg.HasField("seed") else None,
        stop_token_ids=tuple(msg.stop_token_ids),
        ignore_eos=msg.ignore_eos,
    )
