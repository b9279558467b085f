"""Engine API: input validation, abort/stop, load, prefill_only + unpin, and the KV import path."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch

from kvplane.block_hash import hash_blocks
from kvplane.dataplane.engines import (
    AllCleared,
    BlockStored,
    EngineCapacityError,
    EngineInputError,
    EngineLoad,
    EngineOutput,
    EngineRequest,
    SamplingParams,
)
from kvplane.dataplane.engines.reference import Engine

from .helpers import Collected, generate, submit

BS = 4


def prompt(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (EngineRequest("", [1], SamplingParams()), "request_id is empty"),
        (EngineRequest("r", [], SamplingParams()), "prompt_token_ids is empty"),
        (EngineRequest("r", [1], SamplingParams(max_tokens=0)), "max_tokens must be at least 1, got 0"),
        (EngineRequest("r", [1], SamplingParams(max_tokens=65)), "max_tokens 65 exceeds this engine's limit of 64"),
        (
            EngineRequest("r", [1] * 2000, SamplingParams(max_tokens=49)),
            "prompt \\(2000 tokens\\) \\+ max_tokens \\(49\\) exceeds the model's context of 2048 tokens",
        ),
        (EngineRequest("r", [1, 259], SamplingParams()), "prompt token 1 has id 259, outside the vocabulary \\(0..258\\)"),
        (EngineRequest("r", [-1], SamplingParams()), "prompt token 0 has id -1"),
        (EngineRequest("r", [1], SamplingParams(temperature=-0.5)), "temperature must be a finite number >= 0"),
        (EngineRequest("r", [1], SamplingParams(temperature=float("nan"))), "temperature must be a finite number >= 0 .*nan"),
        (EngineRequest("r", [1], SamplingParams(temperature=float("inf"))), "temperature must be a finite number >= 0 .*inf"),
        (EngineRequest("r", [1], SamplingParams(top_p=1.5)), "top_p must be within \\[0, 1\\]"),
        (EngineRequest("r", [1], SamplingParams(top_p=float("nan"))), "top_p must be within \\[0, 1\\]"),
        (EngineRequest("r", [1], SamplingParams(top_k=-1)), "top_k must be >= 0"),
        (EngineRequest("r", [1], SamplingParams(), held_block_ids=[64]), "held block id 64 is outside the pool"),
    ],
)
def test_input_errors(make_engine: Callable[..., Engine], request_: EngineRequest, message: str) -> None:
    engine = make_engine(start=False, max_tokens_limit=64)
    with pytest.raises(EngineInputError, match=message):
        engine.submit(request_, lambda out: None)
    assert engine.load().num_waiting == 0


def test_capacity_error_when_the_pool_can_never_hold_the_request(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(start=False, num_blocks=4, block_size=BS)
    with pytest.raises(EngineCapacityError, match="needs 5 KV blocks of 4 tokens but the pool has only 4"):
        engine.submit(EngineRequest("r", [1] * 10, SamplingParams(max_tokens=10)), lambda out: None)
    engine.submit(EngineRequest("ok", [1] * 10, SamplingParams(max_tokens=6)), lambda out: None)  # exactly 4 blocks


def test_duplicate_request_id_and_submit_after_stop(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(start=False)
    engine.submit(EngineRequest("r", [1, 2], SamplingParams()), lambda out: None)
    with pytest.raises(EngineInputError, match="request_id 'r' is already in flight"):
        engine.submit(EngineRequest("r", [3], SamplingParams()), lambda out: None)
    engine.stop()
    with pytest.raises(RuntimeError, match="engine is stopped"):
        engine.submit(EngineRequest("s", [1], SamplingParams()), lambda out: None)
    with pytest.raises(RuntimeError, match="create a new Engine"):
        engine.start()


def test_load_counts_waiting_work(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(start=False, num_blocks=32)
    engine.submit(EngineRequest("a", prompt(7), SamplingParams()), lambda out: None)
    engine.submit(EngineRequest("b", prompt(5), SamplingParams()), lambda out: None)
    assert engine.load() == EngineLoad(
        num_running=0, num_waiting=2, num_queued_prefill_tokens=12,
        num_free_blocks=32, num_used_blocks=0, num_total_blocks=32, num_cached_blocks=0,
    )  # fmt: skip


def test_abort_running_and_waiting_requests_release_everything(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(start=False, max_num_seqs=1, max_tokens_limit=2000, num_blocks=600)
    first_token = threading.Event()
    running = submit(engine, EngineRequest("run", prompt(4), SamplingParams(max_tokens=1900)))
    engine.submit(EngineRequest("run2", prompt(3), SamplingParams(max_tokens=1900)),
                  lambda out: first_token.set())  # fmt: skip
    waiting = submit(engine, EngineRequest("wait", prompt(3), SamplingParams(max_tokens=4)))
    engine.abort("wait")  # aborted before the engine even starts
    engine.abort("unknown")  # ignored
    engine.start()
    assert waiting.final.finish_reason == "abort" and waiting.token_ids == []
    while not running.outputs:
        threading.Event().wait(0.005)
    engine.abort("run")
    assert running.final.finish_reason == "abort" and running.final.new_token_ids == []
    assert 1 <= len(running.token_ids) < 1900
    assert first_token.wait(20)  # run2 was admitted once run's blocks came back
    engine.abort("run2")
    deadline = threading.Event()
    while engine.load().num_running and not deadline.wait(0.01):
        pass
    assert engine.load().num_used_blocks == 0


def test_stop_aborts_running_requests(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(max_tokens_limit=2000, num_blocks=600)
    sink = submit(engine, EngineRequest("r", prompt(4), SamplingParams(max_tokens=1900)))
    while not sink.outputs:
        threading.Event().wait(0.005)
    engine.stop()
    assert sink.final.finish_reason == "abort"
    assert engine.load().num_used_blocks == 0


def test_a_raising_sink_does_not_kill_the_engine(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()

    def bad(out: EngineOutput) -> None:
        raise RuntimeError("sink bug")

    engine.submit(EngineRequest("bad", prompt(3), SamplingParams(max_tokens=3)), bad)
    assert generate(engine, prompt(3), max_tokens=3, request_id="good").final.finish_reason == "length"


def test_a_failing_step_fails_its_requests_with_an_error(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(start=False)

    class Broken:
        def forward(self, chunks: object) -> None:
            raise RuntimeError("device lost")

        def run(self, chunks: object) -> None:
            raise RuntimeError("device lost")

    engine._runner = Broken()  # type: ignore[assignment]
    engine.start()
    sink = submit(engine, EngineRequest("r", prompt(5), SamplingParams()))
    final = sink.final
    assert (final.finish_reason, final.error) == ("error", "engine step failed: device lost")
    assert engine.load().num_used_blocks == 0


def test_a_sub_epsilon_temperature_is_greedy(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()
    greedy = generate(engine, prompt(6, seed=3), max_tokens=6, request_id="g").token_ids
    tiny = generate(engine, prompt(6, seed=3), max_tokens=6, request_id="t", temperature=1e-45).token_ids
    assert tiny == greedy


def _co_batched(engine: Engine, num: int) -> list[Collected]:
    """Queues `num` greedy requests on a stopped engine so that they run in one batch once started."""
    return [submit(engine, EngineRequest(f"r{i}", prompt(6, seed=10 + i), SamplingParams(max_tokens=5))) for i in range(num)]


def _solo_tokens(make_engine: Callable[..., Engine], num: int) -> list[list[int]]:
    engine = make_engine()
    return [generate(engine, prompt(6, seed=10 + i), max_tokens=5, request_id=f"s{i}").token_ids for i in range(num)]


def test_a_sampling_failure_fails_that_request_and_not_its_batch(make_engine: Callable[..., Engine]) -> None:
    expected = _solo_tokens(make_engine, 4)
    engine = make_engine(start=False)
    sinks = _co_batched(engine, 4)
    # A request whose sampling breaks after validation (as NaN once did: its probabilities are NaN).
    engine._scheduler.waiting[1].request.sampling.temperature = float("nan")
    engine.start()
    finals = [s.final for s in sinks]
    assert finals[1].finish_reason == "error" and "engine step failed" in finals[1].error
    assert [s.token_ids for i, s in enumerate(sinks) if i != 1] == [t for i, t in enumerate(expected) if i != 1]
    assert all(f.finish_reason == "length" for i, f in enumerate(finals) if i != 1)
    assert engine.load().num_used_blocks == 0


def test_a_model_failure_on_one_input_fails_that_request_and_not_its_batch(make_engine: Callable[..., Engine]) -> None:
    expected = _solo_tokens(make_engine, 4)
    engine = make_engine(start=False)
    sinks = _co_batched(engine, 4)
    # An input the forward pass cannot embed breaks the whole batched call.
    engine._scheduler.waiting[2].token_ids[0] = engine.vocab_size + 7
    engine.start()
    finals = [s.final for s in sinks]
    assert finals[2].finish_reason == "error" and "index" in finals[2].error.lower()
    assert [s.token_ids for i, s in enumerate(sinks) if i != 2] == [t for i, t in enumerate(expected) if i != 2]
    assert engine.load().num_used_blocks == 0


def prefill(engine: Engine, token_ids: list[int], request_id: str = "p", salt: str = "") -> EngineOutput:
    req = EngineRequest(request_id, token_ids, SamplingParams(max_tokens=1), cache_salt=salt, prefill_only=True)
    return submit(engine, req).final


def test_prefill_only_pins_full_blocks_until_unpinned(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(block_size=BS, num_blocks=16)
    tokens = prompt(10, seed=1)
    out = prefill(engine, tokens, salt="s")
    assert (out.finished, out.finish_reason, out.new_token_ids) == (True, "length", [])
    assert (out.num_prompt_tokens, out.num_cached_tokens) == (10, 0)
    assert out.block_hashes == hash_blocks(tokens, BS, engine.model_name, "s")
    assert len(out.pinned_block_ids) == 2
    assert engine.take_kv_events() == [BlockStored(tuple(out.block_hashes))]
    load = engine.load()
    assert (load.num_used_blocks, load.num_cached_blocks) == (2, 0)  # pinned, nothing else held
    again = prefill(engine, tokens, request_id="p2", salt="s")
    assert again.num_cached_tokens == 8 and again.pinned_block_ids == out.pinned_block_ids
    engine.unpin(again.pinned_block_ids)
    engine.unpin(out.pinned_block_ids)
    load = engine.load()
    assert (load.num_used_blocks, load.num_cached_blocks) == (0, 2)
    assert set(engine.cached_block_hashes()) == set(out.block_hashes)
    assert engine.reset_prefix_cache() is True
    assert engine.take_kv_events() == [AllCleared()] and engine.cached_block_hashes() == []


def test_import_blocks_from_another_engine_then_decode_equals_local(make_engine: Callable[..., Engine]) -> None:
    src = make_engine(block_size=BS, num_blocks=32)
    dst = make_engine(block_size=BS, num_blocks=32)
    assert src.layout.mismatch(dst.layout) is None
    tokens = prompt(14, seed=2)
    local = generate(make_engine(block_size=BS), tokens, max_tokens=12, request_id="local").token_ids
    out = prefill(src, tokens)
    hashes, pinned = out.block_hashes, out.pinned_block_ids
    assert len(hashes) == 3

    missing = dst.missing_blocks(hashes)
    assert missing == [0, 1, 2]
    dst_ids = dst.allocate_for_import(len(missing))
    assert dst_ids is not None and dst.load().num_used_blocks == 3
    dst.pool.write_blocks(dst_ids, src.pool.read_blocks([pinned[i] for i in missing]))
    holders = dst.commit_import([hashes[i] for i in missing], dst_ids)
    assert holders == dst_ids
    src.unpin(pinned)
    assert dst.take_kv_events() == [BlockStored(tuple(hashes))]
    assert dst.missing_blocks(hashes) == []

    req = EngineRequest("d", tokens, SamplingParams(max_tokens=12), held_block_ids=holders)
    sink = submit(dst, req)
    assert sink.final.num_cached_tokens == 12  # 3 imported blocks, capped at (14 - 1) // 4
    assert sink.token_ids == local
    assert dst.load().num_used_blocks == 0  # the held refs were released at admission
    assert src.load().num_used_blocks == 0


def test_commit_import_keeps_an_existing_copy_and_frees_the_duplicate(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(block_size=BS, num_blocks=8)
    tokens = prompt(8, seed=3)
    out = prefill(engine, tokens)  # both blocks cached and pinned here already
    engine.take_kv_events()
    ids = engine.allocate_for_import(2)
    assert ids is not None and not set(ids) & set(out.pinned_block_ids)
    holders = engine.commit_import(out.block_hashes, ids)
    assert holders == out.pinned_block_ids
    assert engine.take_kv_events() == []
    assert engine.load().num_used_blocks == 2  # duplicates freed; existing ones ref'd twice
    engine.unpin(holders)
    engine.unpin(out.pinned_block_ids)
    assert engine.load().num_used_blocks == 0


def test_allocate_for_import_evicts_lru_or_returns_none_and_abort_import_frees(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(block_size=BS, num_blocks=4)
    out = prefill(engine, prompt(8, seed=4))
    engine.unpin(out.pinned_block_ids)
    engine.take_kv_events()
    assert engine.allocate_for_import(5) is None
    ids = engine.allocate_for_import(4)  # two uncached blocks, then the two cached ones evicted
    assert ids is not None and len(ids) == 4
    assert engine.cached_block_hashes() == []
    removed = [h for e in engine.take_kv_events() for h in e.block_hashes]  # type: ignore[union-attr]
    assert sorted(removed) == sorted(out.block_hashes)
    assert engine.missing_blocks(out.block_hashes) == [0, 1]
    engine.abort_import(ids)
    assert engine.load().num_free_blocks == 4


def test_held_blocks_are_released_when_a_request_ends_before_admission(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(start=False, block_size=BS, num_blocks=8)
    held = engine.allocate_for_import(2)
    assert held is not None
    engine.submit(EngineRequest("r", prompt(9), SamplingParams(), held_block_ids=held), lambda out: None)
    assert engine.load().num_used_blocks == 2
    engine.abort("r")
    engine.start()
    deadline = threading.Event()
    while engine.load().num_used_blocks and not deadline.wait(0.01):
        pass
    assert engine.load().num_used_blocks == 0


@pytest.mark.parametrize("free", ["abort_import", "unpin"])
def test_blocks_given_back_seat_the_request_waiting_for_them(make_engine: Callable[..., Engine], free: str) -> None:
    """A request waiting at the queue's head for blocks is seated as soon as an import's or a
    pin's blocks come back, not at the next submission (the step loop sleeps while it waits)."""
    engine = make_engine(block_size=BS, num_blocks=8)
    held = engine.allocate_for_import(8)
    assert held is not None
    sink = submit(engine, EngineRequest("r", prompt(9), SamplingParams(max_tokens=2)))
    assert not sink.done.wait(0.2)  # no block to reserve: it waits
    assert engine.load().num_waiting == 1
    getattr(engine, free)(held)
    assert sink.done.wait(10), "the freed blocks did not wake the engine"
    assert sink.final.finish_reason == "length"
