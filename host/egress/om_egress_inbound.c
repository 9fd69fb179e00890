/*
 * om_egress_inbound.c: what the inbound APIs (/v1/messages,
 * /v1/responses; docs/EGRESS.md "Inbound APIs") share before their own
 * translation: reading the body into the internal chat form and the
 * rules of a refusal (400 naming the field).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "om_egress_inbound.h"
#include "om_egress_server.h"
#include "om_errno.h"

int eg_in_refuse(eg_in_err_t *e, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->why, e->cap, fmt, ap);
  va_end(ap);
  return OM_EINVAL;
}

int eg_in_only_keys(json_t *obj, const char *const *allowed, const char *where,
                    eg_in_err_t *e) {
  const char *k;
  json_t *v;
  json_object_foreach(obj, k, v) {
    size_t i;
    for (i = 0; allowed[i] != NULL; i++)
      if (strcmp(k, allowed[i]) == 0)
        break;
    if (allowed[i] == NULL)
      return eg_in_refuse(e, "field '%s%s%s': not supported by this gateway",
                          where, *where ? "." : "", k);
  }
  return 0;
}

int eg_inbound_chat(om_egress_t *g, om_http_request_t *req, eg_api_t api,
                    int (*to_chat)(json_t *, json_t **, char *, size_t),
                    json_t **body, json_t **chat) {
  const char *why = NULL;
  char refused[256];
  int rc;
  *chat = NULL;
  *body = eg_parse_body(req, &why);
  if (*body == NULL) {
    om_metric_inc(g->srv->m_refused[api]);
    eg_respond_api_error(req, api, 400, "invalid_request", why, 0, NULL);
    return -1;
  }
  rc = to_chat(*body, chat, refused, sizeof refused);
  if (rc != 0) {
    json_decref(*body);
    *body = NULL;
    if (rc == OM_EINVAL)
      om_metric_inc(g->srv->m_refused[api]);
    eg_respond_api_error(req, api, rc == OM_EINVAL ? 400 : 503,
                         rc == OM_EINVAL ? "invalid_request" : "overloaded",
                         rc == OM_EINVAL ? refused : "out of memory", 0, NULL);
    return -1;
  }
  return 0;
}
