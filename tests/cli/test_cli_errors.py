"""Every command reports a failure on stderr, never on stdout, and exits non-zero, without a traceback.

Scripts read stdout (tables, --json); an error printed there would be parsed as output.
"""

from __future__ import annotations

import argparse
from typing import NamedTuple

import pytest

from kvplane.apps.cli.main import build_parser
from tests.cli.conftest import run_kvplane
from tests.sdk.scripted_server import ScriptedServer

pytestmark = pytest.mark.cluster  # starts processes

UNREACHABLE = "127.0.0.1:1"
CANNOT_REACH = f"kvplane: error: cannot reach the kvplane control plane at {UNREACHABLE} ("


class Case(NamedTuple):
    args: tuple[str, ...]  # "{endpoint}" stands for the scripted server's address
    exit_code: int
    stderr: str  # in stderr


CASES = {
    "generate": Case(("generate", "x", "--seed", str(2**64), "--endpoint", "{endpoint}"), 2,
                     f"kvplane: error: seed must be between 0 and {2**64 - 1}, got {2**64}"),
    "route": Case(("route", "invalid", "--endpoint", "{endpoint}"), 3, "kvplane: error: max_tokens must be > 0"),
    "workers": Case(("workers", "--json", "--endpoint", UNREACHABLE), 5, CANNOT_REACH),
    "cache": Case(("cache", "--json", "--endpoint", UNREACHABLE), 5, CANNOT_REACH),
    "drain": Case(("drain", "nope", "--json", "--endpoint", "{endpoint}"), 1, "kvplane: error: no worker 'nope'"),
    "config": Case(("config",), 2, "usage: kvplane config [-h] COMMAND"),
    "config get": Case(("config", "get", "--json", "--endpoint", UNREACHABLE), 5, CANNOT_REACH),
    "config set": Case(("config", "set", "bogus", "1", "--endpoint", "{endpoint}"), 3,
                       "kvplane: error: unknown config key 'bogus'"),
    "profile": Case(("profile", "decode-0", "--max-batch", str(2**32), "--endpoint", "{endpoint}"), 2,
                    "kvplane: error: max_batch must be between 0 and 4294967295, got 4294967296"),
    "wait": Case(("wait", "--within", "0.5", "--endpoint", UNREACHABLE), 5, "kvplane: error: not ready after 0.5 s: cannot reach"),
    "top": Case(("top", "--once", "--json", "--endpoint", UNREACHABLE), 5, CANNOT_REACH),
    "up": Case(("up", "--both", "0", "--prefill", "0", "--decode", "0"), 2, "kvplane: error: nothing to start"),
    "bench": Case(("bench",), 2, "usage: kvplane bench [-h] BENCHMARK"),
    "bench transfer": Case(("bench", "transfer", "--transports", "carrier-pigeon"), 2,
                           "kvplane bench transfer: transports ['carrier-pigeon'] are not available here"),
    "bench load": Case(("bench", "load", "--bogus"), 2, "kvplane bench load: error: unrecognized arguments: --bogus"),
    "bench tracing": Case(("bench", "tracing", "--bogus"), 2, "kvplane bench tracing: error: unrecognized arguments"),
    "bench tiers": Case(("bench", "tiers", "--bogus"), 2, "kvplane bench tiers: error: unrecognized arguments"),
    "bench prefix": Case(("bench", "prefix", "--bogus"), 2, "kvplane bench prefix: error: unrecognized arguments"),
    "bench routing": Case(("bench", "routing", "--fleets", "nope"), 2, "kvplane bench routing: unknown fleets ['nope']"),
    "bench index": Case(("bench", "index", "--turnover", "2"), 2, "kvplane bench index: --workers, --blocks, --rounds and --interval must"),
    "bench controlplane": Case(("bench", "controlplane", "--shapes", "huge"), 2,
                               "kvplane bench controlplane: error: argument --shapes: unknown ['huge']; choose from ['short', 'long']"),
    "bench disagg": Case(("bench", "disagg", "--bogus"), 2, "kvplane bench disagg: error: unrecognized arguments"),
    "bench calibrate": Case(("bench", "calibrate", "--bogus"), 2, "kvplane bench calibrate: error: unrecognized arguments"),
    "sim": Case(("sim", "--sim-gpu", "tpu-v9"), 2, "kvplane sim: unknown gpu 'tpu-v9'; known: a100-80g"),
    "plan": Case(("plan", "--sim-gpu", "tpu-v9"), 2, "kvplane plan: unknown gpu 'tpu-v9'; known: a100-80g"),
    "controlplane": Case(("controlplane", "--lease-ttl", "-1"), 2,
                         "kvplane controlplane: lease_ttl_s must be at least 2 seconds, got -1"),
    "agent": Case(("agent", "--port", "70000"), 2, "kvplane agent: port must be in 0..65535, got 70000"),
    "certs": Case(("certs",), 2, "usage: kvplane certs [-h] COMMAND"),
    "certs ca": Case(("certs", "ca"), 2, "kvplane certs ca: error: the following arguments are required: --dir"),
    "certs issue": Case(("certs", "issue", "--dir", "/nonexistent-kvplane", "--role", "worker", "--name", "w"), 1,
                        "kvplane: error: cannot read the CA in /nonexistent-kvplane"),
    "certs show": Case(("certs", "show", "/nonexistent-kvplane.pem"), 1, "kvplane: error: /nonexistent-kvplane.pem:"),
}  # fmt: skip


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[str]:
    names = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                names += [" ".join((*prefix, name)), *_commands(sub, (*prefix, name))]
    return names


def test_every_command_has_an_error_case() -> None:
    assert sorted(_commands(build_parser())) == sorted(CASES)


def _params() -> list:
    return [pytest.param(case, id=name) for name, case in CASES.items()]


@pytest.mark.parametrize("case", _params())
def test_errors_go_to_stderr_with_a_non_zero_exit(server: ScriptedServer, case: Case) -> None:
    result = run_kvplane(*(a.replace("{endpoint}", server.endpoint) for a in case.args))
    assert (result.returncode, result.stdout) == (case.exit_code, "")
    assert "Traceback" not in result.stderr
    assert case.stderr in result.stderr
