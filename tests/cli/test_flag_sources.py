"""Server flags from `--config FILE.yaml` and KVPLANE_* environment variables (kvplane/apps/cli/flag_sources.py),
on the real parsers of `kvplane controlplane` and `kvplane agent`."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kvplane.apps.cli import flag_sources
from kvplane.apps.cli.main import main
from kvplane.controlplane import main as controlplane_main
from kvplane.dataplane.agent import main as agent_main


def _parse(module, argv: list[str], environ: dict[str, str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"kvplane {module.__name__}")
    module.add_arguments(parser)
    flag_sources.add_config_argument(parser)
    flag_sources.apply(parser, argv, environ)
    return parser.parse_args(argv)


def test_the_command_line_wins_over_the_environment_which_wins_over_the_file(tmp_path: Path) -> None:
    config = tmp_path / "cp.yaml"
    config.write_text("lease-ttl: 5\nport: 6000\nrouting_policy: least-load\nadmission: predictive\ninsecure: true\n")
    args = _parse(controlplane_main, ["--config", str(config), "--port", "7000"], {"KVPLANE_LEASE_TTL": "8"})
    assert (args.port, args.lease_ttl, args.routing_policy, args.admission, args.insecure) == (7000, 8, "least-load", "predictive", True)
    # The config the server runs is built from them as from flags (and validated the same way).
    built = controlplane_main.config_from_args(args)
    assert (built.port, built.lease_ttl_s, built.planner.router.policy.name) == (7000, 8, "least-load")


def test_the_config_file_can_come_from_the_environment_and_repeatable_flags_take_lists(tmp_path: Path) -> None:
    config = tmp_path / "cp.yaml"
    config.write_text("serve-model: [tiny, small]\n")
    args = _parse(controlplane_main, [], {"KVPLANE_CONFIG": str(config)})
    assert args.serve_model == ["tiny", "small"]
    args = _parse(controlplane_main, [], {"KVPLANE_SERVE_MODEL": "a,b"})
    assert args.serve_model == ["a", "b"]


def test_agent_flags_from_the_environment() -> None:
    args = _parse(agent_main, [], {"KVPLANE_ROLE": "prefill", "KVPLANE_CONTROLPLANE": "cp:50051", "KVPLANE_PIN_TIMEOUT": "2.5"})
    assert (args.role, args.controlplane, args.pin_timeout) == ("prefill", "cp:50051", 2.5)


@pytest.mark.parametrize(
    ("text", "environ", "message"),
    [
        ("lease-tll: 5\n", {}, "'lease-tll' is not a flag of"),
        ("routing-policy: fastest\n", {}, "routing-policy: 'fastest' is not one of"),
        ("port: eighty\n", {}, "port: invalid literal for int()"),
        ("insecure: maybe\n", {}, "insecure: expected true or false, got 'maybe'"),
        ("- port\n", {}, "must hold a mapping of flag names to values, got a list"),
        ("port: [1, 2]\n", {}, "port: expected one value, got a list"),
        ("", {"KVPLANE_LEASE_TTL": "ten"}, "$KVPLANE_LEASE_TTL: invalid literal for int()"),
    ],
)
def test_a_value_that_does_not_fit_its_flag_is_refused_naming_its_source(tmp_path: Path, text, environ, message) -> None:
    config = tmp_path / "cp.yaml"
    config.write_text(text)
    with pytest.raises(flag_sources.FlagSourceError) as err:
        _parse(controlplane_main, ["--config", str(config)], environ)
    assert message in str(err.value)


def test_the_server_command_exits_2_on_a_bad_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "cp.yaml"
    config.write_text("no-such-flag: 1\n")
    assert main(["controlplane", "--config", str(config)]) == 2
    assert capsys.readouterr().err == f"kvplane controlplane: {config}: 'no-such-flag' is not a flag of kvplane controlplane (see --help)\n"
    assert main(["agent", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read the config file" in capsys.readouterr().err
