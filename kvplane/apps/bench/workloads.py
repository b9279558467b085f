"""Workloads of `kvplane bench prefix`: seeded request streams with known prefix sharing.

Token ids are drawn from [1, 255] (the builtin byte model's vocabulary) by seeded generators; a
"segment" is a fixed run of ids drawn once, so equal segments give equal blocks and different
ones differ. Sizes fit the 2-core development machine (a full run of 4 workloads x 4 policies
in about 15 minutes) and the builtin model's 2,048-token context:

- chat: 16 sessions x 6 turns. Every prompt starts with one 64-token system prompt; each turn
  appends the previous turn's 16-token answer and a 32-96-token user message to the session's
  history. Sessions start 0.5 s apart; a turn follows 1.0-2.5 s after the previous one was sent.
- agent: 4 agent types, each with a 640-token system prompt + tool list; 24 tasks (6 per type,
  round robin), each 5 steps; a step appends a 48-token tool result. Tasks start 0.4 s apart,
  steps follow 0.6-1.2 s apart.
- rag: 40 documents of 160 tokens; 120 queries 0.15 s apart, each = a 32-token instruction +
  3 distinct documents drawn by Zipf(1.1) popularity (most relevant first) + a 24-token question.
- trace: a Mooncake-format trace, the bundled one by default (timestamp ms, input_length,
  output_length, hash_ids of 512-token blocks), read and synthesised (ids in [0, 255], one
  block per hash id) by kvplane.apps.bench.workload as `kvplane bench load` does. Lengths and the
  block are scaled by 1/`token_scale` (512 -> 16 tokens: the engine's block), time by
  1/`time_scale`; the first `num_requests` requests; prompts are capped at
  `max_prompt_tokens` and answers at `max_output_tokens`. Equal hash ids give equal token blocks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from kvplane.apps.bench.workload import TRACE_BLOCK_TOKENS, read_trace, synthesize_prompt

VOCAB = (1, 255)


@dataclass(frozen=True, slots=True)
class BenchRequest:
    arrival_s: float
    prompt: tuple[int, ...]
    max_tokens: int
    after: int = -1  # index of a request that must finish first (the previous turn), or -1


def _segment(rng: random.Random, n: int) -> list[int]:
    return [rng.randint(*VOCAB) for _ in range(n)]


def chat(seed: int = 0) -> list[BenchRequest]:
    rng = random.Random(seed)
    system = _segment(rng, 64)
    out: list[BenchRequest] = []
    for s in range(16):
        history = list(system)
        t = s * 0.5
        previous = -1
        for _ in range(6):
            history += _segment(rng, rng.randint(32, 96))
            out.append(BenchRequest(t, tuple(history), 16, previous))
            previous = len(out) - 1
            history += _segment(rng, 16)  # the answer, as the client would send it back
            t += rng.uniform(1.0, 2.5)
    return out


def agent(seed: int = 0) -> list[BenchRequest]:
    rng = random.Random(seed)
    systems = [_segment(rng, 640) for _ in range(4)]
    out: list[BenchRequest] = []
    for task in range(24):
        context = systems[task % 4] + _segment(rng, 40)
        t = task * 0.4
        previous = -1
        for _ in range(5):
            out.append(BenchRequest(t, tuple(context), 16, previous))
            previous = len(out) - 1
            context += _segment(rng, 16) + _segment(rng, 48)  # the call it made, then the tool's result
            t += rng.uniform(0.6, 1.2)
    return out


def rag(seed: int = 0) -> list[BenchRequest]:
    rng = random.Random(seed)
    instruction = _segment(rng, 32)
    docs = [_segment(rng, 160) for _ in range(40)]
    weights = [1 / (i + 1) ** 1.1 for i in range(len(docs))]
    out = []
    for q in range(120):
        chosen: list[int] = []
        while len(chosen) < 3:
            d = rng.choices(range(len(docs)), weights=weights)[0]
            if d not in chosen:
                chosen.append(d)
        prompt = instruction + [t for d in chosen for t in docs[d]] + _segment(rng, 24)
        out.append(BenchRequest(q * 0.15, tuple(prompt), 8))
    return out


def trace(
    path: str | Path | None = None,
    num_requests: int = 300,
    token_scale: int = 32,
    time_scale: float = 4.0,
    max_prompt_tokens: int = 1536,
    max_output_tokens: int = 16,
    seed: int = 0,
) -> list[BenchRequest]:
    """The first `num_requests` records of a Mooncake trace (the bundled one by default), scaled."""
    block = TRACE_BLOCK_TOKENS // token_scale
    if block * token_scale != TRACE_BLOCK_TOKENS:
        raise ValueError(f"token_scale must divide {TRACE_BLOCK_TOKENS}, got {token_scale}")
    out = []
    for r in read_trace(path)[:num_requests]:
        length = min(max(1, r.input_length // token_scale), max_prompt_tokens)
        prompt = synthesize_prompt(r.hash_ids, length, block, VOCAB[1] + 1, salt=f"bench-prefix:{seed}")
        max_tokens = min(max(1, r.output_length // token_scale), max_output_tokens)
        out.append(BenchRequest(r.timestamp_ms / 1000 / time_scale, prompt, max_tokens))
    return out


WORKLOADS = ("chat", "agent", "rag", "trace")
