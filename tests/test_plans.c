/* test_plans.c: the agent's plan store (agent/plans.h) and its messages (agent/node.h): a plan
 * made here and the same plan received as text describe one plan to the core (hash, epoch,
 * ranks) under two handles; the store keeps exactly the handles it is told to; handles are never
 * reused; bad input is an error value. */
#include "agent/node.h"
#include "agent/plans.h"
#include "common/common.h"
#include "harness.h"

#include <stdlib.h>
#include <string.h>

static const char *const IDS[2] = {"0a000000000000000000000000000001",
				   "0b000000000000000000000000000002"};

/* A view of two nodes on one /24 with 1 GiB each. */
static plan_view_t *two_nodes(void)
{
	plan_view_t *v = calloc(1, sizeof *v);
	v->nodes = calloc(2, sizeof *v->nodes);
	v->epoch = 7;
	for (int i = 0; i < 2; i++) {
		node_desc_t d = {.have = 1, .naddrs = 1, .kind = {PLAN_LINK_ETHERNET}};
		snprintf(d.ip[0], PLAN_IP_MAX, "10.9.0.%d", i + 1);
		snprintf(d.ifname[0], PLAN_IFNAME_MAX, "eth0");
		CHECK_EQ_INT(node_to_plan(&v->nodes[v->n_nodes++], IDS[i], "h", 7411, 1ull << 30, 0,
					  2, "", &d),
			     0);
	}
	return v;
}

TEST(made_and_received_are_one_plan)
{
	const char *model = harness_stories();
	if (!model)
		SKIP("stories260K.gguf not found");
	char err[512];
	plans_t *ps = plans_new();
	plan_view_t *v = two_nodes();
	plan_opts_t o;
	plan_opts_default(&o);
	core_plan_t made, got, again;
	CHECK(plans_model(ps) == NULL);
	CHECK_EQ_INT(plans_make(ps, v, model, &o, &made, err, sizeof err), 0);
	CHECK(plans_model(ps) != NULL); /* the shapes, read once */
	CHECK(made.handle != 0);
	CHECK_EQ_INT(made.n, 2);
	CHECK_EQ_INT((int)made.epoch, 7);
	const char *text = plans_text(ps, made.handle);
	CHECK(text != NULL);
	CHECK(plans_get(ps, made.handle) != NULL);
	/* the text as a member receives it: the same plan, another handle */
	CHECK_EQ_INT(plans_receive(ps, (const uint8_t *)text, strlen(text), &got, err, sizeof err),
		     0);
	CHECK(got.handle != made.handle);
	CHECK_EQ_STR(got.hash, made.hash);
	CHECK(got.epoch == made.epoch && got.n == made.n);
	CHECK(!memcmp(got.ranks, made.ranks, sizeof made.ranks[0] * (size_t)made.n));
	/* keep only the received one: the made one is gone, its handle finds nothing */
	plans_keep(ps, &got.handle, 1);
	CHECK(plans_get(ps, made.handle) == NULL);
	CHECK(plans_text(ps, made.handle) == NULL);
	CHECK(plans_get(ps, got.handle) != NULL);
	CHECK(plans_get(ps, 0) == NULL);
	/* handles are never reused */
	CHECK_EQ_INT(plans_make(ps, v, model, &o, &again, err, sizeof err), 0);
	CHECK(again.handle != made.handle && again.handle != got.handle);
	plans_keep(ps, NULL, 0);
	CHECK(plans_get(ps, got.handle) == NULL && plans_get(ps, again.handle) == NULL);
	plan_view_free(v);
	plans_free(ps);
}

TEST(bad_plans_are_errors)
{
	char err[512] = "";
	plans_t *ps = plans_new();
	core_plan_t cp;
	static const char *const bad[] = {"", "{", "[]", "{\"hash\":\"00\"}", "null"};
	for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
		err[0] = 0;
		CHECK(plans_receive(ps, (const uint8_t *)bad[i], strlen(bad[i]), &cp, err,
				    sizeof err) != 0);
		CHECK(err[0] != 0);
	}
	plan_view_t v = {0};
	plan_opts_t o;
	plan_opts_default(&o);
	CHECK_EQ_INT(plans_make(ps, &v, NULL, &o, &cp, err, sizeof err), SH_ENOENT);
	plans_free(ps);
	plans_free(NULL);
}

/* NODE, ACK and EXCLUDED survive their own codecs; a malformed one is an error value. */
TEST(messages)
{
	node_desc_t d = {.have = 1, .http_port = 8080, .sync_port = 40000, .model_size = 1234,
			 .mem_avail = 1ull << 33, .naddrs = 1, .kind = {PLAN_LINK_WIFI},
			 .prefix = {24}};
	snprintf(d.model_hash, sizeof d.model_hash, "%064d", 5);
	snprintf(d.ip[0], PLAN_IP_MAX, "192.168.1.7");
	snprintf(d.ifname[0], PLAN_IFNAME_MAX, "en0");
	char *s = node_desc_json(&d);
	node_desc_t back;
	CHECK(s && node_desc_parse(&back, (const uint8_t *)s, strlen(s)) == 0);
	CHECK(back.have && back.http_port == 8080 && back.sync_port == 40000);
	CHECK(back.model_size == 1234 && back.mem_avail == d.mem_avail);
	CHECK_EQ_STR(back.model_hash, d.model_hash);
	CHECK(back.naddrs == 1 && back.kind[0] == PLAN_LINK_WIFI && back.prefix[0] == 24);
	CHECK_EQ_STR(back.ip[0], "192.168.1.7");
	free(s);
	static const char *const bad[] = {"", "{}", "{\"http_port\":70000,\"addrs\":[]}",
					  "{\"http_port\":1,\"addrs\":[{\"ip\":1}]}",
					  "{\"http_port\":1,\"addrs\":[],\"model\":{\"hash\":\"ab\"}}"};
	for (size_t i = 0; i < ARRAY_LEN(bad); i++)
		CHECK_EQ_INT(node_desc_parse(&back, (const uint8_t *)bad[i], strlen(bad[i])),
			     SH_EFORMAT);
	node_ack_t a;
	s = node_ack_json("0123456789abcdef", CORE_ACK_SERVING, "", 42);
	CHECK(s && node_ack_parse(&a, (const uint8_t *)s, strlen(s)) == 0);
	CHECK_EQ_STR(a.hash, "0123456789abcdef");
	CHECK(a.ack == CORE_ACK_SERVING && a.epoch == 42);
	free(s);
	CHECK_EQ_INT(node_ack_parse(&a, (const uint8_t *)"{\"state\":\"idle\"}", 16), SH_EFORMAT);
	char why[16];
	node_excluded_text(why, sizeof why, (const uint8_t *)"a\nb\tc and more", 15);
	CHECK_EQ_STR(why, "a b c and more");
}

int main(void)
{
	log_threshold = LOG_ERROR;
	RUN(made_and_received_are_one_plan);
	RUN(bad_plans_are_errors);
	RUN(messages);
	return harness_done();
}
