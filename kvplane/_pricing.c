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

/* The prefill work a step at row r absorbs at no cost of its own: c1 x the kink (latency.StepTimeModel.slack_seconds). */
static inline double slack(const Fleet *f, Py_ssize_t r) { return COL(f, C1, r) * COL(f, FREE, r); }

/* One step at row r starting at some moment: with the prefill arriving there on top of what is
   queued: the rate less the work queued there (inflow.py; predictor.next_step_with_prefill). */
static inline double next_step(const Fleet *f, Py_ssize_t r, double step) {
    if (f->inflow == NULL) return step;
    const double queued = SEC(f, S_QUEUED_WORK, r);
    const double arriving = max_nan(f->inflow[r] - queued * f->per_work_s, 0.0);
    /* With prefill queued there a step fills its chunk from that backlog; without, it carries
       what arrives: a prompt, the mean of those sent there (inflow.mean_work), a chunk at most. */
    const double carried = f->carried != NULL && !(queued > 0.0) ? min_nan(SEC(f, S_CHUNK_WORK, r), max_nan(f->carried[r] - slack(f, r), 0.0))
                                                                 : SEC(f, S_CHUNK_WORK, r);
    return step + (0.0 + min_nan(arriving, 1.0) * carried);
}

/* Time per output token of decode steps taking `step` alone at row r, sharing them with the
   prefill arriving there (predictor.shared_step_seconds). */
static inline double token_seconds(const Fleet *f, Py_ssize_t r, double step) {
    if (f->inflow == NULL) return step;
    const double shared = max_nan(step, (step - slack(f, r)) / max_nan(1.0 - f->inflow[r], 1e-9));
    return min_nan(shared, step + SEC(f, S_CHUNK_WORK, r));
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

/* Offers v to the k least kept so far in the max-heap `heap` (`*size` of them, room for k). */
static inline void heap_offer(double *heap, Py_ssize_t *size, Py_ssize_t k, double v) {
    Py_ssize_t at;
    if (*size < k) { /* sift up */
        at = (*size)++;
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
        return;
    }
    heap[at] = v;
}

/* The k-th least of the values of one class (k >= 1), NaN ordered last as numpy sorts it: NaN
   when fewer than k of them are numbers. The class is the `count` positions `at`, or (at NULL)
   the positions k with class_of[k] == 0 of `count`. One pass keeping the k least in a max-heap
   (`heap`: room for k): a value not under the k-th least so far costs one comparison. */
static double kth_least(const double *values, const Py_ssize_t *at, const Py_ssize_t *class_of, Py_ssize_t count, Py_ssize_t k,
                        double *heap) {
    Py_ssize_t size = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (at == NULL && class_of[i] != 0) continue;
        const double v = values[at != NULL ? at[i] : i];
        if (v == v) heap_offer(heap, &size, k, v);
    }
    return size < k ? NAN : heap[0];
}

/* Scratch space of the pruning, for `count` rows. */
typedef struct {
    double *keys;              /* 6 x count */
    double *heap;              /* count + 1 */
    unsigned char *wins;       /* count */
    Py_ssize_t *class_of;      /* count: the held class of each position */
    Py_ssize_t *order;         /* 2 x count: holders' positions grouped by class, then as found */
    Py_ssize_t *start;         /* count + 1: where each class begins in `order` */
    Py_ssize_t *slots;         /* 2 x count rounded up to a power of 2: the classes' hash table */
} Scratch;

/* Numbers each position of `rows` by its held class (matched, host, disk blocks: rows of a class
   differ only in their own numbers, never in what the prompt finds there), into s->class_of;
   returns the number of classes and leaves s->order grouped by class, s->start their bounds.
   The rows holding none of the prompt (most of a fleet) are class 0 without a lookup. */
static Py_ssize_t held_classes(const Fleet *f, const int64_t *rows, Py_ssize_t count, Scratch *s) {
    Py_ssize_t num_holders = 0;
    Py_ssize_t *holders = s->order + count; /* the holders' positions, in the second half of `order` */
    for (Py_ssize_t k = 0; k < count; k++) {
        const int64_t r = rows[k];
        if ((MATCHED(f, r) | HOST(f, r) | DISK(f, r)) == 0) s->class_of[k] = 0;
        else holders[num_holders++] = k;
    }
    Py_ssize_t capacity = 2;
    while (capacity < 2 * num_holders) capacity *= 2;
    for (Py_ssize_t i = 0; i < capacity; i++) s->slots[i] = -1;
    Py_ssize_t num_classes = 1; /* class 0: those holding none (maybe no row) */
    for (Py_ssize_t i = 0; i < num_holders; i++) {
        const Py_ssize_t k = holders[i];
        const int64_t r = rows[k], m = MATCHED(f, r), h = HOST(f, r), d = DISK(f, r);
        uint64_t hash = (uint64_t)m * 0x9E3779B97F4A7C15ull ^ (uint64_t)h * 0xC2B2AE3D27D4EB4Full ^ (uint64_t)d * 0x165667B19E3779F9ull;
        Py_ssize_t slot = (Py_ssize_t)(hash & (uint64_t)(capacity - 1));
        for (;;) {
            const Py_ssize_t first = s->slots[slot]; /* a class is named by its first position */
            if (first < 0) {
                s->slots[slot] = k, s->class_of[k] = num_classes++;
                break;
            }
            const int64_t q = rows[first];
            if (MATCHED(f, q) == m && HOST(f, q) == h && DISK(f, q) == d) {
                s->class_of[k] = s->class_of[first];
                break;
            }
            slot = (slot + 1) & (capacity - 1);
        }
    }
    /* The holders' positions grouped by class (class 0 is read in place: most of the rows);
       class c >= 1 is order[start[c] : start[c + 1]]. The hash table's slots, no longer needed,
       hold each class's next place while they are filled in. */
    for (Py_ssize_t c = 0; c <= num_classes; c++) s->start[c] = 0;
    for (Py_ssize_t i = 0; i < num_holders; i++) s->start[s->class_of[holders[i]] + 1]++;
    for (Py_ssize_t c = 1; c < num_classes; c++) s->start[c + 1] += s->start[c], s->slots[c] = s->start[c];
    for (Py_ssize_t i = 0; i < num_holders; i++) {
        const Py_ssize_t k = holders[i];
        s->order[s->slots[s->class_of[k]]++] = k;
    }
    return num_classes;
}

/* The candidates that can win (seconds.py): of `rows` (count of them), within each held class,
   those with one of the num_keys keys at most its `limit`-th least in the class (ties kept); a
   class of `limit` rows or fewer is kept whole. In their order; returns how many, written over
   `rows`. s->keys[key * count + k] is row k's key. */
static Py_ssize_t can_win(const Fleet *f, int64_t *rows, Py_ssize_t count, int num_keys, Py_ssize_t limit, Scratch *s) {
    if (limit <= 0 || count <= limit) return count;
    const Py_ssize_t num_classes = held_classes(f, rows, count, s);
    /* Rows holding none of the prompt (class 0, read in place): all but the holders, whose
       classes end at start[num_classes]. */
    const Py_ssize_t none = count - s->start[num_classes];
    for (Py_ssize_t k = 0; k < count; k++) s->wins[k] = s->class_of[k] == 0 ? none <= limit : 0;
    for (Py_ssize_t c = 0; c < num_classes; c++) {
        const int in_place = c == 0;
        const Py_ssize_t *members = in_place ? NULL : s->order + s->start[c];
        const Py_ssize_t size = in_place ? none : s->start[c + 1] - s->start[c];
        if (size <= limit) {
            for (Py_ssize_t i = 0; !in_place && i < size; i++) s->wins[members[i]] = 1;
            continue;
        }
        for (int key = 0; key < num_keys; key++) {
            const double *values = s->keys + (Py_ssize_t)key * count;
            const double bound = kth_least(values, members, s->class_of, in_place ? count : size, limit, s->heap);
            if (in_place) {
                for (Py_ssize_t k = 0; k < count; k++)
                    if (s->class_of[k] == 0 && values[k] <= bound) s->wins[k] = 1;
            } else {
                for (Py_ssize_t i = 0; i < size; i++)
                    if (values[members[i]] <= bound) s->wins[members[i]] = 1;
            }
        }
    }
    Py_ssize_t kept = 0;
    for (Py_ssize_t k = 0; k < count; k++)
        if (s->wins[k]) rows[kept++] = rows[k];
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

/* Row r as a remote prefill worker (the prompt's own blocks there, loaded from slower tiers). */
static inline Prefiller prefiller_at(const Fleet *f, int64_t r, int slow, Steps *s) {
    const int64_t own = min_i(MATCHED(f, r), f->max_blocks);
    const double l = load_seconds(f, r, own, slow);
    const Prefill here = prefill_at(f, r, own * f->bs, l, s);
    return (Prefiller){.row = r, .queue = SEC(f, S_QUEUE, r), .load = 0.0 + l, .compute = here.prefill, .work = here.work,
                       .total = here.ttft, .spent = here.ttft + here.work, .computed = f->P - own * f->bs};
}

/* The best remote prefill worker and the second best of `rows` (count of them) into part[0] and
   part[1] (row -1, no tokens cached and infinite seconds for none); 0 when there is none. */
static int best_prefill(const Fleet *f, int64_t *rows, Py_ssize_t count, int prune, Scratch *scratch, Prefiller part[2]) {
    const int slow = any_slow(f, rows, count);
    if (prune) {
        Steps s = NO_STEPS;
        for (Py_ssize_t k = 0; k < count; k++) scratch->keys[k] = prefiller_at(f, rows[k], slow, &s).spent;
        count = can_win(f, rows, count, 1, 2, scratch);
    }
    if (count == 0) return 0;
    const Prefiller none = {.row = -1, .total = INFINITY, .spent = INFINITY, .computed = f->P};
    part[0] = part[1] = none;
    Steps s = NO_STEPS;
    for (Py_ssize_t k = 0; k < count; k++) {
        const Prefiller here = prefiller_at(f, rows[k], slow, &s);
        if (part[0].row < 0 || prefill_before(f, here.spent, here.row, part[0].spent, part[0].row)) part[1] = part[0], part[0] = here;
        else if (part[1].row < 0 || prefill_before(f, here.spent, here.row, part[1].spent, part[1].row)) part[1] = here;
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

/* A decode row's placements, each priced as the choice reads it: the pruning's keys and the
   candidate's own choice come from this one computation, so they agree to the last bit. */
typedef struct {
    int64_t own, gain; /* blocks the row holds of the prompt (at most max_blocks), blocks a fetch adds */
    double load_s, per_work;
    Prefill here;         /* prefilling after its own blocks */
    double local, cost;   /* its TTFT (calibrated) and what its compute costs the others */
    Prefill fetched;      /* after fetching `gain` blocks (gain > 0) */
    double f_move, f_ttft, f_cost;
    const Prefiller *p;   /* the remote prefill worker it would use (has_part) */
    double tail_at, tail_step, remote_ttft, remote_cost;
} Options;

typedef struct {
    const int64_t *source; /* best_two's answer */
    const Prefiller *part; /* best_prefill's answer, or NULL: no remote prefill */
    int slow;
    /* chunked_parts' answers kept for the next row asking the same: a prompt's prefill after
       none of it (most rows) apart from after a holder's blocks, so that the two do not evict
       each other row after row */
    Steps none, own, fetched, tail;
} Pricing;

static inline void options_at(const Fleet *restrict f, Py_ssize_t r, Pricing *restrict g, Options *restrict o) {
    const int64_t matched = MATCHED(f, r);
    o->own = min_i(matched, f->max_blocks);
    o->load_s = load_seconds(f, r, o->own, g->slow);
    o->per_work = cost_per_work_s(f, r);
    o->here = prefill_at(f, r, o->own * f->bs, o->load_s, o->own == 0 ? &g->none : &g->own);
    o->local = o->here.ttft + f->off[0], o->cost = o->here.work * o->per_work;
    o->gain = 0;
    if (g->source[0] >= 0) {
        const int is_first = r == g->source[0];
        o->gain = max_i((is_first ? g->source[3] : g->source[2]) - o->own, 0);
        if (o->gain > 0) {
            o->f_move = fetch_move(f, r, o->load_s, o->gain);
            o->fetched = prefill_at(f, r, (o->own + o->gain) * f->bs, o->f_move, &g->fetched);
            o->f_ttft = o->fetched.ttft + f->off[0], o->f_cost = o->fetched.work * o->per_work;
        }
    }
    if (g->part != NULL) {
        o->p = &g->part[r == g->part[0].row]; /* the best prefill worker decoding: the second best prefills */
        remote_start_and_tail(f, r, matched, o->p->total, &g->tail, &o->tail_at, &o->tail_step);
        o->remote_ttft = o->tail_at + o->tail_step + f->off[1];
        o->remote_cost = o->p->work * remote_per_work(f, o->p->row, o->per_work);
    }
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
    if (bufs->used == (int)(sizeof bufs->b / sizeof bufs->b[0])) {
        PyErr_Format(PyExc_SystemError, "%s: more buffers than Buffers holds", name);
        return NULL;
    }
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
    Scratch scratch = {0};
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
    scratch.keys = malloc(sizeof(double) * 6 * (most + 1));
    scratch.heap = malloc(sizeof(double) * (most + 1));
    scratch.wins = malloc(most + 1);
    scratch.class_of = malloc(sizeof(Py_ssize_t) * (most + 1));
    scratch.order = malloc(sizeof(Py_ssize_t) * 2 * (most + 1)); /* positions by class, then the holders' */
    scratch.start = malloc(sizeof(Py_ssize_t) * (most + 2));
    scratch.slots = malloc(sizeof(Py_ssize_t) * 4 * (most + 1)); /* a power of 2 of at least twice the rows */
    rows = malloc(sizeof(int64_t) * (num_decode + 1));
    prefill = malloc(sizeof(int64_t) * (num_prefill + 1));
    if (!scratch.keys || !scratch.heap || !scratch.wins || !scratch.class_of || !scratch.order || !scratch.start || !scratch.slots || !rows ||
        !prefill) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < num_decode; k++) rows[k] = decode[k];
    for (Py_ssize_t k = 0; k < num_prefill; k++) prefill[k] = prefill_in[k];

    int64_t source[4] = {-1, -1, 0, 0};
    if (f.device != NULL) best_two(&f, source_rows, num_source, source);
    Prefiller part[2];
    const int has_part = num_prefill > 0 && best_prefill(&f, prefill, num_prefill, prune, &scratch, part);
    Pricing g = {.source = source, .part = has_part ? part : NULL, .slow = any_slow(&f, rows, num_decode),
                 .none = NO_STEPS, .own = NO_STEPS, .fetched = NO_STEPS, .tail = NO_STEPS};
    Options o;

    Py_ssize_t count = num_decode;
    if (prune && count > limit) {
        /* Per candidate: its TTFT and its TTFT + cost prefilling locally or after a fetch, and
           after the best remote prefill; its batch's step orders its TPOT (seconds.py's docstring). */
        double *alone = scratch.keys, *alone_ttft = alone + count, *step = alone + 2 * count, *next = alone + 3 * count;
        double *stretched = f.inflow != NULL ? next : NULL, *remote = has_part ? next + (f.inflow != NULL) * count : NULL;
        double *remote_spent = remote != NULL ? remote + count : NULL;
        const int num_keys = 3 + (stretched != NULL) + 2 * (remote != NULL);
        for (Py_ssize_t k = 0; k < count; k++) {
            const Py_ssize_t r = rows[k];
            options_at(&f, r, &g, &o);
            double t = o.local, a = o.local + o.cost;
            if (o.gain > 0) t = min_nan(t, o.f_ttft), a = min_nan(a, o.f_ttft + o.f_cost);
            alone[k] = a, alone_ttft[k] = t;
            step[k] = COL(&f, PER_STEP, r);
            if (stretched != NULL) stretched[k] = token_seconds(&f, r, step[k]);
            if (remote != NULL) remote[k] = o.remote_ttft, remote_spent[k] = o.remote_ttft + o.remote_cost;
        }
        count = can_win(&f, rows, count, num_keys, limit, &scratch);
    }

    for (Py_ssize_t k = 0; k < count; k++) {
        const Py_ssize_t r = rows[k];
        options_at(&f, r, &g, &o);
        const int64_t cached_tok = o.own * bs;
        const double tpot = token_seconds(&f, r, COL(&f, PER_STEP, r) + COL(&f, C3, r) + COL(&f, C4, r) * f.tokens_x) + f.off[2];
        double local = o.local, cost = o.cost;
        int64_t computed = P - cached_tok, fetch_blocks = 0, source_row = -1, prefill_row = -1, kind = LOCAL;
        double move = o.load_s, prefill_k = o.here.prefill, transfer = 0.0, queue_k = SEC(&f, S_QUEUE, r);
        if (o.gain > 0 && beats(&f, tpot, o.f_ttft, o.f_ttft + o.f_cost, local, local + cost)) {
            cost = o.f_cost, computed = P - (o.own + o.gain) * bs, local = o.f_ttft;
            kind = FETCH, move = o.f_move, prefill_k = o.fetched.prefill, fetch_blocks = o.gain;
            source_row = r == source[0] ? source[1] : source[0];
        }
        if (!allow_local) kind = REMOTE; /* no local placement: priced at infinite TTFT */
        double ttft = allow_local ? local : INFINITY;
        if (has_part && beats(&f, tpot, o.remote_ttft, o.remote_ttft + o.remote_cost, ttft, ttft + cost)) {
            const double best = o.p->total;
            ttft = o.remote_ttft, cost = o.remote_cost, computed = o.p->computed;
            transfer = (isfinite(best) ? o.tail_at - best : 0.0) + o.tail_step;
            kind = REMOTE, queue_k = o.p->queue, move = o.p->load, prefill_k = o.p->compute;
            fetch_blocks = 0, source_row = -1, prefill_row = o.p->row;
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
    free(scratch.keys), free(scratch.heap), free(scratch.wins), free(scratch.class_of), free(scratch.order), free(scratch.start);
    free(scratch.slots), free(rows), free(prefill);
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
