"""Workloads for `kvplane bench load`: seeded Poisson arrivals, a synthetic request mix, trace replay.

Plain Python (no grpc, no torch), so every rule here is tested exactly.

- Arrivals: an open-loop Poisson process: gaps are exponential with mean 1 / rate, drawn from
  one seeded `random.Random`, so a run's schedule is reproducible and does not depend on how
  fast the cluster answers (a closed loop would slow down with the server and hide overload).
- Synthetic mix (`MixConfig`): a few shared system prompts (prefix-cache hits), a short or long
  user part, and varied output lengths, the shape of chat traffic.
- Trace replay: the Mooncake trace format (one JSON object a line: `timestamp` ms, `input_length`,
  `output_length`, `hash_ids` of 512-token blocks). To fit a small CPU model, lengths AND the
  block size are divided by one factor (`length_scale`; 32 turns 512-token blocks into the
  engine's 16-token blocks) and time by another (`speed`). Token ids are synthesised per block
  from the block's hash id, so equal hash ids give equal blocks (the trace's prefix reuse is
  preserved) and different ids give different blocks.
"""

from __future__ import annotations

import array
import dataclasses
import gzip
import hashlib
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvplane.types import PRIORITIES

PRIORITY_INTERACTIVE, PRIORITY_BATCH = PRIORITIES  # the one definition, kvplane.types
TRACE_BLOCK_TOKENS = 512  # Mooncake's hash_ids cover 512 tokens each


@dataclass(frozen=True, slots=True)
class RequestSpec:
    arrival_s: float  # from the start of the run
    prompt: tuple[int, ...]
    max_tokens: int
    priority: str = PRIORITY_INTERACTIVE


def poisson_arrivals(rate_rps: float, duration_s: float, rng: random.Random) -> list[float]:
    """Arrival times in [0, duration_s) of a Poisson process of `rate_rps` (exponential gaps)."""
    if rate_rps <= 0 or duration_s <= 0:
        return []
    times: list[float] = []
    t = rng.expovariate(rate_rps)
    while t < duration_s:
        times.append(t)
        t += rng.expovariate(rate_rps)
    return times


@dataclass(frozen=True, slots=True)
class MixConfig:
    """The synthetic request mix; token counts are inclusive ranges."""

    num_system_prompts: int = 3
    system_tokens: tuple[int, int] = (192, 384)  # shared prefixes, cached after their first use
    short_user_tokens: tuple[int, int] = (16, 96)
    long_fraction: float = 0.25  # requests with a long, unshared document after the system prompt
    long_user_tokens: tuple[int, int] = (640, 1152)
    output_tokens: tuple[int, int] = (8, 96)  # drawn log-uniformly: many short answers, some long
    batch_fraction: float = 0.0  # requests sent with priority "batch"
    vocab_size: int = 256
    system_seed: int = 0  # the system prompts are the same in every draw from this mix

    def system_prompts(self) -> list[tuple[int, ...]]:
        rng = random.Random(f"kvplane-system-prompts:{self.system_seed}")
        return [_random_tokens(rng, rng.randint(*self.system_tokens), self.vocab_size) for _ in range(self.num_system_prompts)]

    def scaled(self, factor: float) -> MixConfig:
        """The same mix with every token count multiplied by `factor` (a bigger model's prompts)."""

        def scale(r: tuple[int, int]) -> tuple[int, int]:
            return max(1, round(r[0] * factor)), max(1, round(r[1] * factor))

        return dataclasses.replace(
            self, system_tokens=scale(self.system_tokens), short_user_tokens=scale(self.short_user_tokens),
            long_user_tokens=scale(self.long_user_tokens), output_tokens=scale(self.output_tokens),
        )  # fmt: skip

    def validate(self) -> MixConfig:
        for name in ("system_tokens", "short_user_tokens", "long_user_tokens", "output_tokens"):
            low, high = getattr(self, name)
            if not 0 < low <= high:
                raise ValueError(f"MixConfig.{name} must be a range 0 < low <= high, got {(low, high)}")
        for name in ("long_fraction", "batch_fraction"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"MixConfig.{name} must be in [0, 1], got {getattr(self, name)}")
        if self.num_system_prompts < 1 or self.vocab_size < 2:
            raise ValueError("MixConfig needs at least one system prompt and a vocabulary of 2 or more")
        return self


def synthetic_requests(arrivals: Sequence[float], mix: MixConfig, rng: random.Random) -> list[RequestSpec]:
    """One request per arrival time, drawn from `mix` with `rng` (the system prompts are the mix's own)."""
    mix.validate()
    systems = mix.system_prompts()
    requests = []
    for arrival in arrivals:
        system = systems[rng.randrange(len(systems))]
        user_range = mix.long_user_tokens if rng.random() < mix.long_fraction else mix.short_user_tokens
        user = _random_tokens(rng, rng.randint(*user_range), mix.vocab_size)
        low, high = mix.output_tokens
        max_tokens = min(high, int(low * (high / low) ** rng.random()))  # log-uniform in [low, high]
        priority = PRIORITY_BATCH if rng.random() < mix.batch_fraction else PRIORITY_INTERACTIVE
        requests.append(RequestSpec(arrival, system + user, max_tokens, priority))
    return requests


def _random_tokens(rng: random.Random, n: int, vocab_size: int) -> tuple[int, ...]:
    return tuple(rng.randrange(vocab_size) for _ in range(n))


# ---------------------------------------------------------------------------------------------
# Trace replay.


@dataclass(frozen=True, slots=True)
class TraceRecord:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


# The Mooncake conversation trace (FAST'25, Apache-2.0), bundled: see kvplane/apps/bench/data/README.md.
BUNDLED_TRACE = Path(__file__).parent / "data" / "mooncake_conversation.jsonl.gz"


def read_trace(path: str | Path | None = None) -> list[TraceRecord]:
    """The records of a Mooncake-format trace file (plain or .gz); the bundled trace by default."""
    path = Path(path) if path else BUNDLED_TRACE
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return parse_trace(f)
    except OSError as e:
        raise ValueError(f"cannot read trace {path}: {e}") from None


def parse_trace(lines: Iterable[str]) -> list[TraceRecord]:
    """Records of a Mooncake-format JSONL trace, in file order; blank lines are skipped."""
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            record = TraceRecord(
                timestamp_ms=float(raw["timestamp"]),
                input_length=int(raw["input_length"]),
                output_length=int(raw["output_length"]),
                hash_ids=tuple(int(h) for h in raw.get("hash_ids", ())),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"trace line {number} is not a Mooncake record: {e}") from None
        if record.input_length < 0 or record.output_length < 0 or record.timestamp_ms < 0:
            raise ValueError(f"trace line {number} has a negative length or timestamp")
        records.append(record)
    return records


@dataclass(frozen=True, slots=True)
class TraceScale:
    """How a trace is shrunk to fit: lengths and block size / length_scale, time / speed."""

    length_scale: float = 32.0
    speed: float = 1.0

    @property
    def block_tokens(self) -> int:
        return max(1, round(TRACE_BLOCK_TOKENS / self.length_scale))


def scale_length(length: int, length_scale: float) -> int:
    """A trace token count divided by the length factor, at least 1."""
    return max(1, round(length / length_scale))


def trace_requests(
    records: Sequence[TraceRecord],
    scale: TraceScale,
    *,
    max_context: int,
    duration_s: float | None = None,
    vocab_size: int = 256,
    salt: str = "kvplane-trace",
) -> tuple[list[RequestSpec], int]:
    """The scaled requests (arrivals relative to the first record) and how many were clipped.

    A scaled prompt plus its output that would not fit `max_context` keeps its output and loses
    prompt tokens from the end (it keeps its shared prefix). `duration_s` keeps only arrivals
    before it (after scaling).
    """
    if not records:
        return [], 0
    start = min(r.timestamp_ms for r in records)
    requests, clipped = [], 0
    for r in sorted(records, key=lambda r: r.timestamp_ms):
        arrival = (r.timestamp_ms - start) / 1000.0 / scale.speed
        if duration_s is not None and arrival >= duration_s:
            break
        output = min(scale_length(r.output_length, scale.length_scale), max_context - 1)
        prompt_len = scale_length(r.input_length, scale.length_scale)
        if prompt_len + output > max_context:
            prompt_len, clipped = max_context - output, clipped + 1
        prompt = synthesize_prompt(r.hash_ids, prompt_len, scale.block_tokens, vocab_size, salt=salt)
        requests.append(RequestSpec(arrival, prompt, output))
    return requests, clipped


def synthesize_prompt(
    hash_ids: Sequence[int], length: int, block_tokens: int, vocab_size: int, *, salt: str = "kvplane-trace"
) -> tuple[int, ...]:
    """`length` token ids: block i is a pure function of hash_ids[i] (and the salt).

    Equal hash ids give equal blocks and different ones give different blocks (with overwhelming
    probability: each block is drawn from a SHAKE-128 stream keyed by its id). A prompt longer than its
    hash ids cover continues with blocks that depend on all of its ids, so it shares nothing
    beyond them.
    """
    tokens: list[int] = []
    for h in hash_ids:
        if len(tokens) >= length:
            break
        tokens.extend(_block_tokens(f"{salt}:{h}", block_tokens, vocab_size))
    tail_key = f"{salt}:tail:{','.join(map(str, hash_ids))}"
    index = 0
    while len(tokens) < length:
        tokens.extend(_block_tokens(f"{tail_key}:{index}", block_tokens, vocab_size))
        index += 1
    return tuple(tokens[:length])


def _block_tokens(key: str, block_tokens: int, vocab_size: int) -> list[int]:
    """block_tokens ids drawn from a SHAKE-128 stream of the key (4 bytes per id, mod vocab_size)."""
    words = array.array("I", hashlib.shake_128(key.encode()).digest(4 * block_tokens))
    return [w % vocab_size for w in words]
