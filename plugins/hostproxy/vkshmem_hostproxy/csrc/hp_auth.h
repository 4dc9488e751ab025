/* vkshmem-hostproxy: HMAC-SHA256 (FIPS 180-4, RFC 2104) and a constant-time compare, for the
 * challenge-response that admits a peer (see hp_server.h). Self-contained: no libcrypto. */
#ifndef VKSHMEM_HP_AUTH_H
#define VKSHMEM_HP_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define HP_SHA256_SIZE 32

typedef struct hp_sha256 {
    uint32_t h[8];
    uint64_t bytes; /* message length so far */
    unsigned char block[64];
    size_t fill; /* bytes in block */
} hp_sha256;

void hp_sha256_init(hp_sha256 *c);
void hp_sha256_update(hp_sha256 *c, const void *data, size_t n);
void hp_sha256_final(hp_sha256 *c, unsigned char out[HP_SHA256_SIZE]);

/* HMAC-SHA256 of the concatenation of parts[0..nparts) (lens[i] bytes each) under key. */
void hp_hmac_sha256(const unsigned char *key, size_t keylen, const void *const *parts,
                    const size_t *lens, size_t nparts, unsigned char out[HP_SHA256_SIZE]);

/* 1 when a and b (n bytes) are equal; the time taken does not depend on where they differ. */
int hp_equal_ct(const unsigned char *a, const unsigned char *b, size_t n);

#endif
