"""The `store` fixture: every store test runs once per backend, each in its own key prefix.

Tests are plain sync functions (no pytest-asyncio): `store.run(body)` opens a store in a fresh
event loop, awaits `body(store, prefix)` under a timeout, and closes the store.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import pytest

from kvplane.controlplane.store import Store, open_store

T = TypeVar("T")


@dataclass(slots=True)
class StoreCase:
    backend: str
    url: str
    prefix: str  # unique per test, so tests sharing one etcd never see each other's keys

    def run(self, body: Callable[[Store, str], Awaitable[T]], timeout_s: float = 20.0) -> T:
        async def main() -> T:
            store = open_store(self.url)
            try:
                return await asyncio.wait_for(body(store, self.prefix), timeout_s)
            finally:
                await store.close()

        return asyncio.run(main())


@pytest.fixture(params=["memory", pytest.param("etcd", marks=pytest.mark.cluster)])
def store(request: pytest.FixtureRequest) -> StoreCase:
    if request.param == "memory":
        url = "memory://"
    else:
        url = f"etcd://{request.getfixturevalue('etcd_endpoint')}"
    return StoreCase(request.param, url, f"/test/{request.node.originalname}/{uuid.uuid4().hex[:8]}/")
