"""Every routing candidate priced in predicted seconds, as columns (the kvplane policy's rule).

For a prompt of P tokens (block size bs, B = (P - 1) // bs blocks at most count as cached: the
engine computes the last token) and each decode candidate w, from its step-time model c0..c4
(kvplane.latency; a worker that publishes none gets `fallback`: c1 = 1 / its prefill rate) and
its corrected load (queued prefill tokens Q, running R, waiting W, running context X):

  batch(w)    = R + W sequences holding X + Q tokens: the decode batch w will have once what is
                admitted there runs (every prefill step of w carries it);
  steps(N, K) = the engine steps prefilling N tokens after K cached, chunk by chunk, with that
                batch riding along (StepTimeModel.chunked_prefill_seconds, in closed form);
  queue       = steps(Q, 0): the prefill queued ahead (FIFO: the request waits for all of it);
  own         = min(blocks w holds or is predicted to hold, B); those on a slower tier load at
                `host_bytes_per_s` / `disk_bytes_per_s` (load);
  local TTFT  = max(queue, load) + steps(P - own x bs, own x bs);
  fetch       = the most device blocks D any other worker really holds (KV can move, same block
                layout): pulling D - own blocks over the link (+ `fetch_overhead_s`) while the
                queue drains, then steps(P - D x bs, D x bs), when that predicts less than local;
  remote TTFT = part(p) + KV transfer of the full blocks w lacks / link rate + w's step computing
                the prompt's tail, where part(p) = queue + load + prefill on prefill worker p, the
                p with the least part (a dedicated prefill worker first at equal seconds);
  TTFT(w)     = the least of the placements the request's disagg mode allows (+ the planner's
                calibration offset of that kind); TPOT(w) = one decode step of batch(w) + this
                request: c0 + c3 x (R + W + 1) + c4 x (X + Q + P + max_tokens / 2) (+ offset).

Choice (Mooncake's conductor, against the objectives): of the candidates whose predicted TTFT and
TPOT meet the request's objectives, the least TTFT; when none does, the least
max(TTFT / objective, TPOT / objective), the one that misses by the least. Ties (equal seconds:
idle workers that hold nothing) go to the lower TPOT, then to the router's seeded draw. A cache
hit therefore wins exactly while the prefill it saves outweighs the queue it waits behind; a hot
prefix's holder keeps its readers until its queue costs more than the prefix, then the next
reader goes where the prefix arrives soonest, usually by a fetch from the holder: the prefix is
replicated onto a second holder (which then draws readers itself), not recomputed on a scatter
of workers. Whether prefill runs remotely is the same comparison, pair by pair, not a token
threshold. Every number is kept per candidate (`SecondsBreakdown`) for `kvplane route --explain`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from kvplane.controlplane.core.index import OverlapScore
from kvplane.controlplane.core.pool import WorkerPool
from kvplane.types import Tier, WorkerId

LOCAL, FETCH, REMOTE = 0, 1, 2
_INF = float("inf")
_NO_SOURCE = (None, None, -1, 0, 0, 0)


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

    placement: str  # "local", "fetch from W", "remote prefill on W"
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
class Columns:
    """The per-worker numbers of a pool that predictions read."""

    c: np.ndarray  # (n, 5) step-time coefficients
    chunk: np.ndarray
    queued: np.ndarray
    seqs: np.ndarray  # the batch the worker will have
    context: np.ndarray
    nbytes: np.ndarray

    @staticmethod
    def of(pool: WorkerPool, rates: Rates) -> Columns:
        t, rows = pool.table, pool.rows
        c = t.step[rows]
        missing = np.isnan(c[:, 0])
        if missing.any():
            c = c.copy()
            c[missing] = (0.0, 1.0 / rates.fallback_prefill_tokens_per_s, 0.0, 0.0, 0.0)
        decodes = t.can_decode[rows]
        queued, running, waiting = t.queued[rows], t.running[rows], t.waiting[rows]
        seqs = running + np.where(decodes, waiting, 0)
        context = t.context[rows] + np.where(decodes, queued, 0)
        return Columns(c, t.chunk[rows], queued, seqs, context, t.block_nbytes[rows])


def chunked_seconds(col: Columns, num_tokens: np.ndarray, num_cached: np.ndarray) -> np.ndarray:
    """Per worker, StepTimeModel.chunked_prefill_seconds(num_tokens, num_cached, chunk, batch)."""
    n = np.maximum(num_tokens, 0).astype(np.int64)
    chunk = col.chunk
    steps = -(-n // chunk)
    last = n - np.maximum(steps - 1, 0) * chunk
    num_odd = np.maximum(steps - 1, 0) * (chunk % 2) + last % 2
    attention = (2 * n * num_cached + n * n - np.where(n > 0, num_odd, 0)) // 2
    c = col.c
    per_step = c[:, 0] + c[:, 3] * col.seqs + c[:, 4] * col.context
    return steps * per_step + c[:, 1] * n + c[:, 2] * attention


def _tier_columns(pool: WorkerPool, overlaps: Mapping[WorkerId, OverlapScore]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per worker: leading blocks matched, of those on host, on disk (0 without a score)."""
    codes, per = pool.distinct_values(overlaps)
    table = np.array(
        [(s.num_blocks, s.blocks_by_tier.get(Tier.HOST, 0), s.blocks_by_tier.get(Tier.DISK, 0)) if s else (0, 0, 0) for s in per],
        np.int64,
    ).reshape(len(per), 3)[codes]
    return table[:, 0], table[:, 1], table[:, 2]


def _own_and_load(
    pool: WorkerPool, col: Columns, overlaps: Mapping[WorkerId, OverlapScore], max_blocks: int, rates: Rates
) -> tuple[np.ndarray, np.ndarray]:
    """(blocks counted as cached, seconds loading those held on a slower tier): the matched
    prefix's device blocks first, then host, then disk."""
    matched, host, disk = _tier_columns(pool, overlaps)
    own = np.minimum(matched, max_blocks)
    slow = np.maximum(own - (matched - host - disk), 0)
    from_host = np.minimum(host, slow)
    from_disk = slow - from_host
    load_s = col.nbytes * (from_host / rates.host_bytes_per_s + from_disk / rates.disk_bytes_per_s)
    return own, load_s


@dataclass(slots=True)
class Priced:
    """The candidates' predictions, row for row with the decode pool."""

    ttft: np.ndarray
    tpot: np.ndarray
    placement: np.ndarray  # LOCAL, FETCH or REMOTE
    cached_tokens: np.ndarray  # on the decode worker (its own blocks)
    queue: np.ndarray
    move: np.ndarray
    prefill: np.ndarray
    transfer: np.ndarray
    fetch_blocks: np.ndarray  # FETCH: blocks pulled
    fetch_source: WorkerId | None
    fetch_source_second: WorkerId | None  # the source for the first source itself
    fetch_first_row: int  # table row of fetch_source (-1: none)
    prefill_worker: WorkerId | None
    prefill_second: WorkerId | None
    prefill_row: int


def price_candidates(
    req: Request,
    decode: WorkerPool,
    overlaps: Mapping[WorkerId, OverlapScore],
    cached: Mapping[WorkerId, OverlapScore],
    sources: WorkerPool,
    prefill: WorkerPool,
    rates: Rates,
    offsets: tuple[float, float, float] = (0.0, 0.0, 0.0),
    fetch_mask: np.ndarray | None = None,
) -> Priced:
    """The module docstring's predictions for every worker of `decode`. `overlaps`: the prompt's
    prefix per worker as the policy sees it (predictions included); `cached`: what the index
    really holds (what a fetch can pull); `sources`: workers a fetch may pull from; `prefill`:
    remote prefill candidates; offsets: the calibration (TTFT local, TTFT remote, TPOT);
    fetch_mask: the candidates that may pull from `sources` (None: all)."""
    P, bs = req.num_prompt_tokens, req.block_size
    max_blocks = (P - 1) // bs
    n = len(decode)
    col = Columns.of(decode, rates)
    own, load_s = _own_and_load(decode, col, overlaps, max_blocks, rates)
    zeros = np.zeros(n, np.int64)
    queue_s = chunked_seconds(col, col.queued, zeros)
    move_s = load_s
    cached_tok = own * bs
    prefill_s = chunked_seconds(col, P - cached_tok, cached_tok)
    local = np.maximum(queue_s, move_s) + prefill_s
    placement = np.full(n, LOCAL, np.int64)
    fetch_blocks = np.zeros(n, np.int64)
    source = _NO_SOURCE
    if req.allow_remote and len(sources) and cached:
        source = _best_sources(sources, cached, max_blocks)
    if source[0] is not None:
        first_row, d1, d2, source_nbytes = source[2], source[3], source[4], source[5]
        d = np.where(decode.rows == first_row, d2, d1)
        # Only a worker with the same block layout can take the blocks.
        can = col.nbytes == source_nbytes
        if fetch_mask is not None:
            can &= fetch_mask
        gain = np.where(can, np.maximum(d - own, 0), 0)
        f_move = load_s + np.where(gain > 0, rates.fetch_overhead_s + gain * col.nbytes / rates.link_bytes_per_s, 0.0)
        f_cached = (own + gain) * bs
        f_prefill = chunked_seconds(col, P - f_cached, f_cached)
        f_ttft = np.maximum(queue_s, f_move) + f_prefill
        better = (gain > 0) & (f_ttft < local)
        placement[better] = FETCH
        fetch_blocks = np.where(better, gain, 0)
        move_s = np.where(better, f_move, move_s)
        prefill_s = np.where(better, f_prefill, prefill_s)
        local = np.where(better, f_ttft, local)
    local = local + offsets[0] if req.allow_local else np.full(n, _INF)
    if not req.allow_local:
        placement[:] = REMOTE
    ttft, transfer_s = local, np.zeros(n)
    remote_part = (None, None, -1)
    if req.allow_remote and len(prefill):
        remote, transfer, remote_part = _remote(req, decode, col, overlaps, prefill, rates, max_blocks)
        remote = remote + offsets[1]
        use = remote < ttft
        if use.any():
            placement[use] = REMOTE
            ttft = np.where(use, remote, ttft)
            transfer_s = np.where(use, transfer, 0.0)
            queue_s = np.where(use, remote_part[3], queue_s)
            move_s = np.where(use, remote_part[4], move_s)
            prefill_s = np.where(use, remote_part[5], prefill_s)
            fetch_blocks = np.where(use, 0, fetch_blocks)
        remote_part = remote_part[:3]
    c = col.c
    tpot = c[:, 0] + c[:, 3] * (col.seqs + 1) + c[:, 4] * (col.context + P + req.max_tokens / 2) + offsets[2]
    return Priced(
        ttft, tpot, placement, cached_tok, queue_s, move_s, prefill_s, transfer_s, fetch_blocks,
        source[0], source[1], source[2], remote_part[0], remote_part[1], remote_part[2],
    )  # fmt: skip


def _best_sources(sources: WorkerPool, cached: Mapping[WorkerId, OverlapScore], max_blocks: int):
    """(best holder, second best, best's table row, its device blocks, the second's, its block
    bytes): the workers of `sources` really holding the most leading device blocks of the prompt."""
    holders, _ = sources.split(cached)
    if not len(holders):
        return _NO_SOURCE
    codes, per = holders.distinct_values(cached)
    device = np.minimum(np.array([s.blocks_by_tier.get(Tier.DEVICE, 0) for s in per], np.int64)[codes], max_blocks)
    nbytes = holders.column("block_nbytes")
    order = np.lexsort((holders.table.id_rank[holders.rows], -device))
    i = int(order[0])
    if device[i] <= 0:
        return _NO_SOURCE
    same = order[1:][nbytes[order[1:]] == nbytes[i]]
    j = int(same[0]) if len(same) else -1
    ids = holders.table.worker_ids
    second = ids[int(holders.rows[j])] if j >= 0 and device[j] > 0 else None
    return (ids[int(holders.rows[i])], second, int(holders.rows[i]), int(device[i]), int(device[j]) if second else 0, int(nbytes[i]))


def _remote(req: Request, decode: WorkerPool, col: Columns, overlaps, prefill: WorkerPool, rates: Rates, max_blocks: int):
    """(remote TTFT per decode candidate, its transfer + tail seconds, the prefill worker's parts)."""
    P, bs = req.num_prompt_tokens, req.block_size
    pcol = Columns.of(prefill, rates)
    p_own, p_load = _own_and_load(prefill, pcol, overlaps, max_blocks, rates)
    p_queue = chunked_seconds(pcol, pcol.queued, np.zeros(len(prefill), np.int64))
    p_prefill = chunked_seconds(pcol, P - p_own * bs, p_own * bs)
    part = np.maximum(p_queue, p_load) + p_prefill
    t = prefill.table
    # Least seconds first; a dedicated prefill worker (cannot decode) before a mixed one; then id.
    order = np.lexsort((t.id_rank[prefill.rows], t.can_decode[prefill.rows], part))
    i = int(order[0])
    j = int(order[1]) if len(order) > 1 else -1
    first_row = int(prefill.rows[i])
    is_first = decode.rows == first_row
    best = np.where(is_first, part[j] if j >= 0 else _INF, part[i])
    matched, _, _ = _tier_columns(decode, overlaps)
    full = P // bs
    num_blocks = np.maximum(full - matched, 0)
    transfer = num_blocks * col.nbytes / rates.link_bytes_per_s
    tail = P - max_blocks * bs
    transfer = transfer + chunked_seconds(col, np.full(len(decode), tail, np.int64), np.full(len(decode), P - tail, np.int64))
    # KV must be able to move between the pair.
    movable = t.kv_mask(t.views[first_row])[decode.rows]
    remote = np.where(movable, best + transfer, _INF)
    pick = lambda k, a: np.where(is_first, a[j] if j >= 0 else 0.0, a[k])  # noqa: E731
    parts = (
        t.worker_ids[first_row],
        t.worker_ids[int(prefill.rows[j])] if j >= 0 else None,
        first_row,
        pick(i, p_queue),
        pick(i, p_load),
        pick(i, p_prefill),
    )
    return remote, transfer, parts


def choose(priced: Priced, ttft_target_s: float | None, tpot_target_s: float | None, tie_rank: np.ndarray) -> np.ndarray:
    """The candidates in the order of the module docstring's choice (indices): those meeting the
    objectives by TTFT, then the others by how far they miss; ties by TPOT, then `tie_rank`
    (the router's draw among equals)."""
    ttft, tpot = priced.ttft, priced.tpot
    if ttft_target_s is None or tpot_target_s is None:
        return np.lexsort((tie_rank, tpot, ttft))
    over = np.maximum(ttft / ttft_target_s, tpot / tpot_target_s)
    meets = over <= 1.0
    key = np.where(meets, ttft, _INF)
    return np.lexsort((tie_rank, tpot, np.where(meets, 0.0, over), key, ~meets))
