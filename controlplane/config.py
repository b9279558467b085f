"""The control plane's configuration: one validated dataclass, the source of every default."""

from __future__ import annotations

from dataclasses import dataclass, field

from controlplane.core.planner import PlannerConfig

DEFAULT_PORT = 50051


@dataclass(frozen=True, slots=True)
class ControlPlaneConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    store: str = "memory"  # "memory" or "etcd://host:port"
    lease_ttl_s: int = 10  # worker leases; agents renew at a third of it
    kv_compact_every_s: float = 10.0  # drop a worker's event batches older than its latest snapshot
    max_route_attempts: int = 2  # a decode worker that fails before the first token is retried elsewhere once
    batch_queue_size: int = 64  # batch requests that may wait for admission instead of being rejected
    batch_queue_timeout_s: float = 30.0  # how long one may wait before it is rejected after all
    batch_poll_s: float = 0.05  # how often a waiting batch request asks admission again
    http_port: int = -1  # the OpenAI-compatible HTTP API (controlplane/http/): -1 = off, 0 = any free port
    planner: PlannerConfig = field(default_factory=PlannerConfig)  # routing, admission, prediction

    def validate(self) -> ControlPlaneConfig:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if not -1 <= self.http_port <= 65535:
            raise ValueError(f"http_port must be -1 (off) or in 0..65535, got {self.http_port}")
        if self.lease_ttl_s < 2:
            raise ValueError(f"lease_ttl_s must be at least 2 seconds, got {self.lease_ttl_s}")
        if self.batch_queue_size < 0 or self.batch_queue_timeout_s < 0 or self.batch_poll_s <= 0:
            raise ValueError("batch_queue_size and batch_queue_timeout_s must be >= 0 and batch_poll_s > 0")
        if self.max_route_attempts < 1:
            raise ValueError(f"max_route_attempts must be at least 1, got {self.max_route_attempts}")
        self.planner.validate()
        return self
