/*
 * om_proxy_respond.c: the answers the proxy makes itself, for a refusal
 * or a failure (the outcome's row of OM__PROXY_OUTCOME_MAP): a JSON body
 * {"reason", "message"}, or to a gRPC caller a Trailers-Only answer
 * (docs/PROXY.md "gRPC").
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "om_errno.h"
#include "om_log.h"
#include "om_proxy_internal.h"

/* A JSON string body for msg (escaped; non-ASCII bytes become '?', as a
 * message may quote bytes that are not UTF-8). */
static size_t json_escape(char *out, size_t cap, const char *msg) {
  size_t k = 0;
  for (const unsigned char *m = (const unsigned char *)msg; *m && k + 7 < cap;
       m++) {
    if (*m == '"' || *m == '\\') {
      out[k++] = '\\';
      out[k++] = (char)*m;
    } else if (*m < 0x20) {
      k += (size_t)snprintf(out + k, cap - k, "\\u%04x", *m);
    } else {
      out[k++] = *m < 0x80 ? (char)*m : '?';
    }
  }
  out[k] = '\0';
  return k;
}

/* A gRPC caller: content-type application/grpc, alone or with a suffix
 * ("+proto", ";charset") as the gRPC HTTP/2 protocol spells it. */
/* gRPC status codes by name (grpc/doc/statuscodes.md), index = code. */
static const char *const GRPC_CODES[] = {"OK",
                                         "CANCELLED",
                                         "UNKNOWN",
                                         "INVALID_ARGUMENT",
                                         "DEADLINE_EXCEEDED",
                                         "NOT_FOUND",
                                         "ALREADY_EXISTS",
                                         "PERMISSION_DENIED",
                                         "RESOURCE_EXHAUSTED",
                                         "FAILED_PRECONDITION",
                                         "ABORTED",
                                         "OUT_OF_RANGE",
                                         "UNIMPLEMENTED",
                                         "INTERNAL",
                                         "UNAVAILABLE",
                                         "DATA_LOSS",
                                         "UNAUTHENTICATED"};

int om__proxy_grpc_code(const char *name) {
  for (size_t i = 0; i < sizeof GRPC_CODES / sizeof GRPC_CODES[0]; i++)
    if (strcmp(GRPC_CODES[i], name) == 0)
      return (int)i;
  return -1;
}

int om__proxy_is_grpc(const om_http_request_t *req) {
  size_t len = 0;
  const char *v = om_http_request_header(req, "content-type", &len);
  return v != NULL && len >= 16 &&
         strncasecmp(v, "application/grpc", 16) == 0 &&
         (len == 16 || v[16] == '+' || v[16] == ';');
}

/* grpc-message: percent-encoded, every byte outside 0x20..0x7E and '%'
 * (the gRPC HTTP/2 protocol), cut to fit. */
static void grpc_message(char *out, size_t cap, const char *msg) {
  static const char hex[] = "0123456789ABCDEF";
  size_t k = 0;
  for (const unsigned char *m = (const unsigned char *)msg; *m && k + 4 < cap;
       m++) {
    if (*m < 0x20 || *m > 0x7e || *m == '%') {
      out[k++] = '%';
      out[k++] = hex[*m >> 4];
      out[k++] = hex[*m & 15];
    } else {
      out[k++] = (char)*m;
    }
  }
  out[k] = '\0';
}

/*
 * The proxy's own refusal to a gRPC caller: Trailers-Only (HTTP 200, one
 * HEADERS frame with END_STREAM over HTTP/2: no body), grpc-status from
 * the outcome's row, the message in grpc-message, the reason in
 * x-openmesh-reason. Releases req.
 */
static void respond_grpc(om_http_request_t *req, om__proxy_outcome_t o,
                         const char *message, const char *request_id) {
  char code[8], gm[1024];
  om_http_header_t h[5];
  size_t n = 0;
  snprintf(code, sizeof code, "%d", om__proxy_outcome_grpc(o));
  grpc_message(gm, sizeof gm, message);
  h[n++] = (om_http_header_t){"content-type", "application/grpc", 12, 16};
  h[n++] = (om_http_header_t){"grpc-status", code, 11, 0};
  h[n++] = (om_http_header_t){"grpc-message", gm, 12, 0};
  h[n++] =
      (om_http_header_t){"x-openmesh-reason", om__proxy_outcome_name(o), 17, 0};
  if (request_id != NULL && request_id[0] != '\0')
    h[n++] = (om_http_header_t){"x-request-id", request_id, 12, 0};
  if (om_http_respond(req, 200, h, n, NULL, 0) == OM_EINVAL)
    om_http_response_abort(req); /* not reached: the headers are ours */
}

void om__proxy_respond_error(om_http_request_t *req, om__proxy_outcome_t o,
                             const char *message, unsigned attempts,
                             const char *request_id) {
  char body[1024], esc[768], att[16];
  om_http_header_t h[3];
  size_t n = 0;
  int len;
  if (om__proxy_outcome_grpc(o) != 0 && om__proxy_is_grpc(req)) {
    respond_grpc(req, o, message, request_id);
    return;
  }
  json_escape(esc, sizeof esc, message);
  len = snprintf(body, sizeof body, "{\"reason\":\"%s\",\"message\":\"%s\"}\n",
                 om__proxy_outcome_reason(o), esc);
  h[n++] = (om_http_header_t){"content-type", "application/json", 12, 16};
  if (attempts > 0) {
    snprintf(att, sizeof att, "%u", attempts);
    h[n++] = (om_http_header_t){"x-openmesh-attempts", att, 19, 0};
  }
  if (request_id != NULL && request_id[0] != '\0')
    h[n++] = (om_http_header_t){"x-request-id", request_id, 12, 0};
  if (om_http_respond(req, om__proxy_outcome_status(o), h, n, body,
                      (size_t)len) == OM_EINVAL)
    om_http_response_abort(req); /* not reached: the headers are ours */
}

/*
 * The policy's authorize refused the call: 403 forbidden with its reason,
 * before admission and without reaching a peer. The caller's
 * X-Request-Id is echoed, else a fresh one (as the upstream would have
 * got) names the refusal. Logged as proxy_denied with the caller's
 * identity, at most once a second per service (a refused caller that
 * retries in a loop must not flood the log; the metric counts each).
 */
void om__proxy_deny(om__proxy_service_t *s, om_http_request_t *req,
                    const char *reason, const om_policy_identity_t *who,
                    const char *id, uint64_t now) {
  const char *caller = "";
  uint64_t held;
  s->denied++;
  om_metric_inc(s->m_denied);
  om_metric_inc(s->outcomes[OM__PROXY_FORBIDDEN]);
  if (who != NULL) { /* the SPIFFE ID when there is one, else the subject */
    caller = who->subject != NULL ? who->subject : "";
    for (size_t i = 0; i < who->n_uris; i++)
      if (strncmp(who->uris[i], "spiffe://", 9) == 0) {
        caller = who->uris[i];
        break;
      }
  }
  if (om__proxy_log_limit(&s->deny_log, now, &held)) {
    char sup[24];
    snprintf(sup, sizeof sup, "%llu", (unsigned long long)held);
    om_log(OM_LOG_INFO, "proxy_denied", "service", s->name, "request_id", id,
           "caller", caller, "reason", reason, "suppressed", sup, NULL);
  }
  om__proxy_refused(s->proxy, s, req, OM__PROXY_FORBIDDEN);
  om__proxy_respond_error(
      req, OM__PROXY_FORBIDDEN,
      reason[0] != '\0' ? reason : "the traffic policy refused the call", 0,
      id);
}

/* 413 at the head: the Content-Length passes max (the service's, or
 * the lower one of the policy's decision). */
void om__proxy_refuse_body(om__proxy_service_t *s, om_http_request_t *req,
                           uint64_t max, const char *id) {
  char msg[128];
  snprintf(msg, sizeof msg,
           "the request body (Content-Length) passes max_body_bytes (%llu)",
           (unsigned long long)max);
  om_metric_inc(s->outcomes[OM__PROXY_BODY_TOO_LARGE]);
  om__proxy_refused(s->proxy, s, req, OM__PROXY_BODY_TOO_LARGE);
  om__proxy_respond_error(req, OM__PROXY_BODY_TOO_LARGE, msg, 0, id);
}
