/* Throwaway spike code for issue 53, part 1 (scripts/spike_draft_side.py compiles and loads it with ctypes):
 * not production quality, not part of the package, not built by setup.py.
 *
 * What it gives the spike:
 *   spin(seconds, flag)    a priced decode's wait: busy, on this core, until the time is up or the byte at
 *                          `flag` turns non-zero (ctypes calls drop the interpreter's lock, as native.c's spin does)
 *   spin_stats(out)        this thread's spins so far: wall seconds, and the CPU seconds it had in them (the
 *                          difference: time the scheduler gave its core to another process)
 *   work(iters)            host work in C: a calibrated busy loop
 *   post(ctl, round, t)    the engine's "verifying": stores the round, wakes a sleeping draft side (futex)
 *   wait_post(ctl, last, spin_s)  the draft side's wait for a round after `last`: spins spin_s on the shared word,
 *                          then sleeps on its futex (not FUTEX_PRIVATE: works across processes on shared memory)
 *   set_ready / wait_ready a call's answer and the caller's wait for it (spin, then futex): the --rtt mode
 *   draft_start(ctl) / draft_join()  design (a): a native thread that runs the draft side's round
 *                          (first decode, setup, branch steps; host work as C busy loops), no interpreter at all
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define CAP 8192
#define MAX_DEPTH 16

typedef struct {
    _Atomic uint32_t posted;    /* futex word: the round the engine verifies now (0: none yet) */
    _Atomic uint32_t sleeping;  /* the draft side is (about to be) asleep on `posted` */
    _Atomic uint32_t stop;
    _Atomic uint32_t ready;     /* the last round whose branches are complete (the engine's lookup reads it) */
    volatile uint8_t abort;     /* the engine stops a branch decode in flight (spin polls it) */
    uint8_t pad[7];
    double t_post;              /* perf_counter (CLOCK_MONOTONIC) when round `posted` was posted */
    /* the draft side's round, for the native thread: */
    double spin_wait_s;         /* how long the draft side spins on `posted` before it sleeps */
    double pre_read_iters;      /* host work from the message to the first decode */
    double read_s;              /* the first decode's price (the read of the last draft token) */
    double post_read_iters;     /* host work after it: rows, ranking, branch setup */
    double step_iters[MAX_DEPTH]; /* host work before each branch step */
    int32_t depth, short_depth, width, pad2;
    double step_s[MAX_DEPTH];   /* the price of each branch step (by its rows) */
    double first[CAP];          /* per round: seconds from the post to the first decode's start */
    double cpu_s;               /* the draft side's CPU seconds (written when it stops) */
    double d_wall, d_cpu;       /* the draft side's spins (spin_acc): wall seconds, and CPU seconds it had in them */
    int32_t tid, pad3;          /* the native draft thread's id (its /proc schedstat) */
} ctl_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void relax(void) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
}

size_t ctl_size(void) { return sizeof(ctl_t); }

/* this thread's spins: their wall time and the CPU time it had during them (less: the core was taken away) */
static __thread double spun_wall, spun_cpu;

int spin(double seconds, const volatile uint8_t *flag) {
    const double t0 = now_s(), c0 = thread_cpu_s(), until = t0 + seconds;
    int ok = 1;
    while (now_s() < until)
        if (flag != NULL && *flag) {
            ok = 0;
            break;
        }
    spun_wall += now_s() - t0;
    spun_cpu += thread_cpu_s() - c0;
    return ok;
}

/* the draft side's spin: also adds its wall and CPU time to the ctl (one writer), which the engine reads */
int spin_acc(double seconds, const volatile uint8_t *flag, ctl_t *c) {
    const double w0 = spun_wall, c0 = spun_cpu;
    int ok = spin(seconds, flag);
    c->d_wall += spun_wall - w0;
    c->d_cpu += spun_cpu - c0;
    return ok;
}

void spin_stats(double *out) {
    out[0] = spun_wall;
    out[1] = spun_cpu;
}

volatile uint64_t sink;
void work(double iters) {
    uint64_t x = sink;
    for (long i = 0; i < (long)iters; i++) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    sink = x;
}

void post(ctl_t *c, uint32_t round, double t) {
    c->t_post = t;
    atomic_store(&c->posted, round);
    if (atomic_load(&c->sleeping)) syscall(SYS_futex, &c->posted, FUTEX_WAKE, 1, NULL, NULL, 0);
}

void stop_all(ctl_t *c) {
    atomic_store(&c->stop, 1);
    c->abort = 1;
    atomic_fetch_add(&c->posted, 0);
    syscall(SYS_futex, &c->posted, FUTEX_WAKE, 1 << 30, NULL, NULL, 0);
}

uint32_t wait_post(ctl_t *c, uint32_t last, double spin_s) {
    const double until = now_s() + spin_s;
    for (;;) {
        uint32_t v = atomic_load(&c->posted);
        if (v != last || atomic_load(&c->stop)) return v;
        if (now_s() < until) {
            relax();
            continue;
        }
        atomic_store(&c->sleeping, 1);  /* then look again: post() stores, then reads `sleeping` (seq_cst) */
        if (atomic_load(&c->posted) == last && !atomic_load(&c->stop))
            syscall(SYS_futex, &c->posted, FUTEX_WAIT, last, NULL, NULL, 0);
        atomic_store(&c->sleeping, 0);
    }
}

/* a call's answer (the round trip of a just-in-time draft): the answering side stores `ready` and wakes the
 * caller, which spins spin_s on it, then sleeps on its futex */
void set_ready(ctl_t *c, uint32_t r) {
    atomic_store(&c->ready, r);
    syscall(SYS_futex, &c->ready, FUTEX_WAKE, 1, NULL, NULL, 0);
}

void wait_ready(ctl_t *c, uint32_t r, double spin_s) {
    const double until = now_s() + spin_s;
    uint32_t v;
    while ((v = atomic_load(&c->ready)) != r) {
        if (now_s() < until) relax();
        else syscall(SYS_futex, &c->ready, FUTEX_WAIT, v, NULL, NULL, 0);
    }
}

static void *draft_main(void *arg) {
    ctl_t *c = arg;
    uint32_t last = 0;
    c->tid = (int32_t)syscall(SYS_gettid);
    for (;;) {
        uint32_t r = wait_post(c, last, c->spin_wait_s);
        if (atomic_load(&c->stop)) break;
        last = r;
        c->abort = 0;
        work(c->pre_read_iters);
        c->first[r % CAP] = now_s() - c->t_post;
        if (!spin_acc(c->read_s, &c->abort, c)) continue;
        work(c->post_read_iters);
        int ok = 1;
        for (int d = 0; d < c->depth && ok; d++) {
            work(c->step_iters[d]);
            ok = spin_acc(c->step_s[d], &c->abort, c);
        }
        if (ok) atomic_store(&c->ready, r);
    }
    c->cpu_s = thread_cpu_s();
    return NULL;
}

static pthread_t thread;
int draft_start(ctl_t *c) { return pthread_create(&thread, NULL, draft_main, c); }
int draft_join(void) { return pthread_join(thread, NULL); }
