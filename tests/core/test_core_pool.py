"""The fleet's columns (core/pool.py): they say what the views say, row updates leave the table
they came from untouched, and the vectorised passes pick what a loop over the views picks."""

from __future__ import annotations

import dataclasses
import heapq
import random

import numpy as np

from kvplane.controlplane.core.cost import CostConfig, Priced, cheapest_uncached
from kvplane.controlplane.core.index import CacheIndex
from kvplane.controlplane.core.pool import WorkerPool, WorkerTable, table_of
from kvplane.controlplane.core.views import ClusterView, WorkerLoadView, WorkerView
from kvplane.types import Role, WorkerId


def _fleet(n: int, seed: int = 0) -> list[WorkerView]:
    rng = random.Random(seed)
    return [
        WorkerView(
            worker_id=WorkerId(f"w{i:03d}"),
            role=rng.choice(list(Role)),
            model=rng.choice(["m", "n"]),
            block_size=16,
            active=rng.random() < 0.9,
            load=WorkerLoadView(
                num_running=rng.randrange(8),
                num_waiting=rng.randrange(3),
                num_queued_prefill_tokens=rng.choice([0, 16, 100, 4096]),
                num_free_blocks=100,
                num_used_blocks=rng.choice([0, 10, 50]),
                num_total_blocks=rng.choice([0, 200]),
            ),  # fmt: skip
            max_context=rng.choice([1024, 8192]),
            block_nbytes=rng.choice([0, 4096, 8192]),
            pending_blocks=rng.randrange(4),
            reported_at=rng.choice([None, 10.0, 12.5]),
            transports=rng.choice([None, ("nixl",), ("engine:vllm",)]),
        )
        for i in range(n)
    ]


def test_columns_say_what_the_views_say():
    views = _fleet(60)
    t = WorkerTable(views)
    assert [t.models[c] for c in t.model_code] == [w.model for w in views]
    assert list(t.active) == [w.active for w in views] and list(t.can_decode) == [w.role.can_decode for w in views]
    assert list(t.queued) == [w.load.num_queued_prefill_tokens for w in views]
    assert list(t.requests) == [w.load.num_running + w.load.num_waiting for w in views]
    assert list(t.block_nbytes) == [w.block_nbytes for w in views]
    assert [None if r != r else r for r in t.reported_at.tolist()] == [w.reported_at for w in views]  # NaN: never reported
    other = views[0]
    assert list(t.kv_mask(other, cached_blocks=True)) == [w.can_move_kv_with(other, cached_blocks=True) for w in views]


def test_row_updates_leave_the_original_table_untouched():
    views = _fleet(20)
    t = WorkerTable(views)
    busier = dataclasses.replace(views[3], load=dataclasses.replace(views[3].load, num_queued_prefill_tokens=9999))
    drained = dataclasses.replace(views[5], active=False, model="new-model")
    loads = t.with_loads({3: busier})
    changed = t.replaced({5: drained})
    assert loads.queued[3] == 9999 and t.queued[3] == views[3].load.num_queued_prefill_tokens
    assert loads.views[3] is busier and t.views[3] is views[3]
    assert not changed.active[5] and changed.models[changed.model_code[5]] == "new-model"
    assert t.active[5] == views[5].active and "new-model" not in t.models
    reported = dataclasses.replace(views[7], reported_at=99.0, load=dataclasses.replace(views[7].load, num_used_blocks=77))
    after_report = t.replaced({7: reported})
    assert after_report.reported_at[7] == 99.0 and after_report.used[7] == 77 and after_report.views[7] is reported
    assert t.reported_at[7] != 99.0 and after_report.parent is t and after_report.changed_rows == {7}


def test_load_updates_equal_a_table_built_from_the_new_views_for_few_rows_and_many():
    views = _fleet(40)
    t = WorkerTable(views)
    for rows in ((3,), (0, 17, 39), tuple(range(0, 40, 2))):  # item by item, and as index arrays (over _FEW_ROWS)
        new = {
            i: dataclasses.replace(
                views[i], pending_blocks=i + 1,
                load=dataclasses.replace(views[i].load, num_queued_prefill_tokens=1000 + i, num_used_blocks=i, num_total_blocks=50 + i, num_running=i % 3),
            )
            for i in rows
        }  # fmt: skip
        updated = t.with_loads(new)
        rebuilt = WorkerTable([new.get(i, w) for i, w in enumerate(views)])
        for name in ("queued", "used", "total", "requests", "pending"):
            assert list(getattr(updated, name)) == list(getattr(rebuilt, name)), name
            assert list(getattr(t, name)) == list(getattr(WorkerTable(views), name)), name  # the original untouched
        assert updated.views == rebuilt.views


def test_a_report_with_a_new_step_model_or_chunk_rewrites_the_model_columns_else_they_are_shared():
    from kvplane.latency import StepTimeModel

    views = [dataclasses.replace(w, latency=StepTimeModel((0.01, 1e-4, 0.0, 1e-3, 0.0), 50, 0.1)) for w in _fleet(12)]
    t = WorkerTable(views)
    same_model = {3: dataclasses.replace(views[3], load=dataclasses.replace(views[3].load, num_running=7))}
    loads = t.with_loads(same_model)
    assert loads.step is t.step and loads.chunk is t.chunk and loads.running[3] == 7  # nothing of the model to copy
    refit = StepTimeModel((0.02, 2e-4, 0.0, 1e-3, 0.0), 80, 0.1)
    for new in ({4: dataclasses.replace(views[4], latency=refit)}, {5: dataclasses.replace(views[5], chunk_tokens=1024)}):
        updated = t.with_loads({**same_model, **new})
        rebuilt = WorkerTable([{**same_model, **new}.get(i, w) for i, w in enumerate(views)])
        assert np.array_equal(updated.step, rebuilt.step) and np.array_equal(updated.chunk, rebuilt.chunk)
        assert np.array_equal(t.step, WorkerTable(views).step) and np.array_equal(t.chunk, WorkerTable(views).chunk)  # untouched
    assert t.with_loads({4: dataclasses.replace(views[4], latency=refit)}).step[4, 0] == 0.02


def test_updates_in_place_write_only_a_private_copy_and_count_versions():
    views = _fleet(30)
    shared = WorkerTable(views)
    own = shared.private()
    rng = random.Random(3)
    for step in range(1, 40):
        new = {}
        for i in rng.sample(range(30), rng.randrange(1, 5)):
            w = own.views[i]
            new[i] = dataclasses.replace(
                w, reported_at=float(step), pending_blocks=step,
                load=dataclasses.replace(w.load, num_queued_prefill_tokens=step * 10 + i, num_running=i % 4, num_used_blocks=step),
            )  # fmt: skip
        assert own.updated(new) is own and own.version == step and own.changed_rows == set(new)
        rebuilt = WorkerTable(own.views)
        for name in ("queued", "used", "total", "requests", "pending", "running", "waiting", "context", "chunk", "reported_at", "step"):
            assert np.array_equal(getattr(own, name), getattr(rebuilt, name), equal_nan=True), name
    # The table it was copied from never changed.
    for name in ("queued", "used", "requests", "pending", "reported_at"):
        assert np.array_equal(getattr(shared, name), getattr(WorkerTable(views), name), equal_nan=True), name
    assert shared.views == tuple(views) and shared.version == 0
    # A shared table is never written: `updated` makes a new one, as `replaced` does.
    busier = dataclasses.replace(views[2], load=dataclasses.replace(views[2].load, num_queued_prefill_tokens=12345))
    other = shared.updated({2: busier})
    assert other is not shared and other.queued[2] == 12345 and shared.queued[2] != 12345
    # A change of more than load (a drain) gives a new private table.
    drained = own.updated({4: dataclasses.replace(own.views[4], active=False)})
    assert drained is not own and not drained.active[4] and own.active[4] == views[4].active
    assert drained.updated({5: drained.views[5]}) is drained and drained.version == 1


def test_a_pool_lists_its_workers_in_table_order_and_splits_by_id():
    views = _fleet(30)
    pool = WorkerTable(views).pool(excluded=[views[2].worker_id])
    assert list(pool) == [w for w in views if w is not views[2]]
    decoders = pool.where(pool.table.can_decode)
    assert list(decoders) == [w for w in views if w is not views[2] and w.role.can_decode]
    named = {views[9].worker_id, views[1].worker_id, views[2].worker_id, WorkerId("nobody")}
    inside, rest = pool.split(named)
    assert list(inside) == [views[1], views[9]] and list(rest) == [w for w in views if w.worker_id not in named]
    assert pool.get(views[2].worker_id) is None and pool.get(views[9].worker_id) is views[9]
    assert list(pool.without(views[9].worker_id)) == [w for w in views if w not in (views[2], views[9])]


def test_distinct_values_name_each_rows_value_once_per_object():
    for n in (10, 300):  # both sides of the small-pool path
        pool = WorkerTable(_fleet(n)).pool()
        shared, own = object(), {w.worker_id: object() for w in list(pool)[::7]}
        mapping = {w.worker_id: shared for w in list(pool)[1::3]} | own
        codes, values = pool.distinct_values(mapping)
        assert [values[c] for c in codes] == [mapping.get(w.worker_id) for w in pool]
        assert len(values) == len({id(v) for v in values}) == len(own) + 2  # + shared + None


def test_the_cheapest_uncached_are_the_ones_a_loop_over_the_views_finds():
    config = CostConfig(prefill_load_scale=0.5)
    for seed in range(20):
        views = _fleet(80, seed)
        limit = 1 + seed % 7
        costs = [config.prefill_load_scale * -(-w.load.num_queued_prefill_tokens // w.block_size) + w.load.num_used_blocks for w in views]
        cutoff = heapq.nsmallest(limit, costs)[-1]
        expected = [w for w, c in zip(views, costs) if c <= cutoff]  # the limit cheapest and every tie
        assert list(cheapest_uncached(config, views, limit)) == expected
        assert list(cheapest_uncached(config, WorkerPool.of(views), limit)) == expected


def test_a_cluster_view_builds_its_table_once():
    view = ClusterView(tuple(_fleet(5)), CacheIndex())
    assert table_of(view) is table_of(view)
    assert view.without({"w001"}).table is None  # other workers: other columns


def test_priced_candidates_rank_cheapest_first_ties_by_worker_id_and_are_made_when_read():
    views = _fleet(6)
    table = WorkerTable(views)
    made = []
    priced = Priced(
        [w.worker_id for w in views][::-1],
        np.arange(6, dtype=np.int64)[::-1].copy(),
        np.array([3.0, 1.0, 2.0, 1.0, 0.5, 1.0]),
        np.zeros(6, np.int64),
        np.full(6, 10, np.int64),
        lambda i: made.append(i) or f"candidate {i}",
    )
    ranked = priced.ranked(table)
    assert made == []
    assert ranked.worker_ids == ["w001", "w000", "w002", "w004", "w003", "w005"]  # 0.5, then the three 1.0 by id, 2.0, 3.0
    first = ranked[0]
    assert first.cost == 0.5 and first.note == "candidate 4" and made == [4]


def test_masks_of_fixed_columns_are_made_once_and_follow_a_drain():
    views = [dataclasses.replace(w, model="m", active=True, role=Role.BOTH) for w in _fleet(8)]
    t = WorkerTable(views)
    decoding = t.serving("m", "decode")
    assert decoding.all() and t.serving("m", "decode") is decoding and not t.serving("unknown").any()
    reported = t.replaced({2: dataclasses.replace(views[2], reported_at=50.0)})
    assert reported.serving("m", "decode") is decoding  # a report changes no fixed column
    drained = reported.replaced({3: dataclasses.replace(views[3], active=False)})
    assert list(drained.serving("m", "decode")) == [i != 3 for i in range(8)] and decoding[3]
