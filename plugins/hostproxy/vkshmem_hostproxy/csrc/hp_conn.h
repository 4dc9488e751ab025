/* vkshmem-hostproxy client internals shared by hp_conn.c (connections: opening, the handshake,
 * moving bytes, failures) and hp_client.c (the requests and the API). Both are compiled into
 * the one cffi module with hp_server.c, in that order; the functions below are static to it. */
#ifndef VKSHMEM_HP_CONN_H
#define VKSHMEM_HP_CONN_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <vkshmem/plugin.h>
#include "hp_auth.h"
#include "hp_client.h"
#include "hp_server.h"
#include "hp_wire.h"

/* Runs Python's signal handlers (cffi takes the GIL): 0 to go on waiting, nonzero when one
 * raised (the exception is kept on the Python side). */
static int _hpc_signalled(void);

typedef struct hpc_sizes {
    uint32_t cap;
    struct hpc_sizes *older; /* replaced arrays, freed with the endpoint */
    uint64_t size[];         /* UINT64_MAX: not registered */
} hpc_sizes;

typedef struct hpc_target {
    char *host, *port;
    hpc_sizes *sizes; /* published with release order; read without the lock */
} hpc_target;

typedef struct hpc_conn {
    pthread_mutex_t lock;
    int fd; /* -1 once dropped */
    int32_t pe;
    int dirty; /* puts/AMOs sent since the last reply */
    char where[288];
    char broken[HPC_MSGLEN]; /* why it is unusable ("" while usable) */
    struct hpc_conn *next_all;
} hpc_conn;

struct hpc_client {
    pthread_mutex_t lock; /* targets, opening, the lists below */
    int32_t my_pe, n_pes;
    int rail, closed;
    unsigned char key[HP_KEY];
    double timeout_s;
    struct timeval tv;
    vk_amo_fn amo;
    uintptr_t local_base[HP_MAX_SEGS]; /* this PE's segments (0: none) */
    uint64_t local_size[HP_MAX_SEGS];
    hpc_target *targets;
    hpc_conn **conns; /* the current connection to each PE (NULL: none yet) */
    hpc_conn *all;    /* every connection ever opened, newest first */
    uint64_t n_native, n_python, n_opened;
};

/* The calling thread's last failure (hpc_last_error reads it). */
static __thread char last_msg[HPC_MSGLEN];
static __thread int last_status;

/* Record a failure: returns rc. */
static int fail(int rc, int status, const char *fmt, ...);
/* The connection to pe, opened (once) and authenticated; NULL with *rc on failure. */
static hpc_conn *conn_get(hpc_client *c, int32_t pe, int *rc);
/* Take k (locked) out of service: the next request to its PE opens a fresh connection. */
static void conn_retire(hpc_client *c, hpc_conn *k, const char *why);
/* Drop k (locked): unusable from now on, for reason why (the first one given stays). */
static void conn_drop(hpc_conn *k, const char *why);
/* The failure "k is unusable" (k locked, k->broken set). */
static int unusable(hpc_conn *k);
/* Send iov[0..n) (modified) / n bytes at p; receive exactly iov[0..n) (*got: bytes received);
 * a failure drops k, an interrupt (a signal handler raised) retires it: VK_ST_INTR. */
static int send_all(hpc_client *c, hpc_conn *k, struct iovec *iov, int n, const char *doing);
static int send_bytes(hpc_client *c, hpc_conn *k, const void *p, size_t n, const char *doing);
static int recv_all(hpc_client *c, hpc_conn *k, struct iovec *iov, int n, const char *doing,
                    size_t *got);
/* A reply header: 0 and its value, or the server's rejection (k dropped). */
static int check_reply(hpc_conn *k, const unsigned char *rep, uint64_t *value);
static int read_reply(hpc_client *c, hpc_conn *k, const char *doing, uint64_t *value);

#endif
