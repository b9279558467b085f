"""`python -m kvplane.demo` (or `make demo`): a local disaggregated cluster, shown working.

Starts a control plane (embedded store, disaggregation threshold 32 tokens) with one prefill
and one decode agent, sends prompts that share a long system prompt, and prints where each
ran, how much of its prompt was already cached, how many KV bytes moved, and its TTFT.
The shared prefix is why later prompts find cached tokens.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from kvplane.cli.common import format_bytes, format_table
from kvplane.client import Client, GenerateResult
from kvplane.cluster import ClusterError, LocalCluster
from kvplane.errors import KvplaneError

SYSTEM_PROMPT = (
    "You are the on-call assistant of a small observatory. Answer in one short paragraph, "
    "cite the instrument log when it matters, prefer metric units, and say plainly when you "
    "do not know. The telescope is a 60 cm reflector on an equatorial mount; the dome opens "
    "when humidity is under 80 percent and wind is under 40 km/h.\n\n"
)
QUESTIONS = (
    "Can we open the dome tonight?",
    "What focal length should I expect?",
    "How do I park the mount safely?",
    "Why is the guide star drifting east?",
)
MAX_TOKENS = 24
DISAGG_THRESHOLD = 32


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvplane.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--log-dir", default=None, help="keep the cluster's logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    print(f"starting a control plane, prefill-0 and decode-0 (disaggregation above {DISAGG_THRESHOLD} tokens) ...")
    started = time.monotonic()
    try:
        with LocalCluster(
            num_prefill=1, num_decode=1, store="memory",
            controlplane_args=("--disagg-threshold", str(DISAGG_THRESHOLD)), log_dir=args.log_dir,
        ) as cluster:  # fmt: skip
            print(f"cluster ready at {cluster.endpoint} in {time.monotonic() - started:.1f} s\n")
            with Client(cluster.endpoint, timeout=120) as client:
                results = [client.generate(SYSTEM_PROMPT + q, max_tokens=MAX_TOKENS) for q in QUESTIONS]
    except ClusterError as e:
        print(f"demo failed: the local cluster did not start: {e}", file=sys.stderr)
        return 1
    except KvplaneError as e:
        print(f"demo failed: a request failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("demo interrupted; the cluster was stopped", file=sys.stderr)
        return 130
    print_report(results)
    return 0


def print_report(results: Sequence[GenerateResult]) -> None:
    rows = []
    for number, result in enumerate(results, start=1):
        m = result.metrics
        rows.append((
            number, m.prefill_worker or f"{m.decode_worker} (local)", m.decode_worker, m.prompt_tokens,
            m.cached_tokens, format_bytes(m.kv_transfer_bytes), f"{m.ttft_ms:.1f}",
        ))  # fmt: skip
    print(f"{len(results)} prompts sharing a {len(SYSTEM_PROMPT)}-character system prompt, {MAX_TOKENS} tokens each:\n")
    print(format_table(("#", "PREFILL", "DECODE", "PROMPT TOK", "CACHED TOK", "KV MOVED", "TTFT MS"), rows))
    reused = [r.metrics.cached_tokens for r in results[1:]]
    if reused and min(reused) > 0:
        print(
            f"\nPrompts 2-{len(results)} found {min(reused)}+ tokens (the shared system prompt) already cached on "
            "the decode worker, so only their new tokens were prefilled and moved."
        )
    print("\nGenerated text (the built-in tiny model is not a trained language model, so the text is gibberish):")
    for number, (question, result) in enumerate(zip(QUESTIONS, results), start=1):
        print(f"  {number}. {question}\n     -> {result.text!r}")


if __name__ == "__main__":
    sys.exit(main())
