/*
 * om_egress.c: the egress gateway's server (om_egress.h): the HTTP
 * endpoints, agent turns with the quality gate, delivery through the
 * channels' connectors, Layer C degradation and error tracking. Layer A
 * for each model call is om_egress_call.c.
 *
 * The one rule every path here keeps: text that reaches a user channel is
 * either the model's reply (gated when the agent opted in) or a line from
 * the heuristics policy (holding line, handoff message). Provider error
 * text only ever goes to the errors file and the log.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "om_appendfile.h"
#include "om_connector.h"
#include "om_egress_internal.h"
#include "om_errno.h"
#include "om_log.h"
#include "om_message.h"
#include "om_paths.h"

#define MS UINT64_C(1000000)
#define MAX_CHANNELS 64
#define MAX_TURNS_KEPT 10000
#define MAX_FLAGS 16

/* Used when the heuristics policy has no handoff line for the agent: a
 * fixed sentence, never the cause. */
#define DEFAULT_HANDOFF                                                        \
  "I've passed this conversation to a teammate, who will follow up with you "  \
  "here."

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
  const char *outcome;
  json_t *attempts; /* every attempt over every cycle */
  json_t *answer;   /* the stored answer (idempotent replay) */
  char *candidate;  /* text waiting for the judge */
  int flag_level;
  char flags[256];
  uint64_t created_ns, commit_deadline_ns, next_retry_ns;
  uv_timer_t timer;
  int timer_init;
  struct turn_s *next, *prev;
} turn_t;

typedef struct chat_s {
  struct om_egress_s *g;
  om_http_request_t *req;
  eg_call_t *call;
  int started;
  char id[32];
  struct chat_s *next, *prev;
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
  turn_t *turns; /* newest first */
  size_t n_turns;
  chat_t *chats;
  uint64_t seq;
  char *lib_dir;
  void (*closed_cb)(void *);
  void *closed_ud;
  int closing, open_parts;
  om_metric_t *m_turns[4], *m_errors[2], *m_gate[6], *m_chat[3], *m_duplicates,
      *m_reload_failed, *m_deliver_failed, *m_review;
} eg_server_t;

static const char *OUTCOMES[4] = {"delivered", "held", "silent", "handed_off"};
static const char *GATE[6] = {"clean",        "judge_send", "judge_block",
                              "judge_failed", "sanitized",  "blocked"};

/* ---- small helpers ------------------------------------------------------- */

static char *xstrdup(const char *s) {
  return s ? strdup(s) : NULL;
}

static void outcome_metric(om_egress_t *g, const char *o) {
  for (int i = 0; i < 4; i++)
    if (strcmp(OUTCOMES[i], o) == 0)
      om_metric_inc(g->srv->m_turns[i]);
}

static void respond_json(om_http_request_t *req, int status, json_t *j) {
  static const om_http_header_t h[] = {
      {"Content-Type", "application/json", 0, 0}};
  char *s = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
  if (s == NULL)
    om_http_respond(req, 500, h, 1, "{\"error\":{\"type\":\"internal\"}}", 30);
  else
    om_http_respond(req, status, h, 1, s, strlen(s));
  free(s);
  json_decref(j);
}

static void respond_error(om_http_request_t *req, int status, const char *type,
                          const char *message) {
  respond_json(
      req, status,
      json_pack("{s:{s:s, s:s}}", "error", "type", type, "message", message));
}

static json_t *attempts_json(const eg_call_t *c) {
  json_t *a = json_array();
  for (size_t i = 0; c != NULL && i < c->n_attempts; i++) {
    const eg_attempt_t *t = &c->attempts[i];
    json_array_append_new(a, json_pack("{s:s, s:i, s:s, s:f}", "route",
                                       t->route, "status", t->status, "class",
                                       t->cls, "duration_ms",
                                       (double)t->duration_ns / 1e6));
  }
  return a;
}

/* An id (agent, conversation, run): what om_agent_message_new accepts. */
static int valid_id(const char *s) {
  size_t n;
  if (s == NULL || (n = strlen(s)) == 0 || n > OM_MESSAGE_MAX_ID)
    return 0;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
      return 0;
  return om_utf8_valid(s, n);
}

/* ---- error tracking ------------------------------------------------------ */

static void errors_close(errors_file_t *ef) {
  if (ef == NULL)
    return;
  om_appendfile_close(&ef->file);
  free(ef->path);
  free(ef);
}

/* At startup: a path that cannot be appended to is a configuration error
 * (OM_EINVAL, message naming --errors), not a surprise at the first
 * failure. */
static int errors_open(const char *path, errors_file_t **out, char *err,
                       size_t errlen) {
  errors_file_t *ef = calloc(1, sizeof *ef);
  int fd;
  if (ef == NULL || (ef->path = strdup(path)) == NULL) {
    free(ef);
    snprintf(err, errlen, "out of memory");
    return OM_ENOMEM;
  }
  fd = om_appendfile_open(&ef->file, path);
  if (fd < 0) {
    snprintf(err, errlen, "--errors %.300s: cannot open for appending: %s",
             path, strerror(-fd));
    free(ef->path);
    free(ef);
    return OM_EINVAL;
  }
  *out = ef;
  return 0;
}

static void errors_failed(errors_file_t *ef, int op, int e) {
  om_metric_inc(ef->m_fail[op]);
  if (!ef->failing)
    om_log(OM_LOG_ERROR, "errors_file_failed", "path", ef->path, "op",
           op ? "reopen" : "write", "error", strerror(e), NULL);
  ef->failing = 1;
}

/*
 * Append one line. Synchronous on the loop thread on purpose: it is one
 * write(2) of a short line to a local file on an uncommon path (a failed
 * model call), and it makes the line durable in the file before the answer
 * that carries its error_id goes out. When the path no longer names the
 * open file it is opened again; when that fails the line still goes to the
 * open descriptor (a renamed file keeps it) and the failure is counted.
 */
static void errors_append(errors_file_t *ef, const char *line, size_t len) {
  int rc, bad = 0;
  rc = om_appendfile_follow(&ef->file, ef->path);
  if (rc != 0) {
    errors_failed(ef, 1, -rc);
    bad = 1;
  }
  rc = om_appendfile_write(&ef->file, line, len);
  if (rc != 0) {
    errors_failed(ef, 0, -rc);
    return;
  }
  if (ef->failing && !bad) {
    om_log(OM_LOG_INFO, "errors_file_recovered", "path", ef->path, NULL);
    ef->failing = 0;
  }
}

/*
 * One JSON line per EgressError: attribution, the class, the full cause
 * and every attempt. The only place provider error text is kept.
 */
static void track_error(om_egress_t *g, turn_t *t, const eg_call_t *c,
                        om_egress_error_class_t cls, int retryable,
                        const char *cause, const char *kind) {
  eg_server_t *s = g->srv;
  om_egress_error_t *e = NULL;
  json_t *line;
  char *str, idbuf[40];
  char *id = t ? t->error_id : idbuf;
  if (om_egress_error_new(cls, retryable, cause, &e) == 0) {
    for (size_t i = 0; c != NULL && i < c->n_attempts; i++)
      om_egress_error_add_attempt(e, c->attempts[i].route,
                                  c->attempts[i].status, c->attempts[i].cls,
                                  c->attempts[i].duration_ns);
    if (t != NULL)
      om_egress_error_set_attribution(e, t->agent, t->conversation, t->run_id);
  }
  snprintf(id, 40, "err-%" PRIu64 "-%" PRIu64, (uint64_t)time(NULL), ++s->seq);
  om_metric_inc(s->m_errors[cls == OM_EGRESS_SEMANTIC]);
  line = json_pack(
      "{s:s, s:I, s:s, s:s, s:b, s:s, s:s?, s:s?, s:s?, s:s?, s:s?, s:s?, "
      "s:i, s:o}",
      "error_id", id, "ts", (json_int_t)time(NULL), "kind", kind, "class",
      om_egress_error_class_name(cls), "retryable", retryable, "cause", cause,
      "agent", t ? t->agent : NULL, "conversation", t ? t->conversation : NULL,
      "run_id", t ? t->run_id : NULL, "context", t ? t->context : NULL,
      "channel", t ? t->channel : NULL, "turn_id", t ? t->id : NULL,
      "attempt_count",
      (int)(e ? om_egress_error_attempts(e) : (c ? c->n_attempts : 0)),
      "attempts", attempts_json(c));
  str = line ? json_dumps(line, JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
  if (str != NULL && s->errors != NULL) {
    size_t n = strlen(str);
    char *nl = realloc(str, n + 2);
    if (nl != NULL) {
      str = nl;
      str[n] = '\n';
      str[n + 1] = '\0';
      errors_append(s->errors, str, n + 1); /* one write: one whole line */
    } else {
      errors_failed(s->errors, 0, ENOMEM);
    }
  }
  om_log(OM_LOG_WARN, "egress_error", "error_id", id, "kind", kind, "class",
         om_egress_error_class_name(cls), "agent", t ? t->agent : "", NULL);
  free(str);
  json_decref(line);
  om_egress_error_free(e);
}

/* ---- /v1/chat/completions -------------------------------------------------
 */

static void chat_unlink(chat_t *ch) {
  eg_server_t *s = ch->g->srv;
  if (ch->prev)
    ch->prev->next = ch->next;
  else
    s->chats = ch->next;
  if (ch->next)
    ch->next->prev = ch->prev;
}

static void sse_write(om_http_request_t *req, json_t *j, const char *event) {
  char *s = json_dumps(j, JSON_COMPACT);
  if (s != NULL) {
    if (event) {
      om_http_response_write(req, "event: ", 7);
      om_http_response_write(req, event, strlen(event));
      om_http_response_write(req, "\n", 1);
    }
    om_http_response_write(req, "data: ", 6);
    om_http_response_write(req, s, strlen(s));
    om_http_response_write(req, "\n\n", 2);
  }
  free(s);
  json_decref(j);
}

static json_t *chunk(chat_t *ch, eg_call_t *c, json_t *delta,
                     const char *finish) {
  return json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:o, s:s?}]}", "id", ch->id,
                   "object", "chat.completion.chunk", "created",
                   (json_int_t)time(NULL), "model", c->route_model, "choices",
                   "index", 0, "delta", delta, "finish_reason", finish);
}

static void chat_commit(void *ud, eg_call_t *c) {
  chat_t *ch = ud;
  static const om_http_header_t h[] = {
      {"Content-Type", "text/event-stream", 0, 0},
      {"Cache-Control", "no-cache", 0, 0}};
  if (ch->req == NULL)
    return;
  ch->started = 1;
  om_http_response_start(ch->req, 200, h, 2);
  sse_write(ch->req,
            chunk(ch, c, json_pack("{s:s}", "role", "assistant"), NULL), NULL);
}

static void chat_delta(void *ud, eg_call_t *c, const char *text, size_t len) {
  chat_t *ch = ud;
  if (ch->req == NULL)
    return;
  sse_write(ch->req,
            chunk(ch, c, json_pack("{s:s%}", "content", text, len), NULL),
            NULL);
}

static void chat_tool_delta(void *ud, eg_call_t *c, json_t *tool_calls) {
  chat_t *ch = ud;
  if (ch->req == NULL)
    return;
  sse_write(ch->req,
            chunk(ch, c, json_pack("{s:O}", "tool_calls", tool_calls), NULL),
            NULL);
}

static void chat_done(void *ud, eg_call_t *c) {
  chat_t *ch = ud;
  om_egress_t *g = ch->g;
  om_http_request_t *req = ch->req;
  ch->req = NULL;
  if (req != NULL)
    om_http_request_on_close(req, NULL);
  if (!c->ok)
    track_error(g, NULL, c,
                c->last.is_timeout ||
                        c->last.cls == OM_EGRESS_C_CONNECTION_RESET ||
                        c->last.cls == OM_EGRESS_C_CONNECTION_REFUSED ||
                        c->last.cls == OM_EGRESS_C_SERVER_ERROR
                    ? OM_EGRESS_TRANSPORT
                    : OM_EGRESS_SEMANTIC,
                c->last.retryable, c->cause, "chat");
  om_metric_inc(g->srv->m_chat[c->ok ? 0 : ch->started ? 2 : 1]);
  if (req != NULL) {
    if (ch->started) {
      if (c->ok) {
        sse_write(
            req, chunk(ch, c, json_object(), c->finish[0] ? c->finish : "stop"),
            NULL);
        om_http_response_write(req, "data: [DONE]\n\n", 14);
      } else {
        /* committed: never replayed; the stream ends with an error event */
        sse_write(req,
                  json_pack("{s:{s:s, s:s}}", "error", "type",
                            "stream_interrupted", "message",
                            "The response was interrupted."),
                  "error");
      }
      om_http_response_end(req);
    } else if (c->ok) {
      respond_json(req, 200, json_incref(c->result));
    } else {
      int request_scope =
          !c->last.retryable && c->last.scope == OM_EGRESS_SCOPE_REQUEST;
      int deadline = c->stop_why && strcmp(c->stop_why, "deadline") == 0;
      respond_json(req,
                   request_scope ? 400
                   : deadline    ? 504
                                 : 502,
                   json_pack("{s:{s:s, s:s, s:o}}", "error", "type",
                             request_scope ? "request_rejected"
                             : deadline    ? "deadline_exceeded"
                                           : "all_routes_failed",
                             "message",
                             request_scope
                                 ? "The model provider rejected the request."
                                 : "No model route could answer.",
                             "attempts", attempts_json(c)));
    }
  }
  chat_unlink(ch);
  eg_call_free(c);
  free(ch);
}

static void chat_client_gone(om_http_request_t *req) {
  chat_t *ch = req->user;
  ch->req = NULL;
  chat_unlink(ch);
  eg_call_cancel(ch->call);
  free(ch);
}

static json_t *parse_request(om_http_request_t *req, const char **why) {
  json_error_t jerr;
  json_t *j =
      json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &jerr);
  json_t *msgs;
  size_t i;
  json_t *m;
  if (j == NULL) {
    *why = "body: not valid JSON";
    return NULL;
  }
  msgs = json_object_get(j, "messages");
  if (!json_is_object(j) || !json_is_array(msgs) ||
      json_array_size(msgs) == 0) {
    *why = "field 'messages': a non-empty array is required";
    json_decref(j);
    return NULL;
  }
  json_array_foreach(msgs, i, m) {
    if (!json_is_object(m) || !json_is_string(json_object_get(m, "role"))) {
      *why = "field 'messages': each message needs a string 'role'";
      json_decref(j);
      return NULL;
    }
  }
  if (json_object_get(j, "stream") != NULL &&
      !json_is_boolean(json_object_get(j, "stream"))) {
    *why = "field 'stream': a boolean";
    json_decref(j);
    return NULL;
  }
  return j;
}

static void handle_chat(om_egress_t *g, om_http_request_t *req) {
  const char *why = NULL;
  json_t *body = parse_request(req, &why);
  chat_t *ch;
  eg_call_opts_t o;
  eg_hooks_t hooks = {.commit = chat_commit,
                      .delta = chat_delta,
                      .done = chat_done,
                      .tool_delta = chat_tool_delta};
  int rc;
  if (body == NULL) {
    respond_error(req, 400, "invalid_request", why);
    return;
  }
  ch = calloc(1, sizeof *ch);
  if (ch == NULL) {
    json_decref(body);
    respond_error(req, 503, "overloaded", "out of memory");
    return;
  }
  ch->g = g;
  ch->req = req;
  snprintf(ch->id, sizeof ch->id, "chatcmpl-om%" PRIu64, ++g->srv->seq);
  ch->next = g->srv->chats;
  if (ch->next)
    ch->next->prev = ch;
  g->srv->chats = ch;
  req->user = ch;
  om_http_request_on_close(req, chat_client_gone);
  memset(&o, 0, sizeof o);
  o.request = body;
  o.stream = json_is_true(json_object_get(body, "stream"));
  o.agent = om_http_request_header(req, "x-openmesh-agent", NULL);
  o.context = "interactive";
  rc = eg_call_start(g, &o, &hooks, ch, &ch->call);
  json_decref(body);
  if (rc != 0) {
    om_http_request_on_close(req, NULL);
    chat_unlink(ch);
    free(ch);
    respond_error(req, 503, "no_routes", "No model route is configured.");
  }
}

/* ---- turns: delivery ------------------------------------------------------
 */

static void turn_answer(turn_t *t);
static void turn_cycle(turn_t *t);
static void turn_failed(turn_t *t, eg_call_t *c, om_egress_error_class_t cls,
                        int retryable, const char *cause);
static void turn_finish(turn_t *t);

static void on_delivered(void *ud, int status, size_t parts) {
  turn_t *t = ud;
  om_egress_t *g = t->g;
  g->srv->open_parts--;
  if (g->srv->closing)
    return; /* cancelled by close: the turn is being dropped */
  if (status != 0) {
    char cause[256];
    om_metric_inc(g->srv->m_deliver_failed);
    snprintf(cause, sizeof cause,
             "delivery to channel %s failed after %zu "
             "parts: %s",
             t->channel, parts,
             t->ch && t->ch->conn ? om_connector_last_error(t->ch->conn) : "");
    track_error(g, t, NULL, OM_EGRESS_TRANSPORT, 0, cause, "delivery");
    if (!t->answered) {
      t->outcome = "silent";
      turn_answer(t);
    }
    if (t->delivering_final || t->state == T_DELIVERING)
      turn_finish(t);
    return;
  }
  if (t->delivering_final) {
    turn_finish(t);
  } else if (t->state != T_DONE) {
    /* the holding line is out: keep trying in the background */
    t->state = T_WAITING;
  }
}

/* Deliver text as an agent message. final: the real answer or the handoff
 * (at most one per turn); else the holding line (at most one). */
static int deliver(turn_t *t, const char *text, size_t len, int final) {
  om_agent_message_t *m = NULL;
  int rc;
  if (final ? t->final_delivered : t->holding_delivered) {
    om_metric_inc(t->g->srv->m_duplicates); /* refused, counted */
    return OM_EDUPLICATE;
  }
  rc =
      om_agent_message_new(t->agent, t->conversation, t->run_id, text, len, &m);
  if (rc == 0)
    rc = om_connector_deliver(t->ch->conn, m, on_delivered, t);
  om_agent_message_free(m);
  if (rc != 0)
    return rc;
  t->g->srv->open_parts++;
  if (final) {
    t->final_delivered = 1;
    t->delivering_final = 1;
    if (t->state != T_WAITING || !t->holding_delivered)
      t->state = T_DELIVERING;
  } else {
    t->holding_delivered = 1;
  }
  return 0;
}

static void deliver_reply(turn_t *t, const char *text, size_t len) {
  int rc;
  if (!t->answered)
    t->outcome = "delivered";
  rc = deliver(t, text, len, 1);
  if (!t->answered)
    turn_answer(t);
  if (rc != 0 && rc != OM_EDUPLICATE)
    turn_failed(t, NULL, OM_EGRESS_TRANSPORT, 0,
                "the channel refused the message");
}

/* ---- turns: the quality gate ----------------------------------------------
 */

static void judge_done(void *ud, eg_call_t *c);

/* The heuristics over a candidate: 0 clean, OM_FLAG_LOW, OM_FLAG_HIGH. */
static int run_heuristics(turn_t *t, const char *text, size_t len) {
  om_egress_t *g = t->g;
  om_heuristic_flag_t flags[MAX_FLAGS];
  size_t n = 0, off = 0;
  int overall = 0, rc;
  char err[256];
  json_t *msgs = json_object_get(t->request, "messages"), *m;
  const char *sys = NULL, *question = NULL;
  size_t i;
  om_heuristics_input_t in;
  json_array_foreach(msgs, i, m) {
    const char *role = json_string_value(json_object_get(m, "role"));
    const char *content = json_string_value(json_object_get(m, "content"));
    if (role && content && strcmp(role, "system") == 0 && sys == NULL)
      sys = content;
    if (role && content && strcmp(role, "user") == 0)
      question = content;
  }
  memset(&in, 0, sizeof in);
  in.text = text;
  in.len = len;
  in.system_prompt = sys;
  in.system_prompt_len = sys ? strlen(sys) : 0;
  in.question = question;
  in.question_len = question ? strlen(question) : 0;
  in.agent = t->agent;
  in.channel = t->channel;
  rc = om_heuristics_run_overall(om_policy_watch_current(g->heuristics), &in,
                                 flags, MAX_FLAGS, &n, &overall, err,
                                 sizeof err);
  t->flags[0] = '\0';
  if (rc != 0) {
    /* not proven clean: treated as a high-confidence flag */
    snprintf(t->flags, sizeof t->flags, "heuristics_failed");
    return OM_FLAG_HIGH;
  }
  for (i = 0; i < n && off < sizeof t->flags - 1; i++)
    off += (size_t)snprintf(t->flags + off, sizeof t->flags - off, "%s%s",
                            i ? "," : "", flags[i].name);
  return n == 0 ? 0 : overall == OM_FLAG_HIGH ? OM_FLAG_HIGH : OM_FLAG_LOW;
}

static void gate_blocked(turn_t *t) {
  char cause[400];
  om_metric_inc(t->g->srv->m_gate[5]);
  snprintf(cause, sizeof cause, "quality gate blocked the reply (flags: %s)",
           t->flags);
  turn_failed(t, t->call, OM_EGRESS_SEMANTIC, 1, cause);
}

/* High confidence and no judge's "send": the sanitizing path. */
static void gate_sanitize(turn_t *t) {
  char *clean = NULL;
  size_t len = 0;
  if (om_heuristics_sanitize(om_policy_watch_current(t->g->heuristics),
                             t->candidate, strlen(t->candidate), &clean,
                             &len) == 0 &&
      len > 0 && run_heuristics(t, clean, len) == 0) {
    om_metric_inc(t->g->srv->m_gate[4]);
    deliver_reply(t, clean, len);
    free(clean);
    return;
  }
  free(clean);
  gate_blocked(t);
}

static void start_judge(turn_t *t) {
  om_egress_t *g = t->g;
  om_fallback_settings_t *s = &g->cfg->s;
  eg_call_opts_t o;
  eg_hooks_t hooks = {.done = judge_done};
  char *user;
  json_t *req;
  size_t n = strlen(t->candidate) + strlen(t->flags) + 128;
  int rc = OM_ENOMEM;
  user = malloc(n);
  if (user != NULL)
    snprintf(user, n, "Flags: %s\n\nReply:\n<<<\n%s\n>>>", t->flags,
             t->candidate);
  req = user
            ? json_pack("{s:[{s:s, s:s}, {s:s, s:s}], s:i, s:i}", "messages",
                        "role", "system", "content",
                        "You review a reply an assistant is about to send to a "
                        "person. Answer with exactly one word: SEND if it is a "
                        "fit reply to send, BLOCK if it is not.",
                        "role", "user", "content", user, "max_tokens", 4,
                        "temperature", 0)
            : NULL;
  free(user);
  memset(&o, 0, sizeof o);
  o.request = req;
  o.agent = t->agent;
  o.context = t->context;
  o.channel = t->channel;
  o.only_route = s->judge_route;
  o.max_attempts = 1;
  o.deadline_ms = s->judge_timeout_ms ? s->judge_timeout_ms : 2000;
  t->state = T_JUDGING;
  if (req != NULL && s->judge_route != NULL)
    rc = eg_call_start(g, &o, &hooks, t, &t->judge);
  json_decref(req);
  if (rc != 0) {
    t->judge = NULL;
    judge_done(t, NULL);
  }
}

static void judge_done(void *ud, eg_call_t *c) {
  turn_t *t = ud;
  /* -1 failed, 0 block, 1 send */
  int verdict = -1;
  t->judge = NULL;
  if (c != NULL && c->ok && c->text != NULL) {
    if (strstr(c->text, "BLOCK") != NULL)
      verdict = 0;
    else if (strstr(c->text, "SEND") != NULL)
      verdict = 1;
  }
  /* The judge's own failure is tracked, never shown: not a second error. */
  if (verdict < 0)
    track_error(t->g, t, c, OM_EGRESS_TRANSPORT, 0,
                c && c->cause[0] ? c->cause : "judge unavailable or unclear",
                "judge");
  if (c != NULL)
    eg_call_free(c);
  om_metric_inc(t->g->srv->m_gate[verdict < 0 ? 3 : verdict ? 1 : 2]);
  t->state = T_RUNNING;
  if (t->flag_level == OM_FLAG_LOW) {
    if (verdict == 0) {
      gate_blocked(t);
    } else {
      if (verdict < 0) {
        t->review = 1; /* sent, marked for offline review */
        om_metric_inc(t->g->srv->m_review);
        track_error(t->g, t, NULL, OM_EGRESS_SEMANTIC, 0,
                    "low-confidence flag sent without a judge verdict",
                    "review");
      }
      deliver_reply(t, t->candidate, strlen(t->candidate));
    }
  } else if (verdict == 1) {
    deliver_reply(t, t->candidate, strlen(t->candidate)); /* downgraded */
  } else {
    gate_sanitize(t);
  }
}

static void gate_or_deliver(turn_t *t, const char *text, size_t len) {
  om_egress_t *g = t->g;
  int level;
  if (!om_fallback_gate_enabled(&g->cfg->s, t->agent)) {
    deliver_reply(t, text, len);
    return;
  }
  level = run_heuristics(t, text, len);
  if (level == 0) {
    om_metric_inc(g->srv->m_gate[0]);
    deliver_reply(t, text, len); /* unflagged: no added latency */
    return;
  }
  free(t->candidate);
  t->candidate = strndup(text, len);
  t->flag_level = level;
  if (t->candidate == NULL) {
    gate_blocked(t);
    return;
  }
  start_judge(t);
}

/* ---- turns: Layer C ---------------------------------------------------------
 */

static void on_turn_timer(uv_timer_t *h) {
  turn_t *t = h->data;
  turn_cycle(t);
}

static void schedule(turn_t *t, uint64_t ms) {
  t->state = T_WAITING;
  t->next_retry_ns = eg_now_ns() + ms * MS;
  uv_timer_start(&t->timer, on_turn_timer, ms, 0);
}

static void handoff(turn_t *t) {
  const char *line = om_heuristics_handoff(
      om_policy_watch_current(t->g->heuristics), t->agent);
  if (line == NULL)
    line = DEFAULT_HANDOFF;
  if (!t->answered)
    t->outcome = "handed_off";
  if (deliver(t, line, strlen(line), 1) != 0)
    turn_finish(t);
  if (!t->answered)
    turn_answer(t);
}

static void turn_failed(turn_t *t, eg_call_t *c, om_egress_error_class_t cls,
                        int retryable, const char *cause) {
  om_egress_t *g = t->g;
  om_fallback_settings_t *s = &g->cfg->s;
  uint64_t now = eg_now_ns();
  track_error(g, t, c, cls, retryable, cause, "turn");
  if (t->final_delivered) {
    turn_finish(t);
    return;
  }
  if (!t->interactive) {
    /* async: nothing is sent; retried on the next cycle while young */
    if (!t->answered) {
      t->outcome = "silent";
      turn_answer(t);
    }
    if (retryable && now - t->created_ns + s->pending_retry_interval_ms * MS <
                         s->pending_max_age_ms * MS)
      schedule(t, s->pending_retry_interval_ms);
    else
      turn_finish(t);
    return;
  }
  /* interactive */
  if (retryable && now < t->commit_deadline_ns) {
    if (!t->holding_delivered) {
      const char *line = om_heuristics_holding_line(
          om_policy_watch_current(g->heuristics), t->agent);
      if (line != NULL && deliver(t, line, strlen(line), 0) == 0) {
        if (!t->answered) {
          t->outcome = "held";
          turn_answer(t);
        }
      } else {
        handoff(t);
        return;
      }
    }
    uint64_t wait = s->backoff_base_ms ? s->backoff_base_ms : 100;
    uint64_t left = (t->commit_deadline_ns - now) / MS;
    schedule(t, wait < left ? wait : left);
    return;
  }
  handoff(t);
}

static void turn_call_done(void *ud, eg_call_t *c) {
  turn_t *t = ud;
  size_t i;
  t->call = NULL;
  for (i = 0; i < c->n_attempts; i++)
    json_array_append_new(
        t->attempts,
        json_pack("{s:s, s:i, s:s, s:f, s:i}", "route", c->attempts[i].route,
                  "status", c->attempts[i].status, "class", c->attempts[i].cls,
                  "duration_ms", (double)c->attempts[i].duration_ns / 1e6,
                  "cycle", t->cycles));
  if (c->ok && c->text != NULL && c->text_len > 0) {
    t->call = c; /* kept for the gate's error attribution */
    gate_or_deliver(t, c->text, c->text_len);
    if (t->call == c) {
      t->call = NULL;
      eg_call_free(c);
    }
    return;
  }
  if (c->ok) {
    /* a completion with no text to deliver (only tool calls) */
    snprintf(c->cause, sizeof c->cause,
             "the completion has no text to deliver (tool calls only)");
    turn_failed(t, c, OM_EGRESS_SEMANTIC, 1, c->cause);
  } else {
    om_egress_error_class_t cls =
        c->last.cls == OM_EGRESS_C_EMPTY_COMPLETION ||
                c->last.cls == OM_EGRESS_C_TOOL_JSON_INVALID ||
                c->last.cls == OM_EGRESS_C_LENGTH_NO_CONTENT ||
                c->last.cls == OM_EGRESS_C_CONTEXT_LENGTH ||
                c->last.cls == OM_EGRESS_C_BAD_REQUEST
            ? OM_EGRESS_SEMANTIC
            : OM_EGRESS_TRANSPORT;
    int retryable = c->last.retryable ||
                    c->last.scope == OM_EGRESS_SCOPE_ROUTE ||
                    (c->stop_why && strcmp(c->stop_why, "deadline") == 0);
    turn_failed(t, c, cls, retryable, c->cause);
  }
  eg_call_free(c);
}

static void turn_cycle(turn_t *t) {
  om_egress_t *g = t->g;
  eg_call_opts_t o;
  eg_hooks_t hooks = {.done = turn_call_done};
  uint64_t now = eg_now_ns();
  int rc;
  if (t->final_delivered || t->state == T_DONE)
    return;
  t->cycles++;
  t->state = T_RUNNING;
  memset(&o, 0, sizeof o);
  o.request = t->request;
  o.agent = t->agent;
  o.context = t->context;
  o.channel = t->channel;
  if (t->interactive && t->holding_delivered) {
    uint64_t left =
        t->commit_deadline_ns > now ? (t->commit_deadline_ns - now) / MS : 0;
    if (left == 0) {
      handoff(t);
      return;
    }
    o.deadline_ms = left < g->cfg->s.deadline_ms ? left : g->cfg->s.deadline_ms;
  }
  rc = eg_call_start(g, &o, &hooks, t, &t->call);
  if (rc != 0) {
    t->call = NULL;
    turn_failed(t, NULL, OM_EGRESS_TRANSPORT, 1, "no route could be started");
  }
}

/* ---- turns: bookkeeping -----------------------------------------------------
 */

static json_t *turn_answer_json(turn_t *t) {
  return json_pack("{s:s, s:s, s:o, s:s?, s:b, s:s?}", "turn_id", t->id,
                   "outcome", t->outcome ? t->outcome : "silent", "attempts",
                   json_deep_copy(t->attempts), "error_id",
                   t->error_id[0] ? t->error_id : NULL, "review", t->review,
                   "run_id", t->run_id);
}

static void turn_answer(turn_t *t) {
  om_http_request_t *req = t->req;
  if (t->answered)
    return;
  t->answered = 1;
  outcome_metric(t->g, t->outcome ? t->outcome : "silent");
  json_decref(t->answer);
  t->answer = turn_answer_json(t);
  t->req = NULL;
  if (req != NULL) {
    om_http_request_on_close(req, NULL);
    respond_json(req, 200, json_incref(t->answer));
  }
}

static void turn_finish(turn_t *t) {
  if (t->state == T_DONE)
    return;
  t->state = T_DONE;
  if (t->timer_init)
    uv_timer_stop(&t->timer);
  if (!t->answered)
    turn_answer(t);
  free(t->candidate);
  t->candidate = NULL;
}

static void turn_timer_closed(uv_handle_t *h) {
  turn_t *t = h->data;
  json_decref(t->request);
  json_decref(t->attempts);
  json_decref(t->answer);
  free(t->agent);
  free(t->conversation);
  free(t->run_id);
  free(t->context);
  free(t->channel);
  free(t->key);
  free(t->candidate);
  free(t);
}

static void turn_free(turn_t *t) {
  eg_server_t *s = t->g->srv;
  if (t->prev)
    t->prev->next = t->next;
  else
    s->turns = t->next;
  if (t->next)
    t->next->prev = t->prev;
  s->n_turns--;
  if (t->call)
    eg_call_cancel(t->call);
  if (t->judge)
    eg_call_cancel(t->judge);
  uv_timer_stop(&t->timer);
  uv_close((uv_handle_t *)&t->timer, turn_timer_closed);
}

/* Keep at most MAX_TURNS_KEPT finished turns for idempotent replays. */
static void trim_turns(eg_server_t *s) {
  turn_t *t = s->turns, *last = NULL;
  while (t != NULL) {
    last = t;
    t = t->next;
  }
  while (s->n_turns > MAX_TURNS_KEPT && last != NULL) {
    turn_t *prev = last->prev;
    if (last->state == T_DONE)
      turn_free(last);
    last = prev;
  }
}

static void turn_client_gone(om_http_request_t *req) {
  turn_t *t = req->user;
  t->req = NULL; /* the turn goes on: its answer is stored */
}

static channel_t *find_channel(eg_server_t *s, const char *name) {
  for (size_t i = 0; name != NULL && i < s->n_channels; i++)
    if (strcmp(s->channels[i].name, name) == 0)
      return &s->channels[i];
  return NULL;
}

static void handle_turn(om_egress_t *g, om_http_request_t *req) {
  eg_server_t *s = g->srv;
  json_error_t jerr;
  json_t *j =
      json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &jerr);
  const char *agent, *conv, *run, *ctx, *chan, *idem;
  char key[1024];
  json_t *request;
  turn_t *t;
  const char *why = NULL;
  if (j == NULL || !json_is_object(j)) {
    json_decref(j);
    respond_error(req, 400, "invalid_request", "body: not a JSON object");
    return;
  }
  agent = json_string_value(json_object_get(j, "agent"));
  conv = json_string_value(json_object_get(j, "conversation"));
  run = json_string_value(json_object_get(j, "run_id"));
  ctx = json_string_value(json_object_get(j, "context"));
  chan = json_string_value(json_object_get(j, "channel"));
  request = json_object_get(j, "request");
  if (!valid_id(agent))
    why = "field 'agent': a non-empty string of at most 256 bytes";
  else if (!valid_id(conv))
    why = "field 'conversation': a non-empty string of at most 256 bytes";
  else if (json_object_get(j, "run_id") != NULL &&
           !json_is_null(json_object_get(j, "run_id")) && !valid_id(run))
    why = "field 'run_id': a non-empty string of at most 256 bytes";
  else if (ctx == NULL ||
           (strcmp(ctx, "interactive") != 0 && strcmp(ctx, "async") != 0))
    why = "field 'context': \"interactive\" or \"async\"";
  else if (find_channel(s, chan) == NULL)
    why = "field 'channel': not a configured channel";
  else if (!json_is_object(request) ||
           !json_is_array(json_object_get(request, "messages")) ||
           json_array_size(json_object_get(request, "messages")) == 0)
    why = "field 'request': a chat completion request with messages";
  if (why != NULL) {
    json_decref(j);
    respond_error(req, 400, "invalid_request", why);
    return;
  }
  /* The same turn posted twice is answered from the record, never run (and
   * never delivered) twice: Idempotency-Key, else agent/conversation/run. */
  idem = om_http_request_header(req, "idempotency-key", NULL);
  key[0] = '\0';
  if (idem != NULL && *idem != '\0')
    snprintf(key, sizeof key, "k:%s", idem);
  else if (run != NULL)
    snprintf(key, sizeof key, "r:%s\x1f%s\x1f%s", agent, conv, run);
  if (key[0] != '\0') {
    for (t = s->turns; t != NULL; t = t->next) {
      if (t->key == NULL || strcmp(t->key, key) != 0)
        continue;
      json_decref(j);
      if (t->answered) {
        json_t *a = json_deep_copy(t->answer);
        json_object_set_new(a, "replayed", json_true());
        respond_json(req, 200, a);
      } else {
        respond_error(req, 409, "turn_in_progress",
                      "This turn is still running.");
      }
      return;
    }
  }
  t = calloc(1, sizeof *t);
  if (t == NULL) {
    json_decref(j);
    respond_error(req, 503, "overloaded", "out of memory");
    return;
  }
  t->g = g;
  snprintf(t->id, sizeof t->id, "turn-%" PRIu64, ++s->seq);
  t->agent = xstrdup(agent);
  t->conversation = xstrdup(conv);
  t->run_id = xstrdup(run);
  t->context = xstrdup(ctx);
  t->channel = xstrdup(chan);
  t->key = key[0] ? xstrdup(key) : NULL;
  t->ch = find_channel(s, chan);
  t->request = json_deep_copy(request);
  t->attempts = json_array();
  t->interactive = strcmp(ctx, "interactive") == 0;
  t->created_ns = eg_now_ns();
  t->commit_deadline_ns = t->created_ns + g->cfg->s.commitment_ms * MS;
  t->req = req;
  uv_timer_init(g->loop, &t->timer);
  t->timer.data = t;
  t->timer_init = 1;
  json_decref(j);
  t->next = s->turns;
  if (t->next)
    t->next->prev = t;
  s->turns = t;
  s->n_turns++;
  req->user = t;
  om_http_request_on_close(req, turn_client_gone);
  trim_turns(s);
  turn_cycle(t);
}

static void handle_pending(om_egress_t *g, om_http_request_t *req) {
  json_t *list = json_array();
  uint64_t now = eg_now_ns();
  for (turn_t *t = g->srv->turns; t != NULL; t = t->next) {
    if (t->interactive || t->state == T_DONE || t->final_delivered)
      continue;
    if (t->cycles == 0 || (!t->error_id[0]))
      continue;
    json_array_append_new(
        list,
        json_pack("{s:s, s:s, s:s, s:s?, s:s, s:s, s:i, s:I, s:I}", "turn_id",
                  t->id, "agent", t->agent, "conversation", t->conversation,
                  "run_id", t->run_id, "channel", t->channel, "error_id",
                  t->error_id, "cycles", t->cycles, "age_ms",
                  (json_int_t)((now - t->created_ns) / MS), "next_retry_in_ms",
                  (json_int_t)(t->state == T_WAITING && t->next_retry_ns > now
                                   ? (t->next_retry_ns - now) / MS
                                   : 0)));
  }
  respond_json(req, 200, json_pack("{s:o}", "pending", list));
}

/* ---- admin ------------------------------------------------------------------
 */

static double pending_gauge(void *ud) {
  om_egress_t *g = ud;
  double n = 0;
  for (turn_t *t = g->srv->turns; t != NULL; t = t->next)
    n += !t->interactive && t->state == T_WAITING;
  return n;
}

static void handle_metrics(om_egress_t *g, om_http_request_t *req) {
  static const om_http_header_t h[] = {
      {"Content-Type", "text/plain; version=0.0.4", 0, 0}};
  size_t len = 0;
  char *text = om_metrics_render(g->metrics, &len);
  if (text == NULL) {
    respond_error(req, 500, "internal", "out of memory");
    return;
  }
  om_http_respond(req, 200, h, 1, text, len);
  free(text);
}

/* Turns with work left (a call, a judge, a delivery or a retry timer). */
static size_t active_turns(om_egress_t *g) {
  size_t n = 0;
  for (turn_t *t = g->srv->turns; t != NULL; t = t->next)
    n += t->state != T_DONE;
  return n;
}

static void handle_status(om_egress_t *g, om_http_request_t *req) {
  json_t *routes = json_array();
  uint64_t now = eg_now_ns();
  for (size_t i = 0; g->cfg != NULL && i < g->cfg->n; i++) {
    const om_egress_route_state_t *st = &g->cfg->state[i];
    json_array_append_new(
        routes,
        json_pack(
            "{s:s, s:s, s:s, s:b, s:I, s:i}", "name", g->cfg->routes[i].name,
            "provider", g->cfg->routes[i].provider, "model",
            g->cfg->routes[i].model, "cooling_down",
            !om_egress_route_available(st, now), "cooldown_left_ms",
            (json_int_t)(st->until_ns > now ? (st->until_ns - now) / MS : 0),
            "consecutive_failures", (int)st->consecutive));
  }
  respond_json(
      req, 200,
      json_pack("{s:{s:{s:s, s:I, s:I, s:s}, s:{s:s, s:I, s:I, s:s}}, s:o, "
                "s:I, s:f}",
                "policies", "fallback", "path",
                om_policy_watch_path(g->fallback), "version",
                (json_int_t)om_policy_watch_version(g->fallback), "failures",
                (json_int_t)om_policy_watch_failures(g->fallback), "last_error",
                om_policy_watch_last_error(g->fallback), "egress_heuristics",
                "path", om_policy_watch_path(g->heuristics), "version",
                (json_int_t)om_policy_watch_version(g->heuristics), "failures",
                (json_int_t)om_policy_watch_failures(g->heuristics),
                "last_error", om_policy_watch_last_error(g->heuristics),
                "routes", routes, "active_turns", (json_int_t)active_turns(g),
                "pending", pending_gauge(g)));
}

static void on_request(om_http_request_t *req, void *ud) {
  om_egress_t *g = ud;
  int post = req->method_len == 4 && memcmp(req->method, "POST", 4) == 0;
  int get = req->method_len == 3 && memcmp(req->method, "GET", 3) == 0;
#define PATH_IS(p)                                                             \
  (req->path_len == sizeof(p) - 1 && memcmp(req->path, p, sizeof(p) - 1) == 0)
  if (g->srv->closing) {
    respond_error(req, 503, "draining", "The gateway is shutting down.");
  } else if (PATH_IS("/v1/chat/completions")) {
    if (post)
      handle_chat(g, req);
    else
      respond_error(req, 405, "method_not_allowed", "POST only");
  } else if (PATH_IS("/v1/turns")) {
    if (post)
      handle_turn(g, req);
    else
      respond_error(req, 405, "method_not_allowed", "POST only");
  } else if (PATH_IS("/v1/pending") && get) {
    handle_pending(g, req);
  } else if (PATH_IS("/metrics") && get) {
    handle_metrics(g, req);
  } else if (PATH_IS("/status") && get) {
    handle_status(g, req);
  } else if (PATH_IS("/healthz") && get) {
    respond_json(req, 200, json_pack("{s:s}", "status", "ok"));
  } else {
    respond_error(req, 404, "not_found", "No such endpoint.");
  }
#undef PATH_IS
}

/* ---- lifecycle
 * ----------------------------------------------------------------- */

static int on_fallback_swap(void *ud, om_policy_t *next, om_policy_t *prev) {
  om_egress_t *g = ud;
  eg_cfg_t *cfg;
  char err[512];
  (void)prev;
  if (eg_cfg_build(next, g->cfg, &cfg, err, sizeof err) != 0) {
    om_log(OM_LOG_WARN, "egress_fallback_rejected", "error", err, NULL);
    if (g->srv)
      om_metric_inc(g->srv->m_reload_failed);
    return -1;
  }
  eg_cfg_unref(g->cfg);
  g->cfg = cfg;
  return 0;
}

static int load_channels(om_egress_t *g, const char *path, char *err,
                         size_t errlen) {
  json_error_t jerr;
  json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr), *m, *v;
  const char *name;
  eg_server_t *s = g->srv;
  if (root == NULL) {
    snprintf(err, errlen, "--channels %s:%d: %s", path, jerr.line, jerr.text);
    return OM_EINVAL;
  }
  m = json_object_get(root, "channels") ? json_object_get(root, "channels")
                                        : root;
  if (!json_is_object(m)) {
    snprintf(err, errlen, "--channels %s: an object of channels", path);
    json_decref(root);
    return OM_EINVAL;
  }
  json_object_foreach(m, name, v) {
    om_connector_opts_t o;
    char cerr[256];
    json_t *pl = json_object_get(v, "part_limit");
    json_t *mr = json_object_get(v, "max_retries");
    json_t *to = json_object_get(v, "timeout_ms");
    int rc;
    memset(&o, 0, sizeof o);
    if (s->n_channels == MAX_CHANNELS || !valid_id(name) ||
        !json_is_object(v) ||
        (pl && (!json_is_integer(pl) || json_integer_value(pl) < 0)) ||
        (mr && (!json_is_integer(mr) || json_integer_value(mr) < 0)) ||
        (to && (!json_is_integer(to) || json_integer_value(to) < 0))) {
      snprintf(err, errlen,
               "--channels %s: channel '%s': an object {kind, target, "
               "part_limit?, max_retries?, timeout_ms?} (at most 64 channels)",
               path, name);
      json_decref(root);
      return OM_EINVAL;
    }
    o.kind = json_string_value(json_object_get(v, "kind"));
    o.target = json_string_value(json_object_get(v, "target"));
    o.part_limit = pl ? (size_t)json_integer_value(pl) : 0;
    o.max_retries = mr ? (int)json_integer_value(mr) : 3;
    o.timeout_ms = to ? (uint64_t)json_integer_value(to) : 0;
    if (o.kind == NULL || o.target == NULL) {
      snprintf(err, errlen,
               "--channels %s: channel '%s': field '%s' is "
               "required",
               path, name, o.kind == NULL ? "kind" : "target");
      json_decref(root);
      return OM_EINVAL;
    }
    rc = om_connector_new(g->loop, &o, &s->channels[s->n_channels].conn, cerr,
                          sizeof cerr);
    if (rc != 0) {
      snprintf(err, errlen, "--channels %s: channel '%s': %s", path, name,
               cerr);
      json_decref(root);
      return rc == OM_ENOMEM ? OM_ENOMEM : OM_EINVAL;
    }
    s->channels[s->n_channels].name = strdup(name);
    s->n_channels++;
  }
  json_decref(root);
  return 0;
}

static void register_metrics(om_egress_t *g) {
  om_metrics_t *m = g->metrics;
  eg_server_t *s = g->srv;
  char labels[128];
  for (int i = 0; i < OM_EGRESS_C__COUNT; i++) {
    snprintf(labels, sizeof labels, "class=\"%s\"",
             om_egress_class_name((om_egress_class_t)i));
    g->m_attempts[i] =
        om_metrics_counter(m, "openmesh_egress_attempts_total",
                           "Model-call attempts by outcome class.", labels);
  }
  g->m_fallbacks = om_metrics_counter(m, "openmesh_egress_fallbacks_total",
                                      "Moves to a later route.", "");
  g->m_cooldown_skips =
      om_metrics_counter(m, "openmesh_egress_cooldown_skips_total",
                         "Routes skipped while cooling down.", "");
  g->m_stream_broken = om_metrics_counter(
      m, "openmesh_egress_stream_broken_total",
      "Streams that failed after the first delta (never replayed).", "");
  for (int i = 0; i < 4; i++) {
    snprintf(labels, sizeof labels, "outcome=\"%s\"", OUTCOMES[i]);
    s->m_turns[i] = om_metrics_counter(m, "openmesh_egress_turns_total",
                                       "Turns by first answer.", labels);
  }
  s->m_errors[0] =
      om_metrics_counter(m, "openmesh_egress_errors_total",
                         "EgressErrors tracked.", "class=\"transport\"");
  s->m_errors[1] =
      om_metrics_counter(m, "openmesh_egress_errors_total",
                         "EgressErrors tracked.", "class=\"semantic\"");
  for (int i = 0; i < 6; i++) {
    snprintf(labels, sizeof labels, "result=\"%s\"", GATE[i]);
    s->m_gate[i] = om_metrics_counter(m, "openmesh_egress_gate_total",
                                      "Quality gate decisions.", labels);
  }
  s->m_chat[0] =
      om_metrics_counter(m, "openmesh_egress_chat_total",
                         "Chat completions by result.", "result=\"ok\"");
  s->m_chat[1] =
      om_metrics_counter(m, "openmesh_egress_chat_total",
                         "Chat completions by result.", "result=\"error\"");
  s->m_chat[2] = om_metrics_counter(m, "openmesh_egress_chat_total",
                                    "Chat completions by result.",
                                    "result=\"stream_interrupted\"");
  s->m_duplicates = om_metrics_counter(
      m, "openmesh_egress_duplicate_deliveries_refused_total",
      "Second deliveries of a turn refused (should stay 0).", "");
  s->m_reload_failed =
      om_metrics_counter(m, "openmesh_egress_policy_reload_failures_total",
                         "Policy versions rejected.", "");
  s->m_deliver_failed =
      om_metrics_counter(m, "openmesh_egress_delivery_failures_total",
                         "Deliveries a channel refused.", "");
  s->m_review = om_metrics_counter(m, "openmesh_egress_review_total",
                                   "Replies sent and marked for offline "
                                   "review.",
                                   "");
  if (s->errors != NULL) {
    s->errors->m_fail[0] = om_metrics_counter(
        m, "openmesh_egress_errors_file_failures_total",
        "Errors-file lines that could not be written, or reopens after a "
        "rotation that failed.",
        "op=\"write\"");
    s->errors->m_fail[1] = om_metrics_counter(
        m, "openmesh_egress_errors_file_failures_total",
        "Errors-file lines that could not be written, or reopens after a "
        "rotation that failed.",
        "op=\"reopen\"");
  }
  om_metrics_gauge_fn(m, "openmesh_egress_pending_turns",
                      "Async turns waiting for the next cycle.", "",
                      pending_gauge, g);
}

static void free_all(om_egress_t *g) {
  eg_server_t *s = g->srv;
  if (s != NULL) {
    for (size_t i = 0; i < s->n_channels; i++) {
      om_connector_close(s->channels[i].conn);
      free(s->channels[i].name);
    }
    errors_close(s->errors);
    free(s->lib_dir);
    free(s);
  }
  om_policy_watch_stop(g->fallback);
  om_policy_watch_stop(g->heuristics);
  eg_cfg_unref(g->cfg);
  om_metrics_free(g->metrics);
  free(g);
}

static void on_curl_closed(void *ud) {
  (void)ud;
}

int om_egress_new(uv_loop_t *loop, const om_egress_opts_t *opts,
                  om_egress_t **out, char *err, size_t errlen) {
  om_egress_t *g;
  om_policy_watch_opts_t wo;
  int rc;
  if (loop == NULL || opts == NULL || out == NULL ||
      opts->fallback_path == NULL || opts->heuristics_path == NULL) {
    snprintf(err, errlen, "missing argument");
    return OM_EINVAL;
  }
  g = calloc(1, sizeof *g);
  if (g == NULL || (g->srv = calloc(1, sizeof *g->srv)) == NULL ||
      (g->metrics = om_metrics_new()) == NULL) {
    if (g)
      free(g->srv);
    free(g);
    snprintf(err, errlen, "out of memory");
    return OM_ENOMEM;
  }
  g->loop = loop;
  om_rng_seed(&g->rng,
              opts->seed ? opts->seed : uv_hrtime() ^ (uint64_t)time(NULL));
  g->srv->lib_dir = strdup(opts->lib_dir ? opts->lib_dir : om_lib_dir());
  memset(&wo, 0, sizeof wo);
  wo.policy.lib_dir = g->srv->lib_dir;
  wo.path = opts->fallback_path;
  wo.kind = OM_POLICY_FALLBACK;
  wo.on_swap = on_fallback_swap;
  wo.ud = g;
  rc = om_policy_watch_start(loop, &wo, &g->fallback, err, errlen);
  if (rc == 0) {
    wo.path = opts->heuristics_path;
    wo.kind = OM_POLICY_EGRESS_HEURISTICS;
    wo.on_swap = NULL;
    rc = om_policy_watch_start(loop, &wo, &g->heuristics, err, errlen);
  }
  if (rc == 0 && g->cfg == NULL) {
    snprintf(err, errlen, "%s: no routes", opts->fallback_path);
    rc = OM_EPOLICY;
  }
  if (rc == 0 && opts->channels_path != NULL)
    rc = load_channels(g, opts->channels_path, err, errlen);
  if (rc == 0 && opts->errors_path != NULL)
    rc = errors_open(opts->errors_path, &g->srv->errors, err, errlen);
  if (rc == 0 && om_curl_uv_new(loop, &g->curl) != 0) {
    snprintf(err, errlen, "out of memory");
    rc = OM_ENOMEM;
  }
  if (rc == 0 && om_http_server_new(loop, &opts->server, on_request, g,
                                    &g->srv->http) != 0) {
    snprintf(err, errlen, "out of memory");
    rc = OM_ENOMEM;
  }
  if (rc != 0) {
    if (g->curl)
      om_curl_uv_close(g->curl, on_curl_closed, NULL);
    free_all(g);
    return rc;
  }
  register_metrics(g);
  *out = g;
  return 0;
}

int om_egress_listen(om_egress_t *g, const char *host, int port) {
  return om_http_server_listen(g->srv->http, host, port);
}

int om_egress_port(const om_egress_t *g) {
  return om_http_server_port(g->srv->http);
}

int om_egress_reload_policies(om_egress_t *g) {
  int bad = 0;
  bad += om_policy_watch_reload(g->fallback) < 0;
  bad += om_policy_watch_reload(g->heuristics) < 0;
  return bad;
}

static void on_curl_closed_final(void *ud) {
  om_egress_t *g = ud;
  void (*cb)(void *) = g->srv->closed_cb;
  void *cud = g->srv->closed_ud;
  free_all(g);
  if (cb)
    cb(cud);
}

static void on_http_closed(om_http_server_t *srv, void *ud) {
  (void)srv;
  (void)ud;
}

static void on_server_closed(om_http_server_t *srv) {
  om_egress_t *g = NULL;
  (void)srv;
  (void)g;
}

void om_egress_close(om_egress_t *g, void (*cb)(void *ud), void *ud) {
  eg_server_t *s;
  if (g == NULL || g->srv->closing)
    return;
  s = g->srv;
  s->closing = 1;
  s->closed_cb = cb;
  s->closed_ud = ud;
  (void)on_http_closed;
  (void)on_server_closed;
  while (s->chats != NULL) {
    chat_t *ch = s->chats;
    chat_unlink(ch);
    if (ch->req != NULL) {
      om_http_request_on_close(ch->req, NULL);
      if (ch->started)
        om_http_response_abort(ch->req);
      else
        respond_error(ch->req, 503, "draining",
                      "The gateway is shutting down.");
    }
    eg_call_cancel(ch->call);
    free(ch);
  }
  /* connectors first: their cancelled callbacks still find the turns */
  for (size_t i = 0; i < s->n_channels; i++) {
    om_connector_t *c = s->channels[i].conn;
    s->channels[i].conn = NULL;
    om_connector_close(c);
  }
  while (s->turns != NULL) {
    turn_t *t = s->turns;
    if (t->req != NULL) {
      om_http_request_on_close(t->req, NULL);
      respond_error(t->req, 503, "draining", "The gateway is shutting down.");
      t->req = NULL;
    }
    turn_free(t);
  }
  om_http_server_close(s->http, NULL);
  om_curl_uv_close(g->curl, on_curl_closed_final, g);
}
