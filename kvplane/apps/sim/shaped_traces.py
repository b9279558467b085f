"""Mooncake-format traces of other shapes than the bundled conversation trace, for judging
routing on traffic its rules were not built on (docs/benchmarks.md, "Traces of other shapes").

    python -m kvplane.apps.sim.shaped_traces DIR [--seed N]

writes four files to DIR, one JSON object a line as the bundled trace (`timestamp` ms,
`input_length`, `output_length`, `hash_ids` of 512-token blocks, equal ids at equal positions a
shared prefix), shape k (in the order below) drawn with seed + k, so the same seed writes the
same files:

- toolagent.jsonl: agent sessions of 2-8 turns; each prompt is one of 12 tool definitions (4-8k
  tokens, Zipf-popular) then the session's growing history; 30-300 output tokens; a session
  starts every 4 s on average, its turns 1-15 s apart. Mostly cache hits.
- code.jsonl: bursty arrivals (gamma inter-arrival times, coefficient of variation 3, 8 req/s),
  log-normal prompts (median 2,000 tokens, at most 16,000) and outputs (median 25 tokens), 40 %
  of them opening with one of 5 system prompts. Few hits.
- longdoc.jsonl: long documents (8-32k tokens) at 0.7 req/s, 200-600 output tokens; a quarter
  are follow-up questions on one of the last 20 documents.
- bimodal.jsonl: 70 % short chat (200-800 tokens in, 50-300 out), 30 % long (6-8k in, 100-400
  out), half of them opening with one shared system prompt, 4 req/s.

These are shapes reported for production traffic (agents, coding assistants, long-context
reading, mixed chat), drawn here; they are not recordings.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Callable
from pathlib import Path

from kvplane.apps.bench.workload import TRACE_BLOCK_TOKENS as BLOCK_TOKENS
from kvplane.apps.bench.workload import read_trace


class _Blocks:
    """Fresh block ids: a new id is a block nobody shared before."""

    def __init__(self) -> None:
        self._next = 1

    def fresh(self, n: int) -> list[int]:
        out = list(range(self._next, self._next + n))
        self._next += n
        return out


def _line(at_s: float, hash_ids: list[int], input_length: int, output_length: int) -> dict:
    return {"timestamp": int(at_s * 1000), "input_length": input_length, "output_length": output_length, "hash_ids": hash_ids}


def _of_blocks(rng: random.Random, hash_ids: list[int]) -> int:
    """A prompt length whose last block is partly filled, as real prompts' are."""
    return len(hash_ids) * BLOCK_TOKENS - rng.randrange(BLOCK_TOKENS)


def toolagent(rng: random.Random, sessions: int = 260) -> list[dict]:
    ids = _Blocks()
    tools = [ids.fresh(rng.randint(8, 16)) for _ in range(12)]
    popularity = [1 / (i + 1) ** 1.1 for i in range(len(tools))]
    out, start = [], 0.0
    for _ in range(sessions):
        start += rng.expovariate(1 / 4.0)
        tool, history, at = rng.choices(tools, popularity)[0], [], start
        for _ in range(rng.randint(2, 8)):
            history += ids.fresh(rng.randint(1, 4))  # the user's turn and tool results
            prompt = tool + history
            out.append(_line(at, prompt, _of_blocks(rng, prompt), rng.randint(30, 300)))
            at += rng.uniform(1, 15)
            history += ids.fresh(1)  # the answer joins the history
    return out


def code(rng: random.Random, requests: int = 1500, rate: float = 8.0) -> list[dict]:
    ids = _Blocks()
    systems = [ids.fresh(rng.randint(2, 4)) for _ in range(5)]
    shape = 1 / 9  # gamma inter-arrival times with a coefficient of variation of 3
    out, at = [], 0.0
    for _ in range(requests):
        at += rng.gammavariate(shape, 1 / (rate * shape))
        tokens = min(16000, max(64, int(rng.lognormvariate(math.log(2000), 0.8))))
        blocks = ids.fresh(math.ceil(tokens / BLOCK_TOKENS))
        if rng.random() < 0.4:
            system = rng.choice(systems)[: len(blocks)]
            blocks = system + blocks[len(system) :]
        out.append(_line(at, blocks, tokens, min(500, max(2, int(rng.lognormvariate(math.log(25), 1.0))))))
    return out


def longdoc(rng: random.Random, requests: int = 800, rate: float = 0.7) -> list[dict]:
    ids = _Blocks()
    documents: list[list[int]] = []
    out, at = [], 0.0
    for _ in range(requests):
        at += rng.expovariate(rate)
        if documents and rng.random() < 0.25:
            document = rng.choice(documents[-20:])
        else:
            document = ids.fresh(rng.randint(16, 64))
            documents.append(document)
        prompt = document + ids.fresh(1)  # the question
        out.append(_line(at, prompt, _of_blocks(rng, prompt), rng.randint(200, 600)))
    return out


def bimodal(rng: random.Random, requests: int = 1500, rate: float = 4.0) -> list[dict]:
    ids = _Blocks()
    system = ids.fresh(2)
    out, at = [], 0.0
    for _ in range(requests):
        at += rng.expovariate(rate)
        if rng.random() < 0.7:
            tokens, output = rng.randint(200, 800), rng.randint(50, 300)
        else:
            tokens, output = rng.randint(6000, 8000), rng.randint(100, 400)
        blocks = ids.fresh(math.ceil(tokens / BLOCK_TOKENS))
        if rng.random() < 0.5:
            blocks = system[: len(blocks)] + blocks[len(system) :]
        out.append(_line(at, blocks, tokens, output))
    return out


SHAPES: dict[str, Callable[[random.Random], list[dict]]] = {
    "toolagent": toolagent,
    "code": code,
    "longdoc": longdoc,
    "bimodal": bimodal,
}


def write(directory: Path, seed: int = 0) -> dict[str, Path]:
    """Every shape's trace under `directory` (made if missing), in arrival order."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for k, (name, make) in enumerate(SHAPES.items()):
        lines = sorted(make(random.Random(seed + k)), key=lambda line: line["timestamp"])
        paths[name] = path = directory / f"{name}.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvplane.apps.sim.shaped_traces", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for path in write(args.directory, args.seed).values():
        records = read_trace(path)  # as `kvplane sim --trace` will read it
        mean_in = sum(r.input_length for r in records) / len(records)
        print(f"{path}: {len(records)} requests over {records[-1].timestamp_ms / 1000:.0f} s, {mean_in:.0f} tokens in on average")
    return 0


if __name__ == "__main__":
    sys.exit(main())
