/* ssd_edge.native: what ssd-edge does in C, the module and its Python entry points. Each entry point reads
 * its arguments, calls the plain C of its part (native.h says which file does what) and hands back Python
 * objects; nothing below them touches one (but the row hook, row_hook.c).
 *
 * support, head, gumbel, draw, head_draws, masked_draw: sampling.py's and coupling.py's chain and draws on a
 * row (draws.c); top_ids, argmax, mask: a row's top-k, argmax and a grammar's mask (rows.c); steps: mode
 * ar's plain steps in one call, llama.cpp's functions by address (steps.c); row_hook_address: the C hook
 * that calls a Python callable (row_hook.c); spin, copy_rows, priced_choices: the priced backend's busy
 * wait, rows and language (priced.c).
 *
 * The calls on one row (argmax, top_ids, head, support, draw, masked_draw, mask) keep the interpreter's lock:
 * each takes 10-60 us, and releasing the lock for that long hands the interpreter to the other thread
 * (SSD's worker between two branch decodes) for as long as its Python runs, while the engine waits to get
 * it back; on the priced H200 a verify's draws took 1.6 ms instead of 0.4 that way. spin, copy_rows and
 * steps, which wait on a device, do its work or run whole decodes, release it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>

#include "native.h"

/* ---------------------------------------------------------------- a row (rows.c) */

/* argmax(row) -> int: np.argmax of a float32 row (argmax_core) */
static PyObject *argmax(PyObject *self, PyObject *args) {
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "y*", &buf)) return NULL;
    const Py_ssize_t n = buf.len / (Py_ssize_t)sizeof(float);
    float *bound = n >= 1 ? malloc((size_t)(n / GROUP + 1) * sizeof(float)) : NULL;
    if (bound == NULL) {
        PyBuffer_Release(&buf);
        if (n < 1) {
            PyErr_SetString(PyExc_ValueError, "argmax of an empty row");
            return NULL;
        }
        return PyErr_NoMemory();
    }
    const Py_ssize_t i = argmax_core((const float *)buf.buf, n, bound);
    free(bound);
    PyBuffer_Release(&buf);
    return PyLong_FromSsize_t(i);
}

/* mask(row, bits) -> None: a grammar's mask on a float32 row, in place (mask_core) */
static PyObject *mask(PyObject *self, PyObject *args) {
    Py_buffer row, bits;
    if (!PyArg_ParseTuple(args, "w*y*", &row, &bits)) return NULL;
    mask_core((float *)row.buf, row.len / (Py_ssize_t)sizeof(float), (const uint32_t *)bits.buf, bits.len / 4);
    PyBuffer_Release(&row);
    PyBuffer_Release(&bits);
    Py_RETURN_NONE;
}

/* top_ids(row, k) -> bytes: k int64 ids in sampling.top_ids' order, or None where the numpy path must decide
 * (topk_padded) */
static PyObject *top_ids(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "y*n", &buf, &k)) return NULL;
    Py_ssize_t n = buf.len / (Py_ssize_t)sizeof(float);
    if (k < 1 || k >= n) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "top_ids: need 1 <= k < len(row)");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, k * (Py_ssize_t)sizeof(int64_t));
    if (out == NULL) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    const int ok = topk_padded((const float *)buf.buf, n, k, (int64_t *)PyBytes_AS_STRING(out));
    PyBuffer_Release(&buf);
    if (ok == 1) return out;
    Py_DECREF(out);
    if (ok < 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* scan_width() -> 4 or 8: how wide the top-k pass tests values; scan_width(w) sets it (8 only where the
 * CPU has AVX; the tests run both) and returns the width before */
static PyObject *scan_width(PyObject *self, PyObject *args) {
    int want = 0;
    if (!PyArg_ParseTuple(args, "|i", &want)) return NULL;
    if (want && want != 4 && want != 8) {
        PyErr_SetString(PyExc_ValueError, "the width is 4 or 8");
        return NULL;
    }
    const int was = scan_width_now();
    const int set = want ? scan_width_set(want) : 0;
    if (set == -1) {
        PyErr_SetString(PyExc_ValueError, "built without the 8-wide pass (not x86-64 with GCC or Clang)");
        return NULL;
    }
    if (set == -2) {
        PyErr_SetString(PyExc_ValueError, "this CPU has no AVX: the pass is 4 wide");
        return NULL;
    }
    return PyLong_FromLong(was);
}

/* ---------------------------------------------------------------- draws (draws.c) */

/* A row's length in floats, checked against k and the temperature; -1 with a ValueError (the buffer
 * released) where they do not fit. */
static Py_ssize_t row_length(Py_buffer *buf, Py_ssize_t k, double temperature) {
    Py_ssize_t n = buf->len / (Py_ssize_t)sizeof(float);
    if (k < 1 || k >= n || temperature <= 0.0) {
        PyBuffer_Release(buf);
        PyErr_SetString(PyExc_ValueError, "need 1 <= k < len(row) and a temperature > 0");
        return -1;
    }
    return n;
}

/* What support() and head() hand back: (ids, p) as bytes where ok is 1, None where the numpy path must
 * decide (0), a MemoryError (-1). */
static PyObject *ids_and_probs(int ok, const int64_t *idx, const double *p, Py_ssize_t m) {
    if (ok < 0) return PyErr_NoMemory();
    if (ok == 0) Py_RETURN_NONE;
    PyObject *out = NULL;
    PyObject *ids = PyBytes_FromStringAndSize((const char *)idx, m * (Py_ssize_t)sizeof(int64_t));
    PyObject *ps = PyBytes_FromStringAndSize((const char *)p, m * (Py_ssize_t)sizeof(double));
    if (ids && ps) out = PyTuple_Pack(2, ids, ps);
    Py_XDECREF(ids);
    Py_XDECREF(ps);
    return out;
}

/* support(row, top_k, top_p, min_p, temperature) -> (ids bytes int64 ascending, p bytes float64) or None:
 * sampling.support for top_k > 0 (support_core). */
static PyObject *support(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t k;
    draw_spec d = {0};
    if (!PyArg_ParseTuple(args, "y*nddd", &buf, &k, &d.top_p, &d.min_p, &d.temperature)) return NULL;
    Py_ssize_t n = row_length(&buf, k, d.temperature);
    if (n < 0) return NULL;
    d.top_k = k;
    int64_t *idx;
    double *p;
    ptrdiff_t m = 0;
    const int ok = support_core((const float *)buf.buf, n, &d, &idx, &p, &m);
    PyObject *out = ids_and_probs(ok, idx, p, m);
    free(idx);
    free(p);
    PyBuffer_Release(&buf);
    return out;
}

/* head(row, k, temperature) -> (ids bytes int64, p bytes float64) or None: sampling.head_probs, the row's
 * k largest logits at the temperature, most likely first, normalised over those k (head_core) */
static PyObject *head(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t k;
    double temperature;
    if (!PyArg_ParseTuple(args, "y*nd", &buf, &k, &temperature)) return NULL;
    Py_ssize_t n = row_length(&buf, k, temperature);
    if (n < 0) return NULL;
    int64_t *idx = malloc((size_t)k * sizeof(int64_t));
    double *p = malloc((size_t)k * sizeof(double));
    const int ok = idx && p ? head_core((const float *)buf.buf, n, k, temperature, idx, p) : -1;
    PyObject *out = ids_and_probs(ok, idx, p, k);
    free(idx);
    free(p);
    PyBuffer_Release(&buf);
    return out;
}

/* head_draw(row, width, k_probs, m, cand_temperature, top_k, top_p, min_p, temperature, seed, position) ->
 * (token, ids bytes int64, p bytes float64) or None: a sampled draft step from one pass over its row. The row's
 * `width` largest (head_core, most likely first), the first m as the step's candidates with their probabilities
 * at cand_temperature over the first k_probs (sampling.head_probs's); the coupled draw at `position` from that
 * head (draw_core keyed to its ids: the whole row's draw, as head_draws, where width > top_k). None where the
 * numpy path must decide (ties, NaN). */
static PyObject *head_draw(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t width, k_probs, m, k;
    double cand_t;
    unsigned long long seed, position;
    draw_spec d;
    if (!PyArg_ParseTuple(args, "y*nnndndddKK", &buf, &width, &k_probs, &m, &cand_t, &k, &d.top_p, &d.min_p,
                          &d.temperature, &seed, &position)) return NULL;
    Py_ssize_t n = row_length(&buf, width, cand_t);
    if (n < 0) return NULL;
    if (m < 1 || k_probs < m || k_probs > width || k < 1 || k >= width || d.temperature <= 0.0) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "head_draw: need 1 <= m <= k_probs <= width, 1 <= top_k < width, T > 0");
        return NULL;
    }
    d.top_k = k;
    d.seed = seed;
    const float *x = (const float *)buf.buf;
    int64_t *idx = malloc((size_t)width * sizeof(int64_t));
    double *p = malloc((size_t)width * sizeof(double));
    float *head = malloc((size_t)width * sizeof(float));
    int64_t token = 0;
    int ok = idx && p && head ? head_core(x, n, width, cand_t, idx, p) : -1;
    if (ok == 1) {
        double total = 0.0;
        for (Py_ssize_t j = 0; j < k_probs; j++) total += p[j];
        for (Py_ssize_t j = 0; j < m; j++) p[j] /= total;
        for (Py_ssize_t j = 0; j < width; j++) head[j] = x[idx[j]];
        ok = draw_core(head, width, &d, position, idx, &token);
    }
    PyBuffer_Release(&buf);
    PyObject *out = NULL;
    if (ok == 1) {
        PyObject *pair = ids_and_probs(1, idx, p, m);
        if (pair != NULL) {
            out = Py_BuildValue("(LOO)", (long long)token, PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1));
            Py_DECREF(pair);
        }
    } else if (ok < 0) {
        PyErr_NoMemory();
    } else {
        out = Py_None;
        Py_INCREF(out);
    }
    free(idx);
    free(p);
    free(head);
    return out;
}

/* gumbel(ids bytes int64, p bytes float64, seed, position) -> the id maximising log p + G(seed, position, id),
 * the first of equals: coupling.gumbel_draw (gumbel_core) */
static PyObject *gumbel(PyObject *self, PyObject *args) {
    Py_buffer ids_buf, p_buf;
    unsigned long long seed, position;
    if (!PyArg_ParseTuple(args, "y*y*KK", &ids_buf, &p_buf, &seed, &position)) return NULL;
    Py_ssize_t m = ids_buf.len / (Py_ssize_t)sizeof(int64_t);
    if (m < 1 || p_buf.len != m * (Py_ssize_t)sizeof(double)) {
        PyBuffer_Release(&ids_buf);
        PyBuffer_Release(&p_buf);
        PyErr_SetString(PyExc_ValueError, "gumbel: ids and p must be as long, and not empty");
        return NULL;
    }
    const int64_t best = gumbel_core((const int64_t *)ids_buf.buf, (const double *)p_buf.buf, m, seed, position);
    PyBuffer_Release(&ids_buf);
    PyBuffer_Release(&p_buf);
    return PyLong_FromLongLong(best);
}

/* draw(row, top_k, top_p, min_p, temperature, seed, position) -> the coupled draw from the row's support, or
 * None (the numpy path decides): coupling.draw for top_k > 0, support_core then gumbel_core in one call
 * (draw_core) */
static PyObject *draw(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t k;
    unsigned long long seed, position;
    draw_spec d;
    if (!PyArg_ParseTuple(args, "y*ndddKK", &buf, &k, &d.top_p, &d.min_p, &d.temperature, &seed, &position))
        return NULL;
    Py_ssize_t n = row_length(&buf, k, d.temperature);
    if (n < 0) return NULL;
    d.top_k = k;
    d.seed = seed;
    int64_t best = 0;
    const int ok = draw_core((const float *)buf.buf, n, &d, position, NULL, &best);
    PyBuffer_Release(&buf);
    if (ok < 0) return PyErr_NoMemory();
    if (ok == 0) Py_RETURN_NONE;
    return PyLong_FromLongLong(best);
}

/* head_draws(ids, logits, width, top_k, top_p, min_p, temperature, seed, positions) -> bytes of int64 tokens or
 * None: coupling.head_draws for rows handed over as heads (head_draws_core); None where a row needs the
 * numpy path. */
static PyObject *head_draws(PyObject *self, PyObject *args) {
    Py_buffer ids_buf, logits_buf, pos_buf;
    Py_ssize_t width, k;
    unsigned long long seed;
    draw_spec d;
    if (!PyArg_ParseTuple(args, "y*y*nndddKy*", &ids_buf, &logits_buf, &width, &k, &d.top_p, &d.min_p,
                          &d.temperature, &seed, &pos_buf)) return NULL;
    d.top_k = k;
    d.seed = seed;
    const Py_ssize_t n = pos_buf.len / (Py_ssize_t)sizeof(int64_t);
    PyObject *out = NULL;
    if (width < 2 || k < 1 || k >= width || d.temperature <= 0.0
        || ids_buf.len != n * width * (Py_ssize_t)sizeof(int64_t)
        || logits_buf.len != n * width * (Py_ssize_t)sizeof(float)) {
        PyErr_SetString(PyExc_ValueError, "head_draws: need n heads of width ids and logits, 1 <= top_k < width");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    if (out == NULL) goto done;
    const int ok = head_draws_core((const int64_t *)ids_buf.buf, (const float *)logits_buf.buf,
                                   (const int64_t *)pos_buf.buf, n, width, &d, (int64_t *)PyBytes_AS_STRING(out));
    if (ok != 1) {
        Py_CLEAR(out);
        if (ok < 0) PyErr_NoMemory(); else out = Py_NewRef(Py_None);
    }
done:
    PyBuffer_Release(&ids_buf);
    PyBuffer_Release(&logits_buf);
    PyBuffer_Release(&pos_buf);
    return out;
}

/* masked_draw(row, mask, top_k, top_p, min_p, temperature, seed, position) -> the token, or None: the C loop's
 * draw under a grammar's mask (masked_draw_core; top_k 0: greedy). The row may be written (-inf). */
static PyObject *masked_draw(PyObject *self, PyObject *args) {
    Py_buffer buf, bits;
    Py_ssize_t k;
    unsigned long long seed, position;
    draw_spec d;
    if (!PyArg_ParseTuple(args, "w*y*ndddKK", &buf, &bits, &k, &d.top_p, &d.min_p, &d.temperature, &seed,
                          &position))
        return NULL;
    d.top_k = k;
    d.seed = seed;
    const Py_ssize_t n = buf.len / (Py_ssize_t)sizeof(float);
    float *bound = malloc((size_t)(n / GROUP + 1) * sizeof(float));
    int ok = -1;
    int64_t best = 0;
    if (bound != NULL && n > 0 && k >= 0 && k < n && (k == 0 || d.temperature > 0.0)) {
        ok = masked_draw_core((float *)buf.buf, n, (const uint32_t *)bits.buf, bits.len / 4, &d, position, bound,
                              &best);
    } else if (bound != NULL) {
        ok = -2;
    }
    free(bound);
    PyBuffer_Release(&buf);
    PyBuffer_Release(&bits);
    if (ok == -2) {
        PyErr_SetString(PyExc_ValueError, "masked_draw: need 0 <= top_k < len(row), and a temperature > 0 to sample");
        return NULL;
    }
    if (ok < 0) return PyErr_NoMemory();
    if (ok == 0) Py_RETURN_NONE;
    return PyLong_FromLongLong(best);
}

/* ---------------------------------------------------------------- plain steps (steps.c, row_hook.c) */

/* row_hook_address() -> the address of py_row_hook, for a StepsCall's row_hook (its user: id(callable)) */
static PyObject *row_hook_address(PyObject *self, PyObject *unused) {
    return PyLong_FromVoidPtr((void *)py_row_hook);
}

/* steps(call: StepsCall) -> (drawn, rc, in_decode_s, decoded, undecided): steps_core on the call, the
 * interpreter's lock released throughout. drawn: the tokens drawn; rc: llama_decode's code; undecided: 1
 * where the loop stopped at a row that is not the C pass's to draw; in_decode_s: the seconds inside
 * llama_decode and the logits read that synchronizes with it; decoded: decodes that ran. What the row
 * hook raised (a Ctrl-C included) is raised here, and nothing drawn counts. */
static PyObject *steps(PyObject *self, PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) return NULL;
    if (buf.len != (Py_ssize_t)sizeof(steps_call)) {
        PyErr_Format(PyExc_ValueError, "steps: a call of %zd bytes, not %zd (StepsCall and native.h's steps_call "
                     "differ)", buf.len, (Py_ssize_t)sizeof(steps_call));
        PyBuffer_Release(&buf);
        return NULL;
    }
    steps_call c;  /* a copy: the caller's struct is free again once parsed */
    memcpy(&c, buf.buf, sizeof c);
    PyBuffer_Release(&buf);
    if (c.batch_size != (int64_t)sizeof(llama_batch_t)) {
        PyErr_Format(PyExc_ValueError, "steps: llama_batch is %lld bytes in llama_cpp, %zd in native.h",
                     (long long)c.batch_size, (Py_ssize_t)sizeof(llama_batch_t));
        return NULL;
    }
    const int64_t k = c.draw.top_k;
    if (!c.decode || !c.get_logits || !c.is_eog || !c.ctx || !c.batch || c.n_vocab < 1 || c.most < 1 || k < 0 ||
        k >= c.n_vocab || (k > 0 && !(c.draw.temperature > 0.0))) {
        PyErr_SetString(PyExc_ValueError, "steps: null function or context, an empty vocabulary, most < 1, or "
                                          "top_k outside 0..n_vocab-1 (or a sampled draw at temperature <= 0)");
        return NULL;
    }
    int32_t *drawn = malloc((size_t)c.most * sizeof(int32_t));
    float *bound = malloc((size_t)(c.n_vocab / GROUP + 1) * sizeof(float));
    if (drawn == NULL || bound == NULL) {
        free(drawn);
        free(bound);
        return PyErr_NoMemory();
    }
    steps_out o;
    Py_BEGIN_ALLOW_THREADS
    steps_core(&c, drawn, bound, &o);
    Py_END_ALLOW_THREADS
    free(bound);
    if (o.hook_failed) {  /* what the hook raised (a Ctrl-C included) is the caller's; nothing drawn counts */
        free(drawn);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "steps: the row hook failed");
        return NULL;
    }
    PyObject *list = PyList_New(o.n);
    if (list == NULL) {
        free(drawn);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < o.n; i++) {
        PyObject *v = PyLong_FromLong(drawn[i]);
        if (v == NULL) {
            Py_DECREF(list);
            free(drawn);
            return NULL;
        }
        PyList_SET_ITEM(list, i, v);
    }
    free(drawn);
    return Py_BuildValue("(Nidni)", list, o.rc, o.in_decode, (Py_ssize_t)o.decoded, o.status != 1);
}

/* ---------------------------------------------------------------- the priced backend (priced.c) */

/* spin(seconds[, flag[, word]]) -> False if the byte at address flag turned non-zero first (an abort), else
 * True: the priced backend's wait, with the interpreter's lock released (spin_core); a word (not 0) is bumped
 * once the lock is released (wake.c: the priced target's decode wakes SSD's draft side as it starts) */
static PyObject *spin(PyObject *self, PyObject *args) {
    double seconds;
    unsigned long long flag = 0, word = 0;
    if (!PyArg_ParseTuple(args, "d|KK", &seconds, &flag, &word)) return NULL;
    int waited;
    Py_BEGIN_ALLOW_THREADS
    if (word) wake_bump_core((uint32_t *)(uintptr_t)word);
    waited = spin_core(seconds, (const volatile char *)(uintptr_t)flag);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(waited);
}

/* ---------------------------------------------------------------- the draft side's wake (wake.c) */

/* wake_bump(word): the 32-bit word at that address + 1, its waiters woken */
static PyObject *wake_bump(PyObject *self, PyObject *args) {
    unsigned long long word;
    if (!PyArg_ParseTuple(args, "K", &word)) return NULL;
    wake_bump_core((uint32_t *)(uintptr_t)word);
    Py_RETURN_NONE;
}

/* wake_await(word, seen, spin_s, timeout_s) -> True once the word differs from seen, False after timeout_s;
 * the interpreter's lock released while it waits */
static PyObject *wake_await(PyObject *self, PyObject *args) {
    unsigned long long word;
    unsigned int seen;
    double spin_s, timeout_s;
    if (!PyArg_ParseTuple(args, "KIdd", &word, &seen, &spin_s, &timeout_s)) return NULL;
    int moved;
    Py_BEGIN_ALLOW_THREADS
    moved = wake_await_core((uint32_t *)(uintptr_t)word, (uint32_t)seen, spin_s, timeout_s);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(moved);
}

/* decode_woken(decode, ctx, batch, batch_size, word) -> llama_decode(ctx, *batch)'s code, the word bumped
 * first, both with the interpreter's lock released (a target's decode that wakes SSD's draft side) */
static PyObject *decode_woken(PyObject *self, PyObject *args) {
    unsigned long long fn, ctx, batch, word;
    long long size;
    if (!PyArg_ParseTuple(args, "KKKLK", &fn, &ctx, &batch, &size, &word)) return NULL;
    if (size != (long long)sizeof(llama_batch_t) || !fn || !ctx || !batch) {
        PyErr_SetString(PyExc_ValueError, "decode_woken: a llama_batch of another layout, or a null pointer");
        return NULL;
    }
    int32_t rc;
    Py_BEGIN_ALLOW_THREADS
    if (word) wake_bump_core((uint32_t *)(uintptr_t)word);
    rc = ((decode_fn)(uintptr_t)fn)((void *)(uintptr_t)ctx, *(llama_batch_t *)(uintptr_t)batch);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

/* copy_rows(out, src, index, width): out's row i = src's row index[i] (float32 rows of `width`), with the
 * interpreter's lock released: the priced backend's rows are its device's work, not the host thread's
 * (copy_rows_core). */
static PyObject *copy_rows(PyObject *self, PyObject *args) {
    Py_buffer out, src, index;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "w*y*y*n", &out, &src, &index, &width)) return NULL;
    const Py_ssize_t n = index.len / (Py_ssize_t)sizeof(int64_t), rows = width > 0 ? src.len / (width * 4) : 0;
    const int64_t *at = (const int64_t *)index.buf;
    int ok = width > 0 && out.len >= n * width * 4;
    for (Py_ssize_t i = 0; ok && i < n; i++) ok = at[i] >= 0 && at[i] < rows;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        copy_rows_core((float *)out.buf, (const float *)src.buf, at, n, width);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&src);
    PyBuffer_Release(&index);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "copy_rows: an index past src, or out too small");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* priced_choices(tails, lengths, positions, agreement, ties, pool, runner_up) -> bytes: n rows of 5 int64, each
 * choices(tail[:length], position, agreement or None (agreement < 0), ties) of backend.py (priced_choices_core) */
static PyObject *priced_choices(PyObject *self, PyObject *args) {
    Py_buffer tails, lengths, positions;
    double agreement, ties, runner_up;
    long long pool;
    if (!PyArg_ParseTuple(args, "y*y*y*ddLd", &tails, &lengths, &positions, &agreement, &ties, &pool, &runner_up))
        return NULL;
    const Py_ssize_t n = positions.len / (Py_ssize_t)sizeof(int64_t);
    PyObject *out = NULL;
    if (lengths.len != positions.len || tails.len != 3 * positions.len || pool < 1) {
        PyErr_SetString(PyExc_ValueError, "priced_choices: n tails of 3, n lengths, n positions");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, n * 5 * (Py_ssize_t)sizeof(int64_t));
    if (out != NULL)
        priced_choices_core((const int64_t *)tails.buf, (const int64_t *)lengths.buf, (const int64_t *)positions.buf,
                            n, agreement, ties, pool, runner_up, (int64_t *)PyBytes_AS_STRING(out));
done:
    PyBuffer_Release(&tails);
    PyBuffer_Release(&lengths);
    PyBuffer_Release(&positions);
    return out;
}

/* ---------------------------------------------------------------- the module */

static PyMethodDef methods[] = {
    {"scan_width", scan_width, METH_VARARGS,
     "scan_width([width]) -> the top-k pass's width (4, or 8 with AVX); with an argument, set it (tests)."},
    {"head_draws", head_draws, METH_VARARGS,
     "head_draws(ids, logits, width, top_k, top_p, min_p, temperature, seed, positions) -> bytes or None"},
    {"copy_rows", copy_rows, METH_VARARGS, "copy_rows(out, src, index, width): out[i] = src[index[i]], unlocked."},
    {"priced_choices", priced_choices, METH_VARARGS,
     "priced_choices(tails, lengths, positions, agreement, ties, pool, runner_up) -> bytes (n x 5 int64)"},
    {"spin", spin, METH_VARARGS,
     "spin(seconds[, flag[, word]]): busy-wait that long with the interpreter's lock released; False if the byte at "
     "address flag turned non-zero first (an abort); a 32-bit word at address word is bumped as it starts."},
    {"wake_bump", wake_bump, METH_VARARGS, "wake_bump(word): the 32-bit word at that address + 1, its waiters woken."},
    {"wake_await", wake_await, METH_VARARGS,
     "wake_await(word, seen, spin_s, timeout_s) -> True once the word differs from seen, False after timeout_s "
     "(spinning spin_s, then asleep), the interpreter's lock released."},
    {"decode_woken", decode_woken, METH_VARARGS,
     "decode_woken(decode, ctx, batch, batch_size, word) -> llama_decode's code: the word bumped, then the decode, "
     "the interpreter's lock released (llama.cpp's function and objects by address)."},
    {"support", support, METH_VARARGS,
     "support(row, top_k, top_p, min_p, temperature) -> (ids, p) as bytes (int64 ascending, float64), or None: "
     "sampling.support's chain on the row's top_k candidates."},
    {"head", head, METH_VARARGS,
     "head(row, k, temperature) -> (ids, p) as bytes, or None: sampling.head_probs (most likely first)."},
    {"head_draw", head_draw, METH_VARARGS,
     "head_draw(row, width, k_probs, m, cand_temperature, top_k, top_p, min_p, temperature, seed, position) -> "
     "(token, ids, p) or None: a sampled draft step's m candidates and coupled draw from one pass over its row."},
    {"gumbel", gumbel, METH_VARARGS,
     "gumbel(ids, p, seed, position) -> the coupled draw from a support: coupling.gumbel_draw."},
    {"draw", draw, METH_VARARGS,
     "draw(row, top_k, top_p, min_p, temperature, seed, position) -> the coupled draw from the row's support, "
     "or None: coupling.draw for top_k > 0, in one call."},
    {"steps", steps, METH_O,
     "steps(call: StepsCall) -> (drawn, rc, in_decode_s, decoded, undecided): plain decoding steps in one call "
     "(llama.cpp's functions by address; top_k 0: greedy). call: ssd_edge.llama.context.StepsCall."},
    {"row_hook_address", row_hook_address, METH_NOARGS,
     "row_hook_address() -> the address of a C row hook that calls the Python callable at its user pointer as "
     "callable(row_address, n_vocab, position, previous) -> 1 (draw under the mask) or 0; what it raises stops "
     "steps() and is raised there"},
    {"masked_draw", masked_draw, METH_VARARGS,
     "masked_draw(row, mask, top_k, top_p, min_p, temperature, seed, position) -> the draw under a grammar's mask "
     "(top_k 0: greedy), or None; the row may be written."},
    {"mask", mask, METH_VARARGS,
     "mask(row: writable float32 buffer, bits: int32 words) -> None: -inf where a token's bit is 0, and past the end."},
    {"argmax", argmax, METH_VARARGS, "argmax(row: float32 buffer) -> int: np.argmax's answer (first of ties, a NaN first)."},
    {"top_ids", top_ids, METH_VARARGS,
     "top_ids(row: float32 buffer, k) -> bytes of k int64 ids (above the k-th largest ascending, then equal "
     "to it ascending), or None (ties past its buffer, NaN): see ssd_edge/sampling.py."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "native",
                                    "A logit row's k largest in one pass; a busy wait without the GIL.", -1, methods};

PyMODINIT_FUNC PyInit_native(void) {
    scan_width_init();
    return PyModule_Create(&module);
}
