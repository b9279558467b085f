"""What a NIXL prefill agent tells a decode agent: who it is and where the pinned blocks live.

Binary, not pickle (a descriptor crosses trust boundaries): a magic line, a length-prefixed JSON
header (agent name, layout, memory type), the length-prefixed NIXL agent metadata blob, then one
little-endian uint64 triple (address, length, device id) per pinned block, in pin order.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import numpy as np

from kvplane.dataplane.transport.base import TransportError, layout_from_dict, layout_to_dict
from kvplane.types import KVLayout

_MAGIC = b"kvplane-nixl-1\n"
_U32 = struct.Struct("<I")


@dataclass(frozen=True, slots=True)
class NixlDescriptor:
    agent_name: str
    metadata: bytes  # nixl_agent.get_agent_metadata() of the serving agent
    layout: KVLayout
    mem_type: str  # "DRAM" or "VRAM"
    blocks: np.ndarray  # [num_blocks, 3] uint64: address, length, device id

    @property
    def num_blocks(self) -> int:
        return int(self.blocks.shape[0])

    def encode(self) -> bytes:
        header = json.dumps(
            {
                "agent_name": self.agent_name,
                "layout": layout_to_dict(self.layout),
                "mem_type": self.mem_type,
                "num_blocks": self.num_blocks,
            },
            separators=(",", ":"),
        ).encode()
        rows = np.ascontiguousarray(self.blocks, dtype="<u8").tobytes()
        return b"".join((_MAGIC, _U32.pack(len(header)), header, _U32.pack(len(self.metadata)), self.metadata, rows))

    @classmethod
    def decode(cls, data: bytes) -> NixlDescriptor:
        if not data.startswith(_MAGIC):
            raise TransportError("not a nixl transport descriptor (bad magic); did the peer choose another transport?")
        try:
            pos = len(_MAGIC)
            (header_len,) = _U32.unpack_from(data, pos)
            pos += _U32.size
            header = json.loads(data[pos : pos + header_len])
            pos += header_len
            (metadata_len,) = _U32.unpack_from(data, pos)
            pos += _U32.size
            metadata = bytes(data[pos : pos + metadata_len])
            if len(metadata) != metadata_len:
                raise ValueError("metadata is cut short")
            pos += metadata_len
            num_blocks = int(header["num_blocks"])
            if len(data) - pos != num_blocks * 24:
                raise ValueError(f"expected {num_blocks} block rows, found {len(data) - pos} bytes")
            blocks = np.frombuffer(data, dtype="<u8", count=num_blocks * 3, offset=pos).reshape(num_blocks, 3)
            return cls(str(header["agent_name"]), metadata, layout_from_dict(header["layout"]), str(header["mem_type"]), blocks)
        except (struct.error, ValueError, KeyError, TypeError) as e:
            raise TransportError(f"corrupt nixl transport descriptor: {e}") from None
