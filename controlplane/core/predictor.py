"""Predicts, for one placement of a request, its time to first token and the time per output
token it will see, from each worker's fitted step-time model and its reported load.

Rule (after Mooncake's early-rejection predictor):
  TTFT = max(queue, fetch) + prefill + transfer (+ the decode worker's step that computes the
  prompt's tail)
    queue    = the rest of the step in flight on a busy prefill worker (half a step of its running
               batch, on average) + engine steps for the prefill tokens already queued there, in
               chunks;
    prefill  = engine steps for this prompt's uncached tokens, in chunks, attention over the cached
               prefix included;
    every one of those steps carries the decode batch the worker will have: its running requests
    and those admitted there and not yet running (waiting; on a worker that decodes), holding their
    context plus the queued prompts (latency.StepTimeModel.chunked_prefill_seconds);
    fetch    = a cached prefix pulled from another worker (or loaded from a slower tier) before the
               prefill, while the queue drains (routing prices it: policies/kvplane.py);
    transfer = KV bytes to move / the measured link rate (disaggregated placements only); the
               request keeps its place in the decode worker's queue meanwhile
               (EngineRequest.queued_since) and waits for what is ahead of it there, if that has
               not drained by then, before the step that computes the prompt's tail; the step in
               flight then and the tail's may carry a chunk of the prefill arriving on top of what
               was queued there (next_step_with_prefill).
  TPOT = the decode worker's step time at the moment this request's KV arrives (t = TTFT), not now:
    requests whose remaining tokens run out before t have left the batch, requests waiting there now
    have joined it, and so has this one. Predicting at arrival time, not at decision time, is what
    keeps admission from oscillating (Mooncake, FAST'25). Those steps also carry the prefill
    arriving there meanwhile: step / (1 - inflow), at most step + a full chunk's work
    (inflow.py: the worker's recent prefill work per second, `token_seconds`).
  A worker whose batch is full (max_num_seqs), or whose free KV blocks do not hold what the
  requests waiting there and this one reserve (prompt + max_tokens each), first has to finish
  requests (room_wait_s): on the prefill side that wait is queueing; on a separate decode worker
  it begins once the prompt is prefilled, when the pull asks there for blocks (the agent's pulls,
  as a vLLM decode worker's requests, wait from when they ask): blocks freed before then go to
  requests already asking, among them requests routed after this one whose shorter prefill ended
  sooner and prompts prefilled there. A pool full now stays about as full while new requests
  keep coming, so the wait is counted in full after the prefill path, not overlapped with it.
  Without the blocks counted, admission sent remotely prefilled prompts to a decode worker whose
  pool was full: they waited there 1-4 s past their predicted TTFT (`kvplane sim --workload
  trace --prefill 8 --decode 8 --speed 16 --admission predictive`); with the wait overlapped, 35
  of the 46 TTFT misses on lines 6,001-7,000 of the same trace at 16x had waited for blocks (up
  to 2.6 s), each behind a median 5 requests routed after it.
What the model cannot see (RPC hops, process scheduling on a busy host) is learnt as a residual:
Calibration keeps a running mean of measured - predicted per kind of placement and adds it; the
link rate is learnt from measured transfers (LinkRate, an EWMA).
The step model is kvplane.latency.StepTimeModel (linear in prefill tokens, attention work, decode
batch and decode context). Without a model for either worker there is no prediction (None).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist

from kvplane.controlplane.core.views import WorkerView
from kvplane.latency import StepTimeModel
from kvplane.types import WorkerId


@dataclass(frozen=True, slots=True)
class WorkerPerf:
    worker_id: WorkerId
    model: StepTimeModel | None
    chunk_tokens: int  # prefill tokens per engine step
    block_size: int
    num_running: int
    num_waiting: int
    num_queued_prefill_tokens: int
    running_remaining_tokens: tuple[int, ...]
    running_context_tokens: int
    max_num_seqs: int = 0  # 0 = no slot limit known
    num_free_blocks: int = 0  # KV blocks free (cached ones it may evict included) and not promised
    num_used_blocks: int = 0  # and held by running requests (0 = unknown: no wait for memory)
    decodes: bool = True  # False: a prefill-only worker (its waiting requests leave after prefill)
    prefill_inflow: float = 0.0  # seconds of prefill work arriving per second (inflow.py)
    inflow_per_work_s: float = 0.0  # what one second of work dispatched now counts for in it (Inflow.per_work_s)
    carried_work_s: float = math.inf  # the mean prefill work of a prompt arriving here (PrefillInflow.mean_work)
    spread_work_s: float = 0.0  # E[w] (c_w^2 + c_a^2) of the prompts arriving here (PrefillInflow.spread_work)

    @classmethod
    def of(
        cls,
        view: WorkerView,
        prefill_inflow: float = 0.0,
        inflow_per_work_s: float = 0.0,
        carried_work_s: float = math.inf,
        spread_work_s: float = 0.0,
    ) -> WorkerPerf:
        """What the predictor needs of a worker view (whose load the planner has adjusted)."""
        load = view.load
        return cls(
            worker_id=view.worker_id,
            model=view.latency,
            chunk_tokens=view.chunk_tokens,
            block_size=view.block_size,
            num_running=load.num_running,
            num_waiting=load.num_waiting,
            num_queued_prefill_tokens=load.num_queued_prefill_tokens,
            running_remaining_tokens=load.running_remaining_tokens,
            running_context_tokens=load.running_context_tokens,
            max_num_seqs=view.max_num_seqs,
            num_free_blocks=max(load.num_free_blocks - view.pending_blocks, 0),  # less what is promised to requests on their way
            num_used_blocks=load.num_used_blocks,
            decodes=view.role.can_decode,
            prefill_inflow=prefill_inflow,
            inflow_per_work_s=inflow_per_work_s,
            carried_work_s=carried_work_s,
            spread_work_s=spread_work_s,
        )

    def token_seconds(self, step_s: float) -> float:
        """Time per output token of a decode whose steps take `step_s` alone, sharing them with
        the prefill arriving here (shared_step_seconds)."""
        if self.prefill_inflow <= 0:
            return step_s
        assert self.model is not None
        return shared_step_seconds(step_s, self.prefill_inflow, self._chunk_work_s(), self.model.slack_seconds)

    def next_step_seconds(self, step_s: float) -> float:
        """One step starting at some moment, `step_s` alone, with the prefill arriving here on top
        of what is queued (next_step_with_prefill; the rate less the queued work, inflow.py)."""
        if self.prefill_inflow <= 0:
            return step_s
        return next_step_with_prefill(step_s, *self._arriving_and_carried())

    def tail_spread_seconds(self) -> float:
        """The standard deviation of a remotely prefilled request's TTFT from this decode worker's
        steps: its KV lands in a step carrying a chunk of arriving prefill (half of it left, on
        average) and its tail's own step carries one, with the chance p that the worker is
        prefilling then (next_step_with_prefill's mean), else neither: 1.5 chunks or nothing,
        variance p (1 - p) x (1.5 chunks)^2. The mean alone, held to the objective, admitted
        requests whose TTFT then missed by the chunk (`kvplane sim --decisions`, the trace at 16x
        on 8 prefill + 8 decode: the decode side took a median 51 ms and a mean 244-400 ms)."""
        if self.prefill_inflow <= 0:
            return 0.0
        arriving, carried_s = self._arriving_and_carried()
        p = min(arriving, 1.0)
        return math.sqrt(p * (1.0 - p)) * 1.5 * carried_s

    def _arriving_and_carried(self) -> tuple[float, float]:
        """(the prefill arriving here on top of what is queued: the rate less the queued work,
        inflow.py; the work a step then carries)."""
        model = self.model
        assert model is not None
        queued_work_s = model.prefill_work_seconds(self.num_queued_prefill_tokens, 0, max(self.chunk_tokens, 1))
        arriving = max(self.prefill_inflow - queued_work_s * self.inflow_per_work_s, 0.0)
        # With prefill queued here a step fills its chunk from that backlog; without, it carries
        # what arrives: a prompt, the mean of those sent here (PrefillInflow.mean_work).
        carried_s = (
            self._chunk_work_s() if queued_work_s > 0 else min(self._chunk_work_s(), max(self.carried_work_s - model.slack_seconds, 0.0))
        )
        return arriving, carried_s

    def _chunk_work_s(self) -> float:
        model = self.model
        assert model is not None
        chunk = max(self.chunk_tokens, 1)
        return model.prefill_work_seconds(chunk, 0, chunk)

    @property
    def batch(self) -> tuple[int, int]:
        """(sequences, context tokens) of the decode batch this worker will have once what is
        admitted there runs: running + waiting requests, their context + the queued prompts."""
        if not self.decodes:
            return self.num_running, self.running_context_tokens
        return self.num_running + self.num_waiting, self.running_context_tokens + self.num_queued_prefill_tokens


@dataclass(frozen=True, slots=True)
class Prediction:
    ttft_s: float
    tpot_s: float
    queue_s: float
    prefill_s: float
    transfer_s: float
    decode_batch: int  # the decode batch this request is predicted to join
    room_wait_s: float = 0.0  # disaggregated: the decode worker's wait for a free slot and KV blocks (room_wait_s())
    fetch_s: float = 0.0  # pulling a cached prefix from another worker or a slower tier
    prefill_work_s: float = 0.0  # its prefill as one of the stream the worker takes (StepTimeModel.stream_work_seconds; inflow.py)
    ttft_offset_s: float = 0.0  # calibration added to ttft_s / tpot_s (see Calibration)
    tpot_offset_s: float = 0.0
    tpot_spread_s: float = 0.0  # the standard deviation of this request's TPOT (tpot_spread_seconds)
    ttft_spread_s: float = 0.0  # the standard deviation of its TTFT (disaggregated: WorkerPerf.tail_spread_seconds)

    @property
    def ttft_ms(self) -> float:
        return self.ttft_s * 1000

    @property
    def tpot_ms(self) -> float:
        return self.tpot_s * 1000

    @property
    def tpot_high_ms(self) -> float:
        """The TPOT this request stays under with TPOT_CONFIDENCE (one-sided, normal)."""
        return (self.tpot_s + TPOT_Z * self.tpot_spread_s) * 1000

    @property
    def ttft_high_ms(self) -> float:
        """The TTFT this request stays under with the same confidence (TPOT_CONFIDENCE)."""
        return (self.ttft_s + TPOT_Z * self.ttft_spread_s) * 1000


def shared_step_seconds(step_s: float, inflow: float, chunk_work_s: float, slack_s: float = 0.0) -> float:
    """A decode step's time per output token when prefill work arrives at `inflow` seconds per
    second (StepTimeModel.stream_work_seconds) and rides along in its steps, each absorbing
    `slack_s` of it at no cost (the model's kink): a step takes T = step + inflow x T - slack, so
    T = (step - slack) / (1 - inflow), never below step, at most step + `chunk_work_s` (a step
    carries one chunk at most; inflow >= 1 is that bound). Priced per prompt past the kink
    instead, a stream of prompts shorter than it read as no work at all and longer ones as too
    little: a decode's TPOT was predicted 47-122 ms short of what it measured on a worker
    taking many (`kvplane sim --decisions`, the mix workload at 1.5x its capacity on 8 both
    workers, with predictive admission), and 17-27 ms short with the slack counted once a step
    (the rest is the spread of short answers' TPOT, docs/benchmarks.md). kvplane/_pricing.c
    computes the same for every candidate."""
    return min(max(step_s, (step_s - slack_s) / max(1.0 - inflow, 1e-9)), step_s + chunk_work_s)


# Admission holds a request's TPOT (and TTFT) to its objective with this confidence: its mean plus
# TPOT_Z standard deviations (the normal's one-sided point), so that >= 95 % of the admitted meet it.
TPOT_CONFIDENCE = 0.95
TPOT_Z = NormalDist().inv_cdf(TPOT_CONFIDENCE)


def tpot_spread_seconds(tpot_s: float, inflow: float, spread_work_s: float, intervals: int, bound_s: float) -> float:
    """The standard deviation of one request's TPOT, the mean of its `intervals` steps, on a
    worker whose steps share the prefill arriving at `inflow` (shared_step_seconds: `tpot_s`).
    Its decode lasts D = n x (step - slack) + W, W the prefill work that arrives meanwhile: a
    random number of prompts (Poisson), and a prompt that lengthens the decode lets more arrive:
    the busy period of an M/G/1 queue started by n x (step - slack) of work, whose variance is
    that work x lambda E[w^2] / (1 - inflow)^3 (Takacs), so sd(TPOT) = sqrt(inflow x tpot x
    `spread_work_s` / n) / (1 - inflow), `spread_work_s` = E[w^2] / E[w] of the prompts' work.
    Prompts arriving at gaps more or less regular than Poisson's (a renewal stream, squared
    coefficient of variation c_a^2) vary as E[w] x (c_w^2 + c_a^2) instead (PrefillInflow.
    spread_work; a Monte Carlo of such streams agrees within 10 %, tests/core/test_core_inflow.py).
    Capped where the mean plus TPOT_Z of it would pass `bound_s` (a step carries a chunk at most).
    A short answer averages few steps: on a worker taking prompts to 85-95 % of its time its TPOT
    spreads wide of the mean, and admission that held the mean to the objective kept 70.7 % and
    76.8 % attainment (`kvplane sim --workload mix --both 8 --rate 470 --admission predictive`,
    seeds 0 and 1), the misses all TPOT, the means 17-27 ms short; with this, 100.0 % and 99.3 %.
    A model, not a learnt margin: it falls to zero with the inflow, so admission that rejects on
    it opens again (a margin learnt from measured TPOTs shut `kvplane bench load` for good)."""
    if inflow <= 0 or spread_work_s <= 0 or intervals < 1:
        return 0.0
    headroom_s = max(bound_s - tpot_s, 0.0) / TPOT_Z
    if inflow >= 1:
        return headroom_s
    return min(math.sqrt(inflow * tpot_s * spread_work_s / intervals) / (1.0 - inflow), headroom_s)


def next_step_with_prefill(step_s: float, inflow: float, chunk_work_s: float) -> float:
    """One step at a moment that has nothing to do with the worker's steps (a request's KV comes
    in; its tail is computed in the next step): it carries prefill with the chance that the
    worker is prefilling then, its inflow (the share of its time spent on prefill work), so
    step + min(inflow, 1) x `chunk_work_s`: the mean work of the prompts arriving there, a
    chunk's at most (WorkerPerf.next_step_seconds). Not the mean step of shared_step_seconds: a
    moment falls in a long step more often than steps are long."""
    return step_s + min(inflow, 1.0) * chunk_work_s


def _in_flight_s(perf: WorkerPerf) -> float:
    """The rest of the step in flight on a busy worker, which a request arriving now waits for
    before its own prefill: half a step of the running batch, on average."""
    model = perf.model
    assert model is not None
    if perf.num_running <= 0 and perf.num_queued_prefill_tokens <= 0:
        return 0.0
    c = model.coefficients
    return (c[0] + c[3] * perf.num_running + c[4] * perf.running_context_tokens) / 2


def _prefill_steps_seconds(perf: WorkerPerf, num_tokens: int, context_before: int) -> float:
    """Engine steps that prefill `num_tokens` after `context_before` cached ones, with the decode
    batch the worker will have riding along in every step."""
    model = perf.model
    assert model is not None
    seqs, context = perf.batch
    return model.chunked_prefill_seconds(num_tokens, context_before, max(perf.chunk_tokens, 1), seqs, context)


def predict(
    *,
    prompt_tokens: int,
    max_tokens: int,
    prefill_cached_tokens: int,
    prefill: WorkerPerf,
    decode: WorkerPerf,
    transfer_bytes: int = 0,
    link_bytes_per_s: float = 1e9,
    fetch_s: float = 0.0,
) -> Prediction | None:
    """Prediction for prefilling on `prefill` and decoding on `decode` (the same worker when local);
    `fetch_s`: moving a cached prefix there first (prefill_cached_tokens counts it)."""
    if prefill.model is None or decode.model is None:
        return None
    disaggregated = prefill.worker_id != decode.worker_id
    bs = decode.block_size
    own_tokens = prompt_tokens + (0 if disaggregated else max_tokens)  # a remote prefill holds the prompt's blocks alone
    room_s = room_wait_s(prefill, -(-own_tokens // bs) - prefill_cached_tokens // bs)
    queue_s = _in_flight_s(prefill) + _prefill_steps_seconds(prefill, prefill.num_queued_prefill_tokens, 0) + room_s
    prefill_s = _prefill_steps_seconds(prefill, prompt_tokens - prefill_cached_tokens, prefill_cached_tokens)
    transfer_s = transfer_bytes / link_bytes_per_s if disaggregated and link_bytes_per_s > 0 else 0.0
    decode_room_s = room_wait_s(decode, -(-(prompt_tokens + max_tokens) // bs)) if disaggregated else 0.0
    # The pull asks for the decode worker's blocks once the prompt is prefilled: the wait for
    # room starts then (module docstring).
    ttft_s = max(queue_s, fetch_s) + prefill_s + decode_room_s + transfer_s
    if disaggregated:
        # The decode worker computes the prompt's tail (the partial last block) before the first
        # token, once what was queued there ahead of it has gone; the step in flight when the KV
        # is in and the tail's own step may carry a chunk of the prefill arriving there.
        decode_queue_s = _in_flight_s(decode) + _prefill_steps_seconds(decode, decode.num_queued_prefill_tokens, 0)
        in_flight_s = decode.next_step_seconds(2 * _in_flight_s(decode)) / 2
        tail = prompt_tokens - ((prompt_tokens - 1) // decode.block_size) * decode.block_size
        tail_s = decode.next_step_seconds(_prefill_steps_seconds(decode, tail, prompt_tokens - tail))
        ttft_s = max(ttft_s + in_flight_s, decode_queue_s) + tail_s
    tpot_s, spread_s, batch = _tpot_at(decode, ttft_s, prompt_tokens, max_tokens)
    chunk = max(prefill.chunk_tokens, 1)
    work_s = prefill.model.stream_work_seconds(prompt_tokens - prefill_cached_tokens, prefill_cached_tokens, chunk)
    return Prediction(
        ttft_s, tpot_s, queue_s, prefill_s, transfer_s, batch, decode_room_s, fetch_s, work_s,
        tpot_spread_s=spread_s, ttft_spread_s=decode.tail_spread_seconds() if disaggregated else 0.0,
    )  # fmt: skip


def room_wait_s(perf: WorkerPerf, num_blocks: int) -> float:
    """A worker admits a request once it has a free slot (max_num_seqs) and every KV block the
    request can need free (reserved at admission: prompt + max_tokens, less its cached prefix; a
    vLLM or SGLang decode worker also queues for memory rather than evict): until then it waits
    for running requests to finish, the k-th earliest finish, k counting the requests already
    waiting there, each needing and each finish freeing the mean blocks of a running request."""
    if perf.model is None or not perf.running_remaining_tokens:
        return 0.0
    finishes = perf.num_running + perf.num_waiting - perf.max_num_seqs + 1 if perf.max_num_seqs else 0
    if perf.num_running > 0 and perf.num_used_blocks > 0:
        per_request = perf.num_used_blocks / perf.num_running
        short = num_blocks + perf.num_waiting * per_request - perf.num_free_blocks
        finishes = max(finishes, math.ceil(short / per_request))
    if finishes <= 0:
        return 0.0
    remaining = sorted(perf.running_remaining_tokens)
    step = perf.token_seconds(perf.model.decode_step_seconds(max(perf.num_running, 1), perf.running_context_tokens))
    # The first len(remaining) finishes are today's requests; later ones take whole rounds more,
    # a round lasting about a mean request.
    rounds, index = divmod(finishes - 1, len(remaining))
    return (remaining[index] + rounds * sum(remaining) / len(remaining)) * step


class Calibration:
    """What the model misses (RPC hops, processes competing for the CPU, queueing it does not see):
    an exponentially weighted mean of measured - predicted, per kind of latency, added to later
    predictions. An offset fades with a half-life while nothing new is observed: after an
    overload the offset makes admission reject, rejected requests teach nothing, and without the
    fade admission would stay shut. `now`: seconds on any monotonic clock, passed in.

    A kind may rest on a base kind (`bases`): its offset is the base's plus what it alone learnt
    from its own measurements beyond the base's. A disaggregated TTFT misses what a local one
    misses (the same RPC hops and CPU) and more; calibrated apart from nothing, a burst of slow
    local requests would make an unmeasured remote prefill look faster than computing the same
    prompt at home, and routing would disaggregate on calibration noise alone."""

    def __init__(self, weight: float = 0.2, half_life_s: float = 5.0, bases: Mapping[str, str] | None = None) -> None:
        self.weight = weight
        self.half_life_s = half_life_s
        self._bases = dict(bases or {})
        self._offsets: dict[str, tuple[float, float]] = {}  # kind -> (own offset, when observed)

    def observe(self, kind: str, predicted_s: float, measured_s: float, now: float) -> None:
        base = self._bases.get(kind)
        residual = measured_s - predicted_s - (self.offset(base, now) if base else 0.0)
        old = self._offsets.get(kind)
        current = self._own(kind, now)
        offset = residual if old is None else current + self.weight * (residual - current)
        self._offsets[kind] = (offset, now)

    def offset(self, kind: str, now: float) -> float:
        base = self._bases.get(kind)
        return self._own(kind, now) + (self.offset(base, now) if base else 0.0)

    def _own(self, kind: str, now: float) -> float:
        entry = self._offsets.get(kind)
        if entry is None:
            return 0.0
        offset, at = entry
        return offset * 0.5 ** ((now - at) / self.half_life_s)

    def apply(self, prediction: Prediction, ttft_kind: str, tpot_kind: str, now: float) -> Prediction:
        """`prediction` with the offsets added, never below zero; the `*_offset_s` fields say what
        was added, so that `ttft_s - ttft_offset_s` is the raw prediction again. (They held the
        whole offset: where it was clamped, the raw prediction taken back from them was the
        offset's size, the next residual taught that size again, and a calibration pushed to
        -300 s by an overload's queue stayed there while requests kept coming.)"""
        ttft_s = max(prediction.ttft_s + self.offset(ttft_kind, now), 0.0)
        tpot_s = max(prediction.tpot_s + self.offset(tpot_kind, now), 0.0)
        return dataclasses.replace(
            prediction, ttft_s=ttft_s, tpot_s=tpot_s, ttft_offset_s=ttft_s - prediction.ttft_s, tpot_offset_s=tpot_s - prediction.tpot_s
        )


class LinkRate:
    """The KV transfer rate predictions assume: until transfers are measured, `initial_bytes_per_s`
    when the operator gave one, else the rate the workers state (`rate(stated)`: a fleet on a
    fast network that only ever prefills locally would otherwise never be seen to move KV, and
    never fetch a prefix), else DEFAULT_BYTES_PER_S; then an exponentially weighted mean of the
    measured rates (`weight` for the newest), starting from that assumption."""

    DEFAULT_BYTES_PER_S = 1e9

    def __init__(self, initial_bytes_per_s: float = 0.0, weight: float = 0.2) -> None:
        self.initial_bytes_per_s = initial_bytes_per_s  # 0: not given
        self.measured_bytes_per_s: float | None = None
        self.weight = weight

    def rate(self, stated_bytes_per_s: float = 0.0) -> float:
        if self.measured_bytes_per_s is not None:
            return self.measured_bytes_per_s
        return self.initial_bytes_per_s or stated_bytes_per_s or self.DEFAULT_BYTES_PER_S

    def observe(self, num_bytes: int, seconds: float, stated_bytes_per_s: float = 0.0) -> None:
        if num_bytes > 0 and seconds > 0:
            before = self.rate(stated_bytes_per_s)
            self.measured_bytes_per_s = before + self.weight * (num_bytes / seconds - before)


def _tpot_at(decode: WorkerPerf, arrival_s: float, prompt_tokens: int, max_tokens: int) -> tuple[float, float, int]:
    """(TPOT, its spread, the batch it is predicted in)."""
    model = decode.model
    assert model is not None
    running = decode.num_running
    avg_context = decode.running_context_tokens / running if running else float(prompt_tokens)
    step_now = decode.token_seconds(model.decode_step_seconds(max(running, 1), decode.running_context_tokens or prompt_tokens))
    # A request with r tokens left is gone after about r steps of today's step time.
    finished = sum(1 for r in decode.running_remaining_tokens if r * step_now <= arrival_s)
    survivors = max(running - finished, 0)
    batch = survivors + decode.num_waiting + 1
    context = (survivors + decode.num_waiting) * avg_context + prompt_tokens + max_tokens / 2
    return (*_tpot_with_spread(decode, model.decode_step_seconds(batch, int(context)), max_tokens - 1), batch)


def _tpot_with_spread(decode: WorkerPerf, step_s: float, intervals: int) -> tuple[float, float]:
    """(TPOT, its spread) of a decode of `intervals` steps taking `step_s` alone on `decode`."""
    tpot_s = decode.token_seconds(step_s)
    return tpot_s, tpot_spread_seconds(tpot_s, decode.prefill_inflow, decode.spread_work_s, intervals, step_s + decode._chunk_work_s())


def tpot_recovery_s(decode: WorkerPerf, target_tpot_s: float, prompt_tokens: int, max_tokens: int) -> float | None:
    """How long until enough running requests on `decode` finish for the TPOT objective to hold
    as admission holds it, with its spread (None when even an idle worker misses it)."""
    model = decode.model
    if model is None:
        return None
    step_now = decode.token_seconds(model.decode_step_seconds(max(decode.num_running, 1), decode.running_context_tokens or prompt_tokens))
    remaining = sorted(decode.running_remaining_tokens)
    avg_context = decode.running_context_tokens / decode.num_running if decode.num_running else float(prompt_tokens)
    for num_finished in range(len(remaining) + 1):
        survivors = max(decode.num_running - num_finished, 0)
        batch = survivors + decode.num_waiting + 1
        context = (survivors + decode.num_waiting) * avg_context + prompt_tokens + max_tokens / 2
        tpot_s, spread_s = _tpot_with_spread(decode, model.decode_step_seconds(batch, int(context)), max_tokens - 1)
        if tpot_s + TPOT_Z * spread_s <= target_tpot_s:
            return 0.0 if num_finished == 0 else remaining[num_finished - 1] * step_now
    return None


def blocks_to_transfer(prompt_tokens: int, block_size: int, num_held_on_decode: int) -> int:
    """Full prompt blocks a disaggregated request moves: all but those the decode worker holds."""
    full = prompt_tokens // block_size
    return max(full - num_held_on_decode, 0)
