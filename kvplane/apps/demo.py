"""`python -m kvplane.apps.demo` (or `make demo`): a local disaggregated cluster, shown working.

Starts a control plane (embedded store, disaggregation threshold 32 tokens) with one prefill
and one decode agent, sends prompts that share a long system prompt, and prints where each
ran, how much of its prompt was already cached, how many KV bytes moved, and its TTFT; then
sends the first prompt again through the OpenAI-compatible HTTP API.
The shared prefix is why later prompts find cached tokens.
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

import grpc

from kvplane.apps.cli.common import format_bytes, format_table
from kvplane.apps.cluster import ClusterError, LocalCluster
from kvplane.client import Client, GenerateResult
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
    parser = argparse.ArgumentParser(prog="python -m kvplane.apps.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--log-dir", default=None, help="keep the cluster's logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    print(f"starting a control plane, prefill-0 and decode-0 (disaggregation above {DISAGG_THRESHOLD} tokens) ...")
    started = time.monotonic()
    try:
        with LocalCluster(
            num_prefill=1, num_decode=1, store="memory",
            controlplane_args=("--disagg-threshold", str(DISAGG_THRESHOLD)), log_dir=args.log_dir, http_port=0,
        ) as cluster:  # fmt: skip
            print(f"cluster ready at {cluster.endpoint} (gRPC) and {cluster.http_url} (OpenAI-compatible HTTP) "
                  f"in {time.monotonic() - started:.1f} s\n")  # fmt: skip
            # One tenant for both faces (the HTTP token's), so the HTTP call finds the gRPC calls' cache.
            with Client(cluster.endpoint, timeout=120, token=cluster.http_token) as client:
                results = [client.generate(SYSTEM_PROMPT + q, max_tokens=MAX_TOKENS) for q in QUESTIONS]
            http_answer = http_completion(cluster.http_url, SYSTEM_PROMPT + QUESTIONS[0], cluster.http_token, cluster.http_ca)
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
    usage = http_answer["usage"]
    print(
        f"\nThe same first prompt through the HTTP API (POST /v1/completions): {usage['prompt_tokens']} prompt tokens, "
        f"{usage['prompt_tokens_details']['cached_tokens']} cached, decoded on {http_answer['kvplane']['decode_worker']}."
    )
    return 0


def http_completion(base_url: str, prompt: str, token: str, ca: str | bool = True) -> dict:
    """One OpenAI-style completion with the standard library's HTTP client, as the token's tenant,
    trusting `ca` (a CA file; True: the system's) for HTTPS."""
    body = json.dumps({"model": "", "prompt": prompt, "max_tokens": MAX_TOKENS}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    request = urllib.request.Request(f"{base_url}/completions", body, headers)
    try:
        context = ssl.create_default_context(cafile=ca if isinstance(ca, str) else None)
        with urllib.request.urlopen(request, timeout=120, context=context) as response:
            return json.load(response)
    except urllib.error.HTTPError as e:
        raise KvplaneError(grpc.StatusCode.UNKNOWN, f"HTTP {e.code}: {e.read().decode(errors='replace')}") from None


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
