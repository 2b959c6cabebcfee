/* test_common.c: logging levels, error messages, file helpers. */
#include "common/common.h"
#include "harness.h"

#include <stdlib.h>

TEST(log_levels)
{
	CHECK_EQ_INT(log_level_parse("error"), LOG_ERROR);
	CHECK_EQ_INT(log_level_parse("WARN"), LOG_WARN);
	CHECK_EQ_INT(log_level_parse("info"), LOG_INFO);
	CHECK_EQ_INT(log_level_parse("debug"), LOG_DEBUG);
	CHECK_EQ_INT(log_level_parse("2"), 2);
	CHECK_EQ_INT(log_level_parse("loud"), -1);
	CHECK_EQ_INT(log_level_parse(NULL), -1);
}

static int formatted;
static int side_effect(void)
{
	return ++formatted;
}

TEST(log_skips_formatting_below_threshold)
{
	int saved = log_threshold;
	log_threshold = LOG_ERROR;
	formatted = 0;
	LOG(LOG_DEBUG, "never %d", side_effect());
	CHECK_EQ_INT(formatted, 0);
	log_threshold = saved;
}

TEST(errors_have_messages)
{
	for (int e = 0; e >= SH_ECANCELED; e--)
		CHECK(strcmp(sh_strerror(e), "unknown error") != 0);
	char buf[32];
	CHECK_EQ_INT(sh_fail(buf, sizeof buf, SH_EFORMAT, "bad %s", "magic"), SH_EFORMAT);
	CHECK_EQ_STR(buf, "bad magic");
}

TEST(atomic_write_and_read_back)
{
	char dir[] = "/tmp/shoal-test-XXXXXX";
	CHECK(mkdtemp(dir) != NULL);
	char sub[256], path[300], err[128];
	snprintf(sub, sizeof sub, "%s/a/b", dir);
	CHECK_EQ_INT(mkdir_p(sub, err, sizeof err), 0);
	snprintf(path, sizeof path, "%s/f.json", sub);
	CHECK_EQ_INT(write_file_atomic(path, "[1,2]", 5, err, sizeof err), 0);
	char *data = NULL;
	size_t len = 0;
	CHECK_EQ_INT(read_file_all(path, &data, &len, err, sizeof err), 0);
	CHECK_EQ_INT(len, 5);
	CHECK_EQ_STR(data, "[1,2]");
	free(data);
	CHECK_EQ_INT(read_file_all("/nonexistent/x", &data, &len, err, sizeof err), SH_ENOENT);
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	CHECK_EQ_INT(system(cmd), 0);
}

/* The shared helpers: FNV-1a against its published vectors, the share splitter's rules. */
TEST(fnv_and_split)
{
	CHECK(sh_fnv1a64(SH_FNV1A64_INIT, "", 0) == 0xcbf29ce484222325ULL);
	CHECK(sh_fnv1a64(SH_FNV1A64_INIT, "a", 1) == 0xaf63dc4c8601ec8cULL);
	CHECK(sh_fnv1a64(SH_FNV1A64_INIT, "foobar", 6) == 0x85944171f73967e8ULL);
	int out[3];
	const uint64_t w[3] = {2, 1, 1};
	sh_split_units(out, 3, 10, 1, w); /* 5, 2.5, 2.5: the tie goes to the lower index */
	CHECK(out[0] == 5 && out[1] == 3 && out[2] == 2);
	const uint64_t skew[3] = {1000, 1, 1};
	sh_split_units(out, 3, 4, 1, skew); /* minimums come from the largest share */
	CHECK(out[0] == 2 && out[1] == 1 && out[2] == 1);
}

TEST(size_parse)
{
	uint64_t v = 0, g = 1ull << 30;
	CHECK(sh_size_parse("8G", 16 * g, &v) == 0 && v == 8 * g);
	CHECK(sh_size_parse("1.5GiB", 16 * g, &v) == 0 && v == 3 * g / 2);
	CHECK(sh_size_parse("512M", 16 * g, &v) == 0 && v == g / 2);
	CHECK(sh_size_parse("50%", 16 * g, &v) == 0 && v == 8 * g);
	CHECK(sh_size_parse("1000000", 16 * g, &v) == 0 && v == 1000000);
	CHECK(sh_size_parse("foo", 16 * g, &v) == SH_EINVAL);
	CHECK(sh_size_parse("8X", 16 * g, &v) == SH_EINVAL);
	CHECK(sh_size_parse("0", 16 * g, &v) == SH_EINVAL);
	CHECK(sh_size_parse("150%", 16 * g, &v) == SH_EINVAL);
	CHECK(sh_size_parse("-1G", 16 * g, &v) == SH_EINVAL);
}

TEST(hex)
{
	uint8_t b[3] = {0x00, 0xab, 0xff}, back[3];
	char h[7];
	sh_hex_encode(h, b, 3);
	CHECK_EQ_STR(h, "00abff");
	CHECK_EQ_INT(sh_hex_decode(back, 3, "00ABff"), 0);
	CHECK(!memcmp(back, b, 3));
	CHECK_EQ_INT(sh_hex_decode(back, 3, "00abf"), SH_EFORMAT);
	CHECK_EQ_INT(sh_hex_decode(back, 3, "00abffe"), SH_EFORMAT);
	CHECK_EQ_INT(sh_hex_decode(back, 3, "00abfg"), SH_EFORMAT);
	CHECK_EQ_INT(sh_hex_decode(back, 3, NULL), SH_EFORMAT);
}

/* Linux's /proc/stat: busy never exceeds total, and a second of spinning shows as busy ticks. */
TEST(cpu_jiffies)
{
	unsigned long long b0, t0, b1, t1;
	if (sh_cpu_jiffies(&b0, &t0)) {
		CHECK(access("/proc/stat", R_OK) != 0); /* only where there is none */
		return;
	}
	int64_t end = now_ms() + 300;
	volatile unsigned long x = 0;
	while (now_ms() < end)
		x++;
	CHECK_EQ_INT(sh_cpu_jiffies(&b1, &t1), 0);
	CHECK(b0 <= t0 && b1 <= t1 && t1 > t0 && b1 > b0);
}

int main(void)
{
	RUN(cpu_jiffies);
	RUN(size_parse);
	RUN(hex);
	RUN(fnv_and_split);
	RUN(log_levels);
	RUN(log_skips_formatting_below_threshold);
	RUN(errors_have_messages);
	RUN(atomic_write_and_read_back);
	return harness_done();
}
