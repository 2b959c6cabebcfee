/* test_slices.c: a node that holds only its slice of a model file. eng_shard_ranges must name
 * every byte a shard reads (a copy holding only those bytes computes bit-identical logits) and
 * no more than its share. */
#include "common/common.h"
#include "harness.h"
#include "infer/gguf_write.h"
#include "infer/infer.h"
#include "infer/model/meta.h"
#include "infer/model/model.h"
#include "infer/quant/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gen_model.h"

static const int prompt24[24] = {300, 10,  47,  299, 256, 100, 101, 102, 32, 33, 34, 35,
				 400, 401, 402, 403, 270, 271, 272, 273, 5,  6,  7,  8};

/* ---- a node that holds only its slice of the file ---------------------------------------- */

/* Copies the dense ranges of src into a new sparse file dst of the same size (holes elsewhere)
 * and the compact ones into the sidecar dst.cols, listed in dst.cols.map (gguf.h). */
static int copy_ranges(const char *src, const char *dst, const eng_range_t *r, int n)
{
	char sp[400], mp[400];
	snprintf(sp, sizeof sp, "%s.cols", dst);
	snprintf(mp, sizeof mp, "%s.cols.map", dst);
	FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb"), *side = fopen(sp, "wb");
	FILE *map = fopen(mp, "w");
	int rc = in && out && side && map ? 0 : -1;
	if (!rc) {
		fseek(in, 0, SEEK_END);
		rc = ftruncate(fileno(out), ftell(in));
	}
	char buf[1 << 16];
	long side_at = 0;
	for (int i = 0; !rc && i < n; i++) {
		FILE *o = r[i].compact ? side : out;
		if (r[i].compact)
			fprintf(map, "%llu %llu %ld\n", (unsigned long long)r[i].off,
				(unsigned long long)r[i].len, side_at);
		for (uint64_t done = 0; !rc && done < r[i].len;) {
			size_t k = (size_t)MIN((uint64_t)sizeof buf, r[i].len - done);
			rc = fseek(in, (long)(r[i].off + done), SEEK_SET) ||
			     fread(buf, 1, k, in) != k ||
			     (!r[i].compact && fseek(out, (long)(r[i].off + done), SEEK_SET)) ||
			     fwrite(buf, 1, k, o) != k;
			done += k;
		}
		if (r[i].compact)
			side_at += (long)r[i].len;
	}
	FILE *fs[] = {in, out, side, map};
	for (int i = 0; i < 4; i++)
		if (fs[i] && fclose(fs[i]))
			rc = -1;
	return rc;
}

/* A copy of path holding only the ranges rank 0 of share d reads (zeros elsewhere; column
 * slices' pieces in the sidecar, read through gguf_copy) computes bit-identical logits for shard
 * sh, and those ranges are under max_bytes. Removes the copy. 1 when all holds. */
static int slice_same_logits(const char *path, const gguf_t *g, const model_meta_t *meta,
			     const eng_dist_t *d, const model_shard_t *sh, uint64_t max_bytes)
{
	char slice[300], err[256];
	eng_range_t *r = NULL;
	int n = 0, ok = 1;
	gguf_t *g2 = NULL;
	pool_t *pool = pool_new(1);
	if (eng_shard_ranges(path, d, 0, &r, &n, err, sizeof err)) {
		fprintf(stderr, "ranges: %s\n", err);
		pool_free(pool);
		return 0;
	}
	uint64_t bytes = 0;
	for (int i = 0; i < n; i++)
		bytes += r[i].len;
	ok &= bytes < max_bytes;
	snprintf(slice, sizeof slice, "%s.slice", path);
	ok &= copy_ranges(path, slice, r, n) == 0;
	model_t *m1 = NULL, *m2 = NULL;
	ok &= gguf_open(&g2, slice, err, sizeof err) == 0;
	ok &= model_new(&m1, g, meta, sh, 64, pool, err, sizeof err) == 0;
	ok &= g2 && model_new(&m2, g2, meta, sh, 64, pool, err, sizeof err) == 0;
	int nv = meta->n_vocab;
	float *l1 = calloc((size_t)nv, sizeof *l1), *l2 = calloc((size_t)nv, sizeof *l2);
	if (ok && m1 && m2) {
		ok &= model_forward(m1, prompt24, 24, 0, l1) == 0;
		ok &= model_forward(m2, prompt24, 24, 0, l2) == 0;
		ok &= memcmp(l1, l2, (size_t)nv * sizeof *l1) == 0;
	}
	free(l1);
	free(l2);
	model_free(m1);
	model_free(m2);
	gguf_free(g2);
	pool_free(pool);
	unlink(slice);
	char side[320];
	snprintf(side, sizeof side, "%s.cols", slice);
	unlink(side);
	snprintf(side, sizeof side, "%s.cols.map", slice);
	unlink(side);
	free(r);
	return ok;
}

/* eng_shard_ranges names every byte a shard reads: the same shard bound to a copy that holds
 * only those bytes (zeros elsewhere; the column slices' pieces in the sidecar, read through
 * gguf_copy) computes bit-identical logits, and the ranges of one of two
 * shares are well under the whole file. */
TEST(shard_ranges_cover_what_a_shard_reads)
{
	/* deepseek2: the latent (one KV head) replicated, its per-head matrices split */
	static const model_shard_t sh[3] = {{0, 4, 0, 1, 0, 256, 0, 2, 0, 0, 0, 0},
					    {4, 4, 1, 1, 256, 256, 0, 2, 0, 0, 0, 0},
					    {4, 4, 0, 1, 256, 256, 0, 2, 0, 0, 0, 0}};
	static const char *const arch[3] = {"llama", "qwen2", "deepseek2"};
	for (int s = 0; s < 3; s++) {
		char slice[300], err[256];
		gen_t a;
		if (gen_open(&a, arch[s], QT_Q8_0, 1)) {
			gen_close(&a);
			CHECK(0);
			return;
		}
		eng_dist_t d = {.has_ranges = 1,
				.q0 = sh[s].q_head0,
				.q1 = sh[s].q_head0 + sh[s].n_q_heads,
				.kv0 = sh[s].kv_head0,
				.kv1 = sh[s].kv_head0 + sh[s].n_kv_heads,
				.ffn0 = sh[s].ffn0,
				.ffn1 = sh[s].ffn0 + sh[s].n_ffn,
				.layer0 = 0,
				.layer1 = 2};
		eng_range_t *r = NULL;
		int n = 0;
		CHECK_EQ_INT(eng_shard_ranges(a.path, &d, 0, &r, &n, err, sizeof err), 0);
		uint64_t bytes = 0, size = 0;
		for (int i = 0; i < n; i++) {
			bytes += r[i].len;
			CHECK(i == 0 || r[i].compact > r[i - 1].compact ||
			      r[i].off > r[i - 1].off + r[i - 1].len); /* sorted, merged per kind */
		}
		FILE *f = fopen(a.path, "rb");
		if (f) {
			fseek(f, 0, SEEK_END);
			size = (uint64_t)ftell(f);
			fclose(f);
		}
		/* half the layers' matrices, the whole embedding and head (vocab 512 x 256) */
		fprintf(stderr, "shard %d: %d ranges, %llu of %llu bytes\n", s, n,
			(unsigned long long)bytes, (unsigned long long)size);
		CHECK(bytes < size * 3 / 4);
		snprintf(slice, sizeof slice, "%s.slice", a.path);
		CHECK_EQ_INT(copy_ranges(a.path, slice, r, n), 0);
		gguf_t *g2 = NULL;
		model_t *m1 = NULL, *m2 = NULL;
		CHECK_EQ_INT(gguf_open(&g2, slice, err, sizeof err), 0);
		CHECK_EQ_INT(model_new(&m1, a.g, &a.meta, &sh[s], 64, a.pool, err, sizeof err), 0);
		CHECK_EQ_INT(model_new(&m2, g2, &a.meta, &sh[s], 64, a.pool, err, sizeof err), 0);
		int nv = a.meta.n_vocab;
		float *l1 = calloc((size_t)nv, sizeof *l1), *l2 = calloc((size_t)nv, sizeof *l2);
		if (m1 && m2) {
			CHECK_EQ_INT(model_forward(m1, prompt24, 24, 0, l1), 0);
			CHECK_EQ_INT(model_forward(m2, prompt24, 24, 0, l2), 0);
			CHECK(memcmp(l1, l2, (size_t)nv * sizeof *l1) == 0);
		}
		free(l1);
		free(l2);
		model_free(m1);
		model_free(m2);
		gguf_free(g2);
		char side[400];
		snprintf(side, sizeof side, "%s.cols", slice);
		unlink(side);
		snprintf(side, sizeof side, "%s.cols.map", slice);
		unlink(side);
		unlink(slice);
		free(r);
		gen_close(&a);
	}
}

/* Mixture of experts: a rank's slice holds the routers, its whole experts and its columns of
 * the shared expert; bound to that slice it computes the same logits (the router picks experts
 * held elsewhere too: those are never read here). */
TEST(moe_shard_ranges)
{
	char path[256];
	snprintf(path, sizeof path, "/tmp/shoal-test-slices-%d-moe.gguf", (int)getpid());
	mkmodel_opts_t o = {.arch = "qwen2moe",
			    .dim = 256,
			    .layers = 2,
			    .heads = 8,
			    .kv_heads = 2,
			    .ffn = 256,
			    .vocab = 512,
			    .ctx = 256,
			    .type = QT_Q8_0,
			    .seed = 7,
			    .experts = 8,
			    .experts_used = 2,
			    .expert_ffn = 128};
	gguf_t *g = NULL;
	model_meta_t meta;
	if (gen_file(&o, path, &g, &meta, "moe model")) {
		CHECK(0);
		return;
	}
	eng_dist_t d = {.has_ranges = 1,
			.q0 = 4,
			.q1 = 8,
			.kv0 = 1,
			.kv1 = 2,
			.ffn0 = 128,
			.ffn1 = 256,
			.layer0 = 0,
			.layer1 = 2,
			.exp0 = 5,
			.exp1 = 8,
			.shx0 = 64,
			.shx1 = 128};
	model_shard_t sh = {4, 4, 1, 1, 128, 128, 0, 2, 5, 3, 64, 64};
	CHECK(slice_same_logits(path, g, &meta, &d, &sh,
				/* 3 of 8 experts: well under half the expert bytes plus the rest */
				meta.weight_bytes - meta.expert_bytes / 2));
	gguf_free(g);
	unlink(path);
}

/* qwen35moe: the second of two tensor shares holds DeltaNet key head 1 of 2 and its value
 * heads 1 and 3 (runs of attn_qkv / attn_gate / ssm_beta / ssm_alpha rows, two column slices of
 * ssm_out), the conv kernel whole; a copy with only its ranges (and the head, as rank 0)
 * computes the same logits. */
TEST(qwen35_shard_ranges)
{
	char path[256];
	snprintf(path, sizeof path, "/tmp/shoal-test-slices-%d-q35.gguf", (int)getpid());
	mkmodel_opts_t o = {.arch = "qwen35moe",
			    .dim = 128,
			    .layers = 4,
			    .heads = 4,
			    .kv_heads = 2,
			    .head_dim = 32,
			    .ffn = 256,
			    .vocab = 512,
			    .ctx = 256,
			    .type = QT_Q8_0,
			    .seed = 8,
			    .experts = 4,
			    .experts_used = 2,
			    .expert_ffn = 64,
			    .ssm_state = 32,
			    .ssm_k_heads = 2,
			    .ssm_v_heads = 4};
	gguf_t *g = NULL;
	model_meta_t meta;
	if (gen_file(&o, path, &g, &meta, "qwen35 model")) {
		CHECK(0);
		return;
	}
	eng_dist_t d = {.has_ranges = 1,
			.q0 = 2,
			.q1 = 4,
			.kv0 = 1,
			.kv1 = 2,
			.ffn0 = 64,
			.ffn1 = 128,
			.layer0 = 0,
			.layer1 = 4,
			.exp0 = 2,
			.exp1 = 4,
			.shx0 = 32,
			.shx1 = 64};
	model_shard_t sh = {2, 2, 1, 1, 64, 64, 0, 4, 2, 2, 32, 32};
	CHECK(slice_same_logits(path, g, &meta, &d, &sh, meta.weight_bytes * 3 / 4));
	gguf_free(g);
	unlink(path);
}

int main(void)
{
	quant_init(0);
	RUN(shard_ranges_cover_what_a_shard_reads);
	RUN(moe_shard_ranges);
	RUN(qwen35_shard_ranges);
	return harness_done();
}
