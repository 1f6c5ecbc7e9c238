/* HMAC-SHA256 for the tcp handshake (sha256.c; pt_sha256 and pt_hmac_sha256 are in pt.h). */
#ifndef PT_TCP_SHA256_H
#define PT_TCP_SHA256_H

#include <stddef.h>
#include <stdint.h>

/* HMAC-SHA256 of the concatenation of n parts. */
void pt__hmac_parts(const void *key, size_t klen, const void *const *parts, const size_t *lens,
                    int n, uint8_t out[32]);
/* Compare in time that does not depend on where they differ. */
int pt__ct_equal(const void *a, const void *b, size_t len);

#endif
