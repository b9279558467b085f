"""Scheduler: admission with block reservation, token budget and chunking, finish rules.

The model is not involved: chunks are accounted as if computed, with chosen sampled tokens.
"""

from __future__ import annotations

from kvplane.dataplane.engines.paged.block_manager import BlockManager
from kvplane.dataplane.engines.paged.scheduler import RequestState, Scheduler
from kvplane.dataplane.engines.request import EngineOutput, EngineRequest, SamplingParams

EOS = 99


def make(num_blocks: int = 16, max_num_seqs: int = 4, budget: int = 8) -> Scheduler:
    return Scheduler(BlockManager(num_blocks), "m", block_size=4, max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=budget, eos_token_ids=(EOS,))  # fmt: skip


def add(s: Scheduler, rid: str, prompt_len: int, max_tokens: int = 4, first_token: int = 1, **kw: object) -> RequestState:
    """Prompt first_token, first_token + 1, ...: requests share a prefix unless told otherwise."""
    prefill_only = bool(kw.pop("prefill_only", False))
    queued_since = kw.pop("queued_since", None)
    prompt = list(range(first_token, first_token + prompt_len))
    sampling = SamplingParams(max_tokens=max_tokens, **kw)  # type: ignore[arg-type]
    req = EngineRequest(rid, prompt, sampling, prefill_only=prefill_only, queued_since=queued_since)  # type: ignore[arg-type]
    seq = RequestState(req, lambda out: None, None, list(req.prompt_token_ids), prompt_len)
    s.enqueue(seq)
    return seq


def step(s: Scheduler, token: int = 7) -> list[EngineOutput]:
    outs = []
    for chunk in s.schedule():
        out = s.update(chunk, token if chunk.completes_known_tokens else None)
        if out is not None:
            outs.append(out)
    return outs


def test_admission_reserves_prompt_plus_max_tokens_blocks() -> None:
    s = make()
    add(s, "a", prompt_len=5, max_tokens=6)  # ceil(11 / 4) = 3 blocks
    s.admit()
    assert [len(q.block_ids) for q in s.running] == [3]
    assert s.blocks.num_free_blocks == 13
    assert s.num_blocks_needed(EngineRequest("p", [1] * 5, SamplingParams(max_tokens=6), prefill_only=True)) == 2


def test_head_of_queue_waits_and_is_not_overtaken() -> None:
    s = make(num_blocks=4)
    add(s, "big1", prompt_len=8, max_tokens=4)  # 3 blocks
    add(s, "big2", prompt_len=8, max_tokens=4)  # 3 blocks: does not fit beside big1
    add(s, "small", prompt_len=1, max_tokens=1)  # 1 block would fit, but must not overtake
    s.admit()
    assert [q.request_id for q in s.running] == ["big1"]
    assert [q.request_id for q in s.waiting] == ["big2", "small"]


def test_max_num_seqs_caps_running() -> None:
    s = make(max_num_seqs=2)
    for i in range(3):
        add(s, f"r{i}", prompt_len=2)
    s.admit()
    assert [q.request_id for q in s.running] == ["r0", "r1"] and len(s.waiting) == 1


def test_budget_goes_to_decodes_first_then_prompt_chunks_in_order() -> None:
    s = make(budget=8)
    a = add(s, "a", prompt_len=3)
    step(s)  # a prefills its 3 tokens and samples
    b = add(s, "b", prompt_len=10)
    c = add(s, "c", prompt_len=5, first_token=50)  # shares no block with b
    chunks = s.schedule()
    assert [(ch.seq.request_id, ch.start, ch.num_tokens) for ch in chunks] == [("a", 3, 1), ("b", 0, 7)]
    assert s.num_queued_prefill_tokens() == 10 + 5
    for ch in chunks:
        s.update(ch, 7 if ch.completes_known_tokens else None)
    chunks = s.schedule()
    assert [(ch.seq.request_id, ch.start, ch.num_tokens) for ch in chunks] == [("a", 4, 1), ("b", 7, 3), ("c", 0, 4)]
    assert (a.num_output_tokens, b.num_computed_tokens, c.num_computed_tokens) == (2, 7, 0)


def test_a_request_queues_and_prefills_by_when_it_reached_the_worker() -> None:
    """A disaggregated request is submitted once its KV is in, stamped with its arrival: it takes
    its place ahead of later arrivals, waiting or already admitted."""
    s = Scheduler(BlockManager(64), "m", block_size=4, max_num_seqs=8, max_num_batched_tokens=12, eos_token_ids=(EOS,), clock=lambda: 10.0)
    add(s, "early", prompt_len=8, first_token=100, queued_since=1.0)
    add(s, "late", prompt_len=8, first_token=200, queued_since=3.0)
    s.admit()
    add(s, "remote", prompt_len=8, first_token=300, queued_since=2.0)  # arrived between them
    add(s, "now", prompt_len=8, first_token=400)  # no stamp: the scheduler's clock, 10.0
    assert [q.request_id for q in s.waiting] == ["remote", "now"]
    # Admitted after "late", it still prefills before it: 8 tokens of "early", then 4 of "remote".
    chunks = s.schedule()
    assert [(c.seq.request_id, c.num_tokens) for c in chunks] == [("early", 8), ("remote", 4)]
    s2 = make()
    add(s2, "a", prompt_len=4, queued_since=5.0)
    add(s2, "b", prompt_len=4, queued_since=4.0)
    add(s2, "c", prompt_len=4, queued_since=5.0)  # equal stamps keep their submission order
    assert [q.request_id for q in s2.waiting] == ["b", "a", "c"]


def test_finish_reasons_eos_stop_length_and_ignore_eos() -> None:
    s = make()
    add(s, "eos", prompt_len=2)
    [out] = step(s, token=EOS)
    assert (out.new_token_ids, out.finish_reason, out.finished) == ([EOS], "eos", True)
    add(s, "stop", prompt_len=2, stop_token_ids=(5,))
    [out] = step(s, token=5)
    assert out.finish_reason == "stop"
    add(s, "ign", prompt_len=2, max_tokens=2, ignore_eos=True)
    [out] = step(s, token=EOS)
    assert (out.finished, out.finish_reason) == (False, None)
    [out] = step(s, token=EOS)
    assert out.finish_reason == "length"
    assert s.running == [] and s.blocks.num_free_blocks == 16


def test_full_blocks_are_registered_as_their_kv_is_written() -> None:
    s = make(budget=5)
    seq = add(s, "a", prompt_len=9, max_tokens=8)
    step(s)  # 5 tokens computed: block 0 full
    assert s.blocks.cached_block_hashes() == seq.block_hashes[:1]
    step(s)  # 9 computed: block 1 full, token sampled
    step(s)  # decode: 10 computed
    step(s)
    step(s)
    step(s)  # 13 computed: block 2 full
    assert len(s.blocks.cached_block_hashes()) == 3
    assert s.blocks.lookup(seq.block_hashes[2]) == seq.block_ids[2]


def test_prefix_hit_is_capped_so_one_token_is_computed() -> None:
    s = make()
    add(s, "a", prompt_len=8, max_tokens=1)
    step(s)
    b = add(s, "b", prompt_len=8, max_tokens=1)  # same 8 tokens: 2 full blocks cached
    chunks = s.schedule()
    assert (b.num_cached_tokens, chunks[0].start, chunks[0].num_tokens) == (4, 4, 4)


def test_a_waiting_request_counts_only_the_prompt_its_cached_prefix_leaves_to_compute() -> None:
    """The load report's queued prefill tokens: a request waiting behind a step is counted as what
    admission will compute, not its whole prompt (an agent's next turn queued on the holder of its
    context otherwise looks like the whole context to prefill, and is routed away from it)."""
    s = make(budget=16)
    add(s, "a", prompt_len=12, max_tokens=1)
    step(s)  # a's 3 blocks are cached
    add(s, "b", prompt_len=14, max_tokens=1)  # a's 12 tokens and 2 more: 3 full blocks cached
    add(s, "c", prompt_len=6, max_tokens=1)  # tokens 1..6: a's first block cached, 2 tokens to compute
    assert s.num_queued_prefill_tokens() == (14 - 12) + (6 - 4)
    step(s)
    assert s.num_queued_prefill_tokens() == 0


def test_a_request_waits_for_the_prefix_a_running_request_is_computing_instead_of_recomputing_it() -> None:
    """A burst sharing a new prefix computes it once: the second request waits while the first
    prefills the shared blocks (chunked), then reuses them; meanwhile the load report counts only
    what it will compute (the control plane predicts the prefix held where it sent the first)."""
    s = make(budget=8)
    a = add(s, "a", prompt_len=17, max_tokens=1)  # 4 full blocks, prefilled in 3 steps of 8
    step(s)
    b = add(s, "b", prompt_len=19, max_tokens=4)  # a's 17 tokens and 2 more: 4 blocks shared
    s.admit()
    assert [q.request_id for q in s.waiting] == ["b"], "b must not start computing a's blocks itself"
    assert s.num_queued_prefill_tokens() == (19 - 16) + (17 - 8)
    step(s)  # a: 16 computed, its 4 full blocks registered
    assert a.num_registered_blocks == 4 and b in s.waiting
    step(s)  # b admitted with a's 4 blocks, computes its last 3 tokens beside a's last one
    assert a.num_computed_tokens == 17 and b.num_computed_tokens == 19
    assert b.num_cached_tokens == 16


def test_a_waiting_request_is_admitted_when_the_request_computing_its_prefix_is_cancelled() -> None:
    s = make(budget=8)
    a = add(s, "a", prompt_len=17, max_tokens=1)
    step(s)
    b = add(s, "b", prompt_len=19, max_tokens=1)
    s.admit()
    assert b in s.waiting
    s.remove(a)
    s.admit()
    assert b in s.running and b.num_cached_tokens == 8  # the blocks a registered before it went


def test_a_request_sharing_nothing_in_flight_is_admitted_at_once() -> None:
    s = make(budget=8)
    add(s, "a", prompt_len=17, max_tokens=1)
    step(s)
    b = add(s, "b", prompt_len=10, max_tokens=1, first_token=50)
    s.admit()
    assert b in s.running and b.num_cached_tokens == 0


def test_prefill_only_pins_full_blocks_and_frees_its_own() -> None:
    s = make()
    add(s, "p", prompt_len=9, prefill_only=True)
    assert step(s) == []  # 8 of 9 tokens fit this step's budget
    [out] = step(s)
    assert (out.finished, out.new_token_ids, len(out.block_hashes)) == (True, [], 2)
    assert [s.blocks.ref_count(b) for b in out.pinned_block_ids] == [1, 1]
    assert s.blocks.num_used_blocks == 2 and s.running == []


def test_prefill_only_republishes_its_own_block_when_the_duplicate_was_evicted() -> None:
    s = make(num_blocks=8, budget=4)
    seq = add(s, "p", prompt_len=8, prefill_only=True)
    [chunk] = s.schedule()
    # Meanwhile the same first block arrives from elsewhere (an import) and is released.
    s._extend_hashes(seq, 2)
    other = s.blocks.allocate(1)
    assert other is not None
    s.blocks.register(seq.block_hashes[:1], other)
    s.blocks.release(other)
    assert s.update(chunk, None) is None
    assert s.blocks.block_hash(seq.block_ids[0]) is None  # the existing copy kept the hash
    # Then that copy is evicted before the prompt finishes.
    filler = s.blocks.allocate(s.blocks.num_free_blocks)
    assert filler is not None and s.blocks.lookup(seq.block_hashes[0]) is None
    own = list(seq.block_ids)
    [out] = step(s)
    assert out.pinned_block_ids == own
    assert [s.blocks.lookup(h) for h in out.block_hashes] == own


class HeldLoad:
    """A lower-tier load the test finishes by hand (the scheduler's LoadHandle)."""

    def __init__(self, hashes: list, block_ids: list[int]) -> None:
        self.hashes, self.block_ids = hashes, block_ids
        self.num_loaded: int | None = None
        self.cancelled = False

    def poll(self) -> int | None:
        return self.num_loaded

    def cancel(self) -> None:
        self.cancelled = True


def with_loads(loads: list[HeldLoad], **kw: object) -> Scheduler:
    s = make(**kw)  # type: ignore[arg-type]

    def start_load(_seq, hashes: list, block_ids: list[int]) -> HeldLoad:
        loads.append(HeldLoad(hashes, block_ids))
        return loads[-1]

    s.start_load = start_load
    return s


def planned(s: Scheduler) -> list[tuple[str, int, int]]:
    """One step, computed: (request, start, tokens) of each chunk."""
    chunks = s.schedule()
    for chunk in chunks:
        s.update(chunk, 7 if chunk.completes_known_tokens else None)
    return [(c.seq.request_id, c.start, c.num_tokens) for c in chunks]


def test_a_loading_request_joins_the_batch_only_when_its_blocks_are_in() -> None:
    loads: list[HeldLoad] = []
    s = with_loads(loads, budget=32)
    add(s, "decode", prompt_len=3, max_tokens=8)
    loader = add(s, "loader", prompt_len=13, max_tokens=2)  # 3 full blocks before the last token
    assert planned(s) == [("decode", 0, 3)]  # the loader's copy is in flight
    assert len(loads) == 1 and loads[0].block_ids == loader.block_ids[:3]
    assert s.load().num_running == 2 and s.loading == [loader]
    assert planned(s) == [("decode", 3, 1)]

    loads[0].num_loaded = 2  # the lower tier held the first two blocks
    assert planned(s) == [("decode", 4, 1), ("loader", 8, 5)]
    assert (loader.num_cached_tokens, loader.num_loaded_tokens) == (8, 8)
    assert s.blocks.lookup(loader.block_hashes[0]) == loader.block_ids[0]  # registered as they arrive
    assert s.loading == [] and planned(s) == [("decode", 5, 1), ("loader", 13, 1)]


def test_a_request_cancelled_mid_load_frees_its_blocks_when_the_copy_stops() -> None:
    loads: list[HeldLoad] = []
    s = with_loads(loads)
    loader = add(s, "loader", prompt_len=13, max_tokens=2)
    s.schedule()
    free_while_loading = s.blocks.num_free_blocks
    s.remove(loader)
    assert loads[0].cancelled and s.loading == [] and s.find("loader") is None
    s.schedule()
    assert s.blocks.num_free_blocks == free_while_loading  # the copy may still write them

    loads[0].num_loaded = 1
    s.schedule()
    assert s.blocks.num_free_blocks == s.blocks.num_blocks and s.blocks.cached_block_hashes() == []
