"""`kvplane generate` (run one request, streaming its text) and `kvplane route` (the decision only)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from kvplane.apps.cli.common import (
    CliError,
    client_parent,
    connect,
    format_bytes,
    json_flag,
    non_negative_int,
    print_json,
)
from kvplane.client import GenerateResult, RequestMetrics, StreamAssembler
from kvplane.types import PRIORITIES, DisaggMode

_DISAGG_CHOICES = tuple(m.value for m in DisaggMode)


def register(subparsers: argparse._SubParsersAction) -> None:
    parent = client_parent()
    generate = subparsers.add_parser(
        "generate",
        parents=[parent],
        help="run one request and stream its text",
        description="Runs one request through the control plane. Plain mode streams the text to stdout "
        "and a one-line summary of where it ran to stderr; --json prints one object when it finishes.",
    )
    _add_request_arguments(generate)
    generate.add_argument(
        "--lookaside", action="store_true",
        help="stream from the decode worker's agent directly; the control plane only places the request",
    )  # fmt: skip
    json_flag(generate)
    generate.set_defaults(func=run_generate)

    route = subparsers.add_parser(
        "route",
        parents=[parent],
        help="show where a request would run, without running it",
        description="Asks the control plane for its routing decision (workers, cached prefix, candidate "
        "costs) for a prompt; no work is done.",
    )
    _add_request_arguments(route)
    route.add_argument(
        "--explain", action="store_true",
        help="print what each priced candidate's cost is made of (the kvplane policy: its predicted TTFT and TPOT, "
        "queue, fetch, prefill and transfer seconds, and whether it meets the objectives)",
    )  # fmt: skip
    json_flag(route)
    route.set_defaults(func=run_route)


def _add_request_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", metavar="TEXT", help="the prompt; '-' reads it from stdin")
    parser.add_argument("--max-tokens", type=non_negative_int, default=16, metavar="N", help="default: 16")
    parser.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0, metavar="P", help="default: 1.0 (off)")
    parser.add_argument("--top-k", type=non_negative_int, default=0, metavar="K", help="default: 0 (off)")
    parser.add_argument("--seed", type=non_negative_int, default=None, metavar="S", help="sampling seed")
    parser.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence")
    parser.add_argument(
        "--disagg", choices=_DISAGG_CHOICES, default="auto",
        help="prefill placement: auto = the router decides (default), always = on a prefill worker, "
        "never = on the decode worker",
    )  # fmt: skip
    parser.add_argument("--model", default="", help="model name (default: the only model served)")
    parser.add_argument("--cache-salt", default="", metavar="S", help="per-tenant prefix-cache isolation")
    parser.add_argument("--request-id", default="", metavar="ID", help="default: the control plane makes one")
    parser.add_argument(
        "--priority", choices=PRIORITIES, default=PRIORITIES[0],
        help="objective class: interactive (default) or batch (may wait in a queue instead of being rejected)",
    )  # fmt: skip
    parser.add_argument(
        "--reject-retries", type=non_negative_int, default=0, metavar="N",
        help="on a rejection, wait its retry-after and retry, at most N times (default: 0, never)",
    )  # fmt: skip


def _request_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    prompt = sys.stdin.read() if args.text == "-" else args.text
    return dict(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        seed=args.seed, ignore_eos=args.ignore_eos, disagg=args.disagg, model=args.model,
        cache_salt=args.cache_salt, request_id=args.request_id, priority=args.priority,
        reject_retries=args.reject_retries, prompt=prompt,
    )  # fmt: skip


def run_generate(args: argparse.Namespace) -> int:
    kwargs = _request_kwargs(args)
    prompt = kwargs.pop("prompt")
    with connect(args) as client:
        try:
            chunks = client.stream(prompt, lookaside=args.lookaside, **kwargs)
        except ValueError as e:  # values argparse let through but the wire cannot carry
            raise CliError(str(e), exit_code=2) from None
        assembler = StreamAssembler()
        for chunk in chunks:
            assembler.add(chunk)
            if not args.json:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
        result = assembler.result()
    if args.json:
        print_json(result_to_json(result))
    else:
        sys.stdout.write("\n")
        sys.stdout.flush()
        print(summary_line(result), file=sys.stderr)
    return 0


def run_route(args: argparse.Namespace) -> int:
    kwargs = _request_kwargs(args)
    prompt = kwargs.pop("prompt")
    with connect(args) as client:
        try:
            decision = client.route(prompt, **kwargs)
        except ValueError as e:
            raise CliError(str(e), exit_code=2) from None
    if args.json:
        print_json(dataclasses.asdict(decision))
        return 0
    prefill = decision.prefill_worker if decision.disaggregated else f"{decision.decode_worker} (local)"
    print(f"decode worker:  {decision.decode_worker}")
    print(f"prefill worker: {prefill}")
    print(f"prompt tokens:  {decision.prompt_tokens} ({decision.cached_tokens} cached on the decode worker)")
    print(f"reason:         {decision.reason}")
    print(f"candidates ({len(decision.candidates)}, the router's order of preference):")
    for c in decision.candidates:
        verdict = "ok" if c.admissible else "not admissible"
        note = f"\n      {c.note}" if c.note and getattr(args, "explain", False) else ""
        print(f"  {c.worker_id}: cost {c.cost:.6g}, {c.cached_tokens} cached tokens, {verdict}{note}")
    return 0


def result_to_json(result: GenerateResult) -> dict[str, Any]:
    """One flat object: the output, then every metrics field (request_id included)."""
    return {
        "token_ids": list(result.token_ids),
        "text": result.text,
        "finish_reason": result.finish_reason,
        **dataclasses.asdict(result.metrics),
    }


def summary_line(result: GenerateResult) -> str:
    m: RequestMetrics = result.metrics
    if m.disaggregated:
        placement = f"prefill {m.prefill_worker or '?'} -> decode {m.decode_worker}"
        transfer = f", KV {format_bytes(m.kv_transfer_bytes)} in {m.kv_transfer_blocks} blocks"
        transfer += f" via {m.transport}" if m.transport else ""
    else:
        placement = f"prefill+decode {m.decode_worker}"
        transfer = ""
    return (
        f"[{len(result.token_ids)} tokens, finish={result.finish_reason or '?'}; {placement}; "
        f"prompt {m.prompt_tokens} tokens, {m.cached_tokens} cached{transfer}; TTFT {m.ttft_ms:.1f} ms]"
    )
