/* rows.c: a logit row's k largest in one pass, its argmax, and a grammar's mask on it.
 *
 * topk_core(row, k): k ids; those above the k-th largest value in ascending order, then those equal to it
 * in ascending order (ties at the boundary go to the lower ids), exactly as sampling.top_ids' numpy path;
 * 0 where it cannot tell (more ties at the boundary than it keeps, or NaN logits): the caller takes the
 * numpy path.
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
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "native.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_AVX_SCAN 1
#endif

#define BLOCK 16
#define SPAN (2 * BLOCK)  /* values a scan tests at a time */

/* the k-th largest (1-based) of v[0..n-1]; v is reordered (quickselect) */
static float kth_largest(float *v, ptrdiff_t n, ptrdiff_t k) {
    ptrdiff_t lo = 0, hi = n - 1, want = k - 1;  /* the value at index want when v is descending */
    while (lo < hi) {
        float pivot = v[lo + (hi - lo) / 2];
        ptrdiff_t i = lo, j = hi;
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
    ptrdiff_t n, cap, k;
    float t;
    int finite;  /* keep no -inf (a grammar's refused tokens): they cannot be drawn */
} Kept;

/* raise t to the k-th largest kept value and drop what is below it; 0 if still full (ties) */
static int compact(Kept *s) {
    memcpy(s->scratch, s->val, (size_t)s->n * sizeof(float));
    s->t = kth_largest(s->scratch, s->n, s->k);
    ptrdiff_t m = 0;
    for (ptrdiff_t i = 0; i < s->n; i++) {
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
static ptrdiff_t scan_4wide(const float *x, ptrdiff_t i, ptrdiff_t n, float t) {
    for (; i + SPAN <= n; i += SPAN)
        if (block_reaches(x + i, t) || block_reaches(x + i + BLOCK, t)) return i;
    return i;
}

#ifdef HAVE_AVX_SCAN
__attribute__((target("avx")))
static ptrdiff_t scan_8wide(const float *x, ptrdiff_t i, ptrdiff_t n, float t) {
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

static ptrdiff_t (*scan)(const float *, ptrdiff_t, ptrdiff_t, float) = scan_4wide;

/* bound[g]: the largest of group g (x[g * GROUP ..], GROUP values), for g < groups; +inf where the group
 * holds a NaN (so the pass looks at it and meets the NaN). The bounds of the threshold (topk_core). */
static void group_maxima_4wide(const float *x, ptrdiff_t groups, float *bound) {
    for (ptrdiff_t g = 0; g < groups; g++, x += GROUP) {  /* 4-wide vector compares and selects */
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
static void group_maxima_8wide(const float *x, ptrdiff_t groups, float *bound) {
    for (ptrdiff_t g = 0; g < groups; g++, x += GROUP) {
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

static void (*group_maxima)(const float *, ptrdiff_t, float *) = group_maxima_4wide;

/* bit j set where x[j] >= t or is NaN (not < t), j < SPAN: which values of a span the pass must look at
 * (branch-free, so the compiler vectorises it; a span the scan stops at holds one or two of them) */
static inline uint32_t span_mask(const float *x, float t) {
    uint32_t m = 0;
    for (int j = 0; j < SPAN; j++) m |= (uint32_t)!(x[j] < t) << j;
    return m;
}

/* The values of x[*i..] >= t into s, in row order, through the whole spans before `end` (*i left at the
 * first value after them); 1, or 0 at a NaN (the numpy path decides), -1 out of memory */
static int pass(Kept *s, const float *x, ptrdiff_t *i, ptrdiff_t end) {
    int ok = 1;
    ptrdiff_t at = *i;
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
int topk_core(const float *x, ptrdiff_t n, ptrdiff_t k, int64_t *ids, ptrdiff_t *got) {
    Kept s;
    s.k = k;
    s.finite = got != NULL;
    s.cap = k * 4 > 256 ? k * 4 : 256;
    s.n = 0;
    s.t = -INFINITY;
    s.val = malloc((size_t)s.cap * sizeof(float));
    s.scratch = malloc((size_t)s.cap * sizeof(float));
    s.id = malloc((size_t)s.cap * sizeof(int64_t));
    const ptrdiff_t groups = n / GROUP;
    /* the groups' maxima, then a copy of them that the selection reorders */
    float *bound = groups >= 2 * k ? malloc((size_t)groups * 2 * sizeof(float)) : NULL;
    int ok = (s.val && s.scratch && s.id) ? 1 : -1;
    ptrdiff_t i = 0;
    if (ok == 1 && bound != NULL) {  /* the groups' maxima, then t starts at the k-th largest of them */
        group_maxima(x, groups, bound);
        memcpy(bound + groups, bound, (size_t)groups * sizeof(float));
        s.t = kth_largest(bound + groups, groups, k);
        if (s.finite && s.t == -INFINITY) s.t = -FLT_MAX;  /* fewer than k groups hold a finite value (a grammar's
                                                             * mask): the scans skip the refused, not test each */
        for (ptrdiff_t g = 0; ok == 1 && g < groups; g++) {
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
        ptrdiff_t m = 0;
        for (ptrdiff_t j = 0; j < s.n && m < k; j++)
            if (s.val[j] > edge) ids[m++] = s.id[j];
        for (ptrdiff_t j = 0; j < s.n && m < k; j++)
            if (s.val[j] == edge) ids[m++] = s.id[j];
        if (got) *got = k;
    } else if (ok == 1 && got != NULL && s.n >= 1) {  /* fewer than k finite: all of them, in row order */
        for (ptrdiff_t j = 0; j < s.n; j++) ids[j] = s.id[j];
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
int topk_padded(const float *x, ptrdiff_t n, ptrdiff_t k, int64_t *ids) {
    ptrdiff_t m = 0;
    int ok = topk_core(x, n, k, ids, &m);
    if (ok != 1 || m >= k) return ok;
    for (ptrdiff_t i = 0; i < n && m < k; i++)
        if (x[i] == -INFINITY) ids[m++] = (int64_t)i;
    return m == k ? 1 : 0;
}

/* np.argmax of x[0..n-1] (n >= 1): the first index of its largest value, or of its first NaN where it has
 * one. The groups' maxima (one vectorised pass), then the first group that holds the largest, value by
 * value; the tail after the last whole group value by value. A NaN, or +inf, takes numpy's order pass. */
ptrdiff_t argmax_core(const float *x, ptrdiff_t n, float *bound) {
    const ptrdiff_t groups = n / GROUP;
    group_maxima(x, groups, bound);
    float best = groups ? bound[0] : x[0];
    ptrdiff_t at = 0;
    for (ptrdiff_t g = 1; g < groups; g++)
        if (bound[g] > best) {
            best = bound[g];
            at = g;
        }
    for (ptrdiff_t i = groups * GROUP; i < n; i++)
        if (!(x[i] < INFINITY)) {  /* NaN or +inf in the tail */
            best = INFINITY;
            break;
        }
    if (best == INFINITY) {  /* a group with a NaN (or a +inf): numpy's answer, value by value */
        ptrdiff_t top = 0;
        for (ptrdiff_t i = 0; i < n; i++) {
            if (x[i] != x[i]) return i;
            if (x[i] > x[top]) top = i;
        }
        return top;
    }
    ptrdiff_t first = 0;
    if (groups)
        for (first = at * GROUP; x[first] != best; first++) {
        }
    for (ptrdiff_t i = groups ? groups * GROUP : 1; i < n; i++)  /* the tail wins only with a larger value */
        if (x[i] > x[first]) first = i;
    return first;
}

/* A grammar's mask on a row, in place (native.mask, the C loop's masked rows; structured/shaping.apply_mask):
 * -inf on every token whose bit is 0 (bit i of int32 word w is token 32 w + i) and past the mask's end. A
 * word at a time: all-allowed words skipped, all-refused ones written at once (a JSON grammar refuses most),
 * a partial word only at its refused bits. */
void mask_core(float *x, ptrdiff_t n, const uint32_t *w, ptrdiff_t words) {
    ptrdiff_t i = 0;
    for (ptrdiff_t j = 0; j < words && i < n; j++, i += 32) {
        const uint32_t b = w[j];
        if (b == 0xFFFFFFFFu) continue;
        const ptrdiff_t end = i + 32 < n ? i + 32 : n;
        if (b == 0) {
            for (ptrdiff_t t = i; t < end; t++) x[t] = -INFINITY;
        } else if (end - i == 32) {  /* only the refused ones: inside a JSON string, a few per word */
            for (uint32_t r = ~b; r; r &= r - 1) x[i + __builtin_ctz(r)] = -INFINITY;
        } else {
            for (ptrdiff_t t = i; t < end; t++)
                if (!((b >> (t - i)) & 1u)) x[t] = -INFINITY;
        }
    }
    for (; i < n; i++) x[i] = -INFINITY;
}

/* The pass's width: 8 where this CPU has AVX (the module's load), 4 elsewhere; native.scan_width sets it
 * for the tests, which run both. */
void scan_width_init(void) {
#ifdef HAVE_AVX_SCAN
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx")) {
        scan = scan_8wide;
        group_maxima = group_maxima_8wide;
    }
#endif
}

int scan_width_now(void) {
#ifdef HAVE_AVX_SCAN
    return scan == scan_8wide ? 8 : 4;
#else
    return 4;
#endif
}

int scan_width_set(int width) {
#ifdef HAVE_AVX_SCAN
    if (width == 8 && !__builtin_cpu_supports("avx")) return -2;
    scan = width == 8 ? scan_8wide : scan_4wide;
    group_maxima = width == 8 ? group_maxima_8wide : group_maxima_4wide;
    return 0;
#else
    return width == 8 ? -1 : 0;
#endif
}
