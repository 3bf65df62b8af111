/* native.h: the C files of ssd_edge.native (setup.py builds them into that one module) and what each
 * exports to the others. Only module.c and row_hook.c include Python.h: the rest is plain C on buffers,
 * run with the interpreter's lock held or released as module.c's entry points choose.
 *
 *   rows.c      a logit row's k largest in one pass (sampling.top_ids' order), its argmax, a grammar's mask
 *   draws.c     the sampling chain on a row's candidates and the coupled draw from them (coupling.py)
 *   steps.c     mode ar's plain steps in one call: decode, draw from the row, decode the drawn token, ...
 *   row_hook.c  the row hook that calls a Python callable from the steps' loop
 *   priced.c    the priced backend's work: its busy wait, its rows' copies, its language's choices
 *   wake.c      the word that wakes SSD's draft side at a verify's start (a futex on Linux)
 *   module.c    the Python entry points (arguments in, results out) and the module itself
 *
 * The functions on a row answer 1 (done), 0 (not the C pass's to decide: NaN, ties past its buffer; the
 * numpy path decides) or -1 (out of memory). Nothing here is seen outside the module (hidden). */
#ifndef SSD_EDGE_NATIVE_H
#define SSD_EDGE_NATIVE_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#if defined(__GNUC__)
#pragma GCC visibility push(hidden)
#endif

/* ---------------------------------------------------------------- rows.c */

/* argmax_core and masked_draw_core take a scratch of n / GROUP + 1 floats (the groups' maxima) */
#define GROUP 512

/* The k largest of x[0..n-1] (1 <= k < n) into ids[0..k-1], in sampling.top_ids' order (see rows.c). got
 * NULL: exactly k ids. got non-NULL: the finite ones alone (-inf is a token a grammar refused), k or fewer,
 * their count in *got. */
int topk_core(const float *x, ptrdiff_t n, ptrdiff_t k, int64_t *ids, ptrdiff_t *got);
/* topk_core's k ids, padded where a grammar's mask left fewer than k finite with the lowest refused ids */
int topk_padded(const float *x, ptrdiff_t n, ptrdiff_t k, int64_t *ids);
/* np.argmax of x[0..n-1] (n >= 1), bound: the scratch above */
ptrdiff_t argmax_core(const float *x, ptrdiff_t n, float *bound);
/* -inf on every token of x[0..n-1] whose bit is 0 (bit i of word j: token 32 j + i) and past the mask's end */
void mask_core(float *x, ptrdiff_t n, const uint32_t *w, ptrdiff_t words);
/* the pass's width, 4 or 8 (8 where x86-64 with GCC or Clang built it and the CPU has AVX) */
void scan_width_init(void);  /* the widest this CPU runs: once, as the module loads */
int scan_width_now(void);
int scan_width_set(int width);  /* 0 set; -1 built without the 8-wide pass; -2 the CPU has no AVX */

/* ---------------------------------------------------------------- draws.c */

/* A draw's settings (coupling.Drawer.native): the sampling chain's, and the coupling's seed. The same
 * fields in the same order as steps_call's, where it holds one. */
typedef struct {
    int64_t top_k;       /* 0: greedy (argmax); else top-k on, 1 <= top_k < the row's length */
    double top_p;
    double min_p;
    double temperature;  /* > 0 where top_k > 0 */
    uint64_t seed;
} draw_spec;

/* sampling.support for top_k > 0: the support's ids ascending in (*idx_out)[0..*m_out-1] and their
 * probabilities in *p_out, two arrays of top_k it allocates (the caller frees them, whatever it answers) */
int support_core(const float *x, ptrdiff_t n, const draw_spec *d, int64_t **idx_out, double **p_out,
                 ptrdiff_t *m_out);
/* sampling.head_probs: the k largest at the temperature into idx[0..k-1], most likely first, p normalised */
int head_core(const float *x, ptrdiff_t n, ptrdiff_t k, double temperature, int64_t *idx, double *p);
/* coupling.gumbel_draw: the id of ids[0..m-1] maximising log p + G(seed, position, id), the first of equals */
int64_t gumbel_core(const int64_t *ids, const double *p, ptrdiff_t m, uint64_t seed, uint64_t position);
/* coupling.draw for top_k > 0: support_core, then gumbel_core at position; ids non-NULL maps the row's
 * positions to the tokens they stand for (a head's, a gathered row's) before the draw */
int draw_core(const float *x, ptrdiff_t n, const draw_spec *d, uint64_t position, const int64_t *ids,
              int64_t *out);
/* coupling.head_draws: n heads of width ids and logits, one draw each at positions[i], into tokens */
int head_draws_core(const int64_t *ids, const float *logits, const int64_t *positions, ptrdiff_t n,
                    ptrdiff_t width, const draw_spec *d, int64_t *tokens);
/* the draw from row x under a grammar's mask (top_k 0: greedy); x may be written (-inf) */
int masked_draw_core(float *x, ptrdiff_t n, const uint32_t *w, ptrdiff_t words, const draw_spec *d,
                     uint64_t position, float *bound, int64_t *out);

/* coupling.py's noise, the priced language's hash too: splitmix64's finaliser */
static inline uint64_t mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* ---------------------------------------------------------------- row_hook.c */

/* A row's hook (coupling.RowHook's native form): called on each output row before its draw, with the drawn
 * token's position and the token decoded before it (the row's last input: the hook follows the answer
 * with it); it may change the row in place (a grammar's mask sets -inf, penalties and a bias add). Called
 * too with no row (NULL) when a token is drawn that the loop decodes next, with that token and its
 * position: what the next row will need can start while the decode runs. It returns 1 where the row is
 * to be drawn under the mask at steps_call.mask (the hook filled it; masked_draw_core), 0 where not, -1
 * where it failed (the loop stops). */
typedef int32_t (*row_hook_fn)(void *user, float *row, int64_t n_vocab, int64_t position, int32_t previous);

/* the hook that calls the Python callable at `user` (row_hook.c) */
int32_t py_row_hook(void *user, float *row, int64_t n_vocab, int64_t position, int32_t previous);

/* ---------------------------------------------------------------- steps.c */

/* llama.cpp's batch and the three functions steps_core calls, as the pinned llama.h declares them
 * (llama_token, llama_pos and llama_seq_id are int32_t; llama_cpp's ctypes mirror the same layout). Their
 * addresses come from the loaded library at run time: this module links nothing of llama.cpp. The batch's
 * size travels in each call (steps_call.batch_size, llama_cpp's ctypes.sizeof), so a llama.h whose batch
 * grew is refused, not written past. */
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

/* native.steps's one argument, read from a buffer of exactly this layout: ssd_edge/llama/context.py's
 * StepsCall, a ctypes.Structure with these fields in this order (a buffer of another size is refused). The
 * first eight are a context's and stay the same from call to call; the rest are one call's. */
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
    draw_spec draw;           /* top_k, top_p, min_p, temperature, seed: each row's draw, top_k < n_vocab */
    row_hook_fn row_hook;     /* NULL: none; else called on each row before its draw */
    void *row_hook_user;      /* the hook's first argument */
    const uint32_t *mask;     /* a grammar's mask the hook fills (bit i of word w: token 32 w + i allowed) */
    int64_t mask_words;
} steps_call;

/* what a steps_core call did */
typedef struct {
    ptrdiff_t n;         /* tokens drawn (into its `drawn`) */
    ptrdiff_t decoded;   /* decodes that ran */
    int rc;              /* llama_decode's code: 0, or the failed decode's */
    int status;          /* the last draw's: 1 drawn, 0 not the C pass's to draw, -1 out of memory */
    int hook_failed;     /* the row hook answered -1 (py_row_hook left its exception set) */
    double in_decode;    /* seconds inside llama_decode and the logits read that synchronizes with it */
} steps_out;

/* the steps of a checked call; drawn: room for c->most tokens, bound: argmax_core's scratch for n_vocab */
void steps_core(const steps_call *c, int32_t *drawn, float *bound, steps_out *o);

/* ---------------------------------------------------------------- priced.c */

/* the priced backend's choices (bench/priced/backend.py choices()): n rows of 5 int64 into out */
void priced_choices_core(const int64_t *tails, const int64_t *lengths, const int64_t *positions, ptrdiff_t n,
                         double agreement, double ties, int64_t pool, double runner_up, int64_t *out);
/* a busy wait of `seconds`, or until the byte at stop (where not NULL) turns non-zero: 1 waited, 0 stopped */
int spin_core(double seconds, const volatile char *stop);
/* out's row i = src's row at[i], float32 rows of width (the indices checked) */
void copy_rows_core(float *out, const float *src, const int64_t *at, ptrdiff_t n, ptrdiff_t width);

/* ---------------------------------------------------------------- wake.c */

/* the word + 1, and its waiters woken */
void wake_bump_core(uint32_t *word);
/* until the word differs from seen (1), spinning spin_s then asleep, or timeout_s in all (0) */
int wake_await_core(uint32_t *word, uint32_t seen, double spin_s, double timeout_s);

/* seconds on the monotonic clock (the steps' limit, the busy wait) */
static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#endif
