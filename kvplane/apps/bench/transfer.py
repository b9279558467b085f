"""`kvplane bench transfer`: KV-block transfer throughput between two agent processes, per transport.

For each transport, a local cluster of one prefill and one decode agent (the KV-heavy
`builtin-wide` model: 512 KiB per 16-token block in float32) serves disaggregated requests with
fresh prompts, so every full block crosses between the processes. Throughput is the bytes the
decode agent pulled over the time it spent pulling them (`kv_transfer_ms`, measured on the decode
agent from the first pull call to the blocks being in its prefix cache). Raw memcpy and a raw
loopback TCP socket between two processes move the same number of bytes in the same run, as the
ceilings to compare against.
"""

from __future__ import annotations

import argparse
import json
import random
import sys

ROW_ORDER = ("nixl", "grpc", "memcpy", "tcp")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--transports", default="", help="comma-separated transports to measure (default: all available)")
    parser.add_argument("--prompt-tokens", type=int, default=1024, help="tokens per request; full blocks move (default %(default)s)")
    parser.add_argument("--requests", type=int, default=6, help="measured requests per transport (default %(default)s)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured requests per transport first (default %(default)s)")
    parser.add_argument("--model", default="builtin-wide", help="agent model (default %(default)s)")
    parser.add_argument("--json", action="store_true", help='print {"rows": [{"transport", "bytes", "seconds", "gb_per_s"}]}')


def _prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(256) for _ in range(length)]


def measure_transport(transport: str, args: argparse.Namespace, log) -> tuple[int, float]:
    from kvplane import Client
    from kvplane.apps.cluster import LocalCluster

    block_tokens = 16
    blocks_per_request = args.prompt_tokens // block_tokens + 2
    num_blocks = max(256, 2 * blocks_per_request * (args.requests + args.warmup))
    agent_args = ("--model", args.model, "--transports", transport, "--num-blocks", str(num_blocks))
    rng = random.Random(0)
    total_bytes, total_s = 0, 0.0
    log(f"[{transport}] starting a prefill and a decode agent ...")
    with LocalCluster(num_prefill=1, num_decode=1, agent_args=agent_args) as cluster:
        with Client(cluster.endpoint, timeout=300) as client:
            for i in range(args.warmup + args.requests):
                result = client.generate(_prompt(rng, args.prompt_tokens), max_tokens=1, disagg="always")
                m = result.metrics
                if m.transport != transport or not m.kv_transfer_bytes:
                    raise RuntimeError(f"request {i} did not move KV over {transport}: {m}")
                if i >= args.warmup:
                    total_bytes += m.kv_transfer_bytes
                    total_s += m.kv_transfer_ms / 1000
            log(f"[{transport}] {total_bytes / 2**20:.0f} MiB in {total_s * 1000:.1f} ms")
    return total_bytes, total_s


def run(args: argparse.Namespace) -> int:
    from kvplane.apps.bench.baseline import measure_memcpy, measure_tcp
    from kvplane.dataplane.transport import available_transports

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    names = [t for t in args.transports.split(",") if t] or available_transports()
    missing = [t for t in names if t not in available_transports()]
    if missing:
        print(f"kvplane bench transfer: transports {missing} are not available here; available: {available_transports()}", file=sys.stderr)
        return 2
    rows = []
    for name in names:
        nbytes, seconds = measure_transport(name, args, log)
        rows.append({"transport": name, "bytes": nbytes, "seconds": seconds})
    # The baselines move as many bytes as the largest transport row, in as many pieces.
    nbytes = max(r["bytes"] for r in rows)
    repeats = max(args.requests, 1)
    for name, measure in (("memcpy", measure_memcpy), ("tcp", measure_tcp)):
        log(f"[{name}] measuring ...")
        moved, seconds = measure(nbytes // repeats, repeats)
        rows.append({"transport": name, "bytes": moved, "seconds": seconds})
    for row in rows:
        row["gb_per_s"] = row["bytes"] / row["seconds"] / 1e9 if row["seconds"] > 0 else 0.0
    rows.sort(key=lambda r: ROW_ORDER.index(r["transport"]) if r["transport"] in ROW_ORDER else len(ROW_ORDER))
    if args.json:
        print(json.dumps({"rows": rows}))
    else:
        tcp = next(r for r in rows if r["transport"] == "tcp")
        print(f"{'transport':<10} {'MiB':>8} {'seconds':>9} {'GB/s':>7} {'vs tcp':>7}")
        for r in rows:
            ratio = r["gb_per_s"] / tcp["gb_per_s"] if tcp["gb_per_s"] else 0.0
            print(f"{r['transport']:<10} {r['bytes'] / 2**20:>8.1f} {r['seconds']:>9.4f} {r['gb_per_s']:>7.2f} {ratio:>6.2f}x")
    return 0
