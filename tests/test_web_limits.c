/*
 * test_web_limits.c: the bounds web_req_parse puts on a body before jansson builds its tree
 * (web/request.c's pre-scan): nesting depth, objects and arrays, values; brackets and commas
 * inside strings (escaped quotes included) do not count. Pure: no server, no engine.
 */
#include "harness.h"

#include "web/web_int.h"

static int parse(const char *body, web_err_t *e)
{
	web_req_t r;
	int st = web_req_parse(&r, WEB_COMPLETION, body, strlen(body), e);
	web_req_clear(&r);
	return st;
}

/* "[[[...]]]" of depth n inside a request's "x" field */
static char *nested(int n)
{
	char *s = malloc((size_t)n * 2 + 64);
	int o = sprintf(s, "{\"prompt\":\"hi\",\"x\":");
	for (int i = 0; i < n; i++)
		s[o++] = '[';
	for (int i = 0; i < n; i++)
		s[o++] = ']';
	strcpy(s + o, "}");
	return s;
}

/* {"prompt":"hi","x":[ITEM,ITEM,...]} with n items */
static char *many(const char *item, int n)
{
	size_t il = strlen(item);
	char *s = malloc((il + 1) * (size_t)n + 64);
	int o = sprintf(s, "{\"prompt\":\"hi\",\"x\":[");
	for (int i = 0; i < n; i++) {
		memcpy(s + o, item, il);
		o += (int)il;
		s[o++] = i + 1 < n ? ',' : ']';
	}
	strcpy(s + o, "}");
	return s;
}

TEST(depth)
{
	web_err_t e;
	char *ok = nested(WEB_JSON_DEPTH_MAX - 1), *deep = nested(WEB_JSON_DEPTH_MAX + 1);
	CHECK_EQ_INT(parse(ok, &e), 0);
	CHECK_EQ_INT(parse(deep, &e), 413);
	CHECK(!strcmp(e.code, "request_too_complex"));
	free(ok);
	free(deep);
}

TEST(containers)
{
	web_err_t e;
	char *ok = many("{}", WEB_JSON_CONTAINERS_MAX / 2),
	     *big = many("{}", WEB_JSON_CONTAINERS_MAX);
	CHECK_EQ_INT(parse(ok, &e), 0);
	CHECK_EQ_INT(parse(big, &e), 413);
	CHECK(!strcmp(e.code, "request_too_complex"));
	free(ok);
	free(big);
}

TEST(values)
{
	web_err_t e;
	char *ok = many("1", WEB_JSON_VALUES_MAX / 2), *big = many("1", WEB_JSON_VALUES_MAX);
	CHECK_EQ_INT(parse(ok, &e), 0);
	CHECK_EQ_INT(parse(big, &e), 413);
	free(ok);
	free(big);
}

TEST(strings_do_not_count)
{
	/* a prompt full of commas, brackets and an escaped quote: one value */
	size_t n = 300000;
	char *s = malloc(n + 64);
	int o = sprintf(s, "{\"prompt\":\"a\\\"");
	for (size_t i = 0; i < n; i++)
		s[o++] = "[,{"[i % 3];
	strcpy(s + o, "\"}");
	web_err_t e;
	web_req_t r;
	CHECK_EQ_INT(web_req_parse(&r, WEB_COMPLETION, s, strlen(s), &e), 0);
	CHECK(r.prompt && strlen(r.prompt) == n + 2);
	web_req_clear(&r);
	free(s);
}

TEST(body_limit_is_below_a_mebibyte)
{
	CHECK(WEB_BODY_MAX <= (512u << 10));
}

int main(void)
{
	RUN(depth);
	RUN(containers);
	RUN(values);
	RUN(strings_do_not_count);
	RUN(body_limit_is_below_a_mebibyte);
	return harness_done();
}
