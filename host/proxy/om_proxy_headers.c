/*
 * om_proxy_headers.c: what the proxy forwards, both ways. The rules live
 * here, in one place; om_proxy_call.c only calls them.
 *
 * Request (the caller's fields -> the upstream):
 *
 * - Connection (RFC 9110 7.6.1) is consumed here: every field it names is
 *   hop-by-hop for the caller's connection and removed from what the
 *   caller sent, and no Connection goes to om_upstream. What the proxy
 *   adds is never subject to the caller's Connection: a caller cannot
 *   strip Via, X-Forwarded-For, X-Request-Id, the deadline or the attempt
 *   by naming them, and a named Idempotency-Key is gone for the retry
 *   rules too (they read the forwarded set, c->idem_key).
 * - The other hop-by-hop fields (Keep-Alive, Proxy-Connection, TE,
 *   Transfer-Encoding, Upgrade, Trailer) are dropped by om_upstream, which
 *   also frames the body itself (Content-Length).
 * - Proxy-Authorization is consumed by the proxy it is addressed to
 *   (RFC 9110 11.7.2): removed.
 * - Expect: the proxy answers 100-continue itself when it asks for the
 *   body; the upstream gets the body without waiting.
 * - The traffic policy's decide(req) may set or remove the caller's other
 *   fields (docs/POLICIES.md "Per-request decisions"): a set field
 *   replaces every field of its name; the fields above and the proxy's own
 *   are refused by the decision's check (bindings/om_policy_check.c).
 * - X-Openmesh-Attempt and X-Openmesh-Deadline-Ms are the proxy's, set per
 *   attempt (start_attempt); a caller's are removed (its deadline header is
 *   read before, in om__proxy_on_request).
 * - X-Forwarded-For: the caller's values, then the caller's address, in
 *   one field (the de facto convention Envoy and nginx follow).
 * - Via: "1.1 openmesh" is added (RFC 9110 7.6.3: each intermediary adds
 *   itself); a caller's Via stays before it.
 * - X-Request-Id: the caller's kept, else 32 random hex digits.
 * - W3C Trace Context (https://www.w3.org/TR/trace-context/): a valid
 *   traceparent is passed through with its tracestate; an invalid one,
 *   or more than one, is dropped with tracestate (3.3: a tracestate
 *   without a parent it can trust is meaningless), and a missing one is
 *   created, so a trace joins across the proxy whether or not the caller
 *   started one.
 *
 * Response (the upstream's fields -> the caller):
 *
 * - Proxy-Authenticate applies to the next outbound client only (RFC 9110
 *   11.7.1): the proxy's caller did not choose the upstream's proxy, it
 *   cannot answer the challenge: removed.
 * - Content-Length of a 204 (RFC 9110 8.6: it has no body and may not say
 *   one); om_upstream already removed the hop-by-hop fields.
 * - X-Openmesh-Peer and X-Openmesh-Attempts of a chained proxy: ours
 *   replace them, the caller learns about this hop.
 */
#include <string.h>
#include <strings.h>

#include "om_http_chars.h"
#include "om_proxy_internal.h"

/* traceparent version 00: "00-" 32 hex "-" 16 hex "-" 2 hex */
#define TRACEPARENT_LEN 55

/* ------------------------------------------------------------------ */
/* small helpers */

static int name_is(const om_http_header_t *h, const char *lit, size_t len) {
  return h->name_len == len && memcmp(h->name, lit, len) == 0;
}

/*
 * Is the (lower-cased, NUL-terminated) field name[0, len) listed in a
 * Connection value v[0, vn)? The value is a #token list (RFC 9110 7.6.1,
 * 5.6.1: empty elements allowed); an element that is not a token names
 * nothing.
 */
static int named_in(const char *v, size_t vn, const char *name, size_t len) {
  size_t i = 0;
  while (i < vn) {
    size_t s, e;
    while (i < vn && (v[i] == ',' || om__http_is_ows((unsigned char)v[i])))
      i++;
    s = i;
    while (i < vn && v[i] != ',')
      i++;
    e = i;
    while (e > s && om__http_is_ows((unsigned char)v[e - 1]))
      e--;
    if (e - s == len && om__http_ci_eq(v + s, len, name))
      return 1;
  }
  return 0;
}

static int connection_names(const om_http_request_t *req, const char *name,
                            size_t len) {
  for (size_t i = 0; i < req->n_headers; i++) {
    const om_http_header_t *h = &req->headers[i];
    if (name_is(h, "connection", 10) &&
        named_in(h->value, h->value_len, name, len))
      return 1;
  }
  return 0;
}

/* lower-case hex digits only, n of them, not all '0' */
static int lower_hex_nonzero(const char *s, size_t n, int allow_zero) {
  int nonzero = 0;
  for (size_t i = 0; i < n; i++) {
    char ch = s[i];
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')))
      return 0;
    nonzero |= ch != '0';
  }
  return allow_zero || nonzero;
}

int om__proxy_traceparent_valid(const char *v, size_t len) {
  /* W3C Trace Context 3.2: version 00 is exactly 55 characters; a higher
   * version (not ff) is read as 00 for its first 55 and may go on only
   * after a '-' */
  if (v == NULL || len < TRACEPARENT_LEN)
    return 0;
  if (!lower_hex_nonzero(v, 2, 1) || (v[0] == 'f' && v[1] == 'f'))
    return 0;
  if (v[0] == '0' && v[1] == '0'
          ? len != TRACEPARENT_LEN
          : len > TRACEPARENT_LEN && v[TRACEPARENT_LEN] != '-')
    return 0;
  return v[2] == '-' && lower_hex_nonzero(v + 3, 32, 0) && v[35] == '-' &&
         lower_hex_nonzero(v + 36, 16, 0) && v[52] == '-' &&
         lower_hex_nonzero(v + 53, 2, 1);
}

static void hex_u64(char *out, uint64_t x, int digits) {
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < digits; i++)
    out[i] = hex[(x >> (4 * (digits - 1 - i))) & 15];
}

/* ------------------------------------------------------------------ */
/* the request */

/* The caller's fields the proxy never forwards (besides Connection's). */
static int dropped_request_field(const om_http_header_t *h) {
  switch (h->name_len) {
  case 6:
    return name_is(h, "expect", 6);
  case 10:
    return name_is(h, "connection", 10) || name_is(h, "tracestate", 10);
  case 11:
    return name_is(h, "traceparent", 11);
  case 15:
    return name_is(h, "x-forwarded-for", 15);
  case 18:
    return name_is(h, "x-openmesh-attempt", 18);
  case 19:
    return name_is(h, "proxy-authorization", 19);
  case 22:
    return name_is(h, "x-openmesh-deadline-ms", 22);
  default:
    return 0;
  }
}

/* Whether the decision edits the caller's field h (set or remove). */
static int edited(const om_policy_decision_t *dec, const om_http_header_t *h) {
  for (uint32_t i = 0; dec != NULL && i < dec->n_headers; i++)
    if (dec->headers[i].name_len == h->name_len &&
        strncasecmp(dec->bytes + dec->headers[i].name, h->name, h->name_len) ==
            0)
      return 1;
  return 0;
}

void om__proxy_headers_size(const om_http_request_t *req,
                            const om_policy_decision_t *dec, size_t *n_fields,
                            size_t *n_bytes) {
  size_t bytes = strlen(req->remote_ip) + 1;
  if (dec != NULL) /* the edits' names and values, copied */
    bytes += dec->n_bytes;
  for (size_t i = 0; i < req->n_headers; i++)
    if (name_is(&req->headers[i], "x-forwarded-for", 15))
      bytes += req->headers[i].value_len + 2;
  /* ours: via, x-request-id, x-forwarded-for, traceparent, attempt,
   * deadline, grpc-timeout */
  *n_fields = req->n_headers + 7 + (dec != NULL ? dec->n_headers : 0);
  *n_bytes = bytes + TRACEPARENT_LEN + 1;
}

void om__proxy_headers_build(om__proxy_call_t *c, const om_http_request_t *req,
                             const om_policy_decision_t *dec, char *buf) {
  om_proxy_t *p = c->p;
  const om_http_header_t *tp = NULL, *rid = NULL;
  char *xff = buf, *trace, *edits;
  size_t xk = 0, n_tp = 0;
  int has_conn = 0;
  for (size_t i = 0; i < req->n_headers; i++) {
    const om_http_header_t *h = &req->headers[i];
    if (name_is(h, "connection", 10))
      has_conn = 1;
  }
  c->n_fwd_fixed = 0;
  c->idem_key = NULL;
  c->idem_len = 0;
  /* the caller's fields, minus the hop-by-hop ones and ours */
  for (size_t i = 0; i < req->n_headers; i++) {
    const om_http_header_t *h = &req->headers[i];
    if (has_conn && connection_names(req, h->name, h->name_len))
      continue;
    if (name_is(h, "traceparent", 11)) {
      tp = h;
      n_tp++;
    }
    if (name_is(h, "x-forwarded-for", 15)) {
      memcpy(xff + xk, h->value, h->value_len);
      xk += h->value_len;
      memcpy(xff + xk, ", ", 2);
      xk += 2;
    }
    if (dropped_request_field(h) || edited(dec, h))
      continue;
    if (c->grpc && name_is(h, "grpc-timeout", 12))
      continue; /* the attempt sends what is left (start_attempt) */
    if (rid == NULL && name_is(h, "x-request-id", 12))
      rid = h;
    if (c->idem_key == NULL && name_is(h, "idempotency-key", 15)) {
      c->idem_key = h->value;
      c->idem_len = h->value_len;
    }
    c->fwd[c->n_fwd_fixed++] = *h;
  }
  memcpy(xff + xk, req->remote_ip, strlen(req->remote_ip) + 1);
  trace = xff + xk + strlen(req->remote_ip) + 1;
  edits = trace + TRACEPARENT_LEN + 1;
  /* the policy's fields, in the place of the caller's of those names */
  if (dec != NULL) {
    memcpy(edits, dec->bytes, dec->n_bytes);
    for (uint32_t i = 0; i < dec->n_headers; i++) {
      const om_policy_header_edit_t *e = &dec->headers[i];
      if (e->value_len != OM_DECIDE_REMOVE)
        c->fwd[c->n_fwd_fixed++] = (om_http_header_t){
            edits + e->name, edits + e->value, e->name_len, e->value_len};
    }
  }
  if (xff[0] != '\0')
    c->fwd[c->n_fwd_fixed++] =
        (om_http_header_t){"x-forwarded-for", xff, 15, strlen(xff)};
  c->fwd[c->n_fwd_fixed++] = (om_http_header_t){"via", "1.1 openmesh", 3, 12};
  if (rid == NULL) {
    uint64_t a = om_rng_next(&p->rng), b = om_rng_next(&p->rng);
    hex_u64(c->request_id, a, 16);
    hex_u64(c->request_id + 16, b, 16);
    c->request_id[32] = '\0';
    c->fwd[c->n_fwd_fixed++] =
        (om_http_header_t){"x-request-id", c->request_id, 12, 32};
  }
  if (n_tp == 1 && om__proxy_traceparent_valid(tp->value, tp->value_len)) {
    /* passed through as it came, and its tracestate with it, in order */
    c->fwd[c->n_fwd_fixed++] = *tp;
    for (size_t i = 0; i < req->n_headers; i++) {
      const om_http_header_t *h = &req->headers[i];
      if (name_is(h, "tracestate", 10) &&
          !(has_conn && connection_names(req, h->name, h->name_len)))
        c->fwd[c->n_fwd_fixed++] = *h;
    }
  } else {
    /* a new trace: random trace-id and parent-id (never all zero: a zero
     * word is replaced), sampled (01) as Envoy's default random_sampling
     * of 100% does, so that a parent-based sampler downstream (the
     * OpenTelemetry SDK default) records what it would have recorded as
     * a root without the proxy */
    uint64_t hi = om_rng_next(&p->rng), lo = om_rng_next(&p->rng),
             span = om_rng_next(&p->rng);
    if (hi == 0 && lo == 0)
      lo = 1;
    if (span == 0)
      span = 1;
    memcpy(trace, "00-", 3);
    hex_u64(trace + 3, hi, 16);
    hex_u64(trace + 19, lo, 16);
    trace[35] = '-';
    hex_u64(trace + 36, span, 16);
    memcpy(trace + 52, "-01", 3);
    trace[TRACEPARENT_LEN] = '\0';
    c->fwd[c->n_fwd_fixed++] =
        (om_http_header_t){"traceparent", trace, 11, TRACEPARENT_LEN};
  }
}

/* ------------------------------------------------------------------ */
/* the response */

int om__proxy_response_field_dropped(const om_http_header_t *f, int status) {
  switch (f->name_len) {
  case 14:
    return status == 204 &&
           om__http_ci_eq(f->name, f->name_len, "content-length");
  case 15:
    return om__http_ci_eq(f->name, f->name_len, "x-openmesh-peer");
  case 18:
    return om__http_ci_eq(f->name, f->name_len, "proxy-authenticate");
  case 19:
    return om__http_ci_eq(f->name, f->name_len, "x-openmesh-attempts");
  default:
    return 0;
  }
}
