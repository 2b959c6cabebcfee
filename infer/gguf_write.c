/*
 * gguf_write.c: GGUF v3 writer. Key/values and tensor infos are built in one growing buffer;
 * tensor data offsets are assigned at declaration (each aligned to 32 bytes), so the header can
 * be written before any data. Invariant: `written` counts the data bytes of tensors [0, cur)
 * plus the part of tensor `cur` streamed so far.
 */
#include "infer/gguf_write.h"
#include "common/common.h"
#include "infer/gguf.h"
#include "infer/quant/quant.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ALIGN 32

struct tinfo {
	uint64_t offset, nbytes;
};

struct gguf_writer {
	uint8_t *kv; /* serialized key/values */
	size_t kv_len, kv_cap;
	uint64_t n_kv;
	uint8_t *ti; /* serialized tensor infos */
	size_t ti_len, ti_cap;
	struct tinfo *t;
	int n_t, cap_t;
	uint64_t data_end; /* next free data offset */
	FILE *f;
	char *path, *tmp;
	int cur;           /* tensor being streamed */
	uint64_t cur_done; /* its bytes so far */
	int oom;
};

static void put(gguf_writer_t *w, uint8_t **buf, size_t *len, size_t *cap, const void *p, size_t n)
{
	if (w->oom)
		return;
	if (*len + n > *cap) {
		size_t nc = MAX(*cap * 2, *len + n + 256);
		uint8_t *nb = realloc(*buf, nc);
		if (!nb) {
			w->oom = 1;
			return;
		}
		*buf = nb;
		*cap = nc;
	}
	memcpy(*buf + *len, p, n);
	*len += n;
}

#define KV(p, n) put(w, &w->kv, &w->kv_len, &w->kv_cap, (p), (n))
#define TI(p, n) put(w, &w->ti, &w->ti_len, &w->ti_cap, (p), (n))

static void kv_u32(gguf_writer_t *w, uint32_t v)
{
	KV(&v, 4);
}
static void kv_u64(gguf_writer_t *w, uint64_t v)
{
	KV(&v, 8);
}
static void kv_string(gguf_writer_t *w, const char *s)
{
	kv_u64(w, strlen(s));
	KV(s, strlen(s));
}
static int kv_key(gguf_writer_t *w, const char *key, uint32_t type)
{
	kv_string(w, key);
	kv_u32(w, type);
	w->n_kv++;
	return w->oom ? SH_ENOMEM : 0;
}

gguf_writer_t *gw_new(void)
{
	return calloc(1, sizeof(gguf_writer_t));
}

void gw_free(gguf_writer_t *w)
{
	if (!w)
		return;
	if (w->f) {
		fclose(w->f);
		unlink(w->tmp);
	}
	free(w->kv);
	free(w->ti);
	free(w->t);
	free(w->path);
	free(w->tmp);
	free(w);
}

int gw_kv_str(gguf_writer_t *w, const char *key, const char *val)
{
	kv_key(w, key, 8);
	kv_string(w, val);
	return w->oom ? SH_ENOMEM : 0;
}

int gw_kv_u32(gguf_writer_t *w, const char *key, uint32_t val)
{
	kv_key(w, key, 4);
	kv_u32(w, val);
	return w->oom ? SH_ENOMEM : 0;
}

int gw_kv_i32(gguf_writer_t *w, const char *key, int32_t val)
{
	kv_key(w, key, 5);
	KV(&val, 4);
	return w->oom ? SH_ENOMEM : 0;
}

int gw_kv_f32(gguf_writer_t *w, const char *key, float val)
{
	kv_key(w, key, 6);
	KV(&val, 4);
	return w->oom ? SH_ENOMEM : 0;
}

int gw_kv_bool(gguf_writer_t *w, const char *key, int val)
{
	uint8_t b = val ? 1 : 0;
	kv_key(w, key, 7);
	KV(&b, 1);
	return w->oom ? SH_ENOMEM : 0;
}

int gw_kv_arr_str(gguf_writer_t *w, const char *key, const char *const *vals, size_t n)
{
	kv_key(w, key, 9);
	kv_u32(w, 8);
	kv_u64(w, n);
	for (size_t i = 0; i < n; i++)
		kv_string(w, vals[i]);
	return w->oom ? SH_ENOMEM : 0;
}

int gw_kv_arr_f32(gguf_writer_t *w, const char *key, const float *vals, size_t n)
{
	kv_key(w, key, 9);
	kv_u32(w, 6);
	kv_u64(w, n);
	KV(vals, n * 4);
	return w->oom ? SH_ENOMEM : 0;
}

int gw_kv_arr_i32(gguf_writer_t *w, const char *key, const int32_t *vals, size_t n)
{
	kv_key(w, key, 9);
	kv_u32(w, 5);
	kv_u64(w, n);
	KV(vals, n * 4);
	return w->oom ? SH_ENOMEM : 0;
}

int gw_tensor(gguf_writer_t *w, const char *name, int n_dims, const int64_t *ne, int type)
{
	if (n_dims < 1 || n_dims > 4 || !quant_type_supported(type) ||
	    ne[0] % quant_block_elems(type))
		return SH_EINVAL;
	uint64_t rows = 1;
	for (int i = 1; i < n_dims; i++)
		rows *= (uint64_t)ne[i];
	uint64_t nbytes = quant_row_bytes(type, ne[0]) * rows;
	if (w->n_t == w->cap_t) {
		int nc = w->cap_t ? w->cap_t * 2 : 64;
		struct tinfo *nt = realloc(w->t, (size_t)nc * sizeof *nt);
		if (!nt)
			return SH_ENOMEM;
		w->t = nt;
		w->cap_t = nc;
	}
	w->t[w->n_t].offset = w->data_end;
	w->t[w->n_t].nbytes = nbytes;
	w->n_t++;
	uint64_t len = strlen(name);
	uint32_t nd = (uint32_t)n_dims, ty = (uint32_t)type;
	TI(&len, 8);
	TI(name, len);
	TI(&nd, 4);
	for (int i = 0; i < n_dims; i++) {
		uint64_t v = (uint64_t)ne[i];
		TI(&v, 8);
	}
	TI(&ty, 4);
	TI(&w->data_end, 8);
	w->data_end = (w->data_end + nbytes + ALIGN - 1) / ALIGN * ALIGN;
	return w->oom ? SH_ENOMEM : 0;
}

static int pad_to(gguf_writer_t *w, uint64_t pos, char *err, size_t errlen)
{
	static const uint8_t zero[ALIGN];
	uint64_t n = (ALIGN - pos % ALIGN) % ALIGN;
	if (n && fwrite(zero, 1, n, w->f) != n)
		return sh_fail(err, errlen, SH_EIO, "%s: %s", w->tmp, strerror(errno));
	return 0;
}

int gw_begin(gguf_writer_t *w, const char *path, char *err, size_t errlen)
{
	if (w->oom)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	w->path = strdup(path);
	w->tmp = malloc(strlen(path) + 8);
	if (!w->path || !w->tmp)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	sprintf(w->tmp, "%s.tmp", path);
	w->f = fopen(w->tmp, "wb");
	if (!w->f)
		return sh_fail(err, errlen, SH_EIO, "%s: %s", w->tmp, strerror(errno));
	uint32_t magic = 0x46554747, version = 3;
	uint64_t nt = (uint64_t)w->n_t;
	int ok = fwrite(&magic, 4, 1, w->f) == 1 && fwrite(&version, 4, 1, w->f) == 1 &&
		 fwrite(&nt, 8, 1, w->f) == 1 && fwrite(&w->n_kv, 8, 1, w->f) == 1 &&
		 fwrite(w->kv, 1, w->kv_len, w->f) == w->kv_len &&
		 fwrite(w->ti, 1, w->ti_len, w->f) == w->ti_len;
	if (!ok)
		return sh_fail(err, errlen, SH_EIO, "%s: %s", w->tmp, strerror(errno));
	w->cur = 0;
	w->cur_done = 0;
	return pad_to(w, 24 + w->kv_len + w->ti_len, err, errlen);
}

int gw_data(gguf_writer_t *w, const void *data, size_t len, char *err, size_t errlen)
{
	if (!w->f || w->cur >= w->n_t || w->cur_done + len > w->t[w->cur].nbytes)
		return sh_fail(err, errlen, SH_EINVAL,
			       "gguf writer: data beyond the declared tensors");
	if (fwrite(data, 1, len, w->f) != len)
		return sh_fail(err, errlen, SH_EIO, "%s: %s", w->tmp, strerror(errno));
	w->cur_done += len;
	if (w->cur_done == w->t[w->cur].nbytes) {
		int rc = pad_to(w, w->t[w->cur].offset + w->cur_done, err, errlen);
		if (rc)
			return rc;
		w->cur++;
		w->cur_done = 0;
	}
	return 0;
}

int gw_skip_data(gguf_writer_t *w, char *err, size_t errlen)
{
	if (!w->f || w->cur || w->cur_done)
		return sh_fail(err, errlen, SH_EINVAL, "gguf writer: data already written");
	uint64_t start = (24 + w->kv_len + w->ti_len + ALIGN - 1) / ALIGN * ALIGN;
	if (fflush(w->f) || ftruncate(fileno(w->f), (off_t)(start + w->data_end)))
		return sh_fail(err, errlen, SH_EIO, "%s: %s", w->tmp, strerror(errno));
	w->cur = w->n_t;
	return 0;
}

int gw_finish(gguf_writer_t *w, char *err, size_t errlen)
{
	if (!w->f || w->cur != w->n_t)
		return sh_fail(err, errlen, SH_EINVAL, "gguf writer: %d of %d tensors written",
			       w->cur, w->n_t);
	int rc = fflush(w->f) || fsync(fileno(w->f));
	rc |= fclose(w->f);
	w->f = NULL;
	if (rc || rename(w->tmp, w->path)) {
		unlink(w->tmp);
		return sh_fail(err, errlen, SH_EIO, "%s: %s", w->path, strerror(errno));
	}
	return 0;
}

int gw_kv_copy(gguf_writer_t *w, const gguf_t *g, int i)
{
	int t = gguf_kv_type(g, i);
	const char *key = gguf_key(g, i);
	if (t < 0 || !key)
		return SH_EINVAL;
	if (t == GGUF_STR) {
		const char *s;
		size_t n;
		if (gguf_kv_str(g, i, &s, &n))
			return SH_EFORMAT;
		kv_key(w, key, GGUF_STR);
		kv_u64(w, n);
		KV(s, n);
	} else if (t == GGUF_ARR) {
		int at = gguf_arr_type(g, i);
		uint64_t n = gguf_arr_n(g, i);
		if (at == GGUF_ARR)
			return SH_EUNSUPP; /* nested arrays: no key the engine reads has them */
		kv_key(w, key, GGUF_ARR);
		kv_u32(w, (uint32_t)at);
		kv_u64(w, n);
		if (at == GGUF_STR) {
			for (uint64_t j = 0; j < n; j++) {
				const char *s;
				size_t len;
				if (gguf_arr_str(g, i, j, &s, &len))
					return SH_EFORMAT;
				kv_u64(w, len);
				KV(s, len);
			}
		} else {
			KV(gguf_arr_data(g, i), (size_t)n * (size_t)gguf_vtype_size(at));
		}
	} else {
		/* a scalar: its value re-encoded in its own width (the file is little-endian, as
		 * every host shoal runs on) */
		int64_t iv = 0;
		uint64_t uv = 0;
		double dv = 0;
		int bv = 0, rc = t == GGUF_F32 || t == GGUF_F64 ? gguf_kv_f64(g, i, &dv)
				 : t == GGUF_BOOL               ? gguf_get_bool(g, key, &bv)
				 : t == GGUF_U64                ? gguf_get_u64(g, key, &uv)
								: gguf_kv_i64(g, i, &iv);
		if (rc || !gguf_vtype_size(t))
			return SH_EFORMAT;
		union {
			uint8_t b[8];
			int8_t i8;
			int16_t i16;
			int32_t i32;
			int64_t i64;
			uint64_t u64;
			float f;
			double d;
		} v = {{0}};
		switch (t) {
		case GGUF_F32: v.f = (float)dv; break;
		case GGUF_F64: v.d = dv; break;
		case GGUF_BOOL: v.b[0] = bv ? 1 : 0; break;
		case GGUF_U64: v.u64 = uv; break;
		case GGUF_U8:
		case GGUF_I8: v.i8 = (int8_t)iv; break;
		case GGUF_U16:
		case GGUF_I16: v.i16 = (int16_t)iv; break;
		case GGUF_U32:
		case GGUF_I32: v.i32 = (int32_t)iv; break;
		default: v.i64 = iv;
		}
		kv_key(w, key, (uint32_t)t);
		KV(v.b, (size_t)gguf_vtype_size(t));
	}
	return w->oom ? SH_ENOMEM : 0;
}
