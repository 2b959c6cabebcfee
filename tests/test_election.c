/*
 * test_election.c: the election core stepped as a whole simulated cluster on a fake clock, in the
 * style of canonical/raft's fixture. The simulator owns the links: a link is "up" (both nodes are
 * members of each other's view) when both nodes run and the link is connected and discovery has had
 * its delay; it delivers queued messages one step later and sends heartbeats every 300 ms.
 * Everything is deterministic (seeded LCG), so a failure reproduces exactly.
 */
#include "common/common.h"
#include "discovery/discovery.h"
#include "harness.h"

#define SIM_MAX 8
#define STEP    10 /* ms */

typedef struct sim_msg {
	int from, to;
	elec_msg_t m;
} sim_msg_t;

typedef struct sim {
	int n;
	int64_t now;
	elec_config_t cfg;
	elec_t *node[SIM_MAX];
	disc_id_t id[SIM_MAX];
	int alive[SIM_MAX];
	int64_t start[SIM_MAX];
	int cut[SIM_MAX][SIM_MAX];       /* 1: the network separates i and j */
	int64_t delay[SIM_MAX][SIM_MAX]; /* discovery delay once both run */
	int up[SIM_MAX][SIM_MAX];        /* what each side has been told */
	int64_t next_hb;
	sim_msg_t inflight[512];
	int ninflight;
	disc_id_t last_leader[SIM_MAX];
	int leader_changes[SIM_MAX]; /* changes to a different non-zero leader */
} sim_t;

static uint32_t rng_state;
static uint32_t rng(void)
{
	rng_state = rng_state * 1664525u + 1013904223u;
	return rng_state >> 8;
}

/* Node i gets an ID whose order is i (node 0 is the smallest), with noisy low bytes. */
static disc_id_t make_id(int i)
{
	disc_id_t id;
	for (int k = 0; k < DISC_ID_LEN; k++)
		id.b[k] = (uint8_t)rng();
	id.b[0] = (uint8_t)(0x10 + i);
	return id;
}

static void sim_init(sim_t *s, int n, int64_t settle, int expect)
{
	memset(s, 0, sizeof *s);
	s->n = n;
	s->cfg = (elec_config_t){
	    .settle_ms = settle, .expect = expect, .grace_ms = 1000, .hold_ms = 5000};
	for (int i = 0; i < n; i++) {
		s->id[i] = make_id(i);
		s->start[i] = 0;
		for (int j = 0; j < n; j++)
			s->delay[i][j] = 900;
	}
}

static void sim_free(sim_t *s)
{
	for (int i = 0; i < s->n; i++)
		elec_free(s->node[i]);
}

static int linked(const sim_t *s, int i, int j)
{
	int64_t since = MAX(s->start[i], s->start[j]) + s->delay[MIN(i, j)][MAX(i, j)];
	return i != j && s->node[i] && s->node[j] && s->alive[i] && s->alive[j] && !s->cut[i][j] &&
	       s->now >= since;
}

static void deliver(sim_t *s, const sim_msg_t *sm)
{
	elec_t *e = s->node[sm->to];
	if (!e || !s->alive[sm->to] || !s->up[sm->to][sm->from])
		return; /* the connection is gone: TCP would not deliver */
	if (sm->m.type == DISC_MSG_LEADER)
		elec_on_leader(e, &s->id[sm->from], sm->m.epoch, sm->m.members, sm->m.n, s->now);
	else if (sm->m.type == DISC_MSG_SMALLER)
		elec_on_smaller(e, &s->id[sm->from], &sm->m.subject, s->now);
}

static int index_of(const sim_t *s, const disc_id_t *id)
{
	for (int i = 0; i < s->n; i++)
		if (!disc_id_cmp(&s->id[i], id))
			return i;
	return -1;
}

static void sim_step(sim_t *s)
{
	s->now += STEP;
	for (int i = 0; i < s->n; i++)
		if (!s->node[i] && s->alive[i] && s->now >= s->start[i])
			s->node[i] = elec_new(&s->id[i], &s->cfg, s->now);
	/* last step's messages arrive */
	sim_msg_t batch[512];
	int nb = s->ninflight;
	memcpy(batch, s->inflight, (size_t)nb * sizeof batch[0]);
	s->ninflight = 0;
	for (int k = 0; k < nb; k++)
		deliver(s, &batch[k]);
	/* membership follows the links */
	for (int i = 0; i < s->n; i++)
		for (int j = 0; j < s->n; j++) {
			if (i == j || !s->node[i] || !s->alive[i])
				continue;
			int l = linked(s, i, j);
			if (l && !s->up[i][j])
				elec_member_up(s->node[i], &s->id[j], s->now);
			else if (!l && s->up[i][j])
				elec_member_down(s->node[i], &s->id[j], s->now);
			s->up[i][j] = l;
		}
	for (int i = 0; i < s->n; i++)
		if (s->node[i] && s->alive[i])
			elec_tick(s->node[i], s->now);
	/* heartbeats */
	if (s->now >= s->next_hb) {
		s->next_hb = s->now + 300;
		for (int i = 0; i < s->n; i++) {
			if (!s->node[i] || !s->alive[i])
				continue;
			disc_id_t l;
			elec_leader(s->node[i], &l);
			for (int j = 0; j < s->n; j++)
				if (s->up[j][i] && s->alive[j])
					elec_on_heartbeat(
					    s->node[j], &s->id[i], elec_epoch(s->node[i]), &l,
					    elec_state(s->node[i]) == ELEC_LEADER, s->now);
		}
	}
	/* queued messages leave */
	for (int i = 0; i < s->n; i++) {
		elec_msg_t m;
		while (s->node[i] && s->alive[i] && elec_next_msg(s->node[i], &m)) {
			for (int j = 0; j < s->n; j++) {
				if (!s->up[i][j])
					continue;
				if (!m.broadcast && disc_id_cmp(&m.to, &s->id[j]))
					continue;
				if (s->ninflight < (int)ARRAY_LEN(s->inflight))
					s->inflight[s->ninflight++] = (sim_msg_t){i, j, m};
			}
		}
	}
	for (int i = 0; i < s->n; i++) {
		if (!s->node[i] || !s->alive[i])
			continue;
		disc_id_t l;
		if (elec_leader(s->node[i], &l) && disc_id_cmp(&l, &s->last_leader[i])) {
			if (!disc_id_is_zero(&s->last_leader[i]))
				s->leader_changes[i]++;
			s->last_leader[i] = l;
		}
	}
}

static void sim_run(sim_t *s, int64_t ms)
{
	int64_t end = s->now + ms;
	while (s->now < end)
		sim_step(s);
}

/* Runs until every running node in `group` (bitmask) agrees on `leader` (an index) with the same
 * epoch and the group as view, or the deadline passes. Returns the time it took, or -1. */
static int64_t sim_until_agree(sim_t *s, unsigned group, int leader, int64_t deadline_ms)
{
	int64_t t0 = s->now;
	while (s->now - t0 <= deadline_ms) {
		int ok = 1;
		uint64_t epoch = 0;
		for (int i = 0; i < s->n && ok; i++) {
			if (!(group >> i & 1))
				continue;
			elec_t *e = s->node[i];
			disc_id_t l;
			if (!e || !elec_leader(e, &l) || index_of(s, &l) != leader) {
				ok = 0;
				break;
			}
			if (elec_state(e) != (i == leader ? ELEC_LEADER : ELEC_FOLLOWER))
				ok = 0;
			if (epoch && elec_epoch(e) != epoch)
				ok = 0;
			epoch = elec_epoch(e);
			int cnt = 0;
			for (int j = 0; j < s->n; j++)
				if (group >> j & 1) {
					cnt++;
					if (!elec_is_member(e, &s->id[j]))
						ok = 0;
				}
			if (elec_member_count(e) != cnt)
				ok = 0;
		}
		if (ok)
			return s->now - t0;
		sim_step(s);
	}
	return -1;
}

static int count_leaders(const sim_t *s)
{
	int c = 0;
	for (int i = 0; i < s->n; i++)
		if (s->node[i] && s->alive[i] && elec_state(s->node[i]) == ELEC_LEADER)
			c++;
	return c;
}

TEST(concurrent_starts_give_one_leader)
{
	int worst = 0;
	for (int seed = 1; seed <= 60; seed++) {
		rng_state = (uint32_t)seed;
		sim_t s;
		int n = 3 + seed % 4;
		sim_init(&s, n, 1000, 0);
		for (int i = 0; i < n; i++) {
			s.alive[i] = 1;
			s.start[i] = rng() % 800;
			for (int j = i + 1; j < n; j++)
				s.delay[i][j] = 700 + rng() % 600;
		}
		int64_t t = sim_until_agree(&s, (1u << n) - 1, 0, 10000);
		CHECK(t >= 0);
		sim_run(&s, 3000);
		CHECK_EQ_INT(count_leaders(&s), 1);
		for (int i = 0; i < n; i++) {
			CHECK(s.leader_changes[i] == 0); /* no flapping: one leader ever */
			worst = MAX(worst, s.leader_changes[i]);
		}
		sim_free(&s);
	}
	CHECK_EQ_INT(worst, 0);
}

TEST(expect_settles_at_once)
{
	rng_state = 7;
	sim_t s;
	sim_init(&s, 3, 1000, 3);
	for (int i = 0; i < 3; i++)
		s.alive[i] = 1;
	/* links appear at 900 ms; with --expect 3 agreement needs no settle wait */
	int64_t t = sim_until_agree(&s, 7, 0, 5000);
	CHECK(t >= 0 && t < 1000);
	sim_free(&s);
}

TEST(leader_loss_next_smallest_takes_over)
{
	rng_state = 11;
	sim_t s;
	sim_init(&s, 4, 1000, 0);
	for (int i = 0; i < 4; i++)
		s.alive[i] = 1;
	CHECK(sim_until_agree(&s, 15, 0, 5000) >= 0);
	uint64_t e0 = elec_epoch(s.node[1]);
	s.alive[0] = 0; /* kill -9 */
	int64_t t = sim_until_agree(&s, 14, 1, 5000);
	CHECK(t >= 0 && t <= 1100);
	CHECK(elec_epoch(s.node[1]) > e0);
	CHECK_EQ_INT(count_leaders(&s), 1);
	sim_free(&s);
}

TEST(follower_loss_leaves_every_view)
{
	rng_state = 12;
	sim_t s;
	sim_init(&s, 3, 1000, 0);
	for (int i = 0; i < 3; i++)
		s.alive[i] = 1;
	CHECK(sim_until_agree(&s, 7, 0, 5000) >= 0);
	uint64_t e0 = elec_epoch(s.node[0]);
	s.alive[2] = 0;
	CHECK(sim_until_agree(&s, 3, 0, 5000) >= 0);
	sim_run(&s, 1200); /* the leader re-announces the smaller view once it settles */
	CHECK(sim_until_agree(&s, 3, 0, 100) >= 0);
	CHECK(elec_epoch(s.node[0]) > e0);
	CHECK(!elec_is_member(s.node[0], &s.id[2]) && !elec_is_member(s.node[1], &s.id[2]));
	CHECK_EQ_INT(s.leader_changes[0] + s.leader_changes[1], 0);
	sim_free(&s);
}

TEST(larger_node_joining_keeps_the_leader)
{
	rng_state = 13;
	sim_t s;
	sim_init(&s, 3, 1000, 0);
	s.alive[0] = s.alive[1] = s.alive[2] = 1;
	s.start[2] = 4000;
	CHECK(sim_until_agree(&s, 3, 0, 5000) >= 0);
	CHECK(sim_until_agree(&s, 7, 0, 8000) >= 0);
	for (int i = 0; i < 3; i++)
		CHECK_EQ_INT(s.leader_changes[i], 0);
	sim_free(&s);
}

TEST(partitions_that_heal)
{
	rng_state = 14;
	sim_t s;
	sim_init(&s, 4, 1000, 0);
	for (int i = 0; i < 4; i++)
		s.alive[i] = 1;
	CHECK(sim_until_agree(&s, 15, 0, 5000) >= 0);
	for (int i = 0; i < 2; i++)
		for (int j = 2; j < 4; j++)
			s.cut[i][j] = s.cut[j][i] = 1;
	CHECK(sim_until_agree(&s, 3, 0, 5000) >= 0);
	CHECK(sim_until_agree(&s, 12, 2, 5000) >= 0);
	CHECK_EQ_INT(count_leaders(&s), 2); /* each side goes on alone */
	uint64_t ea = elec_epoch(s.node[0]), eb = elec_epoch(s.node[2]);
	memset(s.cut, 0, sizeof s.cut);
	CHECK(sim_until_agree(&s, 15, 0, 5000) >= 0);
	sim_run(&s, 2000);
	CHECK(sim_until_agree(&s, 15, 0, 100) >= 0);
	CHECK(elec_epoch(s.node[0]) > MAX(ea, eb));
	CHECK_EQ_INT(count_leaders(&s), 1);
	sim_free(&s);
}

TEST(follower_tells_leader_about_smaller_node)
{
	rng_state = 15;
	sim_t s;
	sim_init(&s, 3, 1000, 0);
	for (int i = 0; i < 3; i++)
		s.alive[i] = 1;
	s.cut[0][1] = s.cut[1][0] = 1; /* 0 and 1 cannot see each other; 2 sees both */
	sim_run(&s, 6000);
	CHECK_EQ_INT(elec_state(s.node[0]), ELEC_LEADER);
	CHECK(elec_state(s.node[1]) != ELEC_LEADER);
	disc_id_t h;
	CHECK(elec_hint(s.node[1], &h) && !disc_id_cmp(&h, &s.id[0]));
	disc_id_t l;
	CHECK(elec_leader(s.node[2], &l) && !disc_id_cmp(&l, &s.id[0]));
	/* the link heals: 1 joins 0's view and follows it */
	s.cut[0][1] = s.cut[1][0] = 0;
	CHECK(sim_until_agree(&s, 7, 0, 5000) >= 0);
	sim_free(&s);
}

TEST(lone_node_waits_for_grace)
{
	rng_state = 16;
	sim_t s;
	sim_init(&s, 1, 1000, 0);
	s.alive[0] = 1;
	sim_run(&s, 1500);
	CHECK_EQ_INT(elec_state(s.node[0]), ELEC_UNSETTLED);
	sim_run(&s, 600);
	CHECK_EQ_INT(elec_state(s.node[0]), ELEC_LEADER);
	sim_free(&s);
}

TEST(leader_codec)
{
	elec_msg_t m = {.type = DISC_MSG_LEADER, .epoch = 0x0102030405060708ull, .n = 3};
	rng_state = 3;
	m.subject = make_id(0);
	for (int i = 0; i < 3; i++)
		m.members[i] = make_id(i);
	uint8_t buf[24 + 16 * ELEC_MAX_MEMBERS];
	int len = disc_leader_encode(&m, buf, sizeof buf);
	CHECK_EQ_INT(len, 24 + 48);
	uint64_t ep;
	disc_id_t l, mem[ELEC_MAX_MEMBERS];
	int n;
	CHECK_EQ_INT(disc_leader_decode(buf, (size_t)len, &ep, &l, mem, &n), 0);
	CHECK(ep == m.epoch && n == 3 && !disc_id_cmp(&l, &m.subject) &&
	      !disc_id_cmp(&mem[2], &m.members[2]));
	CHECK_EQ_INT(disc_leader_decode(buf, 10, &ep, &l, mem, &n), SH_EFORMAT);
	CHECK_EQ_INT(disc_leader_decode(buf, (size_t)len - 1, &ep, &l, mem, &n), SH_EFORMAT);
	CHECK_EQ_INT(disc_leader_encode(&m, buf, 30), SH_EINVAL);
	static uint8_t big[24 + 16 * (ELEC_MAX_MEMBERS + 1)];
	CHECK_EQ_INT(disc_leader_decode(big, sizeof big, &ep, &l, mem, &n), SH_EFORMAT);
}

TEST(heartbeat_codec)
{
	disc_wire_heartbeat_t w;
	disc_id_t l = make_id(2), l2;
	disc_heartbeat_encode(&w, 42, &l, ELEC_FOLLOWER, 5);
	uint64_t ep;
	int st, nm;
	CHECK_EQ_INT(disc_heartbeat_decode((uint8_t *)&w, sizeof w, &ep, &l2, &st, &nm), 0);
	CHECK(ep == 42 && st == ELEC_FOLLOWER && nm == 5 && !disc_id_cmp(&l, &l2));
	CHECK_EQ_INT(disc_heartbeat_decode((uint8_t *)&w, sizeof w - 1, &ep, &l2, &st, &nm),
		     SH_EFORMAT);
	w.state = 9;
	CHECK_EQ_INT(disc_heartbeat_decode((uint8_t *)&w, sizeof w, &ep, &l2, &st, &nm),
		     SH_EFORMAT);
}

int main(void)
{
	log_threshold = LOG_WARN; /* the simulated cluster logs every transition at info */
	RUN(concurrent_starts_give_one_leader);
	RUN(expect_settles_at_once);
	RUN(leader_loss_next_smallest_takes_over);
	RUN(follower_loss_leaves_every_view);
	RUN(larger_node_joining_keeps_the_leader);
	RUN(partitions_that_heal);
	RUN(follower_tells_leader_about_smaller_node);
	RUN(lone_node_waits_for_grace);
	RUN(leader_codec);
	RUN(heartbeat_codec);
	return harness_done();
}
