"""The control plane's configuration: one validated dataclass, the source of every default."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvplane import tickets
from kvplane.controlplane.batch_limits import BatchLimits
from kvplane.controlplane.bus import check_bus_url
from kvplane.controlplane.core.failover import FailoverLimits
from kvplane.controlplane.core.planner import PlannerConfig
from kvplane.security import limits

DEFAULT_PORT = 50051
_CONNECTIONS = limits.ConnectionLimits()  # gRPC connection defaults, written once there


@dataclass(frozen=True, slots=True)
class ControlPlaneConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    store: str = "memory"  # "memory", "etcd://host:port" or "etcd://h1:p1,h2:p2,..." (members of one cluster)
    # How load reports and KV events reach every replica (controlplane/bus/): "auto" (in-process with
    # the memory store, the store with etcd), "memory", "store", "nats://host:port[,...]" or "tls://...".
    bus: str = "auto"
    lease_ttl_s: int = 10  # worker leases; agents renew at a third of it
    kv_compact_every_s: float = 10.0  # drop a worker's event batches older than its latest snapshot
    max_route_attempts: int = 2  # a decode worker that fails before the first token is retried elsewhere once
    max_migrations: int = 2  # after tokens were sent, a failed decode worker's request moves at most this often
    first_token_timeout_s: float = 60.0  # no first token this long after dispatch: the worker stalled
    token_timeout_s: float = 15.0  # no next token this long: the worker stalled
    batch_queue_size: int = 64  # batch requests that may wait for admission instead of being rejected
    batch_queue_timeout_s: float = 30.0  # how long one may wait before it is rejected after all
    batch_poll_s: float = 0.05  # how often a waiting batch request asks admission again
    http_port: int = -1  # the OpenAI-compatible HTTP API (controlplane/http/): -1 = off, 0 = any free port
    # A request body larger than this is refused (413) without being read; one that does not
    # arrive whole within the timeout gets 408 (controlplane/http/guard.py).
    http_max_body_bytes: int = limits.HTTP_MAX_BODY_BYTES
    http_body_timeout_s: float = 30.0
    planner: PlannerConfig = field(default_factory=PlannerConfig)  # routing, admission, prediction
    # What a registering worker must match (controlplane/registration.py): the models this cluster
    # serves (empty = any) and the KV block size of every worker (0 = one per model, set by its first worker).
    models: tuple[str, ...] = ()
    block_size: int = 0
    # The tokenizers this replica tokenizes prompts with, `[MODEL=]DIR` each (controlplane/tokenizer.py):
    # none needed for models whose workers all use the builtin byte tokenizer.
    tokenizers: tuple[str, ...] = ()
    # Whether a worker's KV events are believed as they come (True), or only for blocks this replica
    # routed to it (False, the default: issue 28). With False a restarted or new replica rebuilds
    # the index from the store but credits a block only once it routes a request holding it there,
    # so the first request per prefix after a restart routes by load; True keeps cache routing across
    # replica restarts where every worker is trusted (one tenant, one operator).
    trust_worker_cache_claims: bool = False
    # Limits (docs/security.md): what one caller or worker can make this replica hold or do.
    max_lease_ttl_s: int = 60  # a worker asking for a longer lease gets this one
    max_workers: int = 1024  # registered workers in the cluster
    max_hashes_per_batch: int = limits.KV_BATCH_MAX_HASHES  # block hashes in one KV event batch
    max_blocks_per_worker: int = limits.MAX_BLOCKS_PER_WORKER  # blocks the cache index keeps for one worker
    max_prompt_bytes: int = limits.MAX_PROMPT_BYTES  # prompt text, before tokenization
    rate_limit_rps: float = 200.0  # client-API calls per second per identity (0 = no limit)
    rate_limit_burst: int = 400
    # gRPC connections (kvplane.security.limits.ConnectionLimits): handshake and idle timeouts, and
    # a cap on all connections at once (gRPC has no per-peer cap).
    grpc_handshake_timeout_s: float = _CONNECTIONS.handshake_timeout_s
    grpc_idle_timeout_s: float = _CONNECTIONS.idle_timeout_s
    grpc_max_connections: int = _CONNECTIONS.max_connections
    ticket_ttl_s: float = tickets.DEFAULT_TICKET_TTL_S  # at most tickets.MAX_TTL_S
    # etcd's own TLS (its CA; a client certificate whose CN is an etcd user) and password auth.
    etcd_ca: str = ""
    etcd_cert: str = ""
    etcd_key: str = ""
    etcd_user: str = ""
    etcd_password_file: str = ""
    # Testing only (the chaos suite): SIGUSR1 makes the replica miss the bus messages it receives for a while.
    fault_injection: bool = False
    # NATS's TLS (a tls:// bus): its CA, and a client certificate where NATS verifies clients.
    bus_ca: str = ""
    bus_cert: str = ""
    bus_key: str = ""
    bus_stream_replicas: int = 1  # copies of each JetStream stream in a NATS cluster (at most 5)
    # The NATS URL agents publish their load reports and KV batches to themselves ("" = they report over gRPC).
    # Then every bus message must carry a valid MAC (kvplane/bus.py): workers can reach the bus.
    bus_for_agents: str = ""

    @property
    def store_options(self) -> dict:
        """Keyword arguments of open_store for this config's store (etcd TLS and auth)."""
        if not self.store.startswith("etcd"):
            return {}
        options: dict = {}
        if self.etcd_ca or self.etcd_cert:
            from kvplane.security.credentials import Credentials  # noqa: PLC0415

            options["tls"] = Credentials.from_files(self.etcd_cert or None, self.etcd_key or None, self.etcd_ca or None, source="--etcd-*")
        if self.etcd_user:
            options["username"] = self.etcd_user
            options["password"] = open(self.etcd_password_file).read().strip() if self.etcd_password_file else ""
        return options

    @property
    def bus_tls(self):
        """The ssl.SSLContext for a tls:// bus (None otherwise)."""
        if not self.bus.startswith("tls://"):
            return None
        import ssl  # noqa: PLC0415

        context = ssl.create_default_context(cafile=self.bus_ca or None)
        if self.bus_cert:
            context.load_cert_chain(self.bus_cert, self.bus_key)
        return context

    @property
    def connection_limits(self) -> limits.ConnectionLimits:
        return limits.ConnectionLimits(
            handshake_timeout_s=self.grpc_handshake_timeout_s,
            idle_timeout_s=self.grpc_idle_timeout_s,
            max_connections=self.grpc_max_connections,
        )

    @property
    def batch_limits(self) -> BatchLimits:
        return BatchLimits(self.max_hashes_per_batch, self.max_blocks_per_worker)

    @property
    def failover(self) -> FailoverLimits:
        return FailoverLimits(self.max_route_attempts, self.max_migrations)

    def validate(self) -> ControlPlaneConfig:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if not -1 <= self.http_port <= 65535:
            raise ValueError(f"http_port must be -1 (off) or in 0..65535, got {self.http_port}")
        if not 1024 <= self.http_max_body_bytes <= limits.HTTP_MAX_BODY_BYTES_CAP:
            raise ValueError(f"http_max_body_bytes must be in 1024..{limits.HTTP_MAX_BODY_BYTES_CAP}, got {self.http_max_body_bytes}")
        if not 0 < self.http_body_timeout_s <= 3600:
            raise ValueError(f"http_body_timeout_s must be in (0, 3600] seconds, got {self.http_body_timeout_s}")
        self.connection_limits.validate()
        if self.lease_ttl_s < 2:
            raise ValueError(f"lease_ttl_s must be at least 2 seconds, got {self.lease_ttl_s}")
        if self.batch_queue_size < 0 or self.batch_queue_timeout_s < 0 or self.batch_poll_s <= 0:
            raise ValueError("batch_queue_size and batch_queue_timeout_s must be >= 0 and batch_poll_s > 0")
        if self.max_route_attempts < 1:
            raise ValueError(f"max_route_attempts must be at least 1, got {self.max_route_attempts}")
        if self.max_migrations < 0:
            raise ValueError(f"max_migrations must be >= 0, got {self.max_migrations}")
        for name in ("first_token_timeout_s", "token_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.block_size < 0:
            raise ValueError(f"block_size must be >= 0 (0 = set by each model's first worker), got {self.block_size}")
        if any(not m for m in self.models):
            raise ValueError("a served model name must not be empty")
        if not 2 <= self.max_lease_ttl_s <= 3600 or self.lease_ttl_s > self.max_lease_ttl_s:
            raise ValueError(f"max_lease_ttl_s must be in 2..3600 and at least lease_ttl_s, got {self.max_lease_ttl_s}")
        if min(self.max_workers, self.max_hashes_per_batch, self.max_blocks_per_worker, self.max_prompt_bytes, self.rate_limit_burst) < 1:
            raise ValueError("max_workers, max_hashes_per_batch, max_blocks_per_worker, max_prompt_bytes and rate_limit_burst must be >= 1")
        if self.rate_limit_rps < 0:
            raise ValueError(f"rate_limit_rps must be >= 0 (0 = no limit), got {self.rate_limit_rps}")
        if not 0 < self.ticket_ttl_s <= tickets.MAX_TTL_S:
            raise ValueError(f"ticket_ttl_s must be in (0, {tickets.MAX_TTL_S:g}] seconds, got {self.ticket_ttl_s}")
        if bool(self.etcd_cert) != bool(self.etcd_key):
            raise ValueError("--etcd-cert and --etcd-key go together")
        check_bus_url(self.bus, self.store)
        if not 1 <= self.bus_stream_replicas <= 5:
            raise ValueError(f"--bus-stream-replicas must be in 1..5 (JetStream's limit), got {self.bus_stream_replicas}")
        if bool(self.bus_cert) != bool(self.bus_key):
            raise ValueError("--bus-cert and --bus-key go together")
        if (self.bus_ca or self.bus_cert) and not self.bus.startswith("tls://"):
            raise ValueError("--bus-ca and --bus-cert are for a tls://HOST:PORT bus")
        if self.bus_for_agents:
            if check_bus_url(self.bus, self.store) != "nats":
                raise ValueError("--bus-for-agents needs a NATS bus (--bus nats://HOST:PORT or tls://HOST:PORT): agents publish to NATS")
            if check_bus_url(self.bus_for_agents, self.store) != "nats":
                raise ValueError(f"--bus-for-agents must be nats://HOST:PORT[,...] or tls://HOST:PORT[,...], got {self.bus_for_agents!r}")
        if bool(self.etcd_user) != bool(self.etcd_password_file):
            raise ValueError("--etcd-user needs --etcd-password-file (a file holding the password)")
        self.planner.validate()
        return self
