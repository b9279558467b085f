"""The NIXL KV transport: one-sided READs of pinned blocks, UCX backend (DRAM or VRAM).

One NIXL agent per transport (so per agent process), named `<agent_name>-<pid>-<random>` so a
restarted worker never shares a name with its previous life. The whole pool buffer is
registered once at construction; `describe` then costs nothing but encoding: this agent's
name and metadata, the layout, and (address, length, device) of each pinned block.

`pull` loads the peer's metadata once per peer name (again if it changed), builds local and
remote descriptor lists for only the requested blocks (merging runs that are adjacent on both
sides), posts a READ and polls it. Every NIXL call runs on one private thread: NIXL agents are
not thread-safe in their default sync mode, and posting a large READ over shared memory copies
inline, which must not stall the event loop; between polls the loop sleeps briefly.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from kvplane.dataplane.transport.base import (
    KVPoolLike,
    PullSource,
    TransferError,
    TransportError,
    TransportUnavailableError,
    check_layout,
    check_pool,
    check_pull_args,
)
from kvplane.dataplane.transport.nixl_descriptor import NixlDescriptor

NAME = "nixl"
BACKEND = "UCX"

log = logging.getLogger(__name__)
T = TypeVar("T")

# NIXL's exception messages are bare status names; say what they usually mean here.
_HINTS = {
    "nixlNotFoundError": "the described blocks are not in memory the peer registered (stale or corrupt descriptor?)",
    "nixlRemoteDisconnectError": "the peer agent disconnected (did its process exit?)",
    "nixlBackendError": "the UCX backend could not reach the peer or move the data (is the peer alive?)",
}


# UCX modules this process must not load (UCX_MODULES syntax), unless the user sets UCX_MODULES.
# The nixl wheels bundle their own rdma-core (libibverbs, libnl-3, libnl-route-3 under mangled
# names) for every UCX module but one: `efa` (libuct_ib_efa) links the system's libefa.so.1. On a
# host with the RDMA userspace libraries (libibverbs1 + ibverbs-providers, on every InfiniBand or
# RoCE machine) loading it brings the system libibverbs and libnl-route into the process beside
# the bundled copies; the system libnl-route's constructors bind to the bundled one's symbols
# (rtnl_tc_register), its registrations collide, and its destructor at exit unlinks an entry that
# was never registered: every process that made a UCX agent died with SIGSEGV on exit.
# Without that module UCX keeps every transport it can drive with the bundled libraries
# (shared memory, TCP, CMA, and the verbs transports of the bundled rdma-core); EFA
# (an AWS adapter, which NIXL reaches through its libfabric backend instead) is what is left out.
UCX_MODULES_DEFAULT = "^efa"


def _exclude_conflicting_ucx_modules() -> None:
    """Sets UCX_MODULES before UCX reads its configuration (when libucs loads with nixl)."""
    os.environ.setdefault("UCX_MODULES", UCX_MODULES_DEFAULT)


def _import_nixl():
    _exclude_conflicting_ucx_modules()
    try:
        import nixl  # noqa: PLC0415 (optional dependency)
    except Exception as e:  # ImportError, or a broken wheel raising at import time
        raise TransportUnavailableError(
            f"the nixl transport needs the nixl package (pip install 'kvplane[nixl]'); importing it failed: {e}"
        ) from None
    if not os.environ.get("NIXL_LOG_LEVEL"):
        # NIXL logs every agent and backend creation at INFO to stdout; keep agents' stdout clean.
        logging.getLogger("nixl").setLevel(logging.WARNING)
    return nixl


# How long NIXL's progress thread waits for UCX events between two polls, microseconds. NIXL's
# Python wrapper (nixl 1.5.1, nixl/_api.py) sets it to 0: the thread polls without waiting and
# keeps a whole core busy per agent, idle or not (measured here: 1.00 core idle at 0, 0.025 at
# 1,000). A transfer's initiator polls its own READ's state, so the wait delays no pull.
PROGRESS_DELAY_US = 1000
_creating = threading.Lock()  # the wrapper's binding is swapped for the duration of one creation


def _create_agent(name: str, progress_delay_us: int = PROGRESS_DELAY_US):
    """A NIXL agent with the UCX backend, or TransportUnavailableError saying why not."""
    nixl = _import_nixl()
    try:
        with _creating:
            agent = _agent_with_progress_delay(nixl, name, progress_delay_us)
    except Exception as e:
        raise TransportUnavailableError(f"creating a NIXL agent failed: {type(e).__name__}: {e}") from None
    plugins = agent.get_plugin_list()
    if BACKEND not in plugins:
        raise TransportUnavailableError(f"NIXL has no {BACKEND} plugin (available plugins: {plugins})")
    try:
        agent.create_backend(BACKEND)
    except Exception as e:
        raise TransportUnavailableError(f"creating the NIXL {BACKEND} backend failed: {type(e).__name__}: {e}") from None
    return agent


def _agent_with_progress_delay(nixl, name: str, progress_delay_us: int):
    """nixl.nixl_agent(name, ...) with its progress thread waiting `progress_delay_us` between
    polls. The wrapper builds the binding's config itself and passes it to the binding's
    nixlAgent, so that one call is wrapped here to set pthrDelay on the way (a wrapper without
    that binding gets NIXL's own setting, with a warning)."""
    config = nixl.nixl_agent_config(enable_prog_thread=True, backends=[])
    api = sys.modules.get("nixl._api")
    binding = getattr(api, "nixlBind", None)
    if binding is None or not hasattr(binding, "nixlAgent"):
        log.warning("this nixl wrapper has no nixlBind.nixlAgent: its progress thread keeps NIXL's own delay")
        return nixl.nixl_agent(name, config)

    class _WithDelay:
        def __getattr__(self, attr: str):
            return getattr(binding, attr)

        @staticmethod
        def nixlAgent(agent_name, agent_config):  # noqa: N802 (the binding's name)
            agent_config.pthrDelay = progress_delay_us
            return binding.nixlAgent(agent_name, agent_config)

    api.nixlBind = _WithDelay()
    try:
        return nixl.nixl_agent(name, config)
    finally:
        api.nixlBind = binding


@functools.cache
def nixl_unavailable_reason() -> str | None:
    """None when NIXL with UCX works in this process, else why not. Probed once (~0.5 s)."""
    try:
        _create_agent(f"kvplane-probe-{os.getpid()}-{secrets.token_hex(4)}")
    except TransportUnavailableError as e:
        return str(e)
    return None


def merge_runs(local_rows: np.ndarray, remote_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merges consecutive descriptor pairs that are adjacent in memory on both sides.

    Rows are (address, length, device). Fewer, larger descriptors mean fewer UCX operations.
    """
    merged_local: list[list[int]] = []
    merged_remote: list[list[int]] = []
    for (l_addr, l_len, l_dev), (r_addr, r_len, r_dev) in zip(local_rows.tolist(), remote_rows.tolist()):
        if merged_local:
            last_l, last_r = merged_local[-1], merged_remote[-1]
            if last_l[0] + last_l[1] == l_addr and last_r[0] + last_r[1] == r_addr and last_l[2] == l_dev and last_r[2] == r_dev:
                last_l[1] += l_len
                last_r[1] += r_len
                continue
        merged_local.append([l_addr, l_len, l_dev])
        merged_remote.append([r_addr, r_len, r_dev])
    return np.array(merged_local, dtype=np.uint64).reshape(-1, 3), np.array(merged_remote, dtype=np.uint64).reshape(-1, 3)


class NixlTransport:
    """KVTransport over NIXL; construct one per process and pool."""

    name = NAME

    def __init__(
        self,
        pool: KVPoolLike,
        *,
        agent_name: str = "",
        timeout_s: float = 60.0,
        max_poll_interval_s: float = 0.002,
        progress_delay_us: int = PROGRESS_DELAY_US,
    ) -> None:
        if progress_delay_us < 0:
            raise ValueError(f"progress_delay_us must be >= 0 (0 = NIXL polls without waiting), got {progress_delay_us}")
        check_pool(pool)
        self._pool = pool
        self._timeout_s = timeout_s
        self._max_poll_interval_s = max_poll_interval_s
        buffer = pool.buffer
        self._mem_type = "DRAM" if buffer.device.type == "cpu" else "VRAM"
        self._device_id = buffer.device.index or 0
        self._base_address = buffer.data_ptr()
        self.agent_name = f"{agent_name or 'kvplane'}-{os.getpid()}-{secrets.token_hex(4)}"
        started = time.perf_counter()
        self._agent = _create_agent(self.agent_name, progress_delay_us)
        try:
            self._registration = self._agent.register_memory(
                [(self._base_address, pool.num_blocks * pool.block_nbytes, self._device_id, "")], self._mem_type
            )
        except Exception as e:
            raise TransportUnavailableError(
                f"NIXL could not register the KV pool ({pool.num_blocks * pool.block_nbytes} bytes of {self._mem_type}): "
                f"{type(e).__name__}: {e}"
            ) from None
        self._metadata = self._agent.get_agent_metadata()
        self.startup_s = time.perf_counter() - started  # agent + backend creation + registration
        self._remote_name_to_metadata: dict[str, bytes] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nixl")
        self._closed = False

    # -- server side ---------------------------------------------------------------------------

    def describe(self, block_ids: Sequence[int]) -> bytes:
        pool = self._pool
        bad = [b for b in block_ids if not 0 <= b < pool.num_blocks]
        if bad:
            raise ValueError(f"block ids {list(bad)[:5]} are outside the pool (0..{pool.num_blocks - 1})")
        ids = np.asarray(list(block_ids), dtype=np.uint64)
        blocks = np.empty((len(ids), 3), dtype=np.uint64)
        blocks[:, 0] = np.uint64(self._base_address) + ids * np.uint64(pool.block_nbytes)
        blocks[:, 1] = pool.block_nbytes
        blocks[:, 2] = self._device_id
        return NixlDescriptor(self.agent_name, self._metadata, pool.layout, self._mem_type, blocks).encode()

    # -- client side ---------------------------------------------------------------------------

    async def pull(self, source: PullSource, src_block_indices: Sequence[int], dst_block_ids: Sequence[int]) -> int:
        if self._closed:
            raise TransportError("the nixl transport is closed")
        descriptor = NixlDescriptor.decode(source.descriptor)
        pool = self._pool
        check_layout(pool.layout, source.layout)
        check_layout(pool.layout, descriptor.layout)
        src_block_indices, dst_block_ids = list(src_block_indices), list(dst_block_ids)
        check_pull_args(pool, descriptor.num_blocks, src_block_indices, dst_block_ids)
        if not src_block_indices:
            return 0
        remote_rows = descriptor.blocks[np.asarray(src_block_indices, dtype=np.int64)]
        wrong = remote_rows[remote_rows[:, 1] != pool.block_nbytes]
        if len(wrong):
            raise TransferError(
                f"peer {descriptor.agent_name} describes blocks of {int(wrong[0, 1])} bytes, local blocks have {pool.block_nbytes}"
            )
        local_rows = np.empty_like(remote_rows)
        local_rows[:, 0] = np.uint64(self._base_address) + np.asarray(dst_block_ids, dtype=np.uint64) * np.uint64(pool.block_nbytes)
        local_rows[:, 1] = pool.block_nbytes
        local_rows[:, 2] = self._device_id
        local_rows, remote_rows = merge_runs(local_rows, remote_rows)

        where = f"NIXL READ of transfer {source.transfer_id} from {descriptor.agent_name} at {source.endpoint}"
        remote_name = await self._call(where, self._load_remote, descriptor)
        agent = self._agent
        handle = await self._call(
            where,
            lambda: agent.initialize_xfer(
                "READ",
                agent.get_xfer_descs(local_rows, self._mem_type),
                agent.get_xfer_descs(remote_rows, descriptor.mem_type),
                remote_name,
            ),
        )
        done = False
        try:
            state = await self._call(where, agent.transfer, handle)
            deadline = time.monotonic() + self._timeout_s
            interval = 0.0001
            while state == "PROC":
                if time.monotonic() > deadline:
                    raise TransferError(f"{where} did not finish within {self._timeout_s} s")
                await asyncio.sleep(interval)
                interval = min(interval * 2, self._max_poll_interval_s)
                state = await self._call(where, agent.check_xfer_state, handle)
            if state != "DONE":
                raise TransferError(f"{where} failed (state {state}); is the peer still alive?")
            done = True
        finally:
            try:
                await self._call(where, handle.release)
            except TransferError as e:
                # Releasing an unfinished READ aborts it; if even that fails, say so loudly.
                (log.warning if not done else log.error)("releasing %s: %s", where, e)
        return len(src_block_indices) * pool.block_nbytes

    def _load_remote(self, descriptor: NixlDescriptor) -> str:
        """Loads the peer's metadata once per (name, metadata); runs on the NIXL thread."""
        known = self._remote_name_to_metadata.get(descriptor.agent_name)
        if known == descriptor.metadata:
            return descriptor.agent_name
        if known is not None:
            self._agent.remove_remote_agent(descriptor.agent_name)
            del self._remote_name_to_metadata[descriptor.agent_name]
        loaded = self._agent.add_remote_agent(descriptor.metadata)
        loaded = loaded.decode() if isinstance(loaded, bytes) else str(loaded)
        if loaded != descriptor.agent_name:
            raise TransferError(f"the descriptor names agent {descriptor.agent_name!r} but its metadata is for {loaded!r}")
        self._remote_name_to_metadata[loaded] = descriptor.metadata
        return loaded

    async def _call(self, where: str, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, *args)
        except TransportError:
            raise
        except Exception as e:
            kind = type(e).__name__
            hint = f"; {_HINTS[kind]}" if kind in _HINTS else ""
            raise TransferError(f"{where}: {kind}: {e}{hint}") from None

    @property
    def num_remote_agents(self) -> int:
        return len(self._remote_name_to_metadata)

    def close(self) -> None:
        """Waits for in-flight NIXL calls, then forgets peers and deregisters the pool."""
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown(wait=True)
        for name in list(self._remote_name_to_metadata):
            try:
                self._agent.remove_remote_agent(name)
            except Exception as e:
                log.warning("NIXL: forgetting remote agent %s failed: %s", name, e)
        self._remote_name_to_metadata.clear()
        try:
            self._agent.deregister_memory(self._registration)
        except Exception as e:
            log.warning("NIXL: deregistering the KV pool failed: %s", e)
