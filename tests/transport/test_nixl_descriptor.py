"""The NIXL descriptor codec (plain bytes; needs no nixl install)."""

from __future__ import annotations

import numpy as np
import pytest

from kvplane.dataplane.transport import TransportError
from kvplane.dataplane.transport.nixl_descriptor import NixlDescriptor

from .kv_peer import LAYOUT


def make_descriptor() -> NixlDescriptor:
    blocks = np.array([[0x7F0000001000, 2048, 0], [0x7F0000000000, 2048, 0]], dtype=np.uint64)
    return NixlDescriptor("prefill-1-1234-abcd", b"\x00metadata\xff", LAYOUT, "DRAM", blocks)


def test_round_trip_keeps_every_field():
    original = make_descriptor()
    decoded = NixlDescriptor.decode(original.encode())
    assert (decoded.agent_name, decoded.metadata, decoded.layout, decoded.mem_type) == (
        "prefill-1-1234-abcd",
        b"\x00metadata\xff",
        LAYOUT,
        "DRAM",
    )
    assert decoded.blocks.tolist() == original.blocks.tolist()
    assert decoded.num_blocks == 2


def test_foreign_bytes_are_refused():
    with pytest.raises(TransportError, match="not a nixl transport descriptor"):
        NixlDescriptor.decode(b'{"transport":"grpc"}')


def test_truncated_descriptor_is_refused():
    data = make_descriptor().encode()
    with pytest.raises(TransportError, match=r"corrupt nixl transport descriptor: expected 2 block rows, found 40 bytes"):
        NixlDescriptor.decode(data[:-8])
