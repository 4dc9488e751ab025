/*
 * uct_put: a stranger's write into another process's memory through UCX's tcp transport
 * (issue 36). Uses only UCX's public UCT API -- no UCP, no vkshmem, no secret of the job.
 *
 *     uct_put <port> <hex address> <hex 8-byte value>
 *
 * Opens UCT's tcp component on device lo, takes its own device address (127.0.0.1 plus the
 * host's loopback identity: the same as the target's on this host) and its own iface address,
 * puts the target's port into the iface address (UCX's tcp iface address is the listening port,
 * a network-order uint16), connects an endpoint to it and issues a put of the 8-byte value to
 * the address with remote key 0 (put_short where the transport has it, else put_zcopy), then
 * flushes the endpoint: UCX's tcp completes the flush only once the target acknowledged the
 * put, i.e. applied it. Everything is bounded (3 s for connect + put + flush, alarm(10)).
 *
 * Prints one "uct_put: ..." line per step; the last one says what happened.
 * Exit status: 0 the put completed (the target wrote it); 1 the put failed or did not complete
 * in time (no UCX tcp listener there, refused, ...); 2 usage or local setup error.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <ucs/async/async_fwd.h>
#include <uct/api/uct.h>

#define DEADLINE_S 3.0

static ucs_status_t ep_error = UCS_OK;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("uct_put: ", stdout);
    vprintf(fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
    fflush(stdout);
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "uct_put: FAILED: alarm (10 s) expired\n";
    (void)!write(STDOUT_FILENO, msg, sizeof(msg) - 1);
    _exit(1);
}

static ucs_status_t on_ep_error(void *arg, uct_ep_h ep, ucs_status_t status)
{
    (void)arg;
    (void)ep;
    ep_error = status;
    return UCS_OK;
}

static void on_completion(uct_completion_t *comp)
{
    (void)comp;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void hex(const char *what, const void *p, size_t n)
{
    char buf[512] = "";
    for (size_t i = 0; i < n && i < 200; i++) {
        snprintf(buf + 2 * i, sizeof(buf) - 2 * i, "%02x", ((const unsigned char *)p)[i]);
    }
    say("%s (%zu bytes): %s", what, n, buf);
}

/* Is `port` a listening AF_INET socket of this process? (checks the iface address layout) */
static int own_listener(uint16_t port)
{
    for (int fd = 3; fd < 1024; fd++) {
        struct sockaddr_in sa;
        socklen_t len = sizeof(sa);
        int listening = 0;
        socklen_t ilen = sizeof(listening);
        if (getsockname(fd, (struct sockaddr *)&sa, &len) == 0 && sa.sin_family == AF_INET &&
            ntohs(sa.sin_port) == port &&
            getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ilen) == 0 && listening) {
            return 1;
        }
    }
    return 0;
}

#define CHECK(call)                                                                    \
    do {                                                                               \
        ucs_status_t st_ = (call);                                                     \
        if (st_ != UCS_OK) {                                                           \
            say("SETUP ERROR: %s: %s", #call, ucs_status_string(st_));                 \
            _exit(2);                                                                  \
        }                                                                              \
    } while (0)

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s <port> <hex address> <hex 8-byte value>\n", argv[0]);
        _exit(2);
    }
    char *end;
    unsigned long port = strtoul(argv[1], &end, 10);
    if (*end || port == 0 || port > 65535) {
        fprintf(stderr, "uct_put: bad port %s\n", argv[1]);
        _exit(2);
    }
    uint64_t address = strtoull(argv[2], &end, 16);
    if (*end) {
        fprintf(stderr, "uct_put: bad address %s\n", argv[2]);
        _exit(2);
    }
    uint64_t value = strtoull(argv[3], &end, 16);
    if (*end) {
        fprintf(stderr, "uct_put: bad value %s\n", argv[3]);
        _exit(2);
    }
    signal(SIGALRM, on_alarm);
    alarm(10);
    say("uid %d, target 127.0.0.1:%lu, address 0x%" PRIx64 ", value 0x%" PRIx64, (int)getuid(),
        port, address, value);

    /* the tcp component and its memory domain */
    uct_component_h *components;
    unsigned n_components;
    CHECK(uct_query_components(&components, &n_components));
    uct_component_h tcp = NULL;
    uct_md_resource_desc_t md_resources[8];
    uct_component_attr_t cattr = {0};
    for (unsigned i = 0; i < n_components && tcp == NULL; i++) {
        cattr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME |
                           UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
        CHECK(uct_component_query(components[i], &cattr));
        if (strcmp(cattr.name, "tcp") == 0 && cattr.md_resource_count > 0 &&
            cattr.md_resource_count <= 8) {
            cattr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
            cattr.md_resources = md_resources;
            CHECK(uct_component_query(components[i], &cattr));
            tcp = components[i];
        }
    }
    if (tcp == NULL) {
        say("SETUP ERROR: no tcp component in this UCX");
        _exit(2);
    }
    uct_md_config_t *md_config;
    uct_md_h md;
    CHECK(uct_md_config_read(tcp, NULL, NULL, &md_config));
    CHECK(uct_md_open(tcp, md_resources[0].md_name, md_config, &md));
    uct_config_release(md_config);

    /* a worker and an iface of our own on lo */
    ucs_async_context_t *async;
    uct_worker_h worker;
    CHECK(ucs_async_context_create(UCS_ASYNC_MODE_THREAD_SPINLOCK, &async));
    CHECK(uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &worker));
    uct_iface_config_t *iface_config;
    CHECK(uct_md_iface_config_read(md, "tcp", NULL, NULL, &iface_config));
    uct_iface_params_t params;
    memset(&params, 0, sizeof(params));
    params.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_DEVICE |
                        UCT_IFACE_PARAM_FIELD_ERR_HANDLER |
                        UCT_IFACE_PARAM_FIELD_ERR_HANDLER_ARG |
                        UCT_IFACE_PARAM_FIELD_ERR_HANDLER_FLAGS | UCT_IFACE_PARAM_FIELD_FEATURES;
    params.open_mode = UCT_IFACE_OPEN_MODE_DEVICE;
    params.mode.device.tl_name = "tcp";
    params.mode.device.dev_name = "lo";
    params.err_handler = on_ep_error;
    params.err_handler_arg = NULL;
    params.err_handler_flags = 0;
    params.features = UCT_IFACE_FEATURE_PUT | UCT_IFACE_FEATURE_AM;
    uct_iface_h iface;
    CHECK(uct_iface_open(md, worker, &params, iface_config, &iface));
    uct_config_release(iface_config);
    uct_iface_progress_enable(iface, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
    uct_iface_attr_t attr;
    CHECK(uct_iface_query(iface, &attr));
    if (!(attr.cap.flags & UCT_IFACE_FLAG_CONNECT_TO_IFACE) ||
        !(attr.cap.flags & (UCT_IFACE_FLAG_PUT_SHORT | UCT_IFACE_FLAG_PUT_ZCOPY)) ||
        attr.iface_addr_len < sizeof(uint16_t) || attr.device_addr_len > 256 ||
        attr.iface_addr_len > 256) {
        say("SETUP ERROR: tcp on lo cannot connect to an iface or put (flags 0x%" PRIx64
            ", iface address %zu bytes)", attr.cap.flags, attr.iface_addr_len);
        _exit(2);
    }

    /* our own addresses; the target's differ only in the port */
    unsigned char dev_addr[256], iface_addr[256];
    CHECK(uct_iface_get_device_address(iface, (uct_device_addr_t *)dev_addr));
    CHECK(uct_iface_get_address(iface, (uct_iface_addr_t *)iface_addr));
    hex("own device address", dev_addr, attr.device_addr_len);
    hex("own iface address", iface_addr, attr.iface_addr_len);
    uint16_t own_port;
    memcpy(&own_port, iface_addr, sizeof(own_port));
    own_port = ntohs(own_port);
    if (!own_listener(own_port)) {
        say("SETUP ERROR: the iface address does not start with our listening port (%u)",
            own_port);
        _exit(2);
    }
    say("own iface listens on port %u: the iface address is that port, network order",
        own_port);
    uint16_t target_port = htons((uint16_t)port);
    memcpy(iface_addr, &target_port, sizeof(target_port));

    uct_ep_params_t ep_params;
    memset(&ep_params, 0, sizeof(ep_params));
    ep_params.field_mask = UCT_EP_PARAM_FIELD_IFACE | UCT_EP_PARAM_FIELD_DEV_ADDR |
                           UCT_EP_PARAM_FIELD_IFACE_ADDR;
    ep_params.iface = iface;
    ep_params.dev_addr = (const uct_device_addr_t *)dev_addr;
    ep_params.iface_addr = (const uct_iface_addr_t *)iface_addr;
    uct_ep_h ep;
    ucs_status_t st = uct_ep_create(&ep_params, &ep);
    if (st != UCS_OK) {
        say("FAILED: uct_ep_create to port %lu: %s", port, ucs_status_string(st));
        _exit(1);
    }

    /* the put, retried while the connection is being made */
    double deadline = now() + DEADLINE_S;
    uint64_t payload = value;
    uct_completion_t put_comp = {on_completion, 1, UCS_OK};
    const char *how = (attr.cap.flags & UCT_IFACE_FLAG_PUT_SHORT) ? "put_short" : "put_zcopy";
    for (;;) {
        if (attr.cap.flags & UCT_IFACE_FLAG_PUT_SHORT) {
            st = uct_ep_put_short(ep, &payload, sizeof(payload), address, 0);
        } else {
            uct_iov_t iov = {&payload, sizeof(payload), UCT_MEM_HANDLE_NULL, 0, 1};
            st = uct_ep_put_zcopy(ep, &iov, 1, address, 0, &put_comp);
        }
        if (st != UCS_ERR_NO_RESOURCE || ep_error != UCS_OK || now() > deadline) {
            break;
        }
        uct_worker_progress(worker);
    }
    if (ep_error != UCS_OK) {
        say("FAILED: %s: endpoint error %s", how, ucs_status_string(ep_error));
        _exit(1);
    }
    if (st != UCS_OK && st != UCS_INPROGRESS) {
        say("FAILED: %s: %s", how, ucs_status_string(st));
        _exit(1);
    }
    say("%s of 8 bytes to 0x%" PRIx64 " with rkey 0: %s", how, address, ucs_status_string(st));

    /* flush: done once the target acknowledged the put */
    uct_completion_t flush_comp = {on_completion, 1, UCS_OK};
    do {
        st = uct_ep_flush(ep, 0, &flush_comp);
        if (st == UCS_ERR_NO_RESOURCE) {
            uct_worker_progress(worker);
        }
    } while (st == UCS_ERR_NO_RESOURCE && ep_error == UCS_OK && now() < deadline);
    if (st == UCS_INPROGRESS) {
        while (flush_comp.count > 0 && ep_error == UCS_OK && now() < deadline) {
            uct_worker_progress(worker);
        }
        st = flush_comp.count > 0 ? UCS_ERR_TIMED_OUT : flush_comp.status;
    }
    if (ep_error != UCS_OK) {
        st = ep_error;
    } else if (st == UCS_OK && put_comp.count == 0 && put_comp.status != UCS_OK) {
        st = put_comp.status;
    }
    if (st != UCS_OK) {
        say("FAILED: flush: %s (the target did not acknowledge the put)",
            ucs_status_string(st));
        _exit(1);
    }
    say("WROTE 0x%" PRIx64 " at 0x%" PRIx64 " in the process behind port %lu (flush: OK)",
        value, address, port);
    fflush(stdout);
    _exit(0); /* no teardown: nothing of ours is worth waiting for */
}
