/*
 * common: logging, error codes and the few helpers every module shares.
 *
 * Invariant: nothing here allocates behind the caller's back or keeps state other than the
 * log threshold, which is set once at start (before threads) and only read afterwards.
 */
#ifndef SHOAL_COMMON_H
#define SHOAL_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define SHOAL_VERSION "0.1.0"

/* ---- logging ------------------------------------------------------------------------------ */

enum log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };

extern int log_threshold; /* messages above this level are skipped before formatting */

/* LOG(level, fmt, ...): one line to stderr with a UTC timestamp and the level name.
 * Safe to call from any thread (one fprintf per line). */
#define LOG(level, ...)                                                                            \
	do {                                                                                       \
		if ((level) <= log_threshold)                                                      \
			log_write((level), __VA_ARGS__);                                           \
	} while (0)

void log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parses "error|warn|info|debug" (or 0..3). Returns the level or -1. */
int log_level_parse(const char *s);

/* Sets the threshold from SHOAL_LOG if present; a --log-level flag given later overrides it. */
void log_init_from_env(void);

/* ---- errors ------------------------------------------------------------------------------- */

/* Functions return 0 on success or one of these (negative). Detail goes into a caller's buffer. */
enum shoal_err {
	SH_OK = 0,
	SH_EINVAL = -1,    /* bad argument or malformed input */
	SH_ENOMEM = -2,    /* allocation failed */
	SH_EIO = -3,       /* read, write or system call failed */
	SH_EFORMAT = -4,   /* a file or message does not follow its format */
	SH_EUNSUPP = -5,   /* valid but not supported (architecture, type, version) */
	SH_ETIMEDOUT = -6, /* a deadline passed */
	SH_EAUTH = -7,     /* authentication failed */
	SH_ECLOSED = -8,   /* the peer closed or was lost */
	SH_ENOFIT = -9,    /* the model does not fit */
	SH_ENOENT = -10,   /* not found */
	SH_EBUSY = -11,    /* queue full or resource busy */
	SH_ECANCELED = -12 /* canceled by the caller or a client */
};

/* Message for a code; never NULL. */
const char *sh_strerror(int err);

/* snprintf into a caller's error buffer (errbuf may be NULL). Returns err for tail calls:
 *   return sh_fail(errbuf, errlen, SH_EFORMAT, "bad magic %x", m); */
int sh_fail(char *errbuf, size_t errlen, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- small helpers ------------------------------------------------------------------------ */

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b)    ((a) < (b) ? (a) : (b))
#define MAX(a, b)    ((a) > (b) ? (a) : (b))

/* Monotonic clock in milliseconds and in nanoseconds. */
int64_t now_ms(void);
int64_t now_ns(void);

/* The machine's CPU time so far, all CPUs: busy (everything but idle and iowait) and total, in
 * clock ticks (Linux /proc/stat). Returns 0, or -1 where it cannot be read (other systems). */
int sh_cpu_jiffies(unsigned long long *busy, unsigned long long *total);

/* Path buffers: a path the user or the system gives (a state directory, a model file), and a
 * file shoal names inside such a directory (DIR/NAME, DIR/models/HEX.slice.cols.map, a
 * temporary name beside a file: room for the longest suffix shoal adds). */
#define SH_PATH_MAX    4096
#define SH_SUBPATH_MAX (SH_PATH_MAX + 128)

/* Writes len bytes to path atomically: a temp file beside it, fsync, rename. */
int write_file_atomic(const char *path, const void *data, size_t len, char *errbuf, size_t errlen);

/* Reads a whole file into a NUL-terminated malloc'd buffer the caller frees. */
int read_file_all(const char *path, char **out, size_t *outlen, char *errbuf, size_t errlen);

/* mkdir -p with mode 0700 for created directories. */
int mkdir_p(const char *path, char *errbuf, size_t errlen);

/* 64-bit FNV-1a over n bytes, continuing from h (start with SH_FNV1A64_INIT). */
#define SH_FNV1A64_INIT 0xcbf29ce484222325ULL
uint64_t sh_fnv1a64(uint64_t h, const void *p, size_t n);

/* Splits units over n shares in proportion to the weights w[i] (0 counts as 1) by largest
 * remainder (equal remainders go to the lower index), then gives every share at least min_each
 * by taking from the largest (ties: the higher index). n <= SH_SPLIT_MAX and
 * units >= n * min_each. The one share splitter of the planner and of tensor-parallel workers
 * without a plan, so both cut a model the same way. */
#define SH_SPLIT_MAX 256
void sh_split_units(int *out, int n, int units, int min_each, const uint64_t *w);

/* Lowercase hex of n bytes into out (2n + 1 bytes with the NUL). */
void sh_hex_encode(char *out, const uint8_t *p, size_t n);
/* Exactly 2n hex digits (either case, nothing after) into n bytes. Returns 0 or SH_EFORMAT
 * (then out may be partly written). */
int sh_hex_decode(uint8_t *out, size_t n, const char *hex);

/* A size such as --memory-limit takes: BYTES with an optional K, M, G or T (powers of 1024,
 * optionally followed by B or iB; fractions allowed: "1.5G"), or PCT% of total. Returns 0 with
 * *out set (at least 1), or SH_EINVAL. */
int sh_size_parse(const char *s, uint64_t total, uint64_t *out);

/* The index of the largest of x[0..n) (the first on ties; 0 when n < 1): greedy decoding. */
static inline int sh_argmax(const float *x, int n)
{
	int b = 0;
	for (int i = 1; i < n; i++)
		if (x[i] > x[b])
			b = i;
	return b;
}

/* splitmix64: the next 64 random bits of the sequence *state walks (state advances). The
 * seeded generator of sampling and of generated models: same seed, same bits everywhere. */
static inline uint64_t sh_splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Little-endian fields of wire formats and files (any alignment). */
static inline void sh_put_le16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static inline uint16_t sh_get_le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static inline void sh_put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static inline void sh_put_le64(uint8_t *p, uint64_t v)
{
	sh_put_le32(p, (uint32_t)v);
	sh_put_le32(p + 4, (uint32_t)(v >> 32));
}

static inline uint32_t sh_get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t sh_get_le64(const uint8_t *p)
{
	return sh_get_le32(p) | (uint64_t)sh_get_le32(p + 4) << 32;
}

#endif
