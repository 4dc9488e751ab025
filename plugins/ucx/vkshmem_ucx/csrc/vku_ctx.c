/* vkshmem-ucx native helper, continued: contexts (one translation unit with vku.c: the
 * build concatenates vku.c, vku_ctx.c, vku_worker.c, vku_ops.c and vku_native.c). */

/* -- context ------------------------------------------------------------------------------ */

void vku_set_liveness(vku_ctx *c, uintptr_t words)
{
    c->failed = (volatile uint64_t *)words;
}

vku_ctx *vku_ctx_create(const char *const *names, const char *const *values, int n,
                        uint32_t spin_us, uint32_t wait_spin_us, double timeout_s,
                        int err_peer, char *err, size_t errlen)
{
    vku_ctx *c = calloc(1, sizeof(*c));
    if (!c) {
        set_err(err, errlen, "out of memory");
        return NULL;
    }
    c->epfd = c->stopfd = -1;
    pthread_mutex_init(&c->list_lock, NULL);
    pthread_mutex_init(&c->mem_lock, NULL);
    c->spin_ns = (uint64_t)spin_us * 1000ull;
    c->wait_spin_ns = (uint64_t)wait_spin_us * 1000ull;
    c->timeout_ns = (uint64_t)(timeout_s * 1e9);
    c->err_peer = err_peer;

    ucp_config_t *config;
    ucs_status_t st = ucp_config_read(NULL, NULL, &config);
    if (st != UCS_OK) {
        set_err(err, errlen, "ucp_config_read: %s", ucs_status_string(st));
        goto fail;
    }
    for (int i = 0; i < n; i++) {
        st = ucp_config_modify(config, names[i], values[i]);
        if (st != UCS_OK) {
            set_err(err, errlen, "UCX rejected UCX_%s=%s: %s", names[i], values[i],
                    ucs_status_string(st));
            ucp_config_release(config);
            goto fail;
        }
    }
    ucp_params_t params;
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AMO32 | UCP_FEATURE_AMO64 |
                      UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 1;
    st = ucp_init(&params, config, &c->context);
    ucp_config_release(config);
    if (st != UCS_OK) {
        c->context = NULL;
        set_err(err, errlen, "ucp_init: %s", ucs_status_string(st));
        goto fail;
    }
    c->epfd = epoll_create1(EPOLL_CLOEXEC);
    c->stopfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->epfd < 0 || c->stopfd < 0) {
        set_err(err, errlen, "epoll/eventfd: %s", strerror(errno));
        goto fail;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->stopfd, &ev) != 0) {
        set_err(err, errlen, "epoll_ctl: %s", strerror(errno));
        goto fail;
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old); /* signals stay with Python's main thread */
    int rc = pthread_create(&c->thread, NULL, progress_main, c);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        set_err(err, errlen, "pthread_create: %s", strerror(rc));
        goto fail;
    }
    c->thread_started = 1;
    return c;
fail:
    vku_ctx_destroy(c);
    return NULL;
}

void vku_ctx_destroy(vku_ctx *c)
{
    if (!c)
        return;
    stop_thread(c);
    while (c->workers)
        vku_worker_destroy(c->workers, 1);
    for (int i = 0; i < c->nlocal; i++)
        unmap_local(c, &c->locals[i]);
    c->nlocal = 0;
    if (c->context)
        ucp_cleanup(c->context);
    if (c->epfd >= 0)
        close(c->epfd);
    if (c->stopfd >= 0)
        close(c->stopfd);
    pthread_mutex_destroy(&c->list_lock);
    pthread_mutex_destroy(&c->mem_lock);
    free(c);
}

void vku_set_emulation(vku_ctx *c, uint32_t mask) { c->emulate = mask; }

void vku_set_direct(vku_ctx *c, uintptr_t cpu_amo, int direct)
{
    c->cpu_amo = (vk_amo_fn)cpu_amo;
    c->direct = direct;
}

uint32_t vku_get_emulation(vku_ctx *c) { return c->emulate; }

void vku_stats(vku_ctx *c, uint64_t *out3)
{
    out3[3] = c->stat_sleeps;
    out3[4] = c->stat_sleep_timeouts;
    out3[0] = c->stat_wakeups;
    out3[1] = c->stat_idle;
    out3[2] = c->stat_busy;
}

/* Whether the n bytes at p are all zero (every byte equals the first, which is zero). */
static int all_zero(const unsigned char *p, size_t n)
{
    return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
}

/* Copy the pages of [src, src+size) that are resident (mincore) to dst: the bytes that can
 * differ from zero, without touching (and so allocating) the rest of a sparse segment. With
 * skip_zero (dst reads as zeros: a fresh or hole-punched memfd) resident pages that hold only
 * zeros are not copied either: allocating dst's pages is what costs (seconds for a heap of
 * 512 MiB UCX had populated), reading src is cheap. */
static void copy_resident(void *dst, const void *src, uint64_t size, int skip_zero)
{
    long page = sysconf(_SC_PAGESIZE);
    size_t npages = (size_t)((size + (uint64_t)page - 1) / (uint64_t)page);
    unsigned char *vec = malloc(npages ? npages : 1);
    if (!vec || mincore((void *)src, (size_t)size, vec) != 0) {
        memcpy(dst, src, (size_t)size); /* cannot tell: copy everything */
        free(vec);
        return;
    }
    for (size_t i = 0; i < npages; i++) {
        uint64_t off = (uint64_t)i * (uint64_t)page;
        size_t len = (size_t)((off + (uint64_t)page < size ? (uint64_t)page : size - off));
        vec[i] = (vec[i] & 1) && !(skip_zero && all_zero((const unsigned char *)src + off, len));
    }
    for (size_t i = 0; i < npages; i++) {
        if (!vec[i])
            continue;
        size_t j = i;
        while (j + 1 < npages && vec[j + 1])
            j++;
        uint64_t off = (uint64_t)i * (uint64_t)page;
        uint64_t end = (uint64_t)(j + 1) * (uint64_t)page;
        memcpy((char *)dst + off, (const char *)src + off, (size_t)((end < size ? end : size) - off));
        i = j;
    }
    free(vec);
}

/* Ranges UCX allocated in place, process-wide: a second transport (another rail) must not
 * allocate over the first one's memory, so it registers that memory as it is instead. */
static pthread_mutex_t g_alloc_lock = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t g_alloc_addr[VKU_MAX_LOCAL];
static uint64_t g_alloc_size[VKU_MAX_LOCAL];

/* Claim [addr, addr+size) (claim=1; 0 when another transport holds an overlapping range) or
 * release it (claim=0). */
static int alloc_claim(uintptr_t addr, uint64_t size, int claim)
{
    int ok = 0, free_slot = -1;
    pthread_mutex_lock(&g_alloc_lock);
    for (int i = 0; i < VKU_MAX_LOCAL; i++) {
        if (!g_alloc_size[i]) {
            if (free_slot < 0)
                free_slot = i;
            continue;
        }
        if (!claim && g_alloc_addr[i] == addr && g_alloc_size[i] == size) {
            g_alloc_size[i] = 0;
            ok = 1;
            break;
        }
        if (claim && addr < g_alloc_addr[i] + g_alloc_size[i] && g_alloc_addr[i] < addr + size)
            goto out;
    }
    if (claim && free_slot >= 0) {
        g_alloc_addr[free_slot] = addr;
        g_alloc_size[free_slot] = size;
        ok = 1;
    }
out:
    pthread_mutex_unlock(&g_alloc_lock);
    return ok;
}

/* Replace the memfd mapping at [addr, addr+size) by memory UCX allocates at the same address
 * (ucp_mem_map ALLOCATE | FIXED), keeping its bytes: UCX's shared-memory transports then
 * reach it directly (stores and CPU atomics into the mapping) instead of by cma and software
 * atomics. 0 on success; else the range still holds the memfd mapping. */
static int map_allocated(vku_ctx *c, uintptr_t addr, uint64_t size, int fd, ucp_mem_h *memh,
                         int *hollow)
{
    *hollow = 0;
    if (!alloc_claim(addr, size, 1))
        return VK_ST_BUSY;
    void *old = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (old == MAP_FAILED) {
        alloc_claim(addr, size, 0);
        return VK_ST_NOMEM;
    }
    ucp_mem_map_params_t mp;
    memset(&mp, 0, sizeof(mp));
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.address = (void *)addr;
    mp.length = size;
    mp.flags = UCP_MEM_MAP_ALLOCATE | UCP_MEM_MAP_FIXED;
    ucs_status_t st = ucp_mem_map(c->context, &mp, memh);
    int rc = st;
    if (st == UCS_OK) {
        ucp_mem_attr_t attr;
        memset(&attr, 0, sizeof(attr));
        attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
        if (ucp_mem_query(*memh, &attr) != UCS_OK || (uintptr_t)attr.address != addr ||
            attr.length != size) {
            /* not where the core's mapping was (or not all of it): put the memfd back */
            ucp_mem_unmap(c->context, *memh);
            mmap((void *)addr, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                 fd, 0);
            rc = VK_ST_NOMEM;
        } else {
            copy_resident((void *)addr, old, size, 1); /* UCX's new memory reads 0 */
            /* the memfd's pages are UCX's now: give them back (half the memory), so that
             * close() copies only what was written meanwhile into zeros */
            *hollow = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                                (off_t)size) == 0;
            rc = 0;
        }
    }
    munmap(old, (size_t)size);
    if (rc)
        alloc_claim(addr, size, 0);
    return rc;
}

/* Give the range back to the memfd (with the bytes written meanwhile), then release UCX's
 * memory: the core's mapping (and arrays still viewing it) stay valid after close. */
static void unmap_local(vku_ctx *c, vku_local *l)
{
    if (l->fd < 0) {
        ucp_mem_unmap(c->context, l->memh);
        return;
    }
    void *back = mmap(NULL, (size_t)l->size, PROT_READ | PROT_WRITE, MAP_SHARED, l->fd, 0);
    if (back != MAP_FAILED)
        copy_resident(back, (void *)l->addr, l->size, l->hollow);
    ucp_mem_unmap(c->context, l->memh); /* unmaps the range */
    if (back == MAP_FAILED ||
        mremap(back, (size_t)l->size, (size_t)l->size, MREMAP_MAYMOVE | MREMAP_FIXED,
               (void *)l->addr) == MAP_FAILED) {
        /* keep the range reserved at least (zeros), so nothing else lands in it */
        mmap((void *)l->addr, (size_t)l->size, PROT_READ | PROT_WRITE,
             MAP_SHARED | MAP_FIXED, l->fd, 0);
        if (back != MAP_FAILED)
            munmap(back, (size_t)l->size);
    }
    close(l->fd);
    l->fd = -1;
    alloc_claim(l->addr, l->size, 0);
}

int vku_mem_map(vku_ctx *c, uintptr_t addr, uint64_t size, int fd, int cuda, int *allocate,
                void *buf, size_t *len)
{
    int rc = 0;
    pthread_mutex_lock(&c->mem_lock);
    vku_local *l = NULL;
    for (int i = 0; i < c->nlocal; i++)
        if (c->locals[i].addr == addr && c->locals[i].size == size)
            l = &c->locals[i];
    if (!l) {
        if (c->nlocal == VKU_MAX_LOCAL) {
            rc = VK_ST_NOMEM;
            goto out;
        }
        ucp_mem_h memh;
        int own = -1, hollow = 0;
        long page = sysconf(_SC_PAGESIZE);
        if (*allocate && !cuda && fd >= 0 && addr % (uintptr_t)page == 0 && size % (uint64_t)page == 0 &&
            (own = fcntl(fd, F_DUPFD_CLOEXEC, 0)) >= 0 &&
            map_allocated(c, addr, size, own, &memh, &hollow) != 0) {
            close(own);
            own = -1;
        }
        if (own < 0) {
            ucp_mem_map_params_t mp;
            memset(&mp, 0, sizeof(mp));
            mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
            mp.address = (void *)addr;
            mp.length = size;
            if (cuda) { /* UCX registers it with the MDs of CUDA memory (and, in a UCX built
                         * with verbs and CUDA, with the NIC through its dma-buf) */
                mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
                mp.memory_type = UCS_MEMORY_TYPE_CUDA;
            }
            ucs_status_t st = ucp_mem_map(c->context, &mp, &memh);
            if (st != UCS_OK) {
                rc = st;
                goto out;
            }
        }
        l = &c->locals[c->nlocal++];
        l->addr = addr;
        l->size = size;
        l->memh = memh;
        l->fd = own;
        l->hollow = hollow;
    }
    *allocate = l->fd >= 0;
    void *packed;
    size_t plen;
    ucs_status_t st = ucp_rkey_pack(c->context, l->memh, &packed, &plen);
    if (st != UCS_OK) {
        rc = st;
        goto out;
    }
    if (plen > *len) {
        rc = VK_ST_TOOBIG;
    } else {
        memcpy(buf, packed, plen);
    }
    *len = plen;
    ucp_rkey_buffer_release(packed);
out:
    pthread_mutex_unlock(&c->mem_lock);
    return rc;
}
