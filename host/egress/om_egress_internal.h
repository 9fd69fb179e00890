/*
 * om_egress_internal.h: what the gateway's files share (not public).
 *
 * om_egress_call.c runs Layer A for one request: the route order from the
 * fallback policy (a version of it: om_egress_cfg.c), attempts over
 * om_upstream (both provider kinds, JSON and SSE; om_egress_stream.c
 * reads a stream's events, om_egress_names.c resolves routes named by
 * host), classification and
 * the deadline rule from core/om_egress_rules.h, route cooldown, the in-attempt
 * tool-call repair, and the streaming hold. om_egress.c is the server:
 * /v1/chat/completions (and the plumbing om_egress_messages.c and
 * om_egress_responses.c share for /v1/messages and /v1/responses), /v1/turns
 * (Layer C, the quality gate, delivery through connectors), /v1/pending,
 * /metrics, /status, and the errors file.
 */
#ifndef OM_EGRESS_INTERNAL_H
#define OM_EGRESS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>
#include <uv.h>

#include "om_egress.h"
#include "om_list.h"
#include "om_egress_policy.h"
#include "om_metrics.h"
#include "om_policy_watch.h"
#include "om_retry.h"
#include "om_rng.h"
#include "om_upstream.h"

/* Nanoseconds per millisecond: the policy speaks ms, the clocks ns. */
#define MS UINT64_C(1000000)

/* A route's retry budget (core/om_retry.h, in the route's unit): shared
 * by the configs of every policy version that gives the route the same
 * budget, so a reload does not hand a retry storm a fresh one. */
typedef struct eg_budget_s {
  int refs;
  char route[64];
  om_budget_cfg_t cfg;
  om_retry_budget_t *b;
} eg_budget_t;

/* Where a route's calls go: its base_url as a target, the path of each
 * provider call, and the host to resolve when the URL names one. */
typedef struct eg_target_s {
  om_upstream_target_t t; /* addr unset (AF_UNSPEC) when named */
  int named;
  char host[254]; /* the URL's host, as written */
  int port;
  char *path; /* base path + "/chat/completions" or "/messages" */
} eg_target_t;

/* One version of the fallback policy's routes and settings, shared by the
 * calls that started under it (a reload never frees a route in use). */
typedef struct eg_cfg_s {
  int refs;
  om_route_t *routes;
  size_t n;
  om_fallback_settings_t s;
  om_egress_route_state_t *state; /* per route: cooldown (moved on reload) */
  eg_target_t *targets;           /* per route */
  int all_openai; /* every route speaks the OpenAI API (Pass-through) */
  /* per route: openmesh_egress_tokens_total{route,model,kind} for
   * kind prompt, completion, cached (registered on first use) */
  om_metric_t *(*m_tokens)[3];
  /* per route: openmesh_egress_route_attempt_duration_seconds{route}
   * (registered on first use) */
  om_metric_t **m_latency;
  /* per route: the attempts series it used last (most attempts of a
   * route end the same way: no lookup by labels for them) */
  struct eg_series_s {
    int cls, status;
    om_metric_t *m;
  } * m_attempt_last;
  /* per route: its retry budget (NULL: none) and, registered on first
   * use, openmesh_egress_cost_usd_total{route,model} and
   * openmesh_egress_retry_budget_exhausted_total{route} */
  eg_budget_t **budget;
  om_metric_t **m_cost, **m_budget_out;
} eg_cfg_t;

/* Series of openmesh_egress_route_attempts_total{route,class,status} a
 * gateway registers at most (a provider inventing statuses must not
 * grow /metrics without bound); attempts past it are counted in
 * openmesh_egress_route_series_dropped_total. */
#define EG_MAX_ROUTE_SERIES 4096

/* Token usage of one call, in OpenAI terms (prompt includes cached). */
typedef struct eg_usage_s {
  int has; /* the provider reported usage */
  int64_t prompt, completion, cached;
} eg_usage_t;

typedef struct eg_attempt_s {
  char route[64];
  int status;
  const char *cls; /* om_egress_class_name: static */
  om_egress_class_t cls_id;
  uint64_t duration_ns;
  /* when the provider asked to be called again (Retry-After,
   * retry-after-ms), in eg_now_ns time; 0: it did not say */
  uint64_t retry_at_ns;
  eg_usage_t usage; /* a successful attempt's tokens */
  double cost_usd;  /* and their cost; < 0: the route has no price */
} eg_attempt_t;

#define EG_MAX_ATTEMPTS 64

typedef struct om_egress_s om_egress_t;
typedef struct eg_call_s eg_call_t;

/* ---- om_egress_names.c: routes named by host ---------------------------- */

#define EG_NAME_MAX_ADDRS 8

typedef struct eg_name_s eg_name_t;
/* A call waiting for a lookup: cb runs once it ended (ask again). */
typedef struct eg_name_wait_s {
  om_list_t link;
  eg_name_t *name;
  void (*cb)(struct eg_name_wait_s *w);
} eg_name_wait_t;

/*
 * eg_name_get: the nth address (0: the one that last answered) of host
 * into t->addr, with port. 0: filled. 1: a lookup runs and w->cb follows
 * (w must stay put until then or eg_name_cancel). OM_ENOTFOUND with *why:
 * the name did not resolve (tried again a second later), or nth is past
 * its addresses; OM_ENOMEM.
 */
int eg_name_get(om_egress_t *g, const char *host, int port, size_t nth,
                om_upstream_target_t *t, eg_name_wait_t *w, const char **why);
void eg_name_cancel(eg_name_wait_t *w);
/* The nth address of host answered: later calls start there. */
void eg_name_worked(om_egress_t *g, const char *host, size_t nth);
/* At close, once no call is left: lookups in flight free their entry. */
void eg_names_free(om_egress_t *g);

typedef struct eg_hooks_s {
  /* Streaming only: the first non-empty content delta arrived; from now on
   * the call is committed to the current route. */
  void (*commit)(void *ud, eg_call_t *c);
  /* Streaming only, after commit: one content delta. */
  void (*delta)(void *ud, eg_call_t *c, const char *text, size_t len);
  /* The call ended: c->ok, c->result (non-stream), c->text, the attempts.
   * The hook owns nothing; eg_call_free(c) after it is the caller's. */
  void (*done)(void *ud, eg_call_t *c);
  /* Streaming only, after commit: tool-call deltas in the OpenAI shape
   * (an array of {index, id?, type?, function: {name?, arguments?}}),
   * borrowed for the call. A tool-call delta commits the stream like a
   * content delta does. May be NULL (tool calls are then dropped). */
  void (*tool_delta)(void *ud, eg_call_t *c, json_t *tool_calls);
  /* Streaming only, may be NULL: the pass-through of an OpenAI route's
   * stream to a caller of the same API. With it, such a route's events go
   * to raw as the provider sent them (one event's data, a chunk's JSON,
   * borrowed), from the commit on (those held before it first, in order),
   * instead of to delta and tool_delta; the usage chunk only when the
   * caller asked for it; never [DONE] (the done hook ends the stream).
   * eg_call_relaying says which way the current route goes. */
  void (*raw)(void *ud, eg_call_t *c, const char *data, size_t len);
  /* Streaming only, after commit, may be NULL: 1 when the caller has let
   * so much of the stream pile up that the call should stop reading the
   * provider; the hook's owner then calls eg_call_resume once it drained
   * (a slow or never-reading caller must not make the gateway hold a
   * whole stream; the attempt timeout still bounds the wait). */
  int (*backed_up)(void *ud, eg_call_t *c);
} eg_hooks_t;

/* Tool calls one streamed Anthropic reply may carry (content blocks of
 * type tool_use); more end the attempt as a broken stream. */
#define EG_MAX_STREAM_TOOLS 64

/* The caller's chat request, read without a tree: its top-level members
 * (offsets into the body) and what the call needs of them. */
#define EG_REQ_MAX_MEMBERS 64

enum {
  EG_REQ_OTHER,
  EG_REQ_MODEL,
  EG_REQ_STREAM,
  EG_REQ_STREAM_OPTIONS,
  EG_REQ_MESSAGES
};

typedef struct eg_req_member_s {
  int kind;
  size_t start, end; /* from its name's quote to the end of its value */
} eg_req_member_t;

typedef struct eg_req_facts_s {
  eg_req_member_t members[EG_REQ_MAX_MEMBERS];
  size_t n_members;
  size_t n_messages;
  int stream;    /* "stream": true */
  int has_model; /* a "model" string, at model_at (quotes included) */
  size_t model_at, model_len;
  int so_object;     /* "stream_options" is an object */
  int include_usage; /* with "include_usage": true */
} eg_req_facts_t;

typedef struct eg_call_opts_s {
  /* OpenAI chat request (a reference is kept; never changed), or NULL
   * with raw: the caller's body as read by eg_request_scan (copied), so
   * an OpenAI route gets it without a tree; the tree is parsed from it
   * only if a route or the repair needs one */
  json_t *request;
  const char *raw;
  size_t raw_len;
  const eg_req_facts_t *raw_facts;
  int stream;          /* hold and stream content deltas */
  const char *agent;   /* for order(ctx); may be NULL */
  const char *context; /* "interactive" | "async" */
  const char *channel;
  const char *only_route; /* the judge: this route only */
  /* the caller's model: with the policy's models, the alias naming the
   * chain (unknown: OM_ENOTFOUND); also ctx.model for order(ctx). May be
   * NULL. */
  const char *model;
  /* out: why the request cannot be translated for a route of the chain
   * (eg_call_start returns OM_EINVAL); may be NULL */
  char *why;
  size_t why_len;
  uint32_t max_attempts; /* 0: the policy's */
  uint64_t deadline_ms;  /* 0: the policy's */
  /* when the caller's request was handed to the gateway (eg_now_ns), the
   * start of the call's overhead; 0: when the call starts */
  uint64_t received_ns;
} eg_call_opts_t;

struct eg_call_s {
  om_egress_t *g;
  eg_cfg_t *cfg;
  eg_hooks_t hooks;
  void *ud;
  json_t *request; /* NULL until needed when raw is set */
  char *raw;       /* the caller's body (eg_call_opts_t.raw), or NULL */
  size_t raw_len;
  eg_req_facts_t *raw_facts;
  int stream;
  int include_usage; /* the caller asked for the final usage chunk */
  char *agent, *context, *channel, *only_route, *model;
  int alias; /* the model alias in cfg->s.models choosing the chain; -1 */
  uint32_t max_attempts;
  om_deadline_t deadline;
  uint64_t started_ns;
  /* The gateway's own time (eg_call_overhead_ns): since received_ns, less
   * the time away: a provider exchange in flight outside the call's
   * callbacks, a name lookup, a backoff wait. away_since_ns: 0 while the
   * call's own code runs. */
  uint64_t received_ns, away_ns, away_since_ns;
  /* routes */
  unsigned char *done_route; /* per cfg route: abandoned */
  size_t cur;                /* current route index */
  uint32_t attempts_on_route;
  /* the attempt in flight */
  om_upstream_req_t *up;
  eg_name_wait_t wait; /* for a route named by host */
  size_t addr_nth;     /* which of its addresses */
  int waiting;         /* for the name's lookup */
  int paused;          /* the caller is backed up (hooks.backed_up) */
  om_http_header_t hdrs[3];
  size_t n_hdrs;
  int first_byte_bound; /* the head timeout is the first-byte timeout */
  char *req_body;
  size_t req_bytes; /* of the last attempt's body: a retry's estimate */
  uv_timer_t timer; /* backoff waits */
  int timer_active, closing;
  uint64_t attempt_start_ns;
  int got_byte, repaired, status;
  char retry_after[64], retry_after_ms[64], x_should_retry[16];
  char *body;
  size_t body_len, body_cap;
  void *sse; /* om_sse_parser_t */
  int stream_done;
  /* a relayed stream's events before the commit: each a size_t length and
   * its bytes */
  char *held;
  size_t held_len, held_cap;
  char *scratch; /* decoded content of the facts scan */
  size_t scratch_cap;
  char finish[32];
  /* Anthropic stream: the content block index of each tool_use block, in
   * order; its position is the OpenAI tool_calls index */
  int tool_block[EG_MAX_STREAM_TOOLS];
  size_t n_tools;
  eg_usage_t usage; /* the attempt in flight's (a stream's, as it comes) */
  double cost_usd;  /* of the successful attempt, by the route's price */
  /* results */
  int ok, committed;
  json_t *result; /* OpenAI chat.completion (non-stream) */
  /* an OpenAI route's answer as it came (result parsed from it), so an
   * OpenAI caller gets it without a second encoding; NULL otherwise */
  char *raw_result;
  size_t raw_result_len;
  char *text; /* the assistant content */
  size_t text_len, text_cap;
  /* the first EG_MAX_ATTEMPTS attempts, grown as they come (most calls
   * make one: a call stays small to allocate and clear) */
  eg_attempt_t *attempts;
  size_t n_attempts, n_attempts_total, attempts_cap;
  om_egress_verdict_t last; /* the last attempt's verdict */
  const char *stop_why;
  char route_model[128];
  /* Texts last: eg_call_start clears the call up to here (EG_CALL_CLEAR)
   * and only their first bytes beyond. */
  char auth[1100];
  char cause_name[400]; /* why the attempt could not start */
  char cause[1024];     /* internal only: never shown to a person */
};

#define EG_CALL_CLEAR offsetof(eg_call_t, auth)

struct om_egress_s {
  uv_loop_t *loop;
  om_upstream_pool_t *pool; /* provider calls */
  om_list_t names;          /* om_egress_names.c */
  om_policy_watch_t *fallback, *heuristics;
  eg_cfg_t *cfg;
  om_rng_t rng;
  om_metrics_t *metrics;
  om_metric_t *m_attempts[OM_EGRESS_C__COUNT];
  om_metric_t *m_fallbacks, *m_cooldown_skips, *m_stream_broken;
  om_metric_t *m_route_series_dropped;
  size_t n_route_series;   /* registered route-attempt series */
  struct eg_server_s *srv; /* om_egress.c */
};

int eg_call_start(om_egress_t *g, const eg_call_opts_t *o,
                  const eg_hooks_t *hooks, void *ud, eg_call_t **out);
/* Whether request (an OpenAI chat request, borrowed) can be sent to every
 * route of the current fallback policy: 0, or OM_EINVAL with why naming
 * the field that cannot be translated (eg_call_start refuses such a
 * request the same way). */
int eg_call_check(om_egress_t *g, json_t *request, char *why, size_t why_len);
/* What the call has cost the gateway itself up to now: its time since
 * the request was received, less the time it was waiting on a provider, a
 * name lookup or a backoff (docs/EGRESS.md "The gateway's own time"). */
uint64_t eg_call_overhead_ns(const eg_call_t *c, uint64_t now);
/* Read the provider again after the backed_up hook said stop. */
void eg_call_resume(eg_call_t *c);
/* Stop a call without running its done hook (the client went away). */
void eg_call_cancel(eg_call_t *c);
/* After the done hook: release it. */
void eg_call_free(eg_call_t *c);

void eg_cfg_unref(eg_cfg_t *cfg);
/* The index of model in cfg's aliases, -1 when it names none. */
int eg_cfg_alias(const eg_cfg_t *cfg, const char *model);
/* Build the config of the current fallback policy (keeps cooldown state of
 * routes with the same name from prev). */
int eg_cfg_build(om_policy_t *p, const eg_cfg_t *prev, eg_cfg_t **out,
                 char *err, size_t errlen);

uint64_t eg_now_ns(void);

/* ---- om_egress_call.c, for the stream translation ---------------------- */

/* One content delta of the attempt in flight: commits the stream on the
 * first non-empty one, then goes to the delta hook. */
void eg_call_content(eg_call_t *c, const char *s, size_t n);
/* Tool-call deltas in the OpenAI shape (borrowed): commit the stream like
 * content does, then go to the tool_delta hook. */
void eg_call_tool_calls(eg_call_t *c, json_t *tool_calls);
/* 1 when the current route's stream goes to the raw hook. */
int eg_call_relaying(const eg_call_t *c);
/* Append to the assistant content the call keeps (c->text). */
void eg_call_text_append(eg_call_t *c, const char *s, size_t n);
/* The attempt's SSE parser callback (om_sse.h): one provider event. */
struct om_sse_event_s;
int eg_call_sse_event(void *ud, const struct om_sse_event_s *ev);

/* ---- om_egress_facts.c (docs/EGRESS.md "Pass-through") ------------------ */

/* What the call reads of an OpenAI chat.completion or chunk. */
typedef struct eg_facts_s {
  size_t n_choices;    /* elements of choices (an array) */
  const char *content; /* choices[0].{message|delta}.content, decoded */
  size_t content_len;
  int has_content; /* it is a string */
  size_t n_tools;  /* elements of its tool_calls (an array) */
  char finish[32]; /* choices[0].finish_reason */
  int has_finish;
  int has_usage_key; /* a usage member, of any type */
  eg_usage_t usage;  /* its integer counts, as eg_usage_from_openai */
  int has_prompt_tokens, has_completion_tokens, has_cached;
  int error; /* an error member, of any type */
} eg_facts_t;

/*
 * eg_facts_scan: the facts of text (a completion, or with chunk set one
 * stream chunk) into *f, content decoded into *scratch (grown, *cap its
 * size). 0; OM_EPARSE when the scanner is not sure it is a JSON object
 * jansson would accept (read it with jansson then); OM_ENOMEM.
 */
int eg_facts_scan(const char *text, size_t len, int chunk, eg_facts_t *f,
                  char **scratch, size_t *cap);
/* The usage counts f has into *u, replacing those in *u (as
 * eg_usage_from_openai does for a usage object). */
void eg_facts_usage(const eg_facts_t *f, eg_usage_t *u);

/*
 * eg_request_scan: text as an OpenAI chat request the gateway accepts as
 * it is (a JSON object jansson would take, messages a non-empty array of
 * objects with a string role, stream a boolean, model a string), its
 * facts into *f. 0; OM_EPARSE for anything else, which the tree path
 * then answers (with the precise refusal).
 */
int eg_request_scan(const char *text, size_t len, eg_req_facts_t *f);
/*
 * eg_openai_body: the request text (read by eg_request_scan into f) for
 * an OpenAI route, as eg_to_openai makes it: model set to the route's,
 * stream with stream_options.include_usage, or neither. f must not have
 * a stream_options object when stream is set (the tree path keeps its
 * other fields). A new buffer of *out_len bytes; NULL when out of memory.
 */
char *eg_openai_body(const char *text, const eg_req_facts_t *f,
                     const char *model, int stream, size_t *out_len);

/* ---- om_egress_translate.c (docs/EGRESS.md "Translation") --------------- */

/* 1 when the route speaks the Anthropic messages API. */
int eg_route_is_anthropic(const om_route_t *r);
/*
 * The OpenAI chat request req (borrowed) as an Anthropic messages request
 * for route r, streaming when stream is set (docs/EGRESS.md
 * "Translation"). 0 and a new reference in *out; OM_EINVAL with why (a
 * sentence naming the field) when a field has no Anthropic equivalent or
 * cannot be translated; OM_ENOMEM.
 */
int eg_to_anthropic(json_t *req, const om_route_t *r, int stream, json_t **out,
                    char *why, size_t whylen);
/* The OpenAI chat request req (borrowed) for an OpenAI route r: the
 * route's model, stream as given. A new reference; NULL when out of
 * memory. */
json_t *eg_to_openai(json_t *req, const om_route_t *r, int stream);
/* An Anthropic message (borrowed) as an OpenAI chat.completion naming
 * model. A new reference; NULL when out of memory. */
json_t *eg_from_anthropic(json_t *msg, const char *model);
/* One parsed event (borrowed) of an Anthropic stream for the call's
 * attempt in flight: content and tool-call deltas through eg_call_content
 * and eg_call_tool_calls, the finish reason into c->finish, the end or a
 * break into c->stream_done. */
void eg_anthropic_sse_event(eg_call_t *c, json_t *j);
/* Anthropic stop_reason -> OpenAI finish_reason (NULL: "stop"). */
const char *eg_finish_reason(const char *stop_reason);
/* Read a provider's usage object (borrowed; either shape) into *u, the
 * fields it has replacing those in *u. */
void eg_usage_from_anthropic(json_t *usage, eg_usage_t *u);
void eg_usage_from_openai(json_t *usage, eg_usage_t *u);
/* *u as an OpenAI usage object (prompt_tokens_details.cached_tokens when
 * some were cached). A new reference; NULL when out of memory. */
json_t *eg_usage_json(const eg_usage_t *u);

#endif /* OM_EGRESS_INTERNAL_H */
