"""The kvplane policy's predictions in seconds (core/seconds.py), each number worked out by hand
from the step-time model: c0 = 10 ms per step, c1 = 1 ms per prefill token, c3 = 2 ms per decode
sequence (attention and context terms 0), chunks of 2,048 tokens, block size 4 (conftest)."""

from __future__ import annotations

import dataclasses

import pytest

from kvplane.controlplane.core.routing import RouteRequest
from kvplane.latency import StepTimeModel, chunked_attention, prefill_attention
from kvplane.types import DisaggMode, Objective, Role, Tier
from tests.core.conftest import make_router

MODEL = StepTimeModel((0.010, 0.001, 0.0, 0.002, 0.0), num_samples=10, mean_abs_pct_error=0.0)
PROMPT_40 = list(range(200, 240))  # 10 blocks of 4; at most 9 count as cached (the last token is computed)
NOW = 100.0


def view(worker_view, name, role=Role.BOTH, **kw):
    return worker_view(name, role, latency=MODEL, **kw)


def breakdown(decision, worker_id):
    return next(c for c in decision.candidates if c.worker_id == worker_id).detail


def test_chunked_prefill_seconds_is_the_sum_of_its_steps():
    model = StepTimeModel((0.01, 2e-5, 1e-9, 3e-4, 2e-7), num_samples=10, mean_abs_pct_error=0.0)
    for n, cached, chunk, seqs, ctx in ((5000, 300, 2048, 7, 9000), (4095, 0, 1023, 0, 0), (1, 17, 8, 2, 5)):
        steps, done = 0.0, 0
        while done < n:
            k = min(chunk, n - done)
            steps += model.step_seconds(k, prefill_attention(k, cached + done), seqs, ctx)
            done += k
        assert model.chunked_prefill_seconds(n, cached, chunk, seqs, ctx) == pytest.approx(steps, rel=1e-12)
    assert chunked_attention(5, 0, 2) == 2 + 6 + 4  # chunks of 2, 2, 1 after 0, 2, 4 tokens: n(2 context + n) // 2 each
    assert model.chunked_prefill_seconds(0, 10, 2048) == 0.0


@pytest.mark.parametrize("free", [0.0, 100.0, 3000.0])
def test_an_idle_workers_ttft_is_the_models_chunked_prefill_kink_included(free, worker_view):
    """kvplane._pricing's closed form, through seconds.price_candidates: an idle worker holding
    `cached` tokens of the prompt (block size 1) is predicted StepTimeModel.chunked_prefill_seconds
    of the rest, which the test above checks step by step; with a kink c1 prices only each chunk's
    tokens past it (StepTimeModel.free_prefill_tokens)."""
    import dataclasses

    from kvplane.controlplane.core.index import overlap_score
    from kvplane.controlplane.core.pool import WorkerPool, WorkerTable
    from kvplane.controlplane.core.seconds import Rates, Request, price_candidates

    model = StepTimeModel((0.01, 2e-5, 1e-9, 3e-4, 2e-7), 10, 0.0, free_prefill_tokens=free)
    for n, cached, chunk in ((5000, 300, 2048), (4095, 0, 1023), (90, 17, 64), (1, 5, 16)):
        view = dataclasses.replace(worker_view("w", Role.BOTH, block_size=1, latency=model), chunk_tokens=chunk)
        table = WorkerTable([view])
        pool, none = table.pool(), WorkerPool(table, table.pool().rows[:0])
        req = Request(n + cached, 1, 1, allow_local=True, allow_remote=False)
        held = {view.worker_id: overlap_score(cached)} if cached else {}
        priced = price_candidates(req, pool, held, held, none, none, Rates(1e9, 0.0, 1e9, 1e9, 1e4))
        assert priced.ttft[0] == pytest.approx(model.chunked_prefill_seconds(n, cached, chunk), rel=1e-12)
        assert priced.computed[0] == n and priced.cached_tokens[0] == cached


def test_a_kinked_models_steps_are_flat_up_to_the_kink():
    model = StepTimeModel((0.01, 2e-5, 0.0, 0.0, 0.0), 10, 0.0, free_prefill_tokens=128)
    assert model.step_seconds(16) == model.step_seconds(128) == 0.01
    assert model.step_seconds(1128) == pytest.approx(0.01 + 1000 * 2e-5)
    steps, done = 0.0, 0
    while done < 700:  # chunks of 256: 256, 256, 188, each 128 tokens free
        k = min(256, 700 - done)
        steps += model.step_seconds(k, 0)
        done += k
    assert model.chunked_prefill_seconds(700, 0, 256) == pytest.approx(steps)


def test_a_hit_wins_by_the_prefill_it_saves(worker_view, index, cache_prefix):
    cache_prefix("holder", PROMPT_40, 8)
    workers = [view(worker_view, "holder"), view(worker_view, "idle")]
    d = make_router().route(RouteRequest("m", PROMPT_40, 16, DisaggMode.NEVER), workers, index, NOW)
    # holder: one step (10 ms) + 8 uncached tokens (8 ms); idle: 10 ms + 40 tokens.
    assert [(c.worker_id, round(c.cost, 9)) for c in d.candidates] == [("holder", 0.018), ("idle", 0.050)]
    assert d.decode_worker == "holder" and d.cached_tokens == 32
    # TPOT: one decode step of the batch with this request: 10 ms + 2 ms x 1.
    assert breakdown(d, "holder").tpot_s == pytest.approx(0.012)


def test_the_holder_loses_when_its_queue_costs_more_than_twice_the_prefix_compute(worker_view, index, cache_prefix):
    cache_prefix("holder", PROMPT_40, 8)
    busy = view(worker_view, "holder", num_running=2, num_waiting=1, num_queued_prefill_tokens=100)
    d = make_router().route(RouteRequest("m", PROMPT_40, 16, DisaggMode.NEVER), [busy, view(worker_view, "idle")], index, NOW)
    # Every step of the holder carries the batch it will have: 2 running + 1 waiting = 16 ms a step.
    # queue: the rest of the step in flight (half of 10 + 2 x 2 running: 7 ms) + 16 + 100 ms;
    # prefill 16 + 8 ms: 147 ms (+ 8 ms of compute spent) against the idle worker's 50 ms (+ 40).
    holder = breakdown(d, "holder")
    assert (holder.queue_s, holder.prefill_s, holder.ttft_s) == pytest.approx((0.123, 0.024, 0.147))
    assert d.decode_worker == "idle" and d.fetch_from is None  # never mode: no fetch either


def test_a_worker_without_blocks_or_a_slot_for_one_more_request_queues_it_until_a_finish(worker_view, index):
    """Blocks are reserved at admission: 2 running requests hold 45 of the full worker's 100
    blocks each and 10 are free, so one more like them waits for the earliest finish, 5 tokens
    of 14 ms steps (10 ms + 2 x 2 ms) away (predictor.room_wait_s, with a running request's mean
    blocks: routing's queue does not depend on the request)."""
    full = view(worker_view, "full", num_running=2, num_used_blocks=90, running_remaining_tokens=(20, 5))
    roomy = view(worker_view, "roomy", num_running=2, num_used_blocks=20, running_remaining_tokens=(20, 5))
    d = make_router().route(RouteRequest("m", PROMPT_40, 16, DisaggMode.NEVER), [full, roomy], index, NOW)
    in_flight = (0.010 + 2 * 0.002) / 2
    assert breakdown(d, "full").queue_s == pytest.approx(in_flight + 5 * 0.014)
    assert breakdown(d, "roomy").queue_s == pytest.approx(in_flight)
    assert d.decode_worker == "roomy"
    # Its slots taken (max_num_seqs 2), a worker with blocks to spare queues it the same way.
    seated = dataclasses.replace(roomy, max_num_seqs=2)
    d = make_router().route(RouteRequest("m", PROMPT_40, 16, DisaggMode.NEVER), [seated], index, NOW)
    assert breakdown(d, "roomy").queue_s == pytest.approx(in_flight + 5 * 0.014)


def test_a_hot_prefix_is_replicated_by_fetch_when_the_pull_beats_the_prefill(worker_view, index, cache_prefix):
    cache_prefix("holder", PROMPT_40, 8)
    busy = view(worker_view, "holder", num_running=2, num_waiting=1, num_queued_prefill_tokens=100, block_nbytes=1000)
    idle = view(worker_view, "idle", block_nbytes=1000)
    request = RouteRequest("m", PROMPT_40, 16, DisaggMode.AUTO)
    d = make_router(fetch_overhead_ms=6.0).route(request, [busy, idle], index, NOW, link_bytes_per_s=1e6)
    # Pull 8 blocks x 1,000 B at 1 MB/s = 8 ms + 6 ms, then prefill 8 tokens: 14 + 18 = 32 ms < 50.
    assert (d.decode_worker, d.fetch_from, d.fetch_tokens) == ("idle", "holder", 32)
    assert d.fetch_s == pytest.approx(0.014)
    assert d.candidates[0].cost == pytest.approx(0.032)
    # A slow link: the pull (8 s) loses to recomputing, 50 ms.
    d = make_router(fetch_overhead_ms=6.0).route(request, [busy, idle], index, NOW, link_bytes_per_s=1e3)
    assert (d.decode_worker, d.fetch_from) == ("idle", None)


def test_host_blocks_cost_their_load_time(worker_view, index, cache_prefix):
    cache_prefix("host", PROMPT_40, 8, Tier.HOST)
    workers = [view(worker_view, "host", block_nbytes=10**6), view(worker_view, "idle", block_nbytes=10**6)]
    d = make_router(host_load_gb_per_s=0.1).route(RouteRequest("m", PROMPT_40, 16, DisaggMode.NEVER), workers, index, NOW)
    # 8 blocks x 1 MB at 0.1 GB/s = 80 ms of loading, then 18 ms: 98 ms, worse than recomputing (50).
    assert breakdown(d, "host").move_s == pytest.approx(0.080)
    assert d.decode_worker == "idle"


def test_remote_prefill_is_chosen_by_seconds_not_a_threshold(worker_view, index):
    # Steps of 8 prompt tokens: the 40-token prompt prefills in 5 steps.
    decode = dataclasses.replace(view(worker_view, "d", Role.DECODE, num_running=10, block_nbytes=100), chunk_tokens=8)
    prefill = dataclasses.replace(view(worker_view, "p", Role.PREFILL, block_nbytes=100), chunk_tokens=8)
    request = RouteRequest("m", PROMPT_40, 16, DisaggMode.AUTO)
    d = make_router().route(request, [decode, prefill], index, NOW, link_bytes_per_s=1e5)
    # local on d: its steps carry 10 decodes (30 ms a step): half a step in flight, 15, then
    # 5 x 30 + 40 = 205 ms. remote: p prefills in 5 x 10 + 40 = 90 ms, 10 full blocks x 100 B at
    # 100 kB/s (10 ms), then d's half step in flight (15) and its step computing the 4-token tail
    # (30 + 4): 149 ms.
    assert (d.decode_worker, d.prefill_worker) == ("d", "p")
    assert d.candidates[0].cost == pytest.approx(0.149)
    # With 200 tokens queued on d (15 + 25 x 30 + 200 = 965 ms) the request, which keeps its place
    # there while p prefills, waits for what of that queue outlasts the prefill and the transfer.
    queued = dataclasses.replace(decode, load=dataclasses.replace(decode.load, num_queued_prefill_tokens=200))
    d = make_router().route(request, [queued, prefill], index, NOW, link_bytes_per_s=1e5)
    assert breakdown(d, "d").transfer_s == pytest.approx(0.965 - 0.090 + 0.034)
    # An idle decode worker prefills locally: 90 ms beats 90 + 10 + 14.
    idle = dataclasses.replace(view(worker_view, "d", Role.DECODE, block_nbytes=100), chunk_tokens=8)
    assert make_router().route(request, [idle, prefill], index, NOW, link_bytes_per_s=1e5).prefill_worker is None


def test_a_remote_requests_kv_lands_in_a_step_carrying_the_prompts_arriving_there(worker_view, index):
    """The step in flight when the KV is in, and the tail's, carry the prefill arriving at the
    decode worker with the chance it is prefilling then (inflow 0.5): the mean work of the prompts
    sent there (Inflow.carried), a chunk at most."""
    import numpy as np

    from kvplane.controlplane.core.inflow import Inflow

    decode = dataclasses.replace(view(worker_view, "d", Role.DECODE, num_running=10, block_nbytes=100), chunk_tokens=8)
    prefill = dataclasses.replace(view(worker_view, "p", Role.PREFILL, block_nbytes=100), chunk_tokens=8)
    request = RouteRequest("m", PROMPT_40, 16, DisaggMode.AUTO)

    def remote_ttft(inflow):
        d = make_router().route(request, [decode, prefill], index, NOW, link_bytes_per_s=1e5, prefill_inflow=inflow)
        assert d.prefill_worker == "p"
        return d.candidates[0].cost

    # 90 ms on p, 10 of KV, then half of d's 30 ms step + 0.5 x 4 ms carried, then its tail step
    # (30 + 4) + 0.5 x 4: 100 + 16 + 36.
    assert remote_ttft(Inflow(np.array([0.5, 0.0]), 0.0, np.array([0.004, np.inf]))) == pytest.approx(0.152)
    # Prompts bigger than a chunk (8 ms of work) carry a chunk: 100 + 17 + 38.
    assert remote_ttft(Inflow(np.array([0.5, 0.0]), 0.0, np.array([0.050, np.inf]))) == pytest.approx(0.155)
    assert remote_ttft(Inflow(np.array([0.5, 0.0]), 0.0)) == pytest.approx(0.155)
    # With prefill queued on d its steps fill their chunk from that backlog: the mean does not count.
    decode = dataclasses.replace(decode, load=dataclasses.replace(decode.load, num_queued_prefill_tokens=4))
    assert remote_ttft(Inflow(np.array([0.5, 0.0]), 0.0, np.array([0.004, np.inf]))) == remote_ttft(Inflow(np.array([0.5, 0.0]), 0.0))


def test_a_decode_batch_sends_its_prompts_to_a_prefill_worker_sooner_or_not(worker_view, index):
    """A prompt prefilled on a decode worker delays every sequence of its batch by the prefill's
    compute: a remote prefill on a worker that only prefills delays none (seconds.batch_share_of)."""
    decode = dataclasses.replace(view(worker_view, "d", Role.DECODE, num_running=2, block_nbytes=100), chunk_tokens=8)
    prefill = dataclasses.replace(view(worker_view, "p", Role.PREFILL, block_nbytes=100), chunk_tokens=8)
    request = RouteRequest("m", PROMPT_40, 16, DisaggMode.AUTO)
    # Local on d (14 ms steps): 7 + 5 x 14 + 40 = 117 ms; remote: p's 90 ms, the KV's 10, d's half
    # step and its tail step (7 + 18): 125 ms. The 40 ms of compute delay, locally, the next
    # request and d's 2 decodes, each of whose ms is worth 2000 / (200 x 16 / 2) = 1.25 of a
    # prompt's (the default objectives): 117 + 40 x 3.5 = 257 against 125 + 40 on p.
    d = make_router().route(request, [decode, prefill], index, NOW, link_bytes_per_s=1e5)
    assert (d.decode_worker, d.prefill_worker) == ("d", "p")
    assert (d.candidates[0].cost, breakdown(d, "d").cost_s) == (pytest.approx(0.125), pytest.approx(0.040))
    # A 120 ms TTFT objective only local prefill meets: meeting it comes first.
    d = make_router().route(request, [decode, prefill], index, NOW, link_bytes_per_s=1e5, objective=Objective(120.0, 200.0))
    assert (d.decode_worker, d.prefill_worker, d.candidates[0].cost) == ("d", None, pytest.approx(0.117))


def test_a_prefill_on_a_worker_that_decodes_is_charged_at_the_larger_batch(worker_view, index):
    """A prompt prefilled on another decoding worker does not join the batch it delays there: its
    cost is that batch's or the decode worker's, the larger (_pricing.c's remote_per_work), so a
    worker that reported a small batch does not draw every prompt of the fleet."""
    busy = dataclasses.replace(view(worker_view, "busy", num_running=6, block_nbytes=100), chunk_tokens=8)
    calm = dataclasses.replace(view(worker_view, "calm", num_running=2, block_nbytes=100), chunk_tokens=8)
    request = RouteRequest("m", PROMPT_40, 16, DisaggMode.AUTO)
    d = make_router().route(request, [busy, calm], index, NOW, link_bytes_per_s=1e5)
    assert d.decode_worker == "calm"  # 117 ms + 40 x (1 + 2 x 1.25)
    # busy (22 ms steps) prefilling locally: 11 + 5 x 22 + 40 = 161 ms + 40 x (1 + 6 x 1.25) = 501;
    # on calm: 117 + 10 + 11 + 26 = 164 ms + 40 x 8.5 (calm's own batch would say 40 x 3.5: 304).
    assert (breakdown(d, "busy").placement, breakdown(d, "busy").cost_s) == ("local prefill", pytest.approx(0.340))


def test_the_objectives_pick_among_the_candidates(worker_view, index, cache_prefix):
    cache_prefix("holder", PROMPT_40, 8)
    # The holder runs 8 requests: steps of 10 + 2 x 8 = 26 ms. It is the fastest to the first
    # token (half the step in flight, 13 ms, then 26 + 8: 47 ms against the idle worker's 50) but
    # its batch's TPOT with this request, 10 + 2 x 9 = 28 ms, misses a 25 ms objective.
    workers = [view(worker_view, "holder", num_running=8), view(worker_view, "idle")]
    request = RouteRequest("m", PROMPT_40, 16, DisaggMode.NEVER)
    d = make_router().route(request, workers, index, NOW, objective=Objective(ttft_ms=2000.0, tpot_ms=25.0))
    assert d.decode_worker == "idle"
    holder = breakdown(d, "holder")
    assert (holder.ttft_s, holder.tpot_s, holder.meets) == (pytest.approx(0.047), pytest.approx(0.028), False)
    assert "misses objectives" in d.candidates[1].note
    # With a 100 ms TPOT objective both meet: the least TTFT + what the prefill costs the others.
    # The holder's 8 ms of compute delay the request after it and its 8 decodes, each of whose
    # milliseconds is worth 2000 / (100 x 16 / 2) = 2.5 of a prompt's (seconds.batch_share_of): 47 +
    # 8 x (1 + 8 x 2.5) = 215 ms against the idle worker's 50 + 40 = 90. Short decodes have little
    # TPOT budget to give.
    d = make_router().route(request, workers, index, NOW, objective=Objective(ttft_ms=2000.0, tpot_ms=100.0))
    assert d.decode_worker == "idle"
    assert breakdown(d, "holder").cost_s == pytest.approx(0.168) and breakdown(d, "idle").cost_s == pytest.approx(0.040)
    # Decodes of 400 tokens: 2000 / (100 x 200) = 0.1: 47 + 8 x 1.8 = 61.4 ms, the holder's.
    long = RouteRequest("m", PROMPT_40, 400, DisaggMode.NEVER)
    d = make_router().route(long, workers, index, NOW, objective=Objective(ttft_ms=2000.0, tpot_ms=100.0))
    assert d.decode_worker == "holder" and breakdown(d, "holder").cost_s == pytest.approx(0.0144)
    assert "costs the others 14.4 ms" in d.candidates[0].note
    # Neither meets a 10 ms TTFT objective: the one that misses by the least (47 / 10 < 50 / 10).
    d = make_router().route(request, workers, index, NOW, objective=Objective(ttft_ms=10.0, tpot_ms=100.0))
    assert d.decode_worker == "holder"


def test_equal_seconds_are_a_seeded_draw(worker_view, index):
    a, b = view(worker_view, "a"), view(worker_view, "b")
    request = RouteRequest("m", PROMPT_40, 16, DisaggMode.NEVER)
    picks = [make_router(seed=s).route(request, [a, b], index, NOW).decode_worker for s in range(20)]
    assert set(picks) == {"a", "b"}
    assert picks == [make_router(seed=s).route(request, [a, b], index, NOW).decode_worker for s in range(20)]
    # One running request makes b's steps 2 ms longer: 52 ms against 50, no tie.
    b_busy = dataclasses.replace(b, load=dataclasses.replace(b.load, num_running=1))
    assert {make_router(seed=s).route(request, [a, b_busy], index, NOW).decode_worker for s in range(5)} == {"a"}


def test_at_equal_seconds_the_cache_holder_wins_over_recomputing(worker_view, index, cache_prefix):
    # A model fitted on steps whose prefill never varied prices prefill tokens at 0 (c1 = c2 = 0):
    # the holder and an idle worker both predict one 10 ms step. The cache decides, for every draw.
    flat = StepTimeModel((0.010, 0.0, 0.0, 0.002, 0.0), num_samples=10, mean_abs_pct_error=0.0)
    cache_prefix("holder", PROMPT_40, 8)
    workers = [worker_view("holder", Role.BOTH, latency=flat), worker_view("idle", Role.BOTH, latency=flat)]
    request = RouteRequest("m", PROMPT_40, 16, DisaggMode.NEVER)
    picks = {make_router(seed=s).route(request, workers, index, NOW).decode_worker for s in range(20)}
    assert picks == {"holder"}


def test_a_worker_taking_more_prefill_predicts_a_slower_tpot(worker_view, index):
    """Its decode steps carry the prefill arriving there (core/inflow.py): an idle worker's
    12 ms step (10 + 2 for this request) is 24 ms where half of every second goes to prefill."""
    import numpy as np

    from kvplane.controlplane.core.inflow import Inflow

    workers = [view(worker_view, "a"), view(worker_view, "b")]
    request = RouteRequest("m", PROMPT_40, 16, DisaggMode.NEVER)
    inflow = Inflow(np.array([0.0, 0.5]), 0.0)  # per row of the workers' table, in their order
    d = make_router().route(request, workers, index, NOW, objective=Objective(ttft_ms=2000.0, tpot_ms=20.0), prefill_inflow=inflow)
    assert d.decode_worker == "a"
    assert (breakdown(d, "a").tpot_s, breakdown(d, "b").tpot_s) == (pytest.approx(0.012), pytest.approx(0.024))
    assert breakdown(d, "b").meets is False
    # Beyond its capacity every step carries a chunk: 12 ms + 2,048 tokens x 1 ms.
    d = make_router().route(request, workers, index, NOW, prefill_inflow=Inflow(np.array([0.0, 1.5]), 0.0))
    assert breakdown(d, "b").tpot_s == pytest.approx(0.012 + 2.048)


def test_routing_prices_the_steps_slack_as_admission_does(worker_view, index):
    """_pricing.c's TPOT of a worker taking a stream of prompts is predictor.shared_step_seconds'
    with the model's slack (c1 x its kink): (step - slack) / (1 - inflow), not below the step."""
    import numpy as np

    from kvplane.controlplane.core.inflow import Inflow
    from kvplane.controlplane.core.predictor import shared_step_seconds

    kinked = StepTimeModel((0.010, 0.001, 0.0, 0.001, 0.0), num_samples=10, mean_abs_pct_error=0.0, free_prefill_tokens=4.0)
    workers = [worker_view(w, latency=kinked) for w in ("a", "b", "c")]
    request = RouteRequest("m", PROMPT_40, 16, DisaggMode.NEVER)
    d = make_router().route(request, workers, index, NOW, prefill_inflow=Inflow(np.array([0.0, 0.2, 0.8]), 0.0))
    step = 0.010 + 0.001  # this request alone in the batch
    for worker, inflow in (("a", 0.0), ("b", 0.2), ("c", 0.8)):
        assert breakdown(d, worker).tpot_s == pytest.approx(shared_step_seconds(step, inflow, np.inf, slack_s=0.004))
    assert breakdown(d, "b").tpot_s == pytest.approx(step)  # its 4 ms of slack a step take what arrives
    assert breakdown(d, "c").tpot_s == pytest.approx((step - 0.004) / 0.2)


def test_at_equal_seconds_the_worker_taking_less_prefill_wins_before_the_draw(worker_view, index):
    """Two idle workers whose steps' slack absorbs the prefill arriving at each: the same TTFT and
    TPOT; the one taking less of it wins, whatever the router's draw (seconds.choose)."""
    import numpy as np

    from kvplane.controlplane.core.inflow import Inflow

    kinked = StepTimeModel((0.010, 0.001, 0.0, 0.001, 0.0), num_samples=10, mean_abs_pct_error=0.0, free_prefill_tokens=4.0)
    workers = [worker_view(w, latency=kinked) for w in ("a", "b")]
    request = RouteRequest("m", PROMPT_40, 16, DisaggMode.NEVER)
    inflow = Inflow(np.array([0.2, 0.1]), 0.0)
    decisions = [make_router(seed=s).route(request, workers, index, NOW, prefill_inflow=inflow) for s in range(10)]
    assert breakdown(decisions[0], "a").tpot_s == breakdown(decisions[0], "b").tpot_s
    assert {d.decode_worker for d in decisions} == {"b"}
    assert {make_router(seed=s).route(request, workers, index, NOW).decode_worker for s in range(10)} == {"a", "b"}  # none: the draw


def test_when_none_meets_the_objectives_the_least_ttft_wins(worker_view, index, cache_prefix):
    """TTFT is the miss the placement decides; a TPOT missing everywhere is the prefill arriving
    everywhere (seconds.choose)."""
    import numpy as np

    from kvplane.controlplane.core.inflow import Inflow

    cache_prefix("b", PROMPT_40, 8)
    workers = [view(worker_view, "a"), view(worker_view, "b")]
    request = RouteRequest("m", PROMPT_40, 16, DisaggMode.NEVER)
    # a: TTFT 50 ms misses 40, TPOT 12 meets 25. b holds 32 tokens: TTFT 10 + 8 = 18 ms meets, but
    # prefill arriving there at 0.8 s/s stretches its TPOT to 12 / 0.2 = 60 ms, a worse miss by ratio.
    objective = Objective(ttft_ms=40.0, tpot_ms=25.0)
    d = make_router().route(request, workers, index, NOW, objective=objective, prefill_inflow=Inflow(np.array([0.0, 0.8]), 0.0))
    assert (breakdown(d, "a").meets, breakdown(d, "b").meets) == (False, False)
    assert breakdown(d, "b").tpot_s == pytest.approx(0.060)
    assert d.decode_worker == "b"


def test_fleet_columns_kept_across_updates_equal_columns_made_from_scratch(worker_view):
    """FleetColumns redoes only the rows a table changed, whether the table was updated in place
    (WorkerTable.updated: the planner's corrected view) or made from the last one (replaced),
    and writes them into the arrays it keeps: after any sequence of both, what it returns is
    what a fresh FleetColumns computes for the table."""
    import random

    import numpy as np

    from kvplane.controlplane.core.pool import WorkerTable
    from kvplane.controlplane.core.seconds import FleetColumns, Rates

    rng = random.Random(5)
    models = [StepTimeModel((0.01, 2e-5, 1e-9, 3e-4, 2e-7), 10, 0.0, free_prefill_tokens=f) for f in (0.0, 500.0)]

    def view(i: int):
        return worker_view(
            f"w{i:02d}", rng.choice([Role.DECODE, Role.BOTH]), num_running=rng.randrange(8), num_waiting=rng.randrange(3),
            num_queued_prefill_tokens=rng.choice([0, 100, 5000]), running_context_tokens=rng.randrange(20000),
            latency=rng.choice(models + [None]),
        )  # fmt: skip

    rates = Rates(1e9, 0.006, 25e9, 3e9, 20000.0)
    kept = FleetColumns()
    table = WorkerTable([view(i) for i in range(24)]).private()
    for step in range(60):
        rows = {i: view(i) for i in rng.sample(range(24), rng.randrange(0, 4))}
        table = table.updated(rows) if rng.random() < 0.7 else table.replaced(rows)
        columns, seconds = kept.of(table, rates)
        fresh, want = FleetColumns().of(table, rates)
        assert np.array_equal(columns, fresh), f"step {step}"
        assert np.array_equal(seconds, want), f"step {step}"


def test_the_compiled_pricing_refuses_columns_of_the_wrong_type_size_or_rows():
    """kvplane._pricing reads numpy buffers by pointer: a column of another dtype, of the wrong
    length or a row outside the table is a ValueError naming it, never a read out of bounds."""
    import numpy as np

    from kvplane import _pricing

    n = 4
    good = dict(
        m=np.ones((11, n)), seconds=np.zeros((4, n)), held=np.zeros((3, n), np.int64), device=np.empty(0, np.int64),
        inflow=np.empty(0), carried=np.empty(0), id_rank=np.arange(n), can_decode=np.ones(n, bool), decode_rows=np.arange(n),
        prefill_rows=np.empty(0, np.int64), source_rows=np.empty(0, np.int64),
    )  # fmt: skip
    numbers = (64, 16, 8, True, False, 0, 1e9, 0.006, 25e9, 3e9, 0.0, 0.0, 0.0, 0.0, 0.1, np.inf, np.inf)

    def price(**changes):
        columns = {**good, **changes}
        return _pricing.price_group(*columns.values(), *numbers, np.empty((7, n), np.int64), np.empty((7, n)))

    assert price() == n
    for name, bad, says in (
        ("m", np.ones((11, n), np.float32), "m: items of format 'f'"),
        ("held", np.zeros((3, n)), "held: items of format 'd'"),
        ("seconds", np.zeros((4, n - 1)), "seconds: 12 items, expected 16"),
        ("decode_rows", np.array([0, 1, 2, n]), "decode_rows: row 4 outside the table's 4 rows"),
        ("inflow", np.zeros(n - 1), "device, inflow and carried: one value per table row"),
        ("carried", np.zeros(n + 1), "device, inflow and carried: one value per table row"),
        ("m", np.ones((10, n)), "m: not 11 rows"),
        ("m", np.ones((n, 11)).T, "not C-contiguous"),
    ):
        with pytest.raises((ValueError, BufferError), match=says):
            price(**{name: bad})


def test_without_the_compiled_pricing_routing_says_what_to_install(monkeypatch):
    """setup.py builds kvplane._pricing as optional (an install without a C compiler still gets
    the SDK and the agents); the control plane's routing then fails to import with an error that
    names the fix."""
    import importlib
    import sys

    import kvplane

    monkeypatch.delattr(kvplane, "_pricing")
    monkeypatch.setitem(sys.modules, "kvplane._pricing", None)  # None in sys.modules: the import fails
    monkeypatch.delitem(sys.modules, "kvplane.controlplane.core.seconds")  # restored after the test
    with pytest.raises(ImportError, match="kvplane._pricing, the control plane's routing pricing .* install a C compiler"):
        importlib.import_module("kvplane.controlplane.core.seconds")
