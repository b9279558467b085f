"""Fixtures for transport tests: real peer processes that serve pinned KV blocks.

The peer pins PINNED (block ids of its pool, deliberately out of order, with one adjacent run
3,4,5) under several transfer ids; tests pull through a fresh local pool.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .kv_peer import Peer, start_peer

PEER_NUM_BLOCKS = 12
PEER_SEED = 1234
PINNED = [7, 3, 4, 5, 1, 11]


@pytest.fixture(scope="module")
def grpc_peer() -> Iterator[Peer]:
    peer = start_peer("grpc", PEER_NUM_BLOCKS, PEER_SEED, PINNED)
    yield peer
    peer.stop()


@pytest.fixture(scope="module")
def nixl_peer() -> Iterator[Peer]:
    peer = start_peer("nixl", PEER_NUM_BLOCKS, PEER_SEED, PINNED)
    yield peer
    peer.stop()
