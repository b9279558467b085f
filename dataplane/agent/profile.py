"""The latency profile: synthetic requests through the normal engine path, whose steps seed the
worker's step-time model (kvplane.latency).

Plan: prompts of random token ids under a cache salt of their own (nothing hits the prefix cache
except where the plan wants it):
  1. single prefills (max_tokens=1), one at a time, of lengths spread up to max_prompt_tokens,
     twice each, then a few prompts that extend an earlier one (a cached prefix, so the attention
     term sees context before the new tokens);
  2. decode batches of every size 1..max_batch, each request generating DECODE_TOKENS tokens
     (ignore_eos), their prompts short in odd batches and longer in even ones so that total
     context varies apart from batch size.
Prompts longer than the engine's max_num_batched_tokens prefill in chunks, as real ones do.
Defaults: max_prompt_tokens = min(1024, max_context / 2), max_batch = the engine's max_num_seqs.
On the builtin-tiny model on 2 CPU cores a default profile takes about 2 s.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from dataclasses import dataclass

from kvplane.dataplane.engines.base import EngineAdapter
from kvplane.dataplane.engines.request import EngineCapacityError, EngineInputError, EngineRequest, SamplingParams

DEFAULT_MAX_PROMPT_TOKENS = 1024
DECODE_TOKENS = 32
PREFILL_FRACTIONS = (1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 3 / 8, 1 / 2, 5 / 8, 3 / 4, 7 / 8, 1)
PREFILL_REPEATS = 2
EXTEND_FRACTIONS = ((1 / 4, 1 / 4), (1 / 2, 1 / 4), (1 / 4, 3 / 4))  # (cached prefix, new tokens) of max_prompt


class ProfileError(RuntimeError):
    """A synthetic request failed; the profile is incomplete."""


@dataclass(frozen=True, slots=True)
class Plan:
    max_prompt_tokens: int
    max_batch: int
    decode_tokens: int
    decode_prompt_tokens: int  # longest decode-batch prompt: the whole batch fits in the pool
    vocab_size: int
    cache_salt: str
    seed: int


def plan(engine: EngineAdapter, max_prompt_tokens: int = 0, max_batch: int = 0) -> Plan:
    """The profile's shape for this engine; requested sizes are capped at what the engine can run."""
    info = engine.info
    block_size = info.layout.block_size
    capacity = engine.load().num_total_blocks * block_size - block_size
    max_prompt = max_prompt_tokens or min(DEFAULT_MAX_PROMPT_TOKENS, info.max_context // 2)
    max_prompt = max(1, min(max_prompt, info.max_context - 1, capacity))
    batch = max(1, min(max_batch or info.max_num_seqs, info.max_num_seqs))
    decode_tokens = max(1, min(DECODE_TOKENS, info.max_tokens_limit))
    per_request = capacity // batch - decode_tokens - block_size
    decode_prompt = max(1, min(max_prompt // 2, per_request, info.max_context - decode_tokens))
    return Plan(
        max_prompt, batch, decode_tokens, decode_prompt, info.vocab_size, f"kvplane-profile-{uuid.uuid4().hex}", random.getrandbits(32)
    )


async def _run_batch(engine: EngineAdapter, requests: list[EngineRequest]) -> None:
    """Submits the requests together and waits until all have finished."""
    streams = []
    try:
        for r in requests:
            streams.append((r.request_id, await engine.generate(r)))
        for request_id, stream in streams:
            async for out in stream:
                if out.finished and (out.error or out.finish_reason == "abort"):
                    raise ProfileError(f"profile request {request_id} failed: {out.error or 'aborted'}")
        streams = []
    except (EngineInputError, EngineCapacityError) as e:
        raise ProfileError(f"the engine refused a profile request: {e}") from None
    finally:
        for request_id, _ in streams:  # cancelled or failed: stop spending compute on the rest
            engine.abort(request_id)


class _Requests:
    def __init__(self, p: Plan, tag: str) -> None:
        self._p = p
        self._tag = tag
        self._rng = random.Random(f"{p.seed}-{tag}")
        self._n = 0

    def tokens(self, n: int) -> list[int]:
        return [self._rng.randrange(self._p.vocab_size) for _ in range(n)]

    def make(self, prompt: list[int], max_tokens: int, ignore_eos: bool = False) -> EngineRequest:
        self._n += 1
        return EngineRequest(
            request_id=f"{self._p.cache_salt}-{self._tag}{self._n}",
            prompt_token_ids=prompt,
            sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, seed=0),
            cache_salt=self._p.cache_salt,
        )


async def warm_up(engine: EngineAdapter, p: Plan) -> None:
    """One short request first: the first steps after start pay one-off costs a model should not learn."""
    requests = _Requests(p, "warm")
    await _run_batch(engine, [requests.make(requests.tokens(min(32, p.max_prompt_tokens)), min(2, p.decode_tokens))])


async def run(engine: EngineAdapter, p: Plan) -> None:
    requests = _Requests(p, "")
    lengths = sorted({max(1, round(p.max_prompt_tokens * f)) for f in PREFILL_FRACTIONS})
    for _ in range(PREFILL_REPEATS):
        for n in lengths:
            await _run_batch(engine, [requests.make(requests.tokens(n), 1)])
    for prefix_f, new_f in EXTEND_FRACTIONS:
        prefix = requests.tokens(max(1, round(p.max_prompt_tokens * prefix_f)))
        new = max(1, min(round(p.max_prompt_tokens * new_f), p.max_prompt_tokens - len(prefix)))
        await _run_batch(engine, [requests.make(prefix, 1)])
        await _run_batch(engine, [requests.make(prefix + requests.tokens(new), 1)])
    rng = random.Random(p.seed + 1)
    for b in range(1, p.max_batch + 1):
        hi = p.decode_prompt_tokens if b % 2 == 0 else max(1, p.decode_prompt_tokens // 8)
        batch = [requests.make(requests.tokens(rng.randint(max(1, hi // 2), hi)), p.decode_tokens, ignore_eos=True) for _ in range(b)]
        await _run_batch(engine, batch)
        await asyncio.sleep(0)
