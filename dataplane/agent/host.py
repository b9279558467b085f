"""Several agents in one process: `kvplane agent --count N` (a simulated fleet on a few cores).

Each agent is a whole agent (its own engine, gRPC server, port and control-plane link, run by
server.serve) in one shared event loop; SIGINT/SIGTERM stop them all, and so does one agent
failing. Worker ids are `<--worker-id>-<i>`; ports are free ones (--port 0) or --port + i.
With mutual TLS every agent presents its own worker certificate: `{worker_id}` in --tls-cert and
--tls-key (or $KVPLANE_TLS_CERT/_KEY) stands for each agent's id. With --insecure they all
present the join token.

Meant for engines that sleep instead of computing (`--engine sim`): N agents share one core, so
N compute-bound engines would only slow each other down.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import secrets
import signal
import socket
from collections.abc import Callable

from kvplane import telemetry
from kvplane.dataplane.agent.config import AgentConfig
from kvplane.dataplane.agent.server import serve
from kvplane.security.credentials import ENV_CERT, ENV_KEY, Credentials

WORKER_ID_FIELD = "{worker_id}"


def agents_from_args(
    args: argparse.Namespace, one_agent: Callable[[argparse.Namespace], tuple[AgentConfig, Credentials]]
) -> list[tuple[AgentConfig, Credentials]]:
    """The (config, credentials) of each of the `args.count` agents; `one_agent` builds one from
    its own copy of the flags. ValueError naming what is wrong."""
    if args.fault_injection:
        raise ValueError("--fault-injection signals one agent; run agents with it one per process (drop --count)")
    cert, key = args.tls_cert or os.environ.get(ENV_CERT, ""), args.tls_key or os.environ.get(ENV_KEY, "")
    if not args.insecure and cert and not (WORKER_ID_FIELD in cert and WORKER_ID_FIELD in key):
        raise ValueError(
            f"with --count each agent presents its own worker certificate: put {WORKER_ID_FIELD} in --tls-cert and --tls-key "
            f"(e.g. certs/{WORKER_ID_FIELD}.pem), or run --insecure with a --join-token"
        )
    if args.port and args.port + args.count - 1 > 65535:
        raise ValueError(f"--port {args.port} + --count {args.count} runs past port 65535")
    base = args.worker_id or f"{args.role}-{socket.gethostname()}-{secrets.token_hex(3)}"
    agents = []
    for i in range(args.count):
        worker_id = f"{base}-{i}"
        own = copy.copy(args)
        own.worker_id, own.port = worker_id, args.port + i if args.port else 0
        if cert:
            own.tls_cert, own.tls_key = cert.replace(WORKER_ID_FIELD, worker_id), key.replace(WORKER_ID_FIELD, worker_id)
        agents.append(one_agent(own))
    return agents


async def serve_many(agents: list[tuple[AgentConfig, Credentials]]) -> None:
    """Runs every agent until SIGINT/SIGTERM or until one of them fails (then stops the rest and
    raises its error)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(serve(config, credentials, stop), name=config.worker_id) for config, credentials in agents]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    stop.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    telemetry.shutdown()
    failures = [(task.get_name(), r) for task, r in zip(tasks, results, strict=True) if isinstance(r, BaseException)]
    if failures:
        name, error = failures[0]
        raise RuntimeError(f"agent {name} failed ({error}); stopped all {len(agents)} agents of this process") from error
