/* priced.c: the priced backend's work in C (bench/priced/backend.py): its busy wait, as a CUDA host thread
 * waits for its GPU; its rows' copies, its device's work and not the host thread's; and its language's
 * choices, the hashes of a context that decide what the priced pair "says".
 */
#include <string.h>

#include "native.h"

/* A busy wait of `seconds` on this core (it spins: the core stays awake and its caches warm), or until the
 * byte at `stop` (where not NULL) turns non-zero (an abort): 1 where it waited the whole time, 0 stopped. */
int spin_core(double seconds, const volatile char *stop) {
    const double until = now_s() + seconds;
    while (now_s() < until)
        if (stop != NULL && *stop) return 0;
    return 1;
}

/* out's row i = src's row at[i] (float32 rows of `width`; the indices checked by the caller): the priced
 * backend's rows_for (9 rows of 152k floats are 1.5 ms of copying on a slow core) */
void copy_rows_core(float *out, const float *src, const int64_t *at, ptrdiff_t n, ptrdiff_t width) {
    for (ptrdiff_t i = 0; i < n; i++)
        memcpy(out + i * width, src + at[i] * width, (size_t)width * sizeof(float));
}

/* The priced pair's language (backend.py's choices(), the reference the tests hold this to): splitmix64
 * hashes of a context, in the same arithmetic as its Python. */
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

/* n rows of 5 int64 into out, row i choices(tails[3 i ..][:lengths[i]], positions[i], agreement or None
 * (agreement < 0), ties) of backend.py; pool >= 1 */
void priced_choices_core(const int64_t *tails, const int64_t *lengths, const int64_t *positions, ptrdiff_t n,
                         double agreement, double ties, int64_t pool, double runner_up, int64_t *out) {
    int64_t *o = out;
    for (ptrdiff_t i = 0; i < n; i++, o += 5) {
        uint64_t h = mix_g((uint64_t)positions[i]);
        for (int64_t j = 0; j < lengths[i] && j < 3; j++) h = mix_g(h ^ (uint64_t)tails[3 * i + j]);
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
}
