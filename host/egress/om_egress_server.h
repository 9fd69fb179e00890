/*
 * om_egress_server.h: the structures of the egress gateway's server, shared
 * by om_egress.c (the endpoints, /v1/chat/completions, admin, lifecycle,
 * error tracking) and om_egress_turns.c (agent turns: the quality gate,
 * delivery through the connectors, Layer C). Not a public API.
 */
#ifndef OM_EGRESS_SERVER_H
#define OM_EGRESS_SERVER_H

#include "om_appendfile.h"
#include "om_connector.h"
#include "om_egress_internal.h"
#include "om_list.h"

#define MAX_CHANNELS 64

#define TURN_OF(node) OM_LIST_ENTRY(node, turn_t, link)

typedef struct channel_s {
  char *name;
  om_connector_t *conn;
} channel_t;

enum { T_RUNNING, T_JUDGING, T_DELIVERING, T_WAITING, T_DONE };

typedef struct turn_s {
  struct om_egress_s *g;
  char id[32], error_id[40];
  char *agent, *conversation, *run_id, *context, *channel, *key;
  channel_t *ch;
  json_t *request;
  om_http_request_t *req; /* the caller, until answered */
  eg_call_t *call, *judge;
  int state, interactive, cycles;
  int answered;          /* the HTTP answer went out */
  int final_delivered;   /* the real answer or the handoff went out */
  int holding_delivered; /* the holding line went out */
  int review;            /* sent after a judge failure: offline review */
  int delivering_final;  /* what the delivery in flight is */
  int final_handoff;     /* the final message is the handoff line */
  int final_failed;      /* the channel refused the final message */
  const char *outcome;
  json_t *attempts; /* every attempt over every cycle */
  json_t *answer;   /* the stored answer (idempotent replay) */
  char *candidate;  /* text waiting for the judge */
  int flag_level;
  char flags[256];
  uint64_t created_ns, commit_deadline_ns, next_retry_ns;
  uv_timer_t timer;
  int timer_init;
  om_list_t link; /* on the server's turns */
} turn_t;

/* The inbound API a call came in by: its request and answer shapes,
 * errors included (docs/EGRESS.md "Endpoints"). */
typedef enum { EG_API_CHAT, EG_API_MESSAGES, EG_API_RESPONSES } eg_api_t;

typedef struct chat_s {
  struct om_egress_s *g;
  om_http_request_t *req; /* the caller, until answered */
  eg_call_t *call;
  int started; /* the SSE answer has begun */
  eg_api_t api;
  char id[40];
  void *st;                /* the API's stream state (owned) */
  void (*st_free)(void *); /* releases st; may be NULL */
  om_list_t link;          /* on the server's chats */
} chat_t;

/*
 * The errors file (--errors): one JSON line per EgressError. It follows
 * its path like the file connector does (a rotated or deleted file is
 * replaced by a new one at the path, compared by st_dev/st_ino before
 * each line), and a failing write is counted and logged once per streak,
 * never raised: error tracking must not fail the turn it tracks.
 */
typedef struct errors_file_s {
  char *path;
  om_appendfile_t file; /* follows path (om_appendfile.h) */
  int failing; /* the last write failed: logged once, until one succeeds */
  om_metric_t *m_fail[2]; /* op="write", op="reopen" */
} errors_file_t;

typedef struct eg_server_s {
  om_http_server_t *http;
  channel_t channels[MAX_CHANNELS];
  size_t n_channels;
  errors_file_t *errors;
  om_list_t turns; /* turn_t, newest first */
  size_t n_turns;
  om_list_t chats; /* chat_t in flight */
  uint64_t seq;
  char *lib_dir;
  void (*closed_cb)(void *);
  void *closed_ud;
  int closing, open_parts;
  /* openmesh_egress_turn_ends_total{first,end}: [first][end] */
  om_metric_t *m_turn_ends[4][4];
  om_metric_t *m_turns[4], *m_errors[2], *m_gate[6], *m_chat[3], *m_duplicates,
      *m_reload_failed, *m_deliver_failed, *m_review;
  /* openmesh_egress_requests_refused_total{api}: by eg_api_t */
  om_metric_t *m_refused[3];
  /* openmesh_egress_overhead_seconds{api}: by eg_api_t */
  om_metric_t *m_overhead[3];
  /* when the request being dispatched reached on_request (eg_now_ns):
   * valid while its handler runs */
  uint64_t dispatch_ns;
} eg_server_t;

/* ---- om_egress.c, for the turns and the inbound APIs ---- */

#define EG_REQUEST_ID_CAP 129
/* The X-Request-Id of req's answer into out (EG_REQUEST_ID_CAP bytes):
 * the caller's when it is 1..128 visible ASCII characters, else a new
 * one. */
const char *eg_request_id(const om_http_request_t *req, char *out);
/* Answer j (taken) with status; an error (>= 400) says x-should-retry:
 * true with Retry-After when retry_after_s > 0, else false. */
void eg_respond(om_http_request_t *req, int status, json_t *j,
                unsigned retry_after_s);
/* An error of the gateway's own in api's shape: OpenAI's {"error":
 * {type, message}} (chat, responses), Anthropic's {"type": "error",
 * "error": {type, message, reason}} (messages: type Anthropic's class
 * for the status, reason the gateway's stable type). attempts (taken,
 * may be NULL) goes into the error object. */
void eg_respond_api_error(om_http_request_t *req, eg_api_t api, int status,
                          const char *type, const char *message,
                          unsigned retry_after_s, json_t *attempts);
/* The body of req as a JSON object (duplicate keys refused); NULL with
 * why naming the problem. */
json_t *eg_parse_body(om_http_request_t *req, const char **why);

/*
 * eg_inbound_chat: the body of an inbound API request (api: messages or
 * responses) and its internal chat form by to_chat (eg_messages_to_chat,
 * eg_responses_to_chat): 0 with new references in *body and *chat, or -1
 * once req was answered in the API's error shape (400 naming the field,
 * counted as refused; 503 without memory). In om_egress_inbound.c.
 */
int eg_inbound_chat(struct om_egress_s *g, om_http_request_t *req, eg_api_t api,
                    int (*to_chat)(json_t *, json_t **, char *, size_t),
                    json_t **body, json_t **chat);
/* One SSE event (j taken; event NULL: a data-only event). */
void eg_sse_write(om_http_request_t *req, json_t *j, const char *event);
/* Start ch's 200 text/event-stream answer. */
void eg_sse_start(chat_t *ch);
/*
 * eg_chat_run: run request (an OpenAI chat request, borrowed) through
 * Layer A for the caller req with hooks (their ud is the chat_t); or,
 * with request NULL, req's own body as eg_request_scan read it into raw
 * (the chat API's pass-through). model
 * is the caller's model (an alias when the policy declares models). st
 * (released by st_free) is the API's state, owned by the chat from here
 * whatever happens. When the call cannot start the answer (400
 * invalid_request naming the field, 404 model_not_found, 503) is sent in
 * api's shape and the error code returned.
 */
int eg_chat_run(struct om_egress_s *g, om_http_request_t *req, eg_api_t api,
                json_t *request, const eg_req_facts_t *raw, const char *model,
                const eg_hooks_t *hooks, void *st, void (*st_free)(void *));
/*
 * eg_chat_finish: a done hook's whole work, the same for every inbound
 * API: count the call and track a failure; then, if the caller is still
 * there, end a committed stream with stream_end's events (ok or not: a
 * committed stream is never replayed) and the end of the response, or
 * answer 200 with whole(ch, c) (a new reference; whole NULL: the
 * provider's answer as it came, c->raw_result), or the final error in
 * ch's shape; then release the chat, its call and state.
 */
void eg_chat_finish(chat_t *ch, eg_call_t *c,
                    void (*stream_end)(chat_t *ch, eg_call_t *c),
                    json_t *(*whole)(chat_t *ch, eg_call_t *c));

/* What a failed call answers (docs/EGRESS.md "Final errors"). */
typedef struct {
  int status;
  const char *type, *message;
  unsigned retry_after_s; /* 0: x-should-retry: false */
} eg_final_t;
void eg_final_outcome(const eg_call_t *c, uint64_t now, eg_final_t *f);

char *eg_strdup(const char *s); /* strdup(NULL) is NULL */
/* Count a finished turn under its outcome (delivered, held, ...). */
void eg_outcome_metric(om_egress_t *g, const char *outcome);
/* How a turn ended, after its first answer (first: an outcome above; end:
 * "delivered", "handed_off", "undelivered" or "expired"):
 * openmesh_egress_turn_ends_total{first,end}. */
void eg_turn_end_metric(om_egress_t *g, const char *first, const char *end);
/* Answer with j (taken), or a 500 when j is NULL or cannot be encoded. */
void eg_respond_json(om_http_request_t *req, int status, json_t *j);
void eg_respond_error(om_http_request_t *req, int status, const char *type,
                      const char *message);
/* The same with `x-should-retry: true` and `Retry-After: retry_after_s`
 * (> 0): a retry by the caller after that long can succeed (draining). An
 * error answer without it says `x-should-retry: false`. */
void eg_respond_error_retry(om_http_request_t *req, int status,
                            const char *type, const char *message,
                            unsigned retry_after_s);
json_t *eg_attempts_json(const eg_call_t *c);
/* An id (agent, conversation, run): what om_agent_message_new accepts. */
int eg_valid_id(const char *s);
/* One line in the errors file and one log line per EgressError. */
void eg_track_error(om_egress_t *g, turn_t *t, const eg_call_t *c,
                    om_egress_error_class_t cls, int retryable,
                    const char *cause, const char *kind);

/* ---- om_egress_turns.c, for the server ---- */

/* ---- om_egress_chat.c, om_egress_messages.c, om_egress_responses.c ---- */

/* POST /v1/chat/completions (OpenAI chat API). */
void eg_handle_chat(struct om_egress_s *g, om_http_request_t *req);
/* One SSE event ("event: E" when event is not NULL, then "data: D"), one
 * chunk on the wire when it fits 4 KiB. */
void eg_sse_event(om_http_request_t *req, const char *event, const char *data,
                  size_t len);

/* POST /v1/messages (Anthropic Messages API). */
void eg_handle_messages(struct om_egress_s *g, om_http_request_t *req);
/* POST /v1/responses (OpenAI Responses API). */
void eg_handle_responses(struct om_egress_s *g, om_http_request_t *req);

/* POST /v1/turns and GET /v1/pending. */
void eg_handle_turn(om_egress_t *g, om_http_request_t *req);
void eg_handle_pending(om_egress_t *g, om_http_request_t *req);
/* Release a turn whatever its state (its call, judge, timer; the list). */
void eg_turn_free(turn_t *t);

#endif /* OM_EGRESS_SERVER_H */
