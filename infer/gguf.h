/*
 * gguf.h: read-only access to a GGUF file (llama.cpp's model format, versions 2 and 3).
 * Internal to infer/ (used by the engine, meta.c, the tokenizers and the tests).
 *
 * gguf_open() memory-maps the file and validates all of it up front: every key/value (all value
 * types, nested arrays included), every tensor info, and every tensor's data range against the
 * file size. After a successful open no accessor can read outside the file; accessors only
 * check types and indices. Errors name the problem ("truncated header", "tensor X data past end
 * of file", ...).
 *
 * Ownership: a gguf_t owns its mapping (or borrows the caller's buffer for gguf_open_mem(),
 * which must outlive it). Every pointer returned by an accessor (strings, array data, tensor
 * data, tensor names, keys) points into the gguf_t and lives until gguf_free(). Strings read
 * from the file are NOT NUL-terminated (pointer + length); keys and tensor names are copied and
 * are NUL-terminated. Numeric array data is little-endian and may be unaligned: use the element
 * getters or memcpy.
 *
 * Threads: a gguf_t is immutable after open; any thread may read it concurrently.
 */
#ifndef SHOAL_GGUF_H
#define SHOAL_GGUF_H

#include <stddef.h>
#include <stdint.h>

typedef struct gguf gguf_t;

/* Value types of the key/value section. */
enum gguf_vtype {
	GGUF_U8 = 0,
	GGUF_I8 = 1,
	GGUF_U16 = 2,
	GGUF_I16 = 3,
	GGUF_U32 = 4,
	GGUF_I32 = 5,
	GGUF_F32 = 6,
	GGUF_BOOL = 7,
	GGUF_STR = 8,
	GGUF_ARR = 9,
	GGUF_U64 = 10,
	GGUF_I64 = 11,
	GGUF_F64 = 12,
	GGUF_NVTYPES
};

#define GGUF_MAX_DIMS          4
#define GGUF_DEFAULT_ALIGNMENT 32

typedef struct gguf_tensor {
	const char *name;          /* NUL-terminated copy */
	int n_dims;                /* 0..4 */
	int64_t ne[GGUF_MAX_DIMS]; /* ne[0] = row length (fastest varying); unused dims are 1 */
	int type;                  /* ggml type number (enum qtype; any quant_type_known() one) */
	uint64_t offset;           /* from the start of the data section */
	uint64_t nbytes;           /* size of the data */
	const void *data;          /* into the mapping; nbytes readable */
} gguf_tensor_t;

/* Opens and validates path. Returns 0 or a negative SH_E* code (SH_EIO: cannot open/map,
 * SH_EFORMAT: malformed, SH_EUNSUPP: version or tensor type not supported) with a one-line
 * reason in err. */
int gguf_open(gguf_t **out, const char *path, char *err, size_t errlen);
/* The same on a caller's buffer (borrowed; must outlive the gguf_t). */
int gguf_open_mem(gguf_t **out, const void *data, size_t len, char *err, size_t errlen);
void gguf_free(gguf_t *g); /* NULL-safe; unmaps */

/* Sidecar: a file opened at PATH may keep some of its byte ranges compactly in PATH.cols (a node
 * that holds only its slice of a model stores there the short per-row column slices that would
 * otherwise cost whole file-system blocks in the sparse PATH). PATH.cols.map lists them, one
 * "OFF LEN SIDE" line each: bytes [OFF, OFF + LEN) of the file are at SIDE in PATH.cols.
 * gguf_open loads them when the map exists and lists anything (a malformed map is an error).
 * gguf_copy(g, dst, p, len) copies the len bytes the mapping has at p into dst, each byte from
 * the sidecar when an entry covers it (entries may abut: a re-planned slice), else from p. */
void gguf_copy(const gguf_t *g, void *dst, const void *p, size_t len);
/* The size of the header (metadata, tensor table, padding: where the data section starts) of the
 * GGUF file whose first len bytes are prefix. SH_EFORMAT when the prefix does not hold a whole
 * valid header (a longer prefix may). */
int gguf_header_bytes(const void *prefix, size_t len, uint64_t *need, char *err, size_t errlen);

uint32_t gguf_version(const gguf_t *g);
uint64_t gguf_file_size(const gguf_t *g);
uint32_t gguf_alignment(const gguf_t *g);
uint64_t gguf_data_offset(const gguf_t *g); /* start of the data section in the file */

/* ---- key/value section ---- */
/* Bytes of one value of a scalar type (enum gguf_vtype); 0 for strings and arrays. */
int gguf_vtype_size(int t);
int gguf_n_kv(const gguf_t *g);
int gguf_find_key(const gguf_t *g, const char *key); /* index, or -1 */
const char *gguf_key(const gguf_t *g, int i);        /* NUL-terminated */
int gguf_kv_type(const gguf_t *g, int i);            /* enum gguf_vtype, or -1 for a bad i */

/* Typed getters by key. Return 0 and set *out; SH_ENOENT when the key is absent (*out is left
 * untouched, so callers preset their default); SH_EFORMAT when the value has a type that
 * cannot be converted or does not fit. Integer getters accept any integer type whose value
 * fits; gguf_get_f32 accepts f32, f64 and integers; gguf_get_bool accepts bool and integers. */
int gguf_get_u32(const gguf_t *g, const char *key, uint32_t *out);
int gguf_get_i32(const gguf_t *g, const char *key, int32_t *out);
int gguf_get_u64(const gguf_t *g, const char *key, uint64_t *out);
int gguf_get_f32(const gguf_t *g, const char *key, float *out);
int gguf_get_bool(const gguf_t *g, const char *key, int *out);
/* String value: pointer into the mapping, not NUL-terminated, *len bytes. */
int gguf_get_str(const gguf_t *g, const char *key, const char **s, size_t *len);
/* The same, copied into a malloc'd NUL-terminated string the caller frees (*out = NULL on error).
 */
int gguf_get_strdup(const gguf_t *g, const char *key, char **out);

/* The same by index (for iterating, e.g. `shoal info`). */
int gguf_kv_i64(const gguf_t *g, int i, int64_t *out); /* any integer type (u64 must fit) */
int gguf_kv_f64(const gguf_t *g, int i, double *out);  /* floats and integers */
int gguf_kv_str(const gguf_t *g, int i, const char **s, size_t *len);

/* Arrays (by kv index). gguf_arr_type: element type or -1 when kv i is not an array.
 * Elements of a nested array (element type GGUF_ARR) are validated but not accessible. */
int gguf_arr_type(const gguf_t *g, int i);
uint64_t gguf_arr_n(const gguf_t *g, int i);
const void *gguf_arr_data(const gguf_t *g, int i); /* raw elements (non-string arrays), unaligned */
/* Element j of a numeric array, converted as by the getters above. 0 or SH_EINVAL/SH_EFORMAT. */
int gguf_arr_i64(const gguf_t *g, int i, uint64_t j, int64_t *out);
int gguf_arr_f32(const gguf_t *g, int i, uint64_t j, float *out);
/* Element j of a string array: pointer into the mapping, not NUL-terminated. O(1). */
int gguf_arr_str(const gguf_t *g, int i, uint64_t j, const char **s, size_t *len);

/* ---- tensors ---- */
int gguf_n_tensors(const gguf_t *g);
const gguf_tensor_t *gguf_tensor(const gguf_t *g, int i);                 /* NULL for a bad i */
const gguf_tensor_t *gguf_find_tensor(const gguf_t *g, const char *name); /* NULL if absent */
uint64_t gguf_tensor_bytes(const gguf_t *g); /* sum of nbytes over all tensors */

#endif
