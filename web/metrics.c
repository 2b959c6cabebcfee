/*
 * metrics.c: the server's counters and gauges and their Prometheus text form (GET /metrics).
 *
 * Invariant: every field is read and written under m->mu except tokens_live, an atomic bumped
 * once per generated token by the scheduler thread (so the dashboard's rate moves during a long
 * reply, not only when it ends).
 *
 * Continuous batching adds three histograms (time to first token, inter-token latency, sequences
 * per step) with fixed buckets, and the state of every KV slot after the last step.
 *
 * Which API each request used (chat, completions, messages, responses, ollama.chat,
 * embeddings, ...): a total per API (shoal_api_requests_total{api}); the dashboard's request
 * table has the API of each row (history.c).
 */
#include "web/web_int.h"

#include <jansson.h>
#include <string.h>

#include "common/common.h"

static const double LAT_LE[WEB_HIST_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
						1,     2.5,  5,     10,   30,  60,   120};
static const double BATCH_LE[WEB_HIST_BUCKETS] = {1,  2,  3,  4,  6,  8,   12,
						  16, 24, 32, 48, 64, 128, 256};

void web_hist_add(web_hist_t *h, double v)
{
	int i = 0;
	while (i < WEB_HIST_BUCKETS && v > h->le[i])
		i++;
	h->cnt[i]++;
	h->count++;
	h->sum += v;
}

double web_hist_quantile(const web_hist_t *h, double q)
{
	if (!h->count)
		return 0;
	double want = q * (double)h->count, seen = 0;
	for (int i = 0; i <= WEB_HIST_BUCKETS; i++) {
		if (seen + (double)h->cnt[i] >= want && h->cnt[i]) {
			double lo = i ? h->le[i - 1] : 0;
			double hi = i < WEB_HIST_BUCKETS ? h->le[i] : h->le[WEB_HIST_BUCKETS - 1];
			return lo + (hi - lo) * (want - seen) / (double)h->cnt[i];
		}
		seen += (double)h->cnt[i];
	}
	return h->le[WEB_HIST_BUCKETS - 1];
}

/* Prometheus histogram lines: cumulative buckets, sum, count. */
static int hist_prom(web_buf_t *o, const char *name, const char *help, const web_hist_t *h)
{
	int rc = web_buf_addf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
	uint64_t cum = 0;
	for (int i = 0; i < WEB_HIST_BUCKETS; i++) {
		cum += h->cnt[i];
		rc |= web_buf_addf(o, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i],
				   (unsigned long long)cum);
	}
	rc |= web_buf_addf(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
			   (unsigned long long)h->count, name, h->sum, name,
			   (unsigned long long)h->count);
	return rc;
}

static const char *slot_state_name(int st)
{
	return st == 1 ? "prefill" : st == 2 ? "decode" : "free";
}

json_t *web_metrics_batch_json(web_metrics_t *m)
{
	char slots[WEB_MAX_SLOTS + 1];
	pthread_mutex_lock(&m->mu);
	int n = m->n_slots, active = 0;
	for (int i = 0; i < n; i++) {
		slots[i] = "FPD"[m->slot_state[i] % 3];
		active += m->slot_state[i] != 0;
	}
	slots[n] = 0;
	json_t *o =
	    json_pack("{s:s, s:i, s:i, s:f, s:f, s:f, s:f, s:f}", "slots", slots, "n_slots", n,
		      "active_slots", active, "ttft_p50", web_hist_quantile(&m->ttft, 0.5),
		      "ttft_p95", web_hist_quantile(&m->ttft, 0.95), "itl_p50",
		      web_hist_quantile(&m->itl, 0.5), "itl_p95", web_hist_quantile(&m->itl, 0.95),
		      "batch_mean", m->batch.count ? m->batch.sum / (double)m->batch.count : 0.0);
	const eng_spec_stats_t *sp = &m->spec;
	json_t *spec = json_pack(
	    "{s:s, s:f, s:f, s:f, s:f, s:I, s:I}", "mode", m->spec_mode ? m->spec_mode : "off",
	    "acceptance", sp->drafted ? (double)sp->accepted / (double)sp->drafted : 0.0,
	    "tokens_per_verify", sp->verifies ? (double)sp->emitted / (double)sp->verifies : 0.0,
	    "draft_len", sp->draft_len, "draft_ms", sp->draft_ms, "drafted",
	    (json_int_t)sp->drafted, "accepted", (json_int_t)sp->accepted);
	pthread_mutex_unlock(&m->mu);
	if (o && spec)
		json_object_set_new(o, "spec", spec);
	else
		json_decref(spec);
	return o;
}

void web_metrics_init(web_metrics_t *m)
{
	memset(m, 0, sizeof *m);
	m->ttft.le = LAT_LE;
	m->itl.le = LAT_LE;
	m->batch.le = BATCH_LE;
	pthread_mutex_init(&m->mu, NULL);
	atomic_init(&m->tokens_live, 0);
	m->step_ms = -1;
	m->comm_ms = -1;
	memset(m->rank_ok, -1, sizeof m->rank_ok);
}

void web_metrics_destroy(web_metrics_t *m)
{
	pthread_mutex_destroy(&m->mu);
}

void web_metrics_status(web_metrics_t *m, int status)
{
	pthread_mutex_lock(&m->mu);
	if (status >= 100 && status < (int)ARRAY_LEN(m->by_status))
		m->by_status[status]++;
	m->api_requests++;
	pthread_mutex_unlock(&m->mu);
}

void web_metrics_finished(web_metrics_t *m, const eng_result_t *r)
{
	pthread_mutex_lock(&m->mu);
	m->prompt_tokens += (uint64_t)MAX(r->prompt_tokens, 0);
	m->completion_tokens += (uint64_t)MAX(r->completion_tokens, 0);
	if (r->completion_tokens > 0 && r->gen_ms > 0) {
		m->last_tps = r->completion_tokens * 1000.0 / r->gen_ms;
		/* Without figures from a distributed engine, a step is one decoded token. */
		if (!m->step_external)
			m->step_ms = r->gen_ms / r->completion_tokens;
	}
	pthread_mutex_unlock(&m->mu);
}

void web_metrics_request(web_metrics_t *m, int api)
{
	if (api < 0 || api >= WEB_API_N)
		return;
	pthread_mutex_lock(&m->mu);
	m->by_api[api]++;
	pthread_mutex_unlock(&m->mu);
}

static const char *state_name(int st)
{
	switch (st) {
	case WEB_SERVING: return "serving";
	case WEB_FORMING: return "forming";
	case WEB_LOADING: return "loading";
	case WEB_REPLANNING: return "replanning";
	}
	return "stopping";
}

const char *web_state_name(int st)
{
	return state_name(st);
}

int web_metrics_prometheus(web_metrics_t *m, web_buf_t *o, int queued, int running, int state)
{
	int rc = 0;
	pthread_mutex_lock(&m->mu);
	rc |= web_buf_addf(o, "# HELP shoal_requests_total API requests answered, by HTTP status.\n"
			      "# TYPE shoal_requests_total counter\n");
	for (size_t s = 100; s < ARRAY_LEN(m->by_status); s++)
		if (m->by_status[s])
			rc |= web_buf_addf(o, "shoal_requests_total{status=\"%zu\"} %llu\n", s,
					   (unsigned long long)m->by_status[s]);
	rc |= web_buf_addf(o, "# HELP shoal_api_requests_total Generation and embedding requests "
			      "that ended, by the API they came through.\n"
			      "# TYPE shoal_api_requests_total counter\n");
	for (int a = 0; a < WEB_API_N; a++)
		rc |= web_buf_addf(o, "shoal_api_requests_total{api=\"%s\"} %llu\n",
				   web_api_name(a), (unsigned long long)m->by_api[a]);
	rc |= web_buf_addf(
	    o,
	    "# HELP shoal_prompt_tokens_total Prompt tokens of finished requests.\n"
	    "# TYPE shoal_prompt_tokens_total counter\n"
	    "shoal_prompt_tokens_total %llu\n"
	    "# HELP shoal_generated_tokens_total Tokens generated by finished requests.\n"
	    "# TYPE shoal_generated_tokens_total counter\n"
	    "shoal_generated_tokens_total %llu\n",
	    (unsigned long long)m->prompt_tokens, (unsigned long long)m->completion_tokens);
	rc |= web_buf_addf(o,
			   "# HELP shoal_tokens_generated_live_total Tokens generated, counted as "
			   "they are sampled.\n"
			   "# TYPE shoal_tokens_generated_live_total counter\n"
			   "shoal_tokens_generated_live_total %llu\n",
			   (unsigned long long)atomic_load(&m->tokens_live));
	rc |= web_buf_addf(
	    o,
	    "# HELP shoal_tokens_per_second Decode speed of the last finished request.\n"
	    "# TYPE shoal_tokens_per_second gauge\n"
	    "shoal_tokens_per_second %.3f\n"
	    "# HELP shoal_queue_depth Requests waiting (not counting the running one).\n"
	    "# TYPE shoal_queue_depth gauge\n"
	    "shoal_queue_depth %d\n"
	    "# HELP shoal_requests_running Requests being generated now.\n"
	    "# TYPE shoal_requests_running gauge\n"
	    "shoal_requests_running %d\n",
	    m->last_tps, queued, running);
	if (m->step_ms >= 0)
		rc |= web_buf_addf(o,
				   "# HELP shoal_step_seconds Time of one decode step.\n"
				   "# TYPE shoal_step_seconds gauge\n"
				   "shoal_step_seconds %.6f\n",
				   m->step_ms / 1000.0);
	if (m->comm_ms >= 0)
		rc |= web_buf_addf(o,
				   "# HELP shoal_communication_seconds Part of a decode step spent "
				   "communicating between ranks.\n"
				   "# TYPE shoal_communication_seconds gauge\n"
				   "shoal_communication_seconds %.6f\n",
				   m->comm_ms / 1000.0);
	rc |= hist_prom(o, "shoal_time_to_first_token_seconds",
			"From acceptance to the first generated token.", &m->ttft);
	rc |= hist_prom(o, "shoal_inter_token_seconds", "Between consecutive tokens of a request.",
			&m->itl);
	rc |=
	    hist_prom(o, "shoal_batch_size", "Sequences computed together in one step.", &m->batch);
	rc |= web_buf_addf(o,
			   "# HELP shoal_slots KV slots (sequences run together).\n"
			   "# TYPE shoal_slots gauge\nshoal_slots %d\n"
			   "# HELP shoal_slot_state State of each KV slot after the last step.\n"
			   "# TYPE shoal_slot_state gauge\n",
			   m->n_slots);
	for (int i = 0; i < m->n_slots; i++)
		for (int st = 0; st < 3; st++)
			rc |= web_buf_addf(o, "shoal_slot_state{slot=\"%d\",state=\"%s\"} %d\n", i,
					   slot_state_name(st), m->slot_state[i] == st);
	if (m->spec_mode && strcmp(m->spec_mode, "off")) {
		const eng_spec_stats_t *sp = &m->spec;
		rc |= web_buf_addf(
		    o,
		    "# HELP shoal_spec_drafted_tokens_total Drafted tokens verified (speculative "
		    "decoding).\n"
		    "# TYPE shoal_spec_drafted_tokens_total counter\n"
		    "shoal_spec_drafted_tokens_total %llu\n"
		    "# HELP shoal_spec_accepted_tokens_total Drafted tokens the model accepted.\n"
		    "# TYPE shoal_spec_accepted_tokens_total counter\n"
		    "shoal_spec_accepted_tokens_total %llu\n"
		    "# HELP shoal_spec_verify_steps_total Sequence steps that verified a draft.\n"
		    "# TYPE shoal_spec_verify_steps_total counter\n"
		    "shoal_spec_verify_steps_total %llu\n"
		    "# HELP shoal_spec_acceptance_rate Accepted over drafted tokens.\n"
		    "# TYPE shoal_spec_acceptance_rate gauge\n"
		    "shoal_spec_acceptance_rate{mode=\"%s\"} %.4f\n"
		    "# HELP shoal_spec_tokens_per_verify Tokens produced per verifying step of a "
		    "sequence.\n"
		    "# TYPE shoal_spec_tokens_per_verify gauge\n"
		    "shoal_spec_tokens_per_verify %.4f\n"
		    "# HELP shoal_spec_draft_length Mean length of the recent drafts.\n"
		    "# TYPE shoal_spec_draft_length gauge\n"
		    "shoal_spec_draft_length %.3f\n"
		    "# HELP shoal_spec_draft_seconds_total Time spent drafting.\n"
		    "# TYPE shoal_spec_draft_seconds_total counter\n"
		    "shoal_spec_draft_seconds_total %.6f\n",
		    (unsigned long long)sp->drafted, (unsigned long long)sp->accepted,
		    (unsigned long long)sp->verifies, m->spec_mode,
		    sp->drafted ? (double)sp->accepted / (double)sp->drafted : 0.0,
		    sp->verifies ? (double)sp->emitted / (double)sp->verifies : 0.0, sp->draft_len,
		    sp->draft_ms / 1000.0);
	}
	rc |= web_buf_addf(o, "# HELP shoal_rank_up Health of each rank (1 healthy, 0 failed).\n"
			      "# TYPE shoal_rank_up gauge\n");
	for (int r = 0; r < m->n_ranks && r < WEB_MAX_RANKS; r++)
		if (m->rank_ok[r] >= 0)
			rc |= web_buf_addf(o, "shoal_rank_up{rank=\"%d\"} %d\n", r, m->rank_ok[r]);
	rc |= web_buf_addf(o,
			   "# HELP shoal_serving 1 when this node serves the API, 0 while forming, "
			   "loading or replanning.\n"
			   "# TYPE shoal_serving gauge\n"
			   "shoal_serving{state=\"%s\"} %d\n",
			   state_name(state), state == WEB_SERVING);
	pthread_mutex_unlock(&m->mu);
	return rc ? SH_ENOMEM : 0;
}
