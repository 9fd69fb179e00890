/*
 * om_egress_call.c: Layer A for one request (see om_egress_internal.h):
 * attempts over om_upstream on the loop (both provider kinds, translated by
 * om_egress_translate.c), classification and the deadline rule of
 * core/om_egress_rules.h, cooldown, the tool-call repair and the streaming
 * hold.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "om_errno.h"
#include "om_egress_internal.h"
#include "om_log.h"
#include "om_sse.h"

#define EG_MAX_BODY ((size_t)4 << 20)

uint64_t eg_now_ns(void) {
  return uv_hrtime();
}

/* ---- routes -------------------------------------------------------------- */

int eg_cfg_alias(const eg_cfg_t *cfg, const char *model) {
  for (size_t i = 0; model != NULL && i < cfg->s.n_models; i++)
    if (strcmp(cfg->s.models[i].name, model) == 0)
      return (int)i;
  return -1;
}

/* Whether route i is in the call's chain (its alias's routes, or all). */
static int in_chain(const eg_call_t *c, uint32_t i) {
  const om_model_alias_t *a;
  if (c->alias < 0)
    return 1;
  a = &c->cfg->s.models[c->alias];
  for (size_t k = 0; k < a->n; k++)
    if (a->routes[k] == i)
      return 1;
  return 0;
}

static int route_index(const eg_cfg_t *cfg, const char *name) {
  for (size_t i = 0; i < cfg->n; i++)
    if (strcmp(cfg->routes[i].name, name) == 0)
      return (int)i;
  return -1;
}

/*
 * The next route: order(ctx) over the failures so far (the policy may
 * reorder after each), first one not abandoned in this call and not cooling
 * down; cooling routes only when nothing else is left. -1 when none.
 */
static int pick_route(eg_call_t *c, int *has_later) {
  om_egress_t *g = c->g;
  eg_cfg_t *cfg = c->cfg;
  uint32_t order[64];
  size_t n = cfg->n < 64 ? cfg->n : 64, k;
  om_failed_attempt_t failed[EG_MAX_ATTEMPTS];
  om_fallback_ctx_t ctx = {c->agent, c->context,    c->channel,
                           failed,   c->n_attempts, c->model};
  char err[256];
  int first = -1, first_cool = -1, later = 0;
  uint64_t now = eg_now_ns();
  if (c->only_route != NULL) {
    int i = route_index(cfg, c->only_route);
    *has_later = 0;
    return i >= 0 && !c->done_route[i] ? i : -1;
  }
  for (k = 0; k < c->n_attempts; k++) {
    failed[k].route = c->attempts[k].route;
    failed[k].status = c->attempts[k].status;
    failed[k].class_name = c->attempts[k].cls;
  }
  /* order() indexes the current policy's routes; a call started under an
   * older version walks its own list as given. */
  if (c->alias >= 0 && !cfg->s.has_order) {
    /* the alias's chain, in its own order */
    const om_model_alias_t *a = &cfg->s.models[c->alias];
    n = a->n < 64 ? a->n : 64;
    for (k = 0; k < n; k++)
      order[k] = a->routes[k];
  } else if (g->cfg != cfg || !cfg->s.has_order ||
             om_fallback_order(om_policy_watch_current(g->fallback), &ctx,
                               order, &n, err, sizeof err) != 0) {
    n = cfg->n < 64 ? cfg->n : 64;
    for (k = 0; k < n; k++)
      order[k] = (uint32_t)k;
  }
  for (k = 0; k < n; k++) {
    uint32_t i = order[k];
    /* order(ctx) orders; the alias bounds what it may pick */
    if (i >= cfg->n || c->done_route[i] || !in_chain(c, i))
      continue;
    /* Without order(ctx) the listed order would include the judge: a
     * judge answers the gate, not the user. */
    if (!cfg->s.has_order && cfg->s.judge_route != NULL &&
        strcmp(cfg->routes[i].name, cfg->s.judge_route) == 0)
      continue;
    if (om_egress_route_available(&cfg->state[i], now)) {
      if (first < 0)
        first = (int)i;
      else
        later = 1;
    } else {
      if (first_cool < 0)
        first_cool = (int)i;
      else
        later = 1;
    }
  }
  if (first < 0) {
    first = first_cool;
  } else if (first_cool >= 0) {
    later = 1;
    om_metric_inc(g->m_cooldown_skips);
  }
  *has_later = later;
  return first;
}

/* ---- the attempt --------------------------------------------------------- */

static void start_attempt(eg_call_t *c);
static void finish(eg_call_t *c, int ok);

/* The caller's request as a tree: parsed from its body on first need. */
static json_t *call_request(eg_call_t *c) {
  if (c->request == NULL && c->raw != NULL)
    c->request = json_loadb(c->raw, c->raw_len, 0, NULL);
  return c->request;
}

static void stop_timer(eg_call_t *c) {
  if (c->timer_active) {
    uv_timer_stop(&c->timer);
    c->timer_active = 0;
  }
}

/*
 * The call's own time (eg_call_overhead_ns): away() when it hands the
 * attempt to a provider, a name lookup or a backoff timer, back() when
 * one of its callbacks runs. Both are idempotent: a callback that starts
 * the next attempt leaves the call away.
 */
static void away(eg_call_t *c) {
  if (c->away_since_ns == 0)
    c->away_since_ns = eg_now_ns();
}

static void back(eg_call_t *c) {
  if (c->away_since_ns != 0) {
    c->away_ns += eg_now_ns() - c->away_since_ns;
    c->away_since_ns = 0;
  }
}

uint64_t eg_call_overhead_ns(const eg_call_t *c, uint64_t now) {
  uint64_t gone = c->away_ns;
  uint64_t total = now > c->received_ns ? now - c->received_ns : 0;
  if (c->away_since_ns != 0 && now > c->away_since_ns)
    gone += now - c->away_since_ns;
  return total > gone ? total - gone : 0;
}

/* The response head: its status and what it says about retrying. */
static int up_on_headers(void *ud, const om_upstream_response_t *resp) {
  eg_call_t *c = ud;
  struct {
    const char *name;
    char *dst;
    size_t cap;
  } want[] = {{"retry-after", c->retry_after, sizeof c->retry_after},
              {"retry-after-ms", c->retry_after_ms, sizeof c->retry_after_ms},
              {"x-should-retry", c->x_should_retry, sizeof c->x_should_retry}};
  c->got_byte = 1;
  c->status = resp->status;
  for (size_t k = 0; k < resp->n_headers; k++) {
    const om_http_header_t *h = &resp->headers[k];
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
      size_t vl = h->value_len;
      if (h->name_len != strlen(want[i].name) ||
          strncasecmp(h->name, want[i].name, h->name_len) != 0)
        continue;
      if (vl >= want[i].cap)
        vl = want[i].cap - 1;
      memcpy(want[i].dst, h->value, vl);
      want[i].dst[vl] = '\0';
    }
  }
  return 0;
}

static void on_body(eg_call_t *c, const char *buf, size_t n);

/* A part of the answer: the call's own time while it is handled. */
static void up_on_body(void *ud, const char *buf, size_t n) {
  eg_call_t *c = ud;
  back(c);
  on_body(c, buf, n);
  if (c->up != NULL)
    away(c); /* the exchange goes on (an attempt broken here released it) */
}

static void attempt_broken(eg_call_t *c, const char *detail);

static void on_body(eg_call_t *c, const char *buf, size_t n) {
  if (c->stream && c->status >= 200 && c->status < 300 && c->sse != NULL) {
    if (om_sse_parser_feed(c->sse, buf, n, eg_call_sse_event, c) != 0)
      attempt_broken(c, "the provider's event stream is malformed");
    else if (c->committed && c->up != NULL && c->hooks.backed_up != NULL &&
             c->hooks.backed_up(c->ud, c) && om_upstream_pause(c->up) == 0)
      c->paused = 1;
    return;
  }
  if (c->body_len + n > EG_MAX_BODY) {
    attempt_broken(c, "the provider's answer is over 4 MiB");
    return;
  }
  if (c->body_len + n + 1 > c->body_cap) {
    size_t cap = (c->body_len + n + 1) * 2;
    char *nb = realloc(c->body, cap);
    if (nb == NULL) {
      attempt_broken(c, "out of memory for the provider's answer");
      return;
    }
    c->body = nb;
    c->body_cap = cap;
  }
  memcpy(c->body + c->body_len, buf, n);
  c->body_len += n;
  c->body[c->body_len] = '\0';
}

static void release_attempt(eg_call_t *c) {
  c->paused = 0;
  if (c->up != NULL) {
    om_upstream_cancel(c->up);
    c->up = NULL;
  }
  if (c->waiting) {
    eg_name_cancel(&c->wait);
    c->waiting = 0;
  }
  free(c->req_body);
  c->req_body = NULL;
  om_sse_parser_free(c->sse);
  c->sse = NULL;
  c->body_len = 0;
  c->held_len = 0;
}

static void set_cause(eg_call_t *c, const char *fmt, const char *a, int st,
                      const char *b) {
  snprintf(c->cause, sizeof c->cause, fmt, a, st, b);
}

/* The facts of a 2xx JSON completion (OpenAI shape). */
static void completion_facts(json_t *comp, om_egress_outcome_t *o,
                             int *tool_bad) {
  json_t *ch = json_array_get(json_object_get(comp, "choices"), 0);
  json_t *msg = json_object_get(ch, "message");
  json_t *content = json_object_get(msg, "content");
  json_t *tools = json_object_get(msg, "tool_calls"), *t;
  json_t *usage = json_object_get(comp, "usage");
  json_t *ct = json_object_get(usage, "completion_tokens");
  const char *finish = json_string_value(json_object_get(ch, "finish_reason"));
  int has_text = json_is_string(content) && json_string_length(content) > 0;
  int has_tools = json_is_array(tools) && json_array_size(tools) > 0;
  size_t i;
  *tool_bad = 0;
  if (ch == NULL) {
    o->empty_completion = 1;
    return;
  }
  json_array_foreach(tools, i, t) {
    const char *args = json_string_value(
        json_object_get(json_object_get(t, "function"), "arguments"));
    json_t *parsed = args ? json_loads(args, JSON_DECODE_ANY, NULL) : NULL;
    if (parsed == NULL)
      *tool_bad = 1;
    json_decref(parsed);
  }
  if (!has_text && !has_tools) {
    if (finish && strcmp(finish, "length") == 0)
      o->length_no_content = 1;
    else
      o->empty_completion = 1;
  } else if (!has_tools && json_is_integer(ct) && json_integer_value(ct) == 0) {
    o->empty_completion = 1;
  }
}

/*
 * Per-route figures of one attempt: openmesh_egress_route_attempts_total
 * {route,class,status} (status 0: no HTTP answer) and the attempt's
 * duration in openmesh_egress_route_attempt_duration_seconds{route}.
 * Series are registered on first use; past EG_MAX_ROUTE_SERIES attempt
 * series the attempt is counted as dropped instead.
 */
static void route_metrics(eg_call_t *c, const om_egress_verdict_t *v,
                          int status, uint64_t duration_ns) {
  static const double bounds[] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  om_egress_t *g = c->g;
  om_metric_t **lat = &c->cfg->m_latency[c->cur];
  struct eg_series_s *last = &c->cfg->m_attempt_last[c->cur];
  char route[128], labels[256];
  om_metric_t *m;
  if (*lat == NULL) {
    om_metrics_escape(c->cfg->routes[c->cur].name, route, sizeof route);
    snprintf(labels, sizeof labels, "route=\"%s\"", route);
    *lat = om_metrics_histogram(
        g->metrics, "openmesh_egress_route_attempt_duration_seconds",
        "Model-call attempt durations by route (to the answer, the failure "
        "or the end of a stream).",
        labels, bounds, sizeof bounds / sizeof bounds[0]);
  }
  om_metric_observe(*lat, (double)duration_ns / 1e9);
  if (last->m != NULL && last->cls == (int)v->cls && last->status == status) {
    om_metric_inc(last->m);
    return;
  }
  om_metrics_escape(c->cfg->routes[c->cur].name, route, sizeof route);
  snprintf(labels, sizeof labels, "route=\"%s\",class=\"%s\",status=\"%d\"",
           route, v->name, status < 0 || status > 999 ? 0 : status);
  m = NULL;
  if (g->n_route_series < EG_MAX_ROUTE_SERIES) {
    size_t before = g->n_route_series;
    m = om_metrics_counter(g->metrics, "openmesh_egress_route_attempts_total",
                           "Model-call attempts by route, class and HTTP "
                           "status (0: no answer).",
                           labels);
    /* a new series only when the value is still 0 (never incremented) */
    if (m != NULL && om_metric_value(m) == 0)
      g->n_route_series = before + 1;
  } else {
    om_metric_inc(g->m_route_series_dropped);
    return;
  }
  om_metric_inc(m);
  if (m != NULL)
    *last = (struct eg_series_s){(int)v->cls, status, m};
}

static void record_attempt(eg_call_t *c, const om_egress_verdict_t *v,
                           int status) {
  eg_attempt_t *a;
  uint64_t now = eg_now_ns();
  om_egress_cooldown_opts_t cool;
  c->n_attempts_total++;
  om_metric_inc(c->g->m_attempts[v->cls]);
  /* the policy's cooldown (docs/POLICIES.md), defaults filled in by
   * om_fallback_config */
  cool.failures = c->cfg->s.cooldown_after_failures;
  cool.base_ns = c->cfg->s.cooldown_ms * MS;
  cool.max_ns = c->cfg->s.cooldown_max_ms * MS;
  om_egress_route_record(&c->cfg->state[c->cur], &cool, v, now);
  route_metrics(c, v, status, now - c->attempt_start_ns);
  if (c->n_attempts == EG_MAX_ATTEMPTS)
    return;
  if (c->n_attempts == c->attempts_cap) {
    size_t cap = c->attempts_cap ? c->attempts_cap * 2 : 4;
    eg_attempt_t *na = realloc(c->attempts, cap * sizeof *na);
    if (na == NULL)
      return; /* counted in the metrics above; not listed */
    c->attempts = na;
    c->attempts_cap = cap;
  }
  a = &c->attempts[c->n_attempts++];
  memset(a, 0, sizeof *a);
  snprintf(a->route, sizeof a->route, "%s", c->cfg->routes[c->cur].name);
  a->status = status;
  a->cls = v->name;
  a->cls_id = v->cls;
  a->duration_ns = now - c->attempt_start_ns;
  /* a wait of a day or more is as good as none for a caller (saturated
   * values would overflow the multiply) */
  a->retry_at_ns = v->has_server_wait && v->server_wait_ms < 86400000u
                       ? now + v->server_wait_ms * MS
                       : 0;
}

/* USD by the route's price (per million tokens; cached prompt tokens at
 * the cached price); 0 when the route has none or nothing was reported. */
static double usage_cost(const om_route_t *r, const eg_usage_t *u) {
  int64_t cached, fresh;
  if (!r->price.has || !u->has)
    return 0.0;
  cached = u->cached > 0 ? u->cached : 0;
  fresh = u->prompt > cached ? u->prompt - cached : 0;
  return ((double)fresh * r->price.input +
          (double)cached * r->price.cached_input +
          (double)(u->completion > 0 ? u->completion : 0) * r->price.output) /
         1e6;
}

/* What a retry on route r would spend, in its budget's unit: one attempt,
 * or its prompt re-sent. A failed attempt reports no usage, so the prompt
 * is estimated from the request's size (about four bytes per token, the
 * providers' own rule of thumb); the completion it may earn is paid by the
 * deposit of its success. */
static double retry_amount(const eg_call_t *c, const om_route_t *r) {
  double tokens = (double)(c->req_bytes / 4 + 1);
  switch (r->budget.unit) {
  case OM_BUDGET_TOKENS:
    return tokens;
  case OM_BUDGET_COST:
    return tokens * r->price.input / 1e6;
  default:
    return 1.0;
  }
}

/* A success's deposit into its route's budget (tokens or cost; an
 * attempts budget earned its share when the call reached the route) and
 * its cost in openmesh_egress_cost_usd_total{route,model}. Usage not
 * reported is estimated from the sizes (as retry_amount does), so a route
 * whose provider omits it still earns retries. */
static void record_spend(eg_call_t *c, const om_route_t *r,
                         const eg_usage_t *u) {
  eg_budget_t *b = c->cfg->budget[c->cur];
  eg_usage_t est = *u;
  om_metric_t **m = &c->cfg->m_cost[c->cur];
  if (r->price.has && c->cost_usd > 0) {
    if (*m == NULL) {
      char route[128], model[192], labels[400];
      om_metrics_escape(r->name, route, sizeof route);
      om_metrics_escape(r->model, model, sizeof model);
      snprintf(labels, sizeof labels, "route=\"%s\",model=\"%s\"", route,
               model);
      *m = om_metrics_counter(c->g->metrics, "openmesh_egress_cost_usd_total",
                              "Cost of successful model calls in USD by route "
                              "and model (the policy's prices).",
                              labels);
    }
    om_metric_add(*m, c->cost_usd);
  }
  if (b == NULL || r->budget.unit == OM_BUDGET_ATTEMPTS)
    return;
  if (!est.has) {
    est.has = 1;
    est.prompt = (int64_t)(c->req_bytes / 4 + 1);
    est.completion = (int64_t)(c->text_len / 4 + 1);
    est.cached = 0;
  }
  om_retry_budget_deposit(b->b, eg_now_ns(),
                          r->budget.unit == OM_BUDGET_TOKENS
                              ? (double)(est.prompt + est.completion)
                              : usage_cost(r, &est));
}

/* Whether route i's budget affords one more retry of the call (no budget:
 * yes). A refusal is counted in
 * openmesh_egress_retry_budget_exhausted_total{route}. */
static int budget_allows_retry(eg_call_t *c) {
  eg_budget_t *b = c->cfg->budget[c->cur];
  const om_route_t *r = &c->cfg->routes[c->cur];
  om_metric_t **m = &c->cfg->m_budget_out[c->cur];
  if (b == NULL ||
      om_retry_budget_try_spend(b->b, eg_now_ns(), retry_amount(c, r)))
    return 1;
  if (*m == NULL) {
    char route[128], labels[160];
    om_metrics_escape(r->name, route, sizeof route);
    snprintf(labels, sizeof labels, "route=\"%s\"", route);
    *m = om_metrics_counter(
        c->g->metrics, "openmesh_egress_retry_budget_exhausted_total",
        "Retries not made because the route's retry budget was spent (the "
        "call fell back or stopped instead).",
        labels);
  }
  om_metric_inc(*m);
  return 0;
}

/* The tokens of the successful attempt: on its attempt record (the turn
 * record shows them), openmesh_egress_tokens_total{route,model,kind} and
 * the call's log line. */
static void record_usage(eg_call_t *c) {
  static const char *kinds[3] = {"prompt", "completion", "cached"};
  const om_route_t *r = &c->cfg->routes[c->cur];
  om_metric_t **m = c->cfg->m_tokens[c->cur];
  eg_usage_t u = c->usage;
  int64_t v[3];
  char pt[24], ct[24], cat[24], cost[32];
  if (!c->stream)
    eg_usage_from_openai(json_object_get(c->result, "usage"), &u);
  if (c->n_attempts > 0)
    c->attempts[c->n_attempts - 1].usage = u;
  c->usage = u;
  c->cost_usd = usage_cost(r, &u);
  if (c->n_attempts > 0)
    c->attempts[c->n_attempts - 1].cost_usd = r->price.has ? c->cost_usd : -1;
  record_spend(c, r, &u);
  if (u.has) {
    v[0] = u.prompt, v[1] = u.completion, v[2] = u.cached;
    for (int k = 0; k < 3; k++) {
      if (m[k] == NULL) {
        char route[128], model[192], labels[400];
        om_metrics_escape(r->name, route, sizeof route);
        om_metrics_escape(r->model, model, sizeof model);
        snprintf(labels, sizeof labels, "route=\"%s\",model=\"%s\",kind=\"%s\"",
                 route, model, kinds[k]);
        m[k] = om_metrics_counter(
            c->g->metrics, "openmesh_egress_tokens_total",
            "Tokens of successful model calls by route, model and kind "
            "(prompt includes cached).",
            labels);
      }
      if (v[k] > 0)
        om_metric_add(m[k], (double)v[k]);
    }
  }
  if (!om_log_enabled(OM_LOG_INFO))
    return;
  snprintf(pt, sizeof pt, "%lld", (long long)u.prompt);
  snprintf(ct, sizeof ct, "%lld", (long long)u.completion);
  snprintf(cat, sizeof cat, "%lld", (long long)u.cached);
  snprintf(cost, sizeof cost, "%.6f", c->cost_usd);
  om_log(OM_LOG_INFO, "egress_call", "route", r->name, "model", r->model,
         "stream", c->stream ? "true" : "false", "usage",
         u.has ? "reported" : "none", "prompt_tokens", pt, "completion_tokens",
         ct, "cached_tokens", cat, "cost_usd", r->price.has ? cost : "unpriced",
         NULL);
}

static void on_wait_done(uv_timer_t *t) {
  eg_call_t *c = t->data;
  c->timer_active = 0;
  back(c);
  start_attempt(c);
}

/* Decide what follows a failed attempt (core/om_egress_rules.h). */
static void after_failure(eg_call_t *c, const om_egress_verdict_t *v) {
  om_egress_limits_t lim;
  om_egress_step_t st;
  om_fallback_settings_t *s = &c->cfg->s;
  int later = 0, nxt;
  uint64_t now = eg_now_ns();
  c->last = *v;
  if (c->committed) {
    /* Never replayed on another route: the caller already has part of it. */
    c->stop_why = "stream_broken_after_commit";
    om_metric_inc(c->g->m_stream_broken);
    finish(c, 0);
    return;
  }
  lim.max_attempts = c->max_attempts;
  lim.per_wait_ceiling_ns = s->per_wait_ceiling_ms * MS;
  lim.backoff_base_ns = s->backoff_base_ms * MS;
  lim.backoff_cap_ns = s->backoff_cap_ms * MS;
  /* is there a later route? (without touching the order yet) */
  c->done_route[c->cur] = 1;
  nxt = pick_route(c, &later);
  c->done_route[c->cur] = 0;
  om_egress_next(&lim, v, c->attempts_on_route, nxt >= 0, c->deadline, now,
                 &c->g->rng, &st);
  c->stop_why = st.why;
  /* A spent budget stops retries, never fallbacks. */
  if (st.action == OM_EGRESS_RETRY_SAME && !budget_allows_retry(c)) {
    c->stop_why = "retry_budget";
    st.action = nxt >= 0 ? OM_EGRESS_NEXT_ROUTE : OM_EGRESS_STOP;
  }
  if (st.action == OM_EGRESS_STOP) {
    finish(c, 0);
  } else if (st.action == OM_EGRESS_NEXT_ROUTE) {
    c->done_route[c->cur] = 1;
    c->cur = (size_t)nxt;
    c->attempts_on_route = 0;
    om_metric_inc(c->g->m_fallbacks);
    start_attempt(c);
  } else {
    c->timer_active = 1;
    away(c);
    uv_timer_start(&c->timer, on_wait_done, (st.wait_ns + MS - 1) / MS, 0);
  }
}

static void classify_and_go(eg_call_t *c, om_egress_outcome_t *o,
                            const char *detail) {
  om_egress_verdict_t v;
  int status = o->status;
  const char *route = c->cfg->routes[c->cur].name;
  if (om_egress_classify(o, (int64_t)time(NULL), &v) != 0) {
    memset(&v, 0, sizeof v);
    v.cls = OM_EGRESS_C_UNEXPECTED_STATUS;
    v.name = om_egress_class_name(v.cls);
    v.scope = OM_EGRESS_SCOPE_ROUTE;
  }
  record_attempt(c, &v, status);
  if (v.cls == OM_EGRESS_C_OK) {
    c->last = v;
    record_usage(c);
    finish(c, 1);
    return;
  }
  set_cause(c, "route %s: HTTP %d: %s", route, status,
            detail && *detail ? detail : v.name);
  after_failure(c, &v);
}

/* The in-attempt repair: the model's reply and a correction, once. */
static int start_repair(eg_call_t *c, json_t *comp);

/* How om_upstream's failure classes read as the rules' transport facts
 * (core/om_egress_rules.h). */
static om_egress_transport_t transport_of(const eg_call_t *c,
                                          const om_upstream_result_t *res) {
  switch (res->fail) {
  case OM_UPSTREAM_FAIL_CONNECT:
  case OM_UPSTREAM_FAIL_LOCAL:
  case OM_UPSTREAM_FAIL_INTERNAL:
    return OM_EGRESS_T_REFUSED;
  case OM_UPSTREAM_FAIL_TIMEOUT_CONNECT:
  case OM_UPSTREAM_FAIL_TIMEOUT_FIRST_BYTE:
    /* the head timeout is the route's first-byte timeout when it is the
     * tighter bound (send_request) */
    return c->first_byte_bound ? OM_EGRESS_T_FIRST_BYTE_TIMEOUT
                               : OM_EGRESS_T_ATTEMPT_TIMEOUT;
  case OM_UPSTREAM_FAIL_TIMEOUT_TOTAL:
    return OM_EGRESS_T_ATTEMPT_TIMEOUT;
  default:
    return OM_EGRESS_T_RESET;
  }
}

static int send_now(eg_call_t *c);

/* An OpenAI route's 2xx answer for the pass-through, read from its facts
 * the way completion_facts reads the tree: kept as it came (raw_result)
 * when it is a completion. 0 when it could not be (not sure, or tool
 * calls, whose arguments the repair checks): jansson then. */
static int openai_completion_fast(eg_call_t *c, om_egress_outcome_t *o) {
  eg_facts_t f;
  if (eg_facts_scan(c->body, c->body_len, 0, &f, &c->scratch,
                    &c->scratch_cap) != 0 ||
      f.n_tools > 0)
    return 0;
  if (f.n_choices == 0) {
    o->empty_completion = 1;
  } else if (!f.has_content || f.content_len == 0) {
    if (f.has_finish && strcmp(f.finish, "length") == 0)
      o->length_no_content = 1;
    else
      o->empty_completion = 1;
  } else if (f.has_completion_tokens && f.usage.completion == 0) {
    o->empty_completion = 1;
  }
  if (!o->empty_completion && !o->length_no_content) {
    json_decref(c->result);
    c->result = NULL;
    free(c->raw_result);
    c->raw_result = c->body;
    c->raw_result_len = c->body_len;
    c->body = NULL;
    c->body_len = c->body_cap = 0;
    c->text_len = 0;
    eg_call_text_append(c, f.content, f.content_len);
    eg_facts_usage(&f, &c->usage);
  }
  return 1;
}

static void on_done(void *ud, const om_upstream_result_t *res) {
  eg_call_t *c = ud;
  om_egress_outcome_t o;
  int status = c->status;
  char detail[512] = "";
  json_t *j = NULL, *comp = NULL;
  const om_route_t *r = &c->cfg->routes[c->cur];
  const eg_target_t *tg = &c->cfg->targets[c->cur];
  back(c);
  c->up = NULL; /* released when this returns */
  memset(&o, 0, sizeof o);
  if (tg->named && res->fail == OM_UPSTREAM_FAIL_CONNECT &&
      res->tls_fail == 0) {
    /* that address refused: the name's next one, in the same attempt */
    c->addr_nth++;
    if (send_now(c) == 0)
      return;
  } else if (tg->named && res->fail != OM_UPSTREAM_FAIL_CONNECT) {
    eg_name_worked(c->g, tg->host, c->addr_nth);
  }
  if (c->stream && c->committed && (res->err != 0 || c->stream_done != 1)) {
    /* broken after the first delta */
    o.transport = OM_EGRESS_T_RESET;
    snprintf(detail, sizeof detail, "stream broken after the first delta (%s)",
             res->err != 0 ? res->detail : "no end of stream");
    release_attempt(c);
    classify_and_go(c, &o, detail);
    return;
  }
  if (res->err != 0) {
    o.transport = transport_of(c, res);
    snprintf(detail, sizeof detail, "%s: %s", res->reason, res->detail);
    release_attempt(c);
    classify_and_go(c, &o, detail);
    return;
  }
  o.status = status;
  o.retry_after = c->retry_after[0] ? c->retry_after : NULL;
  o.retry_after_len = strlen(c->retry_after);
  o.retry_after_ms = c->retry_after_ms[0] ? c->retry_after_ms : NULL;
  o.retry_after_ms_len = strlen(c->retry_after_ms);
  o.x_should_retry = c->x_should_retry[0] ? c->x_should_retry : NULL;
  o.x_should_retry_len = strlen(c->x_should_retry);
  if (status >= 200 && status < 300 && c->stream) {
    /* held stream ended before any content */
    if (c->stream_done == 1 && c->committed) {
      release_attempt(c);
      classify_and_go(c, &o, NULL);
      return;
    }
    if (c->stream_done != 1)
      o.transport = OM_EGRESS_T_RESET, o.status = 0;
    else if (strcmp(c->finish, "length") == 0)
      o.length_no_content = 1;
    else
      o.empty_completion = 1;
    release_attempt(c);
    classify_and_go(c, &o,
                    o.transport ? "stream ended before the first delta"
                                : "no content in the stream");
    return;
  }
  if (status >= 200 && status < 300 && eg_call_relaying(c) && c->body != NULL &&
      openai_completion_fast(c, &o)) {
    release_attempt(c);
    classify_and_go(c, &o, NULL);
    return;
  }
  if (c->body != NULL)
    j = json_loadb(c->body, c->body_len, 0, NULL);
  if (status >= 200 && status < 300) {
    int tool_bad = 0;
    if (j != NULL && json_is_object(j))
      comp = eg_route_is_anthropic(r) ? eg_from_anthropic(j, r->model)
                                      : json_incref(j);
    if (comp == NULL) {
      o.empty_completion = 1;
      snprintf(detail, sizeof detail, "2xx body is not a completion");
    } else {
      completion_facts(comp, &o, &tool_bad);
      if (tool_bad && !c->repaired) {
        json_decref(j);
        release_attempt(c);
        if (start_repair(c, comp) == 0) {
          json_decref(comp);
          return;
        }
        j = NULL;
      }
      o.tool_json_invalid = tool_bad;
    }
    if (!o.empty_completion && !o.length_no_content && !o.tool_json_invalid) {
      json_t *msg = json_object_get(
          json_array_get(json_object_get(comp, "choices"), 0), "message");
      const char *t = json_string_value(json_object_get(msg, "content"));
      json_decref(c->result);
      c->result = json_incref(comp);
      free(c->raw_result);
      c->raw_result = NULL;
      if (comp == j) { /* an OpenAI answer: kept as it came */
        c->raw_result = c->body;
        c->raw_result_len = c->body_len;
        c->body = NULL;
        c->body_len = c->body_cap = 0;
      }
      c->text_len = 0;
      if (t)
        eg_call_text_append(c, t, strlen(t));
    }
  } else {
    json_t *e = json_object_get(j, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    char type[128], code[128];
    snprintf(type, sizeof type, "%s",
             json_string_value(json_object_get(e, "type"))
                 ? json_string_value(json_object_get(e, "type"))
                 : "");
    snprintf(code, sizeof code, "%s",
             json_string_value(json_object_get(e, "code"))
                 ? json_string_value(json_object_get(e, "code"))
                 : "");
    o.error_type = type[0] ? type : NULL;
    o.error_code = code[0] ? code : NULL;
    if (msg != NULL && (strstr(msg, "prompt is too long") != NULL ||
                        strstr(msg, "maximum context length") != NULL))
      o.context_overflow = 1;
    snprintf(detail, sizeof detail, "%.100s %.100s: %.280s", type, code,
             msg ? msg : "");
    release_attempt(c);
    classify_and_go(c, &o, detail);
    json_decref(j);
    return;
  }
  release_attempt(c);
  classify_and_go(c, &o, detail);
  json_decref(comp);
  json_decref(j);
}

/* An attempt that cannot go on (the answer is malformed or too big):
 * stopped, and classified as a broken transfer. */
static void attempt_broken(eg_call_t *c, const char *detail) {
  om_egress_outcome_t o;
  release_attempt(c);
  memset(&o, 0, sizeof o);
  o.transport = OM_EGRESS_T_RESET;
  classify_and_go(c, &o, detail);
}

static void on_name(eg_name_wait_t *w) {
  eg_call_t *c = OM_LIST_ENTRY(w, eg_call_t, wait);
  c->waiting = 0;
  back(c);
  if (send_now(c) != 0) {
    om_egress_outcome_t o = {.transport = OM_EGRESS_T_REFUSED};
    release_attempt(c);
    classify_and_go(c, &o, c->cause_name);
  }
}

/* Send the attempt's request to the route's target (the name's nth
 * address for a named one, waiting for its lookup when it has none). 0:
 * sent or waiting; else it could not start (c->cause_name says why). */
static int send_now(eg_call_t *c) {
  const om_route_t *r = &c->cfg->routes[c->cur];
  const eg_target_t *tg = &c->cfg->targets[c->cur];
  om_upstream_target_t t = tg->t;
  om_upstream_request_t q;
  om_upstream_callbacks_t cb = {
      .on_headers = up_on_headers, .on_body = up_on_body, .on_done = on_done};
  uint64_t now = eg_now_ns();
  uint64_t budget =
      om_deadline_attempt_timeout(c->deadline, now, r->attempt_timeout_ms * MS);
  uint64_t fb = r->first_byte_timeout_ms;
  int rc;
  if (tg->named) {
    const char *why = "";
    rc = eg_name_get(c->g, tg->host, tg->port, c->addr_nth, &t, &c->wait, &why);
    if (rc == 1) {
      c->waiting = 1;
      away(c);
      return 0;
    }
    if (rc != 0) {
      snprintf(c->cause_name, sizeof c->cause_name, "%s", why);
      return rc;
    }
  }
  memset(&q, 0, sizeof q);
  q.method = "POST";
  q.target = tg->path;
  q.headers = c->hdrs;
  q.n_headers = c->n_hdrs;
  q.body = c->req_body;
  q.body_len = c->req_bytes;
  q.timeout_ms = (budget + MS - 1) / MS ? (budget + MS - 1) / MS : 1;
  c->first_byte_bound = fb > 0 && fb * MS < budget;
  if (c->first_byte_bound)
    q.head_timeout_ms = fb;
  /* a pooled connection the provider closed as we reused it: re-sent
   * once on a fresh one (no byte of an answer came, so it was not read) */
  q.retry_stale = 1;
  c->got_byte = 0;
  c->status = 0;
  c->retry_after[0] = c->retry_after_ms[0] = c->x_should_retry[0] = '\0';
  rc = om_upstream_send(c->g->pool, &t, &q, &cb, c, &c->up);
  if (rc == 0)
    away(c);
  else
    snprintf(c->cause_name, sizeof c->cause_name,
             "the provider call could not start (%s)", om_strerror(rc));
  return rc;
}

/* Send body (taken: the attempt frees it) of len bytes to the route. */
static int send_body(eg_call_t *c, char *body, size_t len) {
  const om_route_t *r = &c->cfg->routes[c->cur];
  const char *key = r->api_key_env ? getenv(r->api_key_env) : NULL;
  c->req_body = body;
  if (c->req_body == NULL)
    return OM_ENOMEM;
  c->req_bytes = len;
  c->n_hdrs = 0;
  c->hdrs[c->n_hdrs++] =
      (om_http_header_t){"Content-Type", "application/json", 12, 16};
  if (eg_route_is_anthropic(r)) {
    c->hdrs[c->n_hdrs++] =
        (om_http_header_t){"anthropic-version", "2023-06-01", 17, 10};
    if (key != NULL && *key != '\0') {
      snprintf(c->auth, sizeof c->auth, "%s", key);
      c->hdrs[c->n_hdrs++] =
          (om_http_header_t){"x-api-key", c->auth, 9, strlen(c->auth)};
    }
  } else if (key != NULL && *key != '\0') {
    snprintf(c->auth, sizeof c->auth, "Bearer %s", key);
    c->hdrs[c->n_hdrs++] =
        (om_http_header_t){"Authorization", c->auth, 13, strlen(c->auth)};
  }
  if (c->stream && om_sse_parser_new(NULL, (om_sse_parser_t **)&c->sse) != 0)
    return OM_ENOMEM;
  c->stream_done = 0;
  c->n_tools = 0;
  c->finish[0] = '\0';
  c->addr_nth = 0;
  return send_now(c);
}

static int send_request(eg_call_t *c, json_t *provider_req) {
  char *body = json_dumps(provider_req, JSON_COMPACT);
  return send_body(c, body, body != NULL ? strlen(body) : 0);
}

static void start_attempt(eg_call_t *c) {
  const om_route_t *r;
  json_t *preq;
  char why[256];
  int rc;
  if (om_deadline_expired(c->deadline, eg_now_ns())) {
    c->stop_why = "deadline";
    finish(c, 0);
    return;
  }
  r = &c->cfg->routes[c->cur];
  /* a call reaching a route earns an attempts budget its share */
  if (c->attempts_on_route == 0 && c->cfg->budget[c->cur] != NULL &&
      r->budget.unit == OM_BUDGET_ATTEMPTS)
    om_retry_budget_deposit(c->cfg->budget[c->cur]->b, eg_now_ns(), 1.0);
  c->attempts_on_route++;
  c->attempt_start_ns = eg_now_ns();
  c->repaired = 0;
  {
    size_t n = strnlen(r->model, sizeof c->route_model - 1);
    memcpy(c->route_model, r->model, n);
    c->route_model[n] = '\0';
  }
  c->usage = (eg_usage_t){0};
  preq = NULL;
  if (!eg_route_is_anthropic(r) && c->raw != NULL &&
      !(c->stream && c->raw_facts->so_object)) {
    /* the caller's body with the route's model: no tree (Pass-through) */
    size_t len = 0;
    char *body =
        eg_openai_body(c->raw, c->raw_facts, r->model, c->stream, &len);
    rc = send_body(c, body, len);
  } else if (call_request(c) == NULL) {
    rc = OM_ENOMEM;
  } else if (eg_route_is_anthropic(r)) {
    rc = eg_to_anthropic(c->request, r, c->stream, &preq, why, sizeof why);
  } else {
    rc = (preq = eg_to_openai(c->request, r, c->stream)) ? 0 : OM_ENOMEM;
  }
  if (rc == 0 && preq != NULL)
    rc = send_request(c, preq);
  json_decref(preq);
  if (rc != 0) {
    om_egress_outcome_t o = {.transport = OM_EGRESS_T_REFUSED};
    release_attempt(c);
    classify_and_go(c, &o, "the request could not be started");
  }
}

static int start_repair(eg_call_t *c, json_t *comp) {
  const om_route_t *r = &c->cfg->routes[c->cur];
  json_t *msg = json_object_get(
      json_array_get(json_object_get(comp, "choices"), 0), "message");
  json_t *req = json_deep_copy(call_request(c)), *msgs, *preq;
  char *reply = json_dumps(json_object_get(msg, "tool_calls"), JSON_COMPACT);
  char why[256];
  int rc;
  c->repaired = 1;
  msgs = json_object_get(req, "messages");
  json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "assistant",
                                        "content", reply ? reply : ""));
  json_array_append_new(
      msgs, json_pack("{s:s, s:s}", "role", "user", "content",
                      "Your last tool call's arguments were not valid JSON. "
                      "Send the same tool call again with arguments that are "
                      "one valid JSON object, and nothing else."));
  free(reply);
  preq = NULL;
  if (eg_route_is_anthropic(r))
    rc = eg_to_anthropic(req, r, 0, &preq, why, sizeof why);
  else
    rc = (preq = eg_to_openai(req, r, 0)) ? 0 : OM_ENOMEM;
  json_decref(req);
  if (rc == 0)
    rc = send_request(c, preq);
  json_decref(preq);
  if (rc != 0)
    release_attempt(c);
  return rc;
}

/* ---- the call --------------------------------------------------------------
 */

static void timer_closed(uv_handle_t *h) {
  eg_call_t *c = h->data;
  eg_cfg_unref(c->cfg);
  json_decref(c->request);
  free(c->raw);
  free(c->raw_facts);
  json_decref(c->result);
  free(c->agent);
  free(c->context);
  free(c->channel);
  free(c->only_route);
  free(c->model);
  free(c->done_route);
  free(c->text);
  free(c->body);
  free(c->held);
  free(c->attempts);
  free(c->scratch);
  free(c->raw_result);
  free(c);
}

void eg_call_free(eg_call_t *c) {
  if (c == NULL || c->closing)
    return;
  c->closing = 1;
  stop_timer(c);
  release_attempt(c);
  uv_close((uv_handle_t *)&c->timer, timer_closed);
}

void eg_call_resume(eg_call_t *c) {
  if (c->paused && c->up != NULL)
    om_upstream_resume(c->up);
  c->paused = 0;
}

void eg_call_cancel(eg_call_t *c) {
  eg_call_free(c);
}

static void finish(eg_call_t *c, int ok) {
  c->ok = ok;
  if (!ok && c->cause[0] == '\0')
    snprintf(c->cause, sizeof c->cause, "no route could be tried (%s)",
             c->stop_why ? c->stop_why : "none");
  c->hooks.done(c->ud, c);
}

static char *dup_or_null(const char *s) {
  return s ? strdup(s) : NULL;
}

/*
 * A request a route of the chain could not receive faithfully is refused
 * before anything is sent (docs/EGRESS.md "Translation"): the answer must
 * not depend on which route happens to serve it. The chain is every route
 * of the config (order(ctx) may pick any), or the only route.
 */
static int check_translatable(eg_call_t *c, char *why, size_t why_len) {
  char buf[256];
  for (size_t i = 0; i < c->cfg->n; i++) {
    const om_route_t *r = &c->cfg->routes[i];
    json_t *preq = NULL;
    int rc;
    if (!eg_route_is_anthropic(r) ||
        (c->only_route != NULL && strcmp(c->only_route, r->name) != 0))
      continue;
    if (call_request(c) == NULL)
      return OM_ENOMEM;
    rc = eg_to_anthropic(c->request, r, c->stream, &preq, buf, sizeof buf);
    json_decref(preq);
    if (rc == OM_EINVAL) {
      if (why != NULL && why_len > 0)
        snprintf(why, why_len, "%s", buf);
      return rc;
    }
    return 0; /* the translation does not depend on the route */
  }
  return 0;
}

int eg_call_check(om_egress_t *g, json_t *request, char *why, size_t why_len) {
  eg_call_t c;
  if (g->cfg == NULL)
    return 0;
  memset(&c, 0, sizeof c);
  c.cfg = g->cfg;
  c.request = request;
  return check_translatable(&c, why, why_len);
}

int eg_call_start(om_egress_t *g, const eg_call_opts_t *o,
                  const eg_hooks_t *hooks, void *ud, eg_call_t **out) {
  eg_call_t *c;
  int later, first;
  uint64_t deadline_ms;
  if (g->cfg == NULL || g->cfg->n == 0)
    return OM_ESTATE;
  c = malloc(sizeof *c);
  if (c == NULL)
    return OM_ENOMEM;
  memset(c, 0, EG_CALL_CLEAR);
  c->auth[0] = c->cause_name[0] = c->cause[0] = '\0';
  c->g = g;
  c->cfg = g->cfg;
  c->cfg->refs++;
  c->hooks = *hooks;
  c->ud = ud;
  /* shared, never changed: a call that needs another form copies it */
  c->request = json_incref(o->request);
  if (o->raw != NULL) {
    c->raw = malloc(o->raw_len ? o->raw_len : 1);
    c->raw_facts = malloc(sizeof *c->raw_facts);
    if (c->raw != NULL)
      memcpy(c->raw, o->raw, o->raw_len);
    if (c->raw_facts != NULL)
      *c->raw_facts = *o->raw_facts;
    c->raw_len = o->raw_len;
  }
  c->stream = o->stream;
  c->agent = dup_or_null(o->agent);
  c->context = dup_or_null(o->context ? o->context : "interactive");
  c->channel = dup_or_null(o->channel);
  c->only_route = dup_or_null(o->only_route);
  c->model = dup_or_null(o->model);
  c->alias = eg_cfg_alias(c->cfg, o->model);
  c->done_route = calloc(c->cfg->n, 1);
  c->max_attempts = o->max_attempts ? o->max_attempts : c->cfg->s.max_attempts;
  if (c->max_attempts == 0)
    c->max_attempts = 1;
  c->started_ns = eg_now_ns();
  c->received_ns = o->received_ns != 0 && o->received_ns <= c->started_ns
                       ? o->received_ns
                       : c->started_ns;
  deadline_ms = o->deadline_ms ? o->deadline_ms : c->cfg->s.deadline_ms;
  c->deadline = om_deadline_after(c->started_ns, deadline_ms * MS);
  uv_timer_init(g->loop, &c->timer);
  c->timer.data = c;
  c->wait.cb = on_name;
  if ((o->raw == NULL ? c->request == NULL
                      : c->raw == NULL || c->raw_facts == NULL) ||
      c->context == NULL || c->done_route == NULL) {
    eg_call_free(c);
    return OM_ENOMEM;
  }
  c->include_usage =
      c->raw_facts != NULL
          ? c->raw_facts->include_usage && c->raw_facts->so_object
          : json_is_true(
                json_object_get(json_object_get(c->request, "stream_options"),
                                "include_usage"));
  if (c->cfg->s.n_models > 0 && o->only_route == NULL && o->model != NULL &&
      c->alias < 0) {
    eg_call_free(c);
    return OM_ENOTFOUND; /* a model the policy does not declare */
  }
  if (check_translatable(c, o->why, o->why_len) != 0) {
    eg_call_free(c);
    return OM_EINVAL;
  }
  first = pick_route(c, &later);
  if (first < 0) {
    eg_call_free(c);
    return OM_ESTATE;
  }
  c->cur = (size_t)first;
  *out = c;
  start_attempt(c);
  return 0;
}
