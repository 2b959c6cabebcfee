/* test_modelsync.c: the model's content hash and its cache, and the whole-file transfer over a
 * pair of authenticated channels on a socketpair: full transfer, resume of a .part, a corrupted
 * prefix or a server sending other bytes (rejected by the hash), a peer with another model, and a
 * peer that goes silent or closes mid-transfer (clean error within the timeout, resumable). */
#include <pthread.h>
#include <sodium.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "agent/modelstore/modelsync.h"
#include "common/common.h"
#include "harness.h"
#include "infer/gguf_write.h"
#include "infer/infer.h"
#include "transport/chan.h"
#include "transport/transport.h"

static tp_keys_t K;
static const uint8_t ID_A[16] = {0xa};
static const uint8_t ID_B[16] = {0xb};
static char DIR_[256];

/* ---- helpers ------------------------------------------------------------------------------ */

struct hs {
	int fd, initiator;
	const uint8_t *id;
	tp_chan_t *ch;
	int rc;
	char err[256];
};

static void *hs_thread(void *p)
{
	struct hs *a = p;
	a->rc =
	    tp_chan_open_fd(&a->ch, a->fd, a->initiator, &K, a->id, 3000, a->err, sizeof a->err);
	return NULL;
}

/* Two authenticated channels joined by a socketpair: *f (fetcher side) and *s (server side). */
static int chan_pair(tp_chan_t **f, tp_chan_t **s)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
		return -1;
	struct hs a = {.fd = sv[0], .initiator = 1, .id = ID_A};
	struct hs b = {.fd = sv[1], .initiator = 0, .id = ID_B};
	pthread_t t;
	pthread_create(&t, NULL, hs_thread, &b);
	hs_thread(&a);
	pthread_join(t, NULL);
	if (a.rc || b.rc) {
		tp_chan_free(a.ch);
		tp_chan_free(b.ch);
		return -1;
	}
	*f = a.ch;
	*s = b.ch;
	return 0;
}

/* A file of n pseudo-random bytes (seeded) at DIR_/name; returns its contents (caller frees). */
static uint8_t *make_file(const char *name, size_t n, unsigned seed, char *path, size_t plen)
{
	uint8_t *b = malloc(n);
	uint32_t x = seed * 2654435761u + 1;
	for (size_t i = 0; i < n; i++) {
		x = x * 1664525u + 1013904223u;
		b[i] = (uint8_t)(x >> 24);
	}
	snprintf(path, plen, "%s/%s", DIR_, name);
	write_file_atomic(path, b, n, NULL, 0);
	return b;
}

static int file_equals(const char *path, const uint8_t *b, size_t n)
{
	char *got = NULL;
	size_t len = 0;
	if (read_file_all(path, &got, &len, NULL, 0))
		return 0;
	int eq = len == n && memcmp(got, b, n) == 0;
	free(got);
	return eq;
}

static void clean_state(const char *state)
{
	char cmd[600];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", state);
	if (system(cmd) != 0)
		fprintf(stderr, "rm failed\n");
}

struct prog {
	uint64_t first, last;
	int calls;
};

static void on_progress(uint64_t done, uint64_t total, void *ud)
{
	struct prog *p = ud;
	(void)total;
	if (!p->calls++)
		p->first = done;
	p->last = done;
}

/* ---- hashing ------------------------------------------------------------------------------ */

TEST(hash_matches_blake2b_and_is_cached)
{
	char path[300], state[300], err[256];
	size_t n = 3 * 1000 * 1000 + 17;
	uint8_t *b = make_file("h.bin", n, 1, path, sizeof path);
	snprintf(state, sizeof state, "%s/st_hash", DIR_);
	uint8_t want[32], got[32], again[32];
	crypto_generichash(want, 32, b, n, NULL, 0);
	CHECK_EQ_INT(modelsync_hash_file(path, state, got, err, sizeof err), 0);
	CHECK(memcmp(got, want, 32) == 0);

	/* The cache holds it: poison the cached entry and see it come back (proves no rehash). */
	char cp[400], *cache = NULL, hex[MS_HASH_HEX];
	size_t clen;
	snprintf(cp, sizeof cp, "%s/model-hashes", state);
	CHECK_EQ_INT(read_file_all(cp, &cache, &clen, NULL, 0), 0);
	CHECK(cache && strstr(cache, modelsync_hex(hex, want)) != NULL);
	if (cache) {
		memset(cache, '0', 64);
		write_file_atomic(cp, cache, clen, NULL, 0);
	}
	free(cache);
	CHECK_EQ_INT(modelsync_hash_file(path, state, again, err, sizeof err), 0);
	uint8_t zero[32] = {0};
	CHECK(memcmp(again, zero, 32) == 0);

	/* A changed file (new mtime and size) is hashed again. */
	b[0] ^= 1;
	write_file_atomic(path, b, n - 1, NULL, 0);
	crypto_generichash(want, 32, b, n - 1, NULL, 0);
	CHECK_EQ_INT(modelsync_hash_file(path, state, again, err, sizeof err), 0);
	CHECK(memcmp(again, want, 32) == 0);

	CHECK_EQ_INT(modelsync_hash_file("/nonexistent/x.gguf", state, got, err, sizeof err),
		     SH_ENOENT);
	uint8_t back[32];
	CHECK_EQ_INT(modelsync_unhex(back, modelsync_hex(hex, want)), 0);
	CHECK(memcmp(back, want, 32) == 0);
	CHECK_EQ_INT(modelsync_unhex(back, "xyz"), SH_EINVAL);
	free(b);
}

/* ---- transfer ----------------------------------------------------------------------------- */

TEST(full_transfer)
{
	char path[300], state[300], out[600], err[256];
	size_t n = (size_t)5.5 * (1 << 20) + 123; /* not a whole number of chunks */
	uint8_t *b = make_file("m.gguf", n, 2, path, sizeof path);
	snprintf(state, sizeof state, "%s/st_full", DIR_);
	uint8_t h[32];
	CHECK_EQ_INT(modelsync_hash_file(path, NULL, h, err, sizeof err), 0);
	tp_chan_t *f, *s;
	if (chan_pair(&f, &s))
		SKIP("no channel pair");
	modelsync_server_t *srv;
	CHECK_EQ_INT(modelsync_server_start(&srv, s, path, h, 0, NULL, 0, 3000, err, sizeof err),
		     0);
	struct prog pg = {0};
	int rc =
	    modelsync_fetch(f, h, state, out, sizeof out, on_progress, &pg, 3000, err, sizeof err);
	if (rc)
		fprintf(stderr, "fetch: %s\n", err);
	CHECK_EQ_INT(rc, 0);
	CHECK(file_equals(out, b, n));
	CHECK_EQ_INT((int64_t)pg.last, (int64_t)n);
	char exp[600];
	modelsync_model_path(state, h, exp, sizeof exp);
	CHECK_EQ_STR(out, exp);
	strcat(exp, ".part");
	CHECK(access(exp, F_OK) != 0);
	int64_t t0 = now_ms();
	int src = -1;
	while (!modelsync_server_done(srv, &src) && now_ms() - t0 < 3000)
		usleep(10000);
	CHECK_EQ_INT(src, 0);
	modelsync_server_free(srv);

	/* Already there: returns at once without the peer. */
	char out2[600];
	CHECK_EQ_INT(
	    modelsync_fetch(f, h, state, out2, sizeof out2, NULL, NULL, 100, err, sizeof err), 0);
	CHECK_EQ_STR(out2, out);
	CHECK_EQ_INT(modelsync_cached(state, h, out2, sizeof out2), 1);
	tp_chan_free(f);
	free(b);
}

#define NO_PAIR (-1000) /* serve_fetch could not make a channel pair */

/* Serves serve_path (announced as serve_h) on a fresh channel pair and fetches want_h into
 * state; frees both sides. Returns modelsync_fetch's code, or NO_PAIR. pg may be NULL. */
static int serve_fetch(const char *serve_path, const uint8_t serve_h[32], const uint8_t want_h[32],
		       const char *state, char *out, size_t outlen, struct prog *pg, char *err,
		       size_t errlen)
{
	tp_chan_t *f, *s;
	if (chan_pair(&f, &s))
		return NO_PAIR;
	modelsync_server_t *srv;
	CHECK_EQ_INT(
	    modelsync_server_start(&srv, s, serve_path, serve_h, 0, NULL, 0, 3000, err, errlen), 0);
	int rc = modelsync_fetch(f, want_h, state, out, outlen, pg ? on_progress : NULL, pg, 3000,
				 err, errlen);
	modelsync_server_free(srv);
	tp_chan_free(f);
	return rc;
}

/* Writes the first k bytes of b as the .part of hash h in state (optionally corrupting one). */
static void make_part(const char *state, const uint8_t h[32], const uint8_t *b, size_t k,
		      int corrupt)
{
	char p[600], dir[400];
	snprintf(dir, sizeof dir, "%s/models", state);
	mkdir_p(dir, NULL, 0);
	modelsync_model_path(state, h, p, sizeof p - 8);
	strcat(p, ".part");
	uint8_t *c = malloc(k);
	memcpy(c, b, k);
	if (corrupt)
		c[k / 2] ^= 0x40;
	write_file_atomic(p, c, k, NULL, 0);
	free(c);
}

TEST(resume_partial)
{
	char path[300], state[300], out[600], err[256];
	size_t n = 4 * (1 << 20) + 5, k = 1500000;
	uint8_t *b = make_file("r.gguf", n, 3, path, sizeof path);
	snprintf(state, sizeof state, "%s/st_resume", DIR_);
	uint8_t h[32];
	CHECK_EQ_INT(modelsync_hash_file(path, NULL, h, err, sizeof err), 0);
	make_part(state, h, b, k, 0);
	struct prog pg = {0};
	int rc = serve_fetch(path, h, h, state, out, sizeof out, &pg, err, sizeof err);
	if (rc == NO_PAIR)
		SKIP("no channel pair");
	CHECK_EQ_INT(rc, 0);
	CHECK(file_equals(out, b, n));
	/* The first chunk received starts where the .part ended: k + one chunk. */
	CHECK_EQ_INT((int64_t)pg.first, (int64_t)(k + MS_CHUNK_DEFAULT));
	free(b);
}

TEST(corrupted_data_rejected)
{
	char path[300], other[300], state[300], out[600], err[256], fin[600];
	size_t n = 2 * (1 << 20) + 77;
	uint8_t *b = make_file("c.gguf", n, 4, path, sizeof path);
	uint8_t *b2 = make_file("c2.gguf", n, 4, other, sizeof other);
	b2[n / 3] ^= 1; /* same size, one byte differs: a server sending a corrupted chunk */
	write_file_atomic(other, b2, n, NULL, 0);
	snprintf(state, sizeof state, "%s/st_corrupt", DIR_);
	uint8_t h[32];
	CHECK_EQ_INT(modelsync_hash_file(path, NULL, h, err, sizeof err), 0);
	modelsync_model_path(state, h, fin, sizeof fin);

	/* The server announces h but sends other's bytes. */
	int rc = serve_fetch(other, h, h, state, out, sizeof out, NULL, err, sizeof err);
	if (rc == NO_PAIR)
		SKIP("no channel pair");
	CHECK_EQ_INT(rc, SH_EFORMAT);
	CHECK(strstr(err, "rejected") != NULL);
	CHECK(access(fin, F_OK) != 0);
	char part[620];
	snprintf(part, sizeof part, "%s.part", fin);
	CHECK(access(part, F_OK) != 0);

	/* A corrupted .part prefix (disk) is caught the same way (the fetcher tells the server to
	 * stop), then a fresh fetch on a new channel succeeds. */
	make_part(state, h, b, 1 << 20, 1);
	CHECK_EQ_INT(serve_fetch(path, h, h, state, out, sizeof out, NULL, err, sizeof err),
		     SH_EFORMAT);
	CHECK(access(part, F_OK) != 0);
	CHECK_EQ_INT(serve_fetch(path, h, h, state, out, sizeof out, NULL, err, sizeof err), 0);
	CHECK(file_equals(out, b, n));
	free(b);
	free(b2);
}

TEST(other_model_is_a_clear_error)
{
	char path[300], other[300], state[300], out[600], err[256];
	uint8_t *b = make_file("a.gguf", 100000, 5, path, sizeof path);
	uint8_t *b2 = make_file("b.gguf", 100000, 6, other, sizeof other);
	snprintf(state, sizeof state, "%s/st_other", DIR_);
	uint8_t ha[32], hb[32];
	CHECK_EQ_INT(modelsync_hash_file(path, NULL, ha, err, sizeof err), 0);
	CHECK_EQ_INT(modelsync_hash_file(other, NULL, hb, err, sizeof err), 0);
	tp_chan_t *f, *s;
	if (chan_pair(&f, &s))
		SKIP("no channel pair");
	modelsync_server_t *srv;
	CHECK_EQ_INT(modelsync_server_start(&srv, s, other, hb, 0, NULL, 0, 3000, err, sizeof err),
		     0);
	CHECK_EQ_INT(
	    modelsync_fetch(f, ha, state, out, sizeof out, NULL, NULL, 3000, err, sizeof err),
	    SH_ENOENT);
	CHECK(strstr(err, "serves model") != NULL);
	int64_t t0 = now_ms();
	int src = 0;
	while (!modelsync_server_done(srv, &src) && now_ms() - t0 < 3000)
		usleep(10000);
	CHECK_EQ_INT(src, SH_ENOENT);
	modelsync_server_free(srv);
	tp_chan_free(f);
	free(b);
	free(b2);
}

/* A fake server: answers REQ with INFO and the first GET with DATA, then goes silent
 * (close_after = 0) or closes the channel (close_after = 1). */
struct fake {
	tp_chan_t *c;
	const uint8_t *hash, *data;
	uint64_t size;
	int close_after;
	int hold_ms;
};

static void *fake_main(void *arg)
{
	struct fake *fk = arg;
	uint16_t type;
	void *p;
	size_t len;
	if (tp_chan_recv(fk->c, &type, &p, &len, 3000) || type != MS_MSG_REQ)
		return NULL;
	uint8_t info[48] = {0};
	memcpy(info, fk->hash, 32);
	for (int i = 0; i < 8; i++)
		info[32 + i] = (uint8_t)(fk->size >> (8 * i));
	uint32_t ch = MS_CHUNK_DEFAULT;
	memcpy(info + 40, &ch, 4); /* little-endian hosts only: fine for a test */
	tp_chan_send(fk->c, MS_MSG_INFO, info, sizeof info);
	if (tp_chan_recv(fk->c, &type, &p, &len, 3000) || type != MS_MSG_GET)
		return NULL;
	uint8_t *d = malloc(12 + MS_CHUNK_DEFAULT);
	uint64_t off;
	memcpy(&off, p, 8);
	memcpy(d, &off, 8);
	uint32_t n = MS_CHUNK_DEFAULT;
	memcpy(d + 8, &n, 4);
	memcpy(d + 12, fk->data + off, n);
	tp_chan_send(fk->c, MS_MSG_DATA, d, 12 + n);
	free(d);
	if (fk->close_after) {
		tp_chan_free(fk->c);
		fk->c = NULL;
	} else {
		usleep((useconds_t)fk->hold_ms * 1000);
	}
	return NULL;
}

TEST(peer_vanishing_mid_transfer)
{
	char path[300], state[300], out[600], err[256];
	size_t n = 3 * (1 << 20) + 9;
	uint8_t *b = make_file("v.gguf", n, 7, path, sizeof path);
	snprintf(state, sizeof state, "%s/st_vanish", DIR_);
	uint8_t h[32];
	CHECK_EQ_INT(modelsync_hash_file(path, NULL, h, err, sizeof err), 0);

	for (int close_after = 0; close_after <= 1; close_after++) {
		tp_chan_t *f, *s;
		if (chan_pair(&f, &s))
			SKIP("no channel pair");
		struct fake fk = {.c = s,
				  .hash = h,
				  .data = b,
				  .size = n,
				  .close_after = close_after,
				  .hold_ms = 1500};
		pthread_t t;
		pthread_create(&t, NULL, fake_main, &fk);
		int64_t t0 = now_ms();
		int rc =
		    modelsync_fetch(f, h, state, out, sizeof out, NULL, NULL, 500, err, sizeof err);
		int64_t took = now_ms() - t0;
		CHECK_EQ_INT(rc, close_after ? SH_ECLOSED : SH_ETIMEDOUT);
		CHECK(took < 1400); /* the fetch's own timeout (500 ms), not the peer's hold */
		pthread_join(t, NULL);
		tp_chan_free(fk.c);
		tp_chan_free(f);
	}
	/* The .part kept the chunk of each attempt; a real server completes it. */
	char part[620];
	modelsync_model_path(state, h, part, sizeof part - 8);
	strcat(part, ".part");
	struct stat sb;
	CHECK(stat(part, &sb) == 0 && sb.st_size == 2 * (off_t)MS_CHUNK_DEFAULT);
	struct prog pg = {0};
	CHECK_EQ_INT(serve_fetch(path, h, h, state, out, sizeof out, &pg, err, sizeof err), 0);
	CHECK(file_equals(out, b, n));
	CHECK_EQ_INT((int64_t)pg.first, 3 * (int64_t)MS_CHUNK_DEFAULT);
	free(b);
}

/* A fetch on its own thread. */
struct fetch_arg {
	tp_chan_t *f;
	const uint8_t *h;
	const char *state;
	char out[600], err[256];
	int rc;
};

static void *fetch_main(void *arg)
{
	struct fetch_arg *a = arg;
	a->rc = modelsync_fetch(a->f, a->h, a->state, a->out, sizeof a->out, NULL, NULL, 3000,
				a->err, sizeof a->err);
	return NULL;
}

TEST(server_first_message_and_stop)
{
	char path[300], state[300], err[256];
	size_t n = 300000;
	uint8_t *b = make_file("d.gguf", n, 8, path, sizeof path);
	snprintf(state, sizeof state, "%s/st_first", DIR_);
	uint8_t h[32];
	CHECK_EQ_INT(modelsync_hash_file(path, NULL, h, err, sizeof err), 0);

	/* An idle server stops promptly when freed. */
	tp_chan_t *f, *s;
	if (chan_pair(&f, &s))
		SKIP("no channel pair");
	modelsync_server_t *srv;
	CHECK_EQ_INT(modelsync_server_start(&srv, s, path, h, 0, NULL, 0, 60000, err, sizeof err),
		     0);
	int64_t t0 = now_ms();
	modelsync_server_free(srv);
	CHECK(now_ms() - t0 < 1000);
	tp_chan_free(f);

	/* A dispatcher that read REQ itself hands it over as the first message. */
	if (chan_pair(&f, &s))
		SKIP("no channel pair");
	struct fetch_arg fa = {.f = f, .h = h, .state = state};
	pthread_t t;
	pthread_create(&t, NULL, fetch_main, &fa);
	uint16_t type;
	void *p;
	size_t len;
	CHECK_EQ_INT(tp_chan_recv(s, &type, &p, &len, 3000), 0);
	CHECK(modelsync_is_msg(type));
	uint8_t first[64];
	memcpy(first, p, MIN(len, sizeof first));
	int rc = modelsync_serve(s, path, h, type, first, len, 3000, err, sizeof err);
	pthread_join(t, NULL);
	CHECK_EQ_INT(rc, 0);
	CHECK_EQ_INT(fa.rc, 0);
	CHECK(file_equals(fa.out, b, n));
	tp_chan_free(s);
	tp_chan_free(f);
	free(b);
}

/* ---- slices ------------------------------------------------------------------------------- */

/* Serves the model at serve_path and fetches the ranges r[0..n) of it into state's slice file. */
static int serve_fetch_slice(const char *serve_path, const uint8_t h[32], const char *state,
			     const ms_range_t *r, int n, char *out, size_t outlen, uint64_t *got,
			     char *err, size_t errlen)
{
	tp_chan_t *f, *s;
	if (chan_pair(&f, &s))
		return NO_PAIR;
	modelsync_server_t *srv;
	CHECK_EQ_INT(modelsync_server_start(&srv, s, serve_path, h, 0, NULL, 0, 3000, err, errlen),
		     0);
	int rc = modelsync_fetch_slice(f, h, state, r, n, out, outlen, got, 3000, err, errlen);
	modelsync_server_free(srv);
	tp_chan_free(f);
	return rc;
}

/* The ranges a share of the model at path reads (eng_shard_ranges), as ms_range_t. */
static int share_ranges(const char *path, int ffn0, int ffn1, int q0, int q1, int kv0, int kv1,
			int rank, ms_range_t **out, int *n)
{
	eng_dist_t d = {.has_ranges = 1,
			.q0 = q0,
			.q1 = q1,
			.kv0 = kv0,
			.kv1 = kv1,
			.ffn0 = ffn0,
			.ffn1 = ffn1,
			.layer0 = 0,
			.layer1 = 4};
	eng_range_t *r;
	char err[256];
	int rc = eng_shard_ranges(path, &d, rank, &r, n, err, sizeof err);
	if (rc) {
		fprintf(stderr, "eng_shard_ranges: %s\n", err);
		return rc;
	}
	*out = calloc((size_t)*n + 1, sizeof **out);
	for (int i = 0; i < *n; i++)
		(*out)[i] = (ms_range_t){r[i].off, r[i].len, r[i].compact, 0};
	free(r);
	return 0;
}

static uint64_t on_disk(const char *path)
{
	struct stat sb;
	return stat(path, &sb) == 0 ? (uint64_t)sb.st_blocks * 512 : 0;
}

/* A node that computes a share fetches the header, then only its share's bytes; a later share
 * fetches only the difference; the bytes it holds equal the model's; a byte that rots on disk is
 * found by the verification and fetched again. */
TEST(slice_transfer)
{
	char model[300], state[300], out[600], err[256], slice[600];
	snprintf(model, sizeof model, "%s/moe.gguf", DIR_);
	snprintf(state, sizeof state, "%s/state-slice", DIR_);
	mkmodel_opts_t o = {.arch = "llama",
			    .dim = 512,
			    .layers = 4,
			    .heads = 8,
			    .kv_heads = 4,
			    .ffn = 2048,
			    .vocab = 512,
			    .ctx = 256,
			    .type = 8 /* Q8_0 */,
			    .seed = 3};
	CHECK_EQ_INT(mkmodel_write(&o, model, err, sizeof err), 0);
	uint8_t h[32];
	CHECK_EQ_INT(modelsync_hash_file(model, NULL, h, err, sizeof err), 0);
	char *whole = NULL;
	size_t size = 0;
	CHECK_EQ_INT(read_file_all(model, &whole, &size, NULL, 0), 0);

	/* 1. the header alone: enough to plan and to compute the ranges */
	uint64_t got = 0;
	CHECK_EQ_INT(
	    serve_fetch_slice(model, h, state, NULL, 0, slice, sizeof slice, &got, err, sizeof err),
	    0);
	CHECK(got > 0 && got < size / 4);
	ms_range_t *ra = NULL, *rb = NULL;
	int na = 0, nb = 0;
	CHECK_EQ_INT(share_ranges(slice, 0, 1024, 0, 4, 0, 2, 1, &ra, &na), 0);

	/* 2. share A (half the heads and FFN columns): about half the layers' bytes */
	CHECK_EQ_INT(
	    serve_fetch_slice(model, h, state, ra, na, out, sizeof out, &got, err, sizeof err), 0);
	uint64_t share_a = 0;
	for (int i = 0; i < na; i++)
		share_a += ra[i].len;
	char cols[700];
	snprintf(cols, sizeof cols, "%s.cols", slice);
	uint64_t disk = on_disk(slice) + on_disk(cols);
	fprintf(stderr, "slice: share A %llu of %zu bytes, fetched %llu, on disk %llu\n",
		(unsigned long long)share_a, size, (unsigned long long)got,
		(unsigned long long)disk);
	CHECK(share_a < size * 2 / 3);
	/* sparse file + sidecar: about the share (rows exact, column pieces packed) */
	CHECK(disk < share_a + share_a / 10 + (256 << 10));
	char *sl = NULL;
	size_t sl_len = 0;
	CHECK_EQ_INT(read_file_all(slice, &sl, &sl_len, NULL, 0), 0);
	CHECK(sl_len == size);
	int same = 1;
	for (int i = 0; sl && i < na; i++) /* the dense ranges at their offsets */
		same &= ra[i].compact || memcmp(sl + ra[i].off, whole + ra[i].off, ra[i].len) == 0;
	CHECK(same);
	free(sl);

	/* 3. again: nothing to fetch, and no channel needed */
	CHECK_EQ_INT(modelsync_fetch_slice(NULL, h, state, ra, na, out, sizeof out, &got, 1000, err,
					   sizeof err),
		     0);
	CHECK(got == 0);

	/* 4. a re-plan moves the share: only the difference travels */
	CHECK_EQ_INT(share_ranges(slice, 512, 1536, 2, 6, 1, 3, 1, &rb, &nb), 0);
	CHECK_EQ_INT(
	    serve_fetch_slice(model, h, state, rb, nb, out, sizeof out, &got, err, sizeof err), 0);
	uint64_t share_b = 0;
	for (int i = 0; i < nb; i++)
		share_b += rb[i].len;
	fprintf(stderr, "slice: share B %llu bytes, fetched %llu\n", (unsigned long long)share_b,
		(unsigned long long)got);
	CHECK(got > 0 && got < share_b * 2 / 3);

	/* 5. a byte rots on disk: the verification drops its batch, the next fetch repairs it */
	uint64_t held = 0, dropped = 0;
	CHECK_EQ_INT(modelsync_slice_verify(state, h, &held, &dropped, err, sizeof err), 0);
	CHECK(dropped == 0 && held > 0);
	FILE *f = fopen(slice, "r+b");
	if (f) {
		fseek(f, (long)(ra[0].off + ra[0].len / 2), SEEK_SET); /* in the header */
		fputc(whole[ra[0].off + ra[0].len / 2] ^ 0x20, f);
		fclose(f);
	}
	CHECK_EQ_INT(modelsync_slice_verify(state, h, &held, &dropped, err, sizeof err), 0);
	CHECK(dropped > 0);
	CHECK_EQ_INT(
	    serve_fetch_slice(model, h, state, ra, na, out, sizeof out, &got, err, sizeof err), 0);
	CHECK(got > 0 && got <= dropped); /* the batch may hold bytes share A does not need */
	CHECK_EQ_INT(modelsync_slice_verify(state, h, &held, &dropped, err, sizeof err), 0);
	CHECK(dropped == 0);
	free(ra);
	free(rb);
	free(whole);
}

int main(void)
{
	char err[256];
	if (sodium_init() < 0 || tp_keys_derive(&K, "modelsync test", 14, err, sizeof err)) {
		fprintf(stderr, "keys: %s\n", err);
		return 1;
	}
	snprintf(DIR_, sizeof DIR_, "/tmp/shoal_modelsync_XXXXXX");
	if (!mkdtemp(DIR_))
		return 1;
	RUN(hash_matches_blake2b_and_is_cached);
	RUN(full_transfer);
	RUN(resume_partial);
	RUN(corrupted_data_rejected);
	RUN(other_model_is_a_clear_error);
	RUN(peer_vanishing_mid_transfer);
	RUN(server_first_message_and_stop);
	RUN(slice_transfer);
	clean_state(DIR_);
	return harness_done();
}
