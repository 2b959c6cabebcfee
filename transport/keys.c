/*
 * keys.c: token -> keys. Argon2id (crypto_pwhash) with a fixed protocol salt turns the token into
 * a 32-byte master key, so an observer who sees the public cluster ID or a handshake must pay
 * Argon2id per guess; crypto_kdf then splits the master key into the public cluster ID and the
 * secret authentication key.
 *
 * Invariant: the token and the master key live only on this function's stack (and libsodium's
 * scratch memory) and are wiped before it returns.
 */
#include "transport/keys.h"

#include <assert.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"

/* "shoal-cluster-v1": 16 bytes = crypto_pwhash_SALTBYTES. Changing it changes every cluster ID. */
static const uint8_t tp_salt[16] = {'s', 'h', 'o', 'a', 'l', '-', 'c', 'l',
				    'u', 's', 't', 'e', 'r', '-', 'v', '1'};
static_assert(sizeof tp_salt == crypto_pwhash_SALTBYTES, "salt size");

#define TP_KDF_CTX "shoalkey" /* crypto_kdf contexts are 8 bytes */
enum { TP_SUBKEY_CID = 1, TP_SUBKEY_AUTH = 2 };

/* Argon2id cost. Written once by tests before any thread starts, read afterwards. */
static unsigned long long tp_ops = crypto_pwhash_OPSLIMIT_INTERACTIVE;
static size_t tp_mem = crypto_pwhash_MEMLIMIT_INTERACTIVE; /* 64 MiB */

void tp_keys_set_cost_for_tests(unsigned long long ops, size_t mem)
{
	tp_ops = ops ? ops : crypto_pwhash_OPSLIMIT_INTERACTIVE;
	tp_mem = mem ? mem : crypto_pwhash_MEMLIMIT_INTERACTIVE;
}

int tp_sodium_init(void)
{
	return sodium_init() < 0 ? SH_EIO : 0;
}

int tp_keys_derive(tp_keys_t *out, const char *token, size_t len, char *err, size_t errlen)
{
	uint8_t master[32], cid16[16];
	memset(out, 0, sizeof *out);
	if (tp_sodium_init() != 0)
		return sh_fail(err, errlen, SH_EIO, "libsodium failed to initialise");
	if (!token || len == 0)
		return sh_fail(err, errlen, SH_EINVAL, "empty token");
	if (crypto_pwhash(master, sizeof master, token, len, tp_salt, tp_ops, tp_mem,
			  crypto_pwhash_ALG_ARGON2ID13) != 0)
		return sh_fail(err, errlen, SH_ENOMEM,
			       "Argon2id could not get its %zu MiB of memory", tp_mem >> 20);
	crypto_kdf_derive_from_key(cid16, sizeof cid16, TP_SUBKEY_CID, TP_KDF_CTX, master);
	crypto_kdf_derive_from_key(out->auth, sizeof out->auth, TP_SUBKEY_AUTH, TP_KDF_CTX,
				   master);
	memcpy(out->cid, cid16, TP_CID_BYTES);
	sodium_bin2hex(out->cid_hex, sizeof out->cid_hex, out->cid, TP_CID_BYTES);
	sodium_memzero(master, sizeof master);
	sodium_memzero(cid16, sizeof cid16);
	return 0;
}

void tp_keys_wipe(tp_keys_t *k)
{
	if (k)
		sodium_memzero(k, sizeof *k);
}

char *tp_id_hex(char out[2 * TP_NODE_ID_BYTES + 1], const uint8_t id[TP_NODE_ID_BYTES])
{
	static const char hx[] = "0123456789abcdef";
	for (int i = 0; i < TP_NODE_ID_BYTES; i++) {
		out[2 * i] = hx[id[i] >> 4];
		out[2 * i + 1] = hx[id[i] & 15];
	}
	out[2 * TP_NODE_ID_BYTES] = 0;
	return out;
}
