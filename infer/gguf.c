/*
 * gguf.c: the GGUF reader. One pass over the header validates everything: each read goes through
 * a cursor that checks the bytes are there before touching them, every count is bounded by the
 * bytes left (so a corrupt count cannot trigger a huge allocation), and size arithmetic is done
 * with overflow checks. Invariant after gguf_open(): every offset stored in the gguf_t (values,
 * string elements, tensor data) lies inside [0, size) together with its length, so accessors
 * need no further bounds checks against the file.
 *
 * The host is assumed little-endian (x86-64, arm64), as GGUF itself is.
 */
#include "infer/gguf.h"
#include "infer/quant/quant.h"

#include "common/common.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC       0x46554747u /* "GGUF" little-endian */
#define GGUF_MAX_NESTING 8

struct gguf_kv {
	char *key;
	int type;          /* enum gguf_vtype */
	uint64_t off;      /* value start (for arrays: first element) */
	int arr_type;      /* arrays only */
	uint64_t n;        /* arrays only: element count */
	uint64_t *str_off; /* string arrays only: offset of each element's u64 length */
};

struct gguf {
	const uint8_t *base;
	size_t size;
	int mapped;
	int header_only;     /* parse() stops after the tensor table (gguf_header_bytes) */
	const uint8_t *side; /* the sidecar PATH.cols, mapped (NULL: none) */
	size_t side_size;
	struct gguf_ovl {
		uint64_t off, len, side;
	} * ovl; /* sorted by off */
	int n_ovl;
	uint32_t version;
	uint32_t alignment;
	uint64_t data_off;
	uint64_t tensor_bytes;
	int n_kv;
	struct gguf_kv *kv;
	int n_tensors;
	gguf_tensor_t *tensors;
	int *kv_hash, *t_hash; /* open addressing, -1 = empty; sizes are powers of two */
	size_t kv_hash_n, t_hash_n;
};

/* ---- bounded cursor ---- */

struct cur {
	const uint8_t *p;
	size_t size, pos;
	char *err;
	size_t errlen;
	const char *what; /* what is being read, for messages */
};

static int cur_need(struct cur *c, uint64_t n)
{
	if (n > c->size - c->pos)
		return sh_fail(c->err, c->errlen, SH_EFORMAT, "truncated file: %s past end of file",
			       c->what);
	return 0;
}

static int cur_u32(struct cur *c, uint32_t *v)
{
	if (cur_need(c, 4))
		return SH_EFORMAT;
	memcpy(v, c->p + c->pos, 4);
	c->pos += 4;
	return 0;
}

static int cur_u64(struct cur *c, uint64_t *v)
{
	if (cur_need(c, 8))
		return SH_EFORMAT;
	memcpy(v, c->p + c->pos, 8);
	c->pos += 8;
	return 0;
}

/* Reads a string header and skips its bytes; *off = offset of the first byte. */
static int cur_str(struct cur *c, uint64_t *off, uint64_t *len)
{
	if (cur_u64(c, len))
		return SH_EFORMAT;
	if (*len > c->size - c->pos)
		return sh_fail(c->err, c->errlen, SH_EFORMAT,
			       "string length %llu past end of file (%s)", (unsigned long long)*len,
			       c->what);
	*off = c->pos;
	c->pos += *len;
	return 0;
}

int gguf_vtype_size(int t)
{
	switch (t) {
	case GGUF_U8:
	case GGUF_I8:
	case GGUF_BOOL: return 1;
	case GGUF_U16:
	case GGUF_I16: return 2;
	case GGUF_U32:
	case GGUF_I32:
	case GGUF_F32: return 4;
	case GGUF_U64:
	case GGUF_I64:
	case GGUF_F64: return 8;
	}
	return 0;
}

/* Skips one value of type t (validating nested arrays); depth bounds recursion. */
static int skip_value(struct cur *c, uint32_t t, int depth)
{
	if (t == GGUF_STR) {
		uint64_t off, len;
		return cur_str(c, &off, &len);
	}
	if (t == GGUF_ARR) {
		uint32_t et;
		uint64_t n;
		if (depth >= GGUF_MAX_NESTING)
			return sh_fail(c->err, c->errlen, SH_EFORMAT, "arrays nested too deep (%s)",
				       c->what);
		if (cur_u32(c, &et) || cur_u64(c, &n))
			return SH_EFORMAT;
		if (et >= GGUF_NVTYPES)
			return sh_fail(c->err, c->errlen, SH_EFORMAT,
				       "unknown value type %u in array (%s)", et, c->what);
		if (gguf_vtype_size((int)et)) {
			uint64_t sz = (uint64_t)gguf_vtype_size((int)et);
			if (n > (c->size - c->pos) / sz)
				return sh_fail(c->err, c->errlen, SH_EFORMAT,
					       "array of %llu elements past end of file (%s)",
					       (unsigned long long)n, c->what);
			c->pos += n * sz;
			return 0;
		}
		/* strings and arrays take at least 8 bytes each: bound n before looping */
		if (n > (c->size - c->pos) / 8)
			return sh_fail(c->err, c->errlen, SH_EFORMAT,
				       "array of %llu elements past end of file (%s)",
				       (unsigned long long)n, c->what);
		for (uint64_t i = 0; i < n; i++)
			if (skip_value(c, et, depth + 1))
				return SH_EFORMAT;
		return 0;
	}
	int sz = gguf_vtype_size((int)t);
	if (!sz)
		return sh_fail(c->err, c->errlen, SH_EFORMAT, "unknown value type %u (%s)", t,
			       c->what);
	if (cur_need(c, (uint64_t)sz))
		return SH_EFORMAT;
	c->pos += (size_t)sz;
	return 0;
}

/* ---- hashing ---- */

static uint64_t hash_str(const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
	return h;
}

static int *hash_new(int n, size_t *cap)
{
	size_t c = 16;
	while (c < (size_t)n * 2)
		c <<= 1;
	int *h = malloc(c * sizeof *h);
	if (h)
		memset(h, 0xff, c * sizeof *h);
	*cap = c;
	return h;
}

/* ---- open ---- */

static int parse_kv(gguf_t *g, struct cur *c)
{
	uint64_t n_kv;
	c->what = "key/value count";
	if (cur_u64(c, &n_kv))
		return SH_EFORMAT;
	/* a key/value takes at least 8 (key length) + 4 (type) + 1 bytes */
	if (n_kv > (c->size - c->pos) / 13 || n_kv > INT_MAX / 2)
		return sh_fail(c->err, c->errlen, SH_EFORMAT,
			       "key/value count %llu past end of file", (unsigned long long)n_kv);
	g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
	g->kv_hash = hash_new((int)n_kv, &g->kv_hash_n);
	if (!g->kv || !g->kv_hash)
		return sh_fail(c->err, c->errlen, SH_ENOMEM, "out of memory reading key/values");
	for (uint64_t i = 0; i < n_kv; i++) {
		struct gguf_kv *kv = &g->kv[i];
		uint64_t koff, klen;
		uint32_t t;
		c->what = "key";
		if (cur_str(c, &koff, &klen))
			return SH_EFORMAT;
		if (klen > 65535 || memchr(c->p + koff, 0, klen))
			return sh_fail(c->err, c->errlen, SH_EFORMAT,
				       "key %llu is not a valid name", (unsigned long long)i);
		kv->key = malloc(klen + 1);
		if (!kv->key)
			return sh_fail(c->err, c->errlen, SH_ENOMEM, "out of memory");
		memcpy(kv->key, c->p + koff, klen);
		kv->key[klen] = 0;
		g->n_kv = (int)i + 1;
		c->what = kv->key;
		if (cur_u32(c, &t))
			return SH_EFORMAT;
		if (t >= GGUF_NVTYPES)
			return sh_fail(c->err, c->errlen, SH_EFORMAT,
				       "unknown value type %u for key %s", t, kv->key);
		kv->type = (int)t;
		if (t == GGUF_ARR) {
			uint32_t et;
			size_t start = c->pos;
			if (cur_u32(c, &et) || cur_u64(c, &kv->n))
				return SH_EFORMAT;
			kv->arr_type = (int)et;
			kv->off = c->pos;
			if (et == GGUF_STR && kv->n <= (c->size - c->pos) / 8) {
				kv->str_off = malloc((kv->n ? kv->n : 1) * sizeof(uint64_t));
				if (!kv->str_off)
					return sh_fail(c->err, c->errlen, SH_ENOMEM,
						       "out of memory");
				for (uint64_t j = 0; j < kv->n; j++) {
					uint64_t so, sl;
					kv->str_off[j] = c->pos;
					if (cur_str(c, &so, &sl))
						return SH_EFORMAT;
				}
			} else {
				c->pos = start;
				if (skip_value(c, t, 0))
					return SH_EFORMAT;
			}
		} else {
			kv->off = c->pos;
			if (skip_value(c, t, 0))
				return SH_EFORMAT;
		}
		/* insert, rejecting duplicates */
		size_t m = g->kv_hash_n - 1, h = hash_str(kv->key, klen) & m;
		while (g->kv_hash[h] >= 0) {
			if (!strcmp(g->kv[g->kv_hash[h]].key, kv->key))
				return sh_fail(c->err, c->errlen, SH_EFORMAT, "duplicate key %s",
					       kv->key);
			h = (h + 1) & m;
		}
		g->kv_hash[h] = (int)i;
	}
	return 0;
}

static int parse_tensors(gguf_t *g, struct cur *c, uint64_t n_t)
{
	g->tensors = calloc(n_t ? n_t : 1, sizeof *g->tensors);
	g->t_hash = hash_new((int)n_t, &g->t_hash_n);
	if (!g->tensors || !g->t_hash)
		return sh_fail(c->err, c->errlen, SH_ENOMEM, "out of memory reading tensor infos");
	for (uint64_t i = 0; i < n_t; i++) {
		gguf_tensor_t *t = &g->tensors[i];
		uint64_t noff, nlen;
		uint32_t nd, ty;
		c->what = "tensor name";
		if (cur_str(c, &noff, &nlen))
			return SH_EFORMAT;
		if (nlen > 4096 || memchr(c->p + noff, 0, nlen))
			return sh_fail(c->err, c->errlen, SH_EFORMAT, "tensor %llu has a bad name",
				       (unsigned long long)i);
		char *name = malloc(nlen + 1);
		if (!name)
			return sh_fail(c->err, c->errlen, SH_ENOMEM, "out of memory");
		memcpy(name, c->p + noff, nlen);
		name[nlen] = 0;
		t->name = name;
		g->n_tensors = (int)i + 1;
		c->what = name;
		if (cur_u32(c, &nd))
			return SH_EFORMAT;
		if (nd > GGUF_MAX_DIMS)
			return sh_fail(c->err, c->errlen, SH_EFORMAT, "tensor %s has %u dimensions",
				       name, nd);
		t->n_dims = (int)nd;
		int64_t nel = 1;
		for (int d = 0; d < GGUF_MAX_DIMS; d++) {
			uint64_t v = 1;
			if ((uint32_t)d < nd && cur_u64(c, &v))
				return SH_EFORMAT;
			if (v > INT64_MAX || (v && (uint64_t)nel > (uint64_t)INT64_MAX / v))
				return sh_fail(c->err, c->errlen, SH_EFORMAT,
					       "tensor %s has an impossible shape", name);
			t->ne[d] = (int64_t)v;
			nel *= (int64_t)v;
		}
		if (cur_u32(c, &ty) || cur_u64(c, &t->offset))
			return SH_EFORMAT;
		t->type = (int)ty;
		if (!quant_type_known((int)ty))
			return sh_fail(c->err, c->errlen, SH_EUNSUPP,
				       "unsupported tensor type %u for %s", ty, name);
		if (t->ne[0] % quant_block_elems((int)ty))
			return sh_fail(c->err, c->errlen, SH_EFORMAT,
				       "tensor %s: row of %lld is not a whole number of %s blocks",
				       name, (long long)t->ne[0], quant_type_ggml_name((int)ty));
		uint64_t blocks = (uint64_t)nel / (uint64_t)quant_block_elems((int)ty);
		uint64_t bs = (uint64_t)quant_block_bytes((int)ty);
		if (blocks > UINT64_MAX / bs)
			return sh_fail(c->err, c->errlen, SH_EFORMAT, "tensor %s is too large",
				       name);
		t->nbytes = blocks * bs;
		size_t m = g->t_hash_n - 1, h = hash_str(name, nlen) & m;
		while (g->t_hash[h] >= 0) {
			if (!strcmp(g->tensors[g->t_hash[h]].name, name))
				return sh_fail(c->err, c->errlen, SH_EFORMAT, "duplicate tensor %s",
					       name);
			h = (h + 1) & m;
		}
		g->t_hash[h] = (int)i;
	}
	return 0;
}

static int parse(gguf_t *g, char *err, size_t errlen)
{
	struct cur c = {g->base, g->size, 0, err, errlen, "header"};
	uint32_t magic;
	uint64_t n_t;
	if (g->size < 4 || cur_u32(&c, &magic))
		return sh_fail(err, errlen, SH_EFORMAT, "truncated header: not a GGUF file");
	if (magic != GGUF_MAGIC)
		return sh_fail(err, errlen, SH_EFORMAT, "not a GGUF file (bad magic)");
	if (cur_u32(&c, &g->version) || cur_u64(&c, &n_t))
		return sh_fail(err, errlen, SH_EFORMAT, "truncated header");
	if (g->version == 1)
		return sh_fail(err, errlen, SH_EUNSUPP, "GGUF version 1 is not supported (2 or 3)");
	if (g->version != 2 && g->version != 3)
		return sh_fail(err, errlen, SH_EUNSUPP, "unsupported GGUF version %u", g->version);
	/* a tensor info takes at least 8 + 4 + 4 + 8 bytes */
	if (n_t > (g->size - c.pos) / 24 || n_t > INT_MAX / 2)
		return sh_fail(err, errlen, SH_EFORMAT, "tensor count %llu past end of file",
			       (unsigned long long)n_t);
	int rc = parse_kv(g, &c);
	if (rc)
		return rc;
	g->alignment = GGUF_DEFAULT_ALIGNMENT;
	int ai = gguf_find_key(g, "general.alignment");
	if (ai >= 0) {
		uint32_t a = 0;
		if (gguf_get_u32(g, "general.alignment", &a) || a == 0 || (a & (a - 1)) ||
		    a > (1u << 20))
			return sh_fail(err, errlen, SH_EFORMAT,
				       "general.alignment must be a power of two");
		g->alignment = a;
	}
	rc = parse_tensors(g, &c, n_t);
	if (rc)
		return rc;
	uint64_t pad = (g->alignment - c.pos % g->alignment) % g->alignment;
	g->data_off = c.pos + pad;
	if (g->header_only) /* a prefix of the file: the data section is not there to check */
		return 0;
	/* a file with no tensors may end right after the infos */
	if (g->data_off > g->size && n_t)
		return sh_fail(err, errlen, SH_EFORMAT, "truncated file: data section missing");
	uint64_t data_len = g->data_off <= g->size ? g->size - g->data_off : 0;
	for (int i = 0; i < g->n_tensors; i++) {
		gguf_tensor_t *t = &g->tensors[i];
		if (t->offset % g->alignment)
			return sh_fail(err, errlen, SH_EFORMAT,
				       "tensor %s data offset is not aligned to %u", t->name,
				       g->alignment);
		if (t->offset > data_len || t->nbytes > data_len - t->offset)
			return sh_fail(err, errlen, SH_EFORMAT, "tensor %s data past end of file",
				       t->name);
		t->data = g->base + g->data_off + t->offset;
		g->tensor_bytes += t->nbytes;
	}
	return 0;
}

void gguf_free(gguf_t *g)
{
	if (!g)
		return;
	for (int i = 0; i < g->n_kv; i++) {
		free(g->kv[i].key);
		free(g->kv[i].str_off);
	}
	for (int i = 0; i < g->n_tensors; i++)
		free((char *)g->tensors[i].name);
	free(g->kv);
	free(g->tensors);
	free(g->kv_hash);
	free(g->t_hash);
	if (g->mapped && g->size)
		munmap((void *)g->base, g->size);
	if (g->side && g->side_size)
		munmap((void *)g->side, g->side_size);
	free(g->ovl);
	free(g);
}

int gguf_header_bytes(const void *prefix, size_t len, uint64_t *need, char *err, size_t errlen)
{
	gguf_t *g = calloc(1, sizeof *g);
	if (!g)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	g->base = prefix;
	g->size = len;
	g->header_only = 1;
	int rc = parse(g, err, errlen);
	*need = rc ? 0 : g->data_off;
	gguf_free(g);
	return rc;
}

int gguf_open_mem(gguf_t **out, const void *data, size_t len, char *err, size_t errlen)
{
	*out = NULL;
	gguf_t *g = calloc(1, sizeof *g);
	if (!g)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	g->base = data;
	g->size = len;
	int rc = parse(g, err, errlen);
	if (rc) {
		gguf_free(g);
		return rc;
	}
	*out = g;
	return 0;
}

static int ovl_cmp(const void *a, const void *b)
{
	const struct gguf_ovl *x = a, *y = b;
	return x->off < y->off ? -1 : x->off > y->off;
}

/* Loads PATH.cols.map and, when it lists anything, PATH.cols (gguf.h). */
static int load_sidecar(gguf_t *g, const char *path, char *err, size_t errlen)
{
	char sp[4200], mp[4200];
	snprintf(sp, sizeof sp, "%s.cols", path);
	snprintf(mp, sizeof mp, "%s.cols.map", path);
	FILE *f = fopen(mp, "r");
	if (!f)
		return 0;
	int rc = 0, cap = 0;
	unsigned long long o, l, d;
	while (fscanf(f, "%llu %llu %llu", &o, &l, &d) == 3) {
		if (!l || o + l > g->size || o + l < o || d + l < d) {
			rc = sh_fail(err, errlen, SH_EFORMAT, "%s: entry %llu+%llu out of range",
				     mp, o, l);
			break;
		}
		if (g->n_ovl == cap) {
			cap = cap ? 2 * cap : 64;
			struct gguf_ovl *n = realloc(g->ovl, (size_t)cap * sizeof *n);
			if (!n) {
				rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
				break;
			}
			g->ovl = n;
		}
		g->ovl[g->n_ovl++] = (struct gguf_ovl){o, l, d};
	}
	if (!rc && !feof(f))
		rc = sh_fail(err, errlen, SH_EFORMAT, "%s: malformed line", mp);
	fclose(f);
	if (rc || !g->n_ovl)
		return rc;
	int fd = open(sp, O_RDONLY | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0 || st.st_size <= 0) {
		rc = sh_fail(err, errlen, SH_EIO, "%s: %s", sp,
			     fd < 0 ? strerror(errno) : "empty or unreadable");
		if (fd >= 0)
			close(fd);
		return rc;
	}
	void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		return sh_fail(err, errlen, SH_EIO, "%s: mmap: %s", sp, strerror(errno));
	g->side = m;
	g->side_size = (size_t)st.st_size;
	for (int i = 0; i < g->n_ovl; i++)
		if (g->ovl[i].side + g->ovl[i].len > g->side_size)
			return sh_fail(err, errlen, SH_EFORMAT, "%s: entry past the end of %s", mp,
				       sp);
	qsort(g->ovl, (size_t)g->n_ovl, sizeof *g->ovl, ovl_cmp);
	return 0;
}

void gguf_copy(const gguf_t *g, void *dst, const void *p, size_t len)
{
	uint8_t *d = dst;
	const uint8_t *src = p;
	if (!g->n_ovl || src < g->base || src + len > g->base + g->size) {
		memcpy(d, src, len);
		return;
	}
	uint64_t off = (uint64_t)(src - g->base), end = off + len;
	int lo = 0, hi = g->n_ovl - 1, at = 0; /* the first entry that may cover off */
	while (lo <= hi) {
		int mid = (lo + hi) / 2;
		if (g->ovl[mid].off <= off) {
			at = mid;
			lo = mid + 1;
		} else {
			hi = mid - 1;
		}
	}
	while (off < end) {
		while (at < g->n_ovl && g->ovl[at].off + g->ovl[at].len <= off)
			at++;
		const struct gguf_ovl *o = at < g->n_ovl ? &g->ovl[at] : NULL;
		uint64_t n;
		if (o && o->off <= off) { /* from the sidecar */
			n = MIN(end, o->off + o->len) - off;
			memcpy(d, g->side + o->side + (off - o->off), n);
		} else { /* from the file, up to the next sidecar entry */
			n = (o ? MIN(end, o->off) : end) - off;
			memcpy(d, g->base + off, n);
		}
		d += n;
		off += n;
	}
}

int gguf_open(gguf_t **out, const char *path, char *err, size_t errlen)
{
	*out = NULL;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return sh_fail(err, errlen, SH_EIO, "%s: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return sh_fail(err, errlen, SH_EIO, "%s: not a regular file", path);
	}
	if (st.st_size == 0) {
		close(fd);
		return sh_fail(err, errlen, SH_EFORMAT, "%s: empty file", path);
	}
	void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	int e = errno;
	close(fd);
	if (m == MAP_FAILED)
		return sh_fail(err, errlen, SH_EIO, "%s: mmap: %s", path, strerror(e));
	gguf_t *g = calloc(1, sizeof *g);
	if (!g) {
		munmap(m, (size_t)st.st_size);
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	}
	g->base = m;
	g->size = (size_t)st.st_size;
	g->mapped = 1;
	char msg[256];
	int rc = parse(g, msg, sizeof msg);
	if (rc) {
		gguf_free(g);
		return sh_fail(err, errlen, rc, "%s: %s", path, msg);
	}
	if ((rc = load_sidecar(g, path, err, errlen))) {
		gguf_free(g);
		return rc;
	}
	*out = g;
	return 0;
}

/* ---- accessors ---- */

uint32_t gguf_version(const gguf_t *g)
{
	return g->version;
}
uint64_t gguf_file_size(const gguf_t *g)
{
	return g->size;
}
uint32_t gguf_alignment(const gguf_t *g)
{
	return g->alignment;
}
uint64_t gguf_data_offset(const gguf_t *g)
{
	return g->data_off;
}
int gguf_n_kv(const gguf_t *g)
{
	return g->n_kv;
}
int gguf_n_tensors(const gguf_t *g)
{
	return g->n_tensors;
}
uint64_t gguf_tensor_bytes(const gguf_t *g)
{
	return g->tensor_bytes;
}

int gguf_find_key(const gguf_t *g, const char *key)
{
	if (!g->kv_hash)
		return -1;
	size_t m = g->kv_hash_n - 1, h = hash_str(key, strlen(key)) & m;
	while (g->kv_hash[h] >= 0) {
		if (!strcmp(g->kv[g->kv_hash[h]].key, key))
			return g->kv_hash[h];
		h = (h + 1) & m;
	}
	return -1;
}

const char *gguf_key(const gguf_t *g, int i)
{
	return i >= 0 && i < g->n_kv ? g->kv[i].key : NULL;
}

int gguf_kv_type(const gguf_t *g, int i)
{
	return i >= 0 && i < g->n_kv ? g->kv[i].type : -1;
}

/* Reads a scalar of type t at off as an integer (is_int = 1) or a double. */
static int read_scalar(const gguf_t *g, int t, uint64_t off, int64_t *iv, uint64_t *uv, double *dv,
		       int *is_int, int *is_uns)
{
	const uint8_t *p = g->base + off;
	*is_int = 1;
	*is_uns = 0;
	switch (t) {
	case GGUF_U8:
	case GGUF_BOOL: *iv = p[0]; break;
	case GGUF_I8: *iv = (int8_t)p[0]; break;
	case GGUF_U16: {
		uint16_t v;
		memcpy(&v, p, 2);
		*iv = v;
		break;
	}
	case GGUF_I16: {
		int16_t v;
		memcpy(&v, p, 2);
		*iv = v;
		break;
	}
	case GGUF_U32: {
		uint32_t v;
		memcpy(&v, p, 4);
		*iv = v;
		break;
	}
	case GGUF_I32: {
		int32_t v;
		memcpy(&v, p, 4);
		*iv = v;
		break;
	}
	case GGUF_I64: {
		memcpy(iv, p, 8);
		break;
	}
	case GGUF_U64: {
		memcpy(uv, p, 8);
		*is_uns = 1;
		*iv = *uv > INT64_MAX ? INT64_MAX : (int64_t)*uv;
		break;
	}
	case GGUF_F32: {
		float v;
		memcpy(&v, p, 4);
		*dv = v;
		*is_int = 0;
		break;
	}
	case GGUF_F64: {
		memcpy(dv, p, 8);
		*is_int = 0;
		break;
	}
	default: return SH_EFORMAT;
	}
	if (*is_int) {
		if (!*is_uns)
			*uv = *iv < 0 ? 0 : (uint64_t)*iv;
		*dv = *is_uns ? (double)*uv : (double)*iv;
	}
	return 0;
}

static int get_int(const gguf_t *g, int t, uint64_t off, int64_t lo, uint64_t hi, int64_t *out)
{
	int64_t iv = 0;
	uint64_t uv = 0;
	double dv = 0;
	int is_int, is_uns;
	if (read_scalar(g, t, off, &iv, &uv, &dv, &is_int, &is_uns) || !is_int)
		return SH_EFORMAT;
	if (is_uns ? uv > hi : (iv < lo || (iv >= 0 && (uint64_t)iv > hi)))
		return SH_EFORMAT;
	*out = is_uns ? (int64_t)uv : iv;
	return 0;
}

static int key_scalar(const gguf_t *g, const char *key, int *t, uint64_t *off)
{
	int i = gguf_find_key(g, key);
	if (i < 0)
		return SH_ENOENT;
	*t = g->kv[i].type;
	*off = g->kv[i].off;
	return 0;
}

/* An integer key's value, checked to lie in [lo, hi] (bools are not integers here). */
static int key_int(const gguf_t *g, const char *key, int64_t lo, uint64_t hi, int64_t *v)
{
	int t;
	uint64_t off;
	int rc = key_scalar(g, key, &t, &off);
	if (rc)
		return rc;
	if (t == GGUF_BOOL || get_int(g, t, off, lo, hi, v))
		return SH_EFORMAT;
	return 0;
}

int gguf_get_u32(const gguf_t *g, const char *key, uint32_t *out)
{
	int64_t v;
	int rc = key_int(g, key, 0, UINT32_MAX, &v);
	if (!rc)
		*out = (uint32_t)v;
	return rc;
}

int gguf_get_i32(const gguf_t *g, const char *key, int32_t *out)
{
	int64_t v;
	int rc = key_int(g, key, INT32_MIN, INT32_MAX, &v);
	if (!rc)
		*out = (int32_t)v;
	return rc;
}

int gguf_get_u64(const gguf_t *g, const char *key, uint64_t *out)
{
	int64_t v;
	int rc = key_int(g, key, 0, UINT64_MAX, &v);
	if (!rc)
		*out = (uint64_t)v;
	return rc;
}

int gguf_get_f32(const gguf_t *g, const char *key, float *out)
{
	int t, is_int, is_uns;
	uint64_t off, uv;
	int64_t iv;
	double dv;
	int rc = key_scalar(g, key, &t, &off);
	if (rc)
		return rc;
	if (t == GGUF_BOOL || read_scalar(g, t, off, &iv, &uv, &dv, &is_int, &is_uns))
		return SH_EFORMAT;
	*out = (float)dv;
	return 0;
}

int gguf_get_bool(const gguf_t *g, const char *key, int *out)
{
	int t;
	uint64_t off;
	int64_t v;
	int rc = key_scalar(g, key, &t, &off);
	if (rc)
		return rc;
	if (get_int(g, t, off, INT64_MIN, UINT64_MAX, &v))
		return SH_EFORMAT;
	*out = v != 0;
	return 0;
}

int gguf_kv_str(const gguf_t *g, int i, const char **s, size_t *len)
{
	if (i < 0 || i >= g->n_kv || g->kv[i].type != GGUF_STR)
		return SH_EFORMAT;
	uint64_t n;
	memcpy(&n, g->base + g->kv[i].off, 8);
	*s = (const char *)g->base + g->kv[i].off + 8;
	*len = (size_t)n;
	return 0;
}

int gguf_get_str(const gguf_t *g, const char *key, const char **s, size_t *len)
{
	int i = gguf_find_key(g, key);
	if (i < 0)
		return SH_ENOENT;
	return gguf_kv_str(g, i, s, len);
}

int gguf_get_strdup(const gguf_t *g, const char *key, char **out)
{
	const char *s;
	size_t n;
	*out = NULL;
	int rc = gguf_get_str(g, key, &s, &n);
	if (rc)
		return rc;
	*out = malloc(n + 1);
	if (!*out)
		return SH_ENOMEM;
	memcpy(*out, s, n);
	(*out)[n] = 0;
	return 0;
}

int gguf_kv_i64(const gguf_t *g, int i, int64_t *out)
{
	if (i < 0 || i >= g->n_kv)
		return SH_EINVAL;
	return get_int(g, g->kv[i].type, g->kv[i].off, INT64_MIN, INT64_MAX, out);
}

int gguf_kv_f64(const gguf_t *g, int i, double *out)
{
	int is_int, is_uns;
	uint64_t uv;
	int64_t iv;
	if (i < 0 || i >= g->n_kv)
		return SH_EINVAL;
	return read_scalar(g, g->kv[i].type, g->kv[i].off, &iv, &uv, out, &is_int, &is_uns);
}

int gguf_arr_type(const gguf_t *g, int i)
{
	return i >= 0 && i < g->n_kv && g->kv[i].type == GGUF_ARR ? g->kv[i].arr_type : -1;
}

uint64_t gguf_arr_n(const gguf_t *g, int i)
{
	return i >= 0 && i < g->n_kv && g->kv[i].type == GGUF_ARR ? g->kv[i].n : 0;
}

const void *gguf_arr_data(const gguf_t *g, int i)
{
	if (gguf_arr_type(g, i) < 0)
		return NULL;
	return g->base + g->kv[i].off;
}

static int arr_elem(const gguf_t *g, int i, uint64_t j, int *t, uint64_t *off)
{
	int et = gguf_arr_type(g, i);
	if (et < 0 || j >= g->kv[i].n)
		return SH_EINVAL;
	int sz = gguf_vtype_size(et);
	if (!sz)
		return SH_EFORMAT;
	*t = et;
	*off = g->kv[i].off + j * (uint64_t)sz;
	return 0;
}

int gguf_arr_i64(const gguf_t *g, int i, uint64_t j, int64_t *out)
{
	int t;
	uint64_t off;
	int rc = arr_elem(g, i, j, &t, &off);
	if (rc)
		return rc;
	return get_int(g, t, off, INT64_MIN, INT64_MAX, out);
}

int gguf_arr_f32(const gguf_t *g, int i, uint64_t j, float *out)
{
	int t, is_int, is_uns;
	uint64_t off, uv;
	int64_t iv;
	double dv;
	int rc = arr_elem(g, i, j, &t, &off);
	if (rc)
		return rc;
	if (read_scalar(g, t, off, &iv, &uv, &dv, &is_int, &is_uns))
		return SH_EFORMAT;
	*out = (float)dv;
	return 0;
}

int gguf_arr_str(const gguf_t *g, int i, uint64_t j, const char **s, size_t *len)
{
	if (gguf_arr_type(g, i) != GGUF_STR || j >= g->kv[i].n || !g->kv[i].str_off)
		return SH_EINVAL;
	uint64_t off = g->kv[i].str_off[j], n;
	memcpy(&n, g->base + off, 8);
	*s = (const char *)g->base + off + 8;
	*len = (size_t)n;
	return 0;
}

const gguf_tensor_t *gguf_tensor(const gguf_t *g, int i)
{
	return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const gguf_tensor_t *gguf_find_tensor(const gguf_t *g, const char *name)
{
	if (!g->t_hash)
		return NULL;
	size_t m = g->t_hash_n - 1, h = hash_str(name, strlen(name)) & m;
	while (g->t_hash[h] >= 0) {
		if (!strcmp(g->tensors[g->t_hash[h]].name, name))
			return &g->tensors[g->t_hash[h]];
		h = (h + 1) & m;
	}
	return NULL;
}
