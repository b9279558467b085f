"""A compressed radix tree over chained block hashes: which workers hold each run of blocks, per tier.

Rule: every indexed block hash belongs to exactly one node, and a node holds a run of blocks
(consecutive blocks of a prompt, in prefix order) that all have the same holders at every tier:
one bitmask of worker bits per tier (device, host, disk) for the whole run. A lookup walks the
prompt's hashes node by node, not block by block: from the node of the block at the current
position it matches the node's whole run at once (one comparison of two tuples, done in C), ANDs
the node's holders into the set of workers still matching, and moves past the run. So a lookup
costs one step per branch point (where the prompt leaves a run, or holders drop out), whatever
the number of blocks: a 4,000-token prefix shared by a thousand workers is one step. The answer
is grouped by match length, as masks: the workers that matched exactly n leading blocks are one
entry, a hot prefix's thousand holders one mask, not a thousand scores.

Where runs come from. The engines' events carry block hashes without their parents, and a worker's
events are its own claims (issue 28), so the tree's edges are never taken from them: an event
changes the holders of single blocks (a block in a run is split out of it first: its run is
dissolved into single blocks), and runs are learned from the prompts that lookups walk, which
the control plane hashed itself: consecutive nodes of a lookup, each matched whole, with equal
holders at every tier, are merged into one. Every match is checked against the node's stored
hashes, so a run can never credit a block the prompt does not have, even for a sequence of
hashes that is not a chain (a test's arbitrary bytes).

Idea from SGLang's RadixCache and Dynamo's radix-tree KV indexer (lib/kv-router), which compress
shared prefixes into nodes; here a node is found by any of its hashes (one dictionary), so the
tree needs no child pointers: chained hashes make a block's hash name its whole prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat

from kvplane.types import BlockHash, Tier


class _Node:
    """A run of blocks with the same holders. `run` is None for a single block (the key it is
    filed under: most blocks, so no tuple is kept for them)."""

    __slots__ = ("run", "device", "host", "disk", "holders")

    def __init__(self, run: tuple[BlockHash, ...] | None, device: int, host: int, disk: int, holders: int) -> None:
        self.run = run
        self.device = device
        self.host = host
        self.disk = disk
        self.holders = holders  # device | host | disk, kept: a lookup ANDs it at every step


class RadixTree:
    """Block hash -> the node holding it; the holders of each node per tier as worker bits."""

    __slots__ = ("_nodes",)

    def __init__(self) -> None:
        self._nodes: dict[BlockHash, _Node] = {}

    # -- writes ----------------------------------------------------------------------------

    def add(self, block_hash: BlockHash, bit: int, tier: Tier) -> None:
        """The worker with bit `bit` holds `block_hash` at `tier`."""
        flag = 1 << bit
        node = self._nodes.get(block_hash)
        if node is None:  # the usual case: a block new to the index
            self._nodes[block_hash] = (
                _Node(None, flag, 0, 0, flag) if tier is Tier.DEVICE
                else _Node(None, 0, flag, 0, flag) if tier is Tier.HOST
                else _Node(None, 0, 0, flag, flag)
            )  # fmt: skip
            return
        if _tier_mask(node, tier) & flag:
            return  # held there already: nothing changes, no run is broken
        if node.run is not None:
            node = self._alone(block_hash)
        if tier is Tier.DEVICE:
            node.device |= flag
        elif tier is Tier.HOST:
            node.host |= flag
        else:
            node.disk |= flag
        node.holders = node.device | node.host | node.disk if node.host or node.disk else node.device

    def discard(self, block_hash: BlockHash, bit: int, tier: Tier) -> None:
        """The worker with bit `bit` no longer holds `block_hash` at `tier` (a no-op when it did not)."""
        flag = 1 << bit
        node = self._nodes.get(block_hash)
        if node is None or not _tier_mask(node, tier) & flag:
            return
        node = self._alone(block_hash)
        if tier is Tier.DEVICE:
            node.device &= ~flag
        elif tier is Tier.HOST:
            node.host &= ~flag
        else:
            node.disk &= ~flag
        node.holders = node.device | node.host | node.disk if node.host or node.disk else node.device
        if not node.holders:
            del self._nodes[block_hash]

    # -- reads -----------------------------------------------------------------------------

    def tier_masks(self, block_hash: BlockHash) -> tuple[int, int, int]:
        """(device, host, disk) holder bits of the block; zeros when nobody holds it."""
        node = self._nodes.get(block_hash)
        return (0, 0, 0) if node is None else (node.device, node.host, node.disk)

    def holders(self, block_hash: BlockHash) -> int:
        """Bits of the workers holding the block at any tier."""
        node = self._nodes.get(block_hash)
        return 0 if node is None else node.holders

    def __len__(self) -> int:
        """Distinct block hashes held by anyone."""
        return len(self._nodes)

    def num_nodes(self) -> int:
        """Nodes (runs and single blocks): how far the tree is compressed."""
        return len({id(node) for node in self._nodes.values()})

    def prefix_groups(self, block_hashes: Sequence[BlockHash]) -> tuple[list[tuple[int, int]], dict[int, list[int]]]:
        """([(n, bits of the workers holding exactly the first n blocks), ...] shortest first,
        {bit: [host, disk] blocks of its match held only off the device} for the workers that
        have any). Runs of the walk that can be merged are merged (module docstring)."""
        hashes = block_hashes  # read only as far as someone still matches
        n = len(hashes)
        get = self._nodes.get
        groups: list[tuple[int, int]] = []
        slower: dict[int, list[int]] = {}
        merges: list[tuple[int, int, _Node]] = []  # (start, end, node): stretches to make one node
        running, pos = -1, 0  # -1: every bit (no node met yet)
        # The stretch of whole nodes with equal holders so far: from `start`, of `count` nodes, the first `first`.
        start, first, count = 0, None, 0
        while pos < n:
            node = get(hashes[pos])
            if node is None:
                break
            run = node.run
            if run is None:
                matched = 1
            else:
                matched = len(run)
                if run != tuple(hashes[pos : pos + matched]):  # the usual case is the whole run (one C comparison)
                    matched = _matched(run, hashes, pos)
                    run = None  # not whole: no stretch goes through it
            holders = node.holders
            kept = running & holders
            if kept != running:
                if running != -1:
                    groups.append((pos, running ^ kept))
                running = kept
                if not kept:
                    break
            if node.host or node.disk:  # rare: blocks held off the device by some of the matching workers
                _count_slower(slower, node, running & ~node.device, matched)
            if count and holders == first.holders and node.run is run and _same_holders(node, first):
                count += 1  # the stretch goes on (run is node.run: this node was matched whole)
            else:
                if count > 1:
                    merges.append((start, pos, first))
                start, first, count = pos, node, int(node.run is run)
            pos += matched
        if count > 1:
            merges.append((start, pos, first))
        if running != -1 and running:
            groups.append((pos, running))
        for begin, end, node in merges:
            self._merge(tuple(hashes[begin:end]), node)
        return groups, slower

    # -- internals -------------------------------------------------------------------------

    def _alone(self, block_hash: BlockHash) -> _Node:
        """The node of `block_hash` alone (created empty when absent): a run it is in is
        dissolved into single blocks first, each with the run's holders."""
        node = self._nodes.get(block_hash)
        if node is None:
            node = self._nodes[block_hash] = _Node(None, 0, 0, 0, 0)
            return node
        run = node.run
        if run is not None:
            node.run = None
            d, h, k, a = node.device, node.host, node.disk, node.holders
            self._nodes.update((other, _Node(None, d, h, k, a)) for other in run if other != block_hash)
            self._nodes[block_hash] = node
        return node

    def _merge(self, run: tuple[BlockHash, ...], node: _Node) -> None:
        """Make `node` the one node of `run`, when the nodes of its blocks hold exactly its blocks
        with `node`'s holders (a sequence that is not a chain can repeat a hash: then nothing)."""
        nodes = set(map(self._nodes.__getitem__, run))
        if len(set(run)) != len(run) or sum(map(_length, nodes)) != len(run) or not all(_same_holders(o, node) for o in nodes):
            return
        node.run = run
        self._nodes.update(zip(run, repeat(node)))


def _tier_mask(node: _Node, tier: Tier) -> int:
    return node.device if tier is Tier.DEVICE else node.host if tier is Tier.HOST else node.disk


def _length(node: _Node) -> int:
    return 1 if node.run is None else len(node.run)


def _same_holders(a: _Node, b: _Node) -> bool:
    return a.device == b.device and a.host == b.host and a.disk == b.disk


def _matched(run: tuple[BlockHash, ...], hashes: Sequence[BlockHash], pos: int) -> int:
    """How many blocks of `hashes` from `pos` on equal `run` from the position of hashes[pos] in it."""
    offset = 0 if run[0] == hashes[pos] else run.index(hashes[pos])  # a run is entered at its start but for odd inputs
    m = min(len(run) - offset, len(hashes) - pos)
    if tuple(hashes[pos : pos + m]) == run[offset : offset + m]:  # the usual case: the whole run (a C comparison)
        return m
    # Chained hashes: equal at i means equal before i, so the first difference is found by halving;
    # the prefix found is then checked, and a sequence that is not a chain is compared one by one.
    lo, hi = 1, m - 1  # hashes[pos] == run[offset]; some block before m differs
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if hashes[pos + mid - 1] == run[offset + mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    if tuple(hashes[pos : pos + lo]) == run[offset : offset + lo] and hashes[pos + lo] != run[offset + lo]:
        return lo
    return next(i for i in range(m) if hashes[pos + i] != run[offset + i])


def _count_slower(slower: dict[int, list[int]], node: _Node, off_device: int, num_blocks: int) -> None:
    """Each of the bits in `off_device` holds the node's `num_blocks` matched blocks at host or disk."""
    bit = 0
    while off_device:
        low = off_device & -off_device
        bit = low.bit_length() - 1
        slot = 0 if node.host >> bit & 1 else 1
        counts = slower.get(bit)
        if counts is None:
            counts = slower[bit] = [0, 0]
        counts[slot] += num_blocks
        off_device ^= low
