/* ssd_edge.native: the two things ssd-edge does in C.
 *
 * spin(seconds): wait that long on this core, the interpreter's lock released, as a CUDA host thread
 * waits for its GPU (it spins: the core stays awake and its caches warm). The priced backend's wait.
 *
 * top_ids(row, k) -> bytes: k int64 ids; those above the k-th largest value in ascending order, then
 * those equal to it in ascending order (ties at the boundary go to the lower ids), exactly as
 * sampling.top_ids' numpy path. None where it cannot tell (more ties at the boundary than it keeps, or
 * NaN logits): the caller takes the numpy path.
 *
 * How: one pass keeps every value at or above a running threshold t in a small buffer, in row order
 * (so ascending ids). When the buffer fills, t rises to the k-th largest value it holds and the entries
 * below t go. The pass tests 16 values at a time against t (vectorised) and looks at single values
 * only in a block that holds one at or above t: after the first thousand values, almost none do.
 * Every value >= the final k-th largest was kept (t never passes it), so the answer is in the buffer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BLOCK 16

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
    if (!(v >= s->t)) return 1;
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

static PyObject *top_ids(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "y*n", &buf, &k)) return NULL;
    const float *x = (const float *)buf.buf;
    Py_ssize_t n = buf.len / (Py_ssize_t)sizeof(float);
    if (k < 1 || k >= n) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "top_ids: need 1 <= k < len(row)");
        return NULL;
    }
    Kept s;
    s.k = k;
    s.cap = k * 4 > 256 ? k * 4 : 256;
    s.n = 0;
    s.t = -INFINITY;
    s.val = malloc((size_t)s.cap * sizeof(float));
    s.scratch = malloc((size_t)s.cap * sizeof(float));
    s.id = malloc((size_t)s.cap * sizeof(int64_t));
    PyObject *out = NULL;
    int ok = s.val && s.scratch && s.id;
    if (!ok) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t i = 0;
    for (; ok == 1 && i + BLOCK <= n; i += BLOCK) {
        if (!block_reaches(x + i, s.t)) continue;
        for (int j = 0; j < BLOCK && ok; j++) {
            float v = x[i + j];
            if (v != v) ok = -1;  /* NaN: the numpy path decides */
            else ok = keep(&s, v, (int64_t)(i + j));
        }
    }
    for (; ok == 1 && i < n; i++) {
        float v = x[i];
        if (v != v) ok = -1;
        else ok = keep(&s, v, (int64_t)i);
    }
    Py_END_ALLOW_THREADS
    if (ok != 1 || s.n < k) {  /* ties past the buffer, NaN, or fewer than k finite values (-inf rows) */
        Py_INCREF(Py_None);
        out = Py_None;
        goto done;
    }
    memcpy(s.scratch, s.val, (size_t)s.n * sizeof(float));
    float edge = kth_largest(s.scratch, s.n, k);
    out = PyBytes_FromStringAndSize(NULL, k * (Py_ssize_t)sizeof(int64_t));
    if (out != NULL) {
        int64_t *ids = (int64_t *)PyBytes_AS_STRING(out);
        Py_ssize_t m = 0;
        for (Py_ssize_t j = 0; j < s.n && m < k; j++)
            if (s.val[j] > edge) ids[m++] = s.id[j];
        for (Py_ssize_t j = 0; j < s.n && m < k; j++)
            if (s.val[j] == edge) ids[m++] = s.id[j];
    }
done:
    free(s.val);
    free(s.scratch);
    free(s.id);
    PyBuffer_Release(&buf);
    return out;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static PyObject *spin(PyObject *self, PyObject *args) {
    double seconds;
    if (!PyArg_ParseTuple(args, "d", &seconds)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    const double until = now_s() + seconds;
    while (now_s() < until) {
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"spin", spin, METH_VARARGS, "spin(seconds): busy-wait that long with the interpreter's lock released."},
    {"top_ids", top_ids, METH_VARARGS,
     "top_ids(row: float32 buffer, k) -> bytes of k int64 ids (above the k-th largest ascending, then equal "
     "to it ascending), or None (ties past its buffer, NaN): see ssd_edge/sampling.py."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "native",
                                    "A logit row's k largest in one pass; a busy wait without the GIL.", -1, methods};

PyMODINIT_FUNC PyInit_native(void) { return PyModule_Create(&module); }
