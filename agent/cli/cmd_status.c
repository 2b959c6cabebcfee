/*
 * cmd_status.c: `shoal status`. Connects to the local agent's status socket (STATE_DIR/agent.sock),
 * reads the one JSON object it writes, and prints it (--json) or the member table.
 */
#include "agent/agent.h"
#include "agent/cli/cli.h"
#include "common/common.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static void usage(FILE *f)
{
	fprintf(f, "usage: shoal status [--json] [--state-dir D]\n\n"
		   "Asks the agent running with state directory D (default as for `shoal agent`)\n"
		   "for its members, leader and view epoch.\n");
}

static const char *str(json_t *o, const char *k)
{
	const char *s = json_string_value(json_object_get(o, k));
	return s ? s : "-";
}

static double num(json_t *o, const char *k)
{
	return json_number_value(json_object_get(o, k));
}

/* The plan, its standby members and the measured links (a matrix: round trip median/p90 in ms
 * and Mbit/s of each measured pair, from the row's node to the column's). */
static void print_plan_links(json_t *root)
{
	json_t *plan = json_object_get(root, "plan"), *x;
	size_t i, k;
	if (json_is_object(plan)) {
		printf("plan %s: %s over %lld ranks", str(plan, "hash"), str(plan, "strategy"),
		       (long long)json_integer_value(json_object_get(plan, "ranks")));
		if (num(plan, "predicted_decode_tok_s") > 0)
			printf(", predicted %.1f tok/s", num(plan, "predicted_decode_tok_s"));
		if (num(plan, "measured_decode_tok_s") > 0)
			printf(", measured %.1f tok/s", num(plan, "measured_decode_tok_s"));
		printf("\n");
		if (json_is_string(json_object_get(plan, "reason")))
			printf("  %s\n", str(plan, "reason"));
		json_array_foreach(json_object_get(plan, "standby"), i, x)
		    printf("standby %.8s: %s\n", str(x, "node_id"), str(x, "reason"));
	}
	json_t *links = json_object_get(root, "links"), *ms = json_object_get(root, "members");
	int any = 0;
	json_array_foreach(links, i, x) any |= json_is_number(json_object_get(x, "rtt_ms"));
	if (!any)
		return;
	printf("links (round trip median/p90 ms, Mbit/s):\n%-8s", "");
	json_t *c, *r;
	json_array_foreach(ms, k, c) printf("  %-24.8s", str(c, "node_id"));
	printf("\n");
	json_array_foreach(ms, i, r)
	{
		printf("%-8.8s", str(r, "node_id"));
		json_array_foreach(ms, k, c)
		{
			char cell[64] = "-";
			for (size_t j = 0; j < json_array_size(links); j++) {
				json_t *l = json_array_get(links, j);
				const char *a = str(l, "a"), *b = str(l, "b");
				const char *ri = str(r, "node_id"), *ci = str(c, "node_id");
				if (!json_is_number(json_object_get(l, "rtt_ms")) ||
				    !((!strcmp(a, ri) && !strcmp(b, ci)) ||
				      (!strcmp(a, ci) && !strcmp(b, ri))))
					continue;
				snprintf(cell, sizeof cell, "%.3f/%.3f %.0f", num(l, "rtt_ms"),
					 num(l, "rtt_p90_ms"), num(l, "mbit_s"));
			}
			printf("  %-24s", cell);
		}
		printf("\n");
	}
}

static void print_table(json_t *root)
{
	printf("node %s  leader %s  epoch %lld  state %s\n", str(root, "node_id"),
	       str(root, "leader"), (long long)json_integer_value(json_object_get(root, "epoch")),
	       str(root, "state"));
	const char *why = json_string_value(json_object_get(root, "reason"));
	if (why && why[0])
		printf("why: %s\n", why);
	if (json_is_string(json_object_get(root, "planner")) &&
	    strcmp(str(root, "planner"), str(root, "leader")))
		printf("planner (rank 0, the majority model's smallest ID): %s\n",
		       str(root, "planner"));
	if (json_is_true(json_object_get(root, "duplicate_id")))
		printf("WARNING: another node (%s) uses this node ID\n", str(root, "duplicate_at"));
	printf("%-32s  %-20s  %-15s  %-10s  %8s  %5s  %s\n", "NODE ID", "HOST", "ADDRESS",
	       "INTERFACE", "MEM GiB", "CORES", "ROLE");
	json_t *m;
	size_t i;
	json_array_foreach(json_object_get(root, "members"), i, m)
	{
		double gib = (double)json_integer_value(json_object_get(m, "mem")) / (1 << 30);
		json_t *ex = json_object_get(m, "experts"); /* MoE: the routed experts held */
		char exps[48] = "";
		if (json_array_size(ex) == 2)
			snprintf(exps, sizeof exps, "  experts %lld-%lld",
				 (long long)json_integer_value(json_array_get(ex, 0)),
				 (long long)json_integer_value(json_array_get(ex, 1)));
		printf("%-32s  %-20s  %-15s  %-10s  %8.1f  %5lld  %s%s%s\n", str(m, "node_id"),
		       str(m, "host"), str(m, "address"), str(m, "interface"), gib,
		       (long long)json_integer_value(json_object_get(m, "cores")), str(m, "role"),
		       json_is_true(json_object_get(m, "self")) ? " (this node)" : "", exps);
		if (json_is_string(json_object_get(m, "excluded")))
			printf("  left out: %s\n", str(m, "excluded"));
	}
	print_plan_links(root);
}

int cmd_status(int argc, char **argv)
{
	static const struct option opts[] = {{"json", no_argument, 0, 'j'},
					     {"state-dir", required_argument, 0, 'd'},
					     {"help", no_argument, 0, 'h'},
					     {0, 0, 0, 0}};
	char state_dir[SH_PATH_MAX] = "", path[SH_SUBPATH_MAX];
	int c, as_json = 0;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'j': as_json = 1; break;
		case 'd': snprintf(state_dir, sizeof state_dir, "%s", optarg); break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!state_dir[0] && disc_state_dir_default(state_dir, sizeof state_dir)) {
		fprintf(stderr, "shoal status: pass --state-dir\n");
		return 2;
	}
	if (agent_status_path(state_dir, path, sizeof path)) {
		fprintf(stderr, "shoal status: state dir path too long\n");
		return 2;
	}
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	memcpy(sa.sun_path, path, strlen(path) + 1); /* length checked by agent_status_path */
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
		fprintf(stderr, "shoal status: no agent answers at %s (%s)\n", path,
			strerror(errno));
		if (fd >= 0)
			close(fd);
		return 1;
	}
	struct timeval tv = {3, 0};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	size_t cap = 1 << 16, len = 0;
	char *buf = malloc(cap);
	while (buf) {
		if (len + 1 == cap) {
			char *nb = realloc(buf, cap * 2);
			if (!nb)
				break;
			buf = nb;
			cap *= 2;
		}
		ssize_t r = read(fd, buf + len, cap - len - 1);
		if (r <= 0)
			break;
		len += (size_t)r;
	}
	close(fd);
	if (!buf) {
		fprintf(stderr, "shoal status: out of memory\n");
		return 1;
	}
	buf[len] = 0;
	json_error_t jerr;
	json_t *root = json_loads(buf, 0, &jerr);
	if (!root || !json_is_object(root)) {
		fprintf(stderr, "shoal status: the agent's answer is not JSON: %s\n", jerr.text);
		json_decref(root);
		free(buf);
		return 1;
	}
	if (as_json)
		fputs(buf, stdout);
	else
		print_table(root);
	json_decref(root);
	free(buf);
	return 0;
}
