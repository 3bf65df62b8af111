/* draws.c: the sampling chain on a row's candidates and the coupled draw from them.
 *
 * support_core and gumbel_core are sampling.support and coupling.gumbel_draw for a row with top-k on, the
 * same steps in the same order (the numpy paths are the reference the tests hold these to; exp and log may
 * differ from numpy's in the last bit); draw_core is the two in one call, the token alone handed back.
 * masked_draw_core draws under a grammar's mask; head_core and head_draws_core read heads (sampling.Heads).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "native.h"

/* numpy's float64 sum (pairwise_sum in its umath loops): 8 running sums over blocks of 128, halves above
 * that; the same order, so the same bits, as the numpy path's p.sum() */
static double np_sum(const double *a, ptrdiff_t n) {
    if (n < 8) {
        double r = 0.0;  /* numpy starts a short sum at -0.0: the same for the positive numbers summed here */
        for (ptrdiff_t i = 0; i < n; i++) r += a[i];
        return r;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; j++) r[j] = a[j];
        ptrdiff_t i;
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    ptrdiff_t n2 = n / 2;
    n2 -= n2 % 8;
    return np_sum(a, n2) + np_sum(a + n2, n - n2);
}

typedef struct {
    double p;
    ptrdiff_t j;
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

static double max_of(const double *z, ptrdiff_t m) {
    double zmax = z[0];
    for (ptrdiff_t j = 1; j < m; j++) if (z[j] > zmax) zmax = z[j];
    return zmax;
}

/* p = exp(z - max z) / their sum, in numpy's order of operations (sampling.py's softmax) */
static void softmax(const double *z, double *p, ptrdiff_t m) {
    const double zmax = max_of(z, m);
    for (ptrdiff_t j = 0; j < m; j++) p[j] = exp(z[j] - zmax);
    const double total = np_sum(p, m);
    for (ptrdiff_t j = 0; j < m; j++) p[j] /= total;
}

/* sampling.support for top_k > 0 (see there), step by step in its order and arithmetic: the support's ids
 * ascending in (*idx_out)[0..*m_out-1] and their probabilities in *p_out, two arrays of top_k it allocates
 * (the caller frees them, whatever it returns). 1 on success, 0 where the numpy path must decide (NaN, ties
 * past the buffer), -1 out of memory. The seed is not read. */
int support_core(const float *x, ptrdiff_t n, const draw_spec *d, int64_t **idx_out, double **p_out,
                 ptrdiff_t *m_out) {
    const ptrdiff_t k = d->top_k;
    const double top_p = d->top_p, min_p = d->min_p, temperature = d->temperature;
    int64_t *idx = *idx_out = malloc((size_t)k * sizeof(int64_t));
    double *p = *p_out = malloc((size_t)k * sizeof(double));
    double *z = malloc((size_t)k * sizeof(double));
    Ranked *rank = malloc((size_t)k * sizeof(Ranked));
    int64_t *pair = malloc((size_t)k * 2 * sizeof(int64_t));
    int ok = (idx && p && z && rank && pair) ? 1 : -1;
    ptrdiff_t m = k;
    if (ok == 1) ok = topk_core(x, n, k, idx, &m);  /* -inf (refused by a grammar) has p 0: never kept */
    if (ok == 1) {
        for (ptrdiff_t j = 0; j < m; j++) z[j] = (double)x[idx[j]];
        if (top_p < 1.0) {  /* the smallest descending prefix whose mass (at temperature 1) reaches top_p */
            softmax(z, p, m);
            for (ptrdiff_t j = 0; j < m; j++) {
                rank[j].p = p[j];
                rank[j].j = j;
            }
            qsort(rank, (size_t)m, sizeof(Ranked), by_p_descending);
            double cum = 0.0;
            ptrdiff_t cut = m;
            for (ptrdiff_t i = 0; i < m; i++) {
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
                for (ptrdiff_t i = 0; i < cut; i++) kept[rank[i].j] = 1;
                ptrdiff_t w = 0;
                for (ptrdiff_t j = 0; j < m; j++)
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
        ptrdiff_t w = 0;
        for (ptrdiff_t j = 0; j < m; j++)
            if (z[j] >= floor_) {
                idx[w] = idx[j];
                z[w] = z[j];
                w++;
            }
        m = w;
    }
    if (ok == 1) {  /* softmax at the temperature, then ids ascending, then what underflowed dropped */
        for (ptrdiff_t j = 0; j < m; j++) z[j] = z[j] / temperature;
        softmax(z, p, m);
        for (ptrdiff_t j = 0; j < m; j++) {
            pair[2 * j] = idx[j];
            memcpy(&pair[2 * j + 1], &p[j], sizeof(double));
        }
        qsort(pair, (size_t)m, 2 * sizeof(int64_t), by_id);
        ptrdiff_t w = 0;
        for (ptrdiff_t j = 0; j < m; j++) {
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

/* sampling.head_probs: the row's k largest logits (1 <= k < n) at the temperature into idx[0..k-1], most
 * likely first, and their probabilities normalised over those k into p[0..k-1] */
int head_core(const float *x, ptrdiff_t n, ptrdiff_t k, double temperature, int64_t *idx, double *p) {
    Scored *sc = malloc((size_t)k * sizeof(Scored));
    int ok = sc ? topk_padded(x, n, k, idx) : -1;
    if (ok == 1) {
        for (ptrdiff_t j = 0; j < k; j++) {
            sc[j].z = (double)x[idx[j]] / temperature;
            sc[j].id = idx[j];
        }
        qsort(sc, (size_t)k, sizeof(Scored), by_z_then_id);
        for (ptrdiff_t j = 0; j < k; j++) {
            p[j] = exp(sc[j].z - sc[0].z);
            idx[j] = sc[j].id;
        }
        double total = np_sum(p, k);
        for (ptrdiff_t j = 0; j < k; j++) p[j] /= total;
    }
    free(sc);
    return ok;
}


/* the id of ids[0..m-1] maximising log p + G(seed, position, id), the first of equals: coupling.gumbel_draw
 * (its noise: U(seed, position, id) from mix64) */
int64_t gumbel_core(const int64_t *ids, const double *p, ptrdiff_t m, uint64_t seed, uint64_t position) {
    const uint64_t golden = 0x9E3779B97F4A7C15ULL, m2 = 0x94D049BB133111EBULL;
    uint64_t key = mix64((seed & ((1ULL << 63) - 1)) + golden);
    key = mix64(key ^ (position * golden));
    int64_t best = ids[0];
    double best_score = -INFINITY;
    for (ptrdiff_t j = 0; j < m; j++) {
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


/* coupling.draw for top_k > 0: support_core, then gumbel_core with the row's position (the support's one
 * id where it holds one). ids non-NULL: the row's positions stand for ids[position] (a head's tokens, a
 * gathered row's), mapped before the draw, which is keyed to the tokens. */
int draw_core(const float *x, ptrdiff_t n, const draw_spec *d, uint64_t position, const int64_t *ids,
              int64_t *out) {
    int64_t *idx;
    double *p;
    ptrdiff_t m = 0;
    int ok = support_core(x, n, d, &idx, &p, &m);
    if (ok == 1) {
        if (ids != NULL)
            for (ptrdiff_t j = 0; j < m; j++) idx[j] = ids[idx[j]];
        *out = m == 1 ? idx[0] : gumbel_core(idx, p, m, d->seed, position);
    }
    free(idx);
    free(p);
    return ok;
}

/* coupling.head_draws for rows handed over as heads (sampling.Heads: n rows of `width` int64 ids and float32
 * logits, most likely first; top_k < width): each row's draw_core over its head, keyed to the head's ids,
 * at positions[i]; the whole row's draw where the head is wider than top-k. 1 all drawn, else the first
 * undrawn row's 0 or -1. */
int head_draws_core(const int64_t *ids, const float *logits, const int64_t *positions, ptrdiff_t n,
                    ptrdiff_t width, const draw_spec *d, int64_t *tokens) {
    for (ptrdiff_t i = 0; i < n; i++) {
        const int ok = draw_core(logits + i * width, width, d, (uint64_t)positions[i], ids + i * width, &tokens[i]);
        if (ok != 1) return ok;
    }
    return 1;
}

/* The draw from row x under a grammar's mask: the same token as mask_core, then argmax_core (top_k 0) or
 * draw_core (coupling.Drawer on the masked row), without writing -inf over the row
 * where the mask allows few tokens (a JSON grammar's usual state): their values are gathered (ids
 * ascending) and drawn from as a row of their own, which keeps top_ids' order among them (the gathered
 * row gets two -inf after them: where no more than k are allowed, top-k keeps every one, ids ascending,
 * as it does on the masked row).
 * 1 drawn (*out), 0 where Python must decide (nothing allowed, NaN, ties past the buffer), -1 out of memory. */
int masked_draw_core(float *x, ptrdiff_t n, const uint32_t *w, ptrdiff_t words, const draw_spec *d,
                     uint64_t position, float *bound, int64_t *out) {
    const ptrdiff_t k = d->top_k;
    ptrdiff_t allowed = 0;
    const ptrdiff_t full = n / 32 < words ? n / 32 : words;
    for (ptrdiff_t j = 0; j < full; j++) allowed += __builtin_popcount(w[j]);
    if (allowed == 0) return 0;
    if (allowed > n / 8 || full < words || n % 32) {  /* many allowed (free text, a string): in place */
        mask_core(x, n, w, words);
        if (k == 0) {
            *out = argmax_core(x, n, bound);
            return 1;
        }
        return draw_core(x, n, d, position, NULL, out);
    }
    float *v = malloc((size_t)(allowed + 2) * sizeof(float));
    int64_t *id = malloc((size_t)(allowed + 2) * sizeof(int64_t));
    if (v == NULL || id == NULL) {
        free(v);
        free(id);
        return -1;
    }
    ptrdiff_t m = 0;
    for (ptrdiff_t j = 0; j < full; j++)
        for (uint32_t b = w[j]; b; b &= b - 1) {
            const ptrdiff_t t = j * 32 + __builtin_ctz(b);
            id[m] = t;
            v[m++] = x[t];
        }
    int ok = 1;
    if (k == 0) {  /* np.argmax's first largest (a NaN first): ids ascending, as in the row */
        ptrdiff_t best = 0;
        for (ptrdiff_t j = 0; j < m; j++) {
            if (v[j] != v[j]) {
                best = j;
                break;
            }
            if (v[j] > v[best]) best = j;
        }
        *out = id[best];
    } else {
        v[m] = v[m + 1] = -INFINITY;  /* refused tokens' places: top-k then keeps all m where m <= k */
        draw_spec all = *d;
        all.top_k = k < m ? k : m + 1;
        ok = draw_core(v, m + 2, &all, position, id, out);  /* keyed to the tokens, not the gathered places */
    }
    free(v);
    free(id);
    return ok;
}
