"""The compiled routing kernels (kvplane/_native.c) against their pure Python twins."""

from __future__ import annotations

import dataclasses
import importlib
import random
from array import array

import numpy as np
import pytest

from kvplane import native
from kvplane.block_hash import CachedBlockHasher, hash_blocks
from kvplane.controlplane.core import predictions
from kvplane.controlplane.core.cost import CostConfig, _score_columns, cheapest_uncached, price
from kvplane.controlplane.core.index import CacheIndex, drop_outs, overlap_score, running_and
from kvplane.controlplane.core.pool import WorkerPool, WorkerTable
from kvplane.types import Tier, WorkerId
from tests.core.conftest import make_worker_view


def test_the_compiled_kernels_are_built_by_the_install():
    # `make env` (pip install -e .) compiles kvplane/_native.c; the routing path runs them.
    assert native.status().startswith("compiled"), native.status()


def random_masks(rng: random.Random, num_blocks: int, num_bits: int) -> tuple[dict[bytes, int], list[bytes]]:
    """A prompt's blocks with holder masks that shrink along the prompt, some blocks missing."""
    hashes = [rng.randbytes(16) for _ in range(num_blocks)]
    masks, holders = {}, rng.getrandbits(num_bits) | (1 << (num_bits - 1))
    for h in hashes:
        if rng.random() < 0.3:
            holders &= rng.getrandbits(num_bits)  # some holders stop here
        if rng.random() < 0.02:
            continue  # nobody holds this block: every match ends before it
        masks[h] = holders | rng.getrandbits(num_bits) & rng.getrandbits(num_bits)  # other workers hold it too
    return masks, hashes


@pytest.mark.parametrize("num_bits", [1, 29, 30, 31, 64, 1000, 2500])
def test_prefix_groups_equals_the_python_walk(num_bits):
    rng = random.Random(num_bits)
    for _ in range(200):
        masks, hashes = random_masks(rng, rng.randrange(0, 80), num_bits)
        start = rng.randrange(0, 3)  # a prompt that starts at a block nobody holds, sometimes
        prompt = hashes[start:] if start < 2 else [b"never stored"] + hashes
        for seq in (prompt, tuple(prompt)):
            assert native.prefix_groups(masks, seq) == drop_outs(running_and(masks, seq))


def test_prefix_groups_edge_cases():
    a, b, c = b"a", b"b", b"c"
    assert native.prefix_groups({}, []) == []
    assert native.prefix_groups({a: 0}, [a, b]) == []  # a block held by nobody
    assert native.prefix_groups({a: 0b101}, [a]) == [(1, [0, 2])]
    assert native.prefix_groups({a: 0b111, b: 0b110, c: 0b1100}, [a, b, c]) == [(1, [0]), (2, [1]), (3, [2])]
    # Later masks wider than the first: bits past the first mask's width never matched block 0.
    assert native.prefix_groups({a: 1, b: (1 << 200) | 1}, [a, b]) == [(2, [0])]
    with pytest.raises(TypeError, match="must be an int"):
        native.prefix_groups({a: "x"}, [a])
    with pytest.raises(ValueError, match="negative"):
        native.prefix_groups({a: -1}, [a])
    with pytest.raises(TypeError):
        native.prefix_groups({a: 1}, 5)


def test_pack_uint32_equals_array_packing():
    rng = random.Random(1)
    tokens = [rng.randrange(1 << 32) for _ in range(4099)] + [0, (1 << 32) - 1]
    for count in (0, 1, 16, 4096, len(tokens)):
        assert native.pack_uint32(tokens, count) == array("I", tokens[:count]).tobytes()
    assert native.pack_uint32(np.arange(8, dtype=np.int64).tolist(), 8) == native.pack_uint32(list(np.arange(8)), 8)
    with pytest.raises(OverflowError):
        native.pack_uint32([1 << 32], 1)
    with pytest.raises(OverflowError):
        native.pack_uint32([-1], 1)
    with pytest.raises(ValueError, match="outside"):
        native.pack_uint32([1, 2], 3)
    with pytest.raises(TypeError):
        native.pack_uint32(["1"], 1)


def routing_inputs() -> tuple[list[int], CacheIndex]:
    rng = random.Random(2)
    prompt = [rng.randrange(32000) for _ in range(1000)]
    hashes = hash_blocks(prompt, 16, "m", "t")
    index = CacheIndex()
    for w in range(300):
        held = rng.randrange(len(hashes) + 1)
        slow = {Tier.HOST: hashes[held // 2 : held]} if w % 7 == 0 else {}  # some hold part of it off the device
        index.apply_snapshot(WorkerId(f"w{w}"), 0, {Tier.DEVICE: hashes[: held - len(slow.get(Tier.HOST, ()))], **slow})
    return prompt, index


def answers(prompt: list[int], index: CacheIndex) -> tuple:
    hashes = hash_blocks(prompt, 16, "m", "t")
    return hashes, CachedBlockHasher().hash_blocks(prompt, 16, "m", "t"), index.overlaps(hashes)


def test_hashes_and_overlaps_are_the_same_with_the_kernels_turned_off(monkeypatch):
    prompt, index = routing_inputs()
    compiled = answers(prompt, index)
    monkeypatch.setenv("KVPLANE_NATIVE", "0")
    importlib.reload(native)
    try:
        assert native.status() == "pure Python: turned off by KVPLANE_NATIVE=0"
        assert native.pack_uint32 is None and native.prefix_groups is None
        assert answers(prompt, index) == compiled
    finally:
        monkeypatch.delenv("KVPLANE_NATIVE")
        importlib.reload(native)
    assert native.status().startswith("compiled")
    overlaps = compiled[2]
    assert len(overlaps) > 100 and any(s.blocks_by_tier[Tier.HOST] for s in overlaps.values())  # both index paths ran


def random_pool(rng: random.Random, n: int) -> WorkerPool:
    """A fleet with loads from idle to far over the mean, some with requests of ours pending and
    some that have not reported their pool (0 total blocks)."""
    views = []
    for i in range(n):
        total = rng.choice([0, 100, 1000])
        view = make_worker_view(
            f"w{i:04d}",
            num_running=rng.randrange(0, 40) if rng.random() < 0.2 else rng.randrange(0, 3),
            num_queued_prefill_tokens=rng.choice([0, rng.randrange(0, 100), rng.randrange(0, 20000)]),
            num_used_blocks=rng.randrange(0, total + 1),
            num_total_blocks=total,
            block_size=16,
        )
        views.append(dataclasses.replace(view, pending_blocks=rng.randrange(0, 50)))
    return WorkerTable(views).pool()


def compiled_and_python(kernels: str | tuple[str, ...], compute):
    """compute() with the compiled kernels, then with their Python twins (the kernels set to None)."""
    names = (kernels,) if isinstance(kernels, str) else kernels
    compiled, saved = compute(), {name: getattr(native, name) for name in names}
    for name in names:
        setattr(native, name, None)
    try:
        return compiled, compute()
    finally:
        for name, kernel in saved.items():
            setattr(native, name, kernel)


def test_price_equals_the_array_operations():
    rng = random.Random(5)
    config = CostConfig(prefill_load_scale=1.5)
    for n in (1, 7, 1000):
        pool = random_pool(rng, n)
        scores = [overlap_score(rng.randrange(1, 300), rng.randrange(0, 5), 0, rng.randrange(0, 3)) for _ in range(4)]
        overlaps = {w.worker_id: rng.choice(scores) for w in pool if rng.random() < 0.6}
        for args in [(), (overlaps,), (None,)]:
            for prompt in (1, 16, 17, 4096):
                kernels = ("price_rows", "score_columns")
                compiled, python = compiled_and_python(kernels, lambda a=args, p=prompt, pool=pool: price(config, pool, p, *a))
                assert compiled.cost.tolist() == python.cost.tolist()
                assert compiled.cached_tokens.tolist() == python.cached_tokens.tolist()
                assert compiled.prefill_tokens.tolist() == python.prefill_tokens.tolist()
                assert [c.detail for c in compiled[:3]] == [c.detail for c in python[:3]]


@pytest.mark.parametrize("num_distinct", [1, 5, 300])
def test_score_columns_equal_the_python_loops(num_distinct):
    """Shared scores (a hot prefix's holders), many distinct ones (the kernel's memo collides),
    host and disk blocks, predicted blocks, workers without a score, weights that are not round."""
    rng = random.Random(num_distinct)
    config = CostConfig(overlap_weight_device=1.0, overlap_weight_host=0.7, overlap_weight_disk=0.3)
    for n in (1, 16, 1000):
        pool = random_pool(rng, n)
        scores = [
            overlap_score(blocks, host, rng.randrange(0, blocks - host + 1), rng.randrange(0, blocks + 1))
            for blocks, host in ((b, rng.randrange(0, b + 1)) for b in (rng.randrange(0, 300) for _ in range(num_distinct)))
        ]  # fmt: skip
        overlaps = {w.worker_id: rng.choice(scores) for w in pool if rng.random() < 0.7}
        compiled, python = compiled_and_python("score_columns", lambda p=pool, o=overlaps: _score_columns(config, p, o))
        assert [a.tolist() for a in compiled] == [a.tolist() for a in python]
    assert (compiled[1] != compiled[1].round()).any() or num_distinct == 1  # the weights' fractions were summed (1,000 rows)


def test_score_columns_refuses_what_it_cannot_read():
    weights = {Tier.DEVICE: 1.0, Tier.HOST: 0.9, Tier.DISK: 0.5}
    matched, credit = np.empty(2, np.int64), np.empty(2)
    scores = [overlap_score(8, 2), None]
    with pytest.raises(KeyError, match="no credit weight for tier <Tier.HOST"):
        native.score_columns(scores, {Tier.DEVICE: 1.0}, matched, credit)
    with pytest.raises(TypeError, match="credit_out must be a 1-d contiguous float64 array"):
        native.score_columns(scores, weights, matched, matched)
    with pytest.raises(ValueError, match="matched_out has 2 entries for 3 scores"):
        native.score_columns([*scores, None], weights, matched, np.empty(3))
    with pytest.raises(TypeError, match="scores must be a list or tuple"):
        native.score_columns(42, weights, matched, credit)
    with pytest.raises(AttributeError, match="num_blocks"):
        native.score_columns(["not a score", None], weights, matched, credit)
    native.score_columns(tuple(scores), weights, matched, credit)
    assert (matched.tolist(), credit.tolist()) == ([8, 0], [6 + 2 * 0.9, 0.0])


def test_cheapest_uncached_equals_the_array_operations():
    """Loads with many ties (the rows tied with the last one are all kept), every limit from 1 to
    the pool's size, pools that skip rows, scales that are not round."""
    rng = random.Random(11)
    for n in (2, 17, 300, 1000):
        pool = random_pool(rng, n)
        for scale in (1.0, 0.37, 3.0):
            config = CostConfig(prefill_load_scale=scale)
            for part in (pool, pool.where_own(np.array([rng.random() < 0.7 for _ in range(n)]))):
                for limit in sorted({1, 2, 16, len(part) - 1, len(part)} | {rng.randrange(1, len(part) + 1) for _ in range(3)}):
                    if limit < 1:
                        continue
                    compiled, python = compiled_and_python("cheapest_rows", lambda c=config, p=part, k=limit: cheapest_uncached(c, p, k))
                    assert compiled.rows.tolist() == python.rows.tolist(), (n, scale, limit)
                    assert len(compiled) >= min(limit, len(part))


def test_column_kernels_refuse_what_they_cannot_read():
    pool = random_pool(random.Random(1), 4)
    t = pool.table
    cost, cached = np.empty(4), np.empty(4, np.int64)
    with pytest.raises(TypeError, match="queued must be a 1-d contiguous int64 array"):
        native.price_rows(t.queued.astype(np.int32), t.used, t.block_size, pool.rows, None, None, 16, 1.0, cost, cached)
    with pytest.raises(IndexError, match="rows"):
        native.price_rows(t.queued, t.used, t.block_size, pool.rows + 1, None, None, 16, 1.0, cost, cached)
    with pytest.raises(TypeError, match="cost_out"):
        native.price_rows(t.queued, t.used, t.block_size, pool.rows, None, None, 16, 1.0, cached, cached)
    with pytest.raises(ValueError, match="block_size"):
        native.price_rows(t.queued, t.used, t.block_size * 0, pool.rows, None, None, 16, 1.0, cost, cached)
    with pytest.raises(ValueError, match="matched has 3 entries for 4 rows"):
        native.price_rows(t.queued, t.used, t.block_size, pool.rows, np.zeros(3, np.int64), None, 16, 1.0, cost, cached)
    with pytest.raises(ValueError, match="cost_out has 3 entries for 4 rows"):
        native.price_rows(t.queued, t.used, t.block_size, pool.rows, None, None, 16, 1.0, cost[:3], cached)
    rows = np.empty(4, np.int64)
    with pytest.raises(ValueError, match="limit 0 is not between 1 and the 4 rows"):
        native.cheapest_rows(t.queued, t.used, t.block_size, pool.rows, 1.0, 0, rows)
    with pytest.raises(ValueError, match="out has 3 entries for 4 rows"):
        native.cheapest_rows(t.queued, t.used, t.block_size, pool.rows, 1.0, 2, rows[:3])
    with pytest.raises(IndexError, match="rows"):
        native.cheapest_rows(t.queued, t.used, t.block_size, pool.rows + 1, 1.0, 2, rows)
    with pytest.raises(ValueError, match="block_size"):
        native.cheapest_rows(t.queued, t.used, t.block_size * 0, pool.rows, 1.0, 2, rows)


def test_turned_off_runs_the_python_twins_inside_only():
    prompt, index = routing_inputs()
    with native.turned_off():
        assert all(getattr(native, name) is None for name in native.KERNELS)
        python = answers(prompt, index)
    assert all(getattr(native, name) is not None for name in native.KERNELS)
    assert answers(prompt, index) == python


def test_prediction_counts_equal_the_python_loops():
    """Random records added and dropped on a few workers: masks and counts equal after each step."""
    rng = random.Random(9)
    prompts = [[rng.randbytes(16) for _ in range(40)] for _ in range(5)]
    states = {kernel: ({}, {}) for kernel in ("compiled", "python")}  # (mask, bit -> refs)
    live: list[tuple[int, list[bytes]]] = []
    for _ in range(400):
        if live and rng.random() < 0.45:
            bit, hashes = live.pop(rng.randrange(len(live)))
            for kernel, (mask, refs) in states.items():
                count_out = native.refs_remove if kernel == "compiled" else predictions._count_out
                count_out(mask, refs[bit], tuple(hashes), 1 << bit)
                if not refs[bit]:
                    del refs[bit]
        else:
            bit, prompt = rng.choice([0, 3, 64, 999]), rng.choice(prompts)
            hashes = prompt[: rng.randrange(1, len(prompt))] + [rng.randbytes(16)] * rng.randrange(2)  # its own last block, sometimes
            live.append((bit, hashes))
            for kernel, (mask, refs) in states.items():
                count_in = native.refs_add if kernel == "compiled" else predictions._count_in
                count_in(mask, refs.setdefault(bit, {}), hashes, 1 << bit)
        assert states["compiled"] == states["python"]
    assert any(m.bit_count() > 1 for m in states["compiled"][0].values())  # blocks shared by workers


def test_prediction_count_kernels_refuse_what_was_never_counted():
    with pytest.raises(KeyError):
        native.refs_remove({}, {}, [b"a"], 1)
    with pytest.raises(KeyError):
        native.refs_remove({}, {b"a": 1}, [b"a"], 1)  # counted, but in no mask
    with pytest.raises(TypeError):
        native.refs_add({}, {}, [b"a"], "1")
