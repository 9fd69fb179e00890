/*
 * om_egress_rules.h: Layer A of the egress gateway, pure: what one model-call
 * attempt's outcome means (classification), what to do next (retry the same
 * route after a wait, move to the next route now, or stop), and per-route
 * cooldown (docs/EGRESS.md).
 *
 * The host parses the provider's response (status, a few headers, the
 * error type/code of the body, the shape of the completion) into an
 * om_egress_outcome_t; everything that decides lives here, so every rule of
 * the gateway is a deterministic unit test: the time is an argument (now_ns,
 * and now_s for Retry-After HTTP-dates) and randomness comes from the
 * caller's om_rng_t.
 *
 * The rules, in the order om_egress_classify applies them:
 * - transport: reset and refused are retryable; an attempt timeout and a
 *   first-byte timeout are retryable and are "timeouts" for the deadline
 *   rule (see om_egress_next).
 * - 2xx: an empty completion (no choices, completion_tokens = 0, null or
 *   empty content with no tool call) is retryable; a tool call whose
 *   arguments are still invalid JSON after the engine's one in-attempt
 *   repair is retryable; finish_reason = length with no content is
 *   terminal for this request on this route.
 * - 5xx (529 "overloaded" included), 408, 409 are retryable.
 * - 429 is retryable (rate limited) unless the body says the quota or a
 *   spend limit is exhausted (insufficient_quota, billing_*, *spend_limit*,
 *   *quota*), which is terminal for the route: waiting will not help.
 * - context length exceeded (OpenAI code context_length_exceeded, Anthropic
 *   "prompt is too long": the host sets context_overflow) is terminal for
 *   the route; a larger-context route may still serve the request.
 * - 400 and 422 (validation) are terminal for the request: every route
 *   would refuse the same body. 401 and 403 are terminal for the route (its
 *   key). Other statuses are terminal for the route.
 * - `x-should-retry: true|false` (OpenAI/Anthropic SDK convention), when
 *   present, overrides retryable for any failure.
 * - The server's wait: `retry-after-ms` first, then `Retry-After` (RFC 9110
 *   section 10.2.3, seconds or HTTP-date); malformed values are absent.
 */
#ifndef OM_EGRESS_RULES_H
#define OM_EGRESS_RULES_H

#include <stddef.h>
#include <stdint.h>

#include "om_deadline.h"
#include "om_rng.h"

/* Transport failures, when no status arrived. */
typedef enum {
  OM_EGRESS_T_NONE = 0,
  OM_EGRESS_T_RESET,              /* reset / closed early / broken stream */
  OM_EGRESS_T_REFUSED,            /* connect failed */
  OM_EGRESS_T_ATTEMPT_TIMEOUT,    /* the whole attempt ran out of time */
  OM_EGRESS_T_FIRST_BYTE_TIMEOUT, /* no response byte within the limit */
} om_egress_transport_t;

/* Where a terminal failure stops: this route (the next may serve the
 * request) or the whole request (every route would refuse it). */
typedef enum {
  OM_EGRESS_SCOPE_NONE = 0, /* retryable or ok */
  OM_EGRESS_SCOPE_ROUTE = 1,
  OM_EGRESS_SCOPE_REQUEST = 2,
} om_egress_scope_t;

/*
 * XX(enum, "stable name", retryable, scope, counts against route health)
 * The names are stable: they appear in /v1/turns answers, the errors file,
 * metrics labels and the fallback policy's ctx.failed[i].class.
 */
#define OM_EGRESS_CLASS_MAP(XX)                                                \
  XX(OK, "ok", 0, NONE, 0)                                                     \
  XX(SERVER_ERROR, "server_error", 1, NONE, 1)                                 \
  XX(OVERLOADED, "overloaded", 1, NONE, 1)                                     \
  XX(REQUEST_TIMEOUT, "request_timeout", 1, NONE, 1)                           \
  XX(CONFLICT, "conflict", 1, NONE, 0)                                         \
  XX(RATE_LIMITED, "rate_limited", 1, NONE, 1)                                 \
  XX(CONNECTION_RESET, "connection_reset", 1, NONE, 1)                         \
  XX(CONNECTION_REFUSED, "connection_refused", 1, NONE, 1)                     \
  XX(TIMEOUT, "timeout", 1, NONE, 1)                                           \
  XX(FIRST_BYTE_TIMEOUT, "first_byte_timeout", 1, NONE, 1)                     \
  XX(EMPTY_COMPLETION, "empty_completion", 1, NONE, 1)                         \
  XX(TOOL_JSON_INVALID, "tool_json_invalid", 1, NONE, 0)                       \
  XX(BAD_REQUEST, "bad_request", 0, REQUEST, 0)                                \
  XX(AUTH, "auth", 0, ROUTE, 1)                                                \
  XX(QUOTA_EXHAUSTED, "quota_exhausted", 0, ROUTE, 1)                          \
  XX(CONTEXT_LENGTH, "context_length", 0, ROUTE, 0)                            \
  XX(LENGTH_NO_CONTENT, "length_no_content", 0, ROUTE, 0)                      \
  XX(NOT_FOUND, "not_found", 0, ROUTE, 1)                                      \
  XX(CLIENT_ERROR, "client_error", 0, ROUTE, 0)                                \
  XX(UNEXPECTED_STATUS, "unexpected_status", 0, ROUTE, 1)

typedef enum {
#define OM__EGRESS_CLASS_ENUM(e, name, r, scope, health) OM_EGRESS_C_##e,
  OM_EGRESS_CLASS_MAP(OM__EGRESS_CLASS_ENUM)
#undef OM__EGRESS_CLASS_ENUM
      OM_EGRESS_C__COUNT
} om_egress_class_t;

/* The stable name of a class ("rate_limited"); "unknown" out of range.
 * Static; never NULL. */
const char *om_egress_class_name(om_egress_class_t c);

/* What the host saw of one attempt. Strings are views (not retained); a
 * NULL string is "absent". */
typedef struct om_egress_outcome_s {
  int status;                      /* HTTP status; 0 with transport set */
  om_egress_transport_t transport; /* OM_EGRESS_T_NONE with a status */
  const char *retry_after_ms;      /* header values, OWS allowed */
  size_t retry_after_ms_len;
  const char *retry_after;
  size_t retry_after_len;
  const char *x_should_retry;
  size_t x_should_retry_len;
  const char *error_type; /* body: error.type (NUL-terminated) */
  const char *error_code; /* body: error.code (NUL-terminated) */
  int context_overflow;   /* body says the prompt exceeds the context */
  int empty_completion;   /* 2xx with nothing in it */
  int length_no_content;  /* 2xx, finish_reason=length, no content */
  int tool_json_invalid;  /* 2xx, tool arguments invalid after repair */
} om_egress_outcome_t;

/* What an outcome means. */
typedef struct om_egress_verdict_s {
  om_egress_class_t cls;
  const char *name;        /* om_egress_class_name(cls) */
  int retryable;           /* after x-should-retry */
  om_egress_scope_t scope; /* for a failure that is not retryable */
  int health;              /* counts against the route (cooldown) */
  int is_timeout;      /* attempt or first-byte timeout: the deadline rule */
  int has_server_wait; /* the server asked for a wait */
  uint64_t server_wait_ms; /* as asked (saturated, NOT clamped) */
} om_egress_verdict_t;

/*
 * om_egress_classify: the verdict for one outcome, at wall-clock now_s (only
 * for an HTTP-date Retry-After). Exactly one of status (100-599) and
 * transport must be set. Returns 0 and fills *v; OM_EINVAL (v untouched)
 * for NULL arguments or an outcome with both or neither set.
 */
int om_egress_classify(const om_egress_outcome_t *o, int64_t now_s,
                       om_egress_verdict_t *v);

/* The bounds of one turn's recovery. */
typedef struct om_egress_limits_s {
  uint32_t max_attempts;        /* per route; >= 1; default 3 */
  uint64_t per_wait_ceiling_ns; /* no single wait is longer; default 8 s */
  uint64_t backoff_base_ns;     /* full jitter base; default 500 ms */
  uint64_t backoff_cap_ns;      /* full jitter cap; default 8 s */
} om_egress_limits_t;

/* Fill *l with the defaults above. */
void om_egress_limits_default(om_egress_limits_t *l);

typedef enum {
  OM_EGRESS_RETRY_SAME = 1, /* wait wait_ns, then the same route again */
  OM_EGRESS_NEXT_ROUTE = 2, /* the next route, now */
  OM_EGRESS_STOP = 3,       /* recovery is over: an EgressError */
} om_egress_action_t;

/* Why a step was chosen; stable names for logs. */
typedef struct om_egress_step_s {
  om_egress_action_t action;
  uint64_t wait_ns; /* RETRY_SAME only; <= per_wait_ceiling_ns */
  const char *why;  /* "backoff", "retry_after", "timeout_with_fallback",
                       "attempts_exhausted", "terminal", "deadline",
                       "retry_after_beyond_deadline", "wait_beyond_deadline" */
} om_egress_step_t;

/*
 * om_egress_next: the shipped deadline policy, exactly:
 * - not retryable: scope REQUEST stops; scope ROUTE moves to the next route
 *   (stops when there is none);
 * - the deadline has passed: stop, whatever attempts remain;
 * - a timeout with a later route: the route is abandoned at once (no wait);
 *   on the last (or only) route a timeout is retried like any other
 *   retryable failure;
 * - attempts_on_route (attempts made on this route, >= 1) reached
 *   max_attempts: next route (or stop);
 * - a server wait longer than the remaining deadline: next route at once
 *   (or stop on the last route);
 * - otherwise wait min(server wait, ceiling), or backoff with full jitter
 *   (attempt = attempts_on_route) clamped to the ceiling, then retry the
 *   same route; a wait that does not fit the remaining deadline moves on
 *   (or stops).
 * Draws from rng only for a backoff. Returns 0 and fills *out; OM_EINVAL for
 * NULL arguments or max_attempts 0 (out untouched).
 */
int om_egress_next(const om_egress_limits_t *lim, const om_egress_verdict_t *v,
                   uint32_t attempts_on_route, int has_later_route,
                   om_deadline_t deadline, uint64_t now_ns, om_rng_t *rng,
                   om_egress_step_t *out);

/*
 * Route cooldown: a route whose attempts keep failing is skipped for a
 * short, growing period, so one outage does not cost every turn its first
 * attempt. A plain value per route (embed it, zero it to start).
 */
typedef struct om_egress_cooldown_opts_s {
  uint32_t failures; /* consecutive health failures to cool down; 3 */
  uint64_t base_ns;  /* first period; 2 s */
  uint64_t max_ns;   /* cap of base x 2^(n-1); 60 s */
} om_egress_cooldown_opts_t;

typedef struct om_egress_route_state_s {
  uint32_t consecutive; /* health failures since the last success */
  uint32_t cooldowns;   /* periods since the last success (growth) */
  uint64_t until_ns;    /* skipped while now < until_ns */
} om_egress_route_state_t;

void om_egress_cooldown_opts_default(om_egress_cooldown_opts_t *o);

/*
 * om_egress_route_record: record one attempt's verdict on the route at
 * now_ns. A success resets everything (a route that answers is trusted
 * again at once); a failure that counts against health (v->health) adds
 * one, and at opts->failures consecutive ones the route cools down for
 * min(max, base x 2^cooldowns) and the count restarts. Other failures (the
 * request's own fault) change nothing. NULL opts: defaults.
 */
void om_egress_route_record(om_egress_route_state_t *st,
                            const om_egress_cooldown_opts_t *opts,
                            const om_egress_verdict_t *v, uint64_t now_ns);

/* Whether the route may be tried at now_ns (not cooling down). */
int om_egress_route_available(const om_egress_route_state_t *st,
                              uint64_t now_ns);

#endif /* OM_EGRESS_RULES_H */
