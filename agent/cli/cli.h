/*
 * cli.h: the subcommands of the shoal binary. Each lives in agent/cli/cmd_NAME.c, takes the
 * arguments after its name (argv[0] is the subcommand name, as for getopt) and returns the
 * process exit code: 0 success, 1 failure, 2 usage error.
 */
#ifndef SHOAL_CLI_H
#define SHOAL_CLI_H

#include "planner/planner.h"

#include <stddef.h>
#include <stdint.h>

int cmd_agent(int argc, char **argv);    /* run the agent: discovery, election, plan, serve */
int cmd_status(int argc, char **argv);   /* ask the local agent for its member table */
int cmd_plan(int argc, char **argv);     /* compute a plan from a view file */
int cmd_info(int argc, char **argv);     /* describe a GGUF model */
int cmd_tokenize(int argc, char **argv); /* text <-> token ids */
int cmd_generate(int argc, char **argv); /* generate text on this machine */
int cmd_mkmodel(int argc, char **argv);  /* write a GGUF with seeded random weights */
int cmd_serve(int argc, char **argv);    /* serve the OpenAI API from one node */
int cmd_worker(int argc, char **argv);   /* one rank of a manually started group */
int cmd_bench(int argc, char **argv);    /* speed figures */

/* The body of `shoal generate` (flags, output, exit codes), shared with `shoal worker`'s rank 0:
 * name is the subcommand for messages; dist NULL = this node alone, else the group's rank 0
 * (borrowed). --stats then also prints the communication figures (cli_comm_stats). */
struct eng_dist;
struct eng;
int cli_generate(int argc, char **argv, const char *name, const struct eng_dist *dist);
void cli_comm_stats(const struct eng *e); /* one line on stderr */
void cli_spec_stats(const struct eng *e); /* speculative decoding's figures: one line on stderr */

/* The one number parser of every flag. A whole decimal integer in [lo, hi]: digits only (no
 * sign, no spaces, no base prefix, no trailing text: "foo", "+1", " 1" and "12x" are refused;
 * flags take no negative integers, so lo >= 0). Returns 0 with *out set, or -1 (then *out is
 * untouched). cli_parse_u64 takes the whole 64-bit range (seeds). */
int cli_parse_int(const char *s, long lo, long hi, int *out);
int cli_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out);
/* A decimal number in [lo, hi] (strtod's syntax, but the whole string, finite, no NaN). */
int cli_parse_num(const char *s, double lo, double hi, double *out);

/* Speculative decoding's flags, shared by generate, worker, serve and agent (which applies them
 * to the leader's engine only): add CLI_SPEC_OPTIONS to the getopt table, CLI_SPEC_USAGE to the
 * help, and let cli_spec_opt() take the option codes it knows. */
enum { CLI_OPT_SPEC = 0x5000, CLI_OPT_DRAFT_MODEL, CLI_OPT_DRAFT_MAX };
/* clang-format off */
#define CLI_SPEC_OPTIONS                                                                           \
	{"spec", required_argument, 0, CLI_OPT_SPEC},                                              \
	{"draft-model", required_argument, 0, CLI_OPT_DRAFT_MODEL},                                \
	{"draft-max", required_argument, 0, CLI_OPT_DRAFT_MAX}
/* clang-format on */
#define CLI_SPEC_USAGE                                                                             \
	"  --spec MODE           speculative decoding: auto (default: where it pays), off,\n"      \
	"                        ngram (prompt lookup), model (needs --draft-model)\n"             \
	"  --draft-model FILE    a small GGUF with the same vocabulary that drafts tokens\n"       \
	"  --draft-max N         longest draft (default 8, at most 16)\n"
/* Applies option c (argument arg) to eo when it is one of the above: returns 1 (and sets *bad
 * for a bad value), else 0. arg is borrowed (argv). */
struct eng_opts;
int cli_spec_opt(int c, const char *arg, struct eng_opts *eo, int *bad);

/* Common flag: --log-level LEVEL (or SHOAL_LOG). Returns 0, or 2 with a message on a bad level. */
int cli_set_log_level(const char *arg);

#endif
