"""Who may call what on an agent (with mutual TLS; a plaintext agent relies on tickets alone).

The control plane sends the work and the admin calls (Generate, Drain, Undrain, Profile; it
tokenizes prompts itself, so no worker sees a prompt not routed to it); clients call Generate themselves in lookaside mode, with the ticket a control plane
placed their request under (the servicer checks it names the caller's tenant); peer workers prefill and move KV for each other (Prefill, PullKV, ReleaseKV); status
is open to the cluster's components and admins. The servicer then checks each call's ticket, and
for peer calls that the caller is the worker the ticket names.
"""

from __future__ import annotations

from kvplane.security.auth import Rule, rule
from kvplane.security.identity import Role
from kvplane.v1 import agent_pb2

_AGENT = agent_pb2.DESCRIPTOR.services_by_name["Agent"].full_name

CONTROLPLANE_METHODS = ("Drain", "Undrain", "Profile")
PEER_METHODS = ("Prefill", "PullKV", "ReleaseKV")


def policy() -> dict[str, Rule]:
    table = {f"/{_AGENT}/{m}": rule(Role.CONTROLPLANE) for m in CONTROLPLANE_METHODS}
    table[f"/{_AGENT}/Generate"] = rule(Role.CONTROLPLANE, Role.CLIENT, Role.ADMIN)
    table |= {f"/{_AGENT}/{m}": rule(Role.WORKER) for m in PEER_METHODS}
    table[f"/{_AGENT}/GetStatus"] = rule(Role.CONTROLPLANE, Role.WORKER, Role.ADMIN)
    return table
