/* test_probe.c: link probes (transport.h) on loopback TCP: the blocking prober against an
 * answering peer, both sides probing at once, the event-loop form driven by hand, the burst's
 * bounds, a peer that never answers, malformed probes, bad options. No timing assertions: the
 * figures are checked for consistency (min <= median <= p90, bytes within the bound), not speed.
 *
 * Lab mode (tests/t_lab_probe.sh runs it in the latency lab):
 *   test_probe serve PORT            answers probes on one connection, then exits
 *   test_probe probe HOST PORT [SIZED_BYTES]   one run, prints the figures on one line */
#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>

#include "common/common.h"
#include "harness.h"
#include "transport/chan.h"
#include "transport/frame.h"
#include "transport/keys.h"
#include "transport/transport.h"

static tp_keys_t K1;
static const uint8_t ID_A[16] = {0xa};
static const uint8_t ID_B[16] = {0xb};

/* ---- a connected pair on loopback TCP ----------------------------------------------------- */

struct acc {
	int lfd;
	tp_chan_t *ch;
	int rc;
	char err[256];
};

static void *acc_main(void *p)
{
	struct acc *a = p;
	int fd;
	a->rc = tp_accept(a->lfd, &fd, NULL, 0, 5000, a->err, sizeof a->err);
	if (a->rc == 0)
		a->rc = tp_chan_accept(&a->ch, fd, &K1, ID_B, 5000, a->err, sizeof a->err);
	return NULL;
}

/* *a connects to *b over 127.0.0.1. Returns 0 when both ends are up. */
static int pair_tcp(tp_chan_t **a, tp_chan_t **b)
{
	char err[256];
	int port;
	struct acc ac = {0};
	*a = *b = NULL;
	if (tp_listen("127.0.0.1", 0, &ac.lfd, &port, err, sizeof err))
		return -1;
	pthread_t t;
	pthread_create(&t, NULL, acc_main, &ac);
	int rc = tp_chan_connect(a, "127.0.0.1", port, &K1, ID_A, 5000, err, sizeof err);
	pthread_join(t, NULL);
	close(ac.lfd);
	*b = ac.ch;
	return rc || ac.rc ? -1 : 0;
}

/* The answering side: receives until stop, answers probes, counts other messages (and, when
 * asked, sends one message of its own in the middle of the run, type 0x0300). */
struct responder {
	tp_chan_t *ch;
	atomic_int stop;
	int answered, others, bad, send_other;
};

static void *responder_main(void *p)
{
	struct responder *r = p;
	while (!atomic_load(&r->stop)) {
		uint16_t type;
		void *pl;
		size_t len;
		int rc = tp_chan_recv(r->ch, &type, &pl, &len, 50);
		if (rc == SH_ETIMEDOUT)
			continue;
		if (rc)
			break;
		rc = tp_probe_answer(r->ch, type, pl, len);
		if (rc == 1)
			r->answered++;
		else if (rc == 0)
			r->others++;
		else
			r->bad++;
		if (r->send_other && r->answered == 3)
			tp_chan_send(r->ch, 0x0300, "hello", 5);
	}
	return NULL;
}

/* A connected pair with an answering thread on b (fx_up), and its teardown (fx_down). */
typedef struct fixture {
	tp_chan_t *a, *b;
	struct responder r;
	pthread_t t;
} fixture_t;

static int fx_up(fixture_t *f, int send_other)
{
	memset(f, 0, sizeof *f);
	if (pair_tcp(&f->a, &f->b)) {
		tp_chan_free(f->a);
		tp_chan_free(f->b);
		return -1;
	}
	f->r.ch = f->b;
	f->r.send_other = send_other;
	pthread_create(&f->t, NULL, responder_main, &f->r);
	return 0;
}

static void fx_down(fixture_t *f)
{
	atomic_store(&f->r.stop, 1);
	pthread_join(f->t, NULL);
	tp_chan_free(f->a);
	tp_chan_free(f->b);
}

static void on_other(void *ctx, uint16_t type, const void *payload, size_t len)
{
	int *n = ctx;
	if (type == 0x0300 && len == 5 && !memcmp(payload, "hello", 5))
		(*n)++;
}

static void check_stats(const tp_link_stats_t *s, int probes, size_t burst)
{
	CHECK_EQ_INT(s->probes, probes);
	CHECK(s->rtt_us_min > 0);
	CHECK(s->rtt_us_min <= s->rtt_us_median && s->rtt_us_median <= s->rtt_us_p90);
	CHECK(s->gap_us == -1 || s->gap_us > 0);
	if (burst) {
		CHECK(s->tput_mbit > 0);
		CHECK(s->burst_bytes > 0 && s->burst_bytes <= burst);
	} else {
		CHECK(s->tput_mbit == -1);
	}
}

TEST(probe_against_answering_peer)
{
	fixture_t f;
	if (fx_up(&f, 1)) {
		CHECK(!"pair");
		return;
	}
	tp_probe_opts_t o;
	tp_probe_opts_default(&o);
	o.sized_bytes = 8192;
	tp_link_stats_t s;
	char err[256];
	int others = 0;
	CHECK_EQ_INT(tp_link_probe(f.a, &o, &s, on_other, &others, err, sizeof err), 0);
	check_stats(&s, 16, o.burst_bytes);
	CHECK_EQ_INT(s.sized_bytes, 8192);
	CHECK(s.sized_rtt_us_median > 0);
	CHECK(s.burst_ms < 5000);
	CHECK_EQ_INT(others, 1); /* the peer's own message reached the callback */
	fprintf(stderr,
		"loopback: rtt median %.1f us p90 %.1f min %.1f; 8 KB %.1f us; gap %.1f us; %.0f "
		"Mbit/s (%llu bytes in %.1f ms)\n",
		s.rtt_us_median, s.rtt_us_p90, s.rtt_us_min, s.sized_rtt_us_median, s.gap_us,
		s.tput_mbit, (unsigned long long)s.burst_bytes, s.burst_ms);
	/* a second run on the same channel (the responder's burst state starts again) */
	o.sized_bytes = 0;
	o.burst_bytes = 300000; /* not a multiple of the frame: the last frame is short */
	CHECK_EQ_INT(tp_link_probe(f.a, &o, &s, NULL, NULL, err, sizeof err), 0);
	check_stats(&s, 16, 300000);
	CHECK_EQ_INT(s.burst_bytes, 300000);
	/* the channel still carries ordinary messages afterwards */
	CHECK_EQ_INT(tp_chan_send(f.a, 0x0301, "x", 1), 0);
	usleep(100 * 1000);
	fx_down(&f);
	CHECK_EQ_INT(f.r.bad, 0);
	CHECK(f.r.answered >= 16 + 8 + 16 + 2);
	CHECK_EQ_INT(f.r.others, 1);
}

struct prober {
	tp_chan_t *ch;
	tp_probe_opts_t o;
	tp_link_stats_t s;
	int rc;
	char err[256];
	atomic_int *done; /* shared: probers finished */
};

/* Probes, then keeps answering the other side until it is done too. */
static void *prober_main(void *p)
{
	struct prober *q = p;
	q->rc = tp_link_probe(q->ch, &q->o, &q->s, NULL, NULL, q->err, sizeof q->err);
	atomic_fetch_add(q->done, 1);
	while (atomic_load(q->done) < 2) {
		uint16_t type;
		void *pl;
		size_t len;
		int rc = tp_chan_recv(q->ch, &type, &pl, &len, 20);
		if (rc == 0)
			tp_probe_answer(q->ch, type, pl, len);
		else if (rc != SH_ETIMEDOUT)
			break;
	}
	return NULL;
}

TEST(both_sides_probe_at_once)
{
	tp_chan_t *a, *b;
	if (pair_tcp(&a, &b)) {
		CHECK(!"pair");
		return;
	}
	atomic_int done = 0;
	struct prober p[2] = {{.ch = a, .done = &done}, {.ch = b, .done = &done}};
	pthread_t t[2];
	for (int i = 0; i < 2; i++) {
		tp_probe_opts_default(&p[i].o);
		p[i].o.burst_bytes = 1u << 20;
		pthread_create(&t[i], NULL, prober_main, &p[i]);
	}
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	/* each side answered the other while it probed */
	for (int i = 0; i < 2; i++) {
		CHECK_EQ_INT(p[i].rc, 0);
		if (p[i].rc)
			fprintf(stderr, "side %d: %s\n", i, p[i].err);
		else
			check_stats(&p[i].s, 16, 1u << 20);
	}
	tp_chan_free(a);
	tp_chan_free(b);
}

TEST(event_loop_form)
{
	/* the way an agent's poll loop drives it: step when woken, take every message */
	fixture_t f;
	if (fx_up(&f, 0)) {
		CHECK(!"pair");
		return;
	}
	tp_chan_t *a = f.a;
	tp_probe_opts_t o;
	tp_probe_opts_default(&o);
	o.probes = 5;
	o.train = 0;
	o.burst_bytes = 200000;
	tp_probe_t *p;
	char err[256];
	CHECK_EQ_INT(tp_probe_new(&p, &o, err, sizeof err), 0);
	tp_link_stats_t s;
	CHECK_EQ_INT(tp_probe_result(p, &s), SH_EINVAL); /* not done yet */
	int rc, wait, loops = 0;
	while ((rc = tp_probe_step(p, a, now_ns(), &wait)) == 0 && loops++ < 100000) {
		CHECK(wait > 0);
		struct pollfd pf = {.fd = tp_chan_fd(a), .events = POLLIN};
		if (poll(&pf, 1, wait) <= 0)
			continue;
		uint16_t type;
		void *pl;
		size_t len;
		while (tp_chan_recv(a, &type, &pl, &len, 0) == 0)
			CHECK_EQ_INT(tp_probe_take(p, type, pl, len, now_ns()), 1);
	}
	CHECK_EQ_INT(rc, 1);
	CHECK_EQ_INT(tp_probe_result(p, &s), 0);
	check_stats(&s, 5, 200000);
	CHECK(s.gap_us == -1); /* no train */
	CHECK_EQ_INT(s.burst_bytes, 200000);
	/* a message that is not an answer is not taken */
	CHECK_EQ_INT(tp_probe_take(p, 0x0300, "x", 1, now_ns()), 0);
	tp_probe_free(p);
	fx_down(&f);
}

TEST(burst_time_bound)
{
	/* 1 GiB asked for, 30 ms allowed: the burst stops on time, window-limited */
	fixture_t f;
	if (fx_up(&f, 0)) {
		CHECK(!"pair");
		return;
	}
	tp_probe_opts_t o;
	tp_probe_opts_default(&o);
	o.probes = 3;
	o.train = 0;
	o.burst_bytes = 1u << 30;
	o.burst_ms = 30;
	tp_link_stats_t s;
	char err[256];
	CHECK_EQ_INT(tp_link_probe(f.a, &o, &s, NULL, NULL, err, sizeof err), 0);
	CHECK(s.burst_bytes < (1u << 30));
	CHECK(s.tput_mbit > 0);
	fprintf(stderr, "30 ms burst: %llu bytes in %.1f ms\n", (unsigned long long)s.burst_bytes,
		s.burst_ms);
	/* no burst at all */
	o.burst_bytes = 0;
	CHECK_EQ_INT(tp_link_probe(f.a, &o, &s, NULL, NULL, err, sizeof err), 0);
	check_stats(&s, 3, 0);
	fx_down(&f);
}

TEST(peer_that_never_answers)
{
	tp_chan_t *a, *b;
	if (pair_tcp(&a, &b)) {
		CHECK(!"pair");
		return;
	}
	tp_probe_opts_t o;
	tp_probe_opts_default(&o);
	o.timeout_ms = 300;
	tp_link_stats_t s;
	char err[256];
	int64_t t0 = now_ms();
	CHECK_EQ_INT(tp_link_probe(a, &o, &s, NULL, NULL, err, sizeof err), SH_ETIMEDOUT);
	CHECK(strstr(err, "no answer in time") != NULL);
	CHECK(now_ms() - t0 < 5000); /* bounded by the timeout, not a speed check */
	/* the channel stays usable */
	CHECK_EQ_INT(tp_chan_send(a, 0x0300, "x", 1), 0);
	tp_chan_free(a);
	tp_chan_free(b);
}

TEST(malformed_probes)
{
	tp_chan_t *a, *b;
	if (pair_tcp(&a, &b)) {
		CHECK(!"pair");
		return;
	}
	uint8_t m[TP_PROBE_HDR + 4] = {0};
	CHECK_EQ_INT(tp_probe_answer(b, TP_MSG_PROBE, m, 8), SH_EFORMAT); /* short */
	tp_put32(m + 4, 8);
	CHECK_EQ_INT(tp_probe_answer(b, TP_MSG_PROBE, m, sizeof m), SH_EFORMAT); /* tiny reply */
	tp_put32(m + 4, TP_PROBE_MAX + 1);
	CHECK_EQ_INT(tp_probe_answer(b, TP_MSG_PROBE, m, sizeof m), SH_EFORMAT); /* huge reply */
	CHECK_EQ_INT(tp_probe_answer(b, TP_MSG_PROBE_BURST, m, 4), SH_EFORMAT);
	CHECK_EQ_INT(tp_probe_answer(b, TP_MSG_PROBE_ECHO, m, sizeof m), 0); /* not a request */
	CHECK_EQ_INT(tp_probe_answer(b, 0x0300, m, sizeof m), 0);
	/* a valid one with a large reply: echoed at the asked size */
	tp_put32(m, 7);
	tp_put32(m + 4, 5000);
	CHECK_EQ_INT(tp_probe_answer(b, TP_MSG_PROBE, m, sizeof m), 1);
	uint16_t type;
	void *pl;
	size_t len;
	CHECK_EQ_INT(tp_chan_recv(a, &type, &pl, &len, 1000), 0);
	CHECK_EQ_INT(type, TP_MSG_PROBE_ECHO);
	CHECK_EQ_INT(len, 5000);
	CHECK_EQ_INT(tp_get32(pl), 7);
	tp_chan_free(a);
	tp_chan_free(b);
}

TEST(bad_options)
{
	tp_probe_t *p;
	char err[256];
	tp_probe_opts_t o;
	tp_probe_opts_default(&o);
	o.probes = 0;
	CHECK_EQ_INT(tp_probe_new(&p, &o, err, sizeof err), SH_EINVAL);
	CHECK(p == NULL);
	tp_probe_opts_default(&o);
	o.probe_bytes = 8;
	CHECK_EQ_INT(tp_probe_new(&p, &o, err, sizeof err), SH_EINVAL);
	tp_probe_opts_default(&o);
	o.train = 1;
	CHECK_EQ_INT(tp_probe_new(&p, &o, err, sizeof err), SH_EINVAL);
	CHECK_EQ_INT(tp_probe_new(&p, NULL, err, sizeof err), 0);
	tp_probe_free(p);
	tp_probe_free(NULL);
}

/* ---- lab mode ----------------------------------------------------------------------------- */

static int lab_serve(int port)
{
	char err[256];
	int lfd, fd;
	tp_chan_t *c;
	if (tp_listen(NULL, port, &lfd, NULL, err, sizeof err) ||
	    tp_accept(lfd, &fd, NULL, 0, 30000, err, sizeof err) ||
	    tp_chan_accept(&c, fd, &K1, ID_B, 5000, err, sizeof err)) {
		fprintf(stderr, "serve: %s\n", err);
		return 1;
	}
	close(lfd);
	for (;;) {
		uint16_t type;
		void *pl;
		size_t len;
		int rc = tp_chan_recv(c, &type, &pl, &len, 30000);
		if (rc || tp_probe_answer(c, type, pl, len) < 0)
			break;
	}
	tp_chan_free(c);
	return 0;
}

static int lab_probe(const char *host, int port, int sized)
{
	char err[256];
	tp_chan_t *c;
	if (tp_chan_connect(&c, host, port, &K1, ID_A, 10000, err, sizeof err)) {
		fprintf(stderr, "probe: %s\n", err);
		return 1;
	}
	tp_probe_opts_t o;
	tp_probe_opts_default(&o);
	o.probes = 64;
	o.sized_bytes = sized;
	tp_link_stats_t s;
	int rc = tp_link_probe(c, &o, &s, NULL, NULL, err, sizeof err);
	if (rc)
		fprintf(stderr, "probe: %s\n", err);
	else
		printf(
		    "rtt_median_us %.1f rtt_p90_us %.1f rtt_min_us %.1f sized_bytes %d "
		    "sized_rtt_us %.1f gap_us %.1f tput_mbit %.1f burst_bytes %llu burst_ms %.1f\n",
		    s.rtt_us_median, s.rtt_us_p90, s.rtt_us_min, s.sized_bytes,
		    s.sized_rtt_us_median, s.gap_us, s.tput_mbit, (unsigned long long)s.burst_bytes,
		    s.burst_ms);
	tp_chan_free(c);
	return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
	char err[128];
	if (sodium_init() < 0)
		return 1;
	tp_keys_set_cost_for_tests(1, 8192);
	if (tp_keys_derive(&K1, "probe-token", 11, err, sizeof err))
		return 1;
	if (argc > 2 && !strcmp(argv[1], "serve"))
		return lab_serve(atoi(argv[2]));
	if (argc > 3 && !strcmp(argv[1], "probe"))
		return lab_probe(argv[2], atoi(argv[3]), argc > 4 ? atoi(argv[4]) : 0);
	RUN(probe_against_answering_peer);
	RUN(both_sides_probe_at_once);
	RUN(event_loop_form);
	RUN(burst_time_bound);
	RUN(peer_that_never_answers);
	RUN(malformed_probes);
	RUN(bad_options);
	return harness_done();
}
