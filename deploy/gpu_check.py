"""The driver of deploy/gpu-check.sh (see there for what it proves): starts engine servers in
disaggregation mode, a kvplane control plane and one agent beside each server, sends requests,
and prints one JSON line per check. Needs NVIDIA GPUs; run through the shell script."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvplane import Client  # noqa: E402
from kvplane.apps.cluster import free_port  # noqa: E402

BLOCK_SIZE = 32
MODEL_NAME = "tiny"


def write_checkpoint(directory: Path) -> Path:
    from tests.engine.helpers import write_hf_llama

    # float32 weights; the servers run --dtype float32 so greedy tokens can equal transformers' exactly.
    return write_hf_llama(directory, hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=2048)  # fmt: skip


def expected_greedy(checkpoint: Path, prompt: list[int], max_tokens: int) -> list[int]:
    import torch

    from tests.engine.helpers import load_hf

    with torch.no_grad():
        out = load_hf(checkpoint).generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False, min_new_tokens=max_tokens)
    return out[0, len(prompt) :].tolist()


class Processes:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        log = (self.log_dir / f"{name}.log").open("wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def engine_servers(engine: str, python: str, checkpoint: Path, backend: str, gpus: list[str]) -> list[dict]:
    """Prefill and decode server command lines and the agent flags for each."""
    servers = []
    for role, gpu in (("prefill", gpus[0]), ("decode", gpus[-1])):
        port, events, replay = free_port(), free_port(), free_port()
        env = {"CUDA_VISIBLE_DEVICES": gpu}
        if engine == "sglang":
            kv = {"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{events}", "bind": True, "replay_endpoint": f"tcp://127.0.0.1:{replay}"}
            argv = [python, "-m", "sglang.launch_server", "--model-path", str(checkpoint), "--served-model-name", MODEL_NAME,
                    "--host", "127.0.0.1", "--port", str(port), "--smg-grpc-mode", "--page-size", str(BLOCK_SIZE),
                    "--disaggregation-mode", role, "--disaggregation-transfer-backend", backend,
                    "--disaggregation-bootstrap-port", str(free_port()), "--mem-fraction-static", "0.3", "--dtype", "float32",
                    "--skip-server-warmup",
                    "--kv-events-config", json.dumps(kv)]  # fmt: skip
            agent = ["--engine", "sglang", "--engine-endpoint", f"127.0.0.1:{port}", "--sglang-bootstrap-host", "127.0.0.1"]
        else:
            kv = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": f"tcp://*:{events}",
                "replay_endpoint": f"tcp://127.0.0.1:{replay}",
            }
            transfer = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
            env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(free_port())
            argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint), "--served-model-name", MODEL_NAME,
                    "--host", "127.0.0.1", "--port", str(port), "--block-size", str(BLOCK_SIZE), "--enable-prefix-caching",
                    "--enable-prompt-tokens-details", "--gpu-memory-utilization", "0.3", "--dtype", "float32", "--kv-events-config", json.dumps(kv),
                    "--kv-transfer-config", json.dumps(transfer)]  # fmt: skip
            agent = ["--engine", "vllm", "--engine-endpoint", f"http://127.0.0.1:{port}", "--vllm-kv-connector", "nixl"]
        agent += ["--kv-events-endpoint", f"tcp://127.0.0.1:{events}", "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{replay}",
                  "--role", role, "--engine-start-timeout", "900"]  # fmt: skip
        servers.append({"role": role, "argv": argv, "env": env, "agent": agent})
    return servers


def run_check(name: str, engine: str, python: str, backend: str, checkpoint: Path, gpus: list[str], log_root: Path) -> dict:
    log_dir = log_root / name
    log_dir.mkdir(parents=True)
    procs = Processes(log_dir)
    result: dict = {"check": name, "ok": False, "logs": str(log_dir)}
    try:
        cp_port = free_port()
        procs.start("controlplane", [sys.executable, "-m", "kvplane", "controlplane", "--port", str(cp_port), "--disagg-threshold", "0",
                                     "--block-size", str(BLOCK_SIZE), "--serve-model", MODEL_NAME])  # fmt: skip
        for server in engine_servers(engine, python, checkpoint, backend, gpus):
            procs.start(f"engine-{server['role']}", server["argv"], server["env"])
            procs.start(f"agent-{server['role']}", [sys.executable, "-m", "kvplane", "agent", "--worker-id", server["role"],
                                                    "--controlplane", f"127.0.0.1:{cp_port}", "--port", str(free_port()),
                                                    "--metrics-port", "-1", *server["agent"]])  # fmt: skip
        endpoint = f"127.0.0.1:{cp_port}"
        with Client(endpoint, timeout=120) as client:
            deadline = time.monotonic() + 900
            while {w.worker_id for w in client.workers()} != {"prefill", "decode"}:
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs.procs):
                    raise RuntimeError("the servers or agents did not come up; see the logs")
                time.sleep(2)
            prompt = [3 + (i * 7919) % 250 for i in range(300)]
            got = client.generate(prompt, max_tokens=16, ignore_eos=True, disagg="always")
        m = got.metrics
        result.update(
            greedy_equal=list(got.token_ids) == expected_greedy(checkpoint, prompt, 16),
            kv_moved=m.disaggregated and m.prefill_worker == "prefill" and m.transport.startswith("engine:"),
            transport=m.transport, kv_transfer_bytes=m.kv_transfer_bytes, kv_transfer_blocks=m.kv_transfer_blocks,
            ttft_ms=round(m.ttft_ms, 1), prompt_tokens=len(prompt),
        )  # fmt: skip
        result["ok"] = bool(result["greedy_equal"] and result["kv_moved"])
    except Exception as e:  # one line per check, whatever happened
        result["error"] = f"{type(e).__name__}: {e}"
    finally:
        procs.stop()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--sglang-python", required=True)
    parser.add_argument("--only", choices=("vllm", "sglang"), default=None)
    args = parser.parse_args()
    gpus = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True).stdout.split()
    if not gpus:
        print(json.dumps({"check": "gpu", "ok": False, "error": "no NVIDIA GPU visible"}))
        return 1
    root = Path(tempfile.mkdtemp(prefix="kvplane-gpu-check-"))
    checkpoint = write_checkpoint(root / "tiny-llama")
    checks = []
    if args.only in (None, "sglang"):
        checks.append(("sglang-nixl", "sglang", args.sglang_python, "nixl"))
        mooncake = subprocess.run([args.sglang_python, "-c", "import mooncake"], capture_output=True).returncode == 0
        if mooncake:
            checks.append(("sglang-mooncake", "sglang", args.sglang_python, "mooncake"))
    if args.only in (None, "vllm"):
        checks.append(("vllm-nixl", "vllm", args.vllm_python, "nixl"))
    ok = True
    for name, engine, python, backend in checks:
        result = run_check(name, engine, python, backend, checkpoint, gpus, root / "logs")
        print(json.dumps(result), flush=True)
        ok = ok and result["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
