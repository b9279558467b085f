"""The periodic KV snapshot is not published again while it would repeat the last one exactly
(dataplane/agent/link.py): a changed cache, a replica's request or SNAPSHOT_REPEAT_MAX_S publish
it. A fake Registry over loopback gRPC plays the control plane, as in test_link_latency.py."""

from __future__ import annotations

import asyncio

from kvplane.dataplane.agent import link as link_module
from kvplane.dataplane.agent.config import AgentConfig
from kvplane.dataplane.agent.link import ControlPlaneLink
from kvplane.security.credentials import Credentials
from kvplane.types import BlockHash
from kvplane.v1 import common_pb2, registry_pb2

from .helpers import wait_until
from .test_link_latency import FakeRegistry, serve_registry


class SnapshotRegistry(FakeRegistry):
    def __init__(self) -> None:
        super().__init__(None)
        self.snapshots = 0
        self.ask_for_snapshot = False

    async def PublishKVEvents(self, request, context):
        self.snapshots += request.snapshot
        return registry_pb2.PublishKVEventsResponse()

    async def ReportLoad(self, request, context):
        self.reports.append(request)
        asked, self.ask_for_snapshot = self.ask_for_snapshot, False
        return registry_pb2.ReportLoadResponse(snapshot_requested=asked)


def test_an_unchanged_cache_is_not_snapshotted_again_until_it_changes_is_asked_for_or_ages(monkeypatch):
    async def body():
        registry = SnapshotRegistry()
        server, address = await serve_registry(registry)
        cache = [BlockHash(b"a" * 16)]
        link = ControlPlaneLink(
            AgentConfig(
                worker_id="w1", controlplane=address, load_report_interval_s=0.02, kv_event_interval_s=0.01, kv_snapshot_interval_s=0.05
            ).validate(),
            info=lambda: common_pb2.WorkerInfo(worker_id="w1"),
            load=lambda: (common_pb2.WorkerLoad(), common_pb2.WORKER_STATE_ACTIVE),
            take_events=lambda: [],
            snapshot=lambda: list(cache),
            credentials=Credentials.plaintext(source="test"),
        )

        async def reports(count: int) -> None:  # a clock: the link's loops have turned many times
            target = len(registry.reports) + count
            await wait_until(lambda: len(registry.reports) >= target, f"{target} load reports")

        try:
            await link.start(timeout_s=5)
            await reports(30)  # 0.6 s: a dozen snapshot intervals
            assert registry.snapshots == 1  # the registration's, never repeated
            cache.append(BlockHash(b"b" * 16))
            await wait_until(lambda: registry.snapshots == 2, "the changed cache's snapshot")
            await reports(30)
            assert registry.snapshots == 2
            registry.ask_for_snapshot = True
            await wait_until(lambda: registry.snapshots == 3, "the snapshot a replica asked for")
            await reports(30)
            assert registry.snapshots == 3
            monkeypatch.setattr(link_module, "SNAPSHOT_REPEAT_MAX_S", 0.0)  # the last one is too old to stand for the cache
            await wait_until(lambda: registry.snapshots >= 5, "repeated snapshots")
        finally:
            await link.stop()
            await server.stop(0)

    asyncio.run(body())
