"""The agent's configuration: one validated dataclass, the source of every default."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvplane.dataplane import engines
from kvplane.dataplane.engines.reference.config import EngineConfig
from kvplane.dataplane.engines.registry import EngineSettings
from kvplane.dataplane.transport.nixl import PROGRESS_DELAY_US
from kvplane.types import Role


@dataclass(frozen=True, slots=True)
class AgentConfig:
    worker_id: str
    role: Role = Role.BOTH
    host: str = "127.0.0.1"
    port: int = 0  # 0 = any free port
    advertise_host: str = ""  # what peers dial; default = host
    controlplane: str = "127.0.0.1:50051"
    engine_name: str = engines.DEFAULT_ENGINE  # which engine (dataplane/engines/registry.py)
    engine: EngineSettings = field(default_factory=EngineConfig)  # that engine's config dataclass
    transports: tuple[str, ...] = ()  # empty = every available transport, best first
    nixl_progress_delay_us: int = PROGRESS_DELAY_US  # NIXL's progress thread's wait between polls
    # What the engine runs on, as the control plane groups workers priced with one step-time
    # model ("" = what the engine says: the reference engine its device, the sim its GPU; vLLM
    # and SGLang say nothing, and then workers of one model and layout are grouped).
    hardware: str = ""
    # The KV link's rate to its peers, GB/s (0 = what the engine says: the sim its modeled link).
    link_gb_per_s: float = 0.0
    lease_ttl_s: int = 0  # 0 = the control plane's default
    load_report_interval_s: float = 0.2
    kv_event_interval_s: float = 0.1  # batch KV events this often
    kv_snapshot_interval_s: float = 10.0  # and publish a full snapshot this often
    pin_timeout_s: float = 30.0  # prefill-side pins are released if not pulled by then
    pin_check_interval_s: float = 1.0  # how often expired pins are looked for
    prefill_timeout_s: float = 120.0  # decode side gives up on a remote prefill after this (or the request's deadline)
    transfer_timeout_s: float = 60.0  # and on pulling its KV after this (or the request's deadline)
    # A decode pool too full to pull a prefilled prompt into: wait this long for steps to free
    # blocks (as vLLM and SGLang decode workers queue for memory) before prefilling locally. Keep
    # it under the prefill workers' pin_timeout_s: a pull after they unpinned fails (and then
    # prefills locally too). 0: prefill locally at once.
    import_wait_s: float = 10.0
    # Testing only: SIGUSR1 drops the next KV event batch, SIGUSR2 cuts the next KV pull served
    # over the gRPC stream after its first chunk (the chaos suite's faults).
    fault_injection: bool = False
    # The agent lives and dies with its engine: once the engine has not served for this long
    # (health() named a reason throughout), the agent deregisters and exits.
    engine_down_grace_s: float = 2.0

    def validate(self) -> AgentConfig:
        if not self.worker_id or "/" in self.worker_id:
            raise ValueError("worker_id must be a non-empty string without '/'")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        for name in (
            "load_report_interval_s",
            "kv_event_interval_s",
            "kv_snapshot_interval_s",
            "pin_timeout_s",
            "pin_check_interval_s",
            "prefill_timeout_s",
            "transfer_timeout_s",
            "engine_down_grace_s",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.import_wait_s < 0:
            raise ValueError(f"import_wait_s must be >= 0 (0 = prefill locally at once when the KV pool is full), got {self.import_wait_s}")
        if self.nixl_progress_delay_us < 0:
            raise ValueError(f"nixl_progress_delay_us must be >= 0 (0 = poll without waiting), got {self.nixl_progress_delay_us}")
        if self.lease_ttl_s != 0 and not 2 <= self.lease_ttl_s <= 3600:
            raise ValueError(f"lease_ttl_s must be 0 (the control plane's default) or 2..3600 seconds, got {self.lease_ttl_s}")
        engines.check_config(self.engine_name, self.engine)
        return self
