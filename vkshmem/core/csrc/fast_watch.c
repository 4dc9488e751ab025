/* vkshmem.core._fast: the wake board. A long wait on this PE's own memory sleeps on a futex
 * that the transports poke after their progress applied incoming data, instead of waking
 * every 50 us to look (the contract: struct vk_watch in _native.h).
 *
 * One board per process, held by one wait at a time (a second thread's wait polls as
 * before). The wait arms it with its predicate when it stops spinning and calls every open
 * transport's watch(); a poke evaluates the predicate and, once it holds, bumps the futex word
 * and wakes the sleeper. Every sleep ends by the wait's slice (1 ms) at the latest, so a poke
 * that never comes (a thread of this PE storing into the word itself) delays the wait, never
 * hangs it. Disarming waits for pokes still reading the predicate, whose address may be freed
 * once the wait returned.
 *
 * Ordering: the poker applied the data, then (fence) reads `armed`; the waiter sets `armed`,
 * then reads the data; one of the two sees the other's write (sequentially consistent
 * operations on both sides). The same holds for `sleeping` and the futex word. */
#include "fast.h"

#include <linux/futex.h>
#include <sched.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

struct board {
    struct vk_watch pub;        /* first: all the transports see */
    uint32_t seq;               /* the futex word: bumped when the armed predicate holds */
    uint32_t owner;             /* a wait holds the board */
    uint32_t armed;             /* pred is set and may be evaluated */
    uint32_t readers;           /* pokes evaluating pred now */
    uint32_t sleeping;          /* the holder sleeps (or is about to) on seq */
    struct fast_pred pred;
    uint64_t n_arms, n_sleeps, n_woken;  /* counters (watch_stats) */
};

static void poke(struct vk_watch *w);
static struct board B = {.pub = {poke}};

static void poke(struct vk_watch *w) {
    struct board *b = (struct board *)w;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);  /* the data this thread applied, then armed */
    if (!__atomic_load_n(&b->armed, __ATOMIC_RELAXED)) return;
    __atomic_add_fetch(&b->readers, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&b->armed, __ATOMIC_SEQ_CST)) {
        struct fast_pred p = b->pred;  /* fast_pred_true writes p.seen: a copy */
        if (fast_pred_true(&p)) {
            uint32_t asleep = 1;  /* one wake per sleep: the first poke to see it takes it */
            __atomic_add_fetch(&b->seq, 1, __ATOMIC_SEQ_CST);
            if (__atomic_compare_exchange_n(&b->sleeping, &asleep, 0, 0, __ATOMIC_SEQ_CST,
                                            __ATOMIC_SEQ_CST)) {
                __atomic_add_fetch(&b->n_woken, 1, __ATOMIC_RELAXED);
                syscall(SYS_futex, &b->seq, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
            }
        }
    }
    __atomic_sub_fetch(&b->readers, 1, __ATOMIC_RELEASE);
}

/* The transports whose watch the board needs (configure); 0 of them: not usable. */
static struct vk_native_ops *watch_ops[VK_MAX_WATCH];
static int nwatch;

int fast_watch_set(struct vk_native_ops *const *ops, int n) {
    nwatch = 0;
    if (n <= 0 || n > VK_MAX_WATCH) return 0;
    for (int i = 0; i < n; i++)
        if (ops[i] == NULL || !(ops[i]->flags & VK_NATIVE_CAN_WATCH) || ops[i]->watch == NULL)
            return 0;
    memcpy(watch_ops, ops, (size_t)n * sizeof *ops);
    nwatch = n;
    return n;
}

int fast_watch_take(Py_buffer *b, struct vk_native_ops **ops) {
    if (b->obj == NULL) return 0;
    Py_ssize_t w = (Py_ssize_t)sizeof(void *);
    int n = b->len % w == 0 && b->len <= VK_MAX_WATCH * w ? (int)(b->len / w) : 0;
    if (n) memcpy(ops, b->buf, (size_t)b->len);
    PyBuffer_Release(b);
    return n;
}

int fast_watch_usable(void) { return nwatch > 0 && G.enabled && !fast_domains_open(); }

int fast_watch_arm(const struct fast_pred *p) {
    uint32_t free_ = 0;
    if (!__atomic_compare_exchange_n(&B.owner, &free_, 1, 0, __ATOMIC_ACQUIRE,
                                     __ATOMIC_RELAXED))
        return 0;  /* another thread's wait holds it */
    B.pred = *p;
    __atomic_store_n(&B.armed, 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&B.n_arms, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < nwatch; i++)
        watch_ops[i]->watch(watch_ops[i]->self, &B.pub);
    return 1;
}

void fast_watch_sleep(struct fast_pred *p, uint64_t ns) {
    uint32_t seq = __atomic_load_n(&B.seq, __ATOMIC_SEQ_CST);
    __atomic_store_n(&B.sleeping, 1, __ATOMIC_SEQ_CST);
    if (!fast_pred_true(p)) {
        struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
        __atomic_add_fetch(&B.n_sleeps, 1, __ATOMIC_RELAXED);
        syscall(SYS_futex, &B.seq, FUTEX_WAIT_PRIVATE, seq, &ts, NULL, 0);
    }
    __atomic_store_n(&B.sleeping, 0, __ATOMIC_RELAXED);
}

void fast_watch_disarm(void) {
    __atomic_store_n(&B.armed, 0, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&B.readers, __ATOMIC_SEQ_CST))  /* a poke reads pred: a moment */
        sched_yield();
    __atomic_store_n(&B.owner, 0, __ATOMIC_RELEASE);
}

PyObject *fast_watch_stats(PyObject *mod, PyObject *noargs) {
    return Py_BuildValue("{s:i,s:K,s:K,s:K}", "transports", nwatch,
                         "arms", (unsigned long long)__atomic_load_n(&B.n_arms, __ATOMIC_RELAXED),
                         "sleeps",
                         (unsigned long long)__atomic_load_n(&B.n_sleeps, __ATOMIC_RELAXED),
                         "woken",
                         (unsigned long long)__atomic_load_n(&B.n_woken, __ATOMIC_RELAXED));
}
