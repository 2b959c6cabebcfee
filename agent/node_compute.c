/*
 * node_compute.c: this node's measured compute (node.h's node_compute_get; docs/view.md
 * section 1.1: "bw", "prefill_bw", "threads", "machine").
 *
 * Nodes that share a machine (namespaces, containers: the latency lab) measure one after the
 * other: measured at once they would slow each other and report a rate one stream never sees.
 * An flock on a file in the temporary directory, which they share, takes them in turn, and the
 * first one's figure is kept there for the others (TMPDIR/shoal-compute.json, by boot id). The
 * result is kept in STATE_DIR/compute.json under a key of the weight type, the threads and the
 * CPU (its model name and core count; SHOAL_REF_KERNELS, the plain C kernels, too), so a restart
 * does not measure again.
 *
 * Invariant: a cached figure is used only for the exact key it was measured under.
 */
#include "agent/node.h"
#include "common/common.h"
#include "infer/infer.h"

#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#define COMPUTE_FILE "compute.json"

/* The kernel's boot id: shared by every namespace and container of one kernel ("" elsewhere). */
static void machine_id(char *out, size_t len)
{
	out[0] = 0;
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
	if (!f)
		return;
	if (fgets(out, (int)len, f))
		out[strcspn(out, "\r\n")] = 0;
	fclose(f);
}

/* "MODEL NAME/CORES": what the cached figure depends on besides type and threads. */
static void cpu_key(char *out, size_t len)
{
	char model[128] = "cpu";
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[256];
	while (f && fgets(line, sizeof line, f)) {
		const char *c = strchr(line, ':');
		if (c && (!strncmp(line, "model name", 10) || !strncmp(line, "Model", 5) ||
			  !strncmp(line, "CPU part", 8))) {
			snprintf(model, sizeof model, "%s", c + 1 + strspn(c + 1, " \t"));
			model[strcspn(model, "\r\n")] = 0;
			break;
		}
	}
	if (f)
		fclose(f);
	snprintf(out, len, "%s/%ld", model, sysconf(_SC_NPROCESSORS_ONLN));
}

/* Waits (at most QUIET_MAX_MS) until the machine's CPUs are mostly idle for a QUIET_STEP_MS
 * window: nodes that start together on one machine (the latency lab, containers) hash their
 * model files at start, and a rate measured meanwhile came out at 14 GB/s where the same
 * kernels stream 21-22 on a quiet machine. A machine that stays busy is measured as it is. */
#define QUIET_STEP_MS 200
#define QUIET_MAX_MS  4000
#define QUIET_BUSY    0.25 /* busy fraction of all CPUs (this process sleeps meanwhile) */

static void wait_quiet(void)
{
	unsigned long long b0, t0, b1, t1;
	if (sh_cpu_jiffies(&b0, &t0))
		return;
	for (int waited = 0; waited < QUIET_MAX_MS; waited += QUIET_STEP_MS) {
		struct timespec step = {0, QUIET_STEP_MS * 1000000L};
		nanosleep(&step, NULL);
		if (sh_cpu_jiffies(&b1, &t1))
			return;
		if (t1 > t0 && (double)(b1 - b0) < QUIET_BUSY * (double)(t1 - t0))
			return;
		b0 = b1, t0 = t1;
	}
	LOG(LOG_INFO, "compute: the machine stayed busy for %d ms; measured as it is",
	    QUIET_MAX_MS);
}

static int cache_read(const char *path, const char *key, node_compute_t *c)
{
	json_error_t je;
	json_t *o = json_load_file(path, 0, &je), *e = json_object_get(o, key);
	json_t *bw = json_object_get(e, "bw_mbs"), *pf = json_object_get(e, "prefill_mbs");
	int ok = json_is_integer(bw) && json_integer_value(bw) > 0 &&
		 json_integer_value(bw) <= NODE_MAX_MBS && json_is_integer(pf) &&
		 json_integer_value(pf) > 0 && json_integer_value(pf) <= NODE_MAX_MBS;
	if (ok) {
		c->bw_mbs = (uint32_t)json_integer_value(bw);
		c->prefill_mbs = (uint32_t)json_integer_value(pf);
	}
	json_decref(o);
	return ok;
}

static void cache_write(const char *path, const char *key, const node_compute_t *c)
{
	json_error_t je;
	json_t *o = json_load_file(path, 0, &je);
	if (!json_is_object(o)) {
		json_decref(o);
		o = json_object();
	}
	json_object_set_new(o, key,
			    json_pack("{s:I,s:I}", "bw_mbs", (json_int_t)c->bw_mbs, "prefill_mbs",
				      (json_int_t)c->prefill_mbs));
	char *s = json_dumps(o, JSON_INDENT(1) | JSON_SORT_KEYS), err[256];
	json_decref(o);
	if (s && write_file_atomic(path, s, strlen(s), err, sizeof err))
		LOG(LOG_WARN, "compute: %s", err);
	free(s);
}

int node_compute_get(node_compute_t *c, const char *state_dir, const char *model_path, int threads,
		     char *err, size_t errlen)
{
	memset(c, 0, sizeof *c);
	machine_id(c->machine, sizeof c->machine);
	c->threads = threads > 0 ? threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
	eng_model_shape_t sh;
	int rc = eng_model_shape(model_path, &sh, err, errlen);
	if (rc)
		return rc;
	char cpu[160], key[256], path[SH_SUBPATH_MAX];
	cpu_key(cpu, sizeof cpu);
	snprintf(key, sizeof key, "type %d, %d threads, %s%s", sh.wtype, c->threads, cpu,
		 getenv("SHOAL_REF_KERNELS") ? ", reference kernels" : "");
	snprintf(path, sizeof path, "%s/%s", state_dir, COMPUTE_FILE);
	if (cache_read(path, key, c)) {
		LOG(LOG_INFO, "compute: %u MB/s decode, %u MB/s on 64 rows (%s: %s)", c->bw_mbs,
		    c->prefill_mbs, path, key);
		return 0;
	}
	/* the machine's own cache, beside the lock: the nodes of one machine (same boot id, CPU,
	 * type and threads) measure once and report the same figure, so the planner does not
	 * take their measurement noise for a difference in speed */
	const char *tmp = getenv("TMPDIR");
	char lpath[SH_SUBPATH_MAX], mpath[SH_SUBPATH_MAX], mkey[384];
	snprintf(lpath, sizeof lpath, "%s/shoal-compute.lock", tmp && tmp[0] ? tmp : "/tmp");
	snprintf(mpath, sizeof mpath, "%s/shoal-compute.json", tmp && tmp[0] ? tmp : "/tmp");
	snprintf(mkey, sizeof mkey, "%s, %s", c->machine[0] ? c->machine : "-", key);
	int fd = open(lpath, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
	if (fd >= 0 && flock(fd, LOCK_EX) != 0) {
		close(fd);
		fd = -1;
	}
	if (c->machine[0] && cache_read(mpath, mkey, c)) {
		if (fd >= 0)
			close(fd);
		LOG(LOG_INFO, "compute: %u MB/s decode, %u MB/s on 64 rows (this machine's, %s)",
		    c->bw_mbs, c->prefill_mbs, mpath);
		cache_write(path, key, c);
		return 0;
	}
	eng_kernel_rate_t kr;
	wait_quiet();
	int64_t t0 = now_ms();
	rc = eng_kernel_rate(sh.wtype, c->threads, &kr, err, errlen);
	if (!rc && c->machine[0]) {
		node_compute_t mc = *c;
		mc.bw_mbs = (uint32_t)MAX(1, MIN(kr.decode_mbs, NODE_MAX_MBS));
		mc.prefill_mbs = (uint32_t)MAX(1, MIN(kr.prefill_mbs, NODE_MAX_MBS));
		cache_write(mpath, mkey, &mc);
	}
	if (fd >= 0)
		close(fd); /* releases the lock */
	if (rc)
		return rc;
	c->threads = kr.threads;
	c->bw_mbs = (uint32_t)MAX(1, MIN(kr.decode_mbs, NODE_MAX_MBS));
	c->prefill_mbs = (uint32_t)MAX(1, MIN(kr.prefill_mbs, NODE_MAX_MBS));
	LOG(LOG_INFO,
	    "compute: %u MB/s decode, %u MB/s on 64 rows (%d threads, measured in %lld ms)",
	    c->bw_mbs, c->prefill_mbs, c->threads, (long long)(now_ms() - t0));
	cache_write(path, key, c);
	return 0;
}
