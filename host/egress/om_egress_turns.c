/*
 * om_egress_turns.c: agent turns of the egress gateway (POST /v1/turns):
 * the model call, the opt-in quality gate (heuristics, then a judge for
 * flagged candidates), delivery through the channel's connector, and
 * Layer C (async turns stay silent and retry next cycle; interactive ones
 * get a holding line or a handoff from policy). The one rule: text that
 * reaches a user channel is the model's reply or a line from the
 * heuristics policy, never provider error text (om_egress.c).
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "om_egress_server.h"
#include "om_errno.h"
#include "om_log.h"
#include "om_message.h"

#define MAX_TURNS_KEPT 10000
#define MAX_FLAGS 16

/* Used when the heuristics policy has no handoff line for the agent: a
 * fixed sentence, never the cause. */
#define DEFAULT_HANDOFF                                                        \
  "I've passed this conversation to a teammate, who will follow up with you "  \
  "here."

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
    eg_track_error(g, t, NULL, OM_EGRESS_TRANSPORT, 0, cause, "delivery");
    if (t->delivering_final)
      t->final_failed = 1;
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
    eg_track_error(t->g, t, c, OM_EGRESS_TRANSPORT, 0,
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
        eg_track_error(t->g, t, NULL, OM_EGRESS_SEMANTIC, 0,
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
  if (!t->final_delivered)
    t->final_handoff = 1;
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
  eg_track_error(g, t, c, cls, retryable, cause, "turn");
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
  for (i = 0; i < c->n_attempts; i++) {
    json_t *a = json_pack(
        "{s:s, s:i, s:s, s:f, s:i}", "route", c->attempts[i].route, "status",
        c->attempts[i].status, "class", c->attempts[i].cls, "duration_ms",
        (double)c->attempts[i].duration_ns / 1e6, "cycle", t->cycles);
    /* the tokens of the attempt that answered (OpenAI usage shape) */
    if (a != NULL && c->attempts[i].usage.has)
      json_object_set_new(a, "usage", eg_usage_json(&c->attempts[i].usage));
    if (a != NULL && c->attempts[i].usage.has && c->attempts[i].cost_usd >= 0)
      json_object_set_new(a, "cost_usd", json_real(c->attempts[i].cost_usd));
    json_array_append_new(t->attempts, a);
  }
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
  o.model = json_string_value(json_object_get(t->request, "model"));
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
  eg_outcome_metric(t->g, t->outcome ? t->outcome : "silent");
  json_decref(t->answer);
  t->answer = turn_answer_json(t);
  t->req = NULL;
  if (req != NULL) {
    om_http_request_on_close(req, NULL);
    eg_respond_json(req, 200, json_incref(t->answer));
  }
}

/* How the turn ended, once: openmesh_egress_turn_ends_total{first,end}
 * and an egress_turn_end log line with the turn id, so a turn first held
 * or silent and later delivered (or handed off, or never) is visible. */
static void turn_end_record(turn_t *t) {
  const char *first = t->outcome ? t->outcome : "silent";
  const char *end = !t->final_delivered ? "expired"
                    : t->final_failed   ? "undelivered"
                    : t->final_handoff  ? "handed_off"
                                        : "delivered";
  char cycles[16], ms[24];
  eg_turn_end_metric(t->g, first, end);
  snprintf(cycles, sizeof cycles, "%d", t->cycles);
  snprintf(ms, sizeof ms, "%.1f", (double)(eg_now_ns() - t->created_ns) / 1e6);
  om_log(OM_LOG_INFO, "egress_turn_end", "turn_id", t->id, "agent", t->agent,
         "conversation", t->conversation, "context",
         t->interactive ? "interactive" : "async", "first", first, "end", end,
         "cycles", cycles, "duration_ms", ms, "error_id",
         t->error_id[0] ? t->error_id : "", NULL);
}

static void turn_finish(turn_t *t) {
  if (t->state == T_DONE)
    return;
  t->state = T_DONE;
  if (t->timer_init)
    uv_timer_stop(&t->timer);
  if (!t->answered)
    turn_answer(t);
  turn_end_record(t);
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

void eg_turn_free(turn_t *t) {
  eg_server_t *s = t->g->srv;
  om_list_remove(&t->link);
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
  om_list_t *it = s->turns.prev; /* the oldest */
  while (s->n_turns > MAX_TURNS_KEPT && it != &s->turns) {
    om_list_t *newer = it->prev;
    if (TURN_OF(it)->state == T_DONE)
      eg_turn_free(TURN_OF(it));
    it = newer;
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

void eg_handle_turn(om_egress_t *g, om_http_request_t *req) {
  eg_server_t *s = g->srv;
  json_error_t jerr;
  json_t *j =
      json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &jerr);
  const char *agent, *conv, *run, *ctx, *chan, *idem;
  char key[1024], refused[256];
  json_t *request;
  turn_t *t;
  const char *why = NULL;
  if (j == NULL || !json_is_object(j)) {
    json_decref(j);
    eg_respond_error(req, 400, "invalid_request", "body: not a JSON object");
    return;
  }
  agent = json_string_value(json_object_get(j, "agent"));
  conv = json_string_value(json_object_get(j, "conversation"));
  run = json_string_value(json_object_get(j, "run_id"));
  ctx = json_string_value(json_object_get(j, "context"));
  chan = json_string_value(json_object_get(j, "channel"));
  request = json_object_get(j, "request");
  if (!eg_valid_id(agent))
    why = "field 'agent': a non-empty string of at most 256 bytes";
  else if (!eg_valid_id(conv))
    why = "field 'conversation': a non-empty string of at most 256 bytes";
  else if (json_object_get(j, "run_id") != NULL &&
           !json_is_null(json_object_get(j, "run_id")) && !eg_valid_id(run))
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
  else if (eg_call_check(g, request, refused, sizeof refused) != 0)
    why = refused; /* a field a route cannot be sent (docs/EGRESS.md) */
  if (why != NULL) {
    json_decref(j);
    eg_respond_error(req, 400, "invalid_request", why);
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
    OM_LIST_FOREACH(it, &s->turns) {
      t = TURN_OF(it);
      if (t->key == NULL || strcmp(t->key, key) != 0)
        continue;
      json_decref(j);
      if (t->answered) {
        json_t *a = json_deep_copy(t->answer);
        json_object_set_new(a, "replayed", json_true());
        eg_respond_json(req, 200, a);
      } else {
        eg_respond_error(req, 409, "turn_in_progress",
                         "This turn is still running.");
      }
      return;
    }
  }
  t = calloc(1, sizeof *t);
  if (t == NULL) {
    json_decref(j);
    eg_respond_error(req, 503, "overloaded", "out of memory");
    return;
  }
  om_list_init(&t->link);
  t->g = g;
  snprintf(t->id, sizeof t->id, "turn-%" PRIu64, ++s->seq);
  t->agent = eg_strdup(agent);
  t->conversation = eg_strdup(conv);
  t->run_id = eg_strdup(run);
  t->context = eg_strdup(ctx);
  t->channel = eg_strdup(chan);
  t->key = key[0] ? eg_strdup(key) : NULL;
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
  om_list_push_front(&s->turns, &t->link);
  s->n_turns++;
  req->user = t;
  om_http_request_on_close(req, turn_client_gone);
  trim_turns(s);
  turn_cycle(t);
}

void eg_handle_pending(om_egress_t *g, om_http_request_t *req) {
  json_t *list = json_array();
  uint64_t now = eg_now_ns();
  OM_LIST_FOREACH(it, &g->srv->turns) {
    turn_t *t = TURN_OF(it);
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
  eg_respond_json(req, 200, json_pack("{s:o}", "pending", list));
}
