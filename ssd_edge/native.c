/* ssd_edge.native: the two things ssd-edge does in C.
 *
 * support(row, top_k, top_p, min_p, temperature) and gumbel(ids, p, seed, position): sampling.support and
 * coupling.gumbel_draw for a row with top-k on, the same steps in the same order (the numpy paths are the
 * reference the tests hold these to; exp and log may differ from numpy's in the last bit); draw(row, top_k,
 * top_p, min_p, temperature, seed, position): the two in one call, the token alone handed back.
 *
 * steps(call): mode ar's plain decoding steps in one call (llama_decode, then argmax_core or support_core and
 * gumbel_core on its row, then the drawn token decoded next, ...), llama.cpp's functions by address.
 *
 * spin(seconds[, flag]): wait that long on this core, the interpreter's lock released, as a CUDA host thread
 * waits for its GPU (it spins: the core stays awake and its caches warm), or until the byte at address
 * `flag` turns non-zero (an abort). The priced backend's wait.
 *
 * top_ids(row, k) -> bytes: k int64 ids; those above the k-th largest value in ascending order, then
 * those equal to it in ascending order (ties at the boundary go to the lower ids), exactly as
 * sampling.top_ids' numpy path. None where it cannot tell (more ties at the boundary than it keeps, or
 * NaN logits): the caller takes the numpy path.
 *
 * How: one pass keeps every value at or above a running threshold t in a small buffer, in row order
 * (so ascending ids). When the buffer fills, t rises to the k-th largest value it holds and the entries
 * below t go. The pass tests 32 values at a time against t (vectorised: 4-wide everywhere, 8-wide with
 * AVX on x86 CPUs that have it, chosen when the module loads) and looks at single values only in a
 * span that holds one at or above t (those values alone, by a mask of the span): after the first
 * thousand values, almost no span does.
 * Every value >= the final k-th largest was kept (t never passes it), so the answer is in the buffer.
 * On a long row (at least 2k groups of 512 values) a first pass takes each group's largest value, and t
 * starts at the k-th largest of those: k groups hold a value at or above it, so the k-th largest value of
 * the row is too. The second pass looks only at the groups whose largest value reaches t, in row order:
 * a few dozen of a vocabulary's 296, so the row is read once at the speed of a max.
 *
 * The calls on one row (argmax, top_ids, head, support, draw, masked_draw, mask) keep the interpreter's lock:
 * each takes 10-60 us, and releasing the lock for that long hands the interpreter to the other thread
 * (SSD's worker between two branch decodes) for as long as its Python runs, while the engine waits to get
 * it back; on the priced H200 a verify's draws took 1.6 ms instead of 0.4 that way. spin and steps, which
 * wait on a device or run whole decodes, release it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_AVX_SCAN 1
#endif

#define BLOCK 16
#define SPAN (2 * BLOCK)  /* values a scan tests at a time */

/* the k-th largest (1-based) of v[0..n-1]; v is reordered (quickselect) */
static float kth_largest(float *v, Py_ssize_t n, Py_ssize_t k) {
    Py_ssize_t lo = 0, hi = n - 1, want = k - 1;  /* the value at index want when v is descending */
    while (lo < hi) {
        float pivot = v[lo + (hi - lo) / 2];
        Py_ssize_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] > pivot) i++;
            while (v[j] < pivot) j--;
            if (i <= j) {
                float tmp = v[i]; v[i] = v[j]; v[j] = tmp;
                i++; j--;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else break;
    }
    return v[want];
}

typedef struct {
    float *val;
    int64_t *id;
    float *scratch;
    Py_ssize_t n, cap, k;
    float t;
    int finite;  /* keep no -inf (a grammar's refused tokens): they cannot be drawn */
} Kept;

/* raise t to the k-th largest kept value and drop what is below it; 0 if still full (ties) */
static int compact(Kept *s) {
    memcpy(s->scratch, s->val, (size_t)s->n * sizeof(float));
    s->t = kth_largest(s->scratch, s->n, s->k);
    Py_ssize_t m = 0;
    for (Py_ssize_t i = 0; i < s->n; i++) {
        if (s->val[i] >= s->t) {
            s->val[m] = s->val[i];
            s->id[m] = s->id[i];
            m++;
        }
    }
    s->n = m;
    return m < s->cap;
}

static int keep(Kept *s, float v, int64_t i) {
    if (!(v >= s->t) || (s->finite && v == -INFINITY)) return 1;
    if (s->n == s->cap) {
        if (!compact(s)) return 0;
        if (!(v >= s->t)) return 1;
    }
    s->val[s->n] = v;
    s->id[s->n] = i;
    s->n++;
    return 1;
}

/* whether any of x[0..BLOCK-1] is >= t or NaN (not < t): four 4-wide compares (GCC/Clang vector
 * extensions, so SSE on x86 and NEON on ARM; a plain loop here was left scalar by the compiler) */
typedef float v4sf __attribute__((vector_size(16)));
typedef int32_t v4si __attribute__((vector_size(16)));

static inline int block_reaches(const float *x, float t) {
    const v4sf tv = {t, t, t, t};
    v4si acc = {0, 0, 0, 0};
    for (int j = 0; j < BLOCK; j += 4) {
        v4sf v;
        memcpy(&v, x + j, sizeof v);
        acc |= ~(v < tv);  /* -1 where v >= t or v is NaN */
    }
    return (acc[0] | acc[1] | acc[2] | acc[3]) != 0;
}

/* The start of the first span of x[i..] (spans of SPAN values, up to the last whole one before n) that
 * holds a value >= t or NaN; where none does, the start of the tail after the last whole span. */
static Py_ssize_t scan_4wide(const float *x, Py_ssize_t i, Py_ssize_t n, float t) {
    for (; i + SPAN <= n; i += SPAN)
        if (block_reaches(x + i, t) || block_reaches(x + i + BLOCK, t)) return i;
    return i;
}

#ifdef HAVE_AVX_SCAN
__attribute__((target("avx")))
static Py_ssize_t scan_8wide(const float *x, Py_ssize_t i, Py_ssize_t n, float t) {
    const __m256 tv = _mm256_set1_ps(t);
    for (; i + SPAN <= n; i += SPAN) {
        /* _CMP_NLT_UQ: not (v < t), so v >= t or NaN, as block_reaches */
        __m256 a = _mm256_cmp_ps(_mm256_loadu_ps(x + i), tv, _CMP_NLT_UQ);
        __m256 b = _mm256_cmp_ps(_mm256_loadu_ps(x + i + 8), tv, _CMP_NLT_UQ);
        __m256 c = _mm256_cmp_ps(_mm256_loadu_ps(x + i + 16), tv, _CMP_NLT_UQ);
        __m256 d = _mm256_cmp_ps(_mm256_loadu_ps(x + i + 24), tv, _CMP_NLT_UQ);
        if (_mm256_movemask_ps(_mm256_or_ps(_mm256_or_ps(a, b), _mm256_or_ps(c, d)))) return i;
    }
    return i;
}
#endif

static Py_ssize_t (*scan)(const float *, Py_ssize_t, Py_ssize_t, float) = scan_4wide;

/* bound[g]: the largest of group g (x[g * GROUP ..], GROUP values), for g < groups; +inf where the group
 * holds a NaN (so the pass looks at it and meets the NaN). The bounds of the threshold (topk_core). */
#define GROUP 512
static void group_maxima_4wide(const float *x, Py_ssize_t groups, float *bound) {
    for (Py_ssize_t g = 0; g < groups; g++, x += GROUP) {  /* 4-wide vector compares and selects */
        v4si nan = {0, 0, 0, 0};
        v4sf m[4];
        for (int a = 0; a < 4; a++) memcpy(&m[a], x + 4 * a, sizeof m[a]);
        for (int j = 0; j < GROUP; j += 16) {
            for (int a = 0; a < 4; a++) {
                v4sf v;
                memcpy(&v, x + j + 4 * a, sizeof v);
                const v4si up = v > m[a];
                nan |= v != v;
                m[a] = (v4sf)((up & (v4si)v) | (~up & (v4si)m[a]));
            }
        }
        float best = m[0][0];
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 4; b++)
                if (m[a][b] > best) best = m[a][b];
        bound[g] = (nan[0] | nan[1] | nan[2] | nan[3]) ? INFINITY : best;
    }
}

#ifdef HAVE_AVX_SCAN
__attribute__((target("avx")))
static void group_maxima_8wide(const float *x, Py_ssize_t groups, float *bound) {
    for (Py_ssize_t g = 0; g < groups; g++, x += GROUP) {
        __m256 m0 = _mm256_loadu_ps(x), m1 = _mm256_loadu_ps(x + 8), nan = _mm256_setzero_ps();
        for (int j = 0; j < GROUP; j += 16) {
            const __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + 8);
            nan = _mm256_or_ps(nan, _mm256_or_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q), _mm256_cmp_ps(b, b, _CMP_UNORD_Q)));
            m0 = _mm256_max_ps(a, m0);  /* a NaN in a keeps m0 (`nan` has it) */
            m1 = _mm256_max_ps(b, m1);
        }
        __m256 m = _mm256_max_ps(m0, m1);  /* the 8 lanes' largest: swap halves, pairs, neighbours */
        m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 1));
        m = _mm256_max_ps(m, _mm256_permute_ps(m, 0x4E));
        m = _mm256_max_ps(m, _mm256_permute_ps(m, 0xB1));
        bound[g] = _mm256_movemask_ps(nan) ? INFINITY : _mm256_cvtss_f32(m);
    }
}
#endif

static void (*group_maxima)(const float *, Py_ssize_t, float *) = group_maxima_4wide;

/* bit j set where x[j] >= t or is NaN (not < t), j < SPAN: which values of a span the pass must look at
 * (branch-free, so the compiler vectorises it; a span the scan stops at holds one or two of them) */
static inline uint32_t span_mask(const float *x, float t) {
    uint32_t m = 0;
    for (int j = 0; j < SPAN; j++) m |= (uint32_t)!(x[j] < t) << j;
    return m;
}

/* The values of x[*i..] >= t into s, in row order, through the whole spans before `end` (*i left at the
 * first value after them); 1, or 0 at a NaN (the numpy path decides), -1 out of memory */
static int pass(Kept *s, const float *x, Py_ssize_t *i, Py_ssize_t end) {
    int ok = 1;
    Py_ssize_t at = *i;
    while (ok == 1 && (at = scan(x, at, end, s->t)) + SPAN <= end) {  /* a span that holds a value >= t */
        /* only its values >= t, in row order (keep() tests each against t again: a compaction may
         * have raised it; what it drops was below t either way) */
        for (uint32_t m = span_mask(x + at, s->t); m && ok == 1; m &= m - 1) {
            const int j = __builtin_ctz(m);
            float v = x[at + j];
            ok = (v != v) ? 0 : keep(s, v, (int64_t)(at + j));
        }
        at += SPAN;
    }
    *i = at;
    return ok;
}

/* The k largest of x[0..n-1] (1 <= k < n) into ids[0..k-1], in sampling.top_ids' order; 1 on success,
 * 0 where the numpy path must decide (NaN, ties past the buffer), -1 out of memory. No Python calls.
 * got NULL: exactly k ids. got non-NULL: the finite ones alone (-inf is a token a grammar refused, which no
 * draw can pick), k or fewer where fewer are finite (at least 1), their count in *got: the ids ascending,
 * as top_ids orders a row's finite values when the k-th largest is -inf. */
static int topk_core(const float *x, Py_ssize_t n, Py_ssize_t k, int64_t *ids, Py_ssize_t *got) {
    Kept s;
    s.k = k;
    s.finite = got != NULL;
    s.cap = k * 4 > 256 ? k * 4 : 256;
    s.n = 0;
    s.t = -INFINITY;
    s.val = malloc((size_t)s.cap * sizeof(float));
    s.scratch = malloc((size_t)s.cap * sizeof(float));
    s.id = malloc((size_t)s.cap * sizeof(int64_t));
    const Py_ssize_t groups = n / GROUP;
    /* the groups' maxima, then a copy of them that the selection reorders */
    float *bound = groups >= 2 * k ? malloc((size_t)groups * 2 * sizeof(float)) : NULL;
    int ok = (s.val && s.scratch && s.id) ? 1 : -1;
    Py_ssize_t i = 0;
    if (ok == 1 && bound != NULL) {  /* the groups' maxima, then t starts at the k-th largest of them */
        group_maxima(x, groups, bound);
        memcpy(bound + groups, bound, (size_t)groups * sizeof(float));
        s.t = kth_largest(bound + groups, groups, k);
        if (s.finite && s.t == -INFINITY) s.t = -FLT_MAX;  /* fewer than k groups hold a finite value (a grammar's
                                                             * mask): the scans skip the refused, not test each */
        for (Py_ssize_t g = 0; ok == 1 && g < groups; g++) {
            if (!(bound[g] >= s.t)) continue;  /* nothing here reaches t, so nothing reaches the k-th */
            i = g * GROUP;
            ok = pass(&s, x, &i, i + GROUP);
        }
        i = groups * GROUP;
    }
    if (s.finite && s.t == -INFINITY) s.t = -FLT_MAX;
    if (ok == 1) ok = pass(&s, x, &i, n);
    free(bound);
    for (; ok == 1 && i < n; i++) {
        float v = x[i];
        ok = (v != v) ? 0 : keep(&s, v, (int64_t)i);
    }
    if (ok == 1 && s.n >= k) {
        memcpy(s.scratch, s.val, (size_t)s.n * sizeof(float));
        float edge = kth_largest(s.scratch, s.n, k);
        Py_ssize_t m = 0;
        for (Py_ssize_t j = 0; j < s.n && m < k; j++)
            if (s.val[j] > edge) ids[m++] = s.id[j];
        for (Py_ssize_t j = 0; j < s.n && m < k; j++)
            if (s.val[j] == edge) ids[m++] = s.id[j];
        if (got) *got = k;
    } else if (ok == 1 && got != NULL && s.n >= 1) {  /* fewer than k finite: all of them, in row order */
        for (Py_ssize_t j = 0; j < s.n; j++) ids[j] = s.id[j];
        *got = s.n;
    } else if (ok == 1) {
        ok = 0;
    }
    free(s.val);
    free(s.scratch);
    free(s.id);
    return ok;
}

/* topk_core's k ids where the row holds k finite values; where a grammar's mask left fewer, the finite ones
 * (ascending) and then the lowest refused ids: the order of sampling.top_ids' numpy path when the k-th
 * largest is -inf (above it ascending, then ties at it to the lower ids), found without a whole-row sort */
static int topk_padded(const float *x, Py_ssize_t n, Py_ssize_t k, int64_t *ids) {
    Py_ssize_t m = 0;
    int ok = topk_core(x, n, k, ids, &m);
    if (ok != 1 || m >= k) return ok;
    for (Py_ssize_t i = 0; i < n && m < k; i++)
        if (x[i] == -INFINITY) ids[m++] = (int64_t)i;
    return m == k ? 1 : 0;
}

/* np.argmax of x[0..n-1] (n >= 1): the first index of its largest value, or of its first NaN where it has
 * one. The groups' maxima (one vectorised pass), then the first group that holds the largest, value by
 * value; the tail after the last whole group value by value. A NaN, or +inf, takes numpy's order pass. */
static Py_ssize_t argmax_core(const float *x, Py_ssize_t n, float *bound) {
    const Py_ssize_t groups = n / GROUP;
    group_maxima(x, groups, bound);
    float best = groups ? bound[0] : x[0];
    Py_ssize_t at = 0;
    for (Py_ssize_t g = 1; g < groups; g++)
        if (bound[g] > best) {
            best = bound[g];
            at = g;
        }
    for (Py_ssize_t i = groups * GROUP; i < n; i++)
        if (!(x[i] < INFINITY)) {  /* NaN or +inf in the tail */
            best = INFINITY;
            break;
        }
    if (best == INFINITY) {  /* a group with a NaN (or a +inf): numpy's answer, value by value */
        Py_ssize_t top = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (x[i] != x[i]) return i;
            if (x[i] > x[top]) top = i;
        }
        return top;
    }
    Py_ssize_t first = 0;
    if (groups)
        for (first = at * GROUP; x[first] != best; first++) {
        }
    for (Py_ssize_t i = groups ? groups * GROUP : 1; i < n; i++)  /* the tail wins only with a larger value */
        if (x[i] > x[first]) first = i;
    return first;
}

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
    Py_ssize_t i;
    i = argmax_core((const float *)buf.buf, n, bound);
    free(bound);
    PyBuffer_Release(&buf);
    return PyLong_FromSsize_t(i);
}

/* mask(row, bits) -> None: a grammar's mask on a float32 row, in place (structured/shaping.apply_mask): -inf on
 * every token whose bit is 0 (bit i of int32 word w is token 32 w + i) and past the mask's end. A word at a
 * time: all-allowed words are skipped, all-refused ones written at once (a JSON grammar refuses most). */
static void mask_core(float *x, Py_ssize_t n, const uint32_t *w, Py_ssize_t words);

static PyObject *mask(PyObject *self, PyObject *args) {
    Py_buffer row, bits;
    if (!PyArg_ParseTuple(args, "w*y*", &row, &bits)) return NULL;
    mask_core((float *)row.buf, row.len / (Py_ssize_t)sizeof(float), (const uint32_t *)bits.buf, bits.len / 4);
    PyBuffer_Release(&row);
    PyBuffer_Release(&bits);
    Py_RETURN_NONE;
}

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
    int ok;
    ok = topk_padded((const float *)buf.buf, n, k, (int64_t *)PyBytes_AS_STRING(out));
    PyBuffer_Release(&buf);
    if (ok == 1) return out;
    Py_DECREF(out);
    if (ok < 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* numpy's float64 sum (pairwise_sum in its umath loops): 8 running sums over blocks of 128, halves above
 * that; the same order, so the same bits, as the numpy path's p.sum() */
static double np_sum(const double *a, Py_ssize_t n) {
    if (n < 8) {
        double r = 0.0;  /* numpy starts a short sum at -0.0: the same for the positive numbers summed here */
        for (Py_ssize_t i = 0; i < n; i++) r += a[i];
        return r;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; j++) r[j] = a[j];
        Py_ssize_t i;
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    Py_ssize_t n2 = n / 2;
    n2 -= n2 % 8;
    return np_sum(a, n2) + np_sum(a + n2, n - n2);
}

typedef struct {
    double p;
    Py_ssize_t j;
} Ranked;

static int by_p_descending(const void *a, const void *b) {  /* stable: ties by position */
    const Ranked *x = a, *y = b;
    if (x->p > y->p) return -1;
    if (x->p < y->p) return 1;
    return (x->j > y->j) - (x->j < y->j);
}

static int by_id(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

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

static double max_of(const double *z, Py_ssize_t m) {
    double zmax = z[0];
    for (Py_ssize_t j = 1; j < m; j++) if (z[j] > zmax) zmax = z[j];
    return zmax;
}

/* p = exp(z - max z) / their sum, in numpy's order of operations (sampling.py's softmax) */
static void softmax(const double *z, double *p, Py_ssize_t m) {
    const double zmax = max_of(z, m);
    for (Py_ssize_t j = 0; j < m; j++) p[j] = exp(z[j] - zmax);
    const double total = np_sum(p, m);
    for (Py_ssize_t j = 0; j < m; j++) p[j] /= total;
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

/* sampling.support for top_k > 0 (see there), step by step in its order and arithmetic: the support's ids
 * ascending in (*idx_out)[0..*m_out-1] and their probabilities in *p_out, two arrays of k it allocates (the
 * caller frees them, whatever it returns). 1 on success, 0 where the numpy path must decide (NaN, ties past
 * the buffer), -1 out of memory. No Python calls: run it with the interpreter's lock released. */
static int support_core(const float *x, Py_ssize_t n, Py_ssize_t k, double top_p, double min_p, double temperature,
                        int64_t **idx_out, double **p_out, Py_ssize_t *m_out) {
    int64_t *idx = *idx_out = malloc((size_t)k * sizeof(int64_t));
    double *p = *p_out = malloc((size_t)k * sizeof(double));
    double *z = malloc((size_t)k * sizeof(double));
    Ranked *rank = malloc((size_t)k * sizeof(Ranked));
    int64_t *pair = malloc((size_t)k * 2 * sizeof(int64_t));
    int ok = (idx && p && z && rank && pair) ? 1 : -1;
    Py_ssize_t m = k;
    if (ok == 1) ok = topk_core(x, n, k, idx, &m);  /* -inf (refused by a grammar) has p 0: never kept */
    if (ok == 1) {
        for (Py_ssize_t j = 0; j < m; j++) z[j] = (double)x[idx[j]];
        if (top_p < 1.0) {  /* the smallest descending prefix whose mass (at temperature 1) reaches top_p */
            softmax(z, p, m);
            for (Py_ssize_t j = 0; j < m; j++) {
                rank[j].p = p[j];
                rank[j].j = j;
            }
            qsort(rank, (size_t)m, sizeof(Ranked), by_p_descending);
            double cum = 0.0;
            Py_ssize_t cut = m;
            for (Py_ssize_t i = 0; i < m; i++) {
                cum += rank[i].p;
                if (cum >= top_p) {
                    cut = i + 1;
                    break;
                }
            }
            /* keep positions rank[0..cut-1].j, in position order */
            char *kept = calloc((size_t)m, 1);
            if (kept == NULL) {
                ok = -1;
            } else {
                for (Py_ssize_t i = 0; i < cut; i++) kept[rank[i].j] = 1;
                Py_ssize_t w = 0;
                for (Py_ssize_t j = 0; j < m; j++)
                    if (kept[j]) {
                        idx[w] = idx[j];
                        z[w] = z[j];
                        w++;
                    }
                m = w;
                free(kept);
            }
        }
    }
    if (ok == 1 && min_p > 0.0) {  /* logit >= max logit + log(min_p) */
        const double floor_ = max_of(z, m) + log(min_p);
        Py_ssize_t w = 0;
        for (Py_ssize_t j = 0; j < m; j++)
            if (z[j] >= floor_) {
                idx[w] = idx[j];
                z[w] = z[j];
                w++;
            }
        m = w;
    }
    if (ok == 1) {  /* softmax at the temperature, then ids ascending, then what underflowed dropped */
        for (Py_ssize_t j = 0; j < m; j++) z[j] = z[j] / temperature;
        softmax(z, p, m);
        for (Py_ssize_t j = 0; j < m; j++) {
            pair[2 * j] = idx[j];
            memcpy(&pair[2 * j + 1], &p[j], sizeof(double));
        }
        qsort(pair, (size_t)m, 2 * sizeof(int64_t), by_id);
        Py_ssize_t w = 0;
        for (Py_ssize_t j = 0; j < m; j++) {
            double pj;
            memcpy(&pj, &pair[2 * j + 1], sizeof(double));
            if (pj > 0.0) {
                idx[w] = pair[2 * j];
                p[w] = pj;
                w++;
            }
        }
        m = w;
    }
    free(z);
    free(rank);
    free(pair);
    *m_out = m;
    return ok;
}

/* support(row, top_k, top_p, min_p, temperature) -> (ids bytes int64 ascending, p bytes float64) or None:
 * sampling.support for top_k > 0 (support_core). */
static PyObject *support(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t k;
    double top_p, min_p, temperature;
    if (!PyArg_ParseTuple(args, "y*nddd", &buf, &k, &top_p, &min_p, &temperature)) return NULL;
    const float *x = (const float *)buf.buf;
    Py_ssize_t n = row_length(&buf, k, temperature);
    if (n < 0) return NULL;
    int64_t *idx;
    double *p;
    Py_ssize_t m = 0;
    int ok;
    ok = support_core(x, n, k, top_p, min_p, temperature, &idx, &p, &m);
    PyObject *out = ids_and_probs(ok, idx, p, m);
    free(idx);
    free(p);
    PyBuffer_Release(&buf);
    return out;
}

typedef struct {
    double z;
    int64_t id;
} Scored;

static int by_z_then_id(const void *a, const void *b) {  /* most likely first, ties to the lower id */
    const Scored *x = a, *y = b;
    if (x->z > y->z) return -1;
    if (x->z < y->z) return 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* head(row, k, temperature) -> (ids bytes int64, p bytes float64) or None: sampling.head_probs, the row's
 * k largest logits at the temperature, most likely first, normalised over those k */
static PyObject *head(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t k;
    double temperature;
    if (!PyArg_ParseTuple(args, "y*nd", &buf, &k, &temperature)) return NULL;
    const float *x = (const float *)buf.buf;
    Py_ssize_t n = row_length(&buf, k, temperature);
    if (n < 0) return NULL;
    int64_t *idx = malloc((size_t)k * sizeof(int64_t));
    Scored *sc = malloc((size_t)k * sizeof(Scored));
    double *p = malloc((size_t)k * sizeof(double));
    PyObject *out = NULL;
    int ok = (idx && sc && p) ? 1 : -1;
    if (ok == 1) ok = topk_padded(x, n, k, idx);
    if (ok == 1) {
        for (Py_ssize_t j = 0; j < k; j++) {
            sc[j].z = (double)x[idx[j]] / temperature;
            sc[j].id = idx[j];
        }
        qsort(sc, (size_t)k, sizeof(Scored), by_z_then_id);
        for (Py_ssize_t j = 0; j < k; j++) {
            p[j] = exp(sc[j].z - sc[0].z);
            idx[j] = sc[j].id;
        }
        double total = np_sum(p, k);
        for (Py_ssize_t j = 0; j < k; j++) p[j] /= total;
    }
    out = ids_and_probs(ok, idx, p, k);
    free(idx);
    free(sc);
    free(p);
    PyBuffer_Release(&buf);
    return out;
}

/* coupling.py's noise: splitmix64's finaliser, and U(seed, position, id) */
static uint64_t mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* the id of ids[0..m-1] maximising log p + G(seed, position, id), the first of equals: coupling.gumbel_draw */
static int64_t gumbel_core(const int64_t *ids, const double *p, Py_ssize_t m, uint64_t seed, uint64_t position) {
    const uint64_t golden = 0x9E3779B97F4A7C15ULL, m2 = 0x94D049BB133111EBULL;
    uint64_t key = mix64((seed & ((1ULL << 63) - 1)) + golden);
    key = mix64(key ^ (position * golden));
    int64_t best = ids[0];
    double best_score = -INFINITY;
    for (Py_ssize_t j = 0; j < m; j++) {
        uint64_t h = mix64(key ^ (((uint64_t)ids[j] + 1ULL) * m2));
        double u = ((double)(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
        double score = log(p[j]) + -log(-log(u));
        if (score > best_score) {
            best_score = score;
            best = ids[j];
        }
    }
    return best;
}

/* gumbel(ids bytes int64, p bytes float64, seed, position) -> the id maximising log p + G(seed, position, id),
 * the first of equals: coupling.gumbel_draw */
static PyObject *gumbel(PyObject *self, PyObject *args) {
    Py_buffer ids_buf, p_buf;
    unsigned long long seed, position;
    if (!PyArg_ParseTuple(args, "y*y*KK", &ids_buf, &p_buf, &seed, &position)) return NULL;
    const int64_t *ids = (const int64_t *)ids_buf.buf;
    const double *p = (const double *)p_buf.buf;
    Py_ssize_t m = ids_buf.len / (Py_ssize_t)sizeof(int64_t);
    if (m < 1 || p_buf.len != m * (Py_ssize_t)sizeof(double)) {
        PyBuffer_Release(&ids_buf);
        PyBuffer_Release(&p_buf);
        PyErr_SetString(PyExc_ValueError, "gumbel: ids and p must be as long, and not empty");
        return NULL;
    }
    const int64_t best = gumbel_core(ids, p, m, seed, position);
    PyBuffer_Release(&ids_buf);
    PyBuffer_Release(&p_buf);
    return PyLong_FromLongLong(best);
}

/* head_draws(ids, logits, width, top_k, top_p, min_p, temperature, seed, positions) -> bytes of int64 tokens or
 * None: coupling.head_draws for rows handed over as heads (sampling.Heads: n rows of `width` int64 ids and
 * float32 logits, most likely first; positions: n int64), top_k < width. Each row is support_core's over its
 * head (positions in the head, mapped to the head's ids), then gumbel_core with the row's position: the
 * whole row's draw where the head is wider than top-k. None where a row needs the numpy path. */
static PyObject *head_draws(PyObject *self, PyObject *args) {
    Py_buffer ids_buf, logits_buf, pos_buf;
    Py_ssize_t width, k;
    double top_p, min_p, temperature;
    unsigned long long seed;
    if (!PyArg_ParseTuple(args, "y*y*nndddKy*", &ids_buf, &logits_buf, &width, &k, &top_p, &min_p, &temperature,
                          &seed, &pos_buf)) return NULL;
    const Py_ssize_t n = pos_buf.len / (Py_ssize_t)sizeof(int64_t);
    PyObject *out = NULL;
    if (width < 2 || k < 1 || k >= width || temperature <= 0.0 || ids_buf.len != n * width * (Py_ssize_t)sizeof(int64_t)
        || logits_buf.len != n * width * (Py_ssize_t)sizeof(float)) {
        PyErr_SetString(PyExc_ValueError, "head_draws: need n heads of width ids and logits, 1 <= top_k < width");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    if (out == NULL) goto done;
    int64_t *tokens = (int64_t *)PyBytes_AS_STRING(out);
    const int64_t *ids = (const int64_t *)ids_buf.buf, *positions = (const int64_t *)pos_buf.buf;
    const float *logits = (const float *)logits_buf.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t *idx;
        double *p;
        Py_ssize_t m = 0;
        int ok = support_core(logits + i * width, width, k, top_p, min_p, temperature, &idx, &p, &m);
        if (ok == 1) {
            for (Py_ssize_t j = 0; j < m; j++) idx[j] = ids[i * width + idx[j]];
            tokens[i] = m == 1 ? idx[0] : gumbel_core(idx, p, m, seed, (uint64_t)positions[i]);
        }
        free(idx);
        free(p);
        if (ok != 1) {
            Py_CLEAR(out);
            if (ok < 0) PyErr_NoMemory(); else out = Py_NewRef(Py_None);
            break;
        }
    }
done:
    PyBuffer_Release(&ids_buf);
    PyBuffer_Release(&logits_buf);
    PyBuffer_Release(&pos_buf);
    return out;
}

/* draw(row, top_k, top_p, min_p, temperature, seed, position) -> the coupled draw from the row's support, or
 * None (the numpy path decides): coupling.draw for top_k > 0, support_core then gumbel_core in one call */
static PyObject *draw(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t k;
    double top_p, min_p, temperature;
    unsigned long long seed, position;
    if (!PyArg_ParseTuple(args, "y*ndddKK", &buf, &k, &top_p, &min_p, &temperature, &seed, &position)) return NULL;
    const float *x = (const float *)buf.buf;
    Py_ssize_t n = row_length(&buf, k, temperature);
    if (n < 0) return NULL;
    int64_t *idx;
    double *p;
    Py_ssize_t m = 0;
    int64_t best = 0;
    int ok;
    ok = support_core(x, n, k, top_p, min_p, temperature, &idx, &p, &m);
    if (ok == 1) best = m == 1 ? idx[0] : gumbel_core(idx, p, m, seed, position);
    free(idx);
    free(p);
    PyBuffer_Release(&buf);
    if (ok < 0) return PyErr_NoMemory();
    if (ok == 0) Py_RETURN_NONE;
    return PyLong_FromLongLong(best);
}

/* -inf on every refused token of x[0..n-1] (mask()'s work): all-allowed words skipped, all-refused ones written,
 * a partial word only at its refused bits */
static void mask_core(float *x, Py_ssize_t n, const uint32_t *w, Py_ssize_t words) {
    Py_ssize_t i = 0;
    for (Py_ssize_t j = 0; j < words && i < n; j++, i += 32) {
        const uint32_t b = w[j];
        if (b == 0xFFFFFFFFu) continue;
        const Py_ssize_t end = i + 32 < n ? i + 32 : n;
        if (b == 0) {
            for (Py_ssize_t t = i; t < end; t++) x[t] = -INFINITY;
        } else if (end - i == 32) {  /* only the refused ones: inside a JSON string, a few per word */
            for (uint32_t r = ~b; r; r &= r - 1) x[i + __builtin_ctz(r)] = -INFINITY;
        } else {
            for (Py_ssize_t t = i; t < end; t++)
                if (!((b >> (t - i)) & 1u)) x[t] = -INFINITY;
        }
    }
    for (; i < n; i++) x[i] = -INFINITY;
}

/* The draw from row x under a grammar's mask: the same token as mask_core, then argmax_core (k 0) or
 * support_core and gumbel_core (coupling.Drawer on the masked row), without writing -inf over the row
 * where the mask allows few tokens (a JSON grammar's usual state): their values are gathered (ids
 * ascending) and drawn from as a row of their own, which keeps top_ids' order among them (the gathered
 * row gets two -inf after them: where no more than k are allowed, top-k keeps every one, ids ascending,
 * as it does on the masked row).
 * 1 drawn (*out), 0 where Python must decide (nothing allowed, NaN, ties past the buffer), -1 out of memory. */
static int masked_draw_core(float *x, Py_ssize_t n, const uint32_t *w, Py_ssize_t words, Py_ssize_t k,
                            double top_p, double min_p, double temperature, uint64_t seed, uint64_t position,
                            float *bound, int64_t *out) {
    Py_ssize_t allowed = 0;
    const Py_ssize_t full = n / 32 < words ? n / 32 : words;
    for (Py_ssize_t j = 0; j < full; j++) allowed += __builtin_popcount(w[j]);
    if (allowed == 0) return 0;
    if (allowed > n / 8 || full < words || n % 32) {  /* many allowed (free text, a string): in place */
        mask_core(x, n, w, words);
        if (k == 0) {
            *out = argmax_core(x, n, bound);
            return 1;
        }
        int64_t *idx;
        double *p;
        Py_ssize_t m = 0;
        int ok = support_core(x, n, k, top_p, min_p, temperature, &idx, &p, &m);
        if (ok == 1) *out = m == 1 ? idx[0] : gumbel_core(idx, p, m, seed, position);
        free(idx);
        free(p);
        return ok;
    }
    float *v = malloc((size_t)(allowed + 2) * sizeof(float));
    int64_t *id = malloc((size_t)(allowed + 2) * sizeof(int64_t));
    if (v == NULL || id == NULL) {
        free(v);
        free(id);
        return -1;
    }
    Py_ssize_t m = 0;
    for (Py_ssize_t j = 0; j < full; j++)
        for (uint32_t b = w[j]; b; b &= b - 1) {
            const Py_ssize_t t = j * 32 + __builtin_ctz(b);
            id[m] = t;
            v[m++] = x[t];
        }
    int ok = 1;
    if (k == 0) {  /* np.argmax's first largest (a NaN first): ids ascending, as in the row */
        Py_ssize_t best = 0;
        for (Py_ssize_t j = 0; j < m; j++) {
            if (v[j] != v[j]) {
                best = j;
                break;
            }
            if (v[j] > v[best]) best = j;
        }
        *out = id[best];
    } else {
        v[m] = v[m + 1] = -INFINITY;  /* refused tokens' places: top-k then keeps all m where m <= k */
        int64_t *idx;
        double *p;
        Py_ssize_t got = 0;
        ok = support_core(v, m + 2, k < m ? k : m + 1, top_p, min_p, temperature, &idx, &p, &got);
        if (ok == 1) {
            for (Py_ssize_t j = 0; j < got; j++) idx[j] = id[idx[j]];
            *out = got == 1 ? idx[0] : gumbel_core(idx, p, got, seed, position);
        }
        free(idx);
        free(p);
    }
    free(v);
    free(id);
    return ok;
}

/* masked_draw(row, mask, top_k, top_p, min_p, temperature, seed, position) -> the token, or None: the C loop's
 * draw under a grammar's mask (masked_draw_core; top_k 0: greedy). The row may be written (-inf). */
static PyObject *masked_draw(PyObject *self, PyObject *args) {
    Py_buffer buf, bits;
    Py_ssize_t k;
    double top_p, min_p, temperature;
    unsigned long long seed, position;
    if (!PyArg_ParseTuple(args, "w*y*ndddKK", &buf, &bits, &k, &top_p, &min_p, &temperature, &seed, &position))
        return NULL;
    const Py_ssize_t n = buf.len / (Py_ssize_t)sizeof(float);
    float *bound = malloc((size_t)(n / GROUP + 1) * sizeof(float));
    int ok = -1;
    int64_t best = 0;
    if (bound != NULL && n > 0 && k >= 0 && k < n && (k == 0 || temperature > 0.0)) {
        ok = masked_draw_core((float *)buf.buf, n, (const uint32_t *)bits.buf, bits.len / 4, k, top_p, min_p,
                              temperature, seed, position, bound, &best);
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

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* copy_rows(out, src, index, width): out's row i = src's row index[i] (float32 rows of `width`), with the
 * interpreter's lock released: the priced backend's rows are its device's work, not the host thread's
 * (bench/priced/backend.py rows_for: 9 rows of 152k floats are 1.5 ms of copying on a slow core). */
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
        for (Py_ssize_t i = 0; i < n; i++)
            memcpy((float *)out.buf + i * width, (const float *)src.buf + at[i] * width, (size_t)width * sizeof(float));
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

/* The priced pair's language (bench/priced/backend.py choices(), the reference the tests hold this to):
 * splitmix64 hashes of a context, in the same arithmetic as its Python. */
static uint64_t mix_g(uint64_t x) {
    return mix64(x + 0x9E3779B97F4A7C15ULL);  /* splitmix64: the golden step, then coupling's finaliser */
}

/* x < fraction * 2**64, exactly as Python compares an int with a float */
static int below(uint64_t x, double fraction) {
    const double t = fraction * 18446744073709551616.0;
    if (t >= 18446744073709551616.0) return 1;
    if (t <= 0.0) return 0;
    const uint64_t floor_t = (uint64_t)t;  /* t < 2**64: exact where t >= 2**53, a floor below */
    return (double)floor_t == t ? x < floor_t : x <= floor_t;
}

#define PRICED_WORD0 256
#define PRICED_WORDS (151643 - 256)

static int64_t priced_word(uint64_t h, int64_t a, int64_t b, int64_t c) {
    int64_t w = PRICED_WORD0 + (int64_t)(h % PRICED_WORDS);
    while (w == a || w == b || w == c) w = PRICED_WORD0 + (w - PRICED_WORD0 + 1) % PRICED_WORDS;
    return w;
}

/* priced_choices(tails, lengths, positions, agreement, ties, pool, runner_up) -> bytes: n rows of 5 int64, each
 * choices(tail[:length], position, agreement or None (agreement < 0), ties) of backend.py */
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
    if (out == NULL) goto done;
    int64_t *o = (int64_t *)PyBytes_AS_STRING(out);
    const int64_t *tl = (const int64_t *)tails.buf, *len = (const int64_t *)lengths.buf, *pos = (const int64_t *)positions.buf;
    for (Py_ssize_t i = 0; i < n; i++, o += 5) {
        uint64_t h = mix_g((uint64_t)pos[i]);
        for (int64_t j = 0; j < len[i] && j < 3; j++) h = mix_g(h ^ (uint64_t)tl[3 * i + j]);
        const int64_t fav = priced_word(h, -1, -1, -1);
        const int tied = ties > 0.0 && below(mix_g(h ^ 0x71E50B0EULL), ties);
        if (agreement < 0.0 || below(mix_g(h ^ 0x5EEDA9E5ULL), agreement)) {
            o[0] = (int64_t)(h % (uint64_t)pool);
            o[1] = fav;
            o[2] = priced_word(mix_g(h ^ 1), fav, -1, -1);
            o[3] = priced_word(mix_g(h ^ 2), fav, -1, -1);
            o[4] = tied;
            continue;
        }
        const uint64_t d = mix_g(h ^ 0xD4AF7001ULL);
        const int64_t mine = priced_word(d, fav, -1, -1);
        const int64_t second = below(mix_g(d ^ 3), runner_up) ? fav : priced_word(mix_g(d ^ 1), fav, mine, -1);
        o[0] = (int64_t)(d % (uint64_t)pool);
        o[1] = mine;
        o[2] = second;
        o[3] = priced_word(mix_g(d ^ 2), fav, mine, second);
        o[4] = 0;
    }
done:
    PyBuffer_Release(&tails);
    PyBuffer_Release(&lengths);
    PyBuffer_Release(&positions);
    return out;
}

static PyObject *spin(PyObject *self, PyObject *args) {
    double seconds;
    unsigned long long flag = 0;
    if (!PyArg_ParseTuple(args, "d|K", &seconds, &flag)) return NULL;
    const volatile char *stop = (const volatile char *)(uintptr_t)flag;
    int stopped = 0;
    Py_BEGIN_ALLOW_THREADS
    const double until = now_s() + seconds;
    while (now_s() < until) {
        if (stop != NULL && *stop) {
            stopped = 1;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(!stopped);
}

/* llama.cpp's batch and the three functions steps() calls, as the pinned llama.h declares them (llama_token,
 * llama_pos and llama_seq_id are int32_t; llama_cpp's ctypes mirror the same layout). Their addresses come
 * from the loaded library at run time: this module links nothing of llama.cpp. The batch's size travels in
 * each call (steps_call.batch_size, llama_cpp's ctypes.sizeof), so a llama.h whose batch grew is refused,
 * not written past. */
typedef struct {
    int32_t n_tokens;
    int32_t *token;
    float *embd;
    int32_t *pos;
    int32_t *n_seq_id;
    int32_t **seq_id;
    int8_t *logits;
} llama_batch_t;
typedef int32_t (*decode_fn)(void *ctx, llama_batch_t batch);
typedef float *(*logits_fn)(void *ctx);
typedef _Bool (*is_eog_fn)(const void *vocab, int32_t token);
/* A row's hook (coupling.RowHook's native form): called on each output row before its draw, with the drawn
 * token's position and the token decoded before it (the row's last input: the hook follows the answer
 * with it); it may change the row in place (a grammar's mask sets -inf, penalties and a bias add). Called
 * too with no row (NULL) when a token is drawn that the loop decodes next, with that token and its
 * position: what the next row will need can start while the decode runs. It returns 1 where the row is
 * to be drawn under the mask at steps_call.mask (the hook filled it; masked_draw_core), else 0. */
typedef int32_t (*row_hook_fn)(void *user, float *row, int64_t n_vocab, int64_t position, int32_t previous);

/* A row hook that calls a Python callable (its user pointer, a borrowed reference the caller keeps alive) as
 * callable(row address or 0, n_vocab, position, previous) -> int, with the interpreter's lock taken for the
 * call. What it raises, a KeyboardInterrupt that arrives as it starts included, stays set on the calling
 * thread and the hook returns -1: the loop stops and steps() raises it (a ctypes callback would print it as
 * "Exception ignored" and go on). */
static int32_t py_row_hook(void *user, float *row, int64_t n_vocab, int64_t position, int32_t previous) {
    PyGILState_STATE g = PyGILState_Ensure();
    int32_t out = -1;
    PyObject *r = PyObject_CallFunction((PyObject *)user, "KLLi", (unsigned long long)(uintptr_t)row,
                                        (long long)n_vocab, (long long)position, (int)previous);
    if (r != NULL) {
        const long v = PyLong_AsLong(r);
        Py_DECREF(r);
        out = v == -1 && PyErr_Occurred() ? -1 : (v == 1);
    }
    PyGILState_Release(g);
    return out;
}

/* row_hook_address() -> the address of py_row_hook, for a StepsCall's row_hook (its user: id(callable)) */
static PyObject *row_hook_address(PyObject *self, PyObject *unused) {
    return PyLong_FromVoidPtr((void *)py_row_hook);
}

/* steps()'s one argument, read from a buffer of exactly this layout: ssd_edge/llama/context.py's StepsCall,
 * a ctypes.Structure with these fields in this order (a buffer of another size is refused). The first
 * eight are a context's and stay the same from call to call; the rest are one call's. */
typedef struct {
    decode_fn decode;         /* llama_decode */
    logits_fn get_logits;     /* llama_get_logits: the output row of the last decode (one output per batch) */
    is_eog_fn is_eog;         /* llama_vocab_is_eog */
    void *ctx;                /* the llama_context */
    const void *vocab;        /* its model's llama_vocab */
    llama_batch_t *batch;     /* the context's batch buffer: each step's one token goes in its arrays */
    int64_t batch_size;       /* sizeof(llama_batch) as the caller's llama_cpp declares it: sizeof(llama_batch_t) */
    int64_t n_vocab;          /* a logit row's length */
    int32_t token;            /* the first token decoded, at position pos of sequence seq */
    int32_t pos;
    int32_t seq;
    int64_t most;             /* draw at most this many tokens (>= 1) */
    double seconds;           /* and stop after the step that reaches this many seconds (looked at after each) */
    int64_t top_k;            /* the draw (coupling.Drawer.native): 0 greedy, else top-k on, < n_vocab */
    double top_p;
    double min_p;
    double temperature;       /* > 0 where top_k > 0 */
    uint64_t seed;
    row_hook_fn row_hook;     /* NULL: none; else called on each row before its draw */
    void *row_hook_user;      /* the hook's first argument */
    const uint32_t *mask;     /* a grammar's mask the hook fills (bit i of word w: token 32 w + i allowed) */
    int64_t mask_words;
} steps_call;

/* steps(call: StepsCall) -> (drawn, rc, in_decode_s, decoded, undecided)
 *
 * Plain decoding in one call, the interpreter's lock released throughout: decode `token` at `pos` of
 * sequence `seq` (one output), draw the next token from its row, decode that one, and so on, until `most`
 * tokens are drawn, an end of generation is drawn, `seconds` have passed (looked at after each step), or a
 * decode fails (rc: llama_decode's code; the tokens drawn before it stand). Each row goes through the
 * call's row hook first, where it has one (the Python draw's coupling.Drawer does the same). A draw is the
 * engine's own: top_k 0 is greedy (argmax_core: np.argmax), else the coupled draw from the support (support_core then
 * gumbel_core at the drawn token's position, pos + 1 for the first), as draw() makes it. Where a row's draw
 * is not the C pass's to make (support_core's 0: NaN, ties past its buffer; or its -1, out of memory) the
 * loop stops with undecided = 1: that row is the context's output row still, for the caller to draw from
 * (what was decoded stays decoded, and the caller knows it). in_decode_s: the
 * seconds inside llama_decode and the logits read that synchronizes with it; decoded: decodes that ran. */
static PyObject *steps(PyObject *self, PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) return NULL;
    if (buf.len != (Py_ssize_t)sizeof(steps_call)) {
        PyErr_Format(PyExc_ValueError, "steps: a call of %zd bytes, not %zd (StepsCall and native.c's steps_call "
                     "differ)", buf.len, (Py_ssize_t)sizeof(steps_call));
        PyBuffer_Release(&buf);
        return NULL;
    }
    steps_call c;  /* a copy: the caller's struct is free again once parsed */
    memcpy(&c, buf.buf, sizeof c);
    PyBuffer_Release(&buf);
    if (c.batch_size != (int64_t)sizeof(llama_batch_t)) {
        PyErr_Format(PyExc_ValueError, "steps: llama_batch is %lld bytes in llama_cpp, %zd in native.c",
                     (long long)c.batch_size, (Py_ssize_t)sizeof(llama_batch_t));
        return NULL;
    }
    const int64_t n_vocab = c.n_vocab, most = c.most, k = c.top_k;
    if (!c.decode || !c.get_logits || !c.is_eog || !c.ctx || !c.batch || n_vocab < 1 || most < 1 || k < 0 ||
        k >= n_vocab || (k > 0 && !(c.temperature > 0.0))) {
        PyErr_SetString(PyExc_ValueError, "steps: null function or context, an empty vocabulary, most < 1, or "
                                          "top_k outside 0..n_vocab-1 (or a sampled draw at temperature <= 0)");
        return NULL;
    }
    llama_batch_t b = *c.batch;  /* its arrays are the context's batch buffer */
    int32_t *drawn = malloc((size_t)most * sizeof(int32_t));
    float *bound = malloc((size_t)(n_vocab / GROUP + 1) * sizeof(float));
    if (drawn == NULL || bound == NULL) {
        free(drawn);
        free(bound);
        return PyErr_NoMemory();
    }
    Py_ssize_t n = 0, decoded = 0;
    int rc = 0, status = 1;  /* support_core's answer: 1 drawn, 0 not its to draw, -1 out of memory */
    int hook_failed = 0;
    double in_decode = 0.0;
    Py_BEGIN_ALLOW_THREADS
    const double start = now_s();
    int32_t t = c.token, p = c.pos;
    for (;;) {
        b.n_tokens = 1;
        b.token[0] = t;
        b.pos[0] = p;
        b.n_seq_id[0] = 1;
        b.seq_id[0][0] = c.seq;
        b.logits[0] = 1;
        const double t0 = now_s();
        rc = c.decode(c.ctx, b);
        const float *row = rc == 0 ? c.get_logits(c.ctx) : NULL;
        in_decode += now_s() - t0;
        if (rc != 0) break;
        decoded++;
        const int32_t hooked = c.row_hook ? c.row_hook(c.row_hook_user, (float *)row, n_vocab, (int64_t)p + 1, t) : 0;
        if (hooked < 0) {  /* the hook failed: raised after the loop (py_row_hook left its exception set) */
            hook_failed = 1;
            break;
        }
        const int masked = hooked == 1 && c.mask != NULL;
        int64_t next;
        if (masked) {
            status = masked_draw_core((float *)row, n_vocab, c.mask, c.mask_words, k, c.top_p, c.min_p, c.temperature,
                                      c.seed, (uint64_t)p + 1, bound, &next);
            if (status != 1) break;
        } else if (k == 0) {
            next = argmax_core(row, n_vocab, bound);
        } else {
            int64_t *idx;
            double *pr;
            Py_ssize_t m = 0;
            status = support_core(row, n_vocab, k, c.top_p, c.min_p, c.temperature, &idx, &pr, &m);
            next = status == 1 ? (m == 1 ? idx[0] : gumbel_core(idx, pr, m, c.seed, (uint64_t)p + 1)) : 0;
            free(idx);
            free(pr);
            if (status != 1) break;
        }
        drawn[n++] = (int32_t)next;
        if (n >= most || c.is_eog(c.vocab, (int32_t)next) || now_s() - start >= c.seconds) break;
        /* the token is drawn, and decoded next: the hook may start on the next row's work (a grammar's mask)
         * while the decode runs (a call with no row, the drawn token's position, the token) */
        if (c.row_hook && c.row_hook(c.row_hook_user, NULL, n_vocab, (int64_t)p + 1, (int32_t)next) < 0) {
            hook_failed = 1;
            break;
        }
        t = (int32_t)next;
        p++;
    }
    Py_END_ALLOW_THREADS
    free(bound);
    if (hook_failed) {  /* what the hook raised (a Ctrl-C included) is the caller's; nothing drawn counts */
        free(drawn);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "steps: the row hook failed");
        return NULL;
    }
    PyObject *list = PyList_New(n);
    if (list == NULL) {
        free(drawn);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLong(drawn[i]);
        if (v == NULL) {
            Py_DECREF(list);
            free(drawn);
            return NULL;
        }
        PyList_SET_ITEM(list, i, v);
    }
    free(drawn);
    return Py_BuildValue("(Nidni)", list, rc, in_decode, decoded, status != 1);
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
#ifdef HAVE_AVX_SCAN
    const int was = scan == scan_8wide ? 8 : 4;
    if (want == 8 && !__builtin_cpu_supports("avx")) {
        PyErr_SetString(PyExc_ValueError, "this CPU has no AVX: the pass is 4 wide");
        return NULL;
    }
    if (want) {
        scan = want == 8 ? scan_8wide : scan_4wide;
        group_maxima = want == 8 ? group_maxima_8wide : group_maxima_4wide;
    }
#else
    const int was = 4;
    if (want == 8) {
        PyErr_SetString(PyExc_ValueError, "built without the 8-wide pass (not x86-64 with GCC or Clang)");
        return NULL;
    }
#endif
    return PyLong_FromLong(was);
}

static PyMethodDef methods[] = {
    {"scan_width", scan_width, METH_VARARGS,
     "scan_width([width]) -> the top-k pass's width (4, or 8 with AVX); with an argument, set it (tests)."},
    {"head_draws", head_draws, METH_VARARGS,
     "head_draws(ids, logits, width, top_k, top_p, min_p, temperature, seed, positions) -> bytes or None"},
    {"copy_rows", copy_rows, METH_VARARGS, "copy_rows(out, src, index, width): out[i] = src[index[i]], unlocked."},
    {"priced_choices", priced_choices, METH_VARARGS,
     "priced_choices(tails, lengths, positions, agreement, ties, pool, runner_up) -> bytes (n x 5 int64)"},
    {"spin", spin, METH_VARARGS,
     "spin(seconds[, flag]): busy-wait that long with the interpreter's lock released; False if the byte at address "
     "flag turned non-zero first (an abort)."},
    {"support", support, METH_VARARGS,
     "support(row, top_k, top_p, min_p, temperature) -> (ids, p) as bytes (int64 ascending, float64), or None: "
     "sampling.support's chain on the row's top_k candidates."},
    {"head", head, METH_VARARGS,
     "head(row, k, temperature) -> (ids, p) as bytes, or None: sampling.head_probs (most likely first)."},
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
#ifdef HAVE_AVX_SCAN
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx")) {
        scan = scan_8wide;
        group_maxima = group_maxima_8wide;
    }
#endif
    return PyModule_Create(&module);
}
