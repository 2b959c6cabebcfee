/*
 * identity.c: the node's identity and the facts it advertises.
 *
 * Invariant: a node ID is created exactly once per state directory (random, from libsodium) and is
 * never rewritten afterwards; a malformed node_id file is reported, not replaced, because replacing
 * it would silently turn the machine into a new node (exo's "ghost nodes").
 */
#include "common/common.h"
#include "discovery/discovery.h"

#include <dirent.h>
#include <errno.h>
#include <pwd.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int disc_state_dir_default(char *out, size_t len)
{
	int n;
	const char *xdg = getenv("XDG_STATE_HOME");
	if (geteuid() == 0)
		n = snprintf(out, len, "/var/lib/shoal");
	else if (xdg && xdg[0] == '/')
		n = snprintf(out, len, "%s/shoal", xdg);
	else {
		const char *home = getenv("HOME");
		if (!home || !home[0]) {
			struct passwd *pw = getpwuid(geteuid());
			home = pw ? pw->pw_dir : "/tmp";
		}
		n = snprintf(out, len, "%s/.local/state/shoal", home);
	}
	return n < 0 || (size_t)n >= len ? SH_EINVAL : 0;
}

int disc_identity_load(const char *state_dir, disc_id_t *id, int *created, char *errbuf,
		       size_t errlen)
{
	char path[4096];
	*created = 0;
	if (snprintf(path, sizeof path, "%s/node_id", state_dir) >= (int)sizeof path)
		return sh_fail(errbuf, errlen, SH_EINVAL, "state dir path too long");
	int rc = mkdir_p(state_dir, errbuf, errlen);
	if (rc)
		return rc;
	char *text = NULL;
	size_t n = 0;
	rc = read_file_all(path, &text, &n, errbuf, errlen);
	if (rc == 0) {
		while (n && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == ' '))
			text[--n] = 0;
		rc = disc_id_parse(text, id);
		free(text);
		if (rc || disc_id_is_zero(id))
			return sh_fail(errbuf, errlen, SH_EFORMAT,
				       "%s: not a node ID (32 hex digits); fix or remove it", path);
		return 0;
	}
	if (rc != SH_ENOENT)
		return rc;
	if (sodium_init() < 0)
		return sh_fail(errbuf, errlen, SH_EIO, "libsodium failed to initialise");
	do
		randombytes_buf(id->b, DISC_ID_LEN);
	while (disc_id_is_zero(id));
	char line[DISC_ID_HEX + 1];
	disc_id_hex(id, line);
	line[DISC_ID_HEX - 1] = '\n';
	line[DISC_ID_HEX] = 0;
	rc = write_file_atomic(path, line, DISC_ID_HEX, errbuf, errlen);
	if (rc)
		return rc;
	*created = 1;
	return 0;
}

/* RDMA devices and the network interfaces they sit on: /sys/class/infiniband/DEV/device/net/IF. */
static void rdma_devices(char *out, size_t cap)
{
	out[0] = 0;
	DIR *d = opendir("/sys/class/infiniband");
	if (!d)
		return;
	struct dirent *e;
	size_t used = 0;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char p[512];
		snprintf(p, sizeof p, "/sys/class/infiniband/%s/device/net", e->d_name);
		DIR *nd = opendir(p);
		const char *ifn = "";
		struct dirent *ne = NULL;
		if (nd) {
			while ((ne = readdir(nd)) && ne->d_name[0] == '.')
				;
			if (ne)
				ifn = ne->d_name;
		}
		int n =
		    snprintf(out + used, cap - used, "%s%s:%s", used ? "," : "", e->d_name, ifn);
		if (nd)
			closedir(nd);
		if (n < 0 || (size_t)n >= cap - used) {
			out[used] = 0; /* keep whole items only */
			break;
		}
		used += (size_t)n;
	}
	closedir(d);
}

void disc_host_facts_get(disc_host_facts_t *f)
{
	memset(f, 0, sizeof *f);
	if (gethostname(f->hostname, sizeof f->hostname - 1) != 0)
		strcpy(f->hostname, "unknown");
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
	if (pages > 0 && psz > 0)
		f->mem_bytes = (uint64_t)pages * (uint64_t)psz;
	long c = sysconf(_SC_NPROCESSORS_ONLN);
	f->cores = c > 0 ? (int)c : 1;
	rdma_devices(f->rdma, sizeof f->rdma);
}
