"""How `kvplane up --engine vllm|sglang` (and the engine tests) start an engine server beside each
agent on one machine: the server's command line, its environment, and the agent flags that point
at it. A local try-out shape; in production the engine runs as it always does and the agent is
its sidecar (deploy/k8s/sidecar-*.yaml).

Each engine server runs from its own Python (`--engine-python`, default the repo's
`.venv-vllm` / `.venv-sglang` that `make engines-env` creates, or `python3`), on loopback ports
picked free: an API port, a ZMQ KV-event port and its replay port. Block size: vLLM's
--block-size, SGLang's --page-size; the agent reads it back from the server and the control plane
checks it at registration. `device="cpu"` adds what each needs on a CPU-only machine (vLLM: a
small --gpu-memory-utilization, which on CPU is the share of host memory it reserves; SGLang:
--device cpu, the torch-native attention backend, no CUDA graphs, SGLANG_USE_CPU_ENGINE=1;
SGLang also needs its CUDA kernel package to import, which the tests shim: tests/engines/shims).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

ENGINES = ("vllm", "sglang")
_REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class EngineLaunchConfig:
    engine: str  # "vllm" | "sglang"
    model: str  # a local model directory
    block_size: int = 32
    python: str = ""  # the engine's interpreter; "" = default_python(engine)
    device: str = "cuda"  # "cpu" adds the CPU-only flags above
    served_model_name: str = ""  # "" = the engine's default (the model path)
    extra_args: tuple[str, ...] = ()  # appended to every server's command line
    env: dict[str, str] = field(default_factory=dict)  # added to every server's environment
    cpu_memory_share: float = 0.05  # vLLM on CPU: --gpu-memory-utilization per server

    def validate(self) -> EngineLaunchConfig:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if not Path(self.model).is_dir():
            raise ValueError(f"--model must be a local model directory for --engine {self.engine}, got {self.model!r}")
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"device must be cuda or cpu, got {self.device!r}")
        return self


@dataclass(frozen=True, slots=True)
class EngineServer:
    """One engine server to start: its command line and environment, and the agent's flags for it."""

    argv: list[str]
    env: dict[str, str]
    agent_args: list[str]
    endpoint: str


def default_python(engine: str) -> str:
    venv = _REPO_ROOT / f".venv-{engine}" / "bin" / "python"
    return str(venv) if venv.exists() else "python3"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_for_agent(config: EngineLaunchConfig) -> EngineServer:
    """The engine server one agent sits beside, on fresh loopback ports."""
    port, events, replay = _free_port(), _free_port(), _free_port()
    python = config.python or default_python(config.engine)
    events_endpoint, replay_endpoint = f"tcp://127.0.0.1:{events}", f"tcp://127.0.0.1:{replay}"
    # Both engines' publishers bind only a wildcard address (a concrete one makes the PUB socket
    # connect instead); SGLang's "bind": true binds loopback, vLLM has no such switch.
    served = ["--served-model-name", config.served_model_name] if config.served_model_name else []
    env = dict(config.env)
    if config.engine == "vllm":
        kv_events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{events}",
            "replay_endpoint": replay_endpoint,
        }
        argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", config.model, *served,
                "--host", "127.0.0.1", "--port", str(port), "--block-size", str(config.block_size),
                "--enable-prefix-caching", "--enable-prompt-tokens-details", "--kv-events-config", json.dumps(kv_events)]  # fmt: skip
        if config.device == "cpu":
            argv += ["--gpu-memory-utilization", str(config.cpu_memory_share)]
        endpoint = f"http://127.0.0.1:{port}"
    else:
        kv_events = {"publisher": "zmq", "endpoint": events_endpoint, "bind": True, "replay_endpoint": replay_endpoint}
        argv = [python, "-m", "sglang.launch_server", "--model-path", config.model, *served,
                "--host", "127.0.0.1", "--port", str(port), "--smg-grpc-mode", "--page-size", str(config.block_size),
                # The scheduler API listens on --port; SGLang still checks --grpc-port, which
                # defaults to --port + 10000 and is refused past 65535: give it a real one.
                "--grpc-port", str(_free_port()),
                "--kv-events-config", json.dumps(kv_events)]  # fmt: skip
        if config.device == "cpu":
            argv += ["--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph"]
            env.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        endpoint = f"127.0.0.1:{port}"
    agent_args = ["--engine", config.engine, "--engine-endpoint", endpoint, "--kv-events-endpoint", events_endpoint,
                  "--kv-events-replay-endpoint", replay_endpoint]  # fmt: skip
    return EngineServer([*argv, *config.extra_args], {**os.environ, **env}, agent_args, endpoint)
