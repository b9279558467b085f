"""The fleet as columns: what routing filters and ranks workers by, one numpy row per worker.

Routing a request looks at every worker (which serve the model, which are active, which hold
the least load, what each would take to answer), and a Python loop over a thousand
worker objects costs tens of microseconds per pass; a planner made a dozen such passes per
request. A `WorkerTable` holds the same numbers as arrays, built once per ClusterView
(`table_of`) and updated row by row where something changed (`with_loads` for the planner's load
corrections, `replaced` for new reports: `cluster_with`), so a pass is a few array operations;
masks of the columns that change only with the worker (model, role, activity, transports) are
made once and shared by the tables made from one another.

A `WorkerPool` is a table and the rows in play (sorted, so a pool lists its workers in the
table's order, as the lists it replaces did). It is a Sequence of WorkerViews: a policy that
needs every worker's object may simply iterate it; the hot paths use its columns.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence

import numpy as np

from kvplane.controlplane.core.views import ClusterView, WorkerView, kv_can_move
from kvplane.types import WorkerId

# Columns a load report or a load correction changes; the rest change only with the worker.
_LOAD_COLUMNS = ("queued", "used", "total", "requests", "pending", "running", "waiting", "context")
# The step-time model a worker publishes (kvplane.latency: c0..c4 and its kink per row, NaN: no model) and its
# prefill chunk: what routing predicts seconds with. They change with a report (an online refit),
# so they are replaced with the load columns.
_MODEL_COLUMNS = ("step", "chunk")
_NO_MODEL = (float("nan"),) * 6


def _fixed(w: WorkerView) -> tuple:
    """What a worker's columns hold besides its load and report time."""
    return w.model, w.transports, w.block_size, w.max_context, w.active, w.role, w.block_nbytes


def _load_row(w: WorkerView) -> tuple[int, ...]:
    load = w.load
    return (
        load.num_queued_prefill_tokens,
        load.num_used_blocks,
        load.num_total_blocks,
        load.num_running + load.num_waiting,
        w.pending_blocks,
        load.num_running,
        load.num_waiting,
        load.running_context_tokens,
    )


def _model_of(w: WorkerView) -> tuple:
    """What the model columns are made of (_step_row, chunk)."""
    return w.latency, w.chunk_tokens


def _step_row(w: WorkerView) -> tuple[float, ...]:
    return (*w.latency.coefficients, w.latency.free_prefill_tokens) if w.latency is not None else _NO_MODEL


class WorkerTable:
    """Columns of a fixed sequence of worker views; row i is views[i]. Read-only once built."""

    __slots__ = (
        "views", "worker_ids", "id_array", "row_of", "id_rank", "models", "transports",
        "model_code", "transport_code", "block_size", "block_nbytes", "max_context", "active", "can_decode", "can_prefill", "reported_at",
        "queued", "used", "total", "requests", "pending", "running", "waiting", "context", "step", "chunk", "_memo", "_parent", "changed_rows",
        "version", "_private", "__weakref__",
    )  # fmt: skip

    def __init__(self, views: Sequence[WorkerView]) -> None:
        self.views: tuple[WorkerView, ...] = tuple(views)
        # The table `replaced` made this one from, and the rows it replaced there (none: built anew).
        self._parent: weakref.ref[WorkerTable] | None = None
        self.changed_rows: frozenset[int] = frozenset()
        # Updates made in place (`updated`, on a `private` copy only): changed_rows names the last one's rows.
        self.version = 0
        self._private = False
        # What depends on the fixed columns only (fixed()), shared by every table made from this
        # one that keeps those columns (new reports, load corrections).
        self._memo: dict[tuple, object] = {}
        self.worker_ids: list[WorkerId] = [w.worker_id for w in self.views]
        self.id_array = np.array(self.worker_ids, dtype=object)  # to pick many ids at C speed
        self.row_of: dict[WorkerId, int] = {w: i for i, w in enumerate(self.worker_ids)}
        # Each row's place in worker-id order: ties in cost are broken by worker id.
        self.id_rank = np.empty(len(self.views), np.int64)
        self.id_rank[sorted(range(len(self.views)), key=self.worker_ids.__getitem__)] = np.arange(len(self.views))
        n = len(self.views)
        models: dict[str, int] = {}
        transports: dict[tuple[str, ...] | None, int] = {}
        rows = [
            (
                models.setdefault(w.model, len(models)),
                transports.setdefault(w.transports, len(transports)),
                w.block_size, w.max_context, w.active, w.role.can_decode, w.role.can_prefill, w.block_nbytes,
            )
            for w in self.views
        ]  # fmt: skip
        self.models = list(models)
        self.transports = list(transports)
        static = np.array(rows, np.int64).reshape(n, 8)
        self.model_code = static[:, 0].astype(np.int32)
        self.transport_code = static[:, 1].astype(np.int32)
        self.block_size = np.ascontiguousarray(static[:, 2])
        self.max_context = np.ascontiguousarray(static[:, 3])
        self.active = static[:, 4].astype(bool)
        self.can_decode = static[:, 5].astype(bool)
        self.can_prefill = static[:, 6].astype(bool)
        self.block_nbytes = np.ascontiguousarray(static[:, 7])
        self.reported_at = np.array([np.nan if w.reported_at is None else w.reported_at for w in self.views], np.float64)
        loads = np.array([_load_row(w) for w in self.views], np.int64).reshape(n, len(_LOAD_COLUMNS))
        for j, name in enumerate(_LOAD_COLUMNS):
            setattr(self, name, np.ascontiguousarray(loads[:, j]))
        self.step = np.array([_step_row(w) for w in self.views], np.float64).reshape(n, 6)
        self.chunk = np.array([max(w.chunk_tokens, 1) for w in self.views], np.int64)

    def _code(self, table: list, value) -> int:
        try:
            return table.index(value)
        except ValueError:
            table.append(value)
            return len(table) - 1

    def _set_worker(self, i: int, w: WorkerView) -> None:
        self.model_code[i] = self._code(self.models, w.model)
        self.transport_code[i] = self._code(self.transports, w.transports)
        self.block_size[i] = w.block_size
        self.max_context[i] = w.max_context
        self.active[i] = w.active
        self.can_decode[i] = w.role.can_decode
        self.can_prefill[i] = w.role.can_prefill
        self.block_nbytes[i] = w.block_nbytes
        self.reported_at[i] = np.nan if w.reported_at is None else w.reported_at

    def _copy(self, columns: Collection[str]) -> WorkerTable:
        """A shallow copy whose `columns` are copies (the others shared: they are not written)."""
        t = object.__new__(WorkerTable)
        for name, value in zip(_DATA_SLOTS, _data_of(self)):
            setattr(t, name, value)
        for name in columns:
            setattr(t, name, getattr(self, name).copy())
        t._parent, t.changed_rows, t.version, t._private = None, frozenset(), 0, False
        return t

    @property
    def parent(self) -> WorkerTable | None:
        """The table this one was made from by `replaced` (if it is still alive): it differs from
        this one in `changed_rows` only."""
        return self._parent() if self._parent is not None else None

    def with_loads(self, rows: Mapping[int, WorkerView]) -> WorkerTable:
        """This table with rows replaced by views of the same workers that differ only in load
        (and pending blocks): the planner's corrections for what this replica routed."""
        if not rows:
            return self
        # The step-time model and chunk columns (7 numbers a row) are copied only when some row's
        # model or chunk changes: a report rarely brings a new one, and at 10,000 workers they
        # are 560 KB.
        old = self.views
        new_models = any(_model_of(w) != _model_of(old[i]) for i, w in rows.items())
        t = self._copy(_LOAD_COLUMNS + _MODEL_COLUMNS if new_models else _LOAD_COLUMNS)
        views = list(old)
        for i, w in rows.items():
            views[i] = w
            if new_models:
                t.step[i] = _step_row(w)
                t.chunk[i] = max(w.chunk_tokens, 1)
        t.views = tuple(views)
        if len(rows) <= _FEW_ROWS:  # item by item: cheaper than building index arrays for a few
            columns = _load_columns_of(t)
            for i, w in rows.items():
                for column, value in zip(columns, _load_row(w)):
                    column[i] = value
            return t
        index = np.fromiter(rows, np.int64, len(rows))
        loads = np.array([_load_row(w) for w in rows.values()], np.int64).reshape(len(rows), len(_LOAD_COLUMNS))
        for j, name in enumerate(_LOAD_COLUMNS):
            getattr(t, name)[index] = loads[:, j]
        return t

    def replaced(self, rows: Mapping[int, WorkerView]) -> WorkerTable:
        """This table with rows replaced by new views of the same workers (a new report, a drain)."""
        if not rows:
            return self
        t = self.with_loads(rows)
        if any(_fixed(self.views[i]) != _fixed(w) for i, w in rows.items()):
            t = t._copy(_FIXED_COLUMNS + ("reported_at",))
            t.models, t.transports, t._memo = list(self.models), list(self.transports), {}
            for i, w in rows.items():
                t._set_worker(i, w)
        else:  # the common case, new reports: of the rest only their time changed
            t.reported_at = self.reported_at.copy()
            for i, w in rows.items():
                t.reported_at[i] = np.nan if w.reported_at is None else w.reported_at
        t._parent, t.changed_rows = weakref.ref(self), frozenset(rows)
        return t

    def private(self) -> WorkerTable:
        """A copy that `updated` may write into: every column a load changes is its own (the
        fixed ones stay shared). For a table one owner alone reads from one update to the next
        (the planner's corrected view), so that a request does not copy the fleet's columns."""
        t = self._copy(_LOAD_COLUMNS + _MODEL_COLUMNS + ("reported_at",))
        t.views, t._private = list(self.views), True
        return t

    def updated(self, rows: Mapping[int, WorkerView]) -> WorkerTable:
        """`replaced`, in place where it can be: on a `private` table, rows whose views change
        only in load (and report time) are written into it, which then names them in
        `changed_rows` and counts one more `version`; anything else (a row whose fixed columns
        change, a shared table) gives a new table, as `replaced` does (private when this one is)."""
        if not rows:
            return self
        views = self.views
        if not self._private:
            return self.replaced(rows)
        if any(_fixed(views[i]) != _fixed(w) for i, w in rows.items()):  # rare: a drain, a new role
            return self.replaced(rows).private()
        columns = _load_columns_of(self)
        for i, w in rows.items():
            views[i] = w
            self.step[i] = _step_row(w)
            self.chunk[i] = max(w.chunk_tokens, 1)
            self.reported_at[i] = np.nan if w.reported_at is None else w.reported_at
            for column, value in zip(columns, _load_row(w)):
                column[i] = value
        self.changed_rows = frozenset(rows)
        self.version += 1
        return self

    def pool(self, excluded: Collection[WorkerId] = ()) -> WorkerPool:
        """Every row but the `excluded` workers'."""
        rows = np.arange(len(self.views), dtype=np.int64)
        if excluded:
            out = [self.row_of[w] for w in excluded if w in self.row_of]
            rows = np.delete(rows, out)
        return WorkerPool(self, rows)

    def kv_mask(self, other: WorkerView, *, cached_blocks: bool = False) -> np.ndarray:
        """Per row, whether KV can move between that worker and `other` (views.kv_can_move)."""

        def make() -> np.ndarray:
            can = np.array([kv_can_move(t, other.transports, cached_blocks=cached_blocks) for t in self.transports], bool)
            return can[self.transport_code]

        return self.fixed(("kv", other.transports, cached_blocks), make)

    def fixed(self, key: tuple, make: Callable[[], object]):
        """`make()`, once per set of fixed columns: for what depends on model, role, activity,
        context or transports only (never on loads or report times)."""
        value = self._memo.get(key)
        if value is None:
            value = self._memo[key] = make()
        return value

    def serving(self, model: str, role: str = "any") -> np.ndarray:
        """Per row, whether the worker serves `model` and, for role "decode" / "prefill" /
        "active", is active and can decode / prefill / do either."""

        def make() -> np.ndarray:
            mask = self.model_code == self.models.index(model) if model in self.models else np.zeros(len(self.views), bool)
            if role != "any":
                mask = mask & self.active
            if role == "decode":
                mask = mask & self.can_decode
            elif role == "prefill":
                mask = mask & self.can_prefill
            return mask

        return self.fixed(("serving", model, role), make)


_FIXED_COLUMNS = ("model_code", "transport_code", "block_size", "block_nbytes", "max_context", "active", "can_decode", "can_prefill")
_DATA_SLOTS = tuple(n for n in WorkerTable.__slots__ if n not in ("_parent", "changed_rows", "version", "_private", "__weakref__"))
_data_of = operator.attrgetter(*_DATA_SLOTS)  # every data slot in one call
_load_columns_of = operator.attrgetter(*_LOAD_COLUMNS)
_FEW_ROWS = 16


class WorkerPool(Sequence[WorkerView]):
    """Some rows of a WorkerTable, in table order: the workers a routing step chooses among."""

    __slots__ = ("table", "rows")

    def __init__(self, table: WorkerTable, rows: np.ndarray) -> None:
        self.table = table
        self.rows = rows

    @staticmethod
    def of(workers: Sequence[WorkerView]) -> WorkerPool:
        """`workers` as a pool (itself when it is one already)."""
        if isinstance(workers, WorkerPool):
            return workers
        return WorkerTable(workers).pool()

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):  # an int or a slice, as a list's
        if isinstance(i, slice):
            return [self.table.views[r] for r in self.rows[i].tolist()]
        return self.table.views[int(self.rows[i])]

    def __iter__(self) -> Iterator[WorkerView]:
        # Row by row from the array's memory: a caller that stops at the first (admission)
        # does not pay for listing a thousand rows.
        return map(self.table.views.__getitem__, memoryview(np.ascontiguousarray(self.rows, np.int64)))

    def column(self, name: str) -> np.ndarray:
        """One column (a WorkerTable attribute) for this pool's rows."""
        return getattr(self.table, name)[self.rows]

    def where(self, mask: np.ndarray) -> WorkerPool:
        """The rows of this pool where `mask` (one bool per TABLE row) holds."""
        return WorkerPool(self.table, self.rows[mask[self.rows]])

    def where_own(self, mask: np.ndarray) -> WorkerPool:
        """The rows of this pool where `mask` (one bool per POOL row) holds."""
        return WorkerPool(self.table, self.rows[mask])

    def get(self, worker_id: WorkerId) -> WorkerView | None:
        """The worker's view if it is in this pool."""
        row = self.table.row_of.get(worker_id)
        if row is None or not self._has(row):
            return None
        return self.table.views[row]

    def _has(self, row: int) -> bool:
        i = int(np.searchsorted(self.rows, row))
        return i < len(self.rows) and int(self.rows[i]) == row

    def split(self, worker_ids: Collection[WorkerId]) -> tuple[WorkerPool, WorkerPool]:
        """(this pool's workers among `worker_ids`; the others)."""
        row_of = self.table.row_of
        rows = list(map(row_of.get, worker_ids))
        if None in rows:  # workers of another view (the index outlives a departed worker's row)
            rows = [r for r in rows if r is not None]
        if not rows:
            return WorkerPool(self.table, self.rows[:0]), self
        named = np.zeros(len(self.table.views), bool)
        named[rows] = True
        mine = named[self.rows]
        return WorkerPool(self.table, self.rows[mine]), WorkerPool(self.table, self.rows[~mine])

    def distinct_values(self, mapping: Mapping[WorkerId, object]) -> tuple[np.ndarray, list]:
        """(codes, values): mapping.get(worker) of each row is values[codes[row]], one entry per
        distinct object (by identity): a hot prefix's thousand holders share one overlap score,
        so what is computed per score is computed once."""
        found = list(map(mapping.get, self.worker_ids))
        if len(found) <= 64:  # a dictionary in Python beats np.unique's fixed cost
            distinct: dict[int, tuple[int, object]] = {}
            codes = np.fromiter((distinct.setdefault(id(v), (len(distinct), v))[0] for v in found), np.int64, len(found))
            return codes, [v for _, v in distinct.values()]
        _, first, codes = np.unique(np.fromiter(map(id, found), np.int64, len(found)), return_index=True, return_inverse=True)
        return codes.reshape(-1), [found[i] for i in first.tolist()]

    def union(self, other: WorkerPool) -> WorkerPool:
        """The workers of both pools (of one table), in table order."""
        if not len(other):
            return self
        if not len(self):
            return other
        both = np.zeros(len(self.table.views), bool)
        both[self.rows] = True
        both[other.rows] = True
        return WorkerPool(self.table, np.flatnonzero(both))

    @property
    def worker_ids(self) -> list[WorkerId]:
        return self.table.id_array[self.rows].tolist()

    def without(self, worker_id: WorkerId) -> WorkerPool:
        row = self.table.row_of.get(worker_id)
        if row is None or not self._has(row):
            return self
        return WorkerPool(self.table, self.rows[self.rows != row])


def table_of(cluster: ClusterView) -> WorkerTable:
    """The cluster's workers as a table: the one its builder kept, else built now and kept."""
    table = cluster.table
    if not isinstance(table, WorkerTable):
        table = WorkerTable(cluster.workers)
        object.__setattr__(cluster, "table", table)  # a cache of `workers`, which are frozen
    return table


def cluster_with(cluster: ClusterView, changed: Mapping[WorkerId, WorkerView], store_ok_at: float | None) -> ClusterView:
    """`cluster` with new views of some of its workers (new reports, a drain): only their rows
    change. A worker it does not have is a KeyError (a join rebuilds the view from scratch)."""
    table = table_of(cluster)
    rows = {table.row_of[w]: view for w, view in changed.items()}
    table = table.replaced({row: view for row, view in rows.items() if view is not table.views[row]})
    return ClusterView(table.views, cluster.index, store_ok_at, table=table, stated_link_bytes_per_s=cluster.stated_link_bytes_per_s)
