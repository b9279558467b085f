"""`kvplane config get|set` (the cluster configuration kept in the store) and `kvplane profile WORKER_ID`."""

from __future__ import annotations

import argparse
import dataclasses

from kvplane.apps.cli.common import CliError, client_parent, connect, format_table, json_flag, non_negative_int, print_json, usage_error
from kvplane.client import ProfileResult

# The order of LatencyModel.coefficients (common.proto): step_seconds = coefficients . features.
COEFFICIENT_NAMES = ("intercept_s", "prefill_tokens", "prefill_attention", "decode_seqs", "decode_context_tokens")


def register(subparsers: argparse._SubParsersAction) -> None:
    parent = client_parent()
    config = subparsers.add_parser(
        "config", help="show or change the cluster configuration (admission policy, objectives)",
        description="Reads or changes the configuration the control planes keep in the store; every "
        "replica applies a change within a second, without a restart.",
    )  # fmt: skip
    commands = config.add_subparsers(title="config commands", metavar="COMMAND")
    get = commands.add_parser(
        "get", parents=[parent], help="print every key set", description="Prints every configuration key set in the store.",
    )  # fmt: skip
    json_flag(get)
    get.set_defaults(func=run_config_get)
    set_ = commands.add_parser(
        "set", parents=[parent], help="set one key, then print the configuration",
        description="Sets one key and prints the resulting configuration. Keys: admission.policy "
        "(none, threshold, predictive) and objectives.MODEL.PRIORITY.ttft_ms / .tpot_ms in milliseconds "
        "(MODEL: a served model name or * for all; PRIORITY: interactive or batch). An empty VALUE "
        "restores the key's default.",
    )  # fmt: skip
    set_.add_argument("key", metavar="KEY", help="e.g. admission.policy or objectives.builtin-tiny.interactive.ttft_ms")
    set_.add_argument("value", metavar="VALUE", help="the new value; '' restores the default")
    json_flag(set_)
    set_.set_defaults(func=run_config_set)
    config.set_defaults(func=lambda args: usage_error(config))

    profile = subparsers.add_parser(
        "profile", parents=[parent], help="measure and store a worker's latency profile",
        description="Has a worker run a sweep of prefill and decode steps, fits its step-time model "
        "and stores it; admission predicts from it until the online fit takes over.",
    )  # fmt: skip
    profile.add_argument("worker_id", metavar="WORKER_ID", help="the worker to profile (see `kvplane workers`)")
    profile.add_argument("--max-prompt-tokens", type=non_negative_int, default=0, metavar="N",
                         help="longest prompt in the sweep (default: 0 = the server's choice)")  # fmt: skip
    profile.add_argument("--max-batch", type=non_negative_int, default=0, metavar="N",
                         help="largest decode batch in the sweep (default: 0 = the server's choice)")  # fmt: skip
    json_flag(profile)
    profile.set_defaults(func=run_profile)


def run_config_get(args: argparse.Namespace) -> int:
    with connect(args) as client:
        _print_config(client.config(), args.json)
    return 0


def run_config_set(args: argparse.Namespace) -> int:
    if not args.key:
        raise CliError("KEY must not be empty", exit_code=2)
    with connect(args) as client:
        _print_config(client.set_config(args.key, args.value), args.json)
    return 0


def _print_config(values: dict[str, str], as_json: bool) -> None:
    if as_json:
        print_json(values)
    elif not values:
        print("no configuration set (every key has its default)")
    else:
        print(format_table(("KEY", "VALUE"), sorted(values.items())))


def run_profile(args: argparse.Namespace) -> int:
    with connect(args) as client:
        try:
            result = client.profile(args.worker_id, max_prompt_tokens=args.max_prompt_tokens, max_batch=args.max_batch)
        except ValueError as e:
            raise CliError(str(e), exit_code=2) from None
    if args.json:
        print_json(profile_to_json(result))
        return 0
    print(f"worker {result.worker_id}: {result.num_samples} step timings, "
          f"fit error {result.mean_abs_pct_error * 100:.1f}% (mean absolute, relative to the step time)")  # fmt: skip
    names = COEFFICIENT_NAMES if len(result.coefficients) == len(COEFFICIENT_NAMES) else [f"c{i}" for i in range(len(result.coefficients))]
    print(format_table(("TERM", "SECONDS PER UNIT"), [(n, f"{c:.6g}") for n, c in zip(names, result.coefficients)]))
    return 0


def profile_to_json(result: ProfileResult) -> dict:
    out = dataclasses.asdict(result)
    out["coefficients"] = list(result.coefficients)
    return out
