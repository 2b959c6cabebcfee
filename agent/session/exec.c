/*
 * exec.c: --exec, CMD's life on this node. One state per node: IDLE (no plan in force, or
 * waiting out a backoff), RUNNING (CMD's process group is up for plan `hash`), STOPPING (SIGTERM
 * sent to the group, SIGKILL at a deadline). exec_sync moves between them once per loop turn
 * and never blocks, so the agent's heartbeats go on while CMD dies.
 *
 * The environment is what python/mlx/_distributed_utils/launch.py gives a rank: MLX_RANK; for
 * the ring (launch_ring) MLX_HOSTFILE; for JACCL (launch_jaccl) MLX_IBV_DEVICES,
 * MLX_JACCL_COORDINATOR and, for its ring, MLX_JACCL_RING=1; plus the hosts file's envs. A
 * variable a backend does not use is left out, as mlx.launch leaves it out: MLX's
 * distributed.cpp init tries the ring first whenever MLX_HOSTFILE and MLX_RANK are set, so a
 * hostfile next to a JACCL matrix would pick the wrong backend; and one rank gets no
 * MLX_HOSTFILE at all (MLX then makes a group of one, docs/mlx.md).
 *
 * Invariant: at most one CMD process group per node; a group is killed (SIGKILL to -pgid) before
 * its leader is reaped, so no process of it outlives the agent's knowledge of it; on Linux the
 * child also dies with the agent (PR_SET_PDEATHSIG), even on kill -9.
 */
#include "agent/session/exec.h"

#include "common/common.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#define EXEC_ENV_MAX     16
#define EXEC_LINES       6 /* last output lines kept for the exit report */
#define EXEC_LINE_MAX    200
#define EXEC_LOG_LINES   200  /* output lines per run logged at info */
#define EXEC_KILL_MS     3000 /* SIGTERM, then SIGKILL this long after */
#define EXEC_BACKOFF_MS  1000 /* first retry */
#define EXEC_BACKOFF_MAX 30000
#define EXEC_STABLE_MS   30000 /* a run this long resets the backoff */

enum exec_state { EXEC_IDLE, EXEC_RUNNING, EXEC_STOPPING };

struct exec {
	enum exec_state state;
	pid_t pid;     /* the group leader (sh), also the process group id */
	int out_fd;    /* read end of CMD's stdout+stderr, -1 when none */
	char hash[20]; /* plan the running CMD was started for */
	int rank;
	int64_t started_ms, kill_at_ms, retry_at_ms;
	int backoff_ms;
	char part[EXEC_LINE_MAX]; /* an output line not yet ended */
	size_t part_len;
	char lines[EXEC_LINES][EXEC_LINE_MAX]; /* ring of the last lines */
	int n_lines;
};

static const char *state_name(enum exec_state s)
{
	return s == EXEC_RUNNING ? "running" : s == EXEC_STOPPING ? "stopping" : "idle";
}

static void convert(exec_t *x, enum exec_state to, const char *why)
{
	LOG(LOG_DEBUG, "exec: %s -> %s (%s)", state_name(x->state), state_name(to), why);
	x->state = to;
}

int exec_env(const plan_t *p, int rank, const exec_cfg_t *cfg, char out[][EXEC_ENV_LEN], int max)
{
	int n = 0;
	const char *b = plan_mlx_backend(p), *d = cfg->state_dir;
#define PUT(...)                                                                                   \
	do {                                                                                       \
		if (n < max)                                                                       \
			snprintf(out[n++], EXEC_ENV_LEN, __VA_ARGS__);                             \
	} while (0)
	PUT("MLX_RANK=%d", rank);
	if (!strcmp(b, "ring")) {
		if (plan_n_ranks(p) > 1)
			PUT("MLX_HOSTFILE=%s/hostfile.json", d);
	} else {
		PUT("MLX_IBV_DEVICES=%s/rdma-devices.json", d);
		PUT("MLX_JACCL_COORDINATOR=%s", plan_coordinator(p));
		if (!strcmp(b, "jaccl-ring"))
			PUT("MLX_JACCL_RING=1");
	}
	if (plan_mlx_env(p)[0])
		PUT("%s", plan_mlx_env(p));
	PUT("SHOAL_PLAN=%s/plan.json", d);
	PUT("SHOAL_MLX_HOSTS=%s/mlx-hosts.json", d);
	PUT("SHOAL_WORLD_SIZE=%d", plan_n_ranks(p));
	if (cfg->port > 0)
		PUT("SHOAL_EXEC_PORT=%d", cfg->port);
#undef PUT
	return n;
}

/* Keeps line s (without its newline) in the ring and logs it. */
static void line_add(exec_t *x, const char *s, size_t len)
{
	char *dst = x->lines[x->n_lines++ % EXEC_LINES];
	snprintf(dst, EXEC_LINE_MAX, "%.*s", (int)MIN(len, EXEC_LINE_MAX - 1), s);
	for (char *c = dst; *c; c++)
		if ((unsigned char)*c < 32)
			*c = ' ';
	/* a chatty command must not flood the log: its first lines at info, the rest at debug */
	if (x->n_lines <= EXEC_LOG_LINES)
		LOG(LOG_INFO, "exec[%d]: %s", x->rank, dst);
	else
		LOG(LOG_DEBUG, "exec[%d]: %s", x->rank, dst);
	if (x->n_lines == EXEC_LOG_LINES)
		LOG(LOG_INFO, "exec[%d]: (further output at --log-level debug)", x->rank);
}

/* Reads what CMD wrote (non-blocking), line by line. */
static void output_drain(exec_t *x)
{
	char buf[4096];
	ssize_t k;
	int reads = 0;
	/* at most 256 KB per loop turn: a command that writes without pause must not hold the
	 * agent's loop (it blocks on the full pipe instead) */
	while (x->out_fd >= 0 && reads++ < 64 && (k = read(x->out_fd, buf, sizeof buf)) != 0) {
		if (k < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				break;
			return;
		}
		for (ssize_t i = 0; i < k; i++) {
			if (buf[i] == '\n' || x->part_len == sizeof x->part - 1) {
				line_add(x, x->part, x->part_len);
				x->part_len = 0;
				if (buf[i] == '\n')
					continue;
			}
			x->part[x->part_len++] = buf[i];
		}
	}
	if (reads > 64)
		return; /* more next turn */
	/* EOF (every writer gone) or an error: done with the pipe */
	if (x->part_len)
		line_add(x, x->part, x->part_len);
	x->part_len = 0;
	close(x->out_fd);
	x->out_fd = -1;
}

extern char **environ;

/*
 * The forked child (async-signal-safe calls only: the agent has threads). It leads CMD's process
 * group. On Linux it stays as a watcher between the agent and sh: when the agent dies, even by
 * kill -9, the kernel sends it SIGUSR1 (PR_SET_PDEATHSIG) and it kills the whole group, whatever
 * sh has forked (dash does not exec the last command of -c, so a death signal on sh alone would
 * orphan CMD). It exits as sh did, so the agent sees CMD's own status.
 */
static _Noreturn void child_main(int out_fd, char **argv, char **envp, pid_t parent)
{
	setpgid(0, 0);
	int devnull = open("/dev/null", O_RDONLY);
	if (devnull >= 0)
		dup2(devnull, 0);
	dup2(out_fd, 1);
	dup2(out_fd, 2);
	long top = sysconf(_SC_OPEN_MAX);
	for (long fd = 3; fd < (top > 0 && top < 65536 ? top : 65536); fd++)
		close((int)fd);
	signal(SIGPIPE, SIG_DFL);
	signal(SIGCHLD, SIG_DFL);
	sigset_t none;
	sigemptyset(&none);
#ifdef __linux__
	sigset_t w;
	sigemptyset(&w);
	sigaddset(&w, SIGUSR1), sigaddset(&w, SIGCHLD), sigaddset(&w, SIGTERM);
	sigaddset(&w, SIGINT), sigaddset(&w, SIGHUP);
	sigprocmask(SIG_SETMASK, &w, NULL);
	prctl(PR_SET_PDEATHSIG, SIGUSR1);
	if (getppid() != parent)
		_exit(127); /* the agent died before prctl */
	pid_t sh = fork();
	if (sh == 0) {
		sigprocmask(SIG_SETMASK, &none, NULL);
		execve("/bin/sh", argv, envp);
		_exit(127);
	}
	if (sh < 0)
		_exit(127);
	for (;;) {
		int sig = sigwaitinfo(&w, NULL), st;
		if (sig == SIGUSR1) { /* the agent is gone: so is everything it started */
			kill(0, SIGKILL);
			_exit(137);
		}
		if (sig == SIGCHLD && waitpid(sh, &st, WNOHANG) == sh) {
			if (WIFSIGNALED(st)) { /* die the same way */
				signal(WTERMSIG(st), SIG_DFL);
				sigprocmask(SIG_SETMASK, &none, NULL);
				kill(getpid(), WTERMSIG(st));
			}
			_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 127);
		}
		/* SIGTERM, SIGINT, SIGHUP went to the whole group: wait for sh to end */
	}
#else
	(void)parent;
	sigprocmask(SIG_SETMASK, &none, NULL);
	execve("/bin/sh", argv, envp);
	_exit(127);
#endif
}

/* Is "NAME=..." one of the names CMD's environment sets or must not inherit? */
static int env_overridden(const char *e, char env[][EXEC_ENV_LEN], int n_env)
{
	static const char *const drop[] = {"MLX_HOSTFILE=", "MLX_IBV_DEVICES=", "MLX_RANK=",
					   "MLX_JACCL_COORDINATOR=", "MLX_JACCL_RING="};
	for (size_t i = 0; i < ARRAY_LEN(drop); i++)
		if (!strncmp(e, drop[i], strlen(drop[i])))
			return 1;
	for (int i = 0; i < n_env; i++) {
		size_t k = strcspn(env[i], "=");
		if (!strncmp(e, env[i], k + 1))
			return 1;
	}
	return 0;
}

static int start(exec_t *x, const exec_cfg_t *cfg, const plan_t *p, int rank, int64_t now)
{
	static char env[EXEC_ENV_MAX][EXEC_ENV_LEN];
	int n_env = exec_env(p, rank, cfg, env, EXEC_ENV_MAX);
	/* the whole environment is built before fork: the child only calls async-signal-safe
	 * functions (the agent has threads) */
	size_t n_inh = 0;
	while (environ && environ[n_inh])
		n_inh++;
	char **envp = calloc(n_inh + (size_t)n_env + 1, sizeof *envp);
	if (!envp)
		return -1;
	size_t k = 0;
	for (size_t i = 0; i < n_inh; i++)
		if (!env_overridden(environ[i], env, n_env))
			envp[k++] = environ[i];
	for (int i = 0; i < n_env; i++)
		envp[k++] = env[i];
	char *argv[] = {"sh", "-c", (char *)cfg->cmd, NULL};
	int fds[2];
	if (pipe(fds)) {
		LOG(LOG_ERROR, "exec: pipe: %s", strerror(errno));
		free(envp);
		return -1;
	}
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid < 0) {
		LOG(LOG_ERROR, "exec: fork: %s", strerror(errno));
		close(fds[0]), close(fds[1]);
		free(envp);
		return -1;
	}
	if (pid == 0)
		child_main(fds[1], argv, envp, parent);
	free(envp);
	setpgid(pid, pid); /* also here: no race with a kill before the child ran */
	close(fds[1]);
	fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
	fcntl(fds[0], F_SETFD, FD_CLOEXEC);
	x->pid = pid;
	x->out_fd = fds[0];
	x->rank = rank;
	x->started_ms = now;
	x->n_lines = 0;
	x->part_len = 0;
	snprintf(x->hash, sizeof x->hash, "%s", plan_hash(p));
	LOG(LOG_INFO, "exec: started rank %d of %d (plan %s, MLX backend %s, pid %d): %s", rank,
	    plan_n_ranks(p), plan_hash(p), plan_mlx_backend(p), (int)pid, cfg->cmd);
	convert(x, EXEC_RUNNING, "plan in force");
	return 0;
}

/* Has the group leader exited? Then kill what is left of its group and reap it. Returns 1 with
 * *status set once reaped. */
static int reap(exec_t *x, int *status)
{
	siginfo_t si;
	memset(&si, 0, sizeof si);
	if (waitid(P_PID, (id_t)x->pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid == 0)
		return 0;
	kill(-x->pid, SIGKILL); /* the group id is still ours: its leader is not reaped yet */
	while (waitpid(x->pid, status, 0) < 0 && errno == EINTR)
		;
	for (int i = 0; i < 64 && x->out_fd >= 0; i++) /* its last words, up to 4 MB */
		output_drain(x);
	if (x->out_fd >= 0) { /* a straggler holds the pipe: we have its last words already */
		close(x->out_fd);
		x->out_fd = -1;
	}
	x->pid = 0;
	return 1;
}

static void describe(int status, char *out, size_t len)
{
	if (WIFEXITED(status))
		snprintf(out, len, "exit status %d", WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(out, len, "killed by signal %d", WTERMSIG(status));
	else
		snprintf(out, len, "status 0x%x", status);
}

static void stop_begin(exec_t *x, int64_t now, const char *why)
{
	LOG(LOG_INFO, "exec: stopping rank %d (pid %d): %s", x->rank, (int)x->pid, why);
	kill(-x->pid, SIGTERM);
	x->kill_at_ms = now + EXEC_KILL_MS;
	convert(x, EXEC_STOPPING, why);
}

void exec_sync(exec_t **xp, const exec_cfg_t *cfg, const plan_t *p, int rank, int64_t now)
{
	if (!cfg || !cfg->cmd)
		return;
	if (!*xp) {
		*xp = calloc(1, sizeof **xp);
		if (!*xp)
			return;
		(*xp)->out_fd = -1;
		(*xp)->backoff_ms = EXEC_BACKOFF_MS;
	}
	exec_t *x = *xp;
	int status;
	switch (x->state) {
	case EXEC_RUNNING:
		output_drain(x);
		if (reap(x, &status)) {
			char how[64];
			describe(status, how, sizeof how);
			int64_t ran = now - x->started_ms;
			if (ran >= EXEC_STABLE_MS)
				x->backoff_ms = EXEC_BACKOFF_MS;
			LOG(LOG_ERROR,
			    "exec: rank %d's command ended after %lld ms with %s; retrying in %d "
			    "ms%s",
			    x->rank, (long long)ran, how, x->backoff_ms,
			    x->n_lines ? "; its last output:" : " (it printed nothing)");
			int first = x->n_lines > EXEC_LINES ? x->n_lines - EXEC_LINES : 0;
			for (int i = first; i < x->n_lines; i++)
				LOG(LOG_ERROR, "exec:   | %s", x->lines[i % EXEC_LINES]);
			x->retry_at_ms = now + x->backoff_ms;
			x->backoff_ms = MIN(x->backoff_ms * 2, EXEC_BACKOFF_MAX);
			x->hash[0] = 0;
			convert(x, EXEC_IDLE, "command ended");
			break;
		}
		if (!p)
			stop_begin(x, now, "the plan is no longer in force");
		else if (strcmp(plan_hash(p), x->hash))
			stop_begin(x, now, "a new plan");
		break;
	case EXEC_STOPPING:
		output_drain(x);
		if (reap(x, &status)) {
			x->retry_at_ms = 0; /* a stop we asked for is no failure */
			x->backoff_ms = EXEC_BACKOFF_MS;
			x->hash[0] = 0;
			convert(x, EXEC_IDLE, "stopped");
		} else if (now >= x->kill_at_ms) {
			LOG(LOG_WARN, "exec: rank %d ignored SIGTERM for %d ms: SIGKILL", x->rank,
			    EXEC_KILL_MS);
			kill(-x->pid, SIGKILL);
			x->kill_at_ms = now + EXEC_KILL_MS;
		}
		break;
	case EXEC_IDLE:
		if (!p) {
			x->retry_at_ms = 0; /* a new plan starts at once */
			x->backoff_ms = EXEC_BACKOFF_MS;
		}
		if (p && now >= x->retry_at_ms && start(x, cfg, p, rank, now))
			x->retry_at_ms = now + EXEC_BACKOFF_MS;
		break;
	}
}

void exec_free(exec_t *x)
{
	if (!x)
		return;
	if (x->pid > 0) {
		if (x->state != EXEC_STOPPING)
			LOG(LOG_INFO, "exec: stopping rank %d (pid %d): shutdown", x->rank,
			    (int)x->pid);
		kill(-x->pid, SIGTERM);
		int status;
		int64_t until = now_ms() + EXEC_KILL_MS;
		while (!reap(x, &status)) {
			if (now_ms() >= until) {
				kill(-x->pid, SIGKILL);
				until = now_ms() + 60000;
			}
			usleep(20000);
		}
	}
	if (x->out_fd >= 0)
		close(x->out_fd);
	free(x);
}
