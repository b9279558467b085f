"""Engine block hashes -> kvplane block hashes, and what the engine holds, per tier.

The router matches a prompt by kvplane's chained hashes (kvplane/block_hash.py: blake2b over the
parent hash and the block's token ids, rooted in the model name and the tenant salt). An engine
publishes its own hashes, computed its own way (vLLM: sha256 or a seeded hash; SGLang: its page
hashes), which kvplane cannot recompute. But every BlockStored event carries the block's token
ids and its parent's engine hash, so the kvplane hash of each stored block is
`chain_hash(kvplane hash of its parent, its token ids)`, rooted at `root_hash(model, salt)` when
the event has no parent. Equal kvplane hashes then mean what they mean for the reference engine:
the same model, tenant and whole token prefix. Blocks must be the same size on both sides
(kvplane's block size is the engine's page/block size, checked at registration), and the served
model name is the model salt (the router hashes with the request's model name).

Translations are content-addressed, so they never go stale: a block's kvplane hash is kept while
the engine holds the block (to translate its BlockRemoved) and for a while after (a bounded LRU,
so a child stored after its parent was evicted still maps). A block whose parent is unknown
(events lost before this agent started) cannot be mapped and is counted, not guessed; so are
blocks of another size and LoRA blocks (their KV is not the base model's).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping

from kvplane.block_hash import chain_hash, root_hash
from kvplane.dataplane.engines.events import AllCleared, BlockRemoved, BlockStored, KVCacheEvent
from kvplane.dataplane.engines.external.wire import EngineCleared, EngineEvent, EngineHash, EngineRemoved, EngineStored
from kvplane.types import BlockHash, Tier

DEFAULT_MAX_REMEMBERED = 1 << 18  # translations of blocks the engine no longer holds


class BlockHashMapper:
    def __init__(
        self, model: str, block_size: int, max_remembered: int = DEFAULT_MAX_REMEMBERED, salt_of: Callable[[str], str] = str
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.model = model
        self.block_size = block_size
        self._salt_of = salt_of  # the kvplane salt behind the one an engine reports (external/salts.py)
        self._max_remembered = max_remembered
        self._held: dict[EngineHash, tuple[BlockHash, set[Tier]]] = {}  # what the engine holds now
        self._remembered: OrderedDict[EngineHash, BlockHash] = OrderedDict()  # no longer held
        self.num_unmapped_blocks = 0  # stored blocks whose parent was unknown
        self.num_foreign_blocks = 0  # stored blocks of another block size or of a LoRA adapter

    def translate(self, engine_hash: EngineHash) -> BlockHash | None:
        held = self._held.get(engine_hash)
        if held is not None:
            return held[0]
        return self._remembered.get(engine_hash)

    def apply(self, event: EngineEvent) -> list[KVCacheEvent]:
        """The kvplane events for one engine event (empty when nothing kvplane can use changed)."""
        if isinstance(event, EngineStored):
            return self._stored(event)
        if isinstance(event, EngineRemoved):
            return self._removed(event)
        if isinstance(event, EngineCleared):
            return self.forget()
        raise TypeError(f"not an engine event: {event!r}")

    def forget(self) -> list[KVCacheEvent]:
        """Everything held is gone (the engine cleared its cache, restarted, or events were lost
        beyond recovery): the index drops this worker's blocks. Translations are kept."""
        for engine_hash, (block_hash, _) in self._held.items():
            self._remember(engine_hash, block_hash)
        self._held.clear()
        return [AllCleared()]

    def snapshot(self) -> Mapping[Tier, list[BlockHash]]:
        """Every held block per tier (a block may be at several)."""
        by_tier: dict[Tier, list[BlockHash]] = {Tier.DEVICE: []}
        for block_hash, tiers in self._held.values():
            for tier in tiers:
                by_tier.setdefault(tier, []).append(block_hash)
        return by_tier

    def num_held(self, tier: Tier = Tier.DEVICE) -> int:
        return sum(1 for _, tiers in self._held.values() if tier in tiers)

    # -- internals -------------------------------------------------------------------------------

    def _stored(self, event: EngineStored) -> list[KVCacheEvent]:
        if event.tier is None:
            return []
        if event.block_size != self.block_size or event.lora is not None:
            self.num_foreign_blocks += len(event.block_hashes)
            return []
        if event.parent is None:
            parent = root_hash(self.model, self._salt_of(event.cache_salt))
        else:
            parent = self.translate(event.parent)
            if parent is None:
                self.num_unmapped_blocks += len(event.block_hashes)
                return []
        stored: list[BlockHash] = []
        size = self.block_size
        for i, engine_hash in enumerate(event.block_hashes):
            parent = chain_hash(parent, event.token_ids[i * size : (i + 1) * size])
            held = self._held.get(engine_hash)
            if held is None:
                self._remembered.pop(engine_hash, None)
                self._held[engine_hash] = (parent, {event.tier})
            else:
                held[1].add(event.tier)
            stored.append(parent)
        return [BlockStored(tuple(stored), event.tier)]

    def _removed(self, event: EngineRemoved) -> list[KVCacheEvent]:
        if event.tier is None:
            return []
        removed: list[BlockHash] = []
        for engine_hash in event.block_hashes:
            held = self._held.get(engine_hash)
            if held is None or event.tier not in held[1]:
                continue  # never mapped (or not at this tier): the index does not have it either
            block_hash, tiers = held
            tiers.discard(event.tier)
            if not tiers:
                del self._held[engine_hash]
                self._remember(engine_hash, block_hash)
            removed.append(block_hash)
        return [BlockRemoved(tuple(removed), event.tier)] if removed else []

    def _remember(self, engine_hash: EngineHash, block_hash: BlockHash) -> None:
        self._remembered[engine_hash] = block_hash
        self._remembered.move_to_end(engine_hash)
        while len(self._remembered) > self._max_remembered:
            self._remembered.popitem(last=False)
