/*
 * om_egress_rules.c: Layer A classification, the deadline rule and route
 * cooldown (see om_egress_rules.h for the rules and why).
 */
#include "om_egress_rules.h"

#include <string.h>

#include "om_backoff.h"
#include "om_errno.h"

#define MS UINT64_C(1000000)

static const struct {
  const char *name;
  int retryable, scope, health;
} CLASSES[] = {
#define OM__EGRESS_CLASS_ROW(e, name, r, scope, health)                        \
  {name, r, OM_EGRESS_SCOPE_##scope, health},
    OM_EGRESS_CLASS_MAP(OM__EGRESS_CLASS_ROW)
#undef OM__EGRESS_CLASS_ROW
};

const char *om_egress_class_name(om_egress_class_t c) {
  if ((int)c < 0 || c >= OM_EGRESS_C__COUNT)
    return "unknown";
  return CLASSES[c].name;
}

/* ASCII case-insensitive equality of n bytes (no locale: header tokens). */
static int ieq(const char *a, const char *b, size_t n) {
  for (size_t i = 0; i < n; i++) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z')
      x = (char)(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z')
      y = (char)(y - 'A' + 'a');
    if (x != y)
      return 0;
  }
  return 1;
}

static int has(const char *s, const char *needle) {
  return s != NULL && strstr(s, needle) != NULL;
}

/* A quota or spend limit: waiting does not help, another account might. */
static int quota_exhausted(const om_egress_outcome_t *o) {
  const char *f[2] = {o->error_code, o->error_type};
  for (int i = 0; i < 2; i++)
    if (has(f[i], "insufficient_quota") || has(f[i], "quota") ||
        has(f[i], "billing") || has(f[i], "spend_limit"))
      return 1;
  return 0;
}

static int context_overflow(const om_egress_outcome_t *o) {
  return o->context_overflow || has(o->error_code, "context_length_exceeded") ||
         has(o->error_type, "context_length_exceeded");
}

static om_egress_class_t classify_status(const om_egress_outcome_t *o) {
  int s = o->status;
  if (s >= 200 && s < 300) {
    if (o->length_no_content)
      return OM_EGRESS_C_LENGTH_NO_CONTENT;
    if (o->empty_completion)
      return OM_EGRESS_C_EMPTY_COMPLETION;
    if (o->tool_json_invalid)
      return OM_EGRESS_C_TOOL_JSON_INVALID;
    return OM_EGRESS_C_OK;
  }
  /* A context overflow may arrive as 400, 413 or 429 (some gateways): the
   * body is more specific than the status. */
  if (s >= 400 && s < 500 && context_overflow(o))
    return OM_EGRESS_C_CONTEXT_LENGTH;
  if (s == 529)
    return OM_EGRESS_C_OVERLOADED;
  if (s >= 500)
    return OM_EGRESS_C_SERVER_ERROR;
  switch (s) {
  case 408:
    return OM_EGRESS_C_REQUEST_TIMEOUT;
  case 409:
    return OM_EGRESS_C_CONFLICT;
  case 429:
    return quota_exhausted(o) ? OM_EGRESS_C_QUOTA_EXHAUSTED
                              : OM_EGRESS_C_RATE_LIMITED;
  case 400:
  case 422:
    return quota_exhausted(o) ? OM_EGRESS_C_QUOTA_EXHAUSTED
                              : OM_EGRESS_C_BAD_REQUEST;
  case 401:
  case 403:
    return OM_EGRESS_C_AUTH;
  case 402:
    return OM_EGRESS_C_QUOTA_EXHAUSTED;
  case 404:
    return OM_EGRESS_C_NOT_FOUND;
  default:
    return s >= 400 ? OM_EGRESS_C_CLIENT_ERROR : OM_EGRESS_C_UNEXPECTED_STATUS;
  }
}

/* "true"/"false" after OWS, case-insensitively; -1 when absent or other. */
static int should_retry(const char *s, size_t len) {
  if (s == NULL)
    return -1;
  while (len > 0 && (*s == ' ' || *s == '\t'))
    s++, len--;
  while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\t'))
    len--;
  if (len == 4 && ieq(s, "true", 4))
    return 1;
  if (len == 5 && ieq(s, "false", 5))
    return 0;
  return -1;
}

int om_egress_classify(const om_egress_outcome_t *o, int64_t now_s,
                       om_egress_verdict_t *v) {
  om_egress_verdict_t r;
  om_egress_class_t c;
  uint64_t ms;
  int sr;
  if (o == NULL || v == NULL)
    return OM_EINVAL;
  if ((o->status == 0) == (o->transport == OM_EGRESS_T_NONE))
    return OM_EINVAL;
  if (o->status != 0 && (o->status < 100 || o->status > 599))
    return OM_EINVAL;
  if ((int)o->transport < 0 || o->transport > OM_EGRESS_T_FIRST_BYTE_TIMEOUT)
    return OM_EINVAL;
  switch (o->transport) {
  case OM_EGRESS_T_RESET:
    c = OM_EGRESS_C_CONNECTION_RESET;
    break;
  case OM_EGRESS_T_REFUSED:
    c = OM_EGRESS_C_CONNECTION_REFUSED;
    break;
  case OM_EGRESS_T_ATTEMPT_TIMEOUT:
    c = OM_EGRESS_C_TIMEOUT;
    break;
  case OM_EGRESS_T_FIRST_BYTE_TIMEOUT:
    c = OM_EGRESS_C_FIRST_BYTE_TIMEOUT;
    break;
  default:
    c = classify_status(o);
    break;
  }
  memset(&r, 0, sizeof r);
  r.cls = c;
  r.name = CLASSES[c].name;
  r.retryable = CLASSES[c].retryable;
  r.scope = (om_egress_scope_t)CLASSES[c].scope;
  r.health = CLASSES[c].health;
  r.is_timeout =
      c == OM_EGRESS_C_TIMEOUT || c == OM_EGRESS_C_FIRST_BYTE_TIMEOUT;
  if (c != OM_EGRESS_C_OK) {
    /* x-should-retry is the server's explicit word: it wins both ways. A
     * "false" on a class that was retryable stops this route only. */
    sr = should_retry(o->x_should_retry, o->x_should_retry_len);
    if (sr == 1) {
      r.retryable = 1;
      r.scope = OM_EGRESS_SCOPE_NONE;
    } else if (sr == 0 && r.retryable) {
      r.retryable = 0;
      r.scope = OM_EGRESS_SCOPE_ROUTE;
    }
    /* retry-after-ms is the more precise of the two; a malformed value is
     * absent and the next source is tried. */
    if (o->retry_after_ms != NULL &&
        om_retry_after_ms_parse(o->retry_after_ms, o->retry_after_ms_len,
                                UINT64_MAX, &ms) == 0) {
      r.has_server_wait = 1;
      r.server_wait_ms = ms;
    } else if (o->retry_after != NULL &&
               om_retry_after_parse(o->retry_after, o->retry_after_len, now_s,
                                    UINT64_MAX, &ms) == 0) {
      r.has_server_wait = 1;
      r.server_wait_ms = ms;
    }
  }
  *v = r;
  return 0;
}

void om_egress_limits_default(om_egress_limits_t *l) {
  l->max_attempts = 3;
  l->per_wait_ceiling_ns = 8000 * MS;
  l->backoff_base_ns = 500 * MS;
  l->backoff_cap_ns = 8000 * MS;
}

static uint64_t ms_to_ns(uint64_t ms) {
  return ms > UINT64_MAX / MS ? UINT64_MAX : ms * MS;
}

static void move_on(om_egress_step_t *st, int has_later, const char *why) {
  st->action = has_later ? OM_EGRESS_NEXT_ROUTE : OM_EGRESS_STOP;
  st->wait_ns = 0;
  st->why = why;
}

int om_egress_next(const om_egress_limits_t *lim, const om_egress_verdict_t *v,
                   uint32_t attempts_on_route, int has_later_route,
                   om_deadline_t deadline, uint64_t now_ns, om_rng_t *rng,
                   om_egress_step_t *out) {
  om_egress_step_t st;
  uint64_t remaining, wait;
  if (lim == NULL || v == NULL || rng == NULL || out == NULL ||
      lim->max_attempts == 0)
    return OM_EINVAL;
  memset(&st, 0, sizeof st);
  remaining = om_deadline_remaining(deadline, now_ns);
  if (!v->retryable) {
    if (v->scope == OM_EGRESS_SCOPE_REQUEST || v->cls == OM_EGRESS_C_OK) {
      st.action = OM_EGRESS_STOP;
      st.why = "terminal";
    } else {
      move_on(&st, has_later_route, "terminal");
    }
    /* Even a route-terminal failure cannot start another route once the
     * deadline is gone. */
    if (remaining == 0)
      st.action = OM_EGRESS_STOP;
  } else if (remaining == 0) {
    st.action = OM_EGRESS_STOP;
    st.why = "deadline";
  } else if (v->is_timeout && has_later_route) {
    move_on(&st, 1, "timeout_with_fallback");
  } else if (attempts_on_route >= lim->max_attempts) {
    move_on(&st, has_later_route, "attempts_exhausted");
  } else if (v->has_server_wait && ms_to_ns(v->server_wait_ms) > remaining) {
    /* The server will not be ready before the turn must end: waiting (even
     * the clamped wait) would spend the budget another route could use. */
    move_on(&st, has_later_route, "retry_after_beyond_deadline");
  } else {
    if (v->has_server_wait) {
      wait = ms_to_ns(v->server_wait_ms);
      st.why = "retry_after";
    } else {
      wait = om_backoff_ns(attempts_on_route, lim->backoff_base_ns,
                           lim->backoff_cap_ns, rng);
      st.why = "backoff";
    }
    if (wait > lim->per_wait_ceiling_ns)
      wait = lim->per_wait_ceiling_ns;
    if (wait >= remaining) {
      move_on(&st, has_later_route, "wait_beyond_deadline");
    } else {
      st.action = OM_EGRESS_RETRY_SAME;
      st.wait_ns = wait;
    }
  }
  *out = st;
  return 0;
}

void om_egress_cooldown_opts_default(om_egress_cooldown_opts_t *o) {
  o->failures = 3;
  o->base_ns = 2000 * MS;
  o->max_ns = 60000 * MS;
}

void om_egress_route_record(om_egress_route_state_t *st,
                            const om_egress_cooldown_opts_t *opts,
                            const om_egress_verdict_t *v, uint64_t now_ns) {
  om_egress_cooldown_opts_t d;
  uint64_t period;
  if (st == NULL || v == NULL)
    return;
  if (opts == NULL) {
    om_egress_cooldown_opts_default(&d);
    opts = &d;
  }
  if (v->cls == OM_EGRESS_C_OK) {
    memset(st, 0, sizeof *st);
    return;
  }
  if (!v->health || opts->failures == 0)
    return;
  if (++st->consecutive < opts->failures)
    return;
  st->consecutive = 0;
  period =
      om_backoff_ceiling_ns(st->cooldowns + 1, opts->base_ns, opts->max_ns);
  if (st->cooldowns < UINT32_MAX)
    st->cooldowns++;
  st->until_ns = period > UINT64_MAX - now_ns ? UINT64_MAX : now_ns + period;
}

int om_egress_route_available(const om_egress_route_state_t *st,
                              uint64_t now_ns) {
  return st == NULL || now_ns >= st->until_ns;
}
