"""Every routing candidate priced in predicted seconds, as columns (the kvplane policy's rule).

For a prompt of P tokens (block size bs, B = (P - 1) // bs blocks at most count as cached: the
engine computes the last token) and each decode candidate w, from its step-time model c0..c4
(kvplane.latency; a worker that publishes none yet gets its peers' median, below) and
its corrected load (queued prefill tokens Q, running R, waiting W, running context X):

  batch(w)    = R + W sequences holding X + Q tokens: the decode batch w will have once what is
                admitted there runs (every prefill step of w carries it);
  steps(N, K) = the engine steps prefilling N tokens after K cached, chunk by chunk, with that
                batch riding along (StepTimeModel.chunked_prefill_seconds, in closed form);
  queue       = the rest of the step in flight on a busy worker (half a step of its running
                batch, c0 + c3 x R + c4 x X, on average) + steps(Q, 0): the prefill queued
                ahead (FIFO: the request waits for all of it);
  own         = min(blocks w holds or is predicted to hold, B); those on a slower tier load at
                `host_bytes_per_s` / `disk_bytes_per_s` (load);
  local TTFT  = max(queue, load) + steps(P - own x bs, own x bs);
  fetch       = the most device blocks D any other worker really holds (KV can move, same block
                layout): pulling D - own blocks over the link (+ `fetch_overhead_s`) while the
                queue drains, then steps(P - D x bs, D x bs), when that predicts less than local;
  remote TTFT = max(part(p) + KV transfer of the full blocks w lacks / link rate + the rest of
                the step in flight on w then, w's queue) + w's step computing the prompt's tail,
                where part(p) = queue + load + prefill on prefill worker p, the p with the least
                part among those KV can move from to w (a dedicated prefill worker first at
                equal seconds); the request keeps its place in w's queue while its KV comes
                (EngineRequest.queued_since), so what is queued there drains meanwhile; the
                step in flight and the tail's step carry the prompts arriving there (their mean
                work, a chunk at most) with the chance that prefill arriving on top of that
                queue keeps w prefilling (core/inflow.py);
  TTFT(w)     = the least of the placements the request's disagg mode allows (+ the planner's
                calibration offset of that kind); TPOT(w) = one decode step of batch(w) + this
                request, c0 + c3 x (R + W + 1) + c4 x (X + Q + P + max_tokens / 2), stretched by
                the prefill arriving at w, whose chunks its steps carry (core/inflow.py:
                predictor.shared_step_seconds: (step - slack) / (1 - inflow), never below
                the step, at most step + a chunk's work) (+ offset).

Choice (Mooncake's conductor, against the objectives, with what a placement spends): of the
candidates whose predicted TTFT and TPOT meet the request's objectives, the least TTFT + cost,
where cost is what its prefill costs the requests on the worker that runs it: its compute (c1 x
tokens + c2 x attention, _pricing.c's chunked_parts) delays the request queued after it and each
sequence of the decode batch its chunks ride with, a second of a decode's worth
ttft_target / (tpot_target x max_tokens / 2) of a prompt's (batch_share_of: the share of its
objective each spends), so cost = compute x (1 + batch x share); when none meets them, the least
TTFT, the miss the placement decides. A worker that only prefills has no batch to delay: on a
disaggregated fleet (`kvplane sim`, synthetic 1,024-4,096 in on 4 prefill + 4 decode) counting
only the compute kept prompts on the decode workers whenever their queue was shorter than a KV
transfer, tripling TPOT and losing TTFT p99 to llm-d's rule; the batch's share moved them to the
prefill workers. A remote prefill on a worker that also decodes is charged at the larger of its
batch and the decode worker's (_pricing.c's remote_per_work: it never wins by a batch it does not
join). Each candidate's placement (local, fetch, remote) is picked by this same rule. A TPOT that misses on every candidate comes from the prefill arriving
everywhere (an overloaded fleet; core/inflow.py), which follows the requests: ordered by it, the
decodes went to the workers that happened to prefill least and were prefilled elsewhere, moving
312-387 GB of KV in 20 s and losing goodput to llm-d's rule in 5 of 5 draws (`kvplane sim`,
synthetic at 1.5x without admission); ordered by TTFT they stayed and won 3 of 3. Greedy TTFT alone
recomputes a prefix on an idle worker the moment its holder's queue matches the prefill, which
costs the fleet that prefill again and scatters the prefix; counting the work keeps a reader with
the holder until the holder's queue costs more than the prefix's compute twice over. Ties (equal
seconds: idle workers that hold nothing, or a model that cannot yet price prefill tokens) go to
the fewer prompt tokens prefilled, then the lower TPOT, then the less prefill arriving, then the router's seeded draw.
A hot prefix's holder keeps its readers until then; the next reader goes where the prefix
arrives soonest, usually by a fetch from the holder: the prefix is replicated onto a second
holder (which then draws readers itself once its KV events arrive: a fetched prefix is not
predicted, as a reader sent there before the pull lands would compute it again), not recomputed
on a scatter of workers. Whether prefill runs remotely is the same comparison, pair by pair, not a
token threshold. Every number is kept per candidate (`SecondsBreakdown`) for `kvplane route
--explain`.

A worker that publishes no step-time model yet (it learns one from the steps it runs) is priced
with the median model of its peers (same model and block layout), not as faster than all of
them; the fallback prefill rate is for a fleet where none has one. (The control plane's views
already carry one pooled model per kind of worker, core/step_pool.py; this covers a worker whose
kind has none yet, and tables built without the control plane: the simulator, the benchmarks.)

Only candidates that can win are priced in full (`limit` > 0, the router's
max_uncached_candidates). The workers are taken in classes of equal matches (the same blocks of
the prompt held, on the same tiers: the holders of a shared system prompt, and those holding
none), whose members differ only in load; of each class of more than `limit`, the `limit` with
the least TTFT + cost and the `limit` with the least TTFT prefilling locally or after a fetch, the
`limit` with the least TTFT + cost and the least TTFT after the best remote prefill (their
queue and step in flight order it, not their batch step alone), the `limit` with the shortest
batch step (without prefill arriving, their TPOT) and, with prefill arriving, the `limit` with
the least stretched step (their TPOT), each with every worker tied with the last; a smaller
class is kept whole. For workers of one step-time model that keeps the winner of pricing every
worker; with objectives it can differ only when a class's fastest all miss an objective that a
slower one meets. What does not depend on the request (each worker's
columns, batch step and queue seconds) is kept from one request to the next (FleetColumns) and
redone only for the rows a new table changed. A remote prefill worker costs exactly its local
TTFT + compute, so the two least of each class of prefill workers (and their ties) are kept,
all the choice of the best and second best prefill worker needs.

Where it is computed: kvplane/_pricing.c, the only implementation of these predictions for many
workers at once (in numpy they cost ~0.5 ms per request at 1,000 workers, the overhead of a few
hundred calls on small arrays; docs/benchmarks.md). This module gathers its inputs (Held,
_columns, FleetColumns, the groups) and makes the choice.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import chain

import numpy as np

try:
    from kvplane import _pricing
except ImportError as error:  # setup.py builds it where a C compiler and the Python headers exist
    raise ImportError(
        "kvplane._pricing, the control plane's routing pricing (kvplane/_pricing.c), is not built: install a C compiler and the "
        "Python headers (Debian/Ubuntu: gcc python3-dev), then reinstall kvplane"
    ) from error
from kvplane.controlplane.core.index import Overlaps, OverlapScore
from kvplane.controlplane.core.inflow import Inflow
from kvplane.controlplane.core.pool import WorkerPool, WorkerTable
from kvplane.controlplane.core.predictions import Extended
from kvplane.controlplane.core.predictor import WorkerPerf, room_wait_s
from kvplane.types import WorkerId

LOCAL, FETCH, REMOTE = 0, 1, 2
_INF = float("inf")


@dataclass(frozen=True, slots=True)
class Rates:
    """What moving KV costs, and the model of a worker without its own: routing's parameters."""

    link_bytes_per_s: float  # KV over the network (the planner's measured link rate)
    fetch_overhead_s: float  # fixed cost of one pull of a cached prefix
    host_bytes_per_s: float  # loading a block from host memory into the device
    disk_bytes_per_s: float  # ... from disk
    fallback_prefill_tokens_per_s: float  # a worker that publishes no step-time model


@dataclass(frozen=True, slots=True)
class SecondsBreakdown:
    """One candidate's predicted seconds, formatted only when someone reads them."""

    placement: str  # "local prefill", "fetch N blocks from W", "remote prefill on W"
    queue_s: float
    move_s: float  # fetch + tier loads (overlapped with the queue)
    prefill_s: float
    transfer_s: float  # remote prefill: KV transfer and the decode worker's tail step
    ttft_s: float
    tpot_s: float
    meets: bool | None  # both objectives met (None: no objective known)
    cost_s: float = 0.0  # what its prefill costs the requests where it runs (Priced.work)

    def __str__(self) -> str:
        verdict = "" if self.meets is None else ("; meets objectives" if self.meets else "; misses objectives")
        return (
            f"{self.placement}: TTFT {self.ttft_s * 1000:.1f} ms = max(queue {self.queue_s * 1000:.1f}, move "
            f"{self.move_s * 1000:.1f}) + prefill {self.prefill_s * 1000:.1f} + transfer {self.transfer_s * 1000:.1f}; "
            f"TPOT {self.tpot_s * 1000:.2f} ms; costs the others {self.cost_s * 1000:.1f} ms{verdict}"
        )


@dataclass(frozen=True, slots=True)
class Request:
    num_prompt_tokens: int
    max_tokens: int
    block_size: int
    allow_local: bool
    allow_remote: bool  # remote prefill and fetches (disagg not NEVER)
    # A second of delay to one sequence of a decode batch, in seconds of a prompt's wait: what the
    # objectives make of it (batch_share_of). 0: only the prompts queued after a prefill count.
    batch_share: float = 0.0
    # The objectives `choose` holds the candidates to (inf: none), by which each candidate's
    # placement (local, fetch, remote) is picked as the candidates are.
    ttft_target_s: float = float("inf")
    tpot_target_s: float = float("inf")


def batch_share_of(ttft_target_s: float, tpot_target_s: float, max_tokens: int) -> float:
    """How much a decode's delay weighs against a prompt's, by the share of its objective each
    spends: a prompt has `ttft_target_s` to its first token; a running decode, with the
    max_tokens / 2 tokens left that TPOT predictions assume, has that many times `tpot_target_s`.
    A second of the decode's is worth ttft_target_s / (tpot_target_s x max_tokens / 2) of the prompt's."""
    return ttft_target_s / (tpot_target_s * max(max_tokens / 2, 1.0))


@dataclass(slots=True)
class Held:
    """Per table row: leading prompt blocks matched, of them on host and on disk (0 for a worker
    without a score). Built from the scores' holders only: a request costs O(holders) here."""

    numbers: np.ndarray  # (3, rows): the three below, one array to copy

    @property
    def matched(self) -> np.ndarray:
        return self.numbers[0]

    @property
    def host(self) -> np.ndarray:
        return self.numbers[1]

    @property
    def disk(self) -> np.ndarray:
        return self.numbers[2]

    @staticmethod
    def of(table: WorkerTable, overlaps: Mapping[WorkerId, OverlapScore], base: Held | None = None) -> Held:
        """`overlaps`' numbers, over `base`'s (None: zeros)."""
        if base is None:
            out = np.zeros((3, len(table.views)), np.int64)
        else:
            out = base.numbers.copy()
        if not overlaps:
            return Held(out)
        if isinstance(overlaps, Overlaps):
            found = overlaps.held_rows(table.row_of)
            if found is not None:
                out[:, found[0]] = found[1]  # the index's answer as groups: no score per holder
                return Held(out)
            overlaps = overlaps.as_dict()
        row_of = table.row_of
        rows = list(map(row_of.get, overlaps))
        numbers = [score.numbers for score in overlaps.values()]
        if None in rows:  # the index outlives a departed worker's row
            numbers = [v for row, v in zip(rows, numbers) if row is not None]
            rows = [row for row in rows if row is not None]
        if rows:
            out[:, rows] = np.fromiter(chain.from_iterable(numbers), np.int64, 3 * len(rows)).reshape(-1, 3).T
        return Held(out)


def _columns(table: WorkerTable, rows: np.ndarray, rates: Rates) -> np.ndarray:
    """The per-worker numbers of `rows` (an index array) that kvplane._pricing reads: a (11, rows)
    array of c0..c4 (the step-time model, kvplane.latency), its kink (prefill tokens per step c1
    does not price), the prefill chunk, the queued prefill tokens, what every step carries (c0 + c3
    x batch sequences + c4 x batch context), KV bytes per block and the decode batch's sequences (0 where it only prefills). Counts are whole floats (exact). Counts are whole floats (exact)."""
    c = table.step[rows]
    missing = np.isnan(c[:, 0])
    if missing.any():
        c = c.copy()
        c[missing] = _borrowed_models(table, rows[missing], rates)
    m = np.empty((11, len(c)))
    m[:6] = c.T
    decodes = table.can_decode[rows]
    queued = table.queued[rows]
    seqs = table.running[rows] + np.where(decodes, table.waiting[rows], 0)
    context = table.context[rows] + np.where(decodes, queued, 0)
    m[6], m[7], m[9] = table.chunk[rows], queued, table.block_nbytes[rows]
    m[8] = m[0] + m[3] * seqs + m[4] * context
    m[10] = np.where(decodes, seqs, 0)
    return m


def _borrowed_models(table: WorkerTable, rows: np.ndarray, rates: Rates) -> np.ndarray:
    """Step-time models for `rows`, which publish none yet (a worker learns its own from the
    steps it runs): each coefficient's median over the workers of the same model and block
    layout that do publish one (same weights, same hardware as a rule), so a new worker is
    priced like its peers, not as faster than all of them; the fallback prefill rate only when
    no such worker has a model."""
    out = np.empty((len(rows), 6))
    out[:] = (0.0, 1.0 / rates.fallback_prefill_tokens_per_s, 0.0, 0.0, 0.0, 0.0)
    known = ~np.isnan(table.step[:, 0])
    if not known.any():
        return out
    kind = table.model_code.astype(np.int64) * (int(table.block_nbytes.max()) + 1) + table.block_nbytes
    for k in np.unique(kind[rows]).tolist():
        peers = known & (kind == k)
        if peers.any():
            out[kind[rows] == k] = np.median(table.step[peers], axis=0)
    return out


class FleetColumns:
    """The whole table's _columns and each worker's seconds that do not depend on the request
    (_worker_seconds), kept from one request to the next. A table updated in place since (the
    planner's corrected view: WorkerTable.updated) or made from the last one (WorkerTable.replaced)
    has only its changed rows redone, in place, so a request pays for what changed, not for the fleet.
    What `of` returns is valid until its next call (the arrays are rewritten then)."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        # (the table, its version, the fallback prefill rate, the columns, the per-row seconds)
        self._last: tuple[weakref.ref, int, float, np.ndarray, np.ndarray] | None = None

    def of(self, table: WorkerTable, rates: Rates) -> tuple[np.ndarray, np.ndarray]:
        """(_columns of every row of `table`, and _worker_seconds of every row)."""
        last, fallback = self._last, rates.fallback_prefill_tokens_per_s
        if last is not None and last[2] == fallback:
            before, version, columns, seconds = last[0](), last[1], last[3], last[4]
            if before is table and version == table.version:
                return columns, seconds
            # The table the columns were made for, updated in place once (WorkerTable.updated), or
            # a table made from it (WorkerTable.replaced): both differ from it in changed_rows only.
            derived = table.version == version + 1 if before is table else before is not None and table.parent is before
            if derived and len(table.changed_rows) < len(table.views) // 4:
                rows = np.fromiter(table.changed_rows, np.int64, len(table.changed_rows))
                columns[:, rows] = changed = _columns(table, rows, rates)
                seconds[:, rows] = _worker_seconds(table, rows, changed)
                self._last = (weakref.ref(table), table.version, fallback, columns, seconds)
                return columns, seconds
        every = np.arange(len(table.views))
        columns = _columns(table, every, rates)
        seconds = _worker_seconds(table, every, columns)
        self._last = (weakref.ref(table), table.version, fallback, columns, seconds)
        return columns, seconds


def _worker_seconds(table: WorkerTable, rows: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """Per row, (what a request arriving now waits before its own prefill: the rest of the step in
    flight on a busy worker, half a step of its running batch on average, and the queued prefill;
    of that, the queued prefill's compute, what the inflow less the queued work takes off; a full chunk's
    compute, what a step carrying one adds: c1 x its tokens past the kink + c2 x its attention;
    the step a busy worker has in flight, with everything it carries: what a remote prefill's
    KV waits for, half of it on average), computed by kvplane._pricing.worker_seconds."""
    out = np.empty((4, len(rows)))
    _pricing.worker_seconds(columns, table.running[rows], table.context[rows], out)
    _add_room_waits(table, rows, out[0])
    return out


def _add_room_waits(table: WorkerTable, rows: np.ndarray, queue: np.ndarray) -> None:
    """Adds to `queue` (per row of `rows`) the wait of a worker whose free KV blocks do not hold
    the requests waiting there and one more like those it runs, or whose slots (max_num_seqs)
    are taken (predictor.room_wait_s: they wait for running requests to finish). Routing prices
    a running request's mean blocks and steps without the prefill arriving there, neither of which
    changes from one request to the next, so a worker's queue is kept across requests;
    admission's prediction prices the request's own blocks and the stretched steps."""
    running, used, waiting = table.running[rows], table.used[rows], table.waiting[rows]
    per_request = used / np.maximum(running, 1)
    free = table.total[rows] - used - table.pending[rows]
    slots = np.fromiter((table.views[r].max_num_seqs for r in rows.tolist()), np.int64, len(rows))
    full = (slots > 0) & (running + waiting >= slots)
    for k in np.flatnonzero((running > 0) & ((per_request * (waiting + 1) > free) | full)).tolist():
        perf = WorkerPerf.of(table.views[int(rows[k])])
        queue[k] += room_wait_s(perf, math.ceil(per_request[k]))


@dataclass(frozen=True, slots=True)
class Placed:
    """How one candidate's prediction is made up (Priced.placed): what the choice does not read,
    worked out only for the candidates someone reads (the one chosen, an explanation)."""

    placement: int  # LOCAL, FETCH or REMOTE
    queue_s: float
    move_s: float  # fetch + tier loads (overlapped with the queue)
    prefill_s: float
    transfer_s: float  # remote prefill: KV transfer and the decode worker's tail step
    fetch_blocks: int  # FETCH: blocks pulled
    source_row: int  # FETCH: the table row pulled from (-1: none)
    prefill_row: int  # REMOTE: the prefill worker's table row (-1: none)


@dataclass(slots=True)
class Priced:
    """The candidates' predictions, row for row with `pool` (the candidates priced): what the
    choice reads as columns, the rest (`placed`) for one candidate when asked."""

    pool: WorkerPool
    ttft: np.ndarray
    tpot: np.ndarray
    cached_tokens: np.ndarray  # on the decode worker (its own blocks)
    # What the placement's prefill costs the requests on the worker that runs it, in seconds of a
    # prompt's wait: its compute (_pricing.c's chunked_parts) x (1 + the decode batch there x
    # Request.batch_share); the choice spends it with the TTFT.
    work: np.ndarray
    computed: np.ndarray  # prompt tokens the placement prefills (the rest are cached or fetched)
    placed: Callable[[int], Placed]  # the i-th candidate's breakdown


def price_candidates(
    req: Request,
    decode: WorkerPool,
    overlaps: Mapping[WorkerId, OverlapScore],
    cached: Mapping[WorkerId, OverlapScore],
    sources: WorkerPool,
    prefill: WorkerPool,
    rates: Rates,
    offsets: tuple[float, float, float] = (0.0, 0.0, 0.0),
    limit: int = 0,
    fleet: FleetColumns | None = None,
    inflow: Inflow | None = None,
) -> Priced:
    """The module docstring's predictions for the workers of `decode` that can win (all of them
    when limit is 0). `overlaps`: the prompt's prefix per worker as the policy sees it
    (predictions included); `cached`: what the index really holds (what a fetch can pull);
    `sources`: workers a fetch may pull from; `prefill`: remote prefill candidates; offsets: the
    calibration (TTFT local, TTFT remote, TPOT); `fleet`: the caller's FleetColumns, kept from
    one request to the next; `inflow`: per table row, the prefill work arriving per second
    (core/inflow.py), which the steps of a decode there carry. Each group of candidates sharing a KV transport and block layout
    gets the sources and prefill workers its KV can move with."""
    table = decode.table
    real = Held.of(table, cached)
    # The policy's overlaps are the index's with predicted prefixes added or extended (same
    # objects elsewhere, predictions.Extended lists them): only those are read again.
    if overlaps is cached:
        held = real
    else:
        changed = overlaps.extended if isinstance(overlaps, Extended) else {w: s for w, s in overlaps.items() if cached.get(w) is not s}
        held = Held.of(table, changed, real)
    # Fetch sources: the index's own device blocks (a prediction cannot be pulled yet).
    device = _NONE
    if req.allow_remote and len(sources) and cached:
        device = np.minimum(real.matched - real.host - real.disk, (req.num_prompt_tokens - 1) // req.block_size)
    columns, seconds = (fleet or FleetColumns()).of(table, rates)
    prune = limit > 0 and max(len(decode), len(prefill)) > limit
    carried = _NO_VALUES if inflow is None or inflow.carried is None else inflow.carried
    args = (
        columns,
        seconds,
        held.numbers,
        device,
        _NO_VALUES if inflow is None else inflow.rates,
        carried,
        table.id_rank,
        table.can_decode,
    )
    after = (
        req.num_prompt_tokens, req.block_size, req.max_tokens, req.allow_local, prune, limit, rates.link_bytes_per_s,
        rates.fetch_overhead_s, rates.host_bytes_per_s, rates.disk_bytes_per_s, *offsets, 0.0 if inflow is None else inflow.per_work_s,
        req.batch_share, req.ttft_target_s, req.tpot_target_s,
    )  # fmt: skip
    parts = []
    for group in _groups(decode):
        first = table.views[int(group.rows[0])] if len(group) else None
        prefill_rows = source_rows = _NONE
        if first is not None and req.allow_remote and len(prefill):
            prefill_rows = prefill.where(table.kv_mask(first)).rows
        if first is not None and device is not _NONE:
            nbytes = int(table.block_nbytes[int(group.rows[0])])
            source_rows = sources.where(table.kv_mask(first, cached_blocks=True) & (table.block_nbytes == nbytes)).rows
        out_int, out_float = np.empty((7, len(group)), np.int64), np.empty((7, len(group)))
        count = _pricing.price_group(*args, group.rows, prefill_rows, source_rows, *after, out_int, out_float)
        parts.append(_priced(table, out_int[:, :count], out_float[:, :count]))
    if len(parts) == 1:
        return parts[0]
    rows = np.concatenate([p.pool.rows for p in parts])
    order = np.argsort(rows, kind="stable")
    starts = np.cumsum([0] + [len(p.pool) for p in parts])  # each part's first position in `rows`

    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(p, name) for p in parts])[order]

    def placed(i: int) -> Placed:
        j = int(order[i])
        g = int(np.searchsorted(starts, j, side="right")) - 1
        return parts[g].placed(j - int(starts[g]))

    columns = (cat(name) for name in ("ttft", "tpot", "cached_tokens", "work", "computed"))
    return Priced(WorkerPool(table, rows[order]), *columns, placed)


# kvplane._pricing's "none" for an optional column or set of rows (int64), or of values (float64)
_NONE, _NO_VALUES = np.empty(0, np.int64), np.empty(0)


def _priced(table: WorkerTable, out_int: np.ndarray, out_float: np.ndarray) -> Priced:
    """kvplane._pricing.price_group's answer as Priced."""
    rows, cached, computed, fetch_blocks, source_row, prefill_row, kind = out_int
    ttft, tpot, work, queue_s, move_s, prefill_s, transfer_s = out_float

    def placed(k: int) -> Placed:
        return Placed(
            int(kind[k]), float(queue_s[k]), float(move_s[k]), float(prefill_s[k]), float(transfer_s[k]), int(fetch_blocks[k]),
            int(source_row[k]), int(prefill_row[k]),
        )  # fmt: skip

    return Priced(WorkerPool(table, np.ascontiguousarray(rows)), ttft, tpot, cached, work, computed, placed)


def _groups(decode: WorkerPool) -> list[WorkerPool]:
    """The candidates split by (KV transport, block bytes): usually one group, the whole pool."""
    table = decode.table
    if table.fixed(("one kv group",), lambda: len(set(zip(table.transport_code.tolist(), table.block_nbytes.tolist()))) <= 1):
        return [decode]  # the whole fleet is one group (known once per set of workers)
    transport, nbytes = decode.column("transport_code"), decode.column("block_nbytes")
    if not len(decode) or ((transport == transport[0]).all() and (nbytes == nbytes[0]).all()):
        return [decode]
    keys = transport.astype(np.int64) * (int(nbytes.max()) + 1) + nbytes
    return [decode.where_own(keys == k) for k in np.unique(keys).tolist()]


def choose(
    priced: Priced, ttft_target_s: float | None, tpot_target_s: float | None, tie_rank: np.ndarray, arriving: np.ndarray | None = None
) -> np.ndarray:
    """The candidates in the order of the module docstring's choice (indices): those meeting the
    objectives by TTFT + the prefill seconds they spend, then the others by their TTFT (how far
    it misses); ties by the fewer prompt tokens prefilled (a model fitted where prefill did not
    vary prices a prefix's compute at 0, and the cache is then the only evidence left), then
    TPOT, then the less prefill `arriving` per second (per candidate: a stream its steps' slack
    absorbs adds no predicted TPOT, yet an equal prediction holds likelier where less arrives),
    then `tie_rank` (the router's draw among equals)."""
    ttft, tpot, computed = priced.ttft, priced.tpot, priced.computed
    spent = ttft + priced.work
    arrivals = arriving if arriving is not None else np.zeros(len(ttft))
    if ttft_target_s is None or tpot_target_s is None:
        return np.lexsort((tie_rank, arrivals, tpot, computed, ttft, spent))
    meets = (ttft <= ttft_target_s) & (tpot <= tpot_target_s)
    key = np.where(meets, spent, _INF)
    return np.lexsort((tie_rank, arrivals, tpot, computed, np.where(meets, 0.0, ttft), key, ~meets))
