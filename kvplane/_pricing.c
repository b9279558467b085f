/* kvplane._pricing: the routing's prices in predicted seconds, for many workers at once.

   The model, its terms and the choice are documented in controlplane/core/seconds.py, which
   gathers the inputs (one row per worker of the fleet's table) and calls price_group() here once
   per group of candidates, and worker_seconds() for the rows a new table changed. This file is
   the only implementation of that vector pricing: written in numpy it cost ~0.5 ms per request
   at 1,000 workers, nearly all of it the overhead of a few hundred numpy calls on small arrays
   (docs/benchmarks.md, "Planning cost"). The scalar predictor admission uses
   (controlplane/core/predictor.py, kvplane/latency.py) prices one placement of one worker with the
   same step-time model, as it did beside the numpy version; tests/core/test_core_seconds.py holds
   this file's chunked prefill equal to StepTimeModel.chunked_prefill_seconds.

   Only the public C API: buffers (PEP 3118) of C-contiguous numpy arrays, whose sizes are checked
   against the counts passed; no numpy headers, no CPython internals. Arithmetic follows
   the order of operations of the numpy version it replaced (1ca9238's seconds.py) term by term in
   IEEE doubles (built with -ffp-contract=off, no fused multiply-add), integer counts in int64, so
   its decisions are those to the bit. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* The rows of seconds._columns and of FleetColumns' per-row seconds. */
enum { C0, C1, C2, C3, C4, FREE, CHUNK, QUEUED, PER_STEP, NBYTES, BATCH, NUM_COLUMNS };
enum { S_QUEUE, S_QUEUED_WORK, S_CHUNK_WORK, S_BUSY_STEP, NUM_SECONDS };
/* The rows of price_group's outputs. */
enum { O_ROW, O_CACHED, O_COMPUTED, O_FETCH_BLOCKS, O_SOURCE_ROW, O_PREFILL_ROW, O_KIND, NUM_INT_OUT };
enum { O_TTFT, O_TPOT, O_WORK, O_QUEUE, O_MOVE, O_PREFILL, O_TRANSFER, NUM_FLOAT_OUT };
enum { LOCAL, FETCH, REMOTE }; /* seconds.LOCAL, FETCH, REMOTE */

/* numpy's maximum / minimum: a NaN operand gives NaN. */
static inline double max_nan(double a, double b) { return a != a ? a : (b != b ? b : (a > b ? a : b)); }
static inline double min_nan(double a, double b) { return a != a ? a : (b != b ? b : (a < b ? a : b)); }
static inline int64_t max_i(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t min_i(int64_t a, int64_t b) { return a < b ? a : b; }

typedef struct {
    const double *m;      /* NUM_COLUMNS x n */
    const double *sec;    /* NUM_SECONDS x n */
    const int64_t *held;  /* 3 x n: matched, host, disk */
    const int64_t *device;  /* n, or NULL: leading blocks a fetch can pull from each row */
    const double *inflow; /* n, or NULL: prefill work arriving per second */
    const double *carried; /* n, or NULL: the mean prefill work of a prompt arriving there (inflow.mean_work) */
    const int64_t *id_rank;
    const unsigned char *can_decode;
    Py_ssize_t n;
    int64_t P, bs, max_blocks;
    double link, overhead, host_rate, disk_rate, off[3], per_work_s, batch_share, ttft_target, tpot_target, tokens_x;
} Fleet;

#define COL(f, c, r) ((f)->m[(Py_ssize_t)(c) * (f)->n + (r)])
#define SEC(f, s, r) ((f)->sec[(Py_ssize_t)(s) * (f)->n + (r)])
#define MATCHED(f, r) ((f)->held[(r)])
#define HOST(f, r) ((f)->held[(f)->n + (r)])
#define DISK(f, r) ((f)->held[2 * (f)->n + (r)])

/* A prefill's steps for one chunk size: what depends on the tokens and the chunk alone, kept for
   the next row asking the same (rows of a fleet mostly share their chunk, and a request's prompt
   is the same for every row: integer division costs more than the rest). */
typedef struct {
    int64_t chunk, tokens, cached; /* the question (chunk -1: none yet) */
    int64_t steps, before_last, last, attention;
} Steps;
#define NO_STEPS {.chunk = -1}

/* chunked_parts: prefilling num_tokens after num_cached on row r, chunk by chunk, each step
   carrying the row's batch: (the steps' own seconds, the prefill's compute: c1 x each step's
   tokens past the kink + c2 x attention). */
static inline void chunked_parts(const double *m, Py_ssize_t n, Py_ssize_t r, int64_t num_tokens, int64_t num_cached, Steps *s,
                                 double *steps_s, double *work_s) {
    const int64_t chunk = max_i((int64_t)m[CHUNK * n + r], 1); /* the table keeps >= 1: never a division by 0 */
    if (s->chunk != chunk || s->tokens != num_tokens || s->cached != num_cached) {
        const int64_t t = num_tokens > 0 ? num_tokens : 0;
        s->chunk = chunk, s->tokens = num_tokens, s->cached = num_cached;
        s->steps = (t + chunk - 1) / chunk;
        s->before_last = max_i(s->steps - 1, 0);
        s->last = t - s->before_last * chunk;
        const int64_t num_odd = s->before_last * (chunk % 2) + s->last % 2;
        s->attention = (2 * t * num_cached + t * t - num_odd) / 2;
    }
    const double free_tokens = m[FREE * n + r];
    const double hinge = (double)s->before_last * max_nan((double)chunk - free_tokens, 0.0) + max_nan((double)s->last - free_tokens, 0.0);
    *steps_s = (double)s->steps * m[PER_STEP * n + r];
    *work_s = m[C1 * n + r] * hinge + m[C2 * n + r] * (double)s->attention;
}

static inline double chunked_seconds(const Fleet *f, Py_ssize_t r, int64_t num_tokens, int64_t num_cached, Steps *s) {
    double steps, work;
    chunked_parts(f->m, f->n, r, num_tokens, num_cached, s, &steps, &work);
    return steps + work;
}

/* What a prefill's compute on row r costs the requests there, per second of it, in seconds of a
   prompt's wait: the request queued after it waits that long (1), and so does every sequence of
   the decode batch its chunks ride with (BATCH of them, 0 on a worker that only prefills), each
   second of theirs worth `batch_share` (seconds.Request.batch_share). */
static inline double cost_per_work_s(const Fleet *f, Py_ssize_t r) { return 1.0 + COL(f, BATCH, r) * f->batch_share; }

/* What a remote prefill on row p costs per second of its compute, for a decode worker whose own
   costs `per_work`: on a worker that only prefills, the request after it waits (1); on one that
   decodes too, the larger of its batch's and the decode worker's. A prefill decoded elsewhere
   never joins the batch it delays, so priced by that batch alone every prefill went to the worker
   that last reported the smallest one until its queue showed it (`kvplane sim`, mix on 3 both
   workers at 800 req/s: 7x the KV moved, goodput -17 %); priced at the decode worker's alone, a
   decode went to the smallest batch and its prompt to the shortest queue (synthetic at 2x with
   admission: 279 GB moved, attainment 85 %). */
static inline double remote_per_work(const Fleet *f, int64_t p, double per_work) { return f->can_decode[p] ? max_nan(per_work, cost_per_work_s(f, p)) : 1.0; }

/* Whether a placement of (ttft, spent) beats one of (ttft_b, spent_b) on a worker whose TPOT is
   `tpot`, by seconds.choose's rule: meeting the objectives first, then the least spent among those
   that meet, the least TTFT among those that miss (NaN never beats). */
static inline int beats(const Fleet *f, double tpot, double ttft, double spent, double ttft_b, double spent_b) {
    const int tpot_ok = tpot <= f->tpot_target, meets = tpot_ok && ttft <= f->ttft_target, meets_b = tpot_ok && ttft_b <= f->ttft_target;
    if (meets != meets_b) return meets;
    return meets ? spent < spent_b : ttft < ttft_b;
}

/* One step at row r starting at some moment: with the prefill arriving there on top of what is
   queued: the rate less the work queued there (inflow.py; predictor.next_step_with_prefill). */
static inline double next_step(const Fleet *f, Py_ssize_t r, double step) {
    if (f->inflow == NULL) return step;
    const double arriving = max_nan(f->inflow[r] - SEC(f, S_QUEUED_WORK, r) * f->per_work_s, 0.0);
    /* With prefill queued there a step fills its chunk from that backlog; without, it carries
       what arrives: a prompt, the mean of those sent there (inflow.mean_work), a chunk at most. */
    const double queued = SEC(f, S_QUEUED_WORK, r);
    const double carried = f->carried != NULL && !(queued > 0.0) ? min_nan(SEC(f, S_CHUNK_WORK, r), f->carried[r]) : SEC(f, S_CHUNK_WORK, r);
    return step + (0.0 + min_nan(arriving, 1.0) * carried);
}

/* Time per output token of decode steps taking `step` alone at row r, sharing them with the
   prefill arriving there (predictor.shared_step_seconds). */
static inline double token_seconds(const Fleet *f, Py_ssize_t r, double step) {
    if (f->inflow == NULL) return step;
    return min_nan(step / max_nan(1.0 - f->inflow[r], 1e-9), step + SEC(f, S_CHUNK_WORK, r));
}

/* Seconds loading the counted blocks held on a slower tier (`load` in seconds.py); `slow_any`:
   whether any of the rows priced together holds blocks off the device (else 0 for all). */
static inline double load_seconds(const Fleet *f, Py_ssize_t r, int64_t own, int slow_any) {
    if (!slow_any) return 0.0;
    const int64_t matched = MATCHED(f, r), host = HOST(f, r), disk = DISK(f, r);
    const int64_t slow = max_i(own - (matched - host - disk), 0);
    const int64_t from_host = min_i(host, slow);
    return COL(f, NBYTES, r) * ((double)from_host / f->host_rate + (double)(slow - from_host) / f->disk_rate);
}

static int any_slow(const Fleet *f, const int64_t *rows, Py_ssize_t count) {
    for (Py_ssize_t k = 0; k < count; k++)
        if (HOST(f, rows[k]) != 0 || DISK(f, rows[k]) != 0) return 1;
    return 0;
}

/* Prefilling the prompt on row r after `cached` of its tokens, `move` seconds of loading or
   pulling overlapping the queue. The pruning and the choice both price a placement through these
   two, so their keys agree to the last bit (the pruning keeps ties). */
typedef struct {
    double ttft;    /* without the calibration offset */
    double prefill; /* the steps' seconds + the prefill's compute */
    double work;    /* the prefill's compute */
} Prefill;

static inline Prefill prefill_at(const Fleet *f, Py_ssize_t r, int64_t cached, double move, Steps *s) {
    double steps, work;
    chunked_parts(f->m, f->n, r, f->P - cached, cached, s, &steps, &work);
    const double prefill = steps + work;
    return (Prefill){.ttft = max_nan(SEC(f, S_QUEUE, r), move) + prefill, .prefill = prefill, .work = work};
}

/* A fetch's `move`: the tier loads of row r, then pulling `gain` blocks over the link. */
static inline double fetch_move(const Fleet *f, Py_ssize_t r, double load_s, int64_t gain) {
    return load_s + (gain > 0 ? f->overhead + (double)gain * COL(f, NBYTES, r) / f->link : 0.0);
}

/* (when the prompt's tail step starts, that step's seconds) on decode row r holding `matched`
   blocks, of a prompt prefilled elsewhere in `best` seconds (`remote TTFT` in seconds.py). */
static inline void remote_start_and_tail(const Fleet *f, Py_ssize_t r, int64_t matched, double best, Steps *s, double *tail_at,
                                         double *tail_step) {
    const int64_t tail = f->P - (f->P - 1) / f->bs * f->bs;
    const double kv_in = best + (double)max_i(f->P / f->bs - matched, 0) * COL(f, NBYTES, r) / f->link;
    const double in_flight = next_step(f, r, SEC(f, S_BUSY_STEP, r)) / 2;
    *tail_step = next_step(f, r, chunked_seconds(f, r, tail, f->P - tail, s));
    *tail_at = max_nan(kv_in + in_flight, SEC(f, S_QUEUE, r));
}

/* The k-th least of the values of the rows holding none of the prompt (k >= 1), NaN ordered last
   as numpy sorts it: NaN when fewer than k of them are numbers. One pass keeping the k least in
   a max-heap (`heap`: room for k): a value not under the k-th least so far costs one comparison. */
static double kth_least(const Fleet *f, const int64_t *rows, const double *values, Py_ssize_t count, Py_ssize_t k, double *heap) {
    Py_ssize_t size = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        double v = values[i];
        if (v != v || MATCHED(f, rows[i]) > 0) continue;
        Py_ssize_t at;
        if (size < k) { /* sift up */
            at = size++;
            while (at > 0 && heap[(at - 1) / 2] < v) heap[at] = heap[(at - 1) / 2], at = (at - 1) / 2;
        } else if (v < heap[0]) { /* replace the largest, sift down */
            at = 0;
            for (;;) {
                Py_ssize_t child = 2 * at + 1;
                if (child >= k) break;
                if (child + 1 < k && heap[child + 1] > heap[child]) child++;
                if (heap[child] <= v) break;
                heap[at] = heap[child], at = child;
            }
        } else {
            continue;
        }
        heap[at] = v;
    }
    return size < k ? NAN : heap[0];
}

/* The candidates that can win (seconds.py): of `rows` (count of them), the holders and, of the
   others, those with one of the num_keys keys at most its `limit`-th least (ties kept), in their
   order; returns how many, written over `rows`. keys[key * count + k] is row k's key (read for
   non-holders). */
static Py_ssize_t can_win(const Fleet *f, int64_t *rows, Py_ssize_t count, const double *keys, int num_keys, Py_ssize_t limit,
                          double *scratch, unsigned char *wins) {
    if (limit <= 0 || count <= limit) return count;
    Py_ssize_t others = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        wins[k] = MATCHED(f, rows[k]) > 0;
        others += !wins[k];
    }
    if (others <= limit) return count;
    for (int key = 0; key < num_keys; key++) {
        const double *values = keys + (Py_ssize_t)key * count;
        const double bound = kth_least(f, rows, values, count, limit, scratch);
        for (Py_ssize_t k = 0; k < count; k++)
            if (MATCHED(f, rows[k]) <= 0 && values[k] <= bound) wins[k] = 1;
    }
    Py_ssize_t kept = 0;
    for (Py_ssize_t k = 0; k < count; k++)
        if (wins[k]) rows[kept++] = rows[k];
    return kept;
}

/* A remote prefill worker's prediction (`part(p)` in seconds.py); row -1: none. */
typedef struct {
    int64_t row;
    double queue, load, compute, work, total, spent; /* spent: total + work, what it is chosen by */
    int64_t computed;
} Prefiller;

/* a before b: least spent (NaN last), a dedicated prefill worker first, then the worker id. */
static int prefill_before(const Fleet *f, double ta, int64_t ra, double tb, int64_t rb) {
    const int a_nan = ta != ta, b_nan = tb != tb;
    if (a_nan != b_nan) return b_nan;
    if (!a_nan && ta != tb) return ta < tb;
    if (f->can_decode[ra] != f->can_decode[rb]) return f->can_decode[ra] < f->can_decode[rb];
    return f->id_rank[ra] < f->id_rank[rb];
}

/* The best remote prefill worker and the second best of `rows` (count of them) into part[0] and
   part[1] (row -1, no tokens cached and infinite seconds for none); 0 when there is none. */
static int best_prefill(const Fleet *f, int64_t *rows, Py_ssize_t count, int prune, double *keys, double *scratch, unsigned char *wins,
                        Prefiller part[2]) {
    if (prune) {
        Steps s = NO_STEPS;
        for (Py_ssize_t k = 0; k < count; k++) {
            const Prefill p = prefill_at(f, rows[k], 0, 0.0, &s); /* a holder is kept whatever its key */
            keys[k] = p.ttft + p.work;
        }
        count = can_win(f, rows, count, keys, 1, 2, scratch, wins);
    }
    if (count == 0) return 0;
    const Prefiller none = {.row = -1, .total = INFINITY, .spent = INFINITY, .computed = f->P};
    part[0] = part[1] = none;
    const int slow = any_slow(f, rows, count);
    Steps s = NO_STEPS;
    for (Py_ssize_t k = 0; k < count; k++) {
        const Py_ssize_t r = rows[k];
        const int64_t own = min_i(MATCHED(f, r), f->max_blocks);
        const double l = load_seconds(f, r, own, slow), q = SEC(f, S_QUEUE, r);
        const Prefill here = prefill_at(f, r, own * f->bs, l, &s);
        const double c = here.prefill, w = here.work, t = here.ttft, key = t + w;
        int slot;
        if (part[0].row < 0 || prefill_before(f, key, r, part[0].spent, part[0].row)) slot = 0, part[1] = part[0];
        else if (part[1].row < 0 || prefill_before(f, key, r, part[1].spent, part[1].row)) slot = 1;
        else continue;
        part[slot] = (Prefiller){.row = r, .queue = q, .load = 0.0 + l, .compute = c, .work = w, .total = t, .spent = key,
                                 .computed = f->P - own * f->bs};
    }
    return 1;
}

/* The rows holding the most leading device blocks of the prompt, then the lower worker id:
   (best row, second row, their blocks); -1 and 0 for none (`fetch` in seconds.py). */
static void best_two(const Fleet *f, const int64_t *rows, Py_ssize_t count, int64_t source[4]) {
    source[0] = source[1] = -1;
    source[2] = source[3] = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        const int64_t r = rows[k], d = f->device[r];
        if (d == 0) continue;
        if (source[0] < 0 || d > source[2] || (d == source[2] && f->id_rank[r] < f->id_rank[source[0]])) {
            source[1] = source[0], source[3] = source[2];
            source[0] = r, source[2] = d;
        } else if (source[1] < 0 || d > source[3] || (d == source[3] && f->id_rank[r] < f->id_rank[source[1]])) {
            source[1] = r, source[3] = d;
        }
    }
    if (source[1] >= 0 && source[3] <= 0) source[1] = -1, source[3] = 0;
}

typedef struct {
    Py_buffer b[13]; /* price_group takes 13 buffers, worker_seconds 4 */
    int used;
} Buffers;

static void release(Buffers *bufs) {
    for (int i = 0; i < bufs->used; i++) PyBuffer_Release(&bufs->b[i]);
}

/* Gets obj's buffer (writable when asked): C-contiguous items of `type` ('d' float64, 'q' int64,
   '?' bool, as numpy formats them), `count` of them (count < 0: any number); NULL with ValueError
   otherwise. */
static void *buffer_of(Buffers *bufs, PyObject *obj, char type, Py_ssize_t count, int writable, const char *name, Py_ssize_t *got) {
    Py_buffer *view = &bufs->b[bufs->used];
    if (PyObject_GetBuffer(obj, view, PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0) return NULL;
    bufs->used++;
    const char *format = view->format ? view->format : "B";
    if (*format == '@' || *format == '=' || *format == '<') format++;
    const int ok = type == 'q' ? (format[0] == 'q' || format[0] == 'l') && format[1] == 0 && view->itemsize == 8
                               : format[0] == type && format[1] == 0 && view->itemsize == (type == '?' ? 1 : 8);
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "%s: items of format '%s' (%zd bytes), expected '%c'", name, view->format, view->itemsize, type);
        return NULL;
    }
    if (count >= 0 && view->len != count * view->itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: %zd items, expected %zd", name, view->len / view->itemsize, count);
        return NULL;
    }
    if (got != NULL) *got = view->len / view->itemsize;
    return view->buf;
}

static int rows_in_range(const int64_t *rows, Py_ssize_t count, Py_ssize_t n, const char *name) {
    for (Py_ssize_t k = 0; k < count; k++)
        if (rows[k] < 0 || rows[k] >= n) {
            PyErr_Format(PyExc_ValueError, "%s: row %lld outside the table's %zd rows", name, (long long)rows[k], n);
            return 0;
        }
    return 1;
}

PyDoc_STRVAR(price_group_doc,
             "price_group(m, seconds, held, device, inflow, carried, id_rank, can_decode, decode_rows, prefill_rows, source_rows,\n"
             "            P, block_size, max_tokens, allow_local, prune, limit, link, fetch_overhead, host_rate, disk_rate,\n"
             "            offset_local, offset_remote, offset_tpot, per_work_s, batch_share, ttft_target, tpot_target, out_int,\n"
             "            out_float) -> count\n\n"
             "seconds.price_candidates for one group of candidates (seconds.py's docstring). Per table row: m (11 x n\n"
             "float64, seconds._columns), seconds (4 x n float64, FleetColumns), held (3 x n int64), device (n int64, or empty:\n"
             "no fetch), inflow (n float64, or empty: none), carried (n float64 or empty: the mean work of an arriving prompt),\n"
             "id_rank (n int64), can_decode (n bool). decode_rows,\n"
             "prefill_rows (empty: no remote prefill), source_rows: int64 table rows. Writes the candidates that can\n"
             "win, in decode_rows' order, into the first `count` columns of out_int (7 x len(decode_rows) int64: row,\n"
             "cached tokens, computed tokens, fetch blocks, fetch source row, prefill row, placement) and out_float\n"
             "(7 x len(decode_rows) float64: TTFT, TPOT, work, queue, move, prefill, transfer seconds).");

static PyObject *price_group(PyObject *self, PyObject *args) {
    PyObject *o_m, *o_sec, *o_held, *o_device, *o_inflow, *o_carried, *o_rank, *o_decodes, *o_decode, *o_prefill, *o_source, *o_out_i,
        *o_out_f;
    long long P, bs, max_tokens;
    int allow_local, prune;
    Py_ssize_t limit;
    Fleet f;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOLLLppndddddddddddOO:price_group", &o_m, &o_sec, &o_held, &o_device, &o_inflow, &o_carried, &o_rank,
                          &o_decodes, &o_decode, &o_prefill, &o_source, &P, &bs, &max_tokens, &allow_local, &prune, &limit, &f.link,
                          &f.overhead, &f.host_rate, &f.disk_rate, &f.off[0], &f.off[1], &f.off[2], &f.per_work_s, &f.batch_share, &f.ttft_target, &f.tpot_target, &o_out_i, &o_out_f))
        return NULL;
    if (P < 1 || bs < 1 || max_tokens < 0) return PyErr_Format(PyExc_ValueError, "price_group: prompt %lld, block size %lld", P, bs);
    Buffers bufs = {.used = 0};
    PyObject *result = NULL;
    double *keys = NULL, *scratch = NULL;
    unsigned char *wins = NULL;
    int64_t *rows = NULL, *prefill = NULL;
    Py_ssize_t n, num_decode = 0, num_prefill = 0, num_source = 0, num_device = 0, num_inflow = 0, num_carried = 0;
    const double *m = buffer_of(&bufs, o_m, 'd', -1, 0, "m", &n);
    if (m == NULL) goto done;
    if (n % NUM_COLUMNS != 0) {
        PyErr_SetString(PyExc_ValueError, "m: not 11 rows of the table's rows");
        goto done;
    }
    n /= NUM_COLUMNS;
    f.m = m, f.n = n;
    if (!(f.sec = buffer_of(&bufs, o_sec, 'd', NUM_SECONDS * n, 0, "seconds", NULL))) goto done;
    if (!(f.held = buffer_of(&bufs, o_held, 'q', 3 * n, 0, "held", NULL))) goto done;
    if (!(f.device = buffer_of(&bufs, o_device, 'q', -1, 0, "device", &num_device))) goto done;
    if (!(f.inflow = buffer_of(&bufs, o_inflow, 'd', -1, 0, "inflow", &num_inflow))) goto done;
    if (!(f.carried = buffer_of(&bufs, o_carried, 'd', -1, 0, "carried", &num_carried))) goto done;
    if (!(f.id_rank = buffer_of(&bufs, o_rank, 'q', n, 0, "id_rank", NULL))) goto done;
    if (!(f.can_decode = buffer_of(&bufs, o_decodes, '?', n, 0, "can_decode", NULL))) goto done;
    const int64_t *decode = buffer_of(&bufs, o_decode, 'q', -1, 0, "decode_rows", &num_decode);
    const int64_t *prefill_in = decode ? buffer_of(&bufs, o_prefill, 'q', -1, 0, "prefill_rows", &num_prefill) : NULL;
    const int64_t *source_rows = prefill_in ? buffer_of(&bufs, o_source, 'q', -1, 0, "source_rows", &num_source) : NULL;
    if (source_rows == NULL) goto done;
    int64_t *out_i = buffer_of(&bufs, o_out_i, 'q', NUM_INT_OUT * num_decode, 1, "out_int", NULL);
    double *out_f = out_i ? buffer_of(&bufs, o_out_f, 'd', NUM_FLOAT_OUT * num_decode, 1, "out_float", NULL) : NULL;
    if (out_f == NULL) goto done;
    if ((num_device != 0 && num_device != n) || (num_inflow != 0 && num_inflow != n) || (num_carried != 0 && num_carried != n)) {
        PyErr_SetString(PyExc_ValueError, "device, inflow and carried: one value per table row, or none");
        goto done;
    }
    if (!rows_in_range(decode, num_decode, n, "decode_rows") || !rows_in_range(prefill_in, num_prefill, n, "prefill_rows") ||
        !rows_in_range(source_rows, num_source, n, "source_rows"))
        goto done;
    if (num_device == 0) f.device = NULL;
    if (num_inflow == 0) f.inflow = NULL;
    if (num_carried == 0 || f.inflow == NULL) f.carried = NULL;
    f.P = P, f.bs = bs, f.max_blocks = (P - 1) / bs;
    f.tokens_x = (double)P + (double)max_tokens / 2;

    const Py_ssize_t most = num_decode > num_prefill ? num_decode : num_prefill;
    keys = malloc(sizeof(double) * 6 * (most + 1));
    scratch = malloc(sizeof(double) * (most + 1));
    wins = malloc(most + 1);
    rows = malloc(sizeof(int64_t) * (num_decode + 1));
    prefill = malloc(sizeof(int64_t) * (num_prefill + 1));
    if (!keys || !scratch || !wins || !rows || !prefill) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < num_decode; k++) rows[k] = decode[k];
    for (Py_ssize_t k = 0; k < num_prefill; k++) prefill[k] = prefill_in[k];

    int64_t source[4] = {-1, -1, 0, 0};
    if (f.device != NULL) best_two(&f, source_rows, num_source, source);
    Prefiller part[2];
    const int has_part = num_prefill > 0 && best_prefill(&f, prefill, num_prefill, prune, keys, scratch, wins, part);

    Py_ssize_t count = num_decode;
    if (prune) {
        /* A non-holder's TTFT and its TTFT + cost prefilling locally or after a fetch, and after
           the best remote prefill; its batch's step orders its TPOT (seconds.py's docstring). */
        double *alone = keys, *alone_ttft = keys + count, *step = keys + 2 * count, *next = keys + 3 * count;
        double *stretched = f.inflow != NULL ? next : NULL, *remote = has_part ? next + (f.inflow != NULL) * count : NULL;
        double *remote_spent = remote != NULL ? remote + count : NULL;
        const int num_keys = 3 + (stretched != NULL) + 2 * (remote != NULL);
        Steps s_local = NO_STEPS, s_fetch = NO_STEPS, s_tail = NO_STEPS;
        for (Py_ssize_t k = 0; k < count; k++) {
            const Py_ssize_t r = rows[k];
            if (MATCHED(&f, r) > 0) continue; /* holders are kept whatever their keys */
            /* (each as the loop below computes it, to the last bit: the pruning keeps ties) */
            const double per_work = cost_per_work_s(&f, r);
            const Prefill local = prefill_at(&f, r, 0, 0.0, &s_local);
            double t = local.ttft + f.off[0], a = t + local.work * per_work;
            if (source[0] >= 0) { /* a non-holder is no fetch source: it pulls the best one's blocks */
                const Prefill fetched = prefill_at(&f, r, source[2] * bs, fetch_move(&f, r, 0.0, source[2]), &s_fetch);
                const double f_ttft = fetched.ttft + f.off[0];
                t = min_nan(t, f_ttft), a = min_nan(a, f_ttft + fetched.work * per_work);
            }
            alone[k] = a, alone_ttft[k] = t;
            step[k] = COL(&f, PER_STEP, r);
            if (stretched != NULL) stretched[k] = token_seconds(&f, r, step[k]);
            if (remote != NULL) {
                double tail_at, tail_step;
                const Prefiller *p = &part[r == part[0].row];
                remote_start_and_tail(&f, r, 0, p->total, &s_tail, &tail_at, &tail_step); /* as the loop below */
                remote[k] = tail_at + tail_step + f.off[1];
                remote_spent[k] = remote[k] + p->work * remote_per_work(&f, p->row, per_work);
            }
        }
        count = can_win(&f, rows, count, keys, num_keys, limit, scratch, wins);
    }

    const int slow = any_slow(&f, rows, count);
    Steps s_own = NO_STEPS, s_fetched = NO_STEPS, s_tail = NO_STEPS;
    for (Py_ssize_t k = 0; k < count; k++) {
        const Py_ssize_t r = rows[k];
        const int64_t matched = MATCHED(&f, r), own = min_i(matched, f.max_blocks);
        const double load_s = load_seconds(&f, r, own, slow), queue_s = SEC(&f, S_QUEUE, r);
        const int64_t cached_tok = own * bs;
        const double per_work = cost_per_work_s(&f, r);
        const double tpot = token_seconds(&f, r, COL(&f, PER_STEP, r) + COL(&f, C3, r) + COL(&f, C4, r) * f.tokens_x) + f.off[2];
        const Prefill here = prefill_at(&f, r, cached_tok, load_s, &s_own);
        double local = here.ttft + f.off[0], cost = here.work * per_work;
        int64_t computed = P - cached_tok, fetch_blocks = 0, source_row = -1, prefill_row = -1, kind = LOCAL;
        double move = load_s, prefill_k = here.prefill, transfer = 0.0, queue_k = queue_s;
        if (source[0] >= 0) {
            const int is_first = r == source[0];
            const int64_t gain = max_i((is_first ? source[3] : source[2]) - own, 0);
            const double f_move = fetch_move(&f, r, load_s, gain);
            const Prefill fetched = prefill_at(&f, r, (own + gain) * bs, f_move, &s_fetched);
            const double f_ttft = fetched.ttft + f.off[0], f_cost = fetched.work * per_work;
            if (gain > 0 && beats(&f, tpot, f_ttft, f_ttft + f_cost, local, local + cost)) {
                cost = f_cost, computed = P - (own + gain) * bs, local = f_ttft;
                kind = FETCH, move = f_move, prefill_k = fetched.prefill, fetch_blocks = gain;
                source_row = is_first ? source[1] : source[0];
            }
        }
        if (!allow_local) kind = REMOTE; /* no local placement: priced at infinite TTFT */
        double ttft = allow_local ? local : INFINITY;
        if (has_part) {
            const Prefiller *p = &part[r == part[0].row]; /* the best prefill worker decoding: the second best prefills */
            const double best = p->total;
            double tail_at, tail_step;
            remote_start_and_tail(&f, r, matched, best, &s_tail, &tail_at, &tail_step);
            const double remote_ttft = tail_at + tail_step + f.off[1];
            const double remote_cost = p->work * remote_per_work(&f, p->row, per_work);
            if (beats(&f, tpot, remote_ttft, remote_ttft + remote_cost, ttft, ttft + cost)) {
                ttft = remote_ttft, cost = remote_cost, computed = p->computed;
                transfer = (isfinite(best) ? tail_at - best : 0.0) + tail_step;
                kind = REMOTE, queue_k = p->queue, move = p->load, prefill_k = p->compute;
                fetch_blocks = 0, source_row = -1, prefill_row = p->row;
            }
        }
        out_i[O_ROW * num_decode + k] = r;
        out_i[O_CACHED * num_decode + k] = cached_tok;
        out_i[O_COMPUTED * num_decode + k] = computed;
        out_i[O_FETCH_BLOCKS * num_decode + k] = fetch_blocks;
        out_i[O_SOURCE_ROW * num_decode + k] = source_row;
        out_i[O_PREFILL_ROW * num_decode + k] = prefill_row;
        out_i[O_KIND * num_decode + k] = kind;
        out_f[O_TTFT * num_decode + k] = ttft;
        out_f[O_TPOT * num_decode + k] = tpot;
        out_f[O_WORK * num_decode + k] = 0.0 + cost;
        out_f[O_QUEUE * num_decode + k] = queue_k;
        out_f[O_MOVE * num_decode + k] = move;
        out_f[O_PREFILL * num_decode + k] = prefill_k;
        out_f[O_TRANSFER * num_decode + k] = transfer;
    }
    result = PyLong_FromSsize_t(count);
done:
    free(keys), free(scratch), free(wins), free(rows), free(prefill);
    release(&bufs);
    return result;
}

PyDoc_STRVAR(worker_seconds_doc,
             "worker_seconds(m, running, context, out)\n\n"
             "FleetColumns' per-row seconds of k rows: m (11 x k float64, seconds._columns), running and context (k int64),\n"
             "out (4 x k float64): what a request arriving now waits before its prefill, of it the queued prefill's\n"
             "compute, a full chunk's compute, the step a busy worker has in flight.");

static PyObject *worker_seconds(PyObject *self, PyObject *args) {
    PyObject *o_m, *o_running, *o_context, *o_out;
    if (!PyArg_ParseTuple(args, "OOOO:worker_seconds", &o_m, &o_running, &o_context, &o_out)) return NULL;
    Buffers bufs = {.used = 0};
    PyObject *result = NULL;
    Py_ssize_t k;
    const int64_t *running = buffer_of(&bufs, o_running, 'q', -1, 0, "running", &k);
    const double *m = running ? buffer_of(&bufs, o_m, 'd', NUM_COLUMNS * k, 0, "m", NULL) : NULL;
    const int64_t *context = m ? buffer_of(&bufs, o_context, 'q', k, 0, "context", NULL) : NULL;
    double *out = context ? buffer_of(&bufs, o_out, 'd', NUM_SECONDS * k, 1, "out", NULL) : NULL;
    if (out == NULL) goto done;
    Steps s_queued = NO_STEPS, s_chunk = NO_STEPS;
    for (Py_ssize_t r = 0; r < k; r++) {
        const double in_flight = m[C0 * k + r] + m[C3 * k + r] * (double)running[r] + m[C4 * k + r] * (double)context[r];
        const int64_t queued = (int64_t)m[QUEUED * k + r];
        double steps, queued_work, chunk_steps, chunk_work;
        chunked_parts(m, k, r, queued, 0, &s_queued, &steps, &queued_work);
        chunked_parts(m, k, r, (int64_t)m[CHUNK * k + r], 0, &s_chunk, &chunk_steps, &chunk_work);
        const int busy = running[r] > 0 || queued > 0;
        out[S_QUEUE * k + r] = (busy ? in_flight / 2 : 0.0) + steps + queued_work;
        out[S_QUEUED_WORK * k + r] = queued_work;
        out[S_CHUNK_WORK * k + r] = chunk_work;
        out[S_BUSY_STEP * k + r] = busy ? m[PER_STEP * k + r] : 0.0;
    }
    result = Py_NewRef(Py_None);
done:
    release(&bufs);
    return result;
}

static PyMethodDef methods[] = {
    {"price_group", price_group, METH_VARARGS, price_group_doc},
    {"worker_seconds", worker_seconds, METH_VARARGS, worker_seconds_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kvplane._pricing", "Routing's prices in predicted seconds (see the C file).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__pricing(void) { return PyModule_Create(&module); }
