"""The chaos suite's fault schedule: seeded, bounded, randomized. Plain Python.

`make_schedule(seed, num_steps, targets)` draws one fault per step from FAULT_KINDS (each kind at
least once when there are enough steps, then at random), with its target and how long it lasts;
the same seed always gives the same schedule, so a failing run can be replayed.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# kind -> the kind of process it targets ("" = none: it acts on the traffic or the store).
FAULT_KINDS: Mapping[str, str] = {
    "kill_agent": "agent",  # SIGKILL; the supervisor restarts it
    "stop_agent": "agent",  # SIGSTOP, then SIGCONT after `duration_s`
    "kill_replica": "replica",  # SIGKILL a control-plane replica; the supervisor restarts it
    "stop_replica": "replica",  # SIGSTOP + SIGCONT
    "stop_etcd_member": "etcd",  # stop one etcd member, start it again after `duration_s`
    "drop_kv_batch": "agent",  # SIGUSR1: the agent loses its next KV event batch
    "cut_transfer": "prefill",  # SIGUSR2: the next KV pull it serves breaks after one chunk
    "client_cancel": "",  # a burst of callers that give up mid-stream or on short deadlines
    "kill_bus": "bus",  # SIGKILL nats-server, start it again (same storage) after `duration_s`
    "drop_bus_messages": "replica",  # SIGUSR1: the replica misses what the bus brings it for 2 s
}


@dataclass(frozen=True, slots=True)
class Fault:
    step: int
    kind: str
    target: str  # a process name, an etcd member name, or "" (client_cancel)
    duration_s: float  # how long the fault lasts before it heals (stop/start faults), or the traffic window

    def __str__(self) -> str:
        target = f" {self.target}" if self.target else ""
        return f"{self.kind}{target} ({self.duration_s:.1f} s)"


def make_schedule(seed: int, num_steps: int, targets: Mapping[str, Sequence[str]]) -> list[Fault]:
    """`targets`: per target kind (agent, replica, etcd, prefill), the names a fault may hit."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    rng = random.Random(seed)
    kinds = [k for k, t in FAULT_KINDS.items() if not t or targets.get(t)]
    order = rng.sample(kinds, len(kinds))  # every kind once first (as far as the steps go)
    order += [rng.choice(kinds) for _ in range(max(0, num_steps - len(order)))]
    faults = []
    for step, kind in enumerate(order[:num_steps]):
        names = targets.get(FAULT_KINDS[kind], ())
        target = rng.choice(list(names)) if names else ""
        faults.append(Fault(step, kind, target, round(rng.uniform(2.0, 5.0), 1)))
    return faults
