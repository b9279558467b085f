"""KV events as vLLM and SGLang send them -> kvplane's block hashes, the ones the router matches."""

from __future__ import annotations

import msgpack
import pytest

from kvplane.block_hash import hash_blocks
from kvplane.dataplane.engines.events import AllCleared, BlockRemoved, BlockStored
from kvplane.dataplane.engines.external.hash_map import BlockHashMapper
from kvplane.dataplane.engines.external.wire import EngineCleared, EngineStored, WireFormatError, decode_message
from kvplane.types import Tier
from tests.engines.kv_publisher import removed, stored
from tests.engines.recorded import BLOCK_SIZE, PROMPT, SGLANG_BATCHES, VLLM_BATCH


def frames(batch: list, seq: int = 0) -> list[bytes]:
    return [b"", seq.to_bytes(8, "big"), msgpack.packb(batch)]


def test_a_recorded_vllm_batch_maps_to_the_routers_hashes():
    batch = decode_message(frames(VLLM_BATCH, seq=7))
    assert batch.seq == 7 and len(batch.events) == 1
    event = batch.events[0]
    assert isinstance(event, EngineStored) and event.tier is Tier.DEVICE and event.cache_salt == "" and event.parent is None
    mapper = BlockHashMapper("tiny", BLOCK_SIZE)
    [out] = mapper.apply(event)
    # Exactly what the router computes for the prompt (kvplane/block_hash.py), model name as salt.
    assert out == BlockStored(tuple(hash_blocks(PROMPT, BLOCK_SIZE, "tiny")), Tier.DEVICE)


def test_recorded_sglang_batches_map_to_the_same_hashes():
    mapper = BlockHashMapper("tiny", BLOCK_SIZE)
    outs = [out for b in SGLANG_BATCHES for e in decode_message(frames(b)).events for out in mapper.apply(e)]
    assert outs == [AllCleared(), BlockStored(tuple(hash_blocks(PROMPT, BLOCK_SIZE, "tiny")), Tier.DEVICE)]
    assert mapper.snapshot()[Tier.DEVICE] == hash_blocks(PROMPT, BLOCK_SIZE, "tiny")


def test_a_child_event_chains_on_its_parents_kvplane_hash_and_the_salt_roots_it():
    prompt = list(range(100, 112))
    salted = hash_blocks(prompt, 4, "m", "tenant-a")
    for salt_field in ({"cache_salt": "tenant-a"}, {"extra_keys": [("tenant-a",)]}):  # SGLang, vLLM
        mapper = BlockHashMapper("m", 4)
        first = decode_message(frames([0.0, [stored([11], prompt[:4], **salt_field)], 0])).events[0]
        second = decode_message(frames([0.0, [stored([12, 13], prompt[4:], parent=11)], 0])).events[0]
        assert mapper.apply(first) == [BlockStored((salted[0],), Tier.DEVICE)]
        assert mapper.apply(second) == [BlockStored(tuple(salted[1:]), Tier.DEVICE)]


def test_removal_and_tiers_follow_the_engine_and_unknown_blocks_are_ignored():
    mapper = BlockHashMapper("m", 4)
    h = hash_blocks(list(range(8)), 4, "m")
    mapper.apply(decode_message(frames([0.0, [stored([1, 2], list(range(8)))], 0])).events[0])
    mapper.apply(decode_message(frames([0.0, [stored([2], [4, 5, 6, 7], parent=1, medium="CPU_PINNED")], 0])).events[0])
    assert mapper.snapshot() == {Tier.DEVICE: h, Tier.HOST: [h[1]]}
    [ev] = decode_message(frames([0.0, [removed([2, 99])], 0])).events
    assert mapper.apply(ev) == [BlockRemoved((h[1],), Tier.DEVICE)]  # 99 was never mapped
    assert mapper.snapshot() == {Tier.DEVICE: [h[0]], Tier.HOST: [h[1]]}
    [ev] = decode_message(frames([0.0, [removed([2], medium="CPU_PINNED")], 0])).events
    assert mapper.apply(ev) == [BlockRemoved((h[1],), Tier.HOST)]
    # Gone from every tier, its translation is remembered: a child stored later still maps.
    [child] = decode_message(frames([0.0, [stored([3], [8, 9, 10, 11], parent=2)], 0])).events
    assert mapper.apply(child) == [BlockStored((hash_blocks(list(range(12)), 4, "m")[2],), Tier.DEVICE)]


def test_blocks_that_cannot_be_mapped_are_counted_not_guessed():
    mapper = BlockHashMapper("m", 4)
    orphan = decode_message(frames([0.0, [stored([5], [1, 2, 3, 4], parent=404)], 0])).events[0]
    other_size = decode_message(frames([0.0, [stored([6], [1, 2, 3, 4, 5, 6, 7, 8], block_size=8)], 0])).events[0]
    lora = decode_message(frames([0.0, [stored([7], [1, 2, 3, 4], lora_name="adapter")], 0])).events[0]
    external = decode_message(frames([0.0, [stored([8], [1, 2, 3, 4], medium="EXTERNAL")], 0])).events[0]
    assert [mapper.apply(e) for e in (orphan, other_size, lora, external)] == [[], [], [], []]
    assert mapper.num_unmapped_blocks == 1 and mapper.num_foreign_blocks == 2
    assert mapper.snapshot() == {Tier.DEVICE: []}


def test_clearing_forgets_what_is_held_but_keeps_translations():
    mapper = BlockHashMapper("m", 4)
    mapper.apply(decode_message(frames([0.0, [stored([1], [0, 1, 2, 3])], 0])).events[0])
    [cleared] = decode_message(frames([0.0, [{"type": "AllBlocksCleared"}], 0])).events
    assert isinstance(cleared, EngineCleared) and mapper.apply(cleared) == [AllCleared()]
    assert mapper.snapshot() == {Tier.DEVICE: []} and mapper.translate(1) == hash_blocks([0, 1, 2, 3], 4, "m")[0]


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ([b"", b"\x00" * 7, b""], "8 bytes"),
        ([b"", b"\x00" * 8], "3 frames"),
        ([b"", b"\x00" * 8, b"\xc1"], "not msgpack"),
        ([b"", b"\x00" * 8, msgpack.packb({"ts": 1})], r"expected \[ts, events, dp_rank\]"),
        ([b"", b"\x00" * 8, msgpack.packb([0.0, [{"type": "Nope"}], 0])], "unknown event type 'Nope'"),
        ([b"", b"\x00" * 8, msgpack.packb([0.0, [stored([1, 2], [1, 2, 3])], 0])], "2 blocks of 4 tokens carries 3 token ids"),
    ],
)
def test_malformed_messages_are_named(message, error):
    with pytest.raises(WireFormatError, match=error):
        decode_message(message)
