"""The settings every external engine shares, and their flags (added once, read by each engine).

Flags share one namespace across engines (dataplane/engines/registry.py): the first external
engine's plugin adds these, later ones find them there and add only their own.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ExternalEngineConfig:
    endpoint: str = ""  # the engine's API; "" = the engine's default (its plugin says which)
    kv_events_endpoint: str = "tcp://127.0.0.1:5557"  # the engine's ZMQ KV-event publisher
    kv_events_replay_endpoint: str = ""  # its replay (ROUTER) endpoint; "" = gaps resync
    kv_events_topic: str = ""
    model_config: str = ""  # the model's directory (config.json) for its KV shape; "" = the path the engine reports
    start_timeout_s: float = 300.0  # how long start() waits for the engine to answer (it may be loading)
    load_poll_interval_s: float = 0.25  # how often the engine's load and health are read

    def validate(self) -> ExternalEngineConfig:
        if not self.kv_events_endpoint.startswith(("tcp://", "ipc://")):
            raise ValueError(
                f"kv_events_endpoint must be a ZMQ address such as tcp://127.0.0.1:5557 (the engine's "
                f"--kv-events-config endpoint), got {self.kv_events_endpoint!r}"
            )
        if self.kv_events_replay_endpoint and not self.kv_events_replay_endpoint.startswith(("tcp://", "ipc://")):
            raise ValueError(f"kv_events_replay_endpoint must be a ZMQ address, got {self.kv_events_replay_endpoint!r}")
        if self.start_timeout_s <= 0 or self.load_poll_interval_s <= 0:
            raise ValueError("start_timeout_s and load_poll_interval_s must be positive")
        return self


def add_shared_arguments(group: argparse._ArgumentGroup) -> None:
    """Adds the shared flags unless an earlier engine's group already did."""
    if "--engine-endpoint" in group._option_string_actions:
        return
    d = ExternalEngineConfig()
    group.add_argument("--engine-endpoint", default=d.endpoint, metavar="ADDR",
                       help="external engines: the engine server's API (vllm: http://HOST:PORT, default http://127.0.0.1:8000; "
                       "sglang: HOST:PORT of its gRPC server, default 127.0.0.1:30000)")  # fmt: skip
    group.add_argument("--kv-events-endpoint", default=d.kv_events_endpoint, metavar="ZMQ",
                       help="external engines: the engine's ZMQ KV-event publisher; a tcp://*:P address makes the agent bind, for a "
                       "publisher that connects (default %(default)s)")  # fmt: skip
    group.add_argument("--kv-events-replay-endpoint", default=d.kv_events_replay_endpoint, metavar="ZMQ",
                       help="external engines: its replay endpoint, to recover lost event batches (default: none; a gap then "
                       "resyncs: the index forgets the engine's blocks)")  # fmt: skip
    group.add_argument("--kv-events-topic", default=d.kv_events_topic, help="external engines: the KV-event topic (default: all)")
    group.add_argument("--engine-model-config", default=d.model_config, metavar="DIR",
                       help="external engines: the model directory (for its KV shape) if the path the engine reports is not readable here")  # fmt: skip
    group.add_argument("--engine-start-timeout", type=float, default=d.start_timeout_s, metavar="SECONDS",
                       help="external engines: seconds to wait for the engine to answer at start; it may be loading (default %(default)s)")  # fmt: skip


def shared_from_args(args: argparse.Namespace) -> dict:
    """The shared fields, as keyword arguments for an engine's config dataclass."""
    return dict(
        endpoint=args.engine_endpoint,
        kv_events_endpoint=args.kv_events_endpoint,
        kv_events_replay_endpoint=args.kv_events_replay_endpoint,
        kv_events_topic=args.kv_events_topic,
        model_config=args.engine_model_config,
        start_timeout_s=args.engine_start_timeout,
    )
