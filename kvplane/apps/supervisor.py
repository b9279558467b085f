"""Keeping a local cluster's processes up, as a process manager does: `kvplane up` runs this.

Rule: a child that exits without being asked to is started again after a back-off that doubles
with each consecutive failure (1 s, 2 s, 4 s ... capped at 30 s). A child that ran at least
`healthy_after_s` before exiting starts a fresh count. After `max_failures` consecutive failures
the supervisor gives up (`GaveUp`) and `kvplane up` stops the cluster: a restart that keeps
failing is a configuration to fix, not a fault to ride out. Meanwhile the rest of the cluster
keeps serving (a restarted agent registers again with its id and port; its lease, or the
control plane's routing around it, covers the gap).

`RestartPolicy.next_restart` is plain arithmetic; `Supervisor.step` applies it to a LocalCluster
and takes the time as an argument, so both are tested without waiting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

DEFAULT_MAX_FAILURES = 5


class GaveUp(RuntimeError):
    """A child kept failing; the message names it, its exit codes and its log's last lines."""


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    healthy_after_s: float = 30.0  # a run this long resets the failure count
    max_failures: int = DEFAULT_MAX_FAILURES  # consecutive failures before giving up

    def __post_init__(self) -> None:
        if not (0 < self.initial_backoff_s <= self.max_backoff_s) or self.healthy_after_s <= 0 or self.max_failures < 1:
            raise ValueError(f"RestartPolicy needs 0 < initial_backoff_s <= max_backoff_s, healthy_after_s > 0, max_failures >= 1: {self}")

    def failures_after(self, previous_failures: int, ran_for_s: float) -> int:
        """The consecutive-failure count once a child that ran `ran_for_s` has exited."""
        return 1 if ran_for_s >= self.healthy_after_s else previous_failures + 1

    def backoff_s(self, failures: int) -> float:
        """Seconds before restart number `failures` (1-based)."""
        return min(self.initial_backoff_s * 2 ** (failures - 1), self.max_backoff_s)


class Supervised(Protocol):
    """What the supervisor needs of a cluster (kvplane.apps.cluster.LocalCluster)."""

    started_at: dict[str, float]

    def exited(self) -> dict[str, int]: ...

    def respawn(self, name: str) -> None: ...

    def log_tail(self, name: str, num_lines: int = 30) -> str: ...


@dataclass(slots=True)
class _Record:
    failures: int = 0
    restart_at: float | None = None  # set while an exited child waits for its restart
    exit_codes: list[int] = field(default_factory=list)


class Supervisor:
    def __init__(self, cluster: Supervised, policy: RestartPolicy | None = None) -> None:
        self.cluster = cluster
        self.policy = policy or RestartPolicy()
        self._records: dict[str, _Record] = {}
        self.num_restarts = 0

    def step(self, now: float) -> list[str]:
        """Notices exits and restarts what is due; returns what it did, one line each.
        `now` is time.monotonic() (the clock of LocalCluster.started_at)."""
        lines = []
        for name, code in sorted(self.cluster.exited().items()):
            record = self._records.setdefault(name, _Record())
            if record.restart_at is None:
                ran_for = now - self.cluster.started_at.get(name, now)
                record.failures = self.policy.failures_after(record.failures, ran_for)
                record.exit_codes.append(code)
                if record.failures > self.policy.max_failures:
                    raise GaveUp(
                        f"{name} exited {self.policy.max_failures + 1} times in a row (exit codes {record.exit_codes[-6:]}); "
                        f"giving up. Last lines of its log:\n{self.cluster.log_tail(name)}"
                    )
                delay = self.policy.backoff_s(record.failures)
                record.restart_at = now + delay
                lines.append(f"{name} exited with code {code} after {ran_for:.1f} s; restarting it in {delay:g} s")
            elif now >= record.restart_at:
                self.cluster.respawn(name)
                record.restart_at = None
                self.num_restarts += 1
                lines.append(f"{name} restarted (restart {record.failures} in a row)")
        return lines
