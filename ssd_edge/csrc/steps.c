/* steps.c: mode ar's plain decoding steps in one call (native.steps).
 *
 * Decode `token` at `pos` of sequence `seq` (one output), draw the next token from its row, decode that
 * one, and so on, until `most` tokens are drawn, an end of generation is drawn, `seconds` have passed
 * (looked at after each step), or a decode fails (rc: llama_decode's code; the tokens drawn before it
 * stand). llama.cpp's functions are called by address (steps_call, native.h). Each row goes through the
 * call's row hook first, where it has one (the Python draw's coupling.Drawer does the same). A draw is the
 * engine's own: top_k 0 is greedy (argmax_core: np.argmax), else the coupled draw from the support
 * (draw_core at the drawn token's position, pos + 1 for the first), as native.draw makes it; a row the
 * hook masked is drawn under its mask (masked_draw_core). Where a row's draw is not the C pass's to make
 * (0: NaN, ties past its buffer; or -1, out of memory) the loop stops with that status: that row is the
 * context's output row still, for the caller to draw from (what was decoded stays decoded, and the caller
 * knows it). No Python calls but the row hook's: module.c runs it with the interpreter's lock released.
 */
#include "native.h"

void steps_core(const steps_call *c, int32_t *drawn, float *bound, steps_out *o) {
    const int64_t n_vocab = c->n_vocab;
    llama_batch_t b = *c->batch;  /* its arrays are the context's batch buffer */
    o->n = o->decoded = 0;
    o->rc = o->hook_failed = 0;
    o->status = 1;
    o->in_decode = 0.0;
    const double start = now_s();
    int32_t t = c->token, p = c->pos;
    for (;;) {
        b.n_tokens = 1;
        b.token[0] = t;
        b.pos[0] = p;
        b.n_seq_id[0] = 1;
        b.seq_id[0][0] = c->seq;
        b.logits[0] = 1;
        const double t0 = now_s();
        o->rc = c->decode(c->ctx, b);
        const float *row = o->rc == 0 ? c->get_logits(c->ctx) : NULL;
        o->in_decode += now_s() - t0;
        if (o->rc != 0) break;
        o->decoded++;
        const int32_t hooked = c->row_hook ? c->row_hook(c->row_hook_user, (float *)row, n_vocab, (int64_t)p + 1, t)
                                           : 0;
        if (hooked < 0) {  /* the hook failed: raised after the loop (py_row_hook left its exception set) */
            o->hook_failed = 1;
            break;
        }
        int64_t next = 0;
        if (hooked == 1 && c->mask != NULL) {
            o->status = masked_draw_core((float *)row, n_vocab, c->mask, c->mask_words, &c->draw, (uint64_t)p + 1,
                                         bound, &next);
        } else if (c->draw.top_k == 0) {
            next = argmax_core(row, n_vocab, bound);
        } else {
            o->status = draw_core(row, n_vocab, &c->draw, (uint64_t)p + 1, NULL, &next);
        }
        if (o->status != 1) break;
        drawn[o->n++] = (int32_t)next;
        if (o->n >= c->most || c->is_eog(c->vocab, (int32_t)next) || now_s() - start >= c->seconds) break;
        /* the token is drawn, and decoded next: the hook may start on the next row's work (a grammar's mask)
         * while the decode runs (a call with no row, the drawn token's position, the token) */
        if (c->row_hook && c->row_hook(c->row_hook_user, NULL, n_vocab, (int64_t)p + 1, (int32_t)next) < 0) {
            o->hook_failed = 1;
            break;
        }
        t = (int32_t)next;
        p++;
    }
}
