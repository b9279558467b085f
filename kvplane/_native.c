/* Compiled kernels of the routing path (kvplane/native.py loads them; each has a pure Python
 * twin that is the reference and the fallback, and tests hold the two equal).
 *
 *   prefix_groups(masks, block_hashes) -> [(length, [bit, ...]), ...]
 *       index.drop_outs(index.running_and(masks, block_hashes)) in one pass: AND each block's
 *       holder mask (a Python int, one bit per worker) into a running mask of fixed-size digits,
 *       and list the bits that drop out at each block. The Python version allocates a new
 *       thousand-bit int per block; this allocates only the answer.
 *   pack_uint32(token_ids, count) -> bytes
 *       The first `count` token ids as little-endian uint32 (array("I", ...).tobytes()).
 *
 * Reads Python ints' digits directly (CPython's layout, 3.11 to 3.13); setup.py builds this only
 * on CPython.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <math.h>
#include <string.h>

#if PY_VERSION_HEX >= 0x030C0000
/* 3.12+: sign and digit count in lv_tag. */
static inline Py_ssize_t long_ndigits(PyObject *v, int *negative) {
    uintptr_t tag = ((PyLongObject *)v)->long_value.lv_tag;
    *negative = (tag & 3) == 2;
    return (Py_ssize_t)(tag >> 3);
}
static inline const digit *long_digits(PyObject *v) { return ((PyLongObject *)v)->long_value.ob_digit; }
#else
static inline Py_ssize_t long_ndigits(PyObject *v, int *negative) {
    Py_ssize_t size = Py_SIZE(v);
    *negative = size < 0;
    return size < 0 ? -size : size;
}
static inline const digit *long_digits(PyObject *v) { return ((PyLongObject *)v)->ob_digit; }
#endif

/* Append (length, [positions of the set bits of d[0:n]]) to out. */
static int append_group(PyObject *out, Py_ssize_t length, const digit *d, Py_ssize_t n) {
    Py_ssize_t count = 0;
    for (Py_ssize_t k = 0; k < n; k++) count += __builtin_popcount((unsigned int)d[k]);
    PyObject *bits = PyList_New(count);
    if (bits == NULL) return -1;
    Py_ssize_t j = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        unsigned int w = (unsigned int)d[k];
        while (w) {
            PyObject *bit = PyLong_FromSsize_t(k * PyLong_SHIFT + __builtin_ctz(w));
            if (bit == NULL) {
                Py_DECREF(bits);
                return -1;
            }
            PyList_SET_ITEM(bits, j++, bit);
            w &= w - 1;
        }
    }
    PyObject *group = Py_BuildValue("(nN)", length, bits);
    if (group == NULL) return -1;
    int rc = PyList_Append(out, group);
    Py_DECREF(group);
    return rc;
}

/* The holder mask of block i, or NULL with no error set when the block is not in masks. */
static int mask_of(PyObject *masks, PyObject *block_hash, PyObject **mask) {
    *mask = PyDict_GetItemWithError(masks, block_hash); /* borrowed */
    if (*mask == NULL) return PyErr_Occurred() ? -1 : 0;
    if (!PyLong_Check(*mask)) {
        PyErr_Format(PyExc_TypeError, "a holder mask must be an int, got %.100s", Py_TYPE(*mask)->tp_name);
        return -1;
    }
    int negative;
    long_ndigits(*mask, &negative);
    if (negative) {
        PyErr_SetString(PyExc_ValueError, "a holder mask must not be negative");
        return -1;
    }
    return 0;
}

static PyObject *prefix_groups(PyObject *self, PyObject *args) {
    PyObject *masks, *hashes;
    if (!PyArg_ParseTuple(args, "O!O:prefix_groups", &PyDict_Type, &masks, &hashes)) return NULL;
    PyObject *seq = PySequence_Fast(hashes, "block_hashes must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(0);
    digit *running = NULL, *next = NULL;
    if (out == NULL) goto fail;
    if (n == 0) goto done;

    PyObject *mask;
    if (mask_of(masks, items[0], &mask) < 0) goto fail;
    if (mask == NULL) goto done;
    int negative;
    Py_ssize_t width = long_ndigits(mask, &negative); /* ANDs only shrink: the first mask bounds the width */
    if (width == 0) goto done;
    running = PyMem_New(digit, width);
    next = PyMem_New(digit, width);
    if (running == NULL || next == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    memcpy(running, long_digits(mask), width * sizeof(digit));

    Py_ssize_t i = 1;
    for (; i < n; i++) {
        if (mask_of(masks, items[i], &mask) < 0) goto fail;
        Py_ssize_t m = 0;
        if (mask != NULL) {
            m = long_ndigits(mask, &negative);
            if (m > width) m = width;
            const digit *d = long_digits(mask);
            for (Py_ssize_t k = 0; k < m; k++) next[k] = running[k] & d[k];
        }
        int changed = 0;
        for (Py_ssize_t k = 0; k < width; k++) {
            digit kept = k < m ? next[k] : 0;
            if (kept != running[k]) {
                changed = 1;
                next[k] = running[k] & ~kept; /* the bits that drop out at block i */
                running[k] = kept;
            } else {
                next[k] = 0;
            }
        }
        if (changed && append_group(out, i, next, width) < 0) goto fail;
        while (width > 0 && running[width - 1] == 0) width--;
        if (width == 0) goto done; /* nobody holds blocks 0..i */
    }
    if (append_group(out, n, running, width) < 0) goto fail;
done:
    PyMem_Free(running);
    PyMem_Free(next);
    Py_DECREF(seq);
    return out;
fail:
    PyMem_Free(running);
    PyMem_Free(next);
    Py_DECREF(seq);
    Py_XDECREF(out);
    return NULL;
}

static PyObject *pack_uint32(PyObject *self, PyObject *args) {
    PyObject *tokens;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "On:pack_uint32", &tokens, &count)) return NULL;
    PyObject *seq = PySequence_Fast(tokens, "token_ids must be a sequence");
    if (seq == NULL) return NULL;
    if (count < 0 || count > PySequence_Fast_GET_SIZE(seq)) {
        PyErr_Format(PyExc_ValueError, "count %zd is outside 0..%zd", count, PySequence_Fast_GET_SIZE(seq));
        Py_DECREF(seq);
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, count * 4);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < count; i++) {
        unsigned long v;
        if (PyLong_Check(items[i])) {
            v = PyLong_AsUnsignedLong(items[i]);
        } else { /* an int-like (numpy's integers): as array("I") takes it */
            PyObject *index = PyNumber_Index(items[i]);
            if (index == NULL) goto bad;
            v = PyLong_AsUnsignedLong(index);
            Py_DECREF(index);
        }
        if (v == (unsigned long)-1 && PyErr_Occurred()) goto bad;
        if (v > 0xFFFFFFFFUL) {
            PyErr_Format(PyExc_OverflowError, "token id %lu at position %zd does not fit in uint32", v, i);
            goto bad;
        }
        p[4 * i] = v & 0xFF;
        p[4 * i + 1] = (v >> 8) & 0xFF;
        p[4 * i + 2] = (v >> 16) & 0xFF;
        p[4 * i + 3] = (v >> 24) & 0xFF;
    }
    Py_DECREF(seq);
    return out;
bad:
    Py_DECREF(seq);
    Py_DECREF(out);
    return NULL;
}


/* ---- column kernels: numpy arrays through the buffer protocol (no numpy headers) ---- */

typedef struct {
    Py_buffer view;
    Py_ssize_t n;
    int held;
} column;

/* A C-contiguous 1-d array of 8-byte items of `kind` ('i': int64, 'd': float64). */
static int column_get(PyObject *obj, char kind, int writable, const char *name, column *c) {
    c->held = 0;
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &c->view, flags) < 0) return -1;
    c->held = 1;
    const char *f = c->view.format ? c->view.format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    int ok = c->view.ndim == 1 && c->view.itemsize == 8 && f[1] == '\0' &&
             (kind == 'd' ? f[0] == 'd' : (f[0] == 'l' || f[0] == 'q'));
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s must be a 1-d contiguous %s array", name, kind == 'd' ? "float64" : "int64");
        return -1;
    }
    c->n = c->view.shape[0];
    return 0;
}

static void column_release(column *c) {
    if (c->held) PyBuffer_Release(&c->view);
    c->held = 0;
}

#define I64(c) ((const int64_t *)(c).view.buf)
#define F64(c) ((const double *)(c).view.buf)

/* Columns o[0..count) into c: kinds[k] 'i' int64 / 'd' float64 as column_get takes them, modes[k]
 * 'r' read, 'w' written, 'n' read or None, 'o' written or None (None: not held). Every c[k] is
 * left releasable. */
static int columns_get(PyObject *const *o, int count, const char *const *names, const char *kinds, const char *modes, column *c) {
    for (int k = 0; k < count; k++) c[k].held = 0;
    for (int k = 0; k < count; k++) {
        if ((modes[k] == 'n' || modes[k] == 'o') && o[k] == Py_None) continue;
        if (column_get(o[k], kinds[k], modes[k] == 'w' || modes[k] == 'o', names[k], &c[k]) < 0) return -1;
    }
    return 0;
}

static void columns_release(column *c, int count) {
    for (int k = 0; k < count; k++) column_release(&c[k]);
}

/* Every held column of c[from..to] has n entries; else ValueError by `format` (name, its length, n). */
static int lengths_are(const column *c, int from, int to, Py_ssize_t n, const char *const *names, const char *format) {
    for (int k = from; k <= to; k++)
        if (c[k].held && c[k].n != n) {
            PyErr_Format(PyExc_ValueError, format, names[k], c[k].n, n);
            return -1;
        }
    return 0;
}

/* Every row index in range of the columns (n rows). */
static int rows_valid(const column *rows, Py_ssize_t n, const char *name) {
    const int64_t *r = I64(*rows);
    for (Py_ssize_t i = 0; i < rows->n; i++) {
        if (r[i] < 0 || r[i] >= n) {
            PyErr_Format(PyExc_IndexError, "%s[%zd] = %lld is not a row of the %zd-row columns", name, i, (long long)r[i], n);
            return -1;
        }
    }
    return 0;
}

static inline int64_t floor_div(int64_t a, int64_t b) { /* Python's // */
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

/* price_rows(queued, used, block_size, rows, matched, credit, num_prompt_tokens,
 *            prefill_load_scale, cost_out, cached_out): cost.price's arithmetic, per row
 * (matched and credit are per row; None: 0). */
static PyObject *price_rows(PyObject *self, PyObject *args) {
    PyObject *o[8];
    long long prompt;
    double scale;
    if (!PyArg_ParseTuple(args, "OOOOOOLdOO:price_rows", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &prompt, &scale, &o[6], &o[7]))
        return NULL;
    static const char *names[8] = {"queued", "used", "block_size", "rows", "matched", "credit", "cost_out", "cached_out"};
    column c[8];
    int ok = 0;
    if (columns_get(o, 8, names, "iiiiiddi", "rrrrnnww", c) < 0) goto end;
    Py_ssize_t n = c[0].n, m = c[3].n;
    if (lengths_are(c, 1, 2, n, names, "%s has %zd rows, queued %zd") < 0) goto end;
    if (lengths_are(c, 4, 7, m, names, "%s has %zd entries for %zd rows") < 0) goto end;
    if (rows_valid(&c[3], n, "rows") < 0) goto end;
    const int64_t *queued = I64(c[0]), *used = I64(c[1]), *bs = I64(c[2]), *rows = I64(c[3]);
    const int64_t *matched = c[4].held ? I64(c[4]) : NULL;
    const double *credit = c[5].held ? F64(c[5]) : NULL;
    double *cost = (double *)c[6].view.buf;
    int64_t *cached = (int64_t *)c[7].view.buf;
    for (Py_ssize_t i = 0; i < m; i++) {
        int64_t r = rows[i], b = bs[r];
        if (b <= 0) {
            PyErr_Format(PyExc_ValueError, "row %lld has block_size %lld", (long long)r, (long long)b);
            goto end;
        }
        int64_t prompt_blocks = -floor_div(-(int64_t)prompt, b);
        int64_t queued_blocks = -floor_div(-queued[r], b);
        double uncovered = (double)(queued_blocks + prompt_blocks) - (credit ? credit[i] : 0.0);
        cost[i] = scale * (uncovered > 0.0 ? uncovered : 0.0) + (double)used[r];
        int64_t most = floor_div((int64_t)prompt - 1, b), held = matched ? matched[i] : 0;
        cached[i] = (held < most ? held : most) * b;
    }
    ok = 1;
end:
    columns_release(c, 8);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* The k-th smallest of v[0..n) (0-based; v reordered): Hoare's selection. */
static double kth_smallest(double *v, Py_ssize_t n, Py_ssize_t k) {
    Py_ssize_t lo = 0, hi = n - 1;
    while (lo < hi) {
        double pivot = v[lo + (hi - lo) / 2];
        Py_ssize_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] < pivot) i++;
            while (v[j] > pivot) j--;
            if (i <= j) {
                double t = v[i];
                v[i] = v[j];
                v[j] = t;
                i++;
                j--;
            }
        }
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else return v[k];
    }
    return v[k];
}

/* cheapest_rows(queued, used, block_size, rows, prefill_load_scale, limit, out) -> count:
 * cost.cheapest_uncached: of `rows`, those whose load cost (scale x queued blocks + used blocks)
 * is at most the limit-th smallest, in their order, into out[0..count). */
static PyObject *cheapest_rows(PyObject *self, PyObject *args) {
    PyObject *o[5];
    double scale;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "OOOOdnO:cheapest_rows", &o[0], &o[1], &o[2], &o[3], &scale, &limit, &o[4])) return NULL;
    static const char *names[5] = {"queued", "used", "block_size", "rows", "out"};
    column c[5];
    double *cost = NULL, *work = NULL;
    Py_ssize_t count = 0;
    int ok = 0;
    if (columns_get(o, 5, names, "iiiii", "rrrrw", c) < 0) goto end;
    Py_ssize_t n = c[0].n, m = c[3].n;
    if (lengths_are(c, 1, 2, n, names, "%s has %zd rows, queued %zd") < 0) goto end;
    if (lengths_are(c, 4, 4, m, names, "%s has %zd entries for %zd rows") < 0) goto end;
    if (limit < 1 || limit > m) {
        PyErr_Format(PyExc_ValueError, "limit %zd is not between 1 and the %zd rows", limit, m);
        goto end;
    }
    if (rows_valid(&c[3], n, "rows") < 0) goto end;
    const int64_t *queued = I64(c[0]), *used = I64(c[1]), *bs = I64(c[2]), *rows = I64(c[3]);
    int64_t *out = (int64_t *)c[4].view.buf;
    cost = PyMem_Malloc(2 * (size_t)m * sizeof(double));
    if (cost == NULL) {
        PyErr_NoMemory();
        goto end;
    }
    work = cost + m;
    for (Py_ssize_t i = 0; i < m; i++) {
        int64_t r = rows[i];
        if (bs[r] <= 0) {
            PyErr_Format(PyExc_ValueError, "row %lld has block_size %lld", (long long)r, (long long)bs[r]);
            goto end;
        }
        cost[i] = work[i] = scale * (double)(-floor_div(-queued[r], bs[r])) + (double)used[r];
    }
    double cutoff = kth_smallest(work, m, limit - 1);
    for (Py_ssize_t i = 0; i < m; i++)
        if (cost[i] <= cutoff) out[count++] = rows[i];
    ok = 1;
end:
    PyMem_Free(cost);
    columns_release(c, 5);
    if (!ok) return NULL;
    return PyLong_FromSsize_t(count);
}

/* ---- overlap scores: the numbers pricing reads from each candidate's score ---- */

static PyObject *s_num_blocks, *s_blocks_by_tier;

typedef struct {
    PyObject *score; /* borrowed: the caller's sequence holds it for the call */
    int64_t matched;
    double credit;
} score_numbers;

/* One score's numbers: num_blocks and the credit, weights[tier] x blocks summed over
 * blocks_by_tier in its order, tiers with no blocks skipped (cost._raw_credit). */
static int read_score(PyObject *score, PyObject *weights, score_numbers *out) {
    PyObject *v = PyObject_GetAttr(score, s_num_blocks);
    if (v == NULL) return -1;
    out->matched = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (out->matched == -1 && PyErr_Occurred()) return -1;
    PyObject *tiers = PyObject_GetAttr(score, s_blocks_by_tier);
    if (tiers == NULL) return -1;
    PyObject *items = PyMapping_Items(tiers);
    Py_DECREF(tiers);
    if (items == NULL) return -1;
    double credit = 0.0;
    int ok = 0;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(items); k++) {
        PyObject *item = PyList_GET_ITEM(items, k);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(PyExc_TypeError, "blocks_by_tier items must be (tier, count) pairs");
            goto end;
        }
        long long count = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 1));
        if (count == -1 && PyErr_Occurred()) goto end;
        if (count == 0) continue;
        PyObject *weight = PyDict_GetItemWithError(weights, PyTuple_GET_ITEM(item, 0));
        if (weight == NULL) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_KeyError, "no credit weight for tier %R", PyTuple_GET_ITEM(item, 0));
            goto end;
        }
        double w = PyFloat_AsDouble(weight);
        if (w == -1.0 && PyErr_Occurred()) goto end;
        credit += w * (double)count;
    }
    out->credit = credit;
    out->score = score;
    ok = 1;
end:
    Py_DECREF(items);
    return ok ? 0 : -1;
}

#define SCORE_MEMO 64 /* direct-mapped by address: a score met again is read once */

/* score_columns(scores, weights, matched_out, credit_out): for each of `scores` (an
 * OverlapScore or None: 0), its num_blocks and credit: cost.price's per-row numbers.
 * weights: {tier: credit weight}. */
static PyObject *score_columns(PyObject *self, PyObject *args) {
    PyObject *scores, *weights, *o[2];
    if (!PyArg_ParseTuple(args, "OO!OO:score_columns", &scores, &PyDict_Type, &weights, &o[0], &o[1])) return NULL;
    if (s_num_blocks == NULL) {
        s_num_blocks = PyUnicode_InternFromString("num_blocks");
        s_blocks_by_tier = PyUnicode_InternFromString("blocks_by_tier");
        if (!s_num_blocks || !s_blocks_by_tier) return NULL;
    }
    static const char *names[2] = {"matched_out", "credit_out"};
    column c[2];
    int ok = 0;
    PyObject *seq = PySequence_Fast(scores, "scores must be a list or tuple");
    if (seq == NULL) return NULL;
    if (columns_get(o, 2, names, "id", "ww", c) < 0) goto end;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (lengths_are(c, 0, 1, n, names, "%s has %zd entries for %zd scores") < 0) goto end;
    int64_t *matched = (int64_t *)c[0].view.buf;
    double *credit = (double *)c[1].view.buf;
    score_numbers memo[SCORE_MEMO];
    memset(memo, 0, sizeof memo);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *score = items[i];
        if (score == Py_None) {
            matched[i] = 0;
            credit[i] = 0.0;
            continue;
        }
        score_numbers *m = &memo[((uintptr_t)score >> 4) % SCORE_MEMO];
        if (m->score != score && read_score(score, weights, m) < 0) {
            m->score = NULL;
            goto end;
        }
        matched[i] = m->matched;
        credit[i] = m->credit;
    }
    ok = 1;
end:
    columns_release(c, 2);
    Py_DECREF(seq);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* ---- predicted prefixes: per-block counts of a worker's live records, and the block masks ---- */

/* refs_add(mask, refs, block_hashes, flag): predictions._count_in. Each block's count in refs
 * goes up by one; a block new there gets `flag` (the worker's bit) in its mask. */
static PyObject *refs_add(PyObject *self, PyObject *args) {
    PyObject *mask, *refs, *hashes, *flag;
    if (!PyArg_ParseTuple(args, "O!O!OO!:refs_add", &PyDict_Type, &mask, &PyDict_Type, &refs, &hashes, &PyLong_Type, &flag)) return NULL;
    PyObject *seq = PySequence_Fast(hashes, "block_hashes must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *h = items[i], *count = PyDict_GetItemWithError(refs, h), *value;
        if (count == NULL) {
            if (PyErr_Occurred()) goto fail;
            PyObject *held = PyDict_GetItemWithError(mask, h);
            if (held == NULL && PyErr_Occurred()) goto fail;
            value = held == NULL ? Py_NewRef(flag) : PyNumber_Or(held, flag);
            if (value == NULL) goto fail;
            int rc = PyDict_SetItem(mask, h, value);
            Py_DECREF(value);
            if (rc < 0) goto fail;
            value = PyLong_FromLong(1);
        } else {
            long c = PyLong_AsLong(count);
            if (c == -1 && PyErr_Occurred()) goto fail;
            value = PyLong_FromLong(c + 1);
        }
        if (value == NULL) goto fail;
        int rc = PyDict_SetItem(refs, h, value);
        Py_DECREF(value);
        if (rc < 0) goto fail;
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

/* refs_remove(mask, refs, block_hashes, flag): predictions._count_out. Each block's count goes
 * down by one; at zero the block leaves refs and `flag` leaves its mask (the mask, once empty). */
static PyObject *refs_remove(PyObject *self, PyObject *args) {
    PyObject *mask, *refs, *hashes, *flag;
    if (!PyArg_ParseTuple(args, "O!O!OO!:refs_remove", &PyDict_Type, &mask, &PyDict_Type, &refs, &hashes, &PyLong_Type, &flag))
        return NULL;
    PyObject *seq = PySequence_Fast(hashes, "block_hashes must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *h = items[i], *count = PyDict_GetItemWithError(refs, h);
        if (count == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, h);
            goto fail;
        }
        long c = PyLong_AsLong(count);
        if (c == -1 && PyErr_Occurred()) goto fail;
        if (c > 1) {
            PyObject *value = PyLong_FromLong(c - 1);
            if (value == NULL) goto fail;
            int rc = PyDict_SetItem(refs, h, value);
            Py_DECREF(value);
            if (rc < 0) goto fail;
            continue;
        }
        if (PyDict_DelItem(refs, h) < 0) goto fail;
        PyObject *held = PyDict_GetItemWithError(mask, h);
        if (held == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, h);
            goto fail;
        }
        PyObject *remaining = PyNumber_Xor(held, flag); /* the bit is set: this record held the block */
        if (remaining == NULL) goto fail;
        int empty = PyObject_Not(remaining);
        int rc = empty ? PyDict_DelItem(mask, h) : PyDict_SetItem(mask, h, remaining);
        Py_DECREF(remaining);
        if (empty < 0 || rc < 0) goto fail;
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef methods[] = {
    {"prefix_groups", prefix_groups, METH_VARARGS,
     "prefix_groups(masks, block_hashes) -> [(length, [bit, ...])]: index.drop_outs(index.running_and(masks, block_hashes))"},
    {"pack_uint32", pack_uint32, METH_VARARGS, "pack_uint32(token_ids, count) -> bytes: the first count ids as little-endian uint32"},
    {"price_rows", price_rows, METH_VARARGS, "price_rows(queued, used, block_size, rows, matched, credit, num_prompt_tokens, prefill_load_scale, cost_out, cached_out): cost.price per row"},
    {"cheapest_rows", cheapest_rows, METH_VARARGS, "cheapest_rows(queued, used, block_size, rows, prefill_load_scale, limit, out) -> count: cost.cheapest_uncached's rows into out"},
    {"score_columns", score_columns, METH_VARARGS, "score_columns(scores, weights, matched_out, credit_out): cost.price's numbers of each overlap score (None: 0)"},
    {"refs_add", refs_add, METH_VARARGS, "refs_add(mask, refs, block_hashes, flag): predictions._count_in"},
    {"refs_remove", refs_remove, METH_VARARGS, "refs_remove(mask, refs, block_hashes, flag): predictions._count_out"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kvplane._native", "Compiled kernels of the routing path.", -1, methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
