/*
 * cmd_tokenize.c: `shoal tokenize`: UTF-8 text on stdin -> token ids on one line, or with
 * --decode ids on stdin -> text. Works on any GGUF with a tokenizer (a vocabulary-only file
 * too). The text is taken exactly as read: `echo` adds a newline that becomes a token; use
 * printf to avoid it.
 */
#include "agent/cli/cli.h"
#include "common/common.h"
#include "infer/gguf.h"
#include "infer/tok/tokenizer.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
	fprintf(f, "usage: shoal tokenize --model FILE.gguf [--bos] [--special] [--decode]\n"
		   "  Reads UTF-8 text on stdin and prints its token ids on one line.\n"
		   "  --bos       prepend the BOS token (off by default)\n"
		   "  --special   parse special tokens written in the text, e.g. <|im_start|>;\n"
		   "              with --decode, print control tokens' text\n"
		   "  --decode    read token ids (space or comma separated) and print the text\n");
}

/* Reads all of stdin into a malloc'd buffer. */
static char *read_stdin(size_t *len)
{
	size_t cap = 65536, n = 0;
	char *b = malloc(cap + 1);
	while (b) {
		size_t r = fread(b + n, 1, cap - n, stdin);
		n += r;
		if (r == 0)
			break;
		if (n == cap) {
			char *nb = realloc(b, cap * 2 + 1);
			if (!nb) {
				free(b);
				return NULL;
			}
			b = nb;
			cap *= 2;
		}
	}
	if (b) {
		b[n] = 0;
		*len = n;
	}
	return b;
}

static int do_decode(const tok_t *t, const char *in, int special)
{
	int cap = 256, n = 0, rc = 1;
	int *ids = malloc((size_t)cap * sizeof *ids);
	char *text = NULL;
	for (const char *p = in; ids && *p;) {
		if (strchr(" \t\r\n,[]", *p)) {
			p++;
			continue;
		}
		char *end;
		errno = 0;
		long v = strtol(p, &end, 10);
		if (end == p || errno || v < 0 || v >= tok_n_vocab(t)) {
			int w = (int)strcspn(p, " \t\r\n,[]");
			fprintf(stderr, "shoal tokenize: bad token id '%.*s' (vocabulary has %d)\n",
				w > 20 ? 20 : w, p, tok_n_vocab(t));
			goto done;
		}
		if (n == cap) {
			int *ni = realloc(ids, (size_t)cap * 2 * sizeof *ids);
			if (!ni)
				goto done;
			ids = ni;
			cap *= 2;
		}
		ids[n++] = (int)v;
		p = end;
	}
	size_t len;
	if (!ids || tok_decode(t, ids, n, TOK_DECODE_STRIP | (special ? TOK_DECODE_SPECIAL : 0),
			       &text, &len)) {
		fprintf(stderr, "shoal tokenize: out of memory\n");
		goto done;
	}
	fwrite(text, 1, len, stdout);
	rc = 0;
done:
	free(ids);
	free(text);
	return rc;
}

int cmd_tokenize(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"model", required_argument, 0, 'm'},
	    {"bos", no_argument, 0, 'b'},
	    {"special", no_argument, 0, 's'},
	    {"decode", no_argument, 0, 'd'},
	    {"help", no_argument, 0, 'h'},
	    {"log-level", required_argument, 0, 'L'},
	    {0, 0, 0, 0},
	};
	const char *model = NULL;
	int bos = 0, special = 0, decode = 0, c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "m:bsdh", opts, NULL)) != -1) {
		switch (c) {
		case 'm': model = optarg; break;
		case 'b': bos = 1; break;
		case 's': special = 1; break;
		case 'd': decode = 1; break;
		case 'h': usage(stdout); return 0;
		case 'L':
			if (cli_set_log_level(optarg))
				return 2;
			break;
		default: usage(stderr); return 2;
		}
	}
	if (!model || optind < argc) {
		usage(stderr);
		return 2;
	}
	char err[512];
	gguf_t *g = NULL;
	tok_t *t = NULL;
	char *in = NULL;
	int *ids = NULL, n, rc = 1;
	size_t len;
	if (gguf_open(&g, model, err, sizeof err) || tok_load(&t, g, err, sizeof err)) {
		fprintf(stderr, "shoal tokenize: %s\n", err);
		goto done;
	}
	in = read_stdin(&len);
	if (!in) {
		fprintf(stderr, "shoal tokenize: cannot read stdin\n");
		goto done;
	}
	if (decode) {
		rc = do_decode(t, in, special);
		goto done;
	}
	if (tok_encode(t, in, len, bos, special, &ids, &n)) {
		fprintf(stderr, "shoal tokenize: out of memory\n");
		goto done;
	}
	for (int i = 0; i < n; i++)
		printf("%s%d", i ? " " : "", ids[i]);
	printf("\n");
	rc = 0;
done:
	if (fflush(stdout) != 0)
		rc = 1;
	free(ids);
	free(in);
	tok_free(t);
	gguf_free(g);
	return rc;
}
