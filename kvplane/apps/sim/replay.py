"""The same workload on real processes: replays `SimRequest`s against a running control plane
(e.g. `kvplane up --engine sim`) and records what the client measured, in the simulator's terms,
so `kvplane sim --compare-processes` can set virtual-time and real-process rows side by side.

Open loop, as `kvplane bench load`: each request is sent at its arrival time (a request with
`after` also waits for that one to end), streamed with ignore_eos, and timed at the client: TTFT
from its send to its first token, TPOT = (last - first token) / (tokens - 1). With sim agents
running at `speedup` (simulated seconds per wall second), arrivals are divided by it and every
measured duration multiplied by it, so the records are in simulated seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from kvplane.apps.sim.simulator import Record, SimRequest


async def replay(
    endpoint: str, requests: Sequence[SimRequest], *, speedup: float = 1.0, timeout_s: float = 600.0,
    log: Callable[[str], None] = lambda message: None,
) -> tuple[list[Record], dict[str, int], float]:  # fmt: skip
    """(records, per-worker prompt tokens computed + tokens generated, simulated seconds from the
    first send to the last reply)."""
    from kvplane.client import AsyncClient
    from kvplane.errors import KvplaneError, RejectedError

    records = [Record(i, r.priority, r.arrival_s, r.num_prompt_tokens, r.max_tokens) for i, r in enumerate(requests)]
    ended = [asyncio.Event() for _ in requests]
    loads: dict[str, int] = {}
    loop = asyncio.get_running_loop()

    async with AsyncClient(endpoint, timeout=timeout_s) as client:
        workers = await client.workers()
        loads.update({w.worker_id: 0 for w in workers})
        start = loop.time()
        last_reply = start
        done = 0

        def sim_s(wall: float) -> float:
            return (wall - start) * speedup

        async def one(i: int) -> None:
            nonlocal last_reply, done
            spec, rec = requests[i], records[i]
            try:
                if spec.after >= 0:
                    await ended[spec.after].wait()
                await asyncio.sleep(max(0.0, start + spec.arrival_s / speedup - loop.time()))
                rec.sent_s = sim_s(loop.time())
                stream = client.stream(list(spec.make_prompt()), max_tokens=spec.max_tokens, ignore_eos=True, priority=spec.priority)
                async for chunk in stream:
                    now = loop.time()
                    if chunk.token_ids:
                        rec.first_token_s = sim_s(now) if rec.first_token_s is None else rec.first_token_s
                        rec.last_token_s = sim_s(now)
                        rec.num_tokens += len(chunk.token_ids)
                    if chunk.metrics is not None:
                        _record_metrics(rec, chunk.metrics, loads, speedup)
                rec.admitted = True
                rec.finished_s = sim_s(loop.time())
            except RejectedError:
                rec.rejected = True
            except KvplaneError:
                rec.admitted = rec.failed = True
            finally:
                last_reply = max(last_reply, loop.time())
                done += 1
                ended[i].set()

        async def progress() -> None:
            started = time.monotonic()
            while done < len(requests):
                await asyncio.sleep(5.0)
                log(f"  [processes] {done}/{len(requests)} requests ended, wall {time.monotonic() - started:.0f} s")

        reporter = asyncio.create_task(progress())
        await asyncio.gather(*(one(i) for i in range(len(requests))))
        reporter.cancel()
    return records, loads, (last_reply - start) * speedup


def _record_metrics(rec: Record, m, loads: dict[str, int], speedup: float) -> None:
    rec.decode_worker, rec.prefill_worker = m.decode_worker, m.prefill_worker
    rec.disaggregated = m.disaggregated
    rec.cached_tokens = m.cached_tokens
    rec.fetched = bool(m.kv_fetched_from)
    rec.kv_transfer_bytes = m.kv_transfer_bytes
    rec.kv_transfer_s = m.kv_transfer_ms / 1000 * speedup
    rec.predicted_ttft_s = m.predicted_ttft_ms / 1000 * speedup if m.predicted_ttft_ms else None
    loads[m.prefill_worker] = loads.get(m.prefill_worker, 0) + m.prefill_computed_tokens
    loads[m.decode_worker] = loads.get(m.decode_worker, 0) + rec.num_tokens
