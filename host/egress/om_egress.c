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
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "om_egress_server.h"
#include "om_errno.h"
#include "om_http_chars.h"
#include "om_http_tls.h"
#include "om_log.h"
#include "om_message.h"
#include "om_paths.h"

static const char *OUTCOMES[4] = {"delivered", "held", "silent", "handed_off"};
static const char *ENDS[4] = {"delivered", "handed_off", "undelivered",
                              "expired"};
static const char *GATE[6] = {"clean",        "judge_send", "judge_block",
                              "judge_failed", "sanitized",  "blocked"};

/* ---- small helpers ------------------------------------------------------- */

char *eg_strdup(const char *s) {
  return s ? strdup(s) : NULL;
}

void eg_outcome_metric(om_egress_t *g, const char *o) {
  for (int i = 0; i < 4; i++)
    if (strcmp(OUTCOMES[i], o) == 0)
      om_metric_inc(g->srv->m_turns[i]);
}

void eg_turn_end_metric(om_egress_t *g, const char *first, const char *end) {
  for (int i = 0; i < 4; i++)
    for (int k = 0; k < 4; k++)
      if (strcmp(OUTCOMES[i], first) == 0 && strcmp(ENDS[k], end) == 0)
        om_metric_inc(g->srv->m_turn_ends[i][k]);
}

/*
 * The X-Request-Id of req's answer into out (at least EG_REQUEST_ID_CAP):
 * the caller's, echoed when it is 1..128 visible ASCII characters, else a
 * new one (32 hex digits: a per-process random seed and a counter through
 * splitmix64, unique without a system call per answer). Every answer
 * carries one, so a caller's log line and the gateway's meet.
 */
static uint64_t splitmix(uint64_t *x) {
  uint64_t z = (*x += UINT64_C(0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

const char *eg_request_id(const om_http_request_t *req, char *out) {
  static uint64_t state;
  static int seeded;
  size_t len = 0;
  const char *v = om_http_request_header(req, "x-request-id", &len);
  int ok = v != NULL && len >= 1 && len < EG_REQUEST_ID_CAP;
  for (size_t i = 0; ok && i < len; i++)
    ok = v[i] > 0x20 && v[i] < 0x7f;
  if (ok) {
    memcpy(out, v, len);
    out[len] = '\0';
    return out;
  }
  if (!seeded) {
    if (getrandom(&state, sizeof state, GRND_NONBLOCK) != sizeof state)
      state = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    seeded = 1;
  }
  { /* 32 hex digits (a per-answer snprintf cost more than the rest) */
    static const char hex[] = "0123456789abcdef";
    uint64_t w[2] = {splitmix(&state), splitmix(&state)};
    for (int k = 0; k < 32; k++)
      out[k] = hex[(w[k >> 4] >> (60 - 4 * (k & 15))) & 15];
    out[32] = '\0';
  }
  return out;
}

/*
 * The answer j (taken) with status. An error of the gateway's own (status
 * >= 400) tells the caller's SDK whether to retry it: the OpenAI and
 * Anthropic SDKs retry 408, 409, 429 and 5xx unless the answer says
 * `x-should-retry: false`, and honour Retry-After when it says true.
 * retry_after_s > 0 says "true, after that many seconds"; 0 says "false"
 * (the gateway has already retried and fallen back as far as its policy
 * allows, so a blind retry would multiply the provider calls).
 */
void eg_respond(om_http_request_t *req, int status, json_t *j,
                unsigned retry_after_s) {
  char ra[16], rid[EG_REQUEST_ID_CAP];
  om_http_header_t h[4] = {{"Content-Type", "application/json", 0, 0},
                           {"X-Request-Id", eg_request_id(req, rid), 0, 0}};
  size_t nh = 2;
  char *s = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
  if (s == NULL) {
    status = 500;
    retry_after_s = 0;
  }
  if (status >= 400) {
    h[nh++] = (om_http_header_t){"x-should-retry",
                                 retry_after_s ? "true" : "false", 0, 0};
    if (retry_after_s) {
      snprintf(ra, sizeof ra, "%u", retry_after_s);
      h[nh++] = (om_http_header_t){"Retry-After", ra, 0, 0};
    }
  }
  if (s == NULL)
    om_http_respond(req, 500, h, nh, "{\"error\":{\"type\":\"internal\"}}", 30);
  else
    om_http_respond(req, status, h, nh, s, strlen(s));
  free(s);
  json_decref(j);
}

void eg_respond_json(om_http_request_t *req, int status, json_t *j) {
  eg_respond(req, status, j, 0);
}

void eg_respond_error(om_http_request_t *req, int status, const char *type,
                      const char *message) {
  eg_respond_json(
      req, status,
      json_pack("{s:{s:s, s:s}}", "error", "type", type, "message", message));
}

void eg_respond_error_retry(om_http_request_t *req, int status,
                            const char *type, const char *message,
                            unsigned retry_after_s) {
  eg_respond(
      req, status,
      json_pack("{s:{s:s, s:s}}", "error", "type", type, "message", message),
      retry_after_s);
}

json_t *eg_attempts_json(const eg_call_t *c) {
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
int eg_valid_id(const char *s) {
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
void eg_track_error(om_egress_t *g, turn_t *t, const eg_call_t *c,
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
      "attempts", eg_attempts_json(c));
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

/* ---- inbound calls: what the three APIs share ----------------------------
 */

/* One SSE event, "event: E\n" (when given) "data: D\n\n", as one write
 * (one chunk on the wire) when it fits the stack buffer. */
void eg_sse_event(om_http_request_t *req, const char *event, const char *data,
                  size_t len) {
  char ev[4160];
  size_t el = event ? strlen(event) : 0, n = 0;
  if (el + len + 16 > sizeof ev) {
    if (event) {
      om_http_response_write(req, "event: ", 7);
      om_http_response_write(req, event, el);
      om_http_response_write(req, "\n", 1);
    }
    om_http_response_write(req, "data: ", 6);
    om_http_response_write(req, data, len);
    om_http_response_write(req, "\n\n", 2);
    return;
  }
  if (event) {
    memcpy(ev, "event: ", 7);
    memcpy(ev + 7, event, el);
    ev[7 + el] = '\n';
    n = 8 + el;
  }
  memcpy(ev + n, "data: ", 6);
  memcpy(ev + n + 6, data, len);
  memcpy(ev + n + 6 + len, "\n\n", 2);
  om_http_response_write(req, ev, n + len + 8);
}

void eg_sse_write(om_http_request_t *req, json_t *j, const char *event) {
  char *s = json_dumps(j, JSON_COMPACT);
  if (s != NULL)
    eg_sse_event(req, event, s, strlen(s));
  free(s);
  json_decref(j);
}

void eg_sse_start(chat_t *ch) {
  char rid[EG_REQUEST_ID_CAP];
  om_http_header_t h[] = {{"Content-Type", "text/event-stream", 0, 0},
                          {"Cache-Control", "no-cache", 0, 0},
                          {"X-Request-Id", NULL, 0, 0}};
  ch->started = 1;
  h[2].value = eg_request_id(ch->req, rid);
  om_http_response_start(ch->req, 200, h, 3);
}

/* Anthropic's error type for a status (Messages API, "Errors"). */
static const char *anthropic_error_type(int status) {
  switch (status) {
  case 400:
  case 405:
    return "invalid_request_error";
  case 401:
    return "authentication_error";
  case 403:
    return "permission_error";
  case 404:
    return "not_found_error";
  case 413:
    return "request_too_large";
  case 429:
    return "rate_limit_error";
  case 503:
  case 529:
    return "overloaded_error";
  default:
    return "api_error";
  }
}

void eg_respond_api_error(om_http_request_t *req, eg_api_t api, int status,
                          const char *type, const char *message,
                          unsigned retry_after_s, json_t *attempts) {
  json_t *e = json_pack("{s:s, s:s}", "type", type, "message", message);
  json_t *body;
  if (e != NULL && attempts != NULL)
    json_object_set(e, "attempts", attempts);
  if (e != NULL && strcmp(type, "model_not_found") == 0)
    json_object_set_new(e, "code", json_string(type));
  if (api == EG_API_MESSAGES && e != NULL) {
    /* Anthropic's shape: its own type names the class of error (what
     * the SDK maps to an exception), reason the gateway's stable type */
    json_object_set_new(e, "reason", json_string(type));
    json_object_set_new(e, "type", json_string(anthropic_error_type(status)));
    body = json_pack("{s:s, s:o}", "type", "error", "error", e);
  } else {
    body = e ? json_pack("{s:o}", "error", e) : NULL;
  }
  json_decref(attempts);
  eg_respond(req, status, body, retry_after_s);
}

json_t *eg_parse_body(om_http_request_t *req, const char **why) {
  json_error_t jerr;
  json_t *j =
      json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &jerr);
  if (j == NULL) {
    *why = "body: not valid JSON";
    return NULL;
  }
  if (!json_is_object(j)) {
    *why = "body: a JSON object";
    json_decref(j);
    return NULL;
  }
  return j;
}

static void chat_release(chat_t *ch, eg_call_t *c) {
  om_list_remove(&ch->link);
  eg_call_free(c);
  if (ch->st_free != NULL)
    ch->st_free(ch->st);
  free(ch);
}

static void chat_client_gone(om_http_request_t *req) {
  chat_t *ch = req->user;
  ch->req = NULL;
  chat_release(ch, ch->call);
}

/* A committed stream the caller reads slower than the provider sends:
 * beyond this much queued for it, the call stops reading the provider
 * until it drains to a quarter (docs/EGRESS.md "Streams and slow
 * callers"). */
#define CALLER_HIGH_WATER ((size_t)256 << 10)

static void chat_drained(om_http_request_t *req) {
  chat_t *ch = req->user;
  if (ch != NULL && ch->call != NULL)
    eg_call_resume(ch->call);
}

static int chat_backed_up(void *ud, eg_call_t *c) {
  chat_t *ch = ud;
  (void)c;
  return ch->req != NULL && ch->started &&
         om_http_response_pending(ch->req) > CALLER_HIGH_WATER &&
         om_http_response_on_drain(ch->req, CALLER_HIGH_WATER / 4,
                                   chat_drained) == 0;
}

int eg_chat_run(om_egress_t *g, om_http_request_t *req, eg_api_t api,
                json_t *request, const eg_req_facts_t *raw, const char *model,
                const eg_hooks_t *hooks, void *st, void (*st_free)(void *)) {
  chat_t *ch = calloc(1, sizeof *ch);
  eg_call_opts_t o;
  char refused[256] = "";
  int rc;
  if (ch == NULL) {
    if (st_free != NULL)
      st_free(st);
    eg_respond_api_error(req, api, 503, "overloaded", "out of memory", 0, NULL);
    return OM_ENOMEM;
  }
  om_list_init(&ch->link);
  ch->g = g;
  ch->req = req;
  ch->api = api;
  ch->st = st;
  ch->st_free = st_free;
  { /* prefix and sequence (formatted by hand: per call) */
    const char *pre = api == EG_API_MESSAGES    ? "msg_om"
                      : api == EG_API_RESPONSES ? "resp_om"
                                                : "chatcmpl-om";
    size_t n = strlen(pre);
    memcpy(ch->id, pre, n);
    om__http_u64_dec(ch->id + n, ++g->srv->seq);
  }
  om_list_push_front(&g->srv->chats, &ch->link);
  req->user = ch;
  om_http_request_on_close(req, chat_client_gone);
  memset(&o, 0, sizeof o);
  o.request = request;
  if (request == NULL) {
    o.raw = req->body;
    o.raw_len = req->body_len;
    o.raw_facts = raw;
  }
  o.model = model;
  o.stream = request != NULL ? json_is_true(json_object_get(request, "stream"))
                             : raw->stream;
  o.agent = om_http_request_header(req, "x-openmesh-agent", NULL);
  o.context = "interactive";
  o.why = refused;
  o.why_len = sizeof refused;
  o.received_ns = g->srv->dispatch_ns;
  {
    eg_hooks_t h = *hooks; /* every inbound API's streams alike */
    h.backed_up = chat_backed_up;
    rc = eg_call_start(g, &o, &h, ch, &ch->call);
  }
  if (rc != 0) {
    char msg[320];
    om_http_request_on_close(req, NULL);
    ch->call = NULL;
    chat_release(ch, NULL);
    if (rc == OM_EINVAL) {
      om_metric_inc(g->srv->m_refused[api]);
      eg_respond_api_error(req, api, 400, "invalid_request", refused, 0, NULL);
    } else if (rc == OM_ENOTFOUND) {
      snprintf(msg, sizeof msg,
               "field 'model': '%.200s' is not a model of this gateway (GET "
               "/v1/models lists them)",
               model ? model : "");
      eg_respond_api_error(req, api, 404, "model_not_found", msg, 0, NULL);
    } else {
      eg_respond_api_error(req, api, 503, "no_routes",
                           "No model route is configured.", 0, NULL);
    }
  }
  return rc;
}

static void chat_track(chat_t *ch, eg_call_t *c) {
  om_egress_t *g = ch->g;
  if (ch->req != NULL)
    om_http_request_on_close(ch->req, NULL);
  if (!c->ok)
    eg_track_error(g, NULL, c,
                   c->last.is_timeout ||
                           c->last.cls == OM_EGRESS_C_CONNECTION_RESET ||
                           c->last.cls == OM_EGRESS_C_CONNECTION_REFUSED ||
                           c->last.cls == OM_EGRESS_C_SERVER_ERROR
                       ? OM_EGRESS_TRANSPORT
                       : OM_EGRESS_SEMANTIC,
                   c->last.retryable, c->cause, "chat");
  om_metric_inc(g->srv->m_chat[c->ok ? 0 : ch->started ? 2 : 1]);
}

static void chat_fail(chat_t *ch, eg_call_t *c) {
  eg_final_t f;
  eg_final_outcome(c, eg_now_ns(), &f);
  eg_respond_api_error(ch->req, ch->api, f.status, f.type, f.message,
                       f.retry_after_s, eg_attempts_json(c));
}

void eg_chat_finish(chat_t *ch, eg_call_t *c,
                    void (*stream_end)(chat_t *ch, eg_call_t *c),
                    json_t *(*whole)(chat_t *ch, eg_call_t *c)) {
  om_egress_t *g = ch->g;
  om_http_request_t *req = ch->req;
  chat_track(ch, c);
  if (req != NULL) {
    if (ch->started) {
      /* committed: never replayed; the API's last events end it */
      stream_end(ch, c);
      om_http_response_end(req);
    } else if (c->ok && whole == NULL) {
      char rid[EG_REQUEST_ID_CAP];
      om_http_header_t h[2] = {{"Content-Type", "application/json", 0, 0},
                               {"X-Request-Id", eg_request_id(req, rid), 0, 0}};
      om_http_respond(req, 200, h, 2, c->raw_result, c->raw_result_len);
    } else if (c->ok) {
      eg_respond_json(req, 200, whole(ch, c));
    } else {
      chat_fail(ch, c);
    }
    om_metric_observe(g->srv->m_overhead[ch->api],
                      (double)eg_call_overhead_ns(c, eg_now_ns()) / 1e9);
  }
  ch->req = NULL;
  chat_release(ch, c);
}

/*
 * What a call that failed before anything was committed answers
 * (docs/EGRESS.md "Final errors"). The gateway has retried and fallen
 * back as its policy allows; what is left for the caller:
 *   - the deadline ran out: 504 deadline_exceeded, not retried;
 *   - every attempt failed for a reason the caller must fix (the same on
 *     every route): the provider's own status and a stable type, not
 *     retried: 400 request_rejected (validation, another 4xx),
 *     400 context_length_exceeded, 401 authentication_failed,
 *     403 permission_denied, 429 insufficient_quota. When the causes
 *     differ, the last attempt's decides;
 *   - every attempt was told to come back later (429 or 503/529 with
 *     Retry-After or retry-after-ms) and the earliest of those times is
 *     within a minute: 429 rate_limited with `x-should-retry: true` and
 *     Retry-After, since a retry then can succeed;
 *   - anything else: 502 all_routes_failed, not retried (a blind retry
 *     would run the whole chain again).
 */
#define MAX_CALLER_WAIT_NS (UINT64_C(60) * 1000000000u)

static int caller_fault(const eg_attempt_t *a, eg_final_t *f) {
  switch (a->cls_id) {
  case OM_EGRESS_C_BAD_REQUEST:
  case OM_EGRESS_C_CLIENT_ERROR:
    *f = (eg_final_t){400, "request_rejected",
                      "The model provider rejected the request.", 0};
    return 1;
  case OM_EGRESS_C_CONTEXT_LENGTH:
    *f = (eg_final_t){400, "context_length_exceeded",
                      "The request is longer than every model route accepts.",
                      0};
    return 1;
  case OM_EGRESS_C_AUTH:
    *f = a->status == 403
             ? (eg_final_t){403, "permission_denied",
                            "The model provider refused the credentials.", 0}
             : (eg_final_t){401, "authentication_failed",
                            "The model provider did not accept the key.", 0};
    return 1;
  case OM_EGRESS_C_QUOTA_EXHAUSTED:
    *f = (eg_final_t){429, "insufficient_quota",
                      "The model provider's quota is spent.", 0};
    return 1;
  default:
    return 0;
  }
}

void eg_final_outcome(const eg_call_t *c, uint64_t now, eg_final_t *f) {
  size_t n = c->n_attempts;
  int all_caller = n > 0, all_wait = n > 0;
  uint64_t earliest = UINT64_MAX;
  eg_final_t last = {0};
  if (c->stop_why && strcmp(c->stop_why, "deadline") == 0) {
    *f = (eg_final_t){504, "deadline_exceeded", "No model route could answer.",
                      0};
    return;
  }
  for (size_t i = 0; i < n; i++) {
    const eg_attempt_t *a = &c->attempts[i];
    eg_final_t one;
    if (caller_fault(a, &one))
      last = one;
    else
      all_caller = 0;
    if (a->retry_at_ns == 0)
      all_wait = 0;
    else if (a->retry_at_ns < earliest)
      earliest = a->retry_at_ns;
  }
  if (all_caller) {
    *f = last;
    return;
  }
  if (all_wait && earliest < now + MAX_CALLER_WAIT_NS) {
    uint64_t left = earliest > now ? earliest - now : 0;
    *f = (eg_final_t){429, "rate_limited",
                      "Every model route asked to be called again later.",
                      (unsigned)((left + 999999999u) / 1000000000u)};
    if (f->retry_after_s == 0)
      f->retry_after_s = 1;
    return;
  }
  *f =
      (eg_final_t){502, "all_routes_failed", "No model route could answer.", 0};
}

/* ---- admin ------------------------------------------------------------------
 */

static double pending_gauge(void *ud) {
  om_egress_t *g = ud;
  double n = 0;
  OM_LIST_FOREACH(it, &g->srv->turns) {
    const turn_t *t = TURN_OF(it);
    n += !t->interactive && t->state == T_WAITING;
  }
  return n;
}

static void handle_metrics(om_egress_t *g, om_http_request_t *req) {
  char rid[EG_REQUEST_ID_CAP];
  const om_http_header_t h[] = {
      {"Content-Type", "text/plain; version=0.0.4", 0, 0},
      {"X-Request-Id", eg_request_id(req, rid), 0, 0}};
  size_t len = 0;
  char *text = om_metrics_render(g->metrics, &len);
  if (text == NULL) {
    eg_respond_error(req, 500, "internal", "out of memory");
    return;
  }
  om_http_respond(req, 200, h, 2, text, len);
  free(text);
}

/* Turns with work left (a call, a judge, a delivery or a retry timer). */
static size_t active_turns(om_egress_t *g) {
  size_t n = 0;
  OM_LIST_FOREACH(it, &g->srv->turns) {
    n += TURN_OF(it)->state != T_DONE;
  }
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
  json_t *st = json_pack(
      "{s:{s:{s:s, s:I, s:I, s:s}, s:{s:s, s:I, s:I, s:s}}, s:o, "
      "s:I, s:f}",
      "policies", "fallback", "path", om_policy_watch_path(g->fallback),
      "version", (json_int_t)om_policy_watch_version(g->fallback), "failures",
      (json_int_t)om_policy_watch_failures(g->fallback), "last_error",
      om_policy_watch_last_error(g->fallback), "egress_heuristics", "path",
      om_policy_watch_path(g->heuristics), "version",
      (json_int_t)om_policy_watch_version(g->heuristics), "failures",
      (json_int_t)om_policy_watch_failures(g->heuristics), "last_error",
      om_policy_watch_last_error(g->heuristics), "routes", routes,
      "active_turns", (json_int_t)active_turns(g), "pending", pending_gauge(g));
  /* each policy's source, revision, load time and errors, as the proxy
   * shows its own */
  json_t *pols = json_object_get(st, "policies");
  if (st != NULL &&
      (om_policy_watch_status(g->fallback, json_object_get(pols, "fallback")) !=
           0 ||
       om_policy_watch_status(
           g->heuristics, json_object_get(pols, "egress_heuristics")) != 0)) {
    json_decref(st);
    st = NULL;
  }
  eg_respond_json(req, 200, st);
}

/*
 * GET /v1/models: the models the routes of the current fallback policy
 * send, once each, in OpenAI's list shape, so an SDK's model listing
 * works against the gateway.
 */
static void handle_models(om_egress_t *g, om_http_request_t *req) {
  json_t *data = json_array();
  const eg_cfg_t *cfg = g->cfg;
  /* with aliases, they are what a caller may name; else each route's
   * model, once (the caller's model then selects nothing) */
  size_t n = cfg == NULL ? 0 : cfg->s.n_models ? cfg->s.n_models : cfg->n;
  for (size_t i = 0; data != NULL && i < n; i++) {
    const char *m =
        cfg->s.n_models ? cfg->s.models[i].name : cfg->routes[i].model;
    size_t k;
    for (k = 0; !cfg->s.n_models && k < i; k++)
      if (strcmp(cfg->routes[k].model, m) == 0)
        break;
    if (cfg->s.n_models || k == i)
      json_array_append_new(data, json_pack("{s:s, s:s, s:i, s:s}", "id", m,
                                            "object", "model", "created", 0,
                                            "owned_by", "openmesh"));
  }
  eg_respond_json(req, 200,
                  data ? json_pack("{s:s, s:o}", "object", "list", "data", data)
                       : NULL);
}

static void on_request(om_http_request_t *req, void *ud) {
  om_egress_t *g = ud;
  g->srv->dispatch_ns = eg_now_ns();
  int post = req->method_len == 4 && memcmp(req->method, "POST", 4) == 0;
  int get = req->method_len == 3 && memcmp(req->method, "GET", 3) == 0;
#define PATH_IS(p)                                                             \
  (req->path_len == sizeof(p) - 1 && memcmp(req->path, p, sizeof(p) - 1) == 0)
  if (g->srv->closing) {
    eg_respond_api_error(
        req, PATH_IS("/v1/messages") ? EG_API_MESSAGES : EG_API_CHAT, 503,
        "draining", "The gateway is shutting down.", 1, NULL);
  } else if (PATH_IS("/v1/chat/completions")) {
    if (post)
      eg_handle_chat(g, req);
    else
      eg_respond_error(req, 405, "method_not_allowed", "POST only");
  } else if (PATH_IS("/v1/messages")) {
    if (post)
      eg_handle_messages(g, req);
    else
      eg_respond_api_error(req, EG_API_MESSAGES, 405, "method_not_allowed",
                           "POST only", 0, NULL);
  } else if (PATH_IS("/v1/responses")) {
    if (post)
      eg_handle_responses(g, req);
    else
      eg_respond_error(req, 405, "method_not_allowed", "POST only");
  } else if (PATH_IS("/v1/turns")) {
    if (post)
      eg_handle_turn(g, req);
    else
      eg_respond_error(req, 405, "method_not_allowed", "POST only");
  } else if (PATH_IS("/v1/pending") && get) {
    eg_handle_pending(g, req);
  } else if (PATH_IS("/v1/models") && get) {
    handle_models(g, req);
  } else if (PATH_IS("/metrics") && get) {
    handle_metrics(g, req);
  } else if (PATH_IS("/status") && get) {
    handle_status(g, req);
  } else if (PATH_IS("/healthz") && get) {
    eg_respond_json(req, 200, json_pack("{s:s}", "status", "ok"));
  } else {
    eg_respond_error(req, 404, "not_found", "No such endpoint.");
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
    if (s->n_channels == MAX_CHANNELS || !eg_valid_id(name) ||
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
  g->m_route_series_dropped = om_metrics_counter(
      m, "openmesh_egress_route_series_dropped_total",
      "Attempts not counted by route because the route-attempt series "
      "reached their limit (4096).",
      "");
  g->m_stream_broken = om_metrics_counter(
      m, "openmesh_egress_stream_broken_total",
      "Streams that failed after the first delta (never replayed).", "");
  for (int i = 0; i < 4; i++) {
    snprintf(labels, sizeof labels, "outcome=\"%s\"", OUTCOMES[i]);
    s->m_turns[i] = om_metrics_counter(m, "openmesh_egress_turns_total",
                                       "Turns by first answer.", labels);
    for (int k = 0; k < 4; k++) {
      snprintf(labels, sizeof labels, "first=\"%s\",end=\"%s\"", OUTCOMES[i],
               ENDS[k]);
      s->m_turn_ends[i][k] = om_metrics_counter(
          m, "openmesh_egress_turn_ends_total",
          "Turns by first answer and by how they ended (a held or silent "
          "turn later delivered: end delivered).",
          labels);
    }
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
  {
    static const char *apis[3] = {"chat", "messages", "responses"};
    for (int i = 0; i < 3; i++) {
      snprintf(labels, sizeof labels, "api=\"%s\"", apis[i]);
      s->m_refused[i] = om_metrics_counter(
          m, "openmesh_egress_requests_refused_total",
          "Inbound requests refused as invalid (a field of the wrong type, "
          "unknown, or over its limit), by API.",
          labels);
    }
    /* the gateway's own time per answered call (eg_call_overhead_ns):
     * tens of microseconds when well, so the buckets start at 10 us */
    static const double ob[] = {0.00001, 0.000025, 0.00005, 0.0001,
                                0.00025, 0.0005,   0.001,   0.0025,
                                0.005,   0.01,     0.05};
    for (int i = 0; i < 3; i++) {
      snprintf(labels, sizeof labels, "api=\"%s\"", apis[i]);
      s->m_overhead[i] = om_metrics_histogram(
          m, "openmesh_egress_overhead_seconds",
          "The gateway's own time per answered call, by inbound API: from "
          "the request to its answer, less the time spent waiting on "
          "providers, name lookups and backoffs.",
          labels, ob, sizeof ob / sizeof ob[0]);
    }
  }
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
  eg_names_free(g);
  om_metrics_free(g->metrics);
  free(g);
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
  om_list_init(&g->names);
  om_list_init(&g->srv->turns);
  om_list_init(&g->srv->chats);
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
  if (rc == 0 && om_upstream_pool_new(loop, NULL, &g->pool) != 0) {
    snprintf(err, errlen, "out of memory");
    rc = OM_ENOMEM;
  }
  if (rc == 0 && om_http_server_new(loop, &opts->server, on_request, g,
                                    &g->srv->http) != 0) {
    snprintf(err, errlen, "out of memory");
    rc = OM_ENOMEM;
  }
  if (rc != 0) {
    if (g->pool)
      om_upstream_pool_close(g->pool, NULL, NULL);
    free_all(g);
    return rc;
  }
  register_metrics(g);
  om_http_tls_metrics(opts->server.tls, g->metrics, "openmesh_egress");
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

static void on_pool_closed(void *ud) {
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
  OM_LIST_FOREACH_SAFE(it, &s->chats) {
    chat_t *ch = OM_LIST_ENTRY(it, chat_t, link);
    om_list_remove(&ch->link);
    if (ch->req != NULL) {
      om_http_request_on_close(ch->req, NULL);
      if (ch->started)
        om_http_response_abort(ch->req);
      else
        eg_respond_api_error(ch->req, ch->api, 503, "draining",
                             "The gateway is shutting down.", 1, NULL);
    }
    eg_call_cancel(ch->call);
    if (ch->st_free != NULL)
      ch->st_free(ch->st);
    free(ch);
  }
  /* connectors first: their cancelled callbacks still find the turns */
  for (size_t i = 0; i < s->n_channels; i++) {
    om_connector_t *c = s->channels[i].conn;
    s->channels[i].conn = NULL;
    om_connector_close(c);
  }
  while (!om_list_empty(&s->turns)) {
    turn_t *t = TURN_OF(om_list_first(&s->turns));
    if (t->req != NULL) {
      om_http_request_on_close(t->req, NULL);
      eg_respond_error_retry(t->req, 503, "draining",
                             "The gateway is shutting down.", 1);
      t->req = NULL;
    }
    eg_turn_free(t);
  }
  om_http_server_close(s->http, NULL);
  om_upstream_pool_close(g->pool, on_pool_closed, g);
}
