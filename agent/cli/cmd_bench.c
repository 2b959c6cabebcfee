/* cmd_bench.c: `shoal bench`: speed figures of the forward pass on one model, without the
 * tokenizer (random token ids): prefill tok/s for a prompt, decode tok/s (greedy), the bytes one
 * decoded token reads (weights, and the KV cache up to its position) and the resulting GB/s,
 * and the peak resident memory. One
 * key=value line per run so scripts can pick the numbers. `shoal bench --membw` instead measures
 * this machine's streaming read bandwidth with the pool's threads (the bound decode is held
 * against: every weight byte is read once per token). `--bound` measures that bandwidth between
 * the decode steps of the run itself: on a shared host it moves by 2x within minutes, so only a
 * figure from the same seconds says how close decode came to it. */
#include "agent/cli/cli.h"
#include "common/common.h"
#include "infer/gguf.h"
#include "infer/model/meta.h"
#include "infer/model/model.h"
#include "infer/pool.h"
#include "infer/quant/quant.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

static void usage(FILE *f)
{
	fprintf(f, "usage: shoal bench --model FILE.gguf [--threads N] [--prompt N] [--gen N]\n"
		   "                   [--kv-type f16|f32|q8_0] [--bound]\n"
		   "       shoal bench --membw [--threads N]   (streaming read GB/s)\n"
		   "Prints: prefill and decode tokens/s, weight bytes per decoded token, GB/s and\n"
		   "peak RSS for one run (defaults: all cores, 128-token prompt, 64 tokens).\n"
		   "--bound also streams 256 MiB between decode steps and prints that bandwidth\n"
		   "(bound_gb_s) and decode's fraction of it (of_bound).\n");
}

/* CPU seconds used by the process so far (all threads): on a shared machine, wall time / CPU
 * time shows how much of a run was lost to other processes. */
static double cpu_s(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
	       ru.ru_stime.tv_usec / 1e6;
}

/* ---- streaming read bandwidth ------------------------------------------------------------ */

typedef struct bw_job {
	const uint64_t *buf;
	size_t n;         /* words */
	uint64_t sum[64]; /* per chunk, so the reads cannot be optimized away */
} bw_job_t;

/* Each chunk sums its contiguous share in four vector lanes, 4 vectors per step, so the loop is
 * bound by memory, not by the adds. The vectors must be as wide as the widest loads the kernels
 * use: with 16-byte loads one core measured ~30 GB/s where its 64-byte loads (and the decode
 * kernels) read ~37, so the bound would have been below what decode achieves. */
#define BW_SUM(name, bytes_per_vec, attr)                                                          \
	typedef uint64_t name##_v __attribute__((vector_size(bytes_per_vec)));                     \
	attr static uint64_t name(const uint64_t *buf, size_t words)                               \
	{                                                                                          \
		const name##_v *p = (const name##_v *)buf;                                         \
		name##_v s0 = {0}, s1 = s0, s2 = s0, s3 = s0;                                      \
		size_t nv = words / (bytes_per_vec / 8);                                           \
		for (size_t i = 0; i + 4 <= nv; i += 4) {                                          \
			s0 += p[i];                                                                \
			s1 += p[i + 1];                                                            \
			s2 += p[i + 2];                                                            \
			s3 += p[i + 3];                                                            \
		}                                                                                  \
		name##_v s = s0 + s1 + s2 + s3;                                                    \
		uint64_t t = 0;                                                                    \
		for (int k = 0; k < bytes_per_vec / 8; k++)                                        \
			t += s[k];                                                                 \
		return t;                                                                          \
	}
BW_SUM(bw_sum16, 16, ) /* SSE2 / NEON without target flags */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
BW_SUM(bw_sum32, 32, __attribute__((target("avx2"))))
BW_SUM(bw_sum64, 64, __attribute__((target("avx512f"))))
#endif

static void bw_task(void *ctx, int c, int nc, int tid)
{
	bw_job_t *j = ctx;
	size_t lo = j->n / (size_t)nc * (size_t)c, hi = c == nc - 1 ? j->n : lo + j->n / (size_t)nc;
	lo &= ~(size_t)31; /* 256-byte steps from a 64-byte aligned start */
	(void)tid;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
	if (__builtin_cpu_supports("avx512f")) {
		j->sum[c] = bw_sum64(j->buf + lo, hi - lo);
		return;
	}
	if (__builtin_cpu_supports("avx2")) {
		j->sum[c] = bw_sum32(j->buf + lo, hi - lo);
		return;
	}
#endif
	j->sum[c] = bw_sum16(j->buf + lo, hi - lo);
}

/* The streaming buffer: 256 MiB (8x the largest L3 here), in huge pages as the engine's
 * repacked weights are (matmul.c rp_alloc), every page faulted in first. */
#define BW_BYTES ((size_t)256 << 20)

static uint64_t *bw_buf_new(void)
{
	uint64_t *buf = aligned_alloc((size_t)2 << 20, BW_BYTES);
	if (!buf)
		return NULL;
#ifdef MADV_HUGEPAGE
	madvise(buf, BW_BYTES, MADV_HUGEPAGE);
#endif
	memset(buf, 1, BW_BYTES);
	return buf;
}

/* One pass over the buffer, one contiguous share per pool thread; returns its seconds. */
static double bw_pass(pool_t *pool, bw_job_t *j)
{
	int64_t t0 = now_ns();
	pool_run(pool, bw_task, j, pool_threads(pool));
	return (double)(now_ns() - t0) / 1e9;
}

/* Best of 40 passes: a pass takes ~10 ms, so on a shared machine some passes still run
 * undisturbed. */
static int membw(int threads)
{
	pool_t *pool = pool_new(threads);
	uint64_t *buf = bw_buf_new();
	if (!pool || !buf) {
		fprintf(stderr, "shoal bench: out of memory\n");
		pool_free(pool);
		free(buf);
		return 1;
	}
	bw_job_t j = {.buf = buf, .n = BW_BYTES / 8};
	double best = 0;
	for (int pass = 0; pass < 40; pass++)
		best = MAX(best, (double)BW_BYTES / bw_pass(pool, &j));
	uint64_t chk = 0;
	for (int i = 0; i < pool_threads(pool); i++)
		chk += j.sum[i];
	printf("membw threads=%d read_gb_s=%.1f check=%llu\n", pool_threads(pool), best / 1e9,
	       (unsigned long long)(chk & 1));
	pool_free(pool);
	free(buf);
	return 0;
}

int cmd_bench(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"model", required_argument, 0, 'm'},
	    {"threads", required_argument, 0, 't'},
	    {"prompt", required_argument, 0, 'p'},
	    {"gen", required_argument, 0, 'g'},
	    {"help", no_argument, 0, 'h'},
	    {"kv-type", required_argument, 0, 'k'},
	    {"membw", no_argument, 0, 'B'},
	    {"bound", no_argument, 0, 'b'},
	    {0, 0, 0, 0},
	};
	const char *path = NULL, *kv_name = "f16";
	int threads = 0, n_prompt = 128, n_gen = 64, c, bw = 0, bound = 0;
	optind = 1;
	while ((c = getopt_long(argc, argv, "m:t:h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': path = optarg; break;
		case 't':
		case 'p':
		case 'g':
			/* strict: "foo" is an error, not 0 */
			if (cli_parse_int(optarg, c == 't' ? 0 : 1, 1 << 20,
					  c == 't'   ? &threads
					  : c == 'p' ? &n_prompt
						     : &n_gen)) {
				fprintf(stderr, "shoal bench: bad --%s '%s'\n",
					c == 't'   ? "threads"
					: c == 'p' ? "prompt"
						   : "gen",
					optarg);
				return 2;
			}
			break;
		case 'k': kv_name = optarg; break;
		case 'B': bw = 1; break;
		case 'b': bound = 1; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (bw && optind == argc && threads >= 0)
		return membw(threads);
	if (!path || optind != argc || threads < 0 || n_prompt < 1 || n_gen < 1) {
		usage(stderr);
		return 2;
	}
	char err[256];
	gguf_t *g = NULL;
	model_meta_t meta;
	model_t *m = NULL;
	pool_t *pool = NULL;
	float *logits = NULL;
	int *toks = NULL, rc = 1;
	uint64_t *bwbuf = NULL;
	const char *impl = quant_init(0);
	if (gguf_open(&g, path, err, sizeof err) || meta_load(&meta, g, err, sizeof err)) {
		fprintf(stderr, "shoal bench: %s: %s\n", path, err);
		goto out;
	}
	pool = pool_new(threads);
	int ctx = n_prompt + n_gen + 1;
	int kv_type = quant_type_parse(kv_name);
	if (!pool || model_new_kv(&m, g, &meta, NULL, ctx, kv_type, pool, err, sizeof err)) {
		fprintf(stderr, "shoal bench: %s\n", pool ? err : "cannot start threads");
		goto out;
	}
	logits = malloc((size_t)meta.n_vocab * sizeof *logits);
	toks = malloc((size_t)n_prompt * sizeof *toks);
	if (!logits || !toks)
		goto out;
	bw_job_t bj = {.n = BW_BYTES / 8};
	struct rusage ru;
	double bw_s = 0, bw_best = 0; /* --bound: the passes between decode steps */
	uint64_t s = 12345;
	for (int i = 0; i < n_prompt; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		toks[i] = (int)((s >> 33) % (uint64_t)meta.n_vocab);
	}
	/* a short warm-up maps the weights in, so the figures are not page-fault bound */
	int w = toks[0];
	if (model_forward(m, &w, 1, 0, logits))
		goto out;
	double c0 = cpu_s();
	int64_t t0 = now_ns();
	if (model_forward(m, toks, n_prompt, 0, logits))
		goto out;
	int64_t t1 = now_ns();
	double c1 = cpu_s();
	int pos = n_prompt;
	double dec_s = 0, c2 = c1;
	for (int i = 0; i < n_gen; i++) {
		int t = sh_argmax(logits, meta.n_vocab);
		int64_t s0 = now_ns();
		double cs0 = cpu_s();
		if (model_forward(m, &t, 1, pos++, logits))
			goto out;
		dec_s += (double)(now_ns() - s0) / 1e9;
		c2 += cpu_s() - cs0;
		if (bound && !bwbuf) { /* the peak RSS is the engine's, taken before the buffer */
			getrusage(RUSAGE_SELF, &ru);
			if (!(bj.buf = bwbuf = bw_buf_new()))
				goto out;
		}
		if (bound) { /* the bandwidth of these very seconds, not of a minute before */
			double p = bw_pass(pool, &bj);
			bw_s += p;
			bw_best = MAX(bw_best, (double)BW_BYTES / p);
		}
	}
	double pre_s = (double)(t1 - t0) / 1e9;
	/* a decode step reads every weight once and the cache up to its position: step i sees
	 * n_prompt + i + 1 positions, n_prompt + (n_gen + 1) / 2 on average */
	uint64_t kvpt = 0; /* (sliding-window layers read at most their window) */
	for (int i = 0; i < n_gen; i++)
		kvpt += model_kv_read_bytes(&meta, NULL, kv_type, n_prompt + i) / (uint64_t)n_gen;
	uint64_t bpt = model_bytes_per_token(m) + kvpt;
	if (!bound)
		getrusage(RUSAGE_SELF, &ru);
	char types[64];
	meta_types_str(&meta, types, sizeof types);
	printf(
	    "model=%s types=\"%s\" kernels=%s kv=%s threads=%d prompt=%d prefill_tok_s=%.1f gen=%d "
	    "decode_tok_s=%.2f bytes_per_token=%llu kv_bytes_per_token=%llu decode_gb_s=%.1f "
	    "peak_rss_mb=%.0f file_mb=%.0f prefill_cpu_s=%.2f prefill_wall_s=%.2f "
	    "decode_cpu_s=%.2f decode_wall_s=%.2f",
	    path, types, impl, quant_type_name(kv_type), pool_threads(pool), n_prompt,
	    n_prompt / pre_s, n_gen, n_gen / dec_s, (unsigned long long)bpt,
	    (unsigned long long)kvpt, (double)bpt * n_gen / dec_s / 1e9,
	    (double)ru.ru_maxrss / 1024.0, (double)gguf_file_size(g) / 1048576.0, c1 - c0, pre_s,
	    c2 - c1, dec_s);
	if (bound) {
		double b = (double)BW_BYTES * n_gen / bw_s;
		printf(" bound_gb_s=%.1f bound_best_gb_s=%.1f of_bound=%.3f", b / 1e9,
		       bw_best / 1e9, (double)bpt * n_gen / dec_s / b);
	}
	printf("\n");
	rc = 0;
out:
	free(logits);
	free(toks);
	free(bwbuf);
	model_free(m);
	pool_free(pool);
	gguf_free(g);
	return rc;
}
