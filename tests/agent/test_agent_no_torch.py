"""An agent beside an engine other than the reference one must not import torch.

The first test runs the real `kvplane agent` start-up in a fresh process (CLI dispatch, flag
parsing for every registered engine, config validation, telemetry set-up, AgentServer.start) and
stops it inside the engine registry's factory call, the first point where engine-specific code
would run; everything before that point is what an agent for any engine runs. The second runs a
sim-engine agent's start-up to the end, with torch made unimportable, against a real control
plane: it registers, serves a request, and stops. The third imports every data-plane module
outside the reference engine's package (the vLLM and SGLang adapters included).
`run_agent_start_up` runs an agent's start-up to the end (engine connected, registered, serving)
in a fresh process and reports what it loaded: the engine tests
(tests/engines/test_engine_clusters.py) run it beside real vLLM and SGLang servers, which only
`make test-engines` has.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvplane.apps.cluster import free_port
from kvplane.client import Client
from kvplane.security.credentials import Credentials

pytestmark = pytest.mark.cluster  # starts processes

REPO_ROOT = Path(__file__).resolve().parents[2]

_START_UP = r"""
import json, sys
from kvplane.dataplane.engines import registry

reference = registry.plugin("reference")

def create(config):
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "kvplane")
    print(json.dumps({"torch": "torch" in sys.modules, "modules": loaded}), flush=True)
    raise RuntimeError("stopped where the engine would be built")

reference.create = create  # the registry looks the factory up when it builds the engine
from kvplane.apps.cli.main import main
sys.exit(main(["agent", "--engine", "reference", "--worker-id", "w", "--controlplane", "127.0.0.1:9", "--metrics-port", "-1", "--insecure"]))
"""

# torch cannot be imported in this process: every attempt is recorded and fails.
_SIM_AGENT = r"""
import atexit, importlib.abc, json, sys
attempts = []

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            attempts.append(name)
            raise ImportError(f"torch is blocked in this test ({name})")
        return None

sys.meta_path.insert(0, NoTorch())
atexit.register(lambda: print(json.dumps({"torch": "torch" in sys.modules, "attempts": attempts,
    "engine_loaded": "kvplane.dataplane.engines.sim.adapter" in sys.modules}), flush=True))
from kvplane.apps.cli.main import main
sys.exit(main(sys.argv[1:]))
"""

_IMPORT_ALL = r"""
import importlib, json, pkgutil, sys
import kvplane.dataplane

names = [m.name for m in pkgutil.walk_packages(kvplane.dataplane.__path__, "kvplane.dataplane.")
         if not m.name.startswith("kvplane.dataplane.engines.reference.")]
for name in names:
    importlib.import_module(name)
print(json.dumps({"torch": "torch" in sys.modules, "modules": names}), flush=True)
"""


_START_UP_TO_THE_END = r"""
import argparse, asyncio, json, sys
from kvplane.dataplane.agent import main as agent_main
from kvplane.dataplane.agent.server import AgentServer
from kvplane.security import flags as security_flags

parser = argparse.ArgumentParser()
agent_main.add_arguments(parser)
args = parser.parse_args(sys.argv[1:])
credentials = security_flags.server_credentials_from_args(args, "the agent")
config = agent_main.config_from_args(args)

async def start_and_stop():
    agent = AgentServer(config, credentials)
    await agent.start()  # the engine connected, the worker registered, the Agent service serving
    info = agent.engine.info
    report = {"started": True, "engine": config.engine_name, "model": info.model, "block_size": info.layout.block_size,
              "torch": "torch" in sys.modules}
    await agent.stop(drain_timeout_s=0)
    return report

print(json.dumps(asyncio.run(start_and_stop())), flush=True)
"""


def run_agent_start_up(agent_argv: list[str]) -> dict:
    """Runs `kvplane agent AGENT_ARGV`'s start-up to the end in a fresh process, then stops it;
    returns its report (engine, model, block size, whether torch was loaded)."""
    done, report = _run(_START_UP_TO_THE_END, agent_argv, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return report


def _run(script: str, argv: list[str] = (), timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], dict]:
    done = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no report from the subprocess; stdout: {done.stdout!r} stderr: {done.stderr[-2000:]!r}"
    return done, json.loads(lines[-1])


def test_agent_start_up_reaches_engine_construction_without_torch():
    done, report = _run(_START_UP)
    assert done.returncode == 1 and "kvplane agent: stopped where the engine would be built" in done.stdout + done.stderr
    # The path really ran: the server, the service, the transports and the registry were loaded ...
    for module in ("kvplane.dataplane.agent.server", "kvplane.dataplane.agent.service", "kvplane.dataplane.transport.grpc_stream",
                   "kvplane.dataplane.engines.registry", "kvplane.dataplane.engines.reference.plugin"):  # fmt: skip
        assert module in report["modules"], module
    # ... but not the reference engine itself, and not torch.
    assert "kvplane.dataplane.engines.reference.engine" not in report["modules"]
    assert report["torch"] is False


# What this test checks is torch-freeness, not security (tests/security/): a bare control plane and agent.
PLAINTEXT = ("--insecure", "--join-token", "no-torch-test-join-token")


def test_a_sim_agent_starts_serves_and_stops_with_torch_unimportable(tmp_path):
    cp_port, agent_port = free_port(), free_port()
    cp_log = (tmp_path / "cp.log").open("w")
    controlplane = subprocess.Popen(
        [sys.executable, "-m", "kvplane", "controlplane", "--host", "127.0.0.1", "--port", str(cp_port), "--metrics-port", "-1", *PLAINTEXT],
        cwd=REPO_ROOT, stdout=cp_log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    agent = subprocess.Popen(
        [sys.executable, "-c", _SIM_AGENT, "agent", "--engine", "sim", "--sim-model", "llama-3-8b", "--sim-tp", "1", "--worker-id", "sim-0",
         "--port", str(agent_port), "--controlplane", f"127.0.0.1:{cp_port}", "--metrics-port", "-1", *PLAINTEXT],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        with Client(f"127.0.0.1:{cp_port}", timeout=5, credentials=Credentials.plaintext(source="no-torch test")) as client:
            deadline = time.monotonic() + 60
            while not [w for w in _workers(client) if w.worker_id == "sim-0"]:
                assert agent.poll() is None and controlplane.poll() is None, agent.stdout.read()
                assert time.monotonic() < deadline, "the sim agent did not register within 60 s"
                time.sleep(0.2)
            result = client.generate(list(range(1, 100)), max_tokens=4)
            assert len(result.token_ids) == 4 and result.metrics.decode_worker == "sim-0"
        agent.send_signal(signal.SIGTERM)
        out, _ = agent.communicate(timeout=30)
    finally:
        for p in (agent, controlplane):
            if p.poll() is None:
                p.kill()
                p.wait()
        cp_log.close()
    assert agent.returncode == 0, out
    report = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert report == {"torch": False, "attempts": [], "engine_loaded": True}


def _workers(client: Client) -> list:
    try:
        return client.workers()
    except Exception:  # noqa: BLE001 - the control plane may not answer yet
        return []


def test_every_data_plane_module_outside_the_reference_engine_imports_without_torch():
    done, report = _run(_IMPORT_ALL)
    assert done.returncode == 0, done.stderr
    assert {"kvplane.dataplane.agent.main", "kvplane.dataplane.engines.base", "kvplane.dataplane.transport.nixl"} <= set(report["modules"])
    assert report["torch"] is False


def test_the_check_can_fail():
    """The reference engine module does load torch: the checks above would see it."""
    done, report = _run("import json, sys; import dataplane.engines.reference.engine; print(json.dumps({'torch': 'torch' in sys.modules}))")
    assert done.returncode == 0 and report["torch"] is True
