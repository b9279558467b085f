"""open_store() URLs, and what callers see when etcd is unreachable or dies."""

from __future__ import annotations

import asyncio
import socket

import pytest

from kvplane.controlplane.store import MemoryStore, StoreUnavailable, open_store
from kvplane.controlplane.store.etcd import EtcdStore


def test_open_store_memory_urls_give_fresh_stores():
    first, second = open_store("memory"), open_store("memory://")
    assert isinstance(first, MemoryStore) and isinstance(second, MemoryStore)
    assert first is not second


def test_open_store_etcd_url():
    store = open_store("etcd://127.0.0.1:2379")
    assert isinstance(store, EtcdStore)
    assert store.endpoint == "127.0.0.1:2379"
    assert open_store("etcd://[::1]:2379").endpoint == "[::1]:2379"


@pytest.mark.parametrize("url", ["", "redis://h:1", "memory:/", "etcd://127.0.0.1", "etcd://:2379", "etcd://h:port", "etcd://h:1/path"])
def test_open_store_rejects_other_urls(url):
    with pytest.raises(ValueError, match=r'use one of "memory", "memory://", "etcd://host:port"'):
        open_store(url)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_etcd_raises_store_unavailable_naming_the_endpoint():
    port = _closed_port()

    async def body() -> None:
        store = open_store(f"etcd://127.0.0.1:{port}")
        try:
            with pytest.raises(StoreUnavailable, match=f"etcd at 127.0.0.1:{port} is unavailable"):
                await store.get("k")
            with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{port}"):
                await store.lease_keepalive(1)
            with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{port}"):
                await store.watch_prefix("p/").__anext__()
        finally:
            await asyncio.wait_for(store.close(), 3)

    asyncio.run(body())


@pytest.mark.cluster
def test_watch_fails_when_etcd_dies_and_data_survives_a_restart(etcd_factory):
    server = etcd_factory()

    async def before_crash() -> int:
        store = open_store(server.url)
        revision = await store.put("crash/k", b"v")
        watch = store.watch_prefix("crash/", start_revision=revision)
        assert (await watch.__anext__()).key == "crash/k"
        server.kill()
        with pytest.raises(StoreUnavailable, match=server.endpoint):
            await asyncio.wait_for(watch.__anext__(), 5)
        await asyncio.wait_for(store.close(), 3)
        return revision

    async def after_restart(revision: int) -> None:
        store = open_store(server.url)
        kv = await store.get("crash/k")
        assert (kv.value, kv.mod_revision) == (b"v", revision)
        await store.close()

    revision = asyncio.run(before_crash())
    server.restart()
    asyncio.run(after_restart(revision))


def test_missing_etcd_binary_fails_with_instructions(etcd_factory, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(pytest.fail.Exception, match="run `make test`"):
        etcd_factory()
