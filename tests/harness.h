/*
 * harness.h: the project's tiny test harness (one header, no library).
 *
 *   #include "harness.h"
 *   TEST(parses_magic) { CHECK(x == 1); CHECK_EQ_INT(a, b); }
 *   int main(void) { RUN(parses_magic); return harness_done(); }
 *
 * Each failed check prints "file:line: expression" and marks the current test failed; the run
 * closes with the line "N passed, N failed[, N skipped]" and exits non-zero on any failure.
 * SKIP("reason") ends the current test as skipped with a one-line reason.
 */
#ifndef SHOAL_HARNESS_H
#define SHOAL_HARNESS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int h_passed, h_failed, h_skipped;
static int h_cur_failed, h_cur_skipped;

#define TEST(name) static void test_##name(void)

#define RUN(name)                                                                                  \
	do {                                                                                       \
		h_cur_failed = 0;                                                                  \
		h_cur_skipped = 0;                                                                 \
		test_##name();                                                                     \
		if (h_cur_skipped)                                                                 \
			h_skipped++;                                                               \
		else if (h_cur_failed) {                                                           \
			h_failed++;                                                                \
			fprintf(stderr, "FAIL %s\n", #name);                                       \
		} else                                                                             \
			h_passed++;                                                                \
	} while (0)

#define CHECK(cond)                                                                                \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);   \
			h_cur_failed = 1;                                                          \
		}                                                                                  \
	} while (0)

#define CHECK_EQ_INT(a, b)                                                                         \
	do {                                                                                       \
		long long h_a = (long long)(a), h_b = (long long)(b);                              \
		if (h_a != h_b) {                                                                  \
			fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", __FILE__,        \
				__LINE__, #a, #b, h_a, h_b);                                       \
			h_cur_failed = 1;                                                          \
		}                                                                                  \
	} while (0)

#define CHECK_EQ_STR(a, b)                                                                         \
	do {                                                                                       \
		const char *h_a = (a), *h_b = (b);                                                 \
		if (!h_a || !h_b || strcmp(h_a, h_b)) {                                            \
			fprintf(stderr, "%s:%d: %s == %s failed: \"%s\" != \"%s\"\n", __FILE__,    \
				__LINE__, #a, #b, h_a ? h_a : "(null)", h_b ? h_b : "(null)");     \
			h_cur_failed = 1;                                                          \
		}                                                                                  \
	} while (0)

#define CHECK_NEAR(a, b, tol)                                                                      \
	do {                                                                                       \
		double h_a = (a), h_b = (b);                                                       \
		if (!(fabs(h_a - h_b) <= (tol))) {                                                 \
			fprintf(stderr, "%s:%d: |%s - %s| <= %g failed: %g vs %g\n", __FILE__,     \
				__LINE__, #a, #b, (double)(tol), h_a, h_b);                        \
			h_cur_failed = 1;                                                          \
		}                                                                                  \
	} while (0)

#define SKIP(reason)                                                                               \
	do {                                                                                       \
		fprintf(stderr, "skip %s: %s\n", __func__ + 5, reason);                            \
		h_cur_skipped = 1;                                                                 \
		return;                                                                            \
	} while (0)

/* Directory of ../shared as seen from the repository root (tests run from the root). */
static inline const char *harness_shared(void)
{
	const char *s = getenv("SHOAL_SHARED");
	return s ? s : "../shared";
}

/* ../shared/models/stories260K.gguf, the story model the inference tests read, or NULL when it
 * is missing (the test then skips). A static buffer: the same path on every call. */
static inline const char *harness_stories(void)
{
	static char p[512];
	snprintf(p, sizeof p, "%s/models/stories260K.gguf", harness_shared());
	return access(p, R_OK) ? NULL : p;
}

static inline int harness_is_root(void) { return geteuid() == 0; }

static inline int harness_done(void)
{
	if (h_skipped)
		printf("%d passed, %d failed, %d skipped\n", h_passed, h_failed, h_skipped);
	else
		printf("%d passed, %d failed\n", h_passed, h_failed);
	return h_failed ? 1 : 0;
}

#endif
