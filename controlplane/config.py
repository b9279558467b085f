"""The control plane's configuration: one validated dataclass, the source of every default."""
from __future__ import annotations

from dataclasses import dataclass, field

from controlplane.core.admission import AdmissionConfig
from controlplane.core.router import RouterConfig

DEFAULT_PORT = 50051


@dataclass(frozen=True, slots=True)
class ControlPlaneConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    store: str = "memory"                 # "memory" or "etcd://host:port"
    lease_ttl_s: int = 10                 # worker leases; agents renew at a third of it
    kv_compact_every_s: float = 10.0      # drop a worker's event batches older than its latest snapshot
    max_route_attempts: int = 2           # a decode worker that fails before the first token is retried elsewhere once
    router: RouterConfig = field(default_factory=RouterConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)

    def validate(self) -> "ControlPlaneConfig":
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.lease_ttl_s < 2:
            raise ValueError(f"lease_ttl_s must be at least 2 seconds, got {self.lease_ttl_s}")
        if self.max_route_attempts < 1:
            raise ValueError(f"max_route_attempts must be at least 1, got {self.max_route_attempts}")
        self.router.validate()
        self.admission.validate()
        return self
