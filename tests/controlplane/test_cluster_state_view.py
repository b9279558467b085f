"""ClusterState.view(): a worker's view is built once per change of its entry, not per request.
The embedded memory store and a real ClusterState; no processes."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from kvplane.controlplane import keys
from kvplane.controlplane.cluster_state import ClusterState
from kvplane.controlplane.core.health import HealthConfig, WorkerHealth
from kvplane.controlplane.store import MemoryStore
from kvplane.v1 import common_pb2, registry_pb2


async def _settle(predicate, what: str) -> None:
    for _ in range(200):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def _views(state: ClusterState) -> dict:
    return {w.worker_id: w for w in state.view().workers}


def test_views_are_reused_until_a_report_a_state_change_or_a_departure_changes_the_worker():
    async def body():
        store = MemoryStore()
        state = ClusterState(store)
        await state.start()
        try:
            for w in ("a", "b"):
                info = common_pb2.WorkerInfo(worker_id=w, role=common_pb2.ROLE_BOTH, endpoint=f"{w}:1", model="m")
                await store.put(keys.worker_key(w), info.SerializeToString())
            await _settle(lambda: len(state.workers) == 2, "both workers")
            generation = state.workers_generation
            first = _views(state)
            assert _views(state)["a"] is first["a"] and _views(state)["b"] is first["b"]

            report = registry_pb2.ReportLoadRequest(worker_id="a", load=common_pb2.WorkerLoad(num_running=3))
            await store.put(keys.load_key("a"), report.SerializeToString())
            await _settle(lambda: _views(state)["a"].load.num_running == 3, "a's report in its view")
            second = _views(state)
            assert second["b"] is first["b"]  # b did not change

            state.set_worker_state("a", common_pb2.WORKER_STATE_DRAINING)  # what DrainWorker does
            assert _views(state)["a"].active is False and second["a"].active is True
            assert state.view() is state.view()  # nothing changed: the same view, columns and all
            view = state.view()
            assert view.table is not None and [w.worker_id for w in view.table.views] == [w.worker_id for w in view.workers]
            assert list(view.table.active) == [w.active for w in view.workers]

            assert state.workers_generation == generation  # reports and states are not membership
            info = common_pb2.WorkerInfo(worker_id="a", role=common_pb2.ROLE_BOTH, endpoint="a:1", model="m")
            await store.put(keys.worker_key("a"), info.SerializeToString())  # registered again, the same
            await store.put(keys.worker_key("a"), info.SerializeToString())
            info.tokenizer = "byte"
            await store.put(keys.worker_key("a"), info.SerializeToString())  # and with other info
            await _settle(lambda: state.workers["a"].info.tokenizer == "byte", "a's new info")
            assert state.workers_generation == generation + 1

            await store.delete(keys.worker_key("b"))
            await _settle(lambda: "b" not in _views(state), "b's departure")
            assert state.workers_generation == generation + 2
        finally:
            await state.stop()

    asyncio.run(body())


def test_workers_of_one_kind_are_priced_with_one_model_and_other_hardware_apart():
    """Two agents of one model, layout, chunk and hardware fit their own step-time models from
    different steps; their views carry the kind's pooled model (core/step_pool.py), so identical
    workers are not told apart by their fits' noise. A worker on other hardware keeps its own."""

    def latency(c1: float) -> common_pb2.LatencyModel:
        return common_pb2.LatencyModel(coefficients=[0.01, c1, 0.0, 1e-4, 1e-7], num_samples=50, mean_abs_pct_error=0.05)

    async def body():
        store = MemoryStore()
        state = ClusterState(store)
        await state.start()
        try:
            for w, hardware in (("a", "H100 x4"), ("b", "H100 x4"), ("c", "A10 x1")):
                info = common_pb2.WorkerInfo(
                    worker_id=w, role=common_pb2.ROLE_BOTH, endpoint=f"{w}:1", model="m", max_num_batched_tokens=2048, hardware=hardware
                )
                await store.put(keys.worker_key(w), info.SerializeToString())
            await _settle(lambda: len(state.workers) == 3, "the workers")
            for w, c1 in (("a", 2e-5), ("b", 4e-5), ("c", 9e-5)):
                report = registry_pb2.ReportLoadRequest(worker_id=w, load=common_pb2.WorkerLoad(), latency=latency(c1))
                await store.put(keys.load_key(w), report.SerializeToString())
            await _settle(lambda: all(v.latency is not None for v in _views(state).values()), "every worker's model")
            views = _views(state)
            assert views["a"].latency == views["b"].latency
            assert views["a"].latency.coefficients[1] == pytest.approx(3e-5)
            assert views["c"].latency.coefficients[1] == pytest.approx(9e-5)
            assert list(state.view().table.step[:, 1]) == pytest.approx([3e-5, 3e-5, 9e-5])
        finally:
            await state.stop()

    asyncio.run(body())


def test_the_view_carries_the_median_link_rate_the_workers_state():
    """WorkerInfo.link_gb_per_s (agent --link-gb-per-s, the sim's modeled link): the planner
    predicts KV moves with it until it has measured one (LinkRate)."""

    async def body():
        store = MemoryStore()
        state = ClusterState(store)
        await state.start()

        async def register(w: str, rate: float) -> None:
            info = common_pb2.WorkerInfo(worker_id=w, role=common_pb2.ROLE_BOTH, endpoint=f"{w}:1", model="m", link_gb_per_s=rate)
            await store.put(keys.worker_key(w), info.SerializeToString())

        try:
            await register("a", 0.0)
            await _settle(lambda: len(state.workers) == 1, "a")
            assert state.view().stated_link_bytes_per_s == 0.0  # nobody states one
            for w, rate in (("b", 50.0), ("c", 12.5), ("d", 50.0)):
                await register(w, rate)
            await _settle(lambda: len(state.workers) == 4, "the workers")
            assert state.view().stated_link_bytes_per_s == 50e9  # the median of 12.5, 50, 50
            report = registry_pb2.ReportLoadRequest(worker_id="a", load=common_pb2.WorkerLoad(num_running=1))
            await store.put(keys.load_key("a"), report.SerializeToString())
            await _settle(lambda: _views(state)["a"].load.num_running == 1, "a's report")
            assert state.view().stated_link_bytes_per_s == 50e9  # kept across a partial rebuild
            await register("b", 12.5)  # b restarted on a slower network
            await _settle(lambda: state.workers["b"].info.link_gb_per_s == 12.5, "b again")
            assert state.view().stated_link_bytes_per_s == 12.5e9  # 12.5, 12.5, 50
            await store.delete(keys.worker_key("c"))
            await _settle(lambda: "c" not in state.workers, "c's departure")
            assert state.view().stated_link_bytes_per_s == 50e9  # 12.5, 50: the upper of the middle two
        finally:
            await state.stop()

    asyncio.run(body())


def test_a_report_repeating_the_last_model_keeps_it_and_a_new_model_replaces_it():
    """Reports carry the worker's model every time; one equal to the last is not parsed again, one
    that differs (a refit) is priced from at once."""

    def report(c1: float, running: int) -> registry_pb2.ReportLoadRequest:
        latency = common_pb2.LatencyModel(coefficients=[0.01, c1, 0.0, 1e-4, 1e-7], num_samples=50, mean_abs_pct_error=0.05)
        return registry_pb2.ReportLoadRequest(worker_id="a", load=common_pb2.WorkerLoad(num_running=running), latency=latency)

    async def body():
        store = MemoryStore()
        state = ClusterState(store)
        await state.start()
        try:
            info = common_pb2.WorkerInfo(worker_id="a", role=common_pb2.ROLE_BOTH, endpoint="a:1", model="m")
            await store.put(keys.worker_key("a"), info.SerializeToString())
            await _settle(lambda: "a" in state.workers, "the worker")
            for c1, running in ((2e-5, 1), (2e-5, 2), (7e-5, 3), (7e-5, 4)):
                await store.put(keys.load_key("a"), report(c1, running).SerializeToString())
                await _settle(lambda running=running: state.workers["a"].load.num_running == running, f"report {running}")
                assert state.workers["a"].latency.coefficients[1] == pytest.approx(c1)
                assert state.view().table.step[0, 1] == pytest.approx(c1)
        finally:
            await state.stop()

    asyncio.run(body())


def test_the_store_probe_keeps_store_ok_at_current():
    """store_ok_at (when the store and the bus last answered) is what lets routing take a worker
    whose reports stopped out of routing, and what kvplane_store_up shows. The probe once read a
    key constant that no longer existed: its task died at its first pass and store_ok_at stayed at
    the start, so no worker was ever judged silent."""

    async def body():
        state = ClusterState(MemoryStore())
        await state.start()
        try:
            started = state.store_ok_at
            assert started is not None
            await _settle(lambda: state.store_ok_at > started, "the first probe")
            probed = state.store_ok_at
            await _settle(lambda: state.store_ok_at > probed, "the probe after that")
        finally:
            await state.stop()

    asyncio.run(body())


def test_a_background_task_that_dies_is_logged_at_once(caplog):
    async def body():
        state = ClusterState(MemoryStore())

        async def broken_probe():
            raise RuntimeError("a bug in the probe")

        state._probe = broken_probe
        with caplog.at_level(logging.ERROR, logger="kvplane.controlplane.cluster_state"):
            await state.start()
            try:
                await _settle(lambda: any("store-probe died" in r.getMessage() for r in caplog.records), "the error log")
            finally:
                await state.stop()

    asyncio.run(body())


def test_a_worker_is_silent_only_while_others_reports_get_through():
    """When every report stops at once (the store's watch or the bus broke, not the workers) nobody
    is judged silent; when one worker's stop and another's keep arriving, that one is."""

    async def report(store, worker_id: str) -> None:
        load = common_pb2.WorkerLoad(num_running=1)
        await store.put(keys.load_key(worker_id), registry_pb2.ReportLoadRequest(worker_id=worker_id, load=load).SerializeToString())

    async def body():
        store = MemoryStore()
        state = ClusterState(store)
        health = WorkerHealth(HealthConfig(silent_after_s=0.3))
        await state.start()
        try:
            for w in ("a", "b"):
                info = common_pb2.WorkerInfo(worker_id=w, role=common_pb2.ROLE_BOTH, endpoint=f"{w}:1", model="m")
                await store.put(keys.worker_key(w), info.SerializeToString())
                await report(store, w)
            await _settle(lambda: state.last_report_at is not None and len(state.workers) == 2, "both workers' reports")
            last = state.last_report_at
            await asyncio.sleep(1.0)  # the probes go on answering; no report arrives
            assert state.heard_at() == last
            assert health.excluded(state.view(), time.monotonic()) == {}
            for _ in range(8):  # b goes on reporting, a does not
                await report(store, "b")
                await asyncio.sleep(0.1)
            out = health.excluded(state.view(), time.monotonic())
            assert list(out) == ["a"] and out["a"].startswith("no load report for"), out
        finally:
            await state.stop()

    asyncio.run(body())
