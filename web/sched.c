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
 * Re-plans (issue 28): no accepted job is lost when the engine goes away. A step that fails
 * because the engine's group broke hands back every running sequence's state (eng_result_t's
 * resume); a detach or a swap (web_set_engine) suspends the running jobs between steps
 * (eng_seq_snapshot). Either way the jobs go back to the head of the queue in their submission
 * order, nothing more is admitted to that engine, and they go on from their state on the next
 * engine, ahead of later jobs: the client sees a pause. While no engine can run them, queued
 * jobs wait up to wait_ms (and their deadline), then end with 503 + Retry-After; only
 * web_sched_unavailable (no plan can serve the model) ends them at once. An embedding job is
 * not resumed: it fails (503) and its client retries.
 *
 * Invariants: a job is in the queue, or in run[] (its slots), or done, and every job that was
 * accepted ends in JOB_DONE with either a result or err.status set, exactly once (finish_job).
 * Lock order: scheduler mutex before a job's mutex; the engine is only called without the
 * scheduler mutex, from this thread. The engine pointer is only swapped while nothing uses it
 * (no running job, no connection tokenizing); set_engine stops admission at once and the
 * scheduler suspends the running jobs before its next step.
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
	int in_turn;   /* under mu: the scheduler thread is in a turn and may use run_eng or eng
			  with mu released (sched_turn) */
	int stopping;
	int started;
	pthread_t thread;
	web_metrics_t *m;
	web_history_t *hist; /* finished requests and step times go there (NULL: nowhere) */
	eng_comm_t comm;     /* run_eng's communication figures after the last step */
	eng_t *comm_eng;     /* the engine comm belongs to */
	/* re-plans */
	int hold;       /* no engine attached but one is coming: jobs wait (set by the first
			   attach, cleared by web_sched_unavailable) */
	eng_t *broken;  /* the attached engine's group broke: nothing more is admitted to it */
	int wait_ms;    /* the longest a job waits for an engine */
	uint64_t order; /* jobs submitted so far */
	char why[160];  /* web_sched_unavailable's reason */
	web_engine_lost_fn lost;
	void *lost_ud;
};

/* An engine jobs can be admitted to (caller holds s->mu). */
static int usable(const web_sched_t *s)
{
	return s->eng && s->eng != s->broken;
}

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
	eng_seq_state_free(j->resume);
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

/* Sets the client-visible error for a cancellation reason (enum web_cancel). */
static void cancel_err(web_sched_t *s, web_job_t *j, int reason)
{
	switch (reason) {
	case WEB_CANCEL_TIMEOUT:
		web_err_set(&j->err, 504, "server_error", NULL, "timeout",
			    "the request did not finish before its deadline");
		break;
	case WEB_CANCEL_STOP:
		web_err_set(&j->err, 503, "unavailable", NULL, "unavailable",
			    "the server stopped or the model is being reloaded; retry");
		break;
	case WEB_CANCEL_REPLAN:
		web_err_set(&j->err, 503, "unavailable", NULL, "replanning",
			    "the cluster is re-planning and no plan served the model in time; "
			    "retry");
		break;
	case WEB_CANCEL_NO_PLAN:
		web_err_set(&j->err, 503, "unavailable", NULL, "unavailable",
			    "no plan can serve the model now (%s); retry later",
			    s && s->why[0] ? s->why : "no engine");
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
		atomic_compare_exchange_strong(&j->cancel, &zero, WEB_CANCEL_TIMEOUT);
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
		cancel_err(s, j, reason ? reason : WEB_CANCEL_GONE);
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
		if (j->proto && j->req.stream && j->proto->start && !j->sent_role) {
			j->proto->start(j); /* once: a resumed job's stream goes on */
			j->sent_role = 1;
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
		atomic_store(&j->cancel, WEB_CANCEL_TIMEOUT);
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
		int id;
		if (j->resume) { /* a generation going on from where its last engine left it */
			id = eng_seq_start_resume(e, j->resume, &j->req.samp, on_token, j, &j->res);
			if (id >= 0) {
				int gen;
				eng_seq_state_tokens(j->resume, &gen);
				LOG(LOG_INFO, "web: %s goes on after %d tokens (paused %.0f ms)",
				    j->rid.id, gen, (double)(now_ns() - j->t_suspend_ns) / 1e6);
				j->resumed++;
				if (s->m)
					atomic_fetch_add(&s->m->resumed, 1);
			}
			if (id == SH_EINVAL) /* the new plan's context is smaller */
				id = SH_ENOFIT;
			eng_seq_state_free(j->resume); /* the engine keeps it current from here */
			j->resume = NULL;
		} else {
			id = j->seq_res
				 ? eng_embed_start(e, j->req.input_ids[k], j->req.input_len[k],
						   j->vecs + (size_t)k * j->dim, &j->seq_res[k])
				 : eng_seq_start(e, j->ids, j->n_ids, &j->req.samp, on_token, j,
						 &j->res);
		}
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

/* Puts j (off its slot, not canceled) back into the queue ahead of every job submitted after
 * it, to go on from st (taken; NULL: from its prompt). Caller holds s->mu; the queue's
 * reference moves with it. */
static void requeue_locked(web_sched_t *s, web_job_t *j, eng_seq_state_t *st)
{
	j->resume = st;
	j->seq_next = j->seq_ended = 0; /* its one sequence starts again */
	j->t_suspend_ns = now_ns();
	j->wait_from_ms = usable(s) ? 0 : now_ms();
	pthread_mutex_lock(&j->mu);
	j->state = JOB_QUEUED;
	pthread_mutex_unlock(&j->mu);
	web_job_t **pp = &s->head, *prev = NULL;
	while (*pp && (*pp)->order < j->order) {
		prev = *pp;
		pp = &(*pp)->next;
	}
	j->next = *pp;
	*pp = j;
	if (!j->next)
		s->tail = j;
	(void)prev;
	s->queued++;
}

/* Whether a job that left its slot with rc can go on elsewhere: a generation (an embedding
 * job's inputs are not resumed: it fails and its client retries) whose group broke (or whose
 * engine is being replaced) with a state to go on from, or that has handed nothing out yet. */
static int can_resume(const web_job_t *j, int rc, const eng_seq_state_t *st)
{
	return web_engine_lost(rc) && !j->seq_res && j->n_seq == 1 && !atomic_load(&j->cancel) &&
	       (st || j->res.completion_tokens == 0);
}

/* A running job left its slot: finish it, or (its group broke) put it back into the queue with
 * its state; then free its place (set_engine waits for that, so the job is done or queued
 * before a detach returns). */
static void slot_done(web_sched_t *s, int id, int rc)
{
	pthread_mutex_lock(&s->mu);
	web_job_t *j = s->run[id];
	int k = s->run_seq[id];
	s->run[id] = NULL;
	pthread_mutex_unlock(&s->mu);
	eng_seq_state_t *st = j ? j->res.resume : NULL;
	if (j)
		j->res.resume = NULL;
	if (j && can_resume(j, rc, st)) {
		LOG(LOG_INFO, "web: %s suspended after %d tokens: %s", j->rid.id,
		    j->res.completion_tokens, j->res.error[0] ? j->res.error : sh_strerror(rc));
		pthread_mutex_lock(&s->mu);
		requeue_locked(s, j, st);
		s->n_running--;
		pthread_cond_broadcast(&s->cv);
		pthread_mutex_unlock(&s->mu);
		return;
	}
	eng_seq_state_free(st);
	if (j)
		seq_done(s, j, k, rc);
	pthread_mutex_lock(&s->mu);
	s->n_running--;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

/* The engine the jobs run on is going away (set_engine): each running job's state is taken
 * between steps and the job goes back to the queue. Scheduler thread, s->mu held on entry and
 * exit. */
static void suspend_running(web_sched_t *s)
{
	eng_t *e = s->run_eng;
	int n_slots = MIN(eng_info(e)->n_slots, WEB_MAX_SLOTS);
	pthread_mutex_unlock(&s->mu);
	for (int id = 0; id < n_slots; id++) {
		web_job_t *j = s->run[id];
		if (!j)
			continue;
		eng_seq_state_t *st = NULL;
		if (!atomic_load(&j->cancel) && !(st = eng_seq_snapshot(e, id)) &&
		    j->res.completion_tokens)
			atomic_store(&j->cancel, WEB_CANCEL_STOP); /* out of memory: it cannot */
		eng_seq_cancel(e, id);
		j->res.resume = st;
		slot_done(s, id, atomic_load(&j->cancel) ? SH_ECANCELED : SH_ECLOSED);
	}
	pthread_mutex_lock(&s->mu);
}

/* Ends the queued jobs that waited for an engine longer than wait_ms or past their deadline
 * (caller holds s->mu; no usable engine). Returns when the next one is due (ms from now). */
static int64_t expire_locked(web_sched_t *s)
{
	int64_t now = now_ms(), next = s->wait_ms;
	web_job_t **pp = &s->head, *prev = NULL;
	while (*pp) {
		web_job_t *j = *pp;
		if (!j->wait_from_ms)
			j->wait_from_ms = now;
		int64_t due = MIN(j->wait_from_ms + s->wait_ms, j->deadline_ms);
		if (now < due) {
			next = MIN(next, due - now);
			prev = j;
			pp = &j->next;
			continue;
		}
		*pp = j->next;
		if (s->tail == j)
			s->tail = prev;
		s->queued--;
		j->next = NULL;
		pthread_mutex_lock(&j->mu);
		atomic_store(&j->cancel, WEB_CANCEL_REPLAN);
		cancel_err(s, j, WEB_CANCEL_REPLAN);
		finish_job_locked(j);
		pthread_mutex_unlock(&j->mu);
		record_job(s, j);
		LOG(LOG_INFO, "web: %s waited %lld ms for an engine: 503", j->rid.id,
		    (long long)(now - j->wait_from_ms));
		web_job_unref(j);
	}
	return next;
}

/* The jobs in the queue wait for an engine from now, or (an engine came) no longer (caller
 * holds s->mu). */
static void mark_waiting_locked(web_sched_t *s)
{
	int64_t now = usable(s) ? 0 : now_ms();
	for (web_job_t *j = s->head; j; j = j->next)
		if (!now || !j->wait_from_ms)
			j->wait_from_ms = now;
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

/* One loop turn: suspend the running jobs when their engine is going away, admit queued jobs
 * into free slots (FIFO), end canceled or expired ones, then run one step of every active
 * sequence. Runs on the scheduler thread with s->mu held on entry and exit. */
static void sched_turn_engine(web_sched_t *s)
{
	if (s->n_running && s->run_eng != s->eng) { /* detached or replaced (set_engine) */
		suspend_running(s);
		return;
	}
	eng_t *e = s->n_running ? s->run_eng : s->eng;
	/* admission: only while an engine that works is attached */
	while (s->head && usable(s) && s->eng == e && eng_active(e) < eng_info(e)->n_slots &&
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
			atomic_compare_exchange_strong(&j->cancel, &zero, WEB_CANCEL_TIMEOUT);
		}
		if (atomic_load(&j->cancel)) {
			eng_seq_cancel(e, id);
			slot_done(s, id, SH_ECANCELED);
		}
	}
	int nd = 0, batch = eng_active(e), rc = 0;
	if (batch) {
		int64_t t0 = now_ns();
		rc = eng_step(e, s->done, &nd);
		step_history(s, e, (double)(now_ns() - t0) / 1e6);
	}
	if (rc && web_engine_lost(rc)) { /* its group broke: the jobs go on on the next engine */
		pthread_mutex_lock(&s->mu);
		s->broken = e;
		pthread_mutex_unlock(&s->mu);
		LOG(LOG_WARN, "web: the engine's group broke (%s); %d requests wait for the next",
		    sh_strerror(rc), nd);
		if (s->lost)
			s->lost(s->lost_ud);
	}
	for (int i = 0; i < nd; i++)
		slot_done(s, s->done[i].id, s->done[i].rc);
	step_metrics(s, e, batch);
	pthread_mutex_lock(&s->mu);
	if (s->broken == e)
		mark_waiting_locked(s);
}

/* One loop turn (sched_turn_engine). The engine is held for the whole turn: its last running
 * job can end in the middle of it (a cancel, a finished sequence), and n_running dropping to 0
 * alone would let set_engine return, and its caller free the engine, under the step metrics
 * that still read it. */
static void sched_turn(web_sched_t *s)
{
	s->in_turn = 1;
	sched_turn_engine(s);
	s->in_turn = 0;
	pthread_cond_broadcast(&s->cv);
}

static void *sched_main(void *arg)
{
	web_sched_t *s = arg;
	pthread_mutex_lock(&s->mu);
	for (;;) {
		while (!s->n_running && !s->stopping && (!s->head || !usable(s))) {
			if (!s->head) {
				pthread_cond_wait(&s->cv, &s->mu);
				continue;
			}
			/* jobs wait for an engine (a re-plan), each for a bounded time */
			int64_t ms = MAX(1, MIN(expire_locked(s), 1000));
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += ms / 1000;
			ts.tv_nsec += (ms % 1000) * 1000000L;
			if (ts.tv_nsec >= 1000000000L) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000L;
			}
			if (s->head)
				pthread_cond_timedwait(&s->cv, &s->mu, &ts);
		}
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
	cancel_err(s, j, atomic_load(&j->cancel));
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

int web_sched_new(web_sched_t **out, web_metrics_t *m, int queue_max, int wait_ms,
		  web_engine_lost_fn lost, void *lost_ud)
{
	web_sched_t *s = calloc(1, sizeof *s);
	if (!s)
		return SH_ENOMEM;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	s->queue_max = queue_max > 0 ? queue_max : 1;
	s->wait_ms = wait_ms > 0 ? wait_ms : WEB_REPLAN_WAIT_MS;
	s->lost = lost;
	s->lost_ud = lost_ud;
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
	drain_locked(s, WEB_CANCEL_STOP);
	for (int i = 0; i < WEB_MAX_SLOTS; i++)
		if (s->run[i])
			atomic_store(&s->run[i]->cancel, WEB_CANCEL_STOP);
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
	else if (!s->eng && !s->hold)
		rc = SH_ENOENT;
	else if (s->queued >= s->queue_max)
		rc = SH_EBUSY;
	if (rc == 0) {
		web_job_ref(j);
		j->t_submit_ns = now_ns();
		j->order = ++s->order;
		j->wait_from_ms = usable(s) ? 0 : now_ms();
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
	s->eng = NULL; /* no new users, no admission; the scheduler suspends the running jobs */
	pthread_cond_broadcast(&s->cv);
	mark_waiting_locked(s);
	while (old && (s->n_running || s->eng_users > 0 || s->in_turn))
		pthread_cond_wait(&s->cv, &s->mu);
	s->eng = e;
	s->broken = NULL;
	if (e) { /* from now on a detach means a re-plan: requests wait for the next engine */
		s->hold = 1;
		s->why[0] = 0;
	} else if (!s->hold) { /* no plan is coming (web_sched_unavailable came first) */
		drain_locked(s, WEB_CANCEL_NO_PLAN);
	}
	mark_waiting_locked(s);
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

void web_sched_unavailable(web_sched_t *s, const char *why)
{
	pthread_mutex_lock(&s->mu);
	snprintf(s->why, sizeof s->why, "%s", why && why[0] ? why : "no engine");
	s->hold = 0;
	if (!s->eng) /* else the detach that follows ends them (web_sched_set_engine) */
		drain_locked(s, WEB_CANCEL_NO_PLAN);
	pthread_mutex_unlock(&s->mu);
}

int web_sched_holding(web_sched_t *s, int *wait_ms)
{
	pthread_mutex_lock(&s->mu);
	int h = !s->stopping && s->hold;
	if (wait_ms)
		*wait_ms = s->wait_ms;
	pthread_mutex_unlock(&s->mu);
	return h;
}

int web_sched_ready(web_sched_t *s)
{
	pthread_mutex_lock(&s->mu);
	int r = !s->stopping && usable(s);
	pthread_mutex_unlock(&s->mu);
	return r;
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
