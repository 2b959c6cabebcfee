/*
 * modelsync_sidx.c: the slice index (STATE_DIR/models/HEX.slice.idx) and the byte-range algebra
 * the slice fetch works with (modelsync_int.h).
 *
 * Invariant: ms_ranges_norm's output is sorted by (kind, offset) with no two ranges of one kind
 * touching; ms_ranges_sub takes and gives such lists.
 */
#define _GNU_SOURCE
#include "agent/modelstore/modelsync_int.h"
#include "common/common.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void ms_sidx_free(ms_sidx_t *x)
{
	for (int i = 0; i < x->n; i++)
		free(x->b[i].r);
	free(x->b);
	memset(x, 0, sizeof *x);
}

int modelsync_slice_path(const char *state_dir, const uint8_t hash[MS_HASH_BYTES], char *path_out,
			 size_t path_len)
{
	char hex[MS_HASH_HEX];
	int n =
	    snprintf(path_out, path_len, "%s/models/%s.slice", state_dir, modelsync_hex(hex, hash));
	return n > 0 && (size_t)n + 12 < path_len ? 0 : SH_EINVAL;
}

/* Appends a range, joining it to the last one when both are of one kind and touch (in the
 * model, and for compact ranges in the sidecar too). */
int ms_range_add(ms_range_t **r, int *n, ms_range_t a)
{
	ms_range_t *l = *n ? &(*r)[*n - 1] : NULL;
	if (l && l->compact == a.compact && l->off + l->len == a.off &&
	    (!a.compact || l->side + l->len == a.side)) {
		l->len += a.len;
		return 0;
	}
	if ((*n & (*n - 1)) == 0) {
		ms_range_t *nr = realloc(*r, (size_t)(*n ? 2 * *n : 8) * sizeof *nr);
		if (!nr)
			return SH_ENOMEM;
		*r = nr;
	}
	(*r)[(*n)++] = a;
	return 0;
}

static int range_cmp(const void *a, const void *b)
{
	const ms_range_t *x = a, *y = b;
	if (x->compact != y->compact)
		return x->compact - y->compact;
	return x->off < y->off ? -1 : x->off > y->off;
}

/* Sorts r by (kind, offset) and merges overlapping or touching ranges of one kind in place
 * (the sidecar positions are dropped: for sets of bytes held or needed). Returns the count. */
int ms_ranges_norm(ms_range_t *r, int n)
{
	if (!n)
		return 0;
	qsort(r, (size_t)n, sizeof *r, range_cmp);
	int k = 0;
	for (int i = 0; i < n; i++) {
		if (!r[i].len)
			continue;
		r[i].side = 0;
		if (k && r[i].compact == r[k - 1].compact &&
		    r[i].off <= r[k - 1].off + r[k - 1].len) {
			uint64_t end = MAX(r[k - 1].off + r[k - 1].len, r[i].off + r[i].len);
			r[k - 1].len = end - r[k - 1].off;
		} else {
			r[k++] = r[i];
		}
	}
	return k;
}

/* *out = need minus have (both from ms_ranges_norm), kind by kind. */
int ms_ranges_sub(const ms_range_t *need, int nn, const ms_range_t *have, int nh, ms_range_t **out,
		  int *n_out)
{
	*out = NULL;
	*n_out = 0;
	for (int i = 0; i < nn; i++) {
		uint64_t a = need[i].off, end = need[i].off + need[i].len;
		int kind = need[i].compact;
		for (int k = 0; a < end && k < nh; k++) {
			if (have[k].compact != kind || have[k].off + have[k].len <= a)
				continue;
			if (have[k].off >= end)
				break;
			if (have[k].off > a &&
			    ms_range_add(out, n_out, (ms_range_t){a, have[k].off - a, kind, 0}))
				return SH_ENOMEM;
			a = MAX(a, have[k].off + have[k].len);
		}
		if (a < end && ms_range_add(out, n_out, (ms_range_t){a, end - a, kind, 0}))
			return SH_ENOMEM;
	}
	return 0;
}

/* Index: "shoal-slice 1 TOTAL", then one line per batch: "HEX N OFF:LEN ..." (a compact range
 * written OFF:LEN@SIDE). A line that does not parse ends the index (a torn last line from a
 * crash costs one refetch of that batch). */
int ms_sidx_load(const char *path, ms_sidx_t *x)
{
	memset(x, 0, sizeof *x);
	FILE *f = fopen(path, "r");
	if (!f)
		return SH_ENOENT;
	unsigned long long total;
	int ver;
	if (fscanf(f, "shoal-slice %d %llu\n", &ver, &total) != 2 || ver != 1) {
		fclose(f);
		return SH_EFORMAT;
	}
	x->total = total;
	char hex[MS_HASH_HEX];
	int n;
	while (fscanf(f, "%64s %d", hex, &n) == 2 && n > 0 && n < (1 << 24)) {
		ms_sbatch_t b = {.n = 0, .r = NULL};
		int ok = modelsync_unhex(b.hash, hex) == 0;
		for (int i = 0; ok && i < n; i++) {
			unsigned long long o, l, sd = 0;
			int c;
			ok = fscanf(f, " %llu:%llu", &o, &l) == 2 && o + l <= total && l;
			c = ok ? fgetc(f) : EOF;
			if (c == '@')
				ok = fscanf(f, "%llu", &sd) == 1;
			else if (c != EOF)
				ungetc(c, f);
			ok = ok && ms_range_add(&b.r, &b.n, (ms_range_t){o, l, c == '@', sd}) == 0;
		}
		ms_sbatch_t *nb = ok ? realloc(x->b, (size_t)(x->n + 1) * sizeof *nb) : NULL;
		if (!nb) {
			free(b.r);
			break;
		}
		x->b = nb;
		x->b[x->n++] = b;
	}
	fclose(f);
	return 0;
}

static void sidx_write_batch(FILE *f, const ms_sbatch_t *b)
{
	char hex[MS_HASH_HEX];
	fprintf(f, "%s %d", modelsync_hex(hex, b->hash), b->n);
	for (int i = 0; i < b->n; i++) {
		fprintf(f, " %llu:%llu", (unsigned long long)b->r[i].off,
			(unsigned long long)b->r[i].len);
		if (b->r[i].compact)
			fprintf(f, "@%llu", (unsigned long long)b->r[i].side);
	}
	fputc('\n', f);
}

/* Rewrites the index (and the sidecar's map the engine reads) from x, atomically. */
int ms_sidx_store(const char *slice_path, const ms_sidx_t *x, char *err, size_t errlen)
{
	char *a = NULL, *m = NULL, p[SH_SUBPATH_MAX];
	size_t al = 0, ml = 0;
	FILE *fa = open_memstream(&a, &al), *fm = open_memstream(&m, &ml);
	int rc = fa && fm ? 0 : SH_ENOMEM;
	if (!rc) {
		fprintf(fa, "shoal-slice 1 %llu\n", (unsigned long long)x->total);
		for (int i = 0; i < x->n; i++) {
			sidx_write_batch(fa, &x->b[i]);
			for (int k = 0; k < x->b[i].n; k++)
				if (x->b[i].r[k].compact)
					fprintf(fm, "%llu %llu %llu\n",
						(unsigned long long)x->b[i].r[k].off,
						(unsigned long long)x->b[i].r[k].len,
						(unsigned long long)x->b[i].r[k].side);
		}
	}
	if (fa)
		fclose(fa);
	if (fm)
		fclose(fm);
	if (!rc) {
		snprintf(p, sizeof p, "%s.cols.map", slice_path);
		rc = write_file_atomic(p, m, ml, err, errlen);
	}
	if (!rc) { /* the index last: it never names bytes the map does not */
		snprintf(p, sizeof p, "%s.idx", slice_path);
		rc = write_file_atomic(p, a, al, err, errlen);
	}
	free(a);
	free(m);
	return rc ? sh_fail(err, errlen, rc, "writing the slice index") : 0;
}

/* All ranges the index holds, normalised (ms_ranges_norm). */
int ms_sidx_held(const ms_sidx_t *x, ms_range_t **out, int *n_out)
{
	*out = NULL;
	*n_out = 0;
	for (int i = 0; i < x->n; i++)
		for (int k = 0; k < x->b[i].n; k++)
			if (ms_range_add(out, n_out, x->b[i].r[k]))
				return SH_ENOMEM;
	*n_out = ms_ranges_norm(*out, *n_out);
	return 0;
}

/* One fetch of missing bytes: a REQ/INFO exchange made once (lazily), then GETs. */