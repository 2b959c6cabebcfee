/*
 * sched.c: the bounded request queue and the continuous-batching scheduler thread.
 *
 * The engine has n_slots KV slots. One thread loops: admit queued requests into free slots in
 * arrival order (FIFO), end running ones whose client went away or whose deadline passed (their
 * slot is free before the next step), then run one eng_step for every active sequence (a token
 * of each decoding request and a prompt chunk of new ones). Tokens flow from the engine's
 * callback into the job: streaming jobs get SSE bytes appended to job->out, others accumulate
 * text; the connection thread waits on job->cv.
 *
 * A job runs one sequence (a generation) or several (an embedding request: one per input,
 * admitted one by one as slots free up, so they share steps with everything else); it stays at
 * the head of the queue until its last sequence is admitted and ends when its last one ends.
 *
 * Invariants: a job is in the queue, or in run[] (its slots), or done, and every job that was
 * accepted ends in JOB_DONE with either a result or err.status set, exactly once (finish_job).
 * Lock order: scheduler mutex before a job's mutex; the engine is only called without the
 * scheduler mutex, from this thread. The engine pointer is only swapped while nothing uses it
 * (no running job, no connection tokenizing); set_engine(NULL) stops admission at once and lets
 * the running jobs end (drained, or failed by their engine's group).
 */
#include "web/web_int.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"

struct web_sched {
	pthread_mutex_t mu;
	pthread_cond_t cv; /* work arrived, engine changed, a job or an engine use ended */
	web_job_t *head, *tail;
	int queued, queue_max;
	web_job_t *run[WEB_MAX_SLOTS]; /* running job of each slot (sequence id) */
	int run_seq[WEB_MAX_SLOTS];    /* which of its job's sequences */
	int n_running;
	eng_done_t done[WEB_MAX_SLOTS];
	eng_t *run_eng; /* the engine the running jobs use (s->eng may be detached meanwhile) */
	eng_t *eng;
	int eng_users; /* connection threads tokenizing with eng */
	int stopping;
	int started;
	pthread_t thread;
	web_metrics_t *m;
	web_history_t *hist; /* finished requests and step times go there (NULL: nowhere) */
	eng_comm_t comm;     /* run_eng's communication figures after the last step */
	eng_t *comm_eng;     /* the engine comm belongs to */
};

/* ---- jobs ----------------------------------------------------------------------------------- */

web_job_t *web_job_new(web_req_t *req, int *ids, int n_ids, const char *model, int timeout_ms)
{
	web_job_t *j = calloc(1, sizeof *j);
	if (!j)
		return NULL;
	pthread_mutex_init(&j->mu, NULL);
	pthread_cond_init(&j->cv, NULL);
	j->refs = 1;
	j->req = *req;
	memset(req, 0, sizeof *req);
	j->req.samp.stop = (const char *const *)j->req.stop; /* re-point into the moved copy */
	if (!j->req.seed_given) {
		uint64_t seed;
		arc4random_buf(&seed, sizeof seed);
		j->req.samp.seed = seed;
	}
	j->ids = ids;
	j->n_ids = n_ids;
	snprintf(j->model, sizeof j->model, "%s", model ? model : "");
	j->rid.kind = j->req.kind;
	j->rid.model = j->model;
	j->rid.created = (long long)time(NULL);
	unsigned char rnd[12];
	arc4random_buf(rnd, sizeof rnd);
	int o = snprintf(j->rid.id, sizeof j->rid.id, "%s",
			 j->req.kind == WEB_CHAT ? "chatcmpl-" : "cmpl-");
	for (size_t i = 0; i < sizeof rnd; i++)
		o += snprintf(j->rid.id + o, sizeof j->rid.id - (size_t)o, "%02x", rnd[i]);
	j->deadline_ms = now_ms() + (timeout_ms > 0 ? timeout_ms : 300000);
	j->n_seq = 1;
	j->ps.t0_ns = now_ns();
	return j;
}

void web_job_ref(web_job_t *j)
{
	pthread_mutex_lock(&j->mu);
	j->refs++;
	pthread_mutex_unlock(&j->mu);
}

void web_job_unref(web_job_t *j)
{
	if (!j)
		return;
	pthread_mutex_lock(&j->mu);
	int left = --j->refs;
	pthread_mutex_unlock(&j->mu);
	if (left)
		return;
	web_req_clear(&j->req);
	free(j->ids);
	web_buf_free(&j->out);
	web_buf_free(&j->text);
	json_decref(j->logprobs);
	json_decref(j->rid.tool_calls);
	free(j->ps.ids);
	free(j->vecs);
	free(j->seq_res);
	json_decref(j->rid.reasoning);
	pthread_cond_destroy(&j->cv);
	pthread_mutex_destroy(&j->mu);
	free(j);
}

/* Sets the client-visible error for a cancellation reason. */
static void cancel_err(web_job_t *j, int reason)
{
	switch (reason) {
	case 2:
		web_err_set(&j->err, 504, "server_error", NULL, "timeout",
			    "the request did not finish before its deadline");
		break;
	case 3:
		web_err_set(&j->err, 503, "unavailable", NULL, "unavailable",
			    "the server stopped or the model is being reloaded; retry");
		break;
	default:
		web_err_set(&j->err, 499, "invalid_request_error", NULL, "client_closed",
			    "the client went away");
	}
}

/* Ends j (caller holds j->mu): writes the stream's tail, marks it done and wakes its waiter. */
static void finish_job_locked(web_job_t *j)
{
	if (j->proto) { /* another API: its own closing events (api.c) */
		web_api_finish(j);
		j->state = JOB_DONE;
		web_job_wake_locked(j);
		return;
	}
	if ((j->req.tool_format || j->req.grammar) && !j->err.status)
		web_tools_finish(j); /* calls in the text become tool_calls */
	if (j->req.stream) {
		if (j->err.status) {
			web_sse_add(&j->out, web_json_error(&j->err));
		} else {
			web_usage_t u = {j->res.prompt_tokens, j->res.completion_tokens};
			web_sse_add(&j->out, web_json_chunk(&j->rid, NULL, NULL, 0, j->res.finish,
							    j->req.include_usage, NULL));
			if (j->req.include_usage)
				web_sse_add(&j->out, web_json_usage_chunk(&j->rid, &u));
			web_buf_add(&j->out, "data: [DONE]\n\n", 14);
		}
	}
	j->state = JOB_DONE;
	web_job_wake_locked(j);
}

/* ---- the token callback --------------------------------------------------------------------- */

static json_t *logprob_entry(eng_t *e, const eng_token_t *t)
{
	char *texts[32] = {0};
	int n = MIN(t->n_top, (int)ARRAY_LEN(texts));
	eng_logprob_t top[32] = {{0, 0}};
	for (int i = 0; i < n; i++) {
		top[i] = t->top[i];
		if (!isfinite(top[i].logprob))
			top[i].logprob = -9999.0f;
		if (eng_detokenize(e, &t->top[i].token, 1, &texts[i]) != 0)
			texts[i] = NULL;
	}
	float lp = isfinite(t->logprob) ? t->logprob : -9999.0f;
	json_t *entry = web_json_logprob(t->text, t->text_len, lp, top, n, texts);
	for (int i = 0; i < n; i++)
		free(texts[i]);
	return entry;
}

/* The engine's callback for job ud (scheduler thread, inside eng_step). */
static int on_token(void *ud, const eng_token_t *t)
{
	web_job_t *j = ud;
	web_metrics_t *m = j->sched->m;
	int64_t now = now_ns();
	if (m) {
		atomic_fetch_add(&m->tokens_live, 1);
		pthread_mutex_lock(&m->mu);
		if (!j->t_last_ns)
			web_hist_add(&m->ttft, (double)(now - j->t_submit_ns) / 1e9);
		else
			web_hist_add(&m->itl, (double)(now - j->t_last_ns) / 1e9);
		pthread_mutex_unlock(&m->mu);
	}
	j->t_last_ns = now;
	if (!j->t_first_ns)
		j->t_first_ns = now;
	if (j->keep_text && j->shown_len + 1 < sizeof j->shown && t->text_len) {
		size_t n = MIN(t->text_len, sizeof j->shown - 1 - j->shown_len);
		memcpy(j->shown + j->shown_len, t->text, n);
		j->shown_len += n;
		j->shown[j->shown_len] = 0;
	}
	if (atomic_load(&j->cancel))
		return 1;
	if (now_ms() > j->deadline_ms) {
		int zero = 0;
		atomic_compare_exchange_strong(&j->cancel, &zero, 2);
		return 1;
	}
	json_t *lp = j->req.logprobs ? logprob_entry(j->eng, t) : NULL;
	pthread_mutex_lock(&j->mu);
	if (j->proto) { /* another API: api.c sorts the text out */
		web_buf_add(&j->text, t->text ? t->text : "", t->text_len);
		web_api_on_token(j, t->id);
		json_decref(lp);
	} else if (j->req.tool_format) { /* tools.c decides what is content and what is a call */
		web_buf_add(&j->text, t->text ? t->text : "", t->text_len);
		web_tools_on_text(j);
		json_decref(lp);
	} else if (j->req.stream) {
		if (j->req.grammar) /* kept to check the value at the end (tools.c) */
			web_buf_add(&j->text, t->text ? t->text : "", t->text_len);
		if (t->text_len || lp) {
			json_t *arr = NULL;
			if (lp) {
				arr = json_array();
				json_array_append_new(arr, lp);
			}
			web_sse_add(&j->out,
				    web_json_chunk(&j->rid, NULL, t->text, t->text_len,
						   ENG_FINISH_NONE, j->req.include_usage, arr));
			web_job_wake_locked(j);
		}
	} else {
		web_buf_add(&j->text, t->text ? t->text : "", t->text_len);
		if (lp) {
			if (!j->logprobs)
				j->logprobs = json_array();
			json_array_append_new(j->logprobs, lp);
		}
	}
	pthread_mutex_unlock(&j->mu);
	return 0;
}

/* ---- the scheduler thread ------------------------------------------------------------------- */

/* The request table's row for an ended job (history.c). */
static void record_job(web_sched_t *s, const web_job_t *j)
{
	if (!s->hist)
		return;
	web_reqrec_t r;
	memset(&r, 0, sizeof r);
	snprintf(r.id, sizeof r.id, "%s", j->rid.id);
	snprintf(r.api, sizeof r.api, "%s",
		 j->api                    ? j->api
		 : j->req.kind == WEB_CHAT ? "chat"
					   : "completions");
	r.status = j->err.status ? j->err.status : 200;
	r.prompt_tokens = j->res.prompt_tokens > 0 ? j->res.prompt_tokens : j->n_ids;
	r.completion_tokens = MAX(j->res.completion_tokens, 0);
	r.ttft_ms = j->t_first_ns ? (double)(j->t_first_ns - j->t_submit_ns) / 1e6 : -1;
	r.tok_s = r.completion_tokens > 1 && j->res.gen_ms > 0
		      ? r.completion_tokens * 1000.0 / j->res.gen_ms
		      : -1;
	const char *fin = j->err.status ? NULL : web_finish_name(j->res.finish);
	snprintf(r.finish, sizeof r.finish, "%s", fin ? fin : "");
	if (j->err.status)
		web_reqrec_error(&r, &j->err);
	if (web_history_show_text(s->hist)) { /* (a job that never ran has no reply) */
		const char *p = j->req.prompt;
		for (int i = j->req.n_msgs - 1; !p && i >= 0; i--) /* chat: the last user turn */
			if (j->req.msgs[i].role && !strcmp(j->req.msgs[i].role, "user"))
				p = j->req.msgs[i].content;
		web_text_head(r.prompt, sizeof r.prompt, p ? p : "", p ? strlen(p) : 0);
		web_text_head(r.reply, sizeof r.reply, j->shown, j->shown_len);
	}
	web_history_request(s->hist, &r);
}

/* Maps an ended job's result to the client-visible outcome and finishes j. */
static void end_job(web_sched_t *s, web_job_t *j, int rc)
{
	pthread_mutex_lock(&j->mu);
	eng_result_t *res = &j->res; /* the engine wrote it while the job ran */
	if (j->seq_res) {            /* embeddings: the inputs' sums (or the failed one's) */
		if (!rc) {
			memset(res, 0, sizeof *res);
			res->finish = ENG_FINISH_STOP;
			for (int i = 0; i < j->n_seq; i++)
				res->prompt_tokens += j->seq_res[i].prompt_tokens;
		}
	}
	int reason = atomic_load(&j->cancel);
	if (reason || res->finish == ENG_FINISH_CANCELED) {
		cancel_err(j, reason ? reason : 1);
	} else if (rc < 0 || res->finish == ENG_FINISH_ERROR) {
		if (rc == SH_EINVAL)
			web_err_set(
			    &j->err, 400, "invalid_request_error",
			    j->seq_res ? "input" : "messages", "context_length_exceeded", "%s",
			    res->error[0] ? res->error : "the prompt does not fit the context");
		else if (web_engine_lost(rc))
			web_err_set(&j->err, 503, "unavailable", NULL, "replanning",
				    "the cluster lost a rank and is re-planning; retry (%s)",
				    res->error[0] ? res->error : sh_strerror(rc));
		else
			web_err_set(&j->err, 500, "server_error", NULL, "engine_error", "%s",
				    res->error[0] ? res->error : sh_strerror(rc));
	}
	finish_job_locked(j);
	pthread_mutex_unlock(&j->mu);
	if (s->m && !j->err.status)
		web_metrics_finished(s->m, res);
	record_job(s, j);
	if (s->m)
		web_metrics_request(s->m, j->req.api);
	if (j->err.status && j->err.status != 499)
		LOG(LOG_INFO, "web: %s ended with %d: %s", j->rid.id, j->err.status,
		    j->err.message);
}

/* Sequence k of j ended with rc (or never started): when it was the job's last, the job ends
 * and the queue's reference goes. */
static void seq_done(web_sched_t *s, web_job_t *j, int k, int rc)
{
	pthread_mutex_lock(&s->mu);
	if (rc && !j->seq_rc) {
		j->seq_rc = rc;
		if (j->seq_res) /* the failed input's reason is the job's */
			j->res = j->seq_res[k];
	}
	int last = ++j->seq_ended == j->n_seq;
	pthread_mutex_unlock(&s->mu);
	if (last) {
		end_job(s, j, j->seq_rc);
		web_job_unref(j); /* the queue's reference */
	}
}

/* Starts sequence k of j in a free slot of e (scheduler thread, no lock held; admission already
 * counted it in n_running, so set_engine waits for it). A sequence that cannot start (a bad
 * prompt, its job canceled, failed or past its deadline) ends here. */
static void start_job(web_sched_t *s, eng_t *e, web_job_t *j, int k)
{
	pthread_mutex_lock(&j->mu);
	if (k == 0) {
		j->state = JOB_RUNNING;
		if (j->proto && j->req.stream && j->proto->start) {
			j->proto->start(j);
			web_job_wake_locked(j);
		} else if (!j->proto && j->req.stream && j->req.kind == WEB_CHAT && !j->sent_role) {
			/* OpenAI's first chunk carries the role and empty content. */
			web_sse_add(&j->out,
				    web_json_chunk(&j->rid, "assistant", "", 0, ENG_FINISH_NONE,
						   j->req.include_usage, NULL));
			j->sent_role = 1;
			web_job_wake_locked(j);
		}
	}
	pthread_mutex_unlock(&j->mu);
	if (atomic_load(&j->cancel) == 0 && now_ms() > j->deadline_ms)
		atomic_store(&j->cancel, 2);
	int rc = SH_ECANCELED;
	if (k == 0) {
		memset(&j->res, 0, sizeof j->res);
		j->res.finish = ENG_FINISH_CANCELED;
		j->keep_text = web_history_show_text(s->hist);
	}
	pthread_mutex_lock(&s->mu);
	int failed = j->seq_rc != 0;
	pthread_mutex_unlock(&s->mu);
	if (!atomic_load(&j->cancel) && !failed) {
		j->sched = s;
		j->eng = e;
		int id = j->seq_res ? eng_embed_start(e, j->req.input_ids[k], j->req.input_len[k],
						      j->vecs + (size_t)k * j->dim, &j->seq_res[k])
				    : eng_seq_start(e, j->ids, j->n_ids, &j->req.samp, on_token, j,
						    &j->res);
		if (id >= 0) {
			pthread_mutex_lock(&s->mu);
			s->run[id] = j;
			s->run_seq[id] = k;
			pthread_mutex_unlock(&s->mu);
			return;
		}
		rc = id;
	} else if (failed) {
		rc = 0; /* an earlier input failed: the job's error is that one */
	}
	seq_done(s, j, k, rc);
	pthread_mutex_lock(&s->mu);
	s->n_running--; /* the place admission reserved */
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

/* A running sequence left its slot: account for it (its job ends with its last), then free its
 * place (set_engine waits for that, so the job is done before a detach returns). */
static void slot_done(web_sched_t *s, int id, int rc)
{
	pthread_mutex_lock(&s->mu);
	web_job_t *j = s->run[id];
	int k = s->run_seq[id];
	s->run[id] = NULL;
	pthread_mutex_unlock(&s->mu);
	if (j)
		seq_done(s, j, k, rc);
	pthread_mutex_lock(&s->mu);
	s->n_running--;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

/* Per-step figures for /metrics and the dashboard. */
static void step_metrics(web_sched_t *s, eng_t *e, int batch)
{
	if (!s->m)
		return;
	int n = MIN(eng_info(e)->n_slots, WEB_MAX_SLOTS);
	pthread_mutex_lock(&s->m->mu);
	s->m->n_slots = n;
	for (int i = 0; i < n; i++)
		s->m->slot_state[i] = (signed char)eng_slot_state(e, i);
	if (batch > 0)
		web_hist_add(&s->m->batch, batch);
	s->m->spec_mode = eng_info(e)->spec;
	eng_spec_stats(e, &s->m->spec);
	pthread_mutex_unlock(&s->m->mu);
}

/* The step's wall time and its communication (the engine's counters since the last step; a
 * single node has none) for the dashboard's per-node series. Scheduler thread. */
static void step_history(web_sched_t *s, eng_t *e, double step_ms)
{
	if (!s->hist)
		return;
	eng_comm_t c;
	eng_comm_stats(e, &c);
	if (s->comm_eng != e || c.steps < s->comm.steps) { /* another engine: start over */
		s->comm_eng = e;
		s->comm = c;
		web_history_step(s->hist, step_ms, -1);
		return;
	}
	double comm = c.steps > s->comm.steps ? c.comm_ms - s->comm.comm_ms : -1;
	s->comm = c;
	web_history_step(s->hist, step_ms, comm);
}

/* One loop turn: admit queued sequences into free slots (FIFO; a job leaves the queue with its
 * last sequence), end canceled or expired ones, then run one step of every active sequence.
 * Runs on the scheduler thread with s->mu held on entry and exit. */
static void sched_turn(web_sched_t *s)
{
	eng_t *e = s->n_running ? s->run_eng : s->eng;
	/* admission: only while the engine is attached (set_engine(NULL) stops it) */
	while (s->head && s->eng && s->eng == e && eng_active(e) < eng_info(e)->n_slots &&
	       s->n_running < eng_info(e)->n_slots) {
		web_job_t *j = s->head;
		int k = j->seq_next++;
		if (j->seq_next >= j->n_seq) {
			s->head = j->next;
			if (!s->head)
				s->tail = NULL;
			j->next = NULL;
			s->queued--;
		}
		s->n_running++;
		s->run_eng = e;
		pthread_mutex_unlock(&s->mu);
		start_job(s, e, j, k);
		pthread_mutex_lock(&s->mu);
	}
	if (!s->n_running)
		return;
	pthread_mutex_unlock(&s->mu);
	/* cancellation (client gone, deadline, server stopping) frees the slot before the step */
	int64_t now = now_ms();
	int n_slots = eng_info(e)->n_slots;
	for (int id = 0; id < n_slots; id++) {
		web_job_t *j = s->run[id];
		if (!j)
			continue;
		if (atomic_load(&j->cancel) == 0 && now > j->deadline_ms) {
			int zero = 0;
			atomic_compare_exchange_strong(&j->cancel, &zero, 2);
		}
		if (atomic_load(&j->cancel)) {
			eng_seq_cancel(e, id);
			slot_done(s, id, SH_ECANCELED);
		}
	}
	int nd = 0, batch = eng_active(e);
	if (batch) {
		int64_t t0 = now_ns();
		eng_step(e, s->done, &nd);
		step_history(s, e, (double)(now_ns() - t0) / 1e6);
	}
	for (int i = 0; i < nd; i++)
		slot_done(s, s->done[i].id, s->done[i].rc);
	step_metrics(s, e, batch);
	pthread_mutex_lock(&s->mu);
}

static void *sched_main(void *arg)
{
	web_sched_t *s = arg;
	pthread_mutex_lock(&s->mu);
	for (;;) {
		while (!s->n_running && !s->stopping && (!s->head || !s->eng))
			pthread_cond_wait(&s->cv, &s->mu);
		if (s->stopping && !s->n_running)
			break;
		sched_turn(s);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

/* j was taken off the queue for reason (caller holds s->mu): its sequences not yet admitted
 * count as ended; with none running it is finished here, else its running ones (canceled before
 * the next step) end it. */
static void abandon_locked(web_sched_t *s, web_job_t *j, int reason)
{
	int zero = 0;
	atomic_compare_exchange_strong(&j->cancel, &zero, reason);
	j->next = NULL;
	j->seq_ended += j->n_seq - j->seq_next;
	j->seq_next = j->n_seq;
	if (j->seq_ended < j->n_seq)
		return;
	pthread_mutex_lock(&j->mu);
	cancel_err(j, atomic_load(&j->cancel));
	finish_job_locked(j);
	pthread_mutex_unlock(&j->mu);
	record_job(s, j);
	web_job_unref(j);
}

/* Fails every queued job with reason (caller holds s->mu). */
static void drain_locked(web_sched_t *s, int reason)
{
	web_job_t *j = s->head;
	s->head = s->tail = NULL;
	s->queued = 0;
	while (j) {
		web_job_t *next = j->next;
		abandon_locked(s, j, reason);
		j = next;
	}
}

int web_sched_new(web_sched_t **out, web_metrics_t *m, int queue_max)
{
	web_sched_t *s = calloc(1, sizeof *s);
	if (!s)
		return SH_ENOMEM;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	s->queue_max = queue_max > 0 ? queue_max : 1;
	s->m = m;
	if (pthread_create(&s->thread, NULL, sched_main, s) != 0) {
		pthread_cond_destroy(&s->cv);
		pthread_mutex_destroy(&s->mu);
		free(s);
		return SH_EIO;
	}
	s->started = 1;
	*out = s;
	return 0;
}

void web_sched_stop(web_sched_t *s)
{
	pthread_mutex_lock(&s->mu);
	int join = s->started;
	s->started = 0;
	s->stopping = 1;
	drain_locked(s, 3);
	for (int i = 0; i < WEB_MAX_SLOTS; i++)
		if (s->run[i])
			atomic_store(&s->run[i]->cancel, 3);
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	if (join)
		pthread_join(s->thread, NULL);
}

void web_sched_free(web_sched_t *s)
{
	if (!s)
		return;
	web_sched_stop(s);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
	free(s);
}

int web_sched_submit(web_sched_t *s, web_job_t *j)
{
	int rc = 0;
	pthread_mutex_lock(&s->mu);
	if (s->stopping)
		rc = SH_ECLOSED;
	else if (!s->eng)
		rc = SH_ENOENT;
	else if (s->queued >= s->queue_max)
		rc = SH_EBUSY;
	if (rc == 0) {
		web_job_ref(j);
		j->t_submit_ns = now_ns();
		j->next = NULL;
		if (s->tail)
			s->tail->next = j;
		else
			s->head = j;
		s->tail = j;
		s->queued++;
		pthread_cond_broadcast(&s->cv);
	}
	pthread_mutex_unlock(&s->mu);
	return rc;
}

void web_sched_cancel(web_sched_t *s, web_job_t *j, int reason)
{
	pthread_mutex_lock(&s->mu);
	web_job_t **pp = &s->head, *prev = NULL;
	while (*pp && *pp != j) {
		prev = *pp;
		pp = &(*pp)->next;
	}
	if (*pp) { /* still queued (maybe partly admitted): finish it here or soon */
		*pp = j->next;
		if (s->tail == j)
			s->tail = prev;
		s->queued--;
		web_job_ref(j); /* abandon may drop the queue's */
		abandon_locked(s, j, reason);
		pthread_mutex_unlock(&s->mu);
		web_job_unref(j);
		return;
	}
	int zero = 0;
	atomic_compare_exchange_strong(&j->cancel, &zero, reason);
	pthread_mutex_unlock(&s->mu);
}

eng_t *web_sched_engine_acquire(web_sched_t *s)
{
	pthread_mutex_lock(&s->mu);
	eng_t *e = s->stopping ? NULL : s->eng;
	if (e)
		s->eng_users++;
	pthread_mutex_unlock(&s->mu);
	return e;
}

void web_sched_engine_release(web_sched_t *s)
{
	pthread_mutex_lock(&s->mu);
	if (--s->eng_users == 0)
		pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

void web_sched_set_engine(web_sched_t *s, eng_t *e)
{
	pthread_mutex_lock(&s->mu);
	eng_t *old = s->eng;
	s->eng = NULL; /* no new users while we wait */
	if (old && !e)
		drain_locked(s, 3);
	while (old && (s->n_running || s->eng_users > 0))
		pthread_cond_wait(&s->cv, &s->mu);
	s->eng = e;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

void web_sched_set_history(web_sched_t *s, web_history_t *h)
{
	pthread_mutex_lock(&s->mu);
	s->hist = h;
	pthread_mutex_unlock(&s->mu);
}

void web_sched_depth(web_sched_t *s, int *queued, int *running)
{
	pthread_mutex_lock(&s->mu);
	*queued = s->queued;
	*running = s->n_running;
	pthread_mutex_unlock(&s->mu);
}
