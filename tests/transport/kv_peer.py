"""A real prefill-side peer for transport tests, run as its own OS process.

    python -m tests.transport.kv_peer --transport grpc|nixl --num-blocks N --seed S --pinned 7,3,4

It fills a pool from the seed, pins the listed block ids under transfer ids t0..t3, serves them
(grpc: a grpc.aio server whose PullKV yields iter_chunks; nixl: a registered NIXL agent), prints
one `KV_PEER_READY {json}` line and serves until its stdin closes. The test process rebuilds the
same pool from the same seed to know the expected bytes. The pool helpers live here too, so the
peer and the tests build pools the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from kvplane.types import KVLayout

READY_PREFIX = "KV_PEER_READY "
NUM_TRANSFERS = 4
LAYOUT = KVLayout(model="tiny-test", num_layers=2, num_kv_heads=2, head_dim=16, dtype="float32", block_size=4)
_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


@dataclass(slots=True)
class TensorPool:
    """A real KV pool: one contiguous tensor of blocks (what the reference engine's KVPool holds)."""

    buffer: torch.Tensor
    layout: KVLayout

    @property
    def num_blocks(self) -> int:
        return int(self.buffer.shape[0])

    @property
    def block_nbytes(self) -> int:
        return self.layout.block_nbytes

    def host_bytes(self) -> memoryview | None:
        if self.buffer.device.type != "cpu":
            return None
        return memoryview(self.buffer.reshape(-1).view(torch.uint8).numpy())


@dataclass(slots=True)
class Peer:
    """A running kv_peer process and what it announced."""

    process: subprocess.Popen
    endpoint: str
    descriptor: bytes
    transfer_ids: list[str]
    pinned: list[int]
    seed: int
    num_blocks: int
    info: dict

    def stop(self) -> None:
        """Closes the peer's stdin (its signal to exit) and reaps it; kills it after 10 s."""
        self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()


def start_peer(transport: str, num_blocks: int, seed: int, pinned: list[int]) -> Peer:
    """Starts a peer process and waits until it serves."""
    repo_root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(repo_root), os.environ.get("PYTHONPATH")])))
    argv = [
        sys.executable,
        "-m",
        "tests.transport.kv_peer",
        "--transport",
        transport,
        "--num-blocks",
        str(num_blocks),
        "--seed",
        str(seed),
        "--pinned",
        ",".join(map(str, pinned)),
    ]
    process = subprocess.Popen(argv, cwd=repo_root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    for line in process.stdout:  # skip anything a library printed first
        if line.startswith(READY_PREFIX):
            info = json.loads(line[len(READY_PREFIX) :])
            return Peer(
                process, info["endpoint"], base64.b64decode(info["descriptor"]), info["transfer_ids"], list(pinned), seed, num_blocks, info
            )
    process.wait()
    raise RuntimeError(f"kv_peer ({transport}) exited with code {process.returncode} before it was ready; see its stderr above")


def pool_shape(layout: KVLayout, num_blocks: int) -> tuple[int, ...]:
    return (num_blocks, layout.num_layers, 2, layout.block_size, layout.num_kv_heads, layout.head_dim)


def empty_pool(layout: KVLayout, num_blocks: int) -> TensorPool:
    return TensorPool(torch.zeros(pool_shape(layout, num_blocks), dtype=_TORCH_DTYPES[layout.dtype]), layout)


def filled_pool(layout: KVLayout, num_blocks: int, seed: int) -> TensorPool:
    generator = torch.Generator().manual_seed(seed)
    data = torch.randn(pool_shape(layout, num_blocks), generator=generator, dtype=torch.float32)
    return TensorPool(data.to(_TORCH_DTYPES[layout.dtype]).contiguous(), layout)


async def _serve_grpc(pool: TensorPool, pinned: list[int], ready: dict) -> None:
    import grpc  # noqa: PLC0415

    from kvplane.convert import layout_from_pb  # noqa: PLC0415
    from kvplane.dataplane.transport.grpc_stream import DEFAULT_CHUNK_BYTES, GrpcStreamTransport, iter_chunks  # noqa: PLC0415
    from kvplane.grpc_util import make_server  # noqa: PLC0415
    from kvplane.v1 import agent_pb2, agent_pb2_grpc  # noqa: PLC0415

    transfer_to_block_ids = {f"t{i}": list(pinned) for i in range(NUM_TRANSFERS)}

    class PeerServicer(agent_pb2_grpc.AgentServicer):
        """Serves PullKV and ReleaseKV as the agent does, from a fixed pin table."""

        async def PullKV(self, request, context):
            block_ids = transfer_to_block_ids.get(request.transfer_id)
            if block_ids is None:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown transfer {request.transfer_id!r}")
            mismatch = pool.layout.mismatch(layout_from_pb(request.layout))
            if mismatch:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, mismatch)
            try:
                for chunk in iter_chunks(pool, block_ids, list(request.block_indices), request.chunk_bytes or DEFAULT_CHUNK_BYTES):
                    yield chunk
            finally:
                if request.release_after:
                    transfer_to_block_ids.pop(request.transfer_id, None)

        async def ReleaseKV(self, request, context):
            return agent_pb2.ReleaseKVResponse(released=transfer_to_block_ids.pop(request.transfer_id, None) is not None)

    server = make_server()
    agent_pb2_grpc.add_AgentServicer_to_server(PeerServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    transport = GrpcStreamTransport(pool)
    ready.update(endpoint=f"127.0.0.1:{port}", descriptor=base64.b64encode(transport.describe(pinned)).decode())
    print(READY_PREFIX + json.dumps(ready), flush=True)
    await asyncio.to_thread(sys.stdin.read)  # serve until the test closes our stdin
    await server.stop(0)


def _serve_nixl(pool: TensorPool, pinned: list[int], ready: dict) -> None:
    from kvplane.dataplane.transport.nixl import NixlTransport  # noqa: PLC0415

    transport = NixlTransport(pool, agent_name="kv-peer")
    ready.update(
        endpoint="nixl-peer",
        descriptor=base64.b64encode(transport.describe(pinned)).decode(),
        agent_name=transport.agent_name,
        startup_s=transport.startup_s,
    )
    print(READY_PREFIX + json.dumps(ready), flush=True)
    sys.stdin.read()
    transport.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--transport", choices=["grpc", "nixl"], required=True)
    parser.add_argument("--num-blocks", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--pinned", required=True, help="comma-separated block ids pinned for every transfer")
    args = parser.parse_args()
    pool = filled_pool(LAYOUT, args.num_blocks, args.seed)
    pinned = [int(b) for b in args.pinned.split(",")]
    ready = {"transfer_ids": [f"t{i}" for i in range(NUM_TRANSFERS)]}
    if args.transport == "grpc":
        asyncio.run(_serve_grpc(pool, pinned, ready))
    else:
        _serve_nixl(pool, pinned, ready)


def assert_pulled(local: TensorPool, peer: Peer, src_block_indices: list[int], dst_block_ids: list[int]) -> None:
    """Each destination block holds exactly the peer's pinned source block; all others are still zero."""
    source = filled_pool(local.layout, peer.num_blocks, peer.seed)
    for index, dst in zip(src_block_indices, dst_block_ids):
        assert torch.equal(local.buffer[dst], source.buffer[peer.pinned[index]]), (index, dst)
    untouched = [b for b in range(local.num_blocks) if b not in set(dst_block_ids)]
    assert torch.count_nonzero(local.buffer[untouched]).item() == 0


if __name__ == "__main__":
    main()
