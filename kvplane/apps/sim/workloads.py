"""Workloads for `kvplane sim` and `kvplane plan`, made from the benchmarks' own generators.

- trace: a Mooncake-format trace (the bundled one by default) at its real lengths and its own
  512-token prefix blocks (kvplane.apps.bench.workload.synthesize_prompt: equal hash ids give equal
  blocks), time divided by `speed`; prompts that do not fit the model's context lose tokens from
  the end, keeping their output;
- mix: `kvplane bench load`'s synthetic mix (shared system prompts, short and long user parts)
  with seeded Poisson arrivals at `rate` requests/s;
- chat, agent, rag: `kvplane bench prefix`'s workloads (a chat turn or agent step waits for the
  previous one to finish);
- closed: `concurrency` chains of requests from the mix, each sent when the previous one of its
  chain ends (a closed loop, for capacity);
- synthetic: fixed or ranged input/output lengths with a share of each prompt taken from one of a
  few shared prefixes, Poisson at `rate` (what `kvplane plan` describes a workload with).
Prompts are made when a request arrives, so an hour of trace never sits in memory.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvplane.apps.bench import workloads as prefix_workloads
from kvplane.apps.bench.workload import (
    TRACE_BLOCK_TOKENS,
    MixConfig,
    poisson_arrivals,
    read_trace,
    synthesize_prompt,
    synthetic_requests,
)
from kvplane.apps.sim.simulator import SimRequest

PREFIX_WORKLOADS = ("chat", "agent", "rag")
WORKLOADS = ("trace", "mix", *PREFIX_WORKLOADS, "synthetic")


def _fixed(prompt: Sequence[int]):
    return lambda: prompt


def trace(
    path: str | Path | None = None,
    *,
    speed: float = 1.0,
    duration_s: float | None = None,
    max_requests: int | None = None,
    max_context: int,
    vocab_size: int,
    salt: str = "kvplane-sim",
) -> list[SimRequest]:
    records = sorted(read_trace(path), key=lambda r: r.timestamp_ms)
    if not records:
        return []
    start = records[0].timestamp_ms
    out = []
    for r in records[: max_requests or None]:
        arrival = (r.timestamp_ms - start) / 1000.0 / speed
        if duration_s is not None and arrival >= duration_s:
            break
        output = max(1, min(r.output_length, max_context - 1))
        length = max(1, min(r.input_length, max_context - output))
        make = functools.partial(synthesize_prompt, r.hash_ids, length, TRACE_BLOCK_TOKENS, vocab_size, salt=salt)
        out.append(SimRequest(arrival, length, output, make))
    return out


def mix(rate: float, duration_s: float, seed: int, config: MixConfig | None = None) -> list[SimRequest]:
    rng = random.Random(f"{seed}:mix:{rate}")
    specs = synthetic_requests(poisson_arrivals(rate, duration_s, rng), config or MixConfig(), rng)
    return [SimRequest(s.arrival_s, len(s.prompt), s.max_tokens, _fixed(s.prompt), s.priority) for s in specs]


def prefix(name: str, seed: int) -> list[SimRequest]:
    if name not in PREFIX_WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    requests = getattr(prefix_workloads, name)(seed)
    return [SimRequest(r.arrival_s, len(r.prompt), r.max_tokens, _fixed(r.prompt), after=r.after) for r in requests]


def closed(concurrency: int, per_chain: int, seed: int, config: MixConfig | None = None) -> list[SimRequest]:
    """`concurrency` chains of `per_chain` requests, each waiting for the previous of its chain."""
    pool = mix(1000.0, concurrency * per_chain / 1000.0 + 1.0, seed, config)
    out: list[SimRequest] = []
    for c in range(concurrency):
        for k in range(per_chain):
            s = pool[(c * per_chain + k) % len(pool)]
            out.append(SimRequest(0.0, s.num_prompt_tokens, s.max_tokens, s.make_prompt, s.priority, len(out) - 1 if k else -1))
    return out


@dataclass(frozen=True, slots=True)
class SyntheticSpec:
    """A workload described by numbers: input and output lengths (inclusive ranges; a fixed length
    is (n, n)) and the share of each prompt that is one of `num_prefixes` shared prefixes."""

    input_tokens: tuple[int, int] = (1024, 1024)
    output_tokens: tuple[int, int] = (128, 128)
    prefix_share: float = 0.0
    num_prefixes: int = 4

    def validate(self) -> SyntheticSpec:
        for name in ("input_tokens", "output_tokens"):
            low, high = getattr(self, name)
            if not 0 < low <= high:
                raise ValueError(f"{name.replace('_', ' ')} must be a range 0 < low <= high, got {low}-{high}")
        if not 0 <= self.prefix_share < 1:
            raise ValueError(f"the prefix share must be in [0, 1), got {self.prefix_share}")
        if self.num_prefixes < 1:
            raise ValueError(f"num_prefixes must be at least 1, got {self.num_prefixes}")
        return self

    def check_fits(self, model: str, max_context: int) -> SyntheticSpec:
        """ValueError unless the longest prompt plus the longest output fits the model's context
        (the engine refuses such a request, so every simulated one would fail)."""
        longest = self.input_tokens[1] + self.output_tokens[1]
        if longest > max_context:
            raise ValueError(
                f"{self.input_tokens[1]} prompt + {self.output_tokens[1]} output tokens exceed {model}'s context of "
                f"{max_context} tokens; shorten them or pick a longer-context model (e.g. --sim-model llama-3.1-70b)"
            )
        return self


def synthetic(spec: SyntheticSpec, rate: float, duration_s: float, seed: int, vocab_size: int) -> list[SimRequest]:
    spec.validate()
    rng = random.Random(f"{seed}:synthetic:{rate}")
    prefix_rng = random.Random(f"{seed}:prefixes")
    longest = int(spec.input_tokens[1] * spec.prefix_share)
    prefixes = [tuple(prefix_rng.randrange(1, vocab_size) for _ in range(longest)) for _ in range(spec.num_prefixes)]
    out = []
    for arrival in poisson_arrivals(rate, duration_s, rng):
        n = rng.randint(*spec.input_tokens)
        shared = int(n * spec.prefix_share)
        head = prefixes[rng.randrange(spec.num_prefixes)][:shared]
        tail_seed = rng.getrandbits(64)
        output = rng.randint(*spec.output_tokens)
        out.append(SimRequest(arrival, n, output, functools.partial(_prompt, head, n - shared, tail_seed, vocab_size)))
    return out


def _prompt(head: tuple[int, ...], num_tail: int, seed: int, vocab_size: int) -> tuple[int, ...]:
    """The shared head, then num_tail tokens of the request's own (one block keyed by its seed)."""
    return head + synthesize_prompt((seed,), num_tail, max(num_tail, 1), vocab_size, salt="kvplane-synthetic")
