/* wake.c: the word that wakes SSD's draft side when a verify starts (speculation/prespec/handoff.py's Wake).
 *
 * The draft worker waits on a 32-bit word with the interpreter's lock released; the engine's target decode
 * bumps it from C after it has released that lock itself, just before llama_decode (or the priced backend's
 * wait) begins. So the worker wakes to a free lock and starts its first decode while the verify has only just
 * begun, where a queue's wake-up came while the engine still held the lock for the Python before its decode
 * (0.2 ms median on these VMs). Other messages bump it from Python after they are queued.
 *
 * On Linux the wait is a futex (after an optional spin); elsewhere, a poll every 50 us. The word is shared
 * futex-wise (not FUTEX_PRIVATE), so a word in shared memory works across processes too.
 */
#include "native.h"

#ifdef __linux__
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* the word + 1, then every waiter woken */
void wake_bump_core(uint32_t *word) {
    __atomic_add_fetch(word, 1, __ATOMIC_SEQ_CST);
#ifdef __linux__
    syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
#endif
}

/* Wait until the word differs from `seen`: spinning for spin_s, then asleep, for timeout_s in all.
 * 1: it changed; 0: the time ran out. */
int wake_await_core(uint32_t *word, uint32_t seen, double spin_s, double timeout_s) {
    const double t0 = now_s();
    while (__atomic_load_n(word, __ATOMIC_ACQUIRE) == seen) {
        const double t = now_s() - t0;
        if (t >= timeout_s) return 0;
        if (t < spin_s) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
            continue;
        }
#ifdef __linux__
        const double left = timeout_s - t;
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, NULL, 0);  /* returns at once if the word moved */
#else
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
#endif
    }
    return 1;
}
