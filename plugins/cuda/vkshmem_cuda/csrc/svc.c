/* The host side of the service kernel (kernels.py SERVICE_SOURCE): a block that stays resident
   on the GPU and serves small copies and AMOs from a mailbox in mapped pinned host memory, so a
   small operation costs a store, the GPU's poll and its reply (no launch, no stream wait).

   One request at a time (a mutex: the application's thread and the core's proxy thread both
   call). The host fills the request, stores seq (release), and launches the kernel where it is
   not resident (never launched, or it stored alive = 0 when it went idle); then it spins on
   done, asking the stream every VKC_SVC_POLL spins whether the kernel ended (an idle exit that
   raced with the request: launched again, it serves the request it did not see). Past spin_ns
   it sleeps between looks; past timeout_ns the service is broken (VKC_SVC_TIMEOUT, then
   VKC_SVC_BROKEN for every later call: the caller takes its other paths). */

#define VKC_SVC_TIMEOUT 1100
#define VKC_SVC_BROKEN 1101
#define VKC_SVC_POLL 1024

struct vkc_box {  /* the kernel's struct box; 128 bytes, then the payload */
    uint64_t seq;
    uint32_t op, width;
    uint64_t dst, src, nbytes, operand, compare, alive;
    uint64_t done, value, pad[6];
    unsigned char payload[];
};

struct vkc_svc {
    uintptr_t ctx, stream, fn;
    struct vkc_box *box;
    uint64_t box_dev, seq, idle_ns, launches;
    unsigned threads;
    int64_t spin_ns;
    int broken;
    pthread_mutex_t lock;
};
typedef struct vkc_svc vkc_svc;

vkc_svc *vkc_svc_new(uintptr_t ctx, uintptr_t stream, uintptr_t fn, uintptr_t box,
                     uint64_t box_dev, unsigned threads, uint64_t idle_ns, int64_t spin_ns) {
    vkc_svc *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->ctx = ctx; s->stream = stream; s->fn = fn;
    s->box = (struct vkc_box *)box;
    s->box_dev = box_dev;
    s->threads = threads;
    s->idle_ns = idle_ns;
    s->spin_ns = spin_ns;
    memset(s->box, 0, sizeof *s->box);
    pthread_mutex_init(&s->lock, NULL);
    return s;
}

void vkc_svc_free(vkc_svc *s) {
    if (!s) return;
    pthread_mutex_destroy(&s->lock);
    free(s);
}

uint64_t vkc_svc_launches(vkc_svc *s) { return s->launches; }

static CUresult svc_launch(vkc_svc *s, uint64_t last) {
    __atomic_store_n(&s->box->alive, 1, __ATOMIC_RELEASE);
    uint64_t box_dev = s->box_dev, idle = s->idle_ns;
    void *params[] = {&box_dev, &last, &idle};
    CUresult r = cu.launch((CUfunction)s->fn, 1, 1, 1, s->threads, 1, 1, 0,
                           (CUstream)s->stream, params, 0);
    if (!r) s->launches++;
    return r;
}

/* Wait until done == seq; relaunch after an idle exit when relaunch is set. */
static int svc_wait(vkc_svc *s, uint64_t seq, int relaunch, int64_t timeout_ns) {
    int64_t start = now_ns(), spin_end = start + s->spin_ns, deadline = start + timeout_ns;
    for (unsigned k = 1;; ++k) {
        if (__atomic_load_n(&s->box->done, __ATOMIC_ACQUIRE) == seq) return 0;
        if (k % VKC_SVC_POLL) continue;
        int64_t t = now_ns();
        CUresult r = cu.query((CUstream)s->stream);
        if (r == 0) {  /* the kernel ended */
            if (__atomic_load_n(&s->box->done, __ATOMIC_ACQUIRE) == seq) return 0;
            if (!relaunch) return VKC_SVC_BROKEN;
            r = svc_launch(s, seq - 1);
            if (r) return r;
        } else if (r != VKC_NOT_READY) {
            return r;
        }
        if (t > deadline) return VKC_SVC_TIMEOUT;
        if (t > spin_end) {
            struct timespec nap = {0, 20000};
            nanosleep(&nap, NULL);
        }
    }
}

int vkc_svc_call(vkc_svc *s, int op, int width, uint64_t dst, uint64_t src, uint64_t nbytes,
                 uint64_t operand, uint64_t compare, uintptr_t host_in, uintptr_t host_out,
                 uint64_t *result, int64_t timeout_ns) {
    if (!cu.loaded) return VKC_NO_DRIVER;
    pthread_mutex_lock(&s->lock);
    int r = s->broken ? VKC_SVC_BROKEN : current(s->ctx);
    if (r) goto out;
    struct vkc_box *b = s->box;
    if (host_in) {
        memcpy(b->payload, (const void *)host_in, nbytes);
        src = s->box_dev + offsetof(struct vkc_box, payload);
    }
    if (host_out) dst = s->box_dev + offsetof(struct vkc_box, payload);
    b->op = (uint32_t)op;
    b->width = (uint32_t)width;
    b->dst = dst; b->src = src; b->nbytes = nbytes;
    b->operand = operand; b->compare = compare;
    uint64_t seq = ++s->seq;
    __atomic_store_n(&b->seq, seq, __ATOMIC_RELEASE);
    if (!__atomic_load_n(&b->alive, __ATOMIC_ACQUIRE)) {
        r = svc_launch(s, seq - 1);
        if (r) goto fail;
    }
    r = svc_wait(s, seq, 1, timeout_ns);
    if (r) goto fail;
    if (host_out) memcpy((void *)host_out, b->payload, nbytes);
    if (result) *result = __atomic_load_n(&b->value, __ATOMIC_RELAXED);
    goto out;
fail:
    s->broken = 1;
out:
    pthread_mutex_unlock(&s->lock);
    return r;
}

/* End the kernel (a stop request where it is resident) and wait for its stream. */
int vkc_svc_stop(vkc_svc *s, int64_t timeout_ns) {
    if (!cu.loaded) return VKC_NO_DRIVER;
    pthread_mutex_lock(&s->lock);
    int r = current(s->ctx);
    if (!r && s->launches) {
        struct vkc_box *b = s->box;
        b->op = 0;
        __atomic_store_n(&b->seq, ++s->seq, __ATOMIC_RELEASE);
        int64_t deadline = now_ns() + timeout_ns;
        while ((r = cu.query((CUstream)s->stream)) == VKC_NOT_READY && now_ns() < deadline) {
            struct timespec nap = {0, 20000};
            nanosleep(&nap, NULL);
        }
        if (r == VKC_NOT_READY) r = VKC_SVC_TIMEOUT;
    }
    s->broken = 1;
    pthread_mutex_unlock(&s->lock);
    return r;
}
