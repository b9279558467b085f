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
                step in flight and the tail's step carry a chunk with the chance that prefill
                arriving on top of that queue keeps w prefilling (core/inflow.py);
  TTFT(w)     = the least of the placements the request's disagg mode allows (+ the planner's
                calibration offset of that kind); TPOT(w) = one decode step of batch(w) + this
                request, c0 + c3 x (R + W + 1) + c4 x (X + Q + P + max_tokens / 2), stretched by
                the prefill arriving at w, whose chunks its steps carry (core/inflow.py:
                step / (1 - inflow), at most step + a chunk's work) (+ offset).

Choice (Mooncake's conductor, against the objectives, with what a placement spends): of the
candidates whose predicted TTFT and TPOT meet the request's objectives, the least TTFT + work,
where work is the compute its prefill adds (c1 x tokens + c2 x attention, chunked_parts: the
seconds later requests will wait for); when none meets them, the least TTFT, the miss the
placement decides. A TPOT that misses on every candidate comes from the prefill arriving
everywhere (an overloaded fleet; core/inflow.py), which follows the requests: ordered by it, the
decodes went to the workers that happened to prefill least and were prefilled elsewhere, moving
312-387 GB of KV in 20 s and losing goodput to llm-d's rule in 5 of 5 draws (`kvplane sim`,
synthetic at 1.5x without admission); ordered by TTFT they stayed and won 3 of 3. Greedy TTFT alone
recomputes a prefix on an idle worker the moment its holder's queue matches the prefill, which
costs the fleet that prefill again and scatters the prefix; counting the work keeps a reader with
the holder until the holder's queue costs more than the prefix's compute twice over. Ties (equal
seconds: idle workers that hold nothing, or a model that cannot yet price prefill tokens) go to
the fewer prompt tokens prefilled, then the lower TPOT, then the router's seeded draw.
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
max_uncached_candidates): every worker holding part of the prompt, and of the others (which
differ only in load) the `limit` with the least TTFT prefilling locally or after a fetch, the
`limit` with the least TTFT after the best remote prefill (their queue and step in flight order
it, not their batch step alone), the `limit` with the shortest batch step (without prefill
arriving, their TPOT) and, with prefill arriving, the `limit` with the least stretched step
(their TPOT), each with every worker tied with the last. For workers of one step-time model that keeps the winner
of pricing every worker; with objectives it can differ only when the fastest non-holders all
miss an objective that a slower one meets. What does not depend on the request (each worker's
columns, batch step and queue seconds) is kept from one request to the next (FleetColumns) and
redone only for the rows a new table changed. A remote prefill worker that holds
none of the prompt costs exactly its local TTFT, so the two least of those (and their ties)
are kept, all the choice of the best and second best prefill worker needs.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

from kvplane.controlplane.core.index import OverlapScore
from kvplane.controlplane.core.inflow import Inflow
from kvplane.controlplane.core.pool import WorkerPool, WorkerTable
from kvplane.controlplane.core.predictor import next_step_with_prefill, shared_step_seconds
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

    def __str__(self) -> str:
        verdict = "" if self.meets is None else ("; meets objectives" if self.meets else "; misses objectives")
        return (
            f"{self.placement}: TTFT {self.ttft_s * 1000:.1f} ms = max(queue {self.queue_s * 1000:.1f}, move "
            f"{self.move_s * 1000:.1f}) + prefill {self.prefill_s * 1000:.1f} + transfer {self.transfer_s * 1000:.1f}; "
            f"TPOT {self.tpot_s * 1000:.2f} ms{verdict}"
        )


@dataclass(frozen=True, slots=True)
class Request:
    num_prompt_tokens: int
    max_tokens: int
    block_size: int
    allow_local: bool
    allow_remote: bool  # remote prefill and fetches (disagg not NEVER)


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
        row_of = table.row_of
        rows = list(map(row_of.get, overlaps))
        numbers = [score.numbers for score in overlaps.values()]
        if None in rows:  # the index outlives a departed worker's row
            numbers = [v for row, v in zip(rows, numbers) if row is not None]
            rows = [row for row in rows if row is not None]
        if rows:
            out[:, rows] = np.fromiter(chain.from_iterable(numbers), np.int64, 3 * len(rows)).reshape(-1, 3).T
        return Held(out)


@dataclass(slots=True)
class Columns:
    """The per-worker numbers of some rows of a table that predictions read."""

    c0: np.ndarray  # the step-time model's coefficients (kvplane.latency), one column each
    c1: np.ndarray
    c2: np.ndarray
    c3: np.ndarray
    c4: np.ndarray
    free: np.ndarray  # the model's kink: prefill tokens per step c1 does not price (StepTimeModel.free_prefill_tokens)
    chunk: np.ndarray
    queued: np.ndarray
    per_step: np.ndarray  # what every step carries: c0 + c3 x batch sequences + c4 x batch context
    nbytes: np.ndarray
    one_chunk: int  # the chunk size when every worker has the same (the usual fleet), else 0
    # The prompt's blocks matched on each worker, of them on host and on disk (Held).
    matched: np.ndarray | None = None
    host: np.ndarray | None = None
    disk: np.ndarray | None = None

    @staticmethod
    def of(table: WorkerTable, rows, rates: Rates) -> Columns:
        """Of `rows` (an index array, or slice(None): the whole table); no held blocks."""
        c = table.step[rows]
        missing = np.isnan(c[:, 0])
        if missing.any():
            c = c.copy()
            c[missing] = _borrowed_models(table, np.arange(len(table.views))[rows][missing], rates)
        c = np.ascontiguousarray(c.T)
        decodes = table.can_decode[rows]
        queued = table.queued[rows]
        seqs = table.running[rows] + np.where(decodes, table.waiting[rows], 0)
        context = table.context[rows] + np.where(decodes, queued, 0)
        per_step = c[0] + c[3] * seqs + c[4] * context
        chunk = table.chunk[rows]
        return Columns(c[0], c[1], c[2], c[3], c[4], c[5], chunk, queued, per_step, table.block_nbytes[rows], _one(chunk))

    def take(self, i: np.ndarray, held: Held | None = None) -> Columns:
        """These columns at positions `i` (with `held`'s blocks at rows `i`)."""
        return Columns(
            self.c0[i], self.c1[i], self.c2[i], self.c3[i], self.c4[i], self.free[i], self.chunk[i], self.queued[i], self.per_step[i],
            self.nbytes[i], self.one_chunk or _one(self.chunk[i]),
            *((held.matched[i], held.host[i], held.disk[i]) if held is not None else ()),
        )  # fmt: skip

    def put(self, i: np.ndarray, other: Columns) -> None:
        """`other`'s values written at positions `i`, in place."""
        for name in _COLUMN_NAMES:
            getattr(self, name)[i] = getattr(other, name)
        if other.one_chunk != self.one_chunk:
            self.one_chunk = _one(self.chunk)


_COLUMN_NAMES = ("c0", "c1", "c2", "c3", "c4", "free", "chunk", "queued", "per_step", "nbytes")


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


def _one(chunk: np.ndarray) -> int:
    return int(chunk[0]) if len(chunk) and chunk.min() == chunk.max() else 0


class FleetColumns:
    """The whole table's Columns and each worker's seconds that do not depend on the request
    (_worker_seconds), kept from one request to the next. A table updated in place since (the
    planner's corrected view: WorkerTable.updated) or made from the last one (WorkerTable.replaced)
    has only its changed rows redone, in place, so a request pays for what changed, not for the fleet.
    What `of` returns is valid until its next call (the arrays are rewritten then)."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        # (the table, its version, the fallback prefill rate, the columns, the per-row seconds)
        self._last: tuple[weakref.ref, int, float, Columns, np.ndarray] | None = None

    def of(self, table: WorkerTable, rates: Rates) -> tuple[Columns, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(Columns of every row of `table`, and per row: the seconds a request arriving now waits
        before its prefill, of them the queued prefill's compute, a full chunk's compute, the step
        in flight on a busy worker)."""
        last, fallback = self._last, rates.fallback_prefill_tokens_per_s
        if last is not None and last[2] == fallback:
            before, version, col, seconds = last[0](), last[1], last[3], last[4]
            if before is table and version == table.version:
                return col, *seconds
            # The table the columns were made for, updated in place once (WorkerTable.updated), or
            # a table made from it (WorkerTable.replaced): both differ from it in changed_rows only.
            derived = table.version == version + 1 if before is table else before is not None and table.parent is before
            if derived and len(table.changed_rows) < len(table.views) // 4:
                rows = np.fromiter(table.changed_rows, np.int64, len(table.changed_rows))
                changed = Columns.of(table, rows, rates)
                col.put(rows, changed)
                seconds[:, rows] = _worker_seconds(table, rows, changed)
                self._last = (weakref.ref(table), table.version, fallback, col, seconds)
                return col, *seconds
        every = np.arange(len(table.views))  # fancy indexing: columns of our own, not the table's, to write into
        col = Columns.of(table, every, rates)
        seconds = _worker_seconds(table, every, col)
        self._last = (weakref.ref(table), table.version, fallback, col, seconds)
        return col, *seconds


def _worker_seconds(table: WorkerTable, rows, col: Columns) -> np.ndarray:
    """Per row, (what a request arriving now waits before its own prefill: the rest of the step in
    flight on a busy worker, half a step of its running batch on average, and the queued prefill;
    of that, the queued prefill's compute, what inflow.Inflow.arriving takes off; a full chunk's
    compute, what a step carrying one adds: c1 x its tokens past the kink + c2 x its attention;
    the step a busy worker has in flight, with everything it carries: what a remote prefill's
    KV waits for, half of it on average)."""
    running = table.running[rows]
    in_flight = col.c0 + col.c3 * running + col.c4 * table.context[rows]
    # The queued prefill and a full chunk in one pass (a row each: broadcast over the rows).
    steps, (queued_work, chunk_work) = chunked_parts(col, np.stack((col.queued, col.chunk)), 0)
    busy = (running > 0) | (col.queued > 0)
    queue = np.where(busy, in_flight / 2, 0.0) + steps[0] + queued_work
    return np.stack((queue, queued_work, chunk_work, np.where(busy, col.per_step, 0.0)))


def chunked_seconds(col: Columns, num_tokens, num_cached) -> np.ndarray:
    """Per worker, StepTimeModel.chunked_prefill_seconds(num_tokens, num_cached, chunk, batch)
    (numbers or arrays)."""
    steps, compute = chunked_parts(col, num_tokens, num_cached)
    return steps + compute


def chunked_parts(col: Columns, num_tokens, num_cached) -> tuple[np.ndarray, np.ndarray]:
    """chunked_seconds in two parts: (the steps' own seconds, each carrying the batch, the
    prefill's compute: c1 x its tokens past each step's kink + c2 x attention). The second is the work the prefill adds to
    the worker, what it takes from the requests that come after it."""
    chunk = col.one_chunk
    if chunk and isinstance(num_tokens, int):  # one prompt, one chunk size: the steps are numbers
        n = max(num_tokens, 0)
        steps = -(-n // chunk)
        before_last = max(steps - 1, 0)
        last = n - before_last * chunk
        num_odd = before_last * (chunk % 2) + last % 2
        attention = (2 * n * num_cached + (n * n - num_odd)) // 2
        hinge = before_last * np.maximum(chunk - col.free, 0) + np.maximum(last - col.free, 0)
        return steps * col.per_step, col.c1 * hinge + col.c2 * attention
    chunk = chunk or col.chunk
    n = np.maximum(num_tokens, 0)
    steps = -(-n // chunk)
    before_last = np.maximum(steps - 1, 0)
    last = n - before_last * chunk
    num_odd = before_last * (chunk % 2) + last % 2
    attention = (2 * n * num_cached + n * n - num_odd) // 2
    # The tokens c1 prices: each step's past the model's kink (kvplane.latency.chunked_hinge; for
    # no tokens both terms are 0, the kink being >= 0).
    hinge = before_last * np.maximum(chunk - col.free, 0) + np.maximum(last - col.free, 0)
    return steps * col.per_step, col.c1 * hinge + col.c2 * attention


def _own_and_load(col: Columns, max_blocks: int, rates: Rates) -> tuple[np.ndarray, np.ndarray | float]:
    """(blocks counted as cached, seconds loading those held on a slower tier): the matched
    prefix's device blocks first, then host, then disk."""
    own = np.minimum(col.matched, max_blocks)
    if not (col.host.any() or col.disk.any()):
        return own, 0.0
    slow = np.maximum(own - (col.matched - col.host - col.disk), 0)
    from_host = np.minimum(col.host, slow)
    load_s = col.nbytes * (from_host / rates.host_bytes_per_s + (slow - from_host) / rates.disk_bytes_per_s)
    return own, load_s


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
    work: np.ndarray  # of prefill: the compute it adds (chunked_parts), what the choice spends
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
    # objects elsewhere): only those are read again.
    held = real if overlaps is cached else Held.of(table, {w: s for w, s in overlaps.items() if cached.get(w) is not s}, real)
    # Fetch sources: the index's own device blocks (a prediction cannot be pulled yet).
    device = None
    if req.allow_remote and len(sources) and cached:
        device = np.minimum(real.matched - real.host - real.disk, (req.num_prompt_tokens - 1) // req.block_size)
    fleet = _Fleet(req, *(fleet or FleetColumns()).of(table, rates), limit > 0 and max(len(decode), len(prefill)) > limit, inflow)  # fmt: skip
    parts = [_price_group(req, group, held, device, sources, prefill, rates, offsets, limit, fleet) for group in _groups(decode)]
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


@dataclass(slots=True)
class _Fleet:
    """Per table row (FleetColumns) and, when pruning, what it compares (module docstring): the
    TTFT of each worker prefilling the whole prompt locally (a non-holder's)."""

    req: Request
    col: Columns
    queue: np.ndarray
    queued_work: np.ndarray
    chunk_work: np.ndarray
    busy_step: np.ndarray
    prune: bool
    inflow: Inflow | None = None  # per table row (price_candidates)
    local: np.ndarray | None = None
    _carried: np.ndarray | None = None  # per table row: the prefill a step starting now carries (next_step)

    def __post_init__(self) -> None:
        if self.prune:
            self.local = self.queue + chunked_seconds(self.col, self.req.num_prompt_tokens, 0)

    def token_seconds(self, step: np.ndarray, rows) -> np.ndarray:
        """Time per output token at `rows` of decode steps taking `step` alone, sharing them
        with the prefill arriving there (predictor.shared_step_seconds)."""
        if self.inflow is None:
            return step
        return shared_step_seconds(step, self.inflow.rates[rows], self.chunk_work[rows])

    def next_step(self, step: np.ndarray, rows) -> np.ndarray:
        """One step at `rows` starting at some moment, with the prefill arriving there on top of
        what is queued (predictor.next_step_with_prefill, inflow.Inflow.arriving)."""
        if self.inflow is None:
            return step
        if self._carried is None:  # once per request, for every row: each request asks for it several times
            self._carried = next_step_with_prefill(0.0, self.inflow.arriving(slice(None), self.queued_work), self.chunk_work)
        return step + self._carried[rows]

    def fetch(self, num_blocks: int, rates: Rates) -> np.ndarray:
        """TTFT of a worker holding none of the prompt that pulls num_blocks of it first."""
        col, cached = self.col, num_blocks * self.req.block_size
        move = rates.fetch_overhead_s + num_blocks * col.nbytes / rates.link_bytes_per_s
        return np.maximum(self.queue, move) + chunked_seconds(col, self.req.num_prompt_tokens - cached, cached)


def _can_win(pool: WorkerPool, held: Held, keys: Sequence[np.ndarray], limit: int) -> WorkerPool:
    """The holders of `pool` and, of the others, the `limit` least by each of `keys` (one value
    per table row) and those tied with them."""
    rows = pool.rows
    if limit <= 0 or len(rows) <= limit:
        return pool
    keep = held.matched[rows] > 0
    others = rows[~keep]
    if len(others) <= limit:
        return pool
    wins = np.zeros(len(others), bool)
    for key in keys:
        values = key[others]
        wins |= values <= _kth_least(values, limit)
    keep[~keep] = wins
    return WorkerPool(pool.table, rows[keep])


def _kth_least(values: np.ndarray, k: int) -> float:
    """The k-th least of `values` (1 <= k <= len). np.partition costs ~10 ns a value past a few
    hundred (97 us for 10,000 here); a bound first leaves it a few dozen: the least values of k
    disjoint slices are k values, so the k-th least is at most the largest of them."""
    if len(values) > 512:
        bound = values[: len(values) // k * k].reshape(k, -1).min(axis=1).max()
        if bound == bound:  # NaN where a slice holds one: partition all (it sorts NaN last)
            values = values[values <= bound]
    return np.partition(values, k - 1)[k - 1]


def _price_group(
    req: Request,
    decode: WorkerPool,
    held: Held,
    device: np.ndarray | None,
    sources: WorkerPool,
    prefill: WorkerPool,
    rates: Rates,
    offsets: tuple[float, float, float],
    limit: int,
    fleet: _Fleet,
) -> Priced:
    """price_candidates for candidates sharing one KV transport and block layout."""
    P, bs = req.num_prompt_tokens, req.block_size
    max_blocks = (P - 1) // bs
    table = decode.table
    first = table.views[int(decode.rows[0])]
    # The fetch sources of this group: same block layout, a kvplane transport both ends share.
    source = (-1, -1, 0, 0)
    if device is not None:
        nbytes = int(table.block_nbytes[int(decode.rows[0])])
        from_rows = sources.where(table.kv_mask(first, cached_blocks=True) & (table.block_nbytes == nbytes)).rows
        source = _best_two(from_rows, device[from_rows], table)

    part = None
    if req.allow_remote and len(prefill):
        part = _best_prefill(req, prefill.where(table.kv_mask(first)), held, rates, limit, fleet)
    if fleet.prune:
        # A non-holder's TTFT prefilling locally or after a fetch, and after the best remote
        # prefill; its batch's step orders its TPOT.
        alone = fleet.local if source[0] < 0 else np.minimum(fleet.local, fleet.fetch(source[2], rates))
        keys = [alone, fleet.col.per_step]
        if fleet.inflow is not None:
            keys.append(fleet.token_seconds(fleet.col.per_step, slice(None)))
        if part is not None:
            (i, _), *_, p_total = part
            best = np.full(len(table.views), p_total[0])
            best[i] = p_total[1]  # the best prefill worker decoding: the second best prefills
            tail_at, tail_step = _remote_start_and_tail(req, fleet.col, slice(None), fleet.queue, 0, best, fleet, rates)
            keys.append(tail_at + tail_step)
        decode = _can_win(decode, held, keys, limit)
    rows = decode.rows
    col = fleet.col.take(rows, held)
    own, load_s = _own_and_load(col, max_blocks, rates)
    queue_s = fleet.queue[rows]
    cached_tok = own * bs
    prefill_steps, work = chunked_parts(col, P - cached_tok, cached_tok)
    prefill_s = prefill_steps + work
    local = np.maximum(queue_s, load_s) + prefill_s
    computed = P - cached_tok
    fetch = None  # (gain, source row per candidate, move, prefill seconds, better) when a fetch can help
    if source[0] >= 0:
        is_first = rows == source[0]
        d = np.where(is_first, source[3], source[2])
        gain = np.maximum(d - own, 0)
        f_move = load_s + np.where(gain > 0, rates.fetch_overhead_s + gain * col.nbytes / rates.link_bytes_per_s, 0.0)
        f_cached = (own + gain) * bs
        f_steps, f_work = chunked_parts(col, P - f_cached, f_cached)
        f_prefill = f_steps + f_work
        f_ttft = np.maximum(queue_s, f_move) + f_prefill
        better = (gain > 0) & (f_ttft < local)
        if better.any():
            work = np.where(better, f_work, work)
            computed = np.where(better, P - f_cached, computed)
            local = np.where(better, f_ttft, local)
            fetch = (gain, np.where(is_first, source[1], source[0]), f_move, f_prefill, better)
    ttft = local + offsets[0] if req.allow_local else np.full(len(rows), _INF)
    remote = None  # (is_first, transfer, use) when a remote prefill is priced
    if part is not None:
        (i, j), p_queue, p_move, p_prefill, p_work, p_computed, p_total = part
        is_first = rows == i
        best = np.where(is_first, p_total[1], p_total[0])
        # `transfer` is all that comes after the prefill.
        tail_at, tail_step = _remote_start_and_tail(req, col, rows, queue_s, col.matched, best, fleet, rates)
        remote_ttft = tail_at + tail_step + offsets[1]
        use = remote_ttft < ttft
        if use.any():
            k = is_first.astype(np.int64)  # 1: the second best prefill worker
            ttft = np.where(use, remote_ttft, ttft)
            work = np.where(use, p_work[k], work)
            computed = np.where(use, p_computed[k], computed)
            finite = np.isfinite(best)  # no second prefill worker: best is infinite
            transfer = np.where(finite, tail_at - np.where(finite, best, 0.0), 0.0) + tail_step
            remote = (is_first, transfer, use)
    tpot = fleet.token_seconds(col.per_step + col.c3 + col.c4 * (P + req.max_tokens / 2), rows) + offsets[2]
    load_at = (lambda k: float(load_s[k])) if isinstance(load_s, np.ndarray) else (lambda k: float(load_s))  # noqa: E731

    def placed(k: int) -> Placed:
        """The k-th candidate's breakdown: its remote prefill, else its fetch, else local."""
        if remote is not None and remote[2][k]:
            second = int(remote[0][k])  # the best prefill worker decodes here: the second best prefills
            return Placed(
                REMOTE, float(p_queue[second]), float(p_move[second]), float(p_prefill[second]), float(remote[1][k]), 0, -1, j if second else i
            )  # fmt: skip
        kind, move, prefill_k, fetch_blocks, source_row = LOCAL, load_at(k), float(prefill_s[k]), 0, -1
        if fetch is not None and fetch[4][k]:
            kind, move, prefill_k = FETCH, float(fetch[2][k]), float(fetch[3][k])
            fetch_blocks, source_row = int(fetch[0][k]), int(fetch[1][k])
        if not req.allow_local:
            kind = REMOTE  # no local placement: priced at infinite TTFT, its remote prefill not possible
        return Placed(kind, float(queue_s[k]), move, prefill_k, 0.0, fetch_blocks, source_row, -1)

    return Priced(decode, ttft, tpot, cached_tok, np.zeros(len(rows)) + work, computed, placed)


def _remote_start_and_tail(req: Request, col: Columns, rows, queue_s, matched, best, fleet: _Fleet, rates: Rates):
    """(when the prompt's tail step starts, that step's seconds) on decode workers `rows` (col's
    positions; queue_s and matched per position) of a prompt prefilled elsewhere by
    `best` seconds: the full blocks the decode worker lacks move, while its queue drains, then its
    step computing the tail. The step in flight when the KV is in (on a busy worker) and the
    tail's step may carry a chunk of the prefill arriving there (next_step)."""
    P, bs = req.num_prompt_tokens, req.block_size
    tail = P - (P - 1) // bs * bs
    kv_in = best + np.maximum(P // bs - matched, 0) * col.nbytes / rates.link_bytes_per_s
    in_flight = fleet.next_step(fleet.busy_step[rows], rows) / 2
    tail_step = fleet.next_step(chunked_seconds(col, tail, P - tail), rows)
    return np.maximum(kv_in + in_flight, queue_s), tail_step


def _best_two(rows: np.ndarray, device: np.ndarray, table: WorkerTable) -> tuple[int, int, int, int]:
    """(best row, second best row, their device blocks): the rows holding the most leading
    device blocks of the prompt, then the lower worker id (-1 and 0: none)."""
    some = np.flatnonzero(device)  # the holders: usually a few of the fleet
    if not len(some):
        return (-1, -1, 0, 0)
    rows, device = rows[some], device[some]
    order = np.lexsort((table.id_rank[rows], -device))
    i = int(order[0])
    j = int(order[1]) if len(order) > 1 and device[order[1]] > 0 else -1
    return (int(rows[i]), int(rows[j]) if j >= 0 else -1, int(device[i]), int(device[j]) if j >= 0 else 0)


def _best_prefill(req: Request, prefill: WorkerPool, held: Held, rates: Rates, limit: int, fleet: _Fleet):
    """((best row, second best row), and per one of the two: queue, load, prefill, its compute
    (the work it adds), the tokens it prefills, total seconds) of the remote prefill workers
    (second: -1 and infinite seconds when there is one); None when there is none."""
    P, bs = req.num_prompt_tokens, req.block_size
    # A worker holding none of the prompt costs its queue + the whole prefill, its local TTFT,
    # exactly: of those, only the two least (and their ties) can be the best two.
    if fleet.prune:
        prefill = _can_win(prefill, held, (fleet.local,), 2)
    if not len(prefill):
        return None
    table = prefill.table
    col = fleet.col.take(prefill.rows, held)
    own, load = _own_and_load(col, (P - 1) // bs, rates)
    queue = fleet.queue[prefill.rows]
    steps, work = chunked_parts(col, P - own * bs, own * bs)
    compute = steps + work
    total = np.maximum(queue, load) + compute
    load = np.zeros(len(prefill)) + load
    # Least seconds first; a dedicated prefill worker (cannot decode) before a mixed one; then id.
    order = np.lexsort((table.id_rank[prefill.rows], table.can_decode[prefill.rows], total))[:2]
    pad = lambda a, none: np.append(a[order], none) if len(order) < 2 else a[order]  # noqa: E731
    rows = pad(prefill.rows, -1)
    computed = P - own * bs
    return (
        (int(rows[0]), int(rows[1])), pad(queue, 0.0), pad(load, 0.0), pad(compute, 0.0), pad(work, 0.0), pad(computed, P),
        pad(total, _INF),
    )  # fmt: skip


def choose(priced: Priced, ttft_target_s: float | None, tpot_target_s: float | None, tie_rank: np.ndarray) -> np.ndarray:
    """The candidates in the order of the module docstring's choice (indices): those meeting the
    objectives by TTFT + the prefill seconds they spend, then the others by their TTFT (how far
    it misses); ties by the fewer prompt tokens prefilled (a model fitted where prefill did not
    vary prices a prefix's compute at 0, and the cache is then the only evidence left), then
    TPOT, then `tie_rank` (the router's draw among equals)."""
    ttft, tpot, computed = priced.ttft, priced.tpot, priced.computed
    spent = ttft + priced.work
    if ttft_target_s is None or tpot_target_s is None:
        return np.lexsort((tie_rank, tpot, computed, ttft, spent))
    meets = (ttft <= ttft_target_s) & (tpot <= tpot_target_s)
    key = np.where(meets, spent, _INF)
    return np.lexsort((tie_rank, tpot, computed, np.where(meets, 0.0, ttft), key, ~meets))
