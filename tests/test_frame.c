/* test_frame.c: the frame codec and message structs (pure, no sockets). */
#include "common/common.h"
#include "harness.h"
#include "transport/frame.h"

TEST(build_parse_round_trip)
{
	uint8_t buf[64], out[64];
	const char msg[] = "hello";
	int64_t n = tp_frame_build(buf, sizeof buf, 0x0123, msg, 5);
	CHECK_EQ_INT(n, 4 + 2 + 5);
	uint16_t type = 0;
	const uint8_t *p = NULL;
	size_t plen = 0;
	CHECK_EQ_INT(tp_frame_parse(buf, (size_t)n, &type, &p, &plen), n);
	CHECK_EQ_INT(type, 0x0123);
	CHECK_EQ_INT(plen, 5);
	CHECK(p && memcmp(p, msg, 5) == 0);
	/* empty payload */
	n = tp_frame_build(out, sizeof out, 7, NULL, 0);
	CHECK_EQ_INT(n, 6);
	CHECK_EQ_INT(tp_frame_parse(out, 6, &type, &p, &plen), 6);
	CHECK_EQ_INT(plen, 0);
}

TEST(truncated_frames_need_more)
{
	uint8_t buf[64];
	int64_t n = tp_frame_build(buf, sizeof buf, 9, "abcdefgh", 8);
	uint16_t type;
	const uint8_t *p;
	size_t plen;
	for (int64_t i = 0; i < n; i++)
		CHECK_EQ_INT(tp_frame_parse(buf, (size_t)i, &type, &p, &plen), 0);
	CHECK_EQ_INT(tp_frame_parse(buf, (size_t)n, &type, &p, &plen), n);
}

TEST(malformed_and_oversized_frames)
{
	uint8_t buf[16] = {0};
	uint16_t type;
	const uint8_t *p;
	size_t plen;
	/* zero length */
	CHECK_EQ_INT(tp_frame_parse(buf, sizeof buf, &type, &p, &plen), SH_EFORMAT);
	/* body shorter than a type */
	tp_put32(buf, 1);
	CHECK_EQ_INT(tp_frame_parse(buf, sizeof buf, &type, &p, &plen), SH_EFORMAT);
	/* oversized: one past the limit, and all ones */
	tp_put32(buf, TP_FRAME_MAX_BODY + 1);
	CHECK_EQ_INT(tp_frame_parse(buf, sizeof buf, &type, &p, &plen), SH_EFORMAT);
	tp_put32(buf, 0xffffffffu);
	CHECK_EQ_INT(tp_frame_parse(buf, 4, &type, &p, &plen), SH_EFORMAT);
	CHECK_EQ_INT(tp_frame_hdr_parse(buf, 256), SH_EFORMAT);
	/* the limit itself is fine (needs more bytes) */
	tp_put32(buf, TP_FRAME_MAX_BODY);
	CHECK_EQ_INT(tp_frame_parse(buf, sizeof buf, &type, &p, &plen), 0);
	/* building too big a payload fails cleanly */
	CHECK_EQ_INT(tp_frame_build(buf, sizeof buf, 1, buf, TP_MAX_PAYLOAD + 1), SH_EINVAL);
	CHECK_EQ_INT(tp_frame_build(buf, sizeof buf, 1, buf, 11), SH_EINVAL);
}

TEST(hello_round_trip_and_errors)
{
	tp_hello_t h = {.magic = TP_PROTO_MAGIC, .version = TP_PROTO_VERSION, .flags = 3}, g;
	for (int i = 0; i < 16; i++)
		h.node_id[i] = (uint8_t)i;
	for (int i = 0; i < 8; i++)
		h.cid[i] = (uint8_t)(0xa0 + i);
	for (int i = 0; i < 32; i++)
		h.nonce[i] = (uint8_t)(0x50 + i);
	uint8_t w[TP_HELLO_WIRE];
	char err[128];
	tp_hello_encode(w, &h);
	CHECK(memcmp(w, "SHOL", 4) == 0);
	CHECK_EQ_INT(tp_hello_decode(&g, w, sizeof w, err, sizeof err), 0);
	CHECK(memcmp(&g, &h, sizeof h) == 0);
	CHECK_EQ_INT(tp_hello_decode(&g, w, sizeof w - 1, err, sizeof err), SH_EFORMAT);
	w[0] ^= 1;
	CHECK_EQ_INT(tp_hello_decode(&g, w, sizeof w, err, sizeof err), SH_EFORMAT);
	CHECK(strstr(err, "magic") != NULL);
	w[0] ^= 1;
	w[4] = 9;
	CHECK_EQ_INT(tp_hello_decode(&g, w, sizeof w, err, sizeof err), SH_EUNSUPP);
	CHECK(strstr(err, "version") != NULL);
}

TEST(join_and_coll_round_trip)
{
	tp_join_t j = {.rank = 3, .world = 5, .group = 0x1122334455667788ull}, k;
	uint8_t w[TP_JOIN_WIRE];
	tp_join_encode(w, &j);
	CHECK_EQ_INT(tp_join_decode(&k, w, sizeof w), 0);
	CHECK(k.rank == 3 && k.world == 5 && k.group == j.group);
	CHECK_EQ_INT(tp_join_decode(&k, w, sizeof w + 1), SH_EFORMAT);

	uint8_t cw[TP_COLL_WIRE + 8];
	tp_coll_t c = {.seq = 42, .op = 2, .step = 7, .offset = 1024, .len = 8}, d;
	tp_coll_encode(cw, &c);
	CHECK_EQ_INT(tp_coll_decode(&d, cw, sizeof cw), 0);
	CHECK(d.seq == 42 && d.op == 2 && d.step == 7 && d.offset == 1024 && d.len == 8);
	CHECK_EQ_INT(tp_coll_decode(&d, cw, sizeof cw - 1), SH_EFORMAT);
	CHECK_EQ_INT(tp_coll_decode(&d, cw, 3), SH_EFORMAT);
}

TEST(msg_names)
{
	char b[8];
	CHECK_EQ_STR(tp_msg_name(TP_MSG_HELLO, b, sizeof b), "HELLO");
	CHECK_EQ_STR(tp_msg_name(0x1234, b, sizeof b), "0x1234");
}

int main(void)
{
	RUN(build_parse_round_trip);
	RUN(truncated_frames_need_more);
	RUN(malformed_and_oversized_frames);
	RUN(hello_round_trip_and_errors);
	RUN(join_and_coll_round_trip);
	RUN(msg_names);
	return harness_done();
}
