/* The host side of the service kernel (vkshmem_cuda/kernels.py SERVICE_SOURCE;
   vkshmem_cuda/service_kernel.py drives it for both the cuda domain and the Vulkan domain's
   AMOs): a block that stays resident on the GPU and serves small copies and AMOs from a
   mailbox, so a small operation costs a store, the GPU's poll and its reply (no launch, no
   stream wait). The mailbox is two boxes
   of one layout: requests (seq, the header, host data) go into `req`, mapped pinned host
   memory or device memory the CPU maps (the GPU's poll then stays on the GPU), and replies
   (done, value, alive, data read) come back in `rep`, mapped pinned host memory (`req` may
   be `rep`).

   One request at a time (a mutex: the application's thread and the core's proxy thread both
   call). The host fills the request, stores seq (release), and launches the kernel where it is
   not resident (never launched, or it stored alive = 0 when it went idle); then it spins on
   done, asking the stream every VKC_SVC_POLL spins whether the kernel ended (an idle exit that
   raced with the request: launched again, it serves the request it did not see). Past spin_ns
   it sleeps between looks; past timeout_ns the service is broken (VKC_SVC_TIMEOUT, then
   VKC_SVC_BROKEN for every later call: the caller takes its other paths).

   vkc_svc_park asks a resident kernel to end without waiting for it (a stop request), for
   callers whose other work on the GPU runs in another context (Vulkan's), which the GPU
   time-slices against this one: the next call first waits until that request was seen. */

#define VKC_SVC_TIMEOUT 1100
#define VKC_SVC_BROKEN 1101
#define VKC_SVC_POLL 1024

struct vkc_box {  /* the kernel's struct box; 128 bytes, then the payload (bar_fence: cudalink.c) */
    uint64_t seq;
    uint32_t op, width;
    uint64_t dst, src, nbytes, operand, compare, alive;
    uint64_t done, value, pad[6];
    unsigned char payload[];
};

struct vkc_svc {
    uintptr_t ctx, stream, fn;
    struct vkc_box *req, *rep;  /* the host's views: requests go out, replies come back */
    uint64_t req_dev, rep_dev, seq, idle_ns, launches, parking;
    unsigned threads;
    int64_t spin_ns;
    int broken;
    pthread_mutex_t lock;
};
typedef struct vkc_svc vkc_svc;

vkc_svc *vkc_svc_new(uintptr_t ctx, uintptr_t stream, uintptr_t fn, uintptr_t req,
                     uint64_t req_dev, uintptr_t rep, uint64_t rep_dev, unsigned threads,
                     uint64_t idle_ns, int64_t spin_ns) {
    vkc_svc *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->ctx = ctx; s->stream = stream; s->fn = fn;
    s->req = (struct vkc_box *)req;
    s->rep = (struct vkc_box *)rep;
    s->req_dev = req_dev;
    s->rep_dev = rep_dev;
    s->threads = threads;
    s->idle_ns = idle_ns;
    s->spin_ns = spin_ns;
    memset(s->rep, 0, sizeof *s->rep);
    if (s->req != s->rep) memset(s->req, 0, sizeof *s->req);
    bar_fence();
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
    __atomic_store_n(&s->rep->alive, 1, __ATOMIC_RELEASE);
    uint64_t req_dev = s->req_dev, rep_dev = s->rep_dev, idle = s->idle_ns;
    void *params[] = {&req_dev, &rep_dev, &last, &idle};
    CUresult r = cu.launch((CUfunction)s->fn, 1, 1, 1, s->threads, 1, 1, 0,
                           (CUstream)s->stream, params, 0);
    if (!r) s->launches++;
    return r;
}

/* Publish the request filled in: its sequence number last. The request box may be device
   memory mapped write-combining (the fences order and drain the stores). */
static void svc_post(vkc_svc *s, uint64_t seq) {
    bar_fence();
    __atomic_store_n(&s->req->seq, seq, __ATOMIC_RELEASE);
    bar_fence();
}

/* Wait until done == seq; relaunch after an idle exit when relaunch is set. */
static int svc_wait(vkc_svc *s, uint64_t seq, int relaunch, int64_t timeout_ns) {
    int64_t start = now_ns(), spin_end = start + s->spin_ns, deadline = start + timeout_ns;
    for (unsigned k = 1;; ++k) {
        if (__atomic_load_n(&s->rep->done, __ATOMIC_ACQUIRE) == seq) return 0;
        if (k % VKC_SVC_POLL) continue;
        int64_t t = now_ns();
        CUresult r = cu.query((CUstream)s->stream);
        if (r == 0) {  /* the kernel ended */
            if (__atomic_load_n(&s->rep->done, __ATOMIC_ACQUIRE) == seq) return 0;
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
    if (s->parking) {  /* a park's stop request first: seen, or the kernel ended anyway */
        uint64_t stop = s->parking;
        s->parking = 0;
        r = svc_wait(s, stop, 0, timeout_ns);
        if (r == VKC_SVC_BROKEN) r = 0;
        if (r) goto fail;
    }
    struct vkc_box *b = s->req;
    if (host_in) {
        memcpy(b->payload, (const void *)host_in, nbytes);
        src = s->req_dev + offsetof(struct vkc_box, payload);
    }
    if (host_out) dst = s->rep_dev + offsetof(struct vkc_box, payload);
    b->op = (uint32_t)op;
    b->width = (uint32_t)width;
    b->dst = dst; b->src = src; b->nbytes = nbytes;
    b->operand = operand; b->compare = compare;
    uint64_t seq = ++s->seq;
    svc_post(s, seq);
    if (!__atomic_load_n(&s->rep->alive, __ATOMIC_ACQUIRE)) {
        r = svc_launch(s, seq - 1);
        if (r) goto fail;
    }
    r = svc_wait(s, seq, 1, timeout_ns);
    if (r) goto fail;
    if (host_out) memcpy((void *)host_out, s->rep->payload, nbytes);
    if (result) *result = __atomic_load_n(&s->rep->value, __ATOMIC_RELAXED);
    goto out;
fail:
    s->broken = 1;
out:
    pthread_mutex_unlock(&s->lock);
    return r;
}

/* Ask a resident kernel to end, without waiting (see the top): 1 where a request was posted,
   0 where none is resident (or a request is pending already). */
int vkc_svc_park(vkc_svc *s) {
    if (!__atomic_load_n(&s->rep->alive, __ATOMIC_ACQUIRE)) return 0;
    int posted = 0;
    pthread_mutex_lock(&s->lock);
    if (!s->broken && !s->parking && __atomic_load_n(&s->rep->alive, __ATOMIC_ACQUIRE)) {
        s->req->op = 0;
        s->parking = ++s->seq;
        svc_post(s, s->parking);
        posted = 1;
    }
    pthread_mutex_unlock(&s->lock);
    return posted;
}

/* End the kernel (a stop request where it is resident) and wait for its stream. */
int vkc_svc_stop(vkc_svc *s, int64_t timeout_ns) {
    if (!cu.loaded) return VKC_NO_DRIVER;
    pthread_mutex_lock(&s->lock);
    int r = current(s->ctx);
    if (!r && s->launches) {
        s->req->op = 0;
        svc_post(s, ++s->seq);
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
