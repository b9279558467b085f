"""Every command has --help; bad arguments fail with one clear line and a non-zero exit."""

from __future__ import annotations

import importlib.util

import pytest

from tests.cli.conftest import run_kvplane

pytestmark = pytest.mark.cluster  # starts processes

CLIENT_COMMANDS = (
    ["generate"], ["route"], ["workers"], ["cache"], ["drain"], ["up"], ["bench"], ["config"], ["config", "get"],
    ["config", "set"], ["profile"], [],
)  # fmt: skip


@pytest.mark.parametrize("command", CLIENT_COMMANDS, ids=lambda c: " ".join(c) or "kvplane")
def test_help_exits_zero(command: list[str]) -> None:
    result = run_kvplane(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {' '.join(['kvplane', *command])}")


def test_top_level_help_lists_every_command() -> None:
    out = run_kvplane("--help").stdout
    for name in (
        "generate",
        "route",
        "workers",
        "cache",
        "drain",
        "up",
        "controlplane",
        "agent",
        "bench",
        "config",
        "profile",
        "sim",
        "plan",
    ):
        assert name in out
    bench = run_kvplane("bench", "--help").stdout
    assert "transfer" in bench and "load" in bench


@pytest.mark.parametrize(
    ("command", "module"),
    [
        (["controlplane"], "kvplane.controlplane.main"),
        (["agent"], "kvplane.dataplane.agent.main"),
        (["bench", "transfer"], "kvplane.apps.bench.transfer"),
        (["bench", "load"], "kvplane.apps.bench.load"),
        (["sim"], "kvplane.apps.sim.main"),
        (["plan"], "kvplane.apps.sim.plan"),
        (["bench", "disagg"], "kvplane.apps.bench.disagg"),
        (["bench", "calibrate"], "kvplane.apps.bench.calibrate"),
    ],  # fmt: skip
    ids=["controlplane", "agent", "bench transfer", "bench load", "sim", "plan", "bench disagg", "bench calibrate"],
)
def test_delegated_help(command: list[str], module: str) -> None:
    assert importlib.util.find_spec(module) is not None
    result = run_kvplane(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: kvplane {' '.join(command)}")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["generate", "x", "--max-tokens", "-1"], "argument --max-tokens: must be >= 0, got -1"),
        (["generate", "x", "--disagg", "sometimes"], "argument --disagg: invalid choice: 'sometimes'"),
        (["generate", "x", "--temperature", "warm"], "argument --temperature: invalid float value: 'warm'"),
        (["generate"], "the following arguments are required: TEXT"),
        (["drain"], "the following arguments are required: WORKER_ID"),
        (["profile"], "the following arguments are required: WORKER_ID"),
        (["profile", "w", "--max-batch", "-1"], "argument --max-batch: must be >= 0, got -1"),
        (["config", "set", "k"], "the following arguments are required: VALUE"),
        (["generate", "x", "--priority", "urgent"], "argument --priority: invalid choice: 'urgent'"),
        (["generate", "x", "--reject-retries", "-2"], "argument --reject-retries: must be >= 0, got -2"),
        (["workers", "--bogus"], "unrecognized arguments: --bogus"),
        (["up", "--store", "redis://x"], "expected 'memory' or 'etcd://HOST:PORT[,HOST:PORT...]', got 'redis://x'"),
        (["up", "--bus", "kafka://x:9092"], 'unsupported bus \'kafka://x:9092\'; use one of "auto", "memory", "store"'),
        (["up", "--prefill", "two"], "argument --prefill: expected a whole number, got 'two'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (
            ["agent", "--worker-id", "w", "--lease-ttl", "-1"],
            "lease_ttl_s must be 0 (the control plane's default) or 2..3600 seconds, got -1",
        ),
    ],
)
def test_bad_arguments_fail_with_a_clear_message(args: list[str], message: str) -> None:
    result = run_kvplane(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_up_with_replicas_refuses_the_in_process_bus() -> None:
    result = run_kvplane("up", "--store", "etcd://127.0.0.1:1", "--replicas", "2", "--bus", "memory")
    assert result.returncode == 2 and "the in-process bus serves one replica" in result.stderr


def test_up_with_no_agents_is_refused() -> None:
    result = run_kvplane("up", "--prefill", "0", "--decode", "0")
    assert result.returncode == 2
    assert result.stderr.strip() == ("kvplane: error: nothing to start: give at least one of --prefill, --decode, --both a count > 0")


def test_no_command_prints_usage_and_fails() -> None:
    result = run_kvplane()
    assert result.returncode == 2 and "usage: kvplane" in result.stderr


def test_unreachable_control_plane_is_one_line() -> None:
    result = run_kvplane("workers", "--endpoint", "127.0.0.1:1")
    assert result.returncode == 5  # unavailable
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("kvplane: error: cannot reach the kvplane control plane at 127.0.0.1:1")


def test_up_forwards_only_the_engine_flags_given() -> None:
    from kvplane.apps.cli import engine_flags
    from kvplane.apps.cli.main import build_parser

    args = build_parser().parse_args(["up", "--engine", "sim", "--sim-tp", "2", "--speedup", "3", "--model", "x"])
    assert engine_flags.forward_args(args, args.engine_flags) == ["--engine", "sim", "--sim-tp", "2", "--speedup", "3.0"]
    assert args.model == "x"  # up's own --model keeps its meaning (forwarded separately)
    plain = build_parser().parse_args(["up"])
    assert engine_flags.forward_args(plain, plain.engine_flags) == []


def test_version_prints_the_installed_version() -> None:
    from importlib import metadata  # noqa: PLC0415

    result = run_kvplane("--version")
    assert (result.returncode, result.stdout) == (0, f"kvplane {metadata.version('kvplane')}\n")
