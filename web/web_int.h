/*
 * web_int.h: web/'s internal interface, shared by its files and its tests (tests/test_web.c,
 * tests/fuzz/fuzz_request.c). Nothing here is for other modules.
 *
 *   request.c  JSON body -> web_req_t (pure; every client mistake becomes a web_err_t)
 *   respond.c  replies, chunks, errors as JSON text; SSE framing; UTF-8 repair (pure)
 *   sched.c    the bounded queue and the continuous-batching scheduler thread (eng_step)
 *   metrics.c  counters and gauges, Prometheus text, the dashboard's live snapshot
 *   server.c   libmicrohttpd: routing, auth, body limits, streaming responses
 *   guard.c    per-connection deadlines, parked (suspended) connections and their watch thread
 *   dashboard_page.c  the dashboard page (one self-contained HTML document)
 *   proxy.c    --exec: /v1/... forwarded to the command's port (web_set_proxy)
 *   generate.c a generation or embedding request from its parsed body to its reply: prompt,
 *              job, queue, streamed or whole reply (every API's requests go through it)
 *   api.c      the other APIs' common scheduler side: reasoning, content and tool calls of a
 *              job's text, each handed to the API's hooks (web_proto_t) once certain
 *   anthropic.c  Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens)
 *   responses.c  OpenAI's Responses API (/v1/responses) and its store of past responses
 *   ollama.c   Ollama's API (/api/chat, /api/generate, /api/tags, /api/show, ...)
 *   embed.c    embeddings (/v1/embeddings, /api/embed, /api/embeddings)
 */
#ifndef SHOAL_WEB_INT_H
#define SHOAL_WEB_INT_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "common/common.h"
#include "infer/infer.h"
#include "web/web.h"

struct json_t; /* jansson */

#define WEB_BODY_MAX            (512u << 10) /* request bodies above this are answered 413 */
#define WEB_STOP_MAX            16           /* stop strings per request */
#define WEB_MSG_MAX             4096         /* messages per request */
#define WEB_JSON_DEPTH_MAX      32           /* nesting of arrays and objects in a body */
#define WEB_JSON_CONTAINERS_MAX 16384  /* arrays + objects in a body (~250 B each once parsed) */
#define WEB_JSON_VALUES_MAX     131072 /* values of any kind in a body */
#define WEB_PARSE_CONCURRENCY   2      /* bodies parsed into trees at once (bounds peak memory) */
/* the dashboard's memory (history.c) */
#define WEB_HISTORY_SECONDS  900  /* samples kept: 15 minutes at one a second */
#define WEB_HISTORY_NODES    8    /* nodes whose step and communication times are kept */
#define WEB_HISTORY_QWINDOW  5    /* latency quantiles of a sample cover its last 5 seconds */
#define WEB_EVENTS_MAX       200  /* cluster events kept */
#define WEB_REQUESTS_MAX     100  /* finished or refused requests kept */
#define WEB_TEXT_MAX         240  /* bytes of a prompt and a reply kept (--dashboard-show-text) */
#define WEB_EMBED_INPUTS_MAX 2048 /* inputs of one embeddings request (OpenAI's limit) */
#define WEB_RSTORE_BYTES     (32u << 20) /* stored responses (previous_response_id): bytes */
#define WEB_RSTORE_ITEMS     1024        /* and count; the oldest go first */

/* ---- growable byte buffer ------------------------------------------------------------------ */

typedef struct web_buf {
	char *p; /* NUL-terminated when non-NULL */
	size_t len, cap;
} web_buf_t;

int web_buf_add(web_buf_t *b, const char *s, size_t n); /* 0 or SH_ENOMEM */
int web_buf_addf(web_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void web_buf_free(web_buf_t *b);

/* ---- errors as the client sees them ---------------------------------------------------------- */

typedef struct web_err {
	int status;        /* HTTP status */
	const char *type;  /* "invalid_request_error", ... (static string) */
	char param[64];    /* offending field or "" */
	char code[48];     /* machine-readable code or "" */
	char message[256]; /* one line for humans */
} web_err_t;

/* Fills e and returns status (for tail calls). */
int web_err_set(web_err_t *e, int status, const char *type, const char *param, const char *code,
		const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* The two errors every parser gives: 500 out of memory; 400 invalid_value on param with msg. */
int web_err_oom(web_err_t *e);
int web_err_bad(web_err_t *e, const char *param, const char *msg);
/* 400 invalid_value on param, the message fmt with its one %s filled by detail (NULL: ""). */
int web_err_badf(web_err_t *e, const char *param, const char *fmt, const char *detail);

/* ---- requests (request.c) ------------------------------------------------------------------- */

enum web_kind { WEB_CHAT = 0, WEB_COMPLETION = 1, WEB_EMBED = 2 };

/* The API a request came through (metrics, the dashboard, error shapes). */
enum web_api {
	WEB_API_CHAT = 0,        /* OpenAI /v1/chat/completions */
	WEB_API_COMPLETIONS,     /* OpenAI /v1/completions */
	WEB_API_MESSAGES,        /* Anthropic /v1/messages */
	WEB_API_RESPONSES,       /* OpenAI /v1/responses */
	WEB_API_OLLAMA_CHAT,     /* Ollama /api/chat */
	WEB_API_OLLAMA_GENERATE, /* Ollama /api/generate */
	WEB_API_EMBEDDINGS,      /* OpenAI /v1/embeddings */
	WEB_API_OLLAMA_EMBED,    /* Ollama /api/embed and /api/embeddings */
	WEB_API_N
};
/* "chat.completions", "messages", ... (static). */
const char *web_api_name(int api);

struct web_rstore;

typedef struct web_req {
	int kind;        /* enum web_kind */
	char *model;     /* as sent, or NULL */
	eng_msg_t *msgs; /* chat: n_msgs messages, role and content strings owned */
	int n_msgs;
	char *prompt;    /* completion: text prompt, or NULL when prompt_ids is used */
	int *prompt_ids; /* completion: prompt given as token ids */
	int n_prompt_ids;
	eng_sampling_t samp; /* samp.stop points into stop[] */
	char *stop[WEB_STOP_MAX];
	int n_stop;
	int stream;        /* Server-Sent Events */
	int include_usage; /* stream_options.include_usage */
	int logprobs;      /* report log-probabilities of chosen tokens */
	int seed_given;    /* samp.seed came from the request */
	/* tools and structured output (tools.c) */
	eng_grammar_t *grammar; /* response_format or a forced call (owned); samp.grammar */
	char *tools;            /* chat: the "tools" array as JSON text, or NULL */
	int tool_choice;        /* enum web_tool_choice */
	char tool_name[128];    /* WEB_TOOLS_NAMED: the function */
	int parallel_tool_calls;
	int tool_format; /* enum web_tool_format, set with the prompt (0: no tools) */
	int mistral_ids; /* call ids of 9 alphanumeric characters */
	/* the other APIs (set by their parsers; zero for OpenAI's chat and completions) */
	int api;                  /* enum web_api */
	struct json_t *echo;      /* responses: the request's fields a reply repeats (owned) */
	struct json_t *history;   /* responses: the conversation's input items (owned) */
	struct web_rstore *store; /* responses: where a stored reply goes (borrowed) */
	int store_reply;          /* responses: "store" (default true) */
	int max_ctx;  /* ollama num_ctx: prompt + reply within this (0 = the engine's) */
	int raw;      /* ollama generate: the prompt as given, no template */
	int *ctx_ids; /* ollama generate: "context" ids before the prompt (owned) */
	int n_ctx_ids;
	/* embeddings: inputs as text or as token ids (owned), the output's form */
	char **inputs;
	int **input_ids;
	int *input_len;
	int n_inputs;
	int base64;     /* encoding_format "base64" */
	int dimensions; /* > 0: the first this many values, normalised again */
	int legacy;     /* ollama /api/embeddings: one "embedding" of one "prompt" */
	int truncate;   /* an input longer than the context is cut to it (else 400) */
	int no_work;    /* answered at once without a job (ollama: nothing to embed, a load) */
	int thinking;   /* anthropic: thinking enabled (reasoning goes out as thinking blocks) */
	int think_open; /* the prompt opened <think>: the reply starts with reasoning (api.c) */
} web_req_t;

enum web_tool_choice { WEB_TOOLS_NONE = 0, WEB_TOOLS_AUTO, WEB_TOOLS_REQUIRED, WEB_TOOLS_NAMED };
enum web_tool_format {
	WEB_TC_OFF = 0,
	WEB_TC_HERMES,
	WEB_TC_LLAMA3,
	WEB_TC_MISTRAL,
	WEB_TC_FORCED,
	WEB_TC_XML,     /* Qwen3.5 (llama.cpp's "Qwen3-Coder" form): <function=NAME><parameter=K> */
	WEB_TC_HARMONY, /* gpt-oss: every reply is parsed into its channels (tools.c) */
	WEB_TC_GLM4     /* GLM-4.5/4.6: <tool_call>NAME then <arg_key>/<arg_value> pairs */
};
/* A finish of a reply that ended in tool calls (beside enum eng_finish's values). */
#define WEB_FINISH_TOOL_CALLS 100

/* Parses and validates a body for kind. Returns 0, or the HTTP status (400; 413 for a body
 * nested or numerous beyond the WEB_JSON_* caps, which a linear pre-scan finds before any tree is
 * built) with err filled. Always leaves r safe to pass to web_req_clear. Never reads past len.
 * (server.c lets at most WEB_PARSE_CONCURRENCY calls run at once.) */
int web_req_parse(web_req_t *r, int kind, const char *body, size_t len, web_err_t *err);
void web_req_clear(web_req_t *r);

/* The pieces of web_req_parse the other APIs reuse. web_json_load: the body's JSON object with
 * the same bounds (pre-scan, depth, counts); 0 or the status with err filled. web_req_from_json:
 * r (already cleared and of kind) from an OpenAI-shaped chat/completions object, which the other
 * APIs build from their own request; the caller keeps root. */
int web_json_load(const char *body, size_t len, struct json_t **root, web_err_t *err);
void web_req_init(web_req_t *r, int kind);
int web_req_from_json(web_req_t *r, struct json_t *root, web_err_t *err);
/* Field readers with OpenAI-style errors naming k (absent or null leaves *out alone). */
int web_get_num(struct json_t *o, const char *k, double lo, double hi, float *out, web_err_t *e);
int web_get_int(struct json_t *o, const char *k, long long lo, long long hi, long long *out,
		int *given, web_err_t *e);
int web_get_bool(struct json_t *o, const char *k, int *out, web_err_t *e);
/* The text of v: a string, or an array of parts {"type", "text"} whose type is one of types
 * (space-separated; "refusal" parts are skipped), joined. *out a new JSON string, or the 400
 * with e filled (param names the field). */
int web_text_parts(struct json_t *v, const char *param, const char *types, struct json_t **out,
		   web_err_t *e);

/* ---- tools and structured output (tools.c) ----------------------------------------------------
 */

/* request.c: the tool and response_format fields of root; and one message's tool_calls /
 * tool_call_id (m->role already set). 0 or the HTTP status with e filled. */
int web_req_parse_tools(web_req_t *r, struct json_t *root, web_err_t *e);
int web_msg_parse_tools(eng_msg_t *m, struct json_t *jm, size_t i, web_err_t *e);
/* The chat prompt with tools (and the grammar of a forced call). 0, or an engine error code
 * with msg filled, or an HTTP status (>= 400) with e filled. */
int web_chat_prompt(eng_t *eng, web_req_t *r, int **ids, int *n_ids, char *msg, size_t msglen,
		    web_err_t *e);
struct web_job;
/* Scheduler side, with the job's mutex held: after text was appended (streams the part that
 * cannot be a call), and once at the end of a job with tools or a grammar (turns calls into
 * tool_calls; a constrained value that closed on the last allowed token ends as "stop"). */
void web_tools_on_text(struct web_job *j);
void web_tools_finish(struct web_job *j);
/* For api.c: of the content s[0..n) of j's reply, the bytes surely not part of a call; and the
 * calls in it (OpenAI's tool_calls array, new reference, or NULL) with *content_len the bytes of
 * content before them. */
size_t web_tools_safe(const struct web_job *j, const char *s, size_t n);
struct json_t *web_tools_parse(struct web_job *j, const char *s, size_t n, size_t *content_len);
/* gpt-oss (harmony, tool_format WEB_TC_HARMONY): the reply's reasoning and content channels,
 * each joined, appended to reasoning and content (as far as a parse of the text so far shows
 * them, all of it when final); *calls (when calls != NULL): its tool calls, OpenAI's tool_calls
 * array (new reference, maybe empty). */
void web_harmony_read(struct web_job *j, int final, web_buf_t *reasoning, web_buf_t *content,
		      struct json_t **calls);
/* A structured value that closed on the last allowed token ends as "stop" (tools.c). */
void web_grammar_finish(struct web_job *j, const char *s, size_t n);

/* ---- replies (respond.c) -------------------------------------------------------------------- */

/* Replaces invalid UTF-8 in s[0..n) with U+FFFD, appending to out. */
int web_utf8_repair(web_buf_t *out, const char *s, size_t n);
/* A JSON string of s[0..n) (NULL: ""), invalid UTF-8 repaired; new reference or NULL. */
struct json_t *web_json_str(const char *s, size_t n);
/* Compact JSON text of root, which is freed (NULL in, NULL out). */
char *web_json_dump(struct json_t *root);
/* The first occurrence of needle in s[0..n), or NULL. */
const char *web_find(const char *s, size_t n, const char *needle);

/* {"error": {...}} as a malloc'd string. */
char *web_json_error(const web_err_t *e);

/* "stop" / "length" / NULL for other finishes. */
const char *web_finish_name(int finish);

typedef struct web_usage {
	int prompt_tokens, completion_tokens;
} web_usage_t;

/* Identity shared by every chunk of one reply. */
typedef struct web_reply_id {
	int kind;
	char id[48];       /* "chatcmpl-..." or "cmpl-..." */
	long long created; /* unix seconds */
	const char *model;
	struct json_t *tool_calls; /* chat reply that ends in calls: its tool_calls (owned) */
	struct json_t *reasoning;  /* its reasoning_content (a JSON string, owned), or NULL */
} web_reply_id_t;

/* The whole non-streaming reply. logprobs (may be NULL) is stolen: it is the array of
 * {token, logprob, bytes, top_logprobs} entries collected while generating. */
char *web_json_reply(const web_reply_id_t *rid, const char *text, size_t text_len, int finish,
		     const web_usage_t *u, struct json_t *logprobs);

/* One streaming chunk. role: first chunk of a chat ("assistant") or NULL; text may be NULL;
 * finish: ENG_FINISH_NONE for content chunks; with_usage_null adds "usage": null (OpenAI sends it
 * on every chunk once include_usage is on). logprobs (may be NULL) is stolen. */
char *web_json_chunk(const web_reply_id_t *rid, const char *role, const char *text, size_t text_len,
		     int finish, int with_usage_null, struct json_t *logprobs);

/* The final usage-only chunk ("choices": []). */
char *web_json_usage_chunk(const web_reply_id_t *rid, const web_usage_t *u);

/* One chosen token's log-probability entry: {token, logprob, bytes, top_logprobs}. texts of the
 * alternatives come from the engine (eng_detokenize) and may be NULL when unknown. */
struct json_t *web_json_logprob(const char *text, size_t text_len, float logprob,
				const eng_logprob_t *top, int n_top, char *const *top_texts);

/* Appends "data: JSON\n\n" (takes ownership of json, frees it; NULL = out of memory). */
int web_sse_add(web_buf_t *out, char *json);

/* ---- the queue and the scheduler (sched.c) ----------------------------------------------------
 */

enum web_job_state { JOB_QUEUED = 0, JOB_RUNNING, JOB_DONE };

typedef struct web_sched web_sched_t;

/*
 * An API other than OpenAI's chat/completions: how its replies look. The scheduler calls the
 * stream hooks with the job's mutex held (api.c decides what is reasoning, content or a call);
 * the connection calls reply and error once the job is done. NULL hooks are skipped.
 */
struct web_job;
typedef struct web_proto {
	int api;                          /* enum web_api */
	const char *stream_ctype;         /* "text/event-stream" or "application/x-ndjson" */
	int keepalive;                    /* SSE comments may go out while the reply waits */
	void (*start)(struct web_job *j); /* stream: opening events */
	void (*delta)(struct web_job *j, int reasoning, const char *s, size_t n); /* stream */
	void (*finish)(struct web_job *j);  /* stream: closing events, or the error's */
	char *(*reply)(struct web_job *j);  /* whole reply (malloc'd), job done and without error */
	char *(*error)(const web_err_t *e); /* an error body in the API's shape (malloc'd) */
} web_proto_t;

/* What api.c and the API files keep per job (under the job's mutex). */
typedef struct web_api_job {
	int think;        /* reasoning: 0 undecided, 1 inside <think>, 2 over (or none) */
	size_t r0, r_len; /* reasoning text: text[r0 .. r0 + r_len) */
	size_t r_sent;    /* reasoning bytes streamed */
	size_t c0;        /* content starts at text[c0] */
	size_t c_len;     /* at the end: content bytes before any call */
	int seq_no;       /* responses: the next sequence_number */
	int index;        /* anthropic: content blocks opened; responses: output items */
	int open, r_open; /* a text / reasoning block or item is open */
	char item_id[80], r_item_id[80];
	int *ids; /* ollama generate: generated ids, for "context" */
	int n_ids, cap_ids;
	int64_t t0_ns; /* acceptance (durations) */
} web_api_job_t;

/* One accepted request. Shared by its connection and the scheduler (reference counted); mu
 * guards out, state and the result fields; the connection waits on cv. */
typedef struct web_job {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int refs;
	web_req_t req;
	int *ids; /* prompt token ids (owned) */
	int n_ids;
	web_reply_id_t rid;
	char model[128];         /* rid.model points here */
	int64_t deadline_ms;     /* now_ms() clock */
	atomic_int cancel;       /* enum web_cancel */
	int state;               /* enum web_job_state */
	web_buf_t out;           /* streaming: SSE bytes not yet sent to the client */
	web_buf_t text;          /* non-streaming: the completion text */
	struct json_t *logprobs; /* non-streaming with logprobs: array of entries */
	eng_result_t res;
	web_err_t err;                  /* status != 0 when the request failed */
	int sent_role; /* streaming: the opening went out (OpenAI's role chunk, another API's
			* start events): once, also when the job resumes on another engine */
	size_t tc_sent;                 /* tools: bytes of text already sent as content (tools.c) */
	size_t rs_sent;                 /* harmony: bytes of reasoning already sent (tools.c) */
	int64_t t_submit_ns, t_last_ns; /* accepted; last token (0 = none yet): TTFT and ITL */
	int64_t t_first_ns;             /* first token (0 = none yet): the request table */
	const char *api;                /* static: "chat", "completions", ... (request table) */
	int keep_text;                  /* the history keeps text: reply's head goes to shown */
	char shown[WEB_TEXT_MAX];       /* the reply's first bytes (keep_text only) */
	size_t shown_len;
	struct web_sched *sched; /* set when the job starts (scheduler thread only) */
	eng_t *eng;
	/* re-plans (sched.c): a job suspended while running goes back to the queue ahead of the
	 * jobs submitted after it and goes on from its state on the next engine */
	eng_seq_state_t *resume; /* suspended: where it goes on (owned); NULL = from its prompt */
	uint64_t order;          /* submission number (the FIFO's order) */
	int64_t wait_from_ms;    /* queued with no engine to run on: since when (0 = there was) */
	int resumed;             /* times it went on after a re-plan */
	int64_t t_suspend_ns;    /* when it was last suspended (the pause, logged) */
	struct web_job *next;    /* queue link (scheduler's mutex) */
	struct web_metrics *metrics;
	void (*wake)(void *);     /* under mu: called with wake_ud whenever cv is broadcast (the */
	void *wake_ud;            /* connection may be parked, see guard.c); NULL = none */
	const web_proto_t *proto; /* another API's replies (api.c); NULL: OpenAI chat/completions */
	web_api_job_t ps;         /* what proto's hooks keep (api.c) */
	/* sequences: 1 for a generation, one per input for embeddings (scheduler's mutex) */
	int n_seq, seq_next, seq_ended, seq_rc;
	float *vecs;           /* embeddings: n_seq x dim, filled by the engine */
	eng_result_t *seq_res; /* embeddings: one result per input */
	int dim;
} web_job_t;

/* Wakes j's waiter (caller holds j->mu): the condition variable and the parked connection. */
static inline void web_job_wake_locked(web_job_t *j)
{
	pthread_cond_broadcast(&j->cv);
	if (j->wake)
		j->wake(j->wake_ud);
}

/* How long a job waits for the next engine during a re-plan (web_opts_t.replan_wait_ms). */
#define WEB_REPLAN_WAIT_MS 30000

/* Why a job ended before its result (web_job_t.cancel). */
enum web_cancel {
	WEB_CANCEL_NONE = 0,
	WEB_CANCEL_GONE,    /* the client went away: 499 */
	WEB_CANCEL_TIMEOUT, /* its deadline passed while it ran: 504 */
	WEB_CANCEL_STOP,    /* the server stops: 503 */
	WEB_CANCEL_REPLAN,  /* no engine came in time (a re-plan; or its deadline passed while it
			       waited for one): 503 + Retry-After */
	WEB_CANCEL_NO_PLAN  /* no plan can serve the model (web_set_unavailable): 503 */
};

/* A new job (refs = 1) owning req's contents (req is moved: zeroed on return) and ids. */
web_job_t *web_job_new(web_req_t *req, int *ids, int n_ids, const char *model, int timeout_ms);
void web_job_ref(web_job_t *j);
void web_job_unref(web_job_t *j); /* NULL-safe; frees at zero */

/* The scheduler. metrics may be NULL (tests). wait_ms: the longest a job waits for an engine
 * during a re-plan (0 = WEB_REPLAN_WAIT_MS). lost (may be NULL) is called with lost_ud from the
 * scheduler thread when a step fails because the engine's group broke (web_engine_lost). */
int web_sched_new(web_sched_t **out, struct web_metrics *m, int queue_max, int wait_ms,
		  web_engine_lost_fn lost, void *lost_ud);
/* Stops: fails queued jobs, cancels the running one, joins the thread; submit then fails.
 * Idempotent; the struct stays valid until web_sched_free (connections may still hold jobs). */
void web_sched_stop(web_sched_t *s);
void web_sched_free(web_sched_t *s); /* stops if needed, then frees; NULL-safe */

/* Enqueues (the queue takes its own reference). Returns 0, SH_EBUSY when full, SH_ENOENT when
 * no engine is attached and none is coming (web_sched_holding), SH_ECLOSED when stopping. */
int web_sched_submit(web_sched_t *s, web_job_t *j);

/* Cancels j for reason (WEB_CANCEL_GONE, _TIMEOUT): a queued job is removed and finished now; a
 * running one is ended by the scheduler before its next step (its slot is free within one
 * step). */
void web_sched_cancel(web_sched_t *s, web_job_t *j, int reason);

/* Engine use from connection threads (tokenizing): acquire returns the engine with a use count
 * held, or NULL when none; release drops it. web_sched_set_engine waits for all uses to end. */
eng_t *web_sched_engine_acquire(web_sched_t *s);
void web_sched_engine_release(web_sched_t *s);
/* web_set_engine (web.h): a detach or a swap suspends the running jobs (their sequences' state
 * kept, back to the head of the queue in their order) and returns once nothing uses the old
 * engine; jobs then wait for the next engine. */
void web_sched_set_engine(web_sched_t *s, eng_t *e);
/* web_set_unavailable (web.h): ends every waiting job (suspended ones too) with 503, why
 * (copied) in the message; submit then fails until the next engine. Call with no engine
 * attached. */
void web_sched_unavailable(web_sched_t *s, const char *why);
/* 1 while a re-plan may bring the next engine (one was attached, and neither
 * web_sched_unavailable nor stop came since): a request that finds no engine to run on waits for
 * it, *wait_ms (may be NULL) the longest. */
int web_sched_holding(web_sched_t *s, int *wait_ms);
/* 1 when an engine that works is attached (jobs can be admitted now). */
int web_sched_ready(web_sched_t *s);

void web_sched_depth(web_sched_t *s, int *queued, int *running);

/* Where finished requests and step times go (history.c); NULL = nowhere. Set before the first
 * submit; the history must outlive the scheduler. */
struct web_history;
void web_sched_set_history(web_sched_t *s, struct web_history *h);

/* 1 when an eng_generate error means the group behind the engine broke (a rank lost or silent,
 * its link failed): the request is answered 503 + Retry-After, as during a re-plan, never 500. */
static inline int web_engine_lost(int rc)
{
	return rc == SH_ECLOSED || rc == SH_ETIMEDOUT || rc == SH_EIO;
}

/* api.c, with the job's mutex held: a token's text was appended to j->text (id: the token); the
 * job ends (error or not): calls, content, the API's closing events. */
void web_api_on_token(web_job_t *j, int id);
void web_api_finish(web_job_t *j);

/* ---- the --exec proxy (proxy.c) ------------------------------------------------------------ */

struct MHD_Connection;
/* Forwards method url with body to 127.0.0.1:port and queues the reply on c, streamed; answers
 * 503 (with Retry-After) when nothing listens there, 502 on a bad reply. Returns libmicrohttpd's
 * result (an enum MHD_Result). stopping: the server's flag (waits end when it is set). */
int web_proxy_answer(struct MHD_Connection *c, int port, const char *method, const char *url,
		     const char *body, size_t body_len, const atomic_int *stopping, int timeout_ms);
/* Does something accept connections on 127.0.0.1:port? (/health of an --exec leader) */
int web_proxy_alive(int port);

/* ---- metrics (metrics.c) -------------------------------------------------------------------- */

#define WEB_MAX_RANKS    256
#define WEB_HIST_BUCKETS 14
#define WEB_MAX_SLOTS    256 /* = ENG_MAX_PARALLEL */

/* A Prometheus histogram with fixed upper bounds (le, ascending; +Inf implied). */
typedef struct web_hist {
	const double *le;                   /* [WEB_HIST_BUCKETS] */
	uint64_t cnt[WEB_HIST_BUCKETS + 1]; /* per bucket (not cumulative); last = +Inf */
	uint64_t count;
	double sum;
} web_hist_t;

typedef struct web_metrics {
	pthread_mutex_t mu;
	uint64_t by_status[600]; /* finished HTTP requests per status code (API paths) */
	uint64_t prompt_tokens, completion_tokens, api_requests;
	atomic_ullong tokens_live; /* generated tokens, bumped per token (dashboard rate) */
	atomic_ullong resumed;     /* requests that went on after a re-plan (sched.c) */
	double last_tps;           /* decode tokens/s of the last finished request */
	double step_ms, comm_ms;   /* negative = unknown */
	int step_external;         /* step_ms comes from web_set_step_metrics, not from results */
	int n_ranks;
	signed char rank_ok[WEB_MAX_RANKS]; /* -1 unknown */
	/* continuous batching (the scheduler thread writes them, under mu) */
	web_hist_t ttft, itl; /* seconds: time to first token, between tokens of a request */
	web_hist_t batch;     /* sequences per step */
	int n_slots;          /* of the engine in use, 0 before the first step */
	signed char slot_state[WEB_MAX_SLOTS]; /* 0 free, 1 prefill, 2 decode */
	uint64_t by_api[WEB_API_N]; /* requests that ended, by the API they came through */
	/* speculative decoding: the engine's figures after the last step (eng_spec_stats) */
	const char *spec_mode; /* "off", "auto", "ngram", "model" (static), NULL before a step */
	eng_spec_stats_t spec;
} web_metrics_t;

void web_metrics_init(web_metrics_t *m);
void web_metrics_destroy(web_metrics_t *m);
const char *web_state_name(int state); /* "serving", "forming", ... */
void web_metrics_status(web_metrics_t *m, int status);
void web_metrics_finished(web_metrics_t *m, const eng_result_t *r);
/* A generation or embedding request ended (any API): counted by API for /metrics (the
 * dashboard's request table names the API of each row: web_job_t.api, history.c). */
void web_metrics_request(web_metrics_t *m, int api);
/* Adds v to h (caller holds m->mu). */
void web_hist_add(web_hist_t *h, double v);
/* The q-quantile (0..1) of h, interpolated within its bucket; 0 when empty (caller holds mu). */
double web_hist_quantile(const web_hist_t *h, double q);
/* The dashboard's batching figures: {"slots": "FPD.", "ttft_p50": s, ...} (new reference). */
struct json_t *web_metrics_batch_json(web_metrics_t *m);

/* Prometheus text exposition into out. */
int web_metrics_prometheus(web_metrics_t *m, web_buf_t *out, int queued, int running, int state);

/* ---- connection guard (guard.c) -------------------------------------------------------------- */

/*
 * libmicrohttpd runs a small pool of event-loop threads, so no callback may block. A reply that
 * waits (a queued job, a stream between tokens, the events stream between snapshots) parks its
 * connection: MHD_suspend_connection from inside the callback, MHD_resume_connection from the
 * thread that has news (the scheduler through web_job_t.wake, or the guard's watch thread). The
 * guard also gives each connection a hard deadline for its request headers and body that bytes
 * trickling in do not extend (libmicrohttpd's own timeout restarts on every byte), and enforces
 * it by shutting the socket down, which libmicrohttpd then sees as a closed peer.
 *
 * Lock order: guard mutex, then the scheduler's, then a job's mu, then a park's mu, then
 * libmicrohttpd's own. Nothing that holds a job's mu takes the guard mutex.
 */
typedef struct web_guard web_guard_t;

/* A connection whose reply waits. Lives inside its owner (stream, events or request state),
 * attached to the guard from creation until its owner is freed (always before libmicrohttpd
 * closes the socket, so fd and c stay valid while attached). */
typedef struct web_park {
	pthread_mutex_t mu; /* guards suspended */
	struct MHD_Connection *c;
	int fd;
	int suspended;
	web_job_t *job;               /* borrowed; the owner holds a reference. NULL for timers */
	_Atomic int64_t wake_at;      /* now_ms() at which the watch thread resumes it; 0 = never */
	struct web_park *prev, *next; /* the guard's list */
} web_park_t;

enum web_phase {
	WEB_PHASE_HEADERS = 0, /* waiting for a request's headers: the header deadline runs */
	WEB_PHASE_BODY,        /* headers done, body uploading: the body deadline runs */
	WEB_PHASE_WORK,        /* request complete: no deadline (the job has its own) */
};

/* Starts the watch thread. header_ms / body_ms: the deadlines. sched: for cancelling jobs whose
 * client went away. */
int web_guard_new(web_guard_t **out, web_sched_t *sched, int header_ms, int body_ms);
/* Refuses new parks and resumes every parked connection (before MHD_stop_daemon, which must not
 * find a suspended one). Idempotent. */
void web_guard_stop(web_guard_t *g);
void web_guard_free(web_guard_t *g); /* stops the watch thread; NULL-safe */

/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION callback (cls = the guard). */
void web_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
		      enum MHD_ConnectionNotificationCode toe);
/* Moves c's deadline to phase (enum web_phase), from now. */
void web_guard_phase(web_guard_t *g, struct MHD_Connection *c, int phase);

/* Attaches p (zeroed by the caller except c, fd, job) / detaches it (before its owner frees). */
void web_park_attach(web_guard_t *g, web_park_t *p);
void web_park_detach(web_guard_t *g, web_park_t *p);
/* From inside a libmicrohttpd callback of p's connection: suspends it. For a job park the caller
 * holds the job's mu, so a wake-up cannot be lost. Returns 1 suspended, 0 when the guard stops
 * (the caller then answers without waiting). */
int web_park_suspend(web_guard_t *g, web_park_t *p);
/* Resumes p if it is suspended; any thread (the job wake hook: void *). */
void web_park_wake(void *p);

/* ---- the dashboard's memory (history.c) ------------------------------------------------------ */

typedef struct web_history web_history_t;

/* One request as the dashboard's table shows it. */
typedef struct web_reqrec {
	uint64_t seq; /* set by web_history_request: 1, 2, ... */
	int64_t t_ms; /* unix time it ended (set by web_history_request when 0) */
	char id[48];  /* the reply's id ("chatcmpl-..."), "" when refused before a job */
	char api[16]; /* "chat", "completions", ... (web_job_t.api) */
	int status;   /* HTTP status of the reply (200 when it streamed to its end) */
	int prompt_tokens, completion_tokens;
	double ttft_ms;  /* acceptance to first token; < 0 unknown */
	double tok_s;    /* decode rate of this request; < 0 unknown */
	char finish[16]; /* "stop", "length", "tool_calls" or "" */
	char error[160]; /* "code: message" when status is not 200 */
	char prompt[WEB_TEXT_MAX], reply[WEB_TEXT_MAX]; /* "" unless show_text */
} web_reqrec_t;

/* A new history reading m and s (s may be NULL: no queue figures) every tick. self names this
 * node in the per-node series (NULL: "self"). show_text: requests keep their text. The sampler
 * thread starts with web_history_start. NULL on ENOMEM. */
web_history_t *web_history_new(web_metrics_t *m, web_sched_t *s, const char *self, int show_text);
int web_history_start(web_history_t *h); /* the 1 s sampler thread; 0 or SH_EIO */
void web_history_free(web_history_t *h); /* stops the thread; NULL-safe */
int web_history_show_text(const web_history_t *h);
/* One sample at unix time t_ms (the sampler thread calls it each second; tests call it). */
void web_history_tick(web_history_t *h, int64_t t_ms);
/* A decode step of this node took step_ms, comm_ms of it communicating (< 0 unknown). */
void web_history_step(web_history_t *h, double step_ms, double comm_ms);
/* Step figures of another node (by id), as the agent learns them. */
void web_history_node_step(web_history_t *h, const char *node, double step_ms, double comm_ms);
/* A cluster event (kind: "join", "leave", "replan", "failover", "rejected", "model", ...). */
void web_history_event(web_history_t *h, const char *kind, const char *text);
/* A request refused before it ran (429, 503, 401...): counted, and one "rejected" event per
 * sample sums them up. */
void web_history_rejected(web_history_t *h, int status, const char *code);
/* The first bytes of src[0..len) into dst (size n), cut at a UTF-8 character boundary, control
 * characters as spaces (a request's text in the table). */
void web_text_head(char *dst, size_t n, const char *src, size_t len);
/* r->error = "code: message" of e, cut to fit. */
void web_reqrec_error(web_reqrec_t *r, const web_err_t *e);
/* Keeps a copy of r (seq and, when 0, t_ms are set here). */
void web_history_request(web_history_t *h, const web_reqrec_t *r);
/* The samples after unix time since_ms, events after event seq ev_after and requests after
 * request seq rq_after (0, 0, 0: everything), as GET /v1/history's object (docs/api.md).
 * New reference, NULL on ENOMEM. */
struct json_t *web_history_json(web_history_t *h, int64_t since_ms, uint64_t ev_after,
				uint64_t rq_after);
/* ---- endpoints: the server's services to generate.c and the API files (server.c) ---------- */

struct MHD_Connection;

/* One request on one connection: its body while it uploads, then the job a whole reply waits
 * for (server.c creates it, generate.c answers through it). */
typedef struct web_conn {
	int route;
	const struct web_route *rt;
	web_buf_t body;
	int too_large;
	size_t discarded; /* body bytes thrown away after too_large */
	int raw_replied;  /* the early 413 went out on the socket (see early_413) */
	web_job_t *job;   /* whole reply pending (a reference), parked in park */
	web_park_t park;
	int parked;            /* park is attached */
	char *url, method[16]; /* proxied requests */
	int64_t hold_until;    /* waiting for the next engine (a re-plan) until then; 0 = not */
} web_conn_t;

/* A generation or embedding endpoint (generate.c runs it). */
typedef struct web_endpoint {
	int kind;                 /* enum web_kind */
	const web_proto_t *proto; /* NULL: OpenAI's chat/completions replies */
	/* body -> request (r is cleared first); 0 or an HTTP status with e filled */
	int (*parse)(web_t *w, web_req_t *r, const char *body, size_t len, web_err_t *e);
	/* request -> prompt ids with the engine held; NULL: the chat template (WEB_CHAT) or the
	 * prompt text or ids (WEB_COMPLETION); embeddings tokenize r->inputs into r->input_ids.
	 * 0 or an HTTP status with e filled. */
	int (*prompt)(eng_t *eng, web_req_t *r, int **ids, int *n_ids, web_err_t *e);
} web_endpoint_t;

/* Any other request a route answers itself (the body, if any, is in cn->body). Returns
 * libmicrohttpd's result. */
typedef int (*web_handler_fn)(web_t *w, struct MHD_Connection *c, web_conn_t *cn);

typedef struct web_route {
	const char *path;
	int route;                 /* server.c's built-ins, or 0 */
	const char *method;        /* the one allowed (HEAD is allowed with GET) */
	int auth;                  /* needs the API key */
	int leader_only;           /* followers redirect it */
	const web_endpoint_t *ep;  /* a generation or embedding */
	web_handler_fn handler;    /* or this */
	const web_proto_t *errors; /* the shape of its errors (NULL: OpenAI's) */
} web_route_t;

/* Queues body (malloc'd and taken; NULL answers 500 out of memory) with status; h1/v1 an extra
 * header or NULL. Counts it in the metrics. */
int web_send(web_t *w, struct MHD_Connection *c, int status, char *body, const char *ctype,
	     const char *h1, const char *v1);
/* An error in proto's shape (NULL: OpenAI's), with Retry-After on 429 and 503. */
int web_send_error(web_t *w, struct MHD_Connection *c, const web_proto_t *proto,
		   const web_err_t *e);
/* A JSON reply (root taken). */
int web_send_json(web_t *w, struct MHD_Connection *c, int status, struct json_t *root);
/* A generation or embedding request of api (enum web_api) refused before it ran: its row in
 * the dashboard's request table (429 and 503 also as "rejected" events), then the error in
 * proto's shape. */
int web_refuse(web_t *w, struct MHD_Connection *c, const web_proto_t *proto, int api,
	       const web_err_t *e);
/* The engine with a use count held when the node serves (release with
 * web_sched_engine_release(web_sched_of(w))), else NULL with e filled (503). */
eng_t *web_engine_get(web_t *w, web_err_t *e);
/* The model's id in replies (e may be NULL). */
void web_model_id(web_t *w, eng_t *e, char *out, size_t len);
web_sched_t *web_sched_of(web_t *w);
struct web_guard *web_guard_of(web_t *w);
struct web_metrics *web_metrics_of(web_t *w);
struct web_rstore *web_rstore_of(web_t *w); /* NULL for w NULL (tests) */
int web_timeout_of(web_t *w);
long long web_started_of(web_t *w);   /* unix seconds */
atomic_int *web_parsing_of(web_t *w); /* bodies being parsed (WEB_PARSE_CONCURRENCY) */
/* During a re-plan a request waits for the next engine (it needs one to tokenize), up to the
 * scheduler's wait, instead of being refused at once: 1 = park cn and come back, 0 = go on,
 * -1 = it waited too long (err set: 503 replanning). */
int web_replan_hold(web_t *w, web_conn_t *cn, web_err_t *err);
/* Parks cn's connection for ms (the parse slots are taken, or no engine yet); the handler runs
 * again then. */
int web_park_retry(web_t *w, struct MHD_Connection *c, web_conn_t *cn, int ms);
int web_conn_fd(struct MHD_Connection *c);

/* generate.c: answers an endpoint's request whose body has arrived; and a parked whole reply
 * that was resumed (cn->job set). */
int web_generate_answer(web_t *w, struct MHD_Connection *c, web_conn_t *cn,
			const web_endpoint_t *ep);
int web_generate_reply(web_t *w, struct MHD_Connection *c, web_conn_t *cn);

/* The endpoints and handlers of each API (their files). */
extern const web_endpoint_t web_ep_chat, web_ep_completions; /* generate.c */
extern const web_endpoint_t web_ep_messages;                 /* anthropic.c */
extern const web_proto_t web_proto_anthropic;
int web_messages_count_tokens(web_t *w, struct MHD_Connection *c, web_conn_t *cn);
extern const web_endpoint_t web_ep_responses;                           /* responses.c */
extern const web_endpoint_t web_ep_ollama_chat, web_ep_ollama_generate; /* ollama.c */
extern const web_proto_t web_proto_ollama;
int web_ollama_tags(web_t *w, struct MHD_Connection *c, web_conn_t *cn);
int web_ollama_ps(web_t *w, struct MHD_Connection *c, web_conn_t *cn);
int web_ollama_show(web_t *w, struct MHD_Connection *c, web_conn_t *cn);
int web_ollama_version(web_t *w, struct MHD_Connection *c, web_conn_t *cn);
extern const web_endpoint_t web_ep_embeddings, web_ep_ollama_embed,
    web_ep_ollama_embeddings; /* embed.c */

/* responses.c: the bounded in-memory store of finished responses (previous_response_id). */
typedef struct web_rstore web_rstore_t;
web_rstore_t *web_rstore_new(size_t max_bytes, int max_items);
void web_rstore_free(web_rstore_t *s); /* NULL-safe */
/* Keeps items (JSON text, taken) under id, dropping the oldest entries to make room; an item
 * larger than the whole store is dropped. Any thread. */
void web_rstore_put(web_rstore_t *s, const char *id, char *items);
/* The items stored under id (a new reference), or NULL (s may be NULL). Any thread. */
struct json_t *web_rstore_get(web_rstore_t *s, const char *id);

/* ---- the page ------------------------------------------------------------------------------- */

extern const char web_dashboard_html[];

#endif
