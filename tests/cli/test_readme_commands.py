"""The README's `kvplane ...` commands work as pasted.

Every command in the README's shell blocks is read from the README itself (continuation lines
joined, comments and a trailing `&` dropped) and checked against the real CLI:
- each one parses: the argv, exactly as written, through the command's own parser (the servers'
  and the benchmarks' included), so a renamed or removed flag fails here;
- each subcommand named answers `--help` in a real `kvplane` process;
- those that need no cluster run as pasted in a real process and must exit 0: `kvplane sim`,
  `kvplane plan`, `kvplane certs ca`, and `kvplane --version` from the prose.
The rest need a running cluster or an engine server (generate, workers, up, bench, agent, ...):
parsing is what is checked of them here; the cluster tests run them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import shlex
from pathlib import Path

import pytest

from kvplane.apps.cli import delegate
from kvplane.apps.cli.main import build_parser
from tests.cli.conftest import REPO_ROOT, run_kvplane

pytestmark = pytest.mark.cluster  # starts processes

SHELL_BLOCK = re.compile(r"^```(?:sh|bash|shell|console)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
RUNNABLE = ("sim", "plan", "certs")  # need no cluster: run as pasted


def readme_commands(readme: Path = REPO_ROOT / "README.md") -> list[list[str]]:
    """The argv (after `kvplane`) of every `kvplane` command in the README's shell blocks."""
    commands = []
    for block in SHELL_BLOCK.findall(readme.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["kvplane"]:
                commands.append(words[1:-1] if words[-1] == "&" else words[1:])
    return commands


COMMANDS = readme_commands()


def _subcommand(argv: list[str]) -> list[str]:
    found = delegate.find(argv)
    if found is not None:
        return list(found[0].command)
    return argv[:2] if argv[0] == "certs" else argv[:1]


def _parse(argv: list[str]) -> argparse.Namespace:
    """argv through the parser `kvplane` would give it (a delegated command's own, built by its module)."""
    found = delegate.find(argv)
    if found is None:
        return build_parser().parse_args(argv)
    command, rest = found
    return delegate.build_parser(command, importlib.import_module(command.module)).parse_args(rest)


def test_the_readme_has_the_commands_this_test_reads():
    subcommands = {" ".join(_subcommand(argv)) for argv in COMMANDS}
    assert {"up", "wait", "generate", "workers", "drain", "certs ca", "sim", "plan", "controlplane", "agent"} <= subcommands
    assert {"bench transfer", "bench prefix"} <= subcommands


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(a) for a in COMMANDS])
def test_each_readme_command_parses_as_written(argv):
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = _parse(argv)
    except SystemExit as e:
        pytest.fail(f"`kvplane {shlex.join(argv)}` does not parse (exit {e.code}): {stderr.getvalue().strip()}")
    assert args is not None


def test_each_subcommand_the_readme_names_answers_help():
    subcommands = sorted({tuple(_subcommand(argv)) for argv in COMMANDS})
    for subcommand in subcommands:
        done = run_kvplane(*subcommand, "--help", timeout=60)
        assert done.returncode == 0, f"kvplane {' '.join(subcommand)} --help: {done.stderr}"
        assert done.stdout.startswith("usage: kvplane " + " ".join(subcommand)), done.stdout[:200]


@pytest.mark.parametrize("argv", [a for a in COMMANDS if a[0] in RUNNABLE], ids=lambda a: " ".join(a[:3]))
def test_readme_commands_that_need_no_cluster_run_as_pasted(argv, tmp_path):
    # In an empty directory: `certs ca --dir ./pki` writes there.
    done = run_kvplane(*argv, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, f"kvplane {shlex.join(argv)} exited {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.strip() or any(tmp_path.iterdir()), "it printed and wrote nothing"


def test_kvplane_version_prints_the_installed_version():
    done = run_kvplane("--version")
    assert done.returncode == 0 and re.fullmatch(r"kvplane \S+\n", done.stdout), (done.stdout, done.stderr)
