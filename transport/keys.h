/*
 * keys.h (internal to transport/ and tests): test hooks and sodium set-up for keys.c.
 */
#ifndef SHOAL_TP_KEYS_H
#define SHOAL_TP_KEYS_H

#include <stddef.h>

#include "transport/transport.h"

/* Tests only: a cheaper Argon2id cost (0, 0 = back to the default). Call before any thread
 * derives keys. Clusters with different costs get different keys, so production never calls it. */
void tp_keys_set_cost_for_tests(unsigned long long ops, size_t mem);

/* sodium_init once (idempotent, thread-safe). Returns 0 or SH_EIO. */
int tp_sodium_init(void);

#endif
