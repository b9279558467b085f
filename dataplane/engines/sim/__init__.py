"""The sim engine: a simulated GPU behind the engine interface (dataplane/engines/base.py).

The real paged KV bookkeeping (dataplane/engines/paged: block manager, prefix cache, scheduler,
KV events) with a timing model instead of a forward pass (kvplane.hardware: a roofline of a named
GPU and model with tensor parallelism, or a measured profile). engine.SimEngine is a clock-free
step machine; adapter.SimAdapter drives it in an agent (asyncio, wall-clock sleeps scaled by
--speedup) and `kvplane sim` drives it in virtual time. KV transfers go through the real
transport code with a scaled-down payload and take the named link's modeled time. No torch.
"""

from kvplane.dataplane.engines.sim.config import SimConfig
from kvplane.dataplane.engines.sim.engine import SimEngine

__all__ = ["SimConfig", "SimEngine"]
