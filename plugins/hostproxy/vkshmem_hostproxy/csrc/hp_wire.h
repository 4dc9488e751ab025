/* vkshmem-hostproxy: little-endian field access of the wire format (hp_server.h), shared by the
 * server (hp_server.c) and the client (hp_client.c). */
#ifndef VKSHMEM_HP_WIRE_H
#define VKSHMEM_HP_WIRE_H

#include <endian.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t rd32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return le32toh(v);
}

static inline uint64_t rd64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return le64toh(v);
}

static inline void wr32(unsigned char *p, uint32_t v) {
    v = htole32(v);
    memcpy(p, &v, 4);
}

static inline void wr64(unsigned char *p, uint64_t v) {
    v = htole64(v);
    memcpy(p, &v, 8);
}

/* A request header: op, AMO op and width, seg, offset, arg, compare (see hp_server.h). */
static inline void hp_header(unsigned char *h, unsigned op, unsigned aop, unsigned width,
                             uint32_t seg, uint64_t off, uint64_t arg, uint64_t cmp) {
    h[0] = (unsigned char)op;
    h[1] = (unsigned char)aop;
    h[2] = (unsigned char)width;
    h[3] = 0;
    wr32(h + 4, seg);
    wr64(h + 8, off);
    wr64(h + 16, arg);
    wr64(h + 24, cmp);
}

#endif
