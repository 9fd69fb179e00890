/*
 * om_connector_webhook.c: the "webhook" connector kind: POST each part as
 * JSON to a URL (see om_connector.h for what is retried and why).
 */
#include "om_connector.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "om_curl_uv.h"
#include "om_errno.h"

#define RESP_MAX ((size_t)64 << 10) /* a receiver's answer is not read */

typedef struct {
  om_connector_t *c;
  om_curl_uv_t *cu;
  char *url;
  uint64_t timeout_ms;
  om_curl_request_t *req; /* the part in flight, or NULL */
  void (*done)(om_connector_t *c);
} webhook_t;

/* http:// or https://, a host, no whitespace or control characters, and a
 * URL libcurl itself parses (RFC 3986 as libcurl reads it). */
static int check_url(const char *url, char *err, size_t errlen) {
  const char *rest;
  CURLU *h;
  CURLUcode uc;
  if (strncmp(url, "http://", 7) == 0)
    rest = url + 7;
  else if (strncmp(url, "https://", 8) == 0)
    rest = url + 8;
  else {
    snprintf(err, errlen, "target: '%.200s' is not an http:// or https:// URL",
             url);
    return OM_EINVAL;
  }
  if (*rest == '\0' || *rest == '/' || *rest == '?' || *rest == '#') {
    snprintf(err, errlen, "target: '%.200s' has no host", url);
    return OM_EINVAL;
  }
  for (const char *p = url; *p; p++)
    if ((unsigned char)*p <= 0x20 || (unsigned char)*p == 0x7F) {
      snprintf(err, errlen,
               "target: URL contains whitespace or a control character");
      return OM_EINVAL;
    }
  if (strlen(url) > 8192) {
    snprintf(err, errlen, "target: URL longer than 8192 bytes");
    return OM_EINVAL;
  }
  h = curl_url();
  if (h == NULL) {
    snprintf(err, errlen, "out of memory");
    return OM_ENOMEM;
  }
  uc = curl_url_set(h, CURLUPART_URL, url, 0);
  curl_url_cleanup(h);
  if (uc != CURLUE_OK) {
    snprintf(err, errlen, "target: '%.200s': %s", url, curl_url_strerror(uc));
    return OM_EINVAL;
  }
  return 0;
}

static int wh_open(om_connector_t *c, uv_loop_t *loop,
                   const om_connector_opts_t *opts, void **state, char *err,
                   size_t errlen) {
  char msg[300] = "";
  webhook_t *w;
  int rc = check_url(opts->target, msg, sizeof msg);
  if (rc != 0) {
    if (err != NULL && errlen > 0)
      snprintf(err, errlen, "%s", msg);
    return rc;
  }
  w = calloc(1, sizeof *w);
  if (w == NULL || (w->url = strdup(opts->target)) == NULL ||
      om_curl_uv_new(loop, &w->cu) != 0) {
    if (w != NULL)
      free(w->url);
    free(w);
    if (err != NULL && errlen > 0)
      snprintf(err, errlen, "out of memory");
    return OM_ENOMEM;
  }
  w->c = c;
  w->timeout_ms =
      opts->timeout_ms ? opts->timeout_ms : OM_CONNECTOR_DEFAULT_TIMEOUT_MS;
  *state = w;
  return 0;
}

static void on_response(void *ud, om_curl_resp_t *resp) {
  webhook_t *w = ud;
  om_connector_outcome_t outcome;
  char why[160];
  w->req = NULL;
  if (resp->result == CURLE_OK) {
    long st = resp->status;
    snprintf(why, sizeof why, "status %ld", st);
    if (st >= 200 && st <= 299)
      outcome = OM_CONNECTOR_OK;
    else if (st == 502 || st == 503 || st == 504)
      outcome = OM_CONNECTOR_RETRY; /* not processed: safe to send again */
    else
      outcome = OM_CONNECTOR_FAIL;
  } else {
    snprintf(why, sizeof why, "%s", curl_easy_strerror(resp->result));
    switch (resp->result) {
    case CURLE_OPERATION_TIMEDOUT:
      outcome = OM_CONNECTOR_TIMEOUT;
      break;
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
      outcome = OM_CONNECTOR_RETRY;
      break;
    default:
      outcome = OM_CONNECTOR_FAIL;
    }
  }
  om__connector_sent(w->c, outcome, why); /* may close: w stays valid */
}

static int wh_send(void *state, om_connector_t *c, const char *json,
                   size_t len) {
  webhook_t *w = state;
  char key[96];
  const char *headers[3];
  om_curl_req_t req;
  snprintf(key, sizeof key, "Idempotency-Key: %s", om__connector_part_key(c));
  headers[0] = "Content-Type: application/json";
  headers[1] = key;
  headers[2] = "Expect:"; /* no 100-continue round trip */
  memset(&req, 0, sizeof req);
  req.method = "POST";
  req.url = w->url;
  req.headers = headers;
  req.n_headers = 3;
  req.body = json;
  req.body_len = len;
  req.timeout_ms = w->timeout_ms;
  req.max_body = RESP_MAX;
  return om_curl_uv_request(w->cu, &req, on_response, w, &w->req);
}

static void wh_closed(void *ud) {
  webhook_t *w = ud;
  om_connector_t *c = w->c;
  void (*done)(om_connector_t *) = w->done;
  free(w->url);
  free(w);
  done(c);
}

static void wh_close(void *state, om_connector_t *c,
                     void (*done)(om_connector_t *c)) {
  webhook_t *w = state;
  (void)c;
  w->done = done;
  w->req = NULL; /* closing the glue frees it without its callback */
  if (om_curl_uv_close(w->cu, wh_closed, w) != 0) {
    /* Only from inside a libcurl callback, which never calls us. */
    free(w->url);
    free(w);
    done(c);
  }
}

const om_connector_kind_t om__connector_webhook = {
    .name = "webhook",
    .default_part_limit = 4000,
    .open = wh_open,
    .send = wh_send,
    .close = wh_close,
};
