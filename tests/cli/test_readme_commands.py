"""The README's `kvplane ...` commands work as pasted.

Every command in the README's shell blocks is read from the README itself (continuation lines
joined, comments and a trailing `&` dropped) and checked against the real CLI:
- each one parses: the argv, exactly as written, through the command's own parser (the servers'
  and the benchmarks' included), so a renamed or removed flag fails here;
- each subcommand named answers `--help` in a real `kvplane` process;
- those that need no cluster run as pasted in a real process and must exit 0: `kvplane sim`,
  `kvplane plan`, `kvplane certs ca`, and `kvplane --version` from the prose;
- the "Using it" block runs as pasted, in order, against the cluster its own `kvplane up ... &`
  starts (each command must exit 0); its lines that run for minutes or until stopped are listed
  in USING_IT_ELSEWHERE with the test that runs them, and a new line must be put in one or the other.
The rest need an engine server or another host (vLLM, SGLang, a deployment's TLS files): parsing
is what is checked of them here.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import re
import shlex
import signal
import subprocess
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


USING_IT = REPO_ROOT / "README.md"
# Lines of the "Using it" block not run by test_the_using_it_block_runs_as_pasted, and why.
USING_IT_ELSEWHERE = {
    "kvplane certs ca": "needs no cluster: test_readme_commands_that_need_no_cluster_run_as_pasted",
    "kvplane sim": "needs no cluster: test_readme_commands_that_need_no_cluster_run_as_pasted",
    "kvplane bench transfer": "starts its own clusters, ~30 s: tests/agent/test_agent_transfer.py runs the transports",
    "kvplane bench tiers": "minutes: tests/bench/test_bench_tiers_overlap.py runs it small",
    "kvplane bench prefix": "about 15 min: tests/cli/test_bench_prefix.py runs it small",
    "kvplane bench routing": "about 2.5 min: tests/bench/test_bench_routing.py runs it small",
    "kvplane up --engine sim": "serves until stopped (a second cluster): tests/sim/test_sim_agents.py starts it",
}


def using_it_lines() -> list[str]:
    """The shell lines of the README's "Using it" block, comments dropped."""
    text = USING_IT.read_text()
    block = SHELL_BLOCK.search(text, text.index("## Using it")).group(1)
    return [line.split("  #")[0].strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def _elsewhere(line: str) -> str | None:
    return next((why for start, why in USING_IT_ELSEWHERE.items() if line.startswith(start)), None)


def test_the_using_it_block_runs_as_pasted(tmp_path):
    lines = using_it_lines()
    activate, start = lines[:2]
    assert activate == ". .venv/bin/activate" and start.startswith("kvplane up ") and start.endswith("&"), lines[:2]
    script = [line for line in lines[2:] if _elsewhere(line) is None]
    assert {"kvplane wait", "kvplane top", "kvplane workers --json"} <= set(script), script
    with open(tmp_path / "up.log", "w") as log:
        up = subprocess.Popen(["bash", "-c", f"{activate} && exec {start.removesuffix('&')}"], cwd=REPO_ROOT,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        for line in script:
            command = ["bash", "-c", f"{activate} && exec {line}"]
            if line == "kvplane top":  # live until Ctrl-C: its first refresh, then the interrupt
                top = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                shown = ""
                for row in iter(top.stdout.readline, ""):  # until its table lists a worker (the suite's timeout bounds it)
                    shown += row
                    if "decode-0" in row:
                        break
                top.send_signal(signal.SIGINT)
                rest, err = top.communicate(timeout=30)
                assert top.returncode == 130 and "decode-0" in shown, (top.returncode, shown + rest, err)
                continue
            done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
            assert done.returncode == 0, f"`{line}` exited {done.returncode}: {done.stdout[-1000:]}{done.stderr[-2000:]}"
    finally:
        os.killpg(up.pid, signal.SIGTERM)
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
    assert up.returncode == 0, f"`{start}` exited {up.returncode}: {(tmp_path / 'up.log').read_text()[-2000:]}"


def test_each_line_the_using_it_test_leaves_out_is_in_the_readme():
    lines = using_it_lines()
    stale = [start for start in USING_IT_ELSEWHERE if not any(line.startswith(start) for line in lines)]
    assert not stale, f"USING_IT_ELSEWHERE names lines the README no longer has: {stale}"
