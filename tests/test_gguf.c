/* test_gguf.c: the GGUF reader on files built in memory, on stories260K, and on truncated and
 * corrupted copies of it (clean errors only; run under `make test-asan T=gguf` too). */
#include "harness.h"

#include "common/common.h"
#include "infer/gguf.h"
#include "infer/model/meta.h"
#include "infer/quant/quant.h"
#include "infer/tok/tokenizer.h"

#include <stdint.h>

/* ---- a tiny GGUF writer for tests ---- */

struct buf {
	uint8_t *p;
	size_t n, cap;
};

static void put(struct buf *b, const void *d, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 64;
		b->p = realloc(b->p, b->cap);
	}
	memcpy(b->p + b->n, d, n);
	b->n += n;
}
static void put_u32(struct buf *b, uint32_t v)
{
	put(b, &v, 4);
}
static void put_u64(struct buf *b, uint64_t v)
{
	put(b, &v, 8);
}
static void put_str(struct buf *b, const char *s)
{
	put_u64(b, strlen(s));
	put(b, s, strlen(s));
}
static void pad_to(struct buf *b, size_t a)
{
	while (b->n % a)
		put(b, "", 1);
}

/* A v3 file with one KV of every type (a nested array included) and two tensors. */
static struct buf build_small(uint32_t version, uint32_t align)
{
	struct buf b = {0};
	put_u32(&b, 0x46554747u);
	put_u32(&b, version);
	put_u64(&b, 2);  /* tensors */
	put_u64(&b, 15); /* kvs */
	put_str(&b, "general.architecture");
	put_u32(&b, GGUF_STR);
	put_str(&b, "llama");
	put_str(&b, "general.alignment");
	put_u32(&b, GGUF_U32);
	put_u32(&b, align);
	uint8_t u8 = 200;
	put_str(&b, "k.u8");
	put_u32(&b, GGUF_U8);
	put(&b, &u8, 1);
	int8_t i8 = -5;
	put_str(&b, "k.i8");
	put_u32(&b, GGUF_I8);
	put(&b, &i8, 1);
	uint16_t u16 = 60000;
	put_str(&b, "k.u16");
	put_u32(&b, GGUF_U16);
	put(&b, &u16, 2);
	int16_t i16 = -300;
	put_str(&b, "k.i16");
	put_u32(&b, GGUF_I16);
	put(&b, &i16, 2);
	int32_t i32 = -70000;
	put_str(&b, "k.i32");
	put_u32(&b, GGUF_I32);
	put(&b, &i32, 4);
	float f = 1.5f;
	put_str(&b, "k.f32");
	put_u32(&b, GGUF_F32);
	put(&b, &f, 4);
	uint8_t bo = 1;
	put_str(&b, "k.bool");
	put_u32(&b, GGUF_BOOL);
	put(&b, &bo, 1);
	put_str(&b, "k.u64");
	put_u32(&b, GGUF_U64);
	put_u64(&b, 1ull << 40);
	int64_t i64 = -(1ll << 40);
	put_str(&b, "k.i64");
	put_u32(&b, GGUF_I64);
	put(&b, &i64, 8);
	double d = 2.25;
	put_str(&b, "k.f64");
	put_u32(&b, GGUF_F64);
	put(&b, &d, 8);
	put_str(&b, "k.strs");
	put_u32(&b, GGUF_ARR);
	put_u32(&b, GGUF_STR);
	put_u64(&b, 3);
	put_str(&b, "a");
	put_str(&b, "");
	put_str(&b, "hello");
	put_str(&b, "k.f32s");
	put_u32(&b, GGUF_ARR);
	put_u32(&b, GGUF_F32);
	put_u64(&b, 2);
	float fs[2] = {0.5f, -2.0f};
	put(&b, fs, 8);
	put_str(&b, "k.nested");
	put_u32(&b, GGUF_ARR);
	put_u32(&b, GGUF_ARR);
	put_u64(&b, 2);
	put_u32(&b, GGUF_I32);
	put_u64(&b, 1);
	put(&b, &i32, 4);
	put_u32(&b, GGUF_STR);
	put_u64(&b, 1);
	put_str(&b, "x");
	/* tensors: a [4 x 2] F32 at 0, a [32] Q8_0 after it (aligned) */
	put_str(&b, "a.weight");
	put_u32(&b, 2);
	put_u64(&b, 4);
	put_u64(&b, 2);
	put_u32(&b, QT_F32);
	put_u64(&b, 0);
	put_str(&b, "b.weight");
	put_u32(&b, 1);
	put_u64(&b, 32);
	put_u32(&b, QT_Q8_0);
	uint64_t boff = ((32 + align - 1) / align) * align;
	put_u64(&b, boff);
	pad_to(&b, align);
	for (int i = 0; i < 8; i++) {
		float v = (float)i;
		put(&b, &v, 4);
	}
	pad_to(&b, align);
	uint8_t q[34] = {0};
	put(&b, q, 34);
	return b;
}

TEST(small_all_types)
{
	uint32_t vers[2] = {2, 3}, aligns[2] = {32, 64};
	for (int vi = 0; vi < 2; vi++) {
		struct buf b = build_small(vers[vi], aligns[vi]);
		gguf_t *g;
		char err[256] = "";
		int rc = gguf_open_mem(&g, b.p, b.n, err, sizeof err);
		CHECK_EQ_INT(rc, 0);
		if (rc) {
			fprintf(stderr, "%s\n", err);
			free(b.p);
			continue;
		}
		CHECK_EQ_INT(gguf_version(g), vers[vi]);
		CHECK_EQ_INT(gguf_alignment(g), aligns[vi]);
		CHECK_EQ_INT(gguf_n_kv(g), 15);
		uint32_t u = 0;
		int32_t i = 0;
		uint64_t u64 = 0;
		float f = 0;
		int bo = 0;
		CHECK_EQ_INT(gguf_get_u32(g, "k.u8", &u), 0);
		CHECK_EQ_INT(u, 200);
		CHECK_EQ_INT(gguf_get_u32(g, "k.u16", &u), 0);
		CHECK_EQ_INT(u, 60000);
		CHECK_EQ_INT(gguf_get_i32(g, "k.i8", &i), 0);
		CHECK_EQ_INT(i, -5);
		CHECK_EQ_INT(gguf_get_i32(g, "k.i16", &i), 0);
		CHECK_EQ_INT(i, -300);
		CHECK_EQ_INT(gguf_get_i32(g, "k.i32", &i), 0);
		CHECK_EQ_INT(i, -70000);
		CHECK_EQ_INT(gguf_get_u32(g, "k.i32", &u), SH_EFORMAT); /* negative */
		CHECK_EQ_INT(gguf_get_u32(g, "k.u64", &u), SH_EFORMAT); /* too big */
		CHECK_EQ_INT(gguf_get_u64(g, "k.u64", &u64), 0);
		CHECK(u64 == 1ull << 40);
		CHECK_EQ_INT(gguf_get_f32(g, "k.f32", &f), 0);
		CHECK_NEAR(f, 1.5, 0);
		CHECK_EQ_INT(gguf_get_f32(g, "k.f64", &f), 0);
		CHECK_NEAR(f, 2.25, 0);
		CHECK_EQ_INT(gguf_get_bool(g, "k.bool", &bo), 0);
		CHECK_EQ_INT(bo, 1);
		CHECK_EQ_INT(gguf_get_u32(g, "general.architecture", &u), SH_EFORMAT);
		u = 7;
		CHECK_EQ_INT(gguf_get_u32(g, "no.such.key", &u), SH_ENOENT);
		CHECK_EQ_INT(u, 7);
		int ki = gguf_find_key(g, "k.i64");
		int64_t i64;
		CHECK_EQ_INT(gguf_kv_i64(g, ki, &i64), 0);
		CHECK(i64 == -(1ll << 40));
		const char *s;
		size_t n;
		CHECK_EQ_INT(gguf_get_str(g, "general.architecture", &s, &n), 0);
		CHECK(n == 5 && !memcmp(s, "llama", 5));
		char *dup;
		CHECK_EQ_INT(gguf_get_strdup(g, "general.architecture", &dup), 0);
		CHECK_EQ_STR(dup, "llama");
		free(dup);
		int ai = gguf_find_key(g, "k.strs");
		CHECK_EQ_INT(gguf_arr_type(g, ai), GGUF_STR);
		CHECK_EQ_INT(gguf_arr_n(g, ai), 3);
		CHECK_EQ_INT(gguf_arr_str(g, ai, 2, &s, &n), 0);
		CHECK(n == 5 && !memcmp(s, "hello", 5));
		CHECK_EQ_INT(gguf_arr_str(g, ai, 1, &s, &n), 0);
		CHECK_EQ_INT(n, 0);
		CHECK(gguf_arr_str(g, ai, 3, &s, &n) != 0);
		ai = gguf_find_key(g, "k.f32s");
		CHECK_EQ_INT(gguf_arr_f32(g, ai, 1, &f), 0);
		CHECK_NEAR(f, -2.0, 0);
		ai = gguf_find_key(g, "k.nested");
		CHECK_EQ_INT(gguf_arr_type(g, ai), GGUF_ARR);
		CHECK_EQ_INT(gguf_arr_n(g, ai), 2);
		CHECK_EQ_INT(gguf_n_tensors(g), 2);
		const gguf_tensor_t *t = gguf_find_tensor(g, "a.weight");
		CHECK(t != NULL);
		if (t) {
			CHECK_EQ_INT(t->n_dims, 2);
			CHECK_EQ_INT(t->ne[0], 4);
			CHECK_EQ_INT(t->ne[1], 2);
			CHECK_EQ_INT(t->nbytes, 32);
			float v;
			memcpy(&v, (const char *)t->data + 12, 4);
			CHECK_NEAR(v, 3.0, 0);
		}
		t = gguf_find_tensor(g, "b.weight");
		CHECK(t && t->type == QT_Q8_0 && t->nbytes == 34);
		CHECK(gguf_find_tensor(g, "c.weight") == NULL);
		CHECK_EQ_INT(gguf_tensor_bytes(g), 66);
		gguf_free(g);
		free(b.p);
	}
}

/* Rewrites a u32 at a found pattern position: finds a tensor's type field by name. */
static size_t find_bytes(const struct buf *b, const char *s)
{
	size_t n = strlen(s);
	for (size_t i = 0; i + n <= b->n; i++)
		if (!memcmp(b->p + i, s, n))
			return i;
	return 0;
}

TEST(errors_name_the_problem)
{
	char err[256];
	gguf_t *g;
	struct buf b = build_small(3, 32);
	/* bad magic */
	b.p[0] = 'X';
	CHECK_EQ_INT(gguf_open_mem(&g, b.p, b.n, err, sizeof err), SH_EFORMAT);
	CHECK(strstr(err, "magic") != NULL);
	b.p[0] = 'G';
	/* version */
	b.p[4] = 9;
	CHECK_EQ_INT(gguf_open_mem(&g, b.p, b.n, err, sizeof err), SH_EUNSUPP);
	CHECK(strstr(err, "version 9") != NULL);
	b.p[4] = 3;
	/* truncated header */
	CHECK_EQ_INT(gguf_open_mem(&g, b.p, 10, err, sizeof err), SH_EFORMAT);
	CHECK(strstr(err, "truncated") != NULL);
	/* unknown value type */
	size_t k = find_bytes(&b, "k.u8") + 4;
	b.p[k] = 77;
	CHECK_EQ_INT(gguf_open_mem(&g, b.p, b.n, err, sizeof err), SH_EFORMAT);
	CHECK(strstr(err, "unknown value type 77") != NULL);
	b.p[k] = GGUF_U8;
	/* unsupported tensor type: b.weight type field follows name + n_dims + ne[0] */
	size_t tt = find_bytes(&b, "b.weight") + 8 + 4 + 8;
	b.p[tt] = 5;
	CHECK_EQ_INT(gguf_open_mem(&g, b.p, b.n, err, sizeof err), SH_EUNSUPP);
	CHECK(strstr(err, "unsupported tensor type 5 for b.weight") != NULL);
	b.p[tt] = QT_Q8_0;
	/* tensor data past the end */
	CHECK_EQ_INT(gguf_open_mem(&g, b.p, b.n - 1, err, sizeof err), SH_EFORMAT);
	CHECK(strstr(err, "b.weight data past end of file") != NULL);
	/* string length past the end */
	size_t sl = find_bytes(&b, "hello") - 8;
	b.p[sl + 3] = 1;
	CHECK_EQ_INT(gguf_open_mem(&g, b.p, b.n, err, sizeof err), SH_EFORMAT);
	CHECK(strstr(err, "string length") != NULL);
	free(b.p);
	CHECK_EQ_INT(gguf_open(&g, "/nonexistent/x.gguf", err, sizeof err), SH_EIO);
	CHECK(strstr(err, "/nonexistent/x.gguf") != NULL);
}

TEST(stories260k)
{
	gguf_t *g;
	char err[256];
	if (!harness_stories())
		SKIP("stories260K.gguf not found");
	int rc = gguf_open(&g, harness_stories(), err, sizeof err);
	CHECK_EQ_INT(rc, 0);
	if (rc)
		return;
	const char *s;
	size_t n;
	CHECK_EQ_INT(gguf_get_str(g, "general.architecture", &s, &n), 0);
	CHECK(n == 5 && !memcmp(s, "llama", 5));
	uint32_t v = 0;
	CHECK_EQ_INT(gguf_get_u32(g, "llama.block_count", &v), 0);
	CHECK_EQ_INT(v, 5);
	CHECK_EQ_INT(gguf_get_u32(g, "llama.embedding_length", &v), 0);
	CHECK_EQ_INT(v, 64);
	const gguf_tensor_t *t = gguf_find_tensor(g, "token_embd.weight");
	CHECK(t != NULL);
	if (t) {
		CHECK_EQ_INT(t->ne[0], 64);
		CHECK_EQ_INT(t->ne[1], 512);
		CHECK_EQ_INT(t->type, QT_F32);
	}
	CHECK(gguf_find_tensor(g, "blk.4.ffn_down.weight") != NULL);
	int ti = gguf_find_key(g, "tokenizer.ggml.tokens");
	CHECK_EQ_INT(gguf_arr_n(g, ti), 512);
	gguf_free(g);
}

TEST(meta_stories)
{
	gguf_t *g;
	char err[256];
	if (!harness_stories())
		SKIP("stories260K.gguf not found");
	if (gguf_open(&g, harness_stories(), err, sizeof err))
		SKIP("cannot open stories260K.gguf");
	model_meta_t m;
	int rc = meta_load(&m, g, err, sizeof err);
	CHECK_EQ_INT(rc, 0);
	if (rc)
		fprintf(stderr, "%s\n", err);
	CHECK_EQ_STR(m.arch_name, "llama");
	CHECK_EQ_INT(m.n_layers, 5);
	CHECK_EQ_INT(m.dim, 64);
	CHECK_EQ_INT(m.n_heads, 8);
	CHECK_EQ_INT(m.n_kv_heads, 4);
	CHECK_EQ_INT(m.head_dim, 8);
	CHECK_EQ_INT(m.ffn, 172);
	CHECK_EQ_INT(m.n_vocab, 512);
	CHECK_EQ_INT(m.rope_style, META_ROPE_ADJACENT);
	CHECK_EQ_INT(m.tied_output, gguf_find_tensor(g, "output.weight") == NULL);
	CHECK(m.types_used == 1);
	CHECK(m.weight_bytes > 0 && m.weight_bytes < gguf_file_size(g));
	char ts[64];
	meta_types_str(&m, ts, sizeof ts);
	CHECK_EQ_STR(ts, "F32");
	gguf_free(g);
}

TEST(meta_errors)
{
	struct buf b = build_small(3, 32);
	gguf_t *g;
	char err[256];
	model_meta_t m;
	CHECK_EQ_INT(gguf_open_mem(&g, b.p, b.n, err, sizeof err), 0);
	CHECK_EQ_INT(meta_load(&m, g, err, sizeof err), SH_EFORMAT);
	CHECK(strstr(err, "missing key llama.block_count") != NULL);
	gguf_free(g);
	memcpy(b.p + find_bytes(&b, "llama"), "bloom", 5);
	CHECK_EQ_INT(gguf_open_mem(&g, b.p, b.n, err, sizeof err), 0);
	CHECK_EQ_INT(meta_load(&m, g, err, sizeof err), SH_EUNSUPP);
	CHECK(strstr(err, "unsupported architecture 'bloom'") != NULL);
	gguf_free(g);
	free(b.p);
}

/* xorshift64*: deterministic corruption positions */
static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ull;
}

/* Opens a buffer and, when it parses, loads metadata (and whatever else reads it). */
static void try_buffer(const uint8_t *p, size_t n, int *ok, int *bad)
{
	uint8_t *copy = malloc(n ? n : 1); /* exact size so ASan sees any overread */
	memcpy(copy, p, n);
	gguf_t *g;
	char err[256] = "";
	int rc = gguf_open_mem(&g, copy, n, err, sizeof err);
	if (rc == 0) {
		model_meta_t m;
		tok_t *t;
		if (meta_load(&m, g, err, sizeof err))
			CHECK(err[0] != 0);
		if (tok_load(&t, g, err, sizeof err) == 0) {
			int *ids, n;
			if (tok_encode(t, "Once upon a time", 16, 1, 0, &ids, &n) == 0)
				free(ids);
			tok_free(t);
		}
		(*ok)++;
		gguf_free(g);
	} else {
		CHECK(err[0] != 0);
		CHECK(strchr(err, '\n') == NULL);
		(*bad)++;
	}
	free(copy);
}

TEST(truncate_and_corrupt)
{
	char *data;
	size_t n;
	char err[256];
	if (!harness_stories())
		SKIP("stories260K.gguf not found");
	if (read_file_all(harness_stories(), &data, &n, err, sizeof err))
		SKIP("cannot read stories260K.gguf");
	gguf_t *g;
	CHECK_EQ_INT(gguf_open_mem(&g, data, n, err, sizeof err), 0);
	size_t hdr = (size_t)gguf_data_offset(g);
	gguf_free(g);
	int ok = 0, bad = 0;
	/* every offset through the header, then a stride through the data */
	for (size_t cut = 0; cut < n; cut += cut < hdr + 64 ? 1 : 4099)
		try_buffer((uint8_t *)data, cut, &ok, &bad);
	CHECK(bad > 0);
	uint64_t seed = 0x5eed;
	uint8_t *mut = malloc(n);
	for (int round = 0; round < 3000; round++) {
		memcpy(mut, data, n);
		int flips = 1 + (int)(rng_next(&seed) % 4);
		for (int f = 0; f < flips; f++) {
			/* mostly the header, where structure lives */
			size_t pos = (size_t)(rng_next(&seed) % (round % 4 ? hdr : n));
			mut[pos] = (uint8_t)rng_next(&seed);
		}
		try_buffer(mut, n, &ok, &bad);
	}
	free(mut);
	free(data);
	fprintf(stderr, "robustness: %d parsed, %d rejected\n", ok, bad);
}

int main(void)
{
	RUN(small_all_types);
	RUN(errors_name_the_problem);
	RUN(stories260k);
	RUN(meta_stories);
	RUN(meta_errors);
	RUN(truncate_and_corrupt);
	return harness_done();
}
