/*
 * test_control.c: the control plane server (om_control.h) in process: a
 * memory store with a fake lease clock and the server on a loop in this
 * thread, driven by raw loopback sockets (tests/support/http_test_client.h)
 * and read back by an independent chunked decoder feeding the SSE parser.
 * Each test owns its loop and closes it fully (uv_loop_close must succeed).
 */
#include "om_test.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "http_test_client.h"
#include "om_auth.h"
#include "om_control.h"
#include "om_errno.h"
#include "om_snapshot_json.h"
#include "om_sse.h"
#include "om_store_memory.h"

/* ------------------------------------------------------------------ */
/* fixture */

#define MAX_SSE 8

typedef struct sse_s sse_t;

typedef struct fx_s {
  uv_loop_t loop;
  om_store_t *store;
  om_control_t *ctl;
  int port;
  int closed, store_closed;
  uint64_t fake_ms;
  sse_t *sse[MAX_SSE];
} fx_t;

static uint64_t fake_now(void *ud) {
  return ((fx_t *)ud)->fake_ms;
}

static void on_closed(void *ud) {
  ((fx_t *)ud)->closed = 1;
}

static void on_store_closed(void *ud) {
  ((fx_t *)ud)->store_closed = 1;
}

/* o: control options (store and auth filled in here); may be NULL. */
static fx_t *fx_new_auth(const om_control_opts_t *o, om_auth_t *auth) {
  fx_t *fx = calloc(1, sizeof *fx);
  om_store_memory_opts_t so;
  om_control_opts_t co;
  assert_non_null(fx);
  assert_int_equal(uv_loop_init(&fx->loop), 0);
  memset(&so, 0, sizeof so);
  so.now_ms = fake_now;
  so.clock_ud = fx;
  fx->fake_ms = 1000000;
  assert_int_equal(om_store_memory_new(&fx->loop, &so, &fx->store), 0);
  if (o != NULL)
    co = *o;
  else
    memset(&co, 0, sizeof co);
  co.store = fx->store;
  co.auth = auth;
  assert_int_equal(om_control_new(&fx->loop, &co, &fx->ctl), 0);
  assert_int_equal(om_control_listen(fx->ctl, "127.0.0.1", 0), 0);
  fx->port = om_control_port(fx->ctl);
  assert_true(fx->port > 0);
  return fx;
}

static fx_t *fx_new(const om_control_opts_t *o) {
  return fx_new_auth(o, NULL);
}

static void sse_free(sse_t *s);

static void fx_close_control(fx_t *fx) {
  uint64_t t0 = htc_now_ms();
  if (fx->ctl == NULL)
    return;
  assert_int_equal(om_control_close(fx->ctl, on_closed, fx), 0);
  while (!fx->closed && htc_now_ms() - t0 < 10000)
    htc_step(&fx->loop, NULL, 1);
  assert_true(fx->closed);
  fx->ctl = NULL;
}

static void fx_free(fx_t *fx) {
  for (int i = 0; i < MAX_SSE; i++)
    if (fx->sse[i] != NULL)
      sse_free(fx->sse[i]);
  fx_close_control(fx);
  om_store_close(fx->store, on_store_closed, fx);
  uv_run(&fx->loop, UV_RUN_DEFAULT);
  assert_true(fx->store_closed);
  assert_int_equal(uv_loop_close(&fx->loop), 0);
  free(fx);
}

/* ------------------------------------------------------------------ */
/* plain requests: one connection each */

static htc_resp_t RESP;
static char RAW[HTC_BUF + 1]; /* the last response as received */

static int wait_one(fx_t *fx, htc_t *c, int head, int ms) {
  uint64_t t0 = htc_now_ms();
  for (;;) {
    int k = htc_responses(c, &head, &RESP, 1);
    if (k != 0 || c->eof || htc_now_ms() - t0 > (uint64_t)ms) {
      if (c->eof && k == 0)
        k = htc_responses(c, &head, &RESP, 1);
      return k;
    }
    htc_step(&fx->loop, c, 1);
  }
}

/*
 * method target with extra header lines (each ending CRLF; may be NULL)
 * and a body (NULL: no Content-Length). Returns the status, 0 when the
 * connection closed without an answer.
 */
static int http_n(fx_t *fx, const char *method, const char *target,
                  const char *headers, const char *body, size_t blen) {
  size_t cap = 1024 + strlen(target) + (headers ? strlen(headers) : 0) + blen;
  char *raw = malloc(cap);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  int n, k;
  assert_non_null(raw);
  assert_non_null(c);
  n = snprintf(raw, cap, "%s %s HTTP/1.1\r\nHost: t\r\n%s", method, target,
               headers ? headers : "");
  if (body != NULL)
    n += snprintf(raw + n, cap - (size_t)n, "Content-Length: %zu\r\n", blen);
  n += snprintf(raw + n, cap - (size_t)n, "\r\n");
  if (body != NULL) {
    memcpy(raw + n, body, blen);
    n += (int)blen;
  }
  assert_int_equal(htc_send(&fx->loop, c, raw, (size_t)n), 0);
  free(raw);
  k = wait_one(fx, c, strcmp(method, "HEAD") == 0, 5000);
  memcpy(RAW, c->buf, c->len);
  RAW[c->len] = '\0';
  if (k == 1) /* RESP.head points into the client: move it to RAW */
    RESP.head = RAW + (RESP.head - c->buf);
  htc_free(c);
  if (k != 1)
    return 0;
  return RESP.status;
}

static int http(fx_t *fx, const char *method, const char *target,
                const char *headers, const char *body) {
  return http_n(fx, method, target, headers, body,
                body != NULL ? strlen(body) : 0);
}

static int GET(fx_t *fx, const char *target) {
  return http(fx, "GET", target, NULL, NULL);
}

static int PUT(fx_t *fx, const char *target, const char *body) {
  return http(fx, "PUT", target, NULL, body);
}

/* The JSON body of the last response (caller decrefs). */
static json_t *body_json(void) {
  json_error_t je;
  json_t *j = json_loadb(RESP.body, RESP.body_len, 0, &je);
  if (j == NULL)
    fail_msg("not JSON (%s): %.200s", je.text, RESP.body);
  return j;
}

static const char *jstr(json_t *o, const char *k) {
  json_t *v = json_object_get(o, k);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

static const char *jstr_must(json_t *o, const char *k) {
  const char *v = jstr(o, k);
  if (v == NULL)
    fail_msg("no string member '%s'", k);
  return v != NULL ? v : "";
}

static uint64_t jint(json_t *o, const char *k) {
  json_t *v = json_object_get(o, k);
  return json_is_integer(v) ? (uint64_t)json_integer_value(v) : 0;
}

/* The error member and field of a refusal. */
static void assert_error(const char *error, const char *field) {
  json_t *j = body_json();
  assert_string_equal(jstr(j, "error"), error);
  if (field != NULL)
    assert_string_equal(jstr(j, "field"), field);
  json_decref(j);
}

static uint64_t register_one(fx_t *fx, const char *svc, const char *id,
                             const char *body, const char *change) {
  char target[256];
  json_t *j;
  uint64_t rev;
  snprintf(target, sizeof target, "/v1/services/%s/instances/%s", svc, id);
  assert_int_equal(PUT(fx, target, body), 200);
  j = body_json();
  assert_string_equal(jstr(j, "service"), svc);
  assert_string_equal(jstr(j, "id"), id);
  if (change != NULL)
    assert_string_equal(jstr(j, "change"), change);
  rev = jint(j, "revision");
  assert_true(rev > 0);
  json_decref(j);
  return rev;
}

#define INST(url) "{\"url\":\"" url "\",\"ttl_ms\":10000}"

/* ------------------------------------------------------------------ */
/* watch clients: chunked decoding of our own, then the SSE parser */

struct sse_s {
  fx_t *fx;
  htc_t *c;
  int got_head, status, ended;
  int plain; /* not chunked: an error answer, not a stream */
  char head[1024];
  om_sse_parser_t *p;
  int n; /* events */
  int pings;
  int retry_seen;
  char id[32], type[32];
  char data[16384];
  size_t data_len;
};

static int on_event(void *ud, const om_sse_event_t *ev) {
  sse_t *s = ud;
  size_t k =
      ev->data_len < sizeof s->data - 1 ? ev->data_len : sizeof s->data - 1;
  s->n++;
  snprintf(s->id, sizeof s->id, "%s", ev->id);
  snprintf(s->type, sizeof s->type, "%s", ev->type);
  memcpy(s->data, ev->data, k);
  s->data[k] = '\0';
  s->data_len = ev->data_len;
  return 0;
}

/* Consume what arrived: the head, then whole chunks. */
static void sse_process(sse_t *s) {
  htc_t *c = s->c;
  size_t off = 0;
  if (!s->got_head) {
    for (size_t i = 0; i + 3 < c->len; i++)
      if (memcmp(c->buf + i, "\r\n\r\n", 4) == 0) {
        size_t hl = i + 4 < sizeof s->head ? i + 4 : sizeof s->head - 1;
        memcpy(s->head, c->buf, hl);
        s->head[hl] = '\0';
        s->status = atoi(c->buf + 9);
        s->got_head = 1;
        s->plain = strstr(s->head, "Transfer-Encoding: chunked") == NULL;
        off = i + 4;
        break;
      }
    if (!s->got_head)
      return;
  }
  if (s->plain) {
    c->len = 0;
    return;
  }
  while (off < c->len && !s->ended) {
    size_t k = off, sz = 0;
    while (k < c->len && isxdigit((unsigned char)c->buf[k])) {
      char ch = c->buf[k++];
      sz = sz * 16 + (size_t)(ch <= '9' ? ch - '0' : (ch | 0x20) - 'a' + 10);
    }
    if (k + 2 > c->len)
      break;
    assert_true(k > off && c->buf[k] == '\r' && c->buf[k + 1] == '\n');
    k += 2;
    if (sz == 0) {
      if (k + 2 > c->len)
        break;
      assert_memory_equal(c->buf + k, "\r\n", 2);
      s->ended = 1;
      off = k + 2;
      break;
    }
    if (k + sz + 2 > c->len)
      break;
    for (size_t i = 0; i + 8 <= sz; i++)
      if (memcmp(c->buf + k + i, ": ping\n\n", 8) == 0)
        s->pings++;
    if (sz >= 7 && memcmp(c->buf + k, "retry: ", 7) == 0)
      s->retry_seen = 1;
    assert_int_equal(om_sse_parser_feed(s->p, c->buf + k, sz, on_event, s), 0);
    off = k + sz + 2;
  }
  memmove(c->buf, c->buf + off, c->len - off);
  c->len -= off;
}

/* One turn of the loop, then every watch client reads. */
static void pump(fx_t *fx, int ms) {
  struct pollfd p[MAX_SSE];
  int n = 0;
  uv_run(&fx->loop, UV_RUN_NOWAIT);
  for (int i = 0; i < MAX_SSE; i++)
    if (fx->sse[i] != NULL && !fx->sse[i]->c->eof) {
      p[n].fd = fx->sse[i]->c->fd;
      p[n].events = POLLIN;
      p[n].revents = 0;
      n++;
    }
  poll(p, (nfds_t)n, ms);
  for (int i = 0; i < MAX_SSE; i++)
    if (fx->sse[i] != NULL) {
      htc_read(fx->sse[i]->c);
      sse_process(fx->sse[i]);
    }
  uv_run(&fx->loop, UV_RUN_NOWAIT);
}

static void spin(fx_t *fx, int ms) {
  uint64_t t0 = htc_now_ms();
  while (htc_now_ms() - t0 < (uint64_t)ms)
    pump(fx, 1);
}

static sse_t *sse_attach(fx_t *fx, htc_t *c, const char *target,
                         const char *headers) {
  sse_t *s = calloc(1, sizeof *s);
  char raw[2048];
  int i;
  assert_non_null(s);
  s->fx = fx;
  s->c = c;
  assert_non_null(s->c);
  assert_int_equal(om_sse_parser_new(NULL, &s->p), 0);
  for (i = 0; i < MAX_SSE && fx->sse[i] != NULL; i++)
    ;
  assert_true(i < MAX_SSE);
  fx->sse[i] = s;
  snprintf(raw, sizeof raw, "GET %s HTTP/1.1\r\nHost: t\r\n%s\r\n", target,
           headers ? headers : "");
  assert_int_equal(htc_sends(&fx->loop, s->c, raw), 0);
  return s;
}

static sse_t *sse_open(fx_t *fx, const char *target, const char *headers) {
  return sse_attach(fx, htc_new("127.0.0.1", fx->port), target, headers);
}

static void sse_free(sse_t *s) {
  fx_t *fx = s->fx;
  for (int i = 0; i < MAX_SSE; i++)
    if (fx->sse[i] == s)
      fx->sse[i] = NULL;
  htc_free(s->c);
  om_sse_parser_free(s->p);
  free(s);
}

/* Pump until s has its head and n events, or ms passed. */
static int sse_wait(sse_t *s, int n, int ms) {
  uint64_t t0 = htc_now_ms();
  while ((!s->got_head || s->n < n) && !s->c->eof &&
         htc_now_ms() - t0 < (uint64_t)ms)
    pump(s->fx, 1);
  return s->n;
}

static uint64_t sse_rev(const sse_t *s) {
  return strtoull(s->id, NULL, 10);
}

static size_t snap_count(const sse_t *s) {
  json_t *j = json_loadb(s->data, s->data_len, 0, NULL);
  size_t n;
  assert_non_null(j);
  n = json_array_size(json_object_get(j, "instances"));
  json_decref(j);
  return n;
}

static om_control_stats_t stats(fx_t *fx) {
  om_control_stats_t st;
  om_control_stats(fx->ctl, &st);
  return st;
}

/* ------------------------------------------------------------------ */
/* construction */

static void new_rejects_bad_arguments(void **state) {
  uv_loop_t loop;
  om_store_t *store;
  om_control_opts_t o;
  om_control_t *c = NULL;
  (void)state;
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(om_store_memory_new(&loop, NULL, &store), 0);
  memset(&o, 0, sizeof o);
  assert_int_equal(om_control_new(&loop, &o, &c), OM_EINVAL); /* no store */
  o.store = store;
  assert_int_equal(om_control_new(NULL, &o, &c), OM_EINVAL);
  assert_int_equal(om_control_new(&loop, NULL, &c), OM_EINVAL);
  assert_int_equal(om_control_new(&loop, &o, NULL), OM_EINVAL);
  o.cors_origin = "https://a.example\r\nX-Evil: 1";
  assert_int_equal(om_control_new(&loop, &o, &c), OM_EINVAL);
  o.cors_origin = "";
  assert_int_equal(om_control_new(&loop, &o, &c), OM_EINVAL);
  o.cors_origin = NULL;
  o.warmup_ms = OM_CONTROL_MAX_WARMUP_MS + 1;
  assert_int_equal(om_control_new(&loop, &o, &c), OM_EINVAL);
  assert_null(c);
  assert_int_equal(om_control_close(NULL, NULL, NULL), OM_EINVAL);
  assert_int_equal(om_control_port(NULL), OM_ESTATE);
  om_store_close(store, NULL, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void new_fails_cleanly_without_memory(void **state) {
  uv_loop_t loop;
  om_store_t *store;
  om_control_opts_t o;
  int n;
  (void)state;
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(om_store_memory_new(&loop, NULL, &store), 0);
  memset(&o, 0, sizeof o);
  o.store = store;
  o.cors_origin = "*";
  for (n = 0;; n++) {
    om_control_t *c = NULL;
    int rc;
    om_test_fail_alloc_after(n);
    rc = om_control_new(&loop, &o, &c);
    om_test_alloc_reset();
    if (rc == 0) {
      assert_int_equal(om_control_close(c, NULL, NULL), 0);
      assert_int_equal(om_control_close(c, NULL, NULL), OM_ESTATE);
      uv_run(&loop, UV_RUN_DEFAULT);
      break;
    }
    assert_int_equal(rc, OM_ENOMEM);
    assert_null(c);
  }
  assert_true(n >= 10);
  OM_TEST_NOTE("om_control_new: %d allocations failed one by one", n);
  om_store_close(store, NULL, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* ------------------------------------------------------------------ */
/* registry */

static void register_renew_update_delete(void **state) {
  fx_t *fx = fx_new(NULL);
  uint64_t r1, r2, r3;
  json_t *j;
  char v[64];
  (void)state;
  r1 = register_one(fx, "web", "a", INST("http://10.0.0.1:80"), "created");
  /* the same fields: a renewal, no new revision */
  r2 = register_one(fx, "web", "a", INST("http://10.0.0.1:80"), "renewed");
  assert_true(r2 == r1);
  r3 = register_one(fx, "web", "a", INST("http://10.0.0.1:81"), "updated");
  assert_true(r3 > r1);
  assert_int_equal(htc_header(&RESP, "content-type", v, sizeof v), 0);
  assert_string_equal(v, "application/json");
  /* heartbeat: renews, no body needed */
  assert_int_equal(
      http(fx, "POST", "/v1/services/web/instances/a/heartbeat", NULL, NULL),
      200);
  j = body_json();
  assert_string_equal(jstr(j, "change"), "renewed");
  assert_true(jint(j, "revision") == r3);
  json_decref(j);
  /* an unknown lease: 404 so the keeper registers again */
  assert_int_equal(
      http(fx, "POST", "/v1/services/web/instances/zz/heartbeat", NULL, NULL),
      404);
  assert_error("not_found", NULL);
  assert_int_equal(
      http(fx, "POST", "/v1/services/nosvc/instances/a/heartbeat", NULL, ""),
      404);
  /* discovery sees it */
  assert_int_equal(GET(fx, "/v1/services/web"), 200);
  j = body_json();
  assert_string_equal(jstr(j, "service"), "web");
  assert_true(jint(j, "revision") == r3);
  assert_int_equal(json_array_size(json_object_get(j, "instances")), 1);
  assert_true(json_is_null(json_object_get(j, "next_page_token")));
  assert_string_equal(
      jstr(json_array_get(json_object_get(j, "instances"), 0), "url"),
      "http://10.0.0.1:81");
  json_decref(j);
  /* delete, then again: 404 */
  assert_int_equal(
      http(fx, "DELETE", "/v1/services/web/instances/a", NULL, NULL), 200);
  j = body_json();
  assert_string_equal(jstr(j, "change"), "deleted");
  assert_true(jint(j, "revision") > r3);
  json_decref(j);
  assert_int_equal(
      http(fx, "DELETE", "/v1/services/web/instances/a", NULL, NULL), 404);
  assert_error("not_found", NULL);
  /* the service stays, empty, at its last revision */
  assert_int_equal(GET(fx, "/v1/services/web"), 200);
  j = body_json();
  assert_int_equal(json_array_size(json_object_get(j, "instances")), 0);
  json_decref(j);
  /* list */
  register_one(fx, "api", "x", INST("https://api.example"), "created");
  assert_int_equal(GET(fx, "/v1/services"), 200);
  j = body_json();
  assert_int_equal(json_array_size(json_object_get(j, "services")), 2);
  assert_string_equal(
      jstr(json_array_get(json_object_get(j, "services"), 0), "service"),
      "api");
  assert_int_equal(
      jint(json_array_get(json_object_get(j, "services"), 0), "instances"), 1);
  json_decref(j);
  /* HEAD: the headers of GET, no body */
  assert_int_equal(http(fx, "HEAD", "/v1/services/api", NULL, NULL), 200);
  assert_int_equal(RESP.body_len, 0);
  fx_free(fx);
}

static void registration_validation_changes_nothing(void **state) {
  fx_t *fx = fx_new(NULL);
  static const struct {
    const char *target, *body;
    int status;
    const char *error, *field;
  } cases[] = {
      {"/v1/services/web/instances/b", "{\"url\":", 400, "invalid_json", NULL},
      {"/v1/services/web/instances/b", "", 400, "invalid_json", NULL},
      {"/v1/services/web/instances/b", "[1]", 400, "invalid_json", NULL},
      {"/v1/services/web/instances/b",
       "{\"url\":\"http://h\",\"ttl_ms\":5000,\"ttl_ms\":6000}", 400,
       "invalid_json", NULL},
      {"/v1/services/web/instances/b", "{\"url\":\"http://h\",\"ttl\":5000}",
       400, "invalid_field", "ttl"},
      {"/v1/services/web/instances/b", "{\"ttl_ms\":5000}", 400,
       "invalid_field", "url"},
      {"/v1/services/web/instances/b", "{\"url\":\"ftp://h\",\"ttl_ms\":5000}",
       400, "invalid_field", "url"},
      {"/v1/services/web/instances/b",
       "{\"url\":\"http://u@h\",\"ttl_ms\":5000}", 400, "invalid_field", "url"},
      /* the one URL rule: what a proxy would refuse, the registry refuses */
      {"/v1/services/web/instances/b",
       "{\"url\":\"http://web-4.internal:8080#f\",\"ttl_ms\":5000}", 400,
       "invalid_field", "url"},
      {"/v1/services/web/instances/b",
       "{\"url\":\"https://h/?q=1\",\"ttl_ms\":5000}", 400, "invalid_field",
       "url"},
      {"/v1/services/web/instances/b",
       "{\"url\":\"http://999.1.1.1\",\"ttl_ms\":5000}", 400, "invalid_field",
       "url"},
      {"/v1/services/web/instances/b", "{\"url\":\"http://h\",\"ttl_ms\":999}",
       400, "invalid_field", "ttl_ms"},
      {"/v1/services/web/instances/b",
       "{\"url\":\"http://h\",\"ttl_ms\":3600001}", 400, "invalid_field",
       "ttl_ms"},
      {"/v1/services/web/instances/b",
       "{\"url\":\"http://h\",\"ttl_ms\":\"5000\"}", 400, "invalid_field",
       "ttl_ms"},
      {"/v1/services/web/instances/b",
       "{\"url\":\"http://h\",\"ttl_ms\":5000,\"weight\":0}", 400,
       "invalid_field", "weight"},
      {"/v1/services/web/instances/b",
       "{\"url\":\"http://h\",\"ttl_ms\":5000,\"weight\":10001}", 400,
       "invalid_field", "weight"},
      {"/v1/services/web/instances/b",
       "{\"url\":\"http://h\",\"ttl_ms\":5000,\"metadata\":{\"k\":1}}", 400,
       "invalid_field", "metadata.k"},
      {"/v1/services/web/instances/b",
       "{\"url\":\"http://h\",\"ttl_ms\":5000,\"id\":\"other\"}", 400,
       "invalid_field", "id"},
      {"/v1/services/web!/instances/b", INST("http://h"), 400, "invalid_field",
       "service"},
      {"/v1/services/web/instances/..", INST("http://h"), 400, "invalid_field",
       "id"},
      {"/v1/services/web/instances/a%2Fb", INST("http://h"), 400,
       "invalid_field", "id"},
  };
  char big[OM_INSTANCE_JSON_MAX + 64], *p;
  uint64_t rev;
  json_t *j;
  (void)state;
  rev = register_one(fx, "web", "a", INST("http://10.0.0.1"), "created");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int st = PUT(fx, cases[i].target, cases[i].body);
    if (st != cases[i].status)
      fail_msg("case %zu (%s): status %d, want %d: %s", i, cases[i].body, st,
               cases[i].status, RESP.body);
    assert_error(cases[i].error, cases[i].field);
  }
  /* a name of 129 characters, and one of 128 that is fine */
  {
    char t[400], name[130];
    memset(name, 'n', 129);
    name[129] = '\0';
    snprintf(t, sizeof t, "/v1/services/%s/instances/x", name);
    assert_int_equal(PUT(fx, t, INST("http://h")), 400);
    assert_error("invalid_field", "service");
  }
  /* huge metadata: 65 entries, then a value of 1025 bytes */
  p = big;
  p += sprintf(p, "{\"url\":\"http://h\",\"ttl_ms\":5000,\"metadata\":{");
  for (int i = 0; i < 65; i++)
    p += sprintf(p, "%s\"k%d\":\"v\"", i ? "," : "", i);
  sprintf(p, "}}");
  assert_int_equal(PUT(fx, "/v1/services/web/instances/b", big), 400);
  assert_error("invalid_field", "metadata");
  p = big;
  p += sprintf(p,
               "{\"url\":\"http://h\",\"ttl_ms\":5000,\"metadata\":{\"k\":\"");
  memset(p, 'v', 1025);
  p += 1025;
  sprintf(p, "\"}}");
  assert_int_equal(PUT(fx, "/v1/services/web/instances/b", big), 400);
  assert_error("invalid_field", "metadata");
  /* over the registration body limit: 413 */
  memset(big, ' ', sizeof big - 1);
  big[0] = '{';
  big[sizeof big - 2] = '}';
  big[sizeof big - 1] = '\0';
  assert_int_equal(PUT(fx, "/v1/services/web/instances/b", big), 413);
  assert_error("too_large", NULL);
  /* nothing changed */
  assert_int_equal(GET(fx, "/v1/services/web"), 200);
  j = body_json();
  assert_true(jint(j, "revision") == rev);
  assert_int_equal(json_array_size(json_object_get(j, "instances")), 1);
  json_decref(j);
  assert_int_equal(GET(fx, "/v1/services/web!"), 400);
  assert_int_equal(GET(fx, "/v1/services/nope"), 404);
  assert_error("not_found", NULL);
  assert_int_equal(GET(fx, "/v1/services"), 200);
  j = body_json();
  assert_int_equal(json_array_size(json_object_get(j, "services")), 1);
  json_decref(j);
  fx_free(fx);
}

static void discovery_pages_and_tokens(void **state) {
  fx_t *fx = fx_new(NULL);
  char target[256], token[64], id[16];
  json_t *j;
  uint64_t rev = 0;
  int seen = 0, pages = 0;
  (void)state;
  for (int i = 0; i < 25; i++) {
    snprintf(id, sizeof id, "i%02d", i);
    rev = register_one(fx, "web", id, INST("http://10.0.0.1"), "created");
  }
  /* 10 + 10 + 5, in id order, one revision */
  snprintf(target, sizeof target, "/v1/services/web?page_size=10");
  for (;;) {
    json_t *inst, *next;
    assert_int_equal(GET(fx, target), 200);
    j = body_json();
    assert_true(jint(j, "revision") == rev);
    inst = json_object_get(j, "instances");
    for (size_t k = 0; k < json_array_size(inst); k++) {
      snprintf(id, sizeof id, "i%02d", seen++);
      assert_string_equal(jstr(json_array_get(inst, k), "id"), id);
    }
    pages++;
    next = json_object_get(j, "next_page_token");
    if (json_is_null(next)) {
      json_decref(j);
      break;
    }
    assert_int_equal(json_string_length(next), OM_PAGE_TOKEN_LEN);
    snprintf(token, sizeof token, "%s", json_string_value(next));
    snprintf(target, sizeof target,
             "/v1/services/web?page_size=10&page_token=%s", token);
    json_decref(j);
  }
  assert_int_equal(pages, 3);
  assert_int_equal(seen, 25);
  /* page_size out of range or not a number */
  assert_int_equal(GET(fx, "/v1/services/web?page_size=0"), 400);
  assert_error("invalid_field", "page_size");
  assert_int_equal(GET(fx, "/v1/services/web?page_size=1001"), 400);
  assert_int_equal(GET(fx, "/v1/services/web?page_size=ten"), 400);
  assert_int_equal(GET(fx, "/v1/services/web?page_size=-1"), 400);
  assert_int_equal(GET(fx, "/v1/services/web?page_size=5&page_size=6"), 400);
  assert_int_equal(GET(fx, "/v1/services/web?page_size=1000"), 200);
  /* malformed and forged tokens */
  assert_int_equal(GET(fx, "/v1/services/web?page_token=abc"), 400);
  assert_error("invalid_field", "page_token");
  token[3] = token[3] == 'A' ? 'B' : 'A'; /* the checksum catches it */
  snprintf(target, sizeof target, "/v1/services/web?page_token=%s", token);
  assert_int_equal(GET(fx, target), 400);
  assert_error("invalid_field", "page_token");
  /* a token past the end of this revision */
  {
    char far[OM_PAGE_TOKEN_LEN + 1];
    om_page_token_encode(rev, 26, far);
    snprintf(target, sizeof target, "/v1/services/web?page_token=%s", far);
    assert_int_equal(GET(fx, target), 400);
  }
  /* a token from before a change: 409 with the current revision */
  assert_int_equal(GET(fx, "/v1/services/web?page_size=10"), 200);
  j = body_json();
  snprintf(token, sizeof token, "%s", jstr_must(j, "next_page_token"));
  json_decref(j);
  rev = register_one(fx, "web", "late", INST("http://10.0.0.9"), "created");
  snprintf(target, sizeof target, "/v1/services/web?page_size=10&page_token=%s",
           token);
  assert_int_equal(GET(fx, target), 409);
  j = body_json();
  assert_string_equal(jstr(j, "error"), "revision_changed");
  assert_true(jint(j, "revision") == rev);
  json_decref(j);
  /* a token without page_size: the rest */
  assert_int_equal(GET(fx, "/v1/services/web?page_size=20"), 200);
  j = body_json();
  snprintf(target, sizeof target, "/v1/services/web?page_token=%s",
           jstr_must(j, "next_page_token"));
  json_decref(j);
  assert_int_equal(GET(fx, target), 200);
  j = body_json();
  assert_int_equal(json_array_size(json_object_get(j, "instances")), 6);
  json_decref(j);
  fx_free(fx);
}

static void routes_404_405_options(void **state) {
  om_control_opts_t o;
  fx_t *fx;
  char v[128];
  static const char *missing[] = {
      "/",
      "/v1",
      "/v1/",
      "/v1/services/",
      "/v1/services/web/instances",
      "/v1/services/web/instances/a/heartbeat/x",
      "/v1/services//instances/a",
      "/v1/watch",
      "/v1/watch/config",
      "/v2/services",
      "/healthz/",
      "/metrics/x",
  };
  (void)state;
  memset(&o, 0, sizeof o);
  o.cors_origin = "https://ui.example";
  fx = fx_new(&o);
  for (size_t i = 0; i < sizeof missing / sizeof missing[0]; i++) {
    if (GET(fx, missing[i]) != 404)
      fail_msg("%s: %d", missing[i], RESP.status);
    assert_error("not_found", NULL);
  }
  assert_int_equal(http(fx, "POST", "/v1/services", NULL, ""), 405);
  assert_error("method_not_allowed", NULL);
  assert_int_equal(htc_header(&RESP, "allow", v, sizeof v), 0);
  assert_string_equal(v, "GET, HEAD, OPTIONS");
  assert_int_equal(GET(fx, "/v1/services/web/instances/a"), 405);
  assert_int_equal(htc_header(&RESP, "allow", v, sizeof v), 0);
  assert_string_equal(v, "PUT, DELETE, OPTIONS");
  assert_int_equal(
      http(fx, "GET", "/v1/services/web/instances/a/heartbeat", NULL, NULL),
      405);
  assert_int_equal(PUT(fx, "/healthz", ""), 405);
  assert_int_equal(http(fx, "PATCH", "/v1/config/x", NULL, "{}"), 405);
  assert_int_equal(htc_header(&RESP, "allow", v, sizeof v), 0);
  assert_string_equal(v, "GET, HEAD, PUT, OPTIONS");
  assert_int_equal(http(fx, "DELETE", "/v1/watch/services", NULL, NULL), 405);
  /* CORS: on every answer, and a preflight */
  assert_int_equal(http(fx, "OPTIONS", "/v1/config/x",
                        "Origin: https://ui.example\r\n", NULL),
                   204);
  assert_int_equal(
      htc_header(&RESP, "access-control-allow-methods", v, sizeof v), 0);
  assert_string_equal(v, "GET, HEAD, PUT, OPTIONS");
  assert_int_equal(
      htc_header(&RESP, "access-control-allow-headers", v, sizeof v), 0);
  assert_true(strstr(v, "Authorization") != NULL);
  assert_int_equal(GET(fx, "/healthz"), 200);
  assert_string_equal(RESP.body, "ok\n");
  assert_int_equal(
      htc_header(&RESP, "access-control-allow-origin", v, sizeof v), 0);
  assert_string_equal(v, "https://ui.example");
  fx_free(fx);
}

/* ------------------------------------------------------------------ */
/* auth */

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void auth_roles(void **state) {
  char path[] = "/tmp/om_test_control_tokensXXXXXX", v[256], err[256];
  int fd = mkstemp(path);
  om_auth_t *auth = NULL;
  fx_t *fx;
  sse_t *s;
  (void)state;
  assert_true(fd >= 0);
  close(fd);
  write_file(path, "# tokens\nr-token read\ng-token register\n"
                   "a-token admin\n");
  assert_int_equal(om_auth_load(path, &auth, err, sizeof err), 0);
  fx = fx_new_auth(NULL, auth);
  /* no token, a bad token */
  assert_int_equal(GET(fx, "/v1/services"), 401);
  assert_error("unauthorized", NULL);
  assert_int_equal(htc_header(&RESP, "www-authenticate", v, sizeof v), 0);
  assert_string_equal(v, "Bearer realm=\"openmesh\"");
  assert_int_equal(
      http(fx, "GET", "/v1/services", "Authorization: Bearer nope\r\n", NULL),
      401);
  assert_int_equal(htc_header(&RESP, "www-authenticate", v, sizeof v), 0);
  assert_true(strstr(v, "invalid_token") != NULL);
  assert_int_equal(
      http(fx, "GET", "/v1/services", "Authorization: Basic r-token\r\n", NULL),
      401);
  /* read: discovery yes, registration no */
  assert_int_equal(http(fx, "GET", "/v1/services",
                        "Authorization: Bearer r-token\r\n", NULL),
                   200);
  assert_int_equal(http(fx, "PUT", "/v1/services/web/instances/a",
                        "Authorization: Bearer r-token\r\n", INST("http://h")),
                   403);
  assert_error("forbidden", NULL);
  assert_int_equal(htc_header(&RESP, "www-authenticate", v, sizeof v), 0);
  assert_true(strstr(v, "insufficient_scope") != NULL);
  /* register: instances yes, config no, discovery no */
  assert_int_equal(http(fx, "PUT", "/v1/services/web/instances/a",
                        "Authorization: Bearer g-token\r\n", INST("http://h")),
                   200);
  assert_int_equal(http(fx, "POST", "/v1/services/web/instances/a/heartbeat",
                        "Authorization: bearer g-token\r\n", NULL),
                   200);
  assert_int_equal(http(fx, "PUT", "/v1/config/c",
                        "Authorization: Bearer g-token\r\n", "{}"),
                   403);
  assert_int_equal(http(fx, "GET", "/v1/services/web",
                        "Authorization: Bearer g-token\r\n", NULL),
                   403);
  /* admin: everything */
  assert_int_equal(http(fx, "PUT", "/v1/config/c",
                        "Authorization: Bearer a-token\r\n", "{}"),
                   200);
  assert_int_equal(http(fx, "GET", "/v1/config/c",
                        "Authorization: Bearer a-token\r\n", NULL),
                   200);
  assert_int_equal(http(fx, "GET", "/v1/config/c",
                        "Authorization: Bearer r-token\r\n", NULL),
                   200);
  assert_int_equal(http(fx, "DELETE", "/v1/services/web/instances/a",
                        "Authorization: Bearer a-token\r\n", NULL),
                   200);
  /* /healthz and /metrics need none; /status does */
  assert_int_equal(GET(fx, "/healthz"), 200);
  assert_int_equal(GET(fx, "/metrics"), 200);
  assert_int_equal(GET(fx, "/status"), 401);
  /* a watch: header, or access_token for EventSource */
  s = sse_open(fx, "/v1/watch/services/web", NULL);
  sse_wait(s, 0, 2000);
  assert_int_equal(s->status, 401);
  sse_free(s);
  s = sse_open(fx, "/v1/watch/services/web?access_token=r-token", NULL);
  sse_wait(s, 1, 2000);
  assert_int_equal(s->status, 200);
  assert_int_equal(s->n, 1);
  sse_free(s);
  /* a bad file on reload keeps the old tokens */
  write_file(path, "x-token reader\n");
  assert_int_equal(om_control_reload_auth(fx->ctl, path, err, sizeof err),
                   OM_EPARSE);
  assert_true(strstr(err, ":1:") != NULL);
  assert_int_equal(http(fx, "GET", "/v1/services",
                        "Authorization: Bearer r-token\r\n", NULL),
                   200);
  /* a good one replaces them */
  write_file(path, "n-token read\n");
  assert_int_equal(om_control_reload_auth(fx->ctl, path, err, sizeof err), 0);
  assert_int_equal(http(fx, "GET", "/v1/services",
                        "Authorization: Bearer r-token\r\n", NULL),
                   401);
  assert_int_equal(http(fx, "GET", "/v1/services",
                        "Authorization: Bearer n-token\r\n", NULL),
                   200);
  assert_int_equal(GET(fx, "/metrics"), 200);
  assert_true(strstr(RAW, "openmesh_control_auth_reloads_total{result=\"ok\"} "
                          "1") != NULL);
  assert_true(strstr(RAW, "openmesh_control_auth_reloads_total{result="
                          "\"error\"} 1") != NULL);
  assert_true(strstr(RAW, "openmesh_control_rejections_total{reason="
                          "\"forbidden\"} 3") != NULL);
  fx_free(fx);
  unlink(path);
}

/* ------------------------------------------------------------------ */
/* watches */

static void watch_first_snapshot_then_changes(void **state) {
  fx_t *fx = fx_new(NULL);
  uint64_t r1, r2;
  sse_t *s;
  char v[64];
  (void)state;
  r1 = register_one(fx, "web", "a", INST("http://10.0.0.1"), "created");
  s = sse_open(fx, "/v1/watch/services/web", NULL);
  assert_int_equal(sse_wait(s, 1, 2000), 1);
  assert_int_equal(s->status, 200);
  assert_true(strstr(s->head, "Content-Type: text/event-stream") != NULL);
  assert_true(strstr(s->head, "Cache-Control: no-cache") != NULL);
  assert_true(strstr(s->head, "Transfer-Encoding: chunked") != NULL);
  assert_true(s->retry_seen);
  assert_string_equal(s->type, "snapshot");
  assert_true(sse_rev(s) == r1);
  assert_int_equal(snap_count(s), 1);
  assert_int_equal(stats(fx).watchers, 1);
  /* a change: the next full snapshot */
  r2 = register_one(fx, "web", "b", INST("http://10.0.0.2"), "created");
  assert_int_equal(sse_wait(s, 2, 2000), 2);
  assert_true(sse_rev(s) == r2);
  assert_int_equal(snap_count(s), 2);
  /* a renewal is not a change */
  register_one(fx, "web", "b", INST("http://10.0.0.2"), "renewed");
  spin(fx, 50);
  assert_int_equal(s->n, 2);
  /* another service's change is not this watcher's */
  register_one(fx, "api", "x", INST("http://10.0.0.3"), "created");
  spin(fx, 50);
  assert_int_equal(s->n, 2);
  /* a delete is */
  assert_int_equal(
      http(fx, "DELETE", "/v1/services/web/instances/a", NULL, NULL), 200);
  assert_int_equal(sse_wait(s, 3, 2000), 3);
  assert_int_equal(snap_count(s), 1);
  /* the same bytes as the data a GET returns for that revision */
  assert_int_equal(GET(fx, "/v1/services/web"), 200);
  assert_true(strncmp(RESP.body, s->data, s->data_len - 1) == 0);
  /* HEAD: the stream's headers, no stream */
  assert_int_equal(http(fx, "HEAD", "/v1/watch/services/web", NULL, NULL), 200);
  assert_int_equal(htc_header(&RESP, "content-type", v, sizeof v), 0);
  assert_string_equal(v, "text/event-stream");
  /* the client leaves: the watcher goes */
  sse_free(s);
  spin(fx, 50);
  assert_int_equal(stats(fx).watchers, 0);
  fx_free(fx);
}

static void watch_last_event_id(void **state) {
  fx_t *fx = fx_new(NULL);
  uint64_t r1, r2;
  char h[96];
  sse_t *cur, *old, *junk;
  (void)state;
  register_one(fx, "web", "a", INST("http://10.0.0.1"), "created");
  r1 = register_one(fx, "web", "b", INST("http://10.0.0.2"), "created");
  /* current: no duplicate, the stream stays open */
  snprintf(h, sizeof h, "Last-Event-ID: %" PRIu64 "\r\n", r1);
  cur = sse_open(fx, "/v1/watch/services/web", h);
  snprintf(h, sizeof h, "Last-Event-ID: %" PRIu64 "\r\n", r1 - 1);
  old = sse_open(fx, "/v1/watch/services/web", h);
  junk = sse_open(fx, "/v1/watch/services/web", "Last-Event-ID: x12\r\n");
  assert_int_equal(sse_wait(old, 1, 2000), 1);
  assert_true(sse_rev(old) == r1);
  assert_int_equal(sse_wait(junk, 1, 2000), 1);
  assert_true(sse_rev(junk) == r1);
  spin(fx, 200);
  assert_true(cur->got_head);
  assert_int_equal(cur->status, 200);
  assert_int_equal(cur->n, 0);
  assert_false(cur->c->eof);
  /* the next change reaches everyone once */
  r2 = register_one(fx, "web", "c", INST("http://10.0.0.3"), "created");
  assert_int_equal(sse_wait(cur, 1, 2000), 1);
  assert_true(sse_rev(cur) == r2);
  assert_int_equal(sse_wait(old, 2, 2000), 2);
  assert_int_equal(sse_wait(junk, 2, 2000), 2);
  spin(fx, 50);
  assert_int_equal(cur->n, 1);
  assert_int_equal(old->n, 2);
  fx_free(fx);
}

/*
 * A memory store starts empty: with warmup_ms the plane warms up from its
 * start. Every snapshot it serves (GET whole and paged, watch events of
 * one service and of all) carries "warming": true and /readyz is 503 with
 * the reason; at the window's end /readyz is 200, GET carries no member
 * and every watcher gets its snapshot again at the same revision without
 * it. Without warmup_ms there is no window.
 */
static void warmup_window(void **state) {
  om_control_opts_t o;
  fx_t *fx;
  sse_t *one, *all;
  uint64_t r1;
  json_t *j;
  char want[64];
  (void)state;
  memset(&o, 0, sizeof o);
  o.warmup_ms = 300;
  fx = fx_new(&o);
  assert_true(stats(fx).warming);
  r1 = register_one(fx, "web", "a", INST("http://10.0.0.1"), "created");
  assert_int_equal(GET(fx, "/v1/services/web"), 200);
  snprintf(want, sizeof want, "\"revision\":%" PRIu64 ",\"warming\":true,", r1);
  if (strstr(RESP.body, want) == NULL)
    fail_msg("no %s in %.300s", want, RESP.body);
  assert_int_equal(GET(fx, "/v1/services/web?page_size=1"), 200);
  assert_non_null(strstr(RESP.body, want));
  assert_int_equal(GET(fx, "/readyz"), 503);
  j = body_json();
  assert_string_equal(
      json_string_value(json_array_get(json_object_get(j, "reasons"), 0)),
      "warming");
  OM_ASSERT_CMP(jint(j, "warming_remaining_ms"), <=, 300);
  OM_ASSERT_CMP(jint(j, "warming_remaining_ms"), >, 0);
  json_decref(j);
  assert_int_equal(GET(fx, "/healthz"), 200);
  one = sse_open(fx, "/v1/watch/services/web", NULL);
  all = sse_open(fx, "/v1/watch/services", NULL);
  assert_int_equal(sse_wait(one, 1, 2000), 1);
  assert_int_equal(sse_wait(all, 1, 2000), 1);
  assert_non_null(strstr(one->data, want));
  assert_non_null(strstr(all->data, want));
  /* the window ends: both get the same revision again, warm */
  assert_int_equal(sse_wait(one, 2, 3000), 2);
  assert_int_equal(sse_wait(all, 2, 3000), 2);
  assert_true(sse_rev(one) == r1);
  assert_true(sse_rev(all) == r1);
  assert_null(strstr(one->data, "warming"));
  assert_null(strstr(all->data, "warming"));
  assert_false(stats(fx).warming);
  assert_int_equal(GET(fx, "/readyz"), 200);
  assert_int_equal(GET(fx, "/v1/services/web"), 200);
  assert_null(strstr(RESP.body, "warming"));
  assert_int_equal(GET(fx, "/metrics"), 200);
  assert_non_null(strstr(RESP.body, "openmesh_control_warming 0\n"));
  assert_non_null(strstr(RESP.body, "openmesh_control_warmups_total 1\n"));
  /* nothing more: the window does not come back */
  spin(fx, 100);
  assert_int_equal(one->n, 2);
  fx_free(fx);
  /* no warmup_ms: no window */
  fx = fx_new(NULL);
  assert_false(stats(fx).warming);
  register_one(fx, "web", "a", INST("http://10.0.0.1"), "created");
  assert_int_equal(GET(fx, "/v1/services/web"), 200);
  assert_null(strstr(RESP.body, "warming"));
  assert_int_equal(GET(fx, "/readyz"), 200);
  fx_free(fx);
}

static void watch_unknown_service_then_all_services(void **state) {
  fx_t *fx = fx_new(NULL);
  uint64_t ra, rb, rb2;
  char h[96];
  sse_t *w, *all, *all_cur;
  (void)state;
  /* a service nobody registered yet: the stream waits */
  w = sse_open(fx, "/v1/watch/services/later", NULL);
  spin(fx, 100);
  assert_true(w->got_head);
  assert_int_equal(w->status, 200);
  assert_int_equal(w->n, 0);
  register_one(fx, "later", "a", INST("http://10.0.0.1"), "created");
  assert_int_equal(sse_wait(w, 1, 2000), 1);
  assert_int_equal(snap_count(w), 1);
  sse_free(w);
  /* all services: one snapshot each, oldest revision first */
  ra = register_one(fx, "zeta", "a", INST("http://10.0.0.1"), "created");
  rb = register_one(fx, "alpha", "a", INST("http://10.0.0.1"), "created");
  assert_true(rb > ra);
  all = sse_open(fx, "/v1/watch/services", NULL);
  assert_int_equal(sse_wait(all, 3, 2000), 3);
  assert_true(sse_rev(all) == rb);
  assert_true(strstr(all->data, "\"service\":\"alpha\"") != NULL);
  /* Last-Event-ID at the newest revision: nothing re-sent */
  snprintf(h, sizeof h, "Last-Event-ID: %" PRIu64 "\r\n", rb);
  all_cur = sse_open(fx, "/v1/watch/services", h);
  spin(fx, 100);
  assert_int_equal(all_cur->status, 200);
  assert_int_equal(all_cur->n, 0);
  /* then each change */
  rb2 = register_one(fx, "alpha", "b", INST("http://10.0.0.2"), "created");
  assert_int_equal(sse_wait(all, 4, 2000), 4);
  assert_true(sse_rev(all) == rb2);
  assert_int_equal(sse_wait(all_cur, 1, 2000), 1);
  assert_true(sse_rev(all_cur) == rb2);
  assert_int_equal(stats(fx).watchers, 2);
  fx_free(fx);
}

static void lease_expiry_pushes_a_snapshot(void **state) {
  fx_t *fx = fx_new(NULL);
  uint64_t r1;
  sse_t *s;
  (void)state;
  r1 = register_one(fx, "web", "short",
                    "{\"url\":\"http://10.0.0.1\",\"ttl_ms\":1000}", "created");
  register_one(fx, "web", "long",
               "{\"url\":\"http://10.0.0.2\",\"ttl_ms\":"
               "60000}",
               "created");
  s = sse_open(fx, "/v1/watch/services/web", NULL);
  assert_int_equal(sse_wait(s, 1, 2000), 1);
  fx->fake_ms += 999;
  assert_int_equal(om_store_memory_expire(fx->store), 0);
  fx->fake_ms += 2;
  assert_int_equal(om_store_memory_expire(fx->store), 1);
  assert_int_equal(sse_wait(s, 2, 2000), 2);
  assert_true(sse_rev(s) > r1);
  assert_int_equal(snap_count(s), 1);
  assert_true(strstr(s->data, "\"id\":\"long\"") != NULL);
  /* the keeper's next heartbeat learns it must register again */
  assert_int_equal(http(fx, "POST",
                        "/v1/services/web/instances/short/"
                        "heartbeat",
                        NULL, NULL),
                   404);
  assert_int_equal(GET(fx, "/metrics"), 200);
  assert_true(strstr(RAW, "openmesh_control_expiries_total 1\n") != NULL);
  fx_free(fx);
}

/* A raw client whose receive buffer is tiny and who never reads. */
static htc_t *slow_client(int port) {
  htc_t *c = calloc(1, sizeof *c);
  struct sockaddr_in a;
  int small = 4096;
  assert_non_null(c);
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  c->fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(c->fd >= 0);
  setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  assert_int_equal(connect(c->fd, (struct sockaddr *)&a, sizeof a), 0);
  fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
  return c;
}

static void backlog_limit_cuts_a_slow_all_services_watcher(void **state) {
  om_control_opts_t o;
  fx_t *fx;
  char *big, *p;
  sse_t *fast, *slow;
  htc_t *sc;
  int rounds = 0, want;
  (void)state;
  memset(&o, 0, sizeof o);
  o.max_watch_backlog = 64 * 1024;
  fx = fx_new(&o);
  /* one instance with ~60 KB of metadata makes every snapshot that big */
  big = malloc(80000);
  assert_non_null(big);
  p = big + sprintf(big, "{\"url\":\"http://h\",\"ttl_ms\":60000,"
                         "\"metadata\":{");
  for (int i = 0; i < 60; i++) {
    p += sprintf(p, "%s\"k%02d\":\"", i ? "," : "", i);
    memset(p, 'a' + i % 26, 1000);
    p += 1000;
    *p++ = '"';
  }
  sprintf(p, "}}");
  register_one(fx, "web", "big", big, "created");
  fast = sse_open(fx, "/v1/watch/services/web", NULL);
  sc = slow_client(fx->port);
  /* the every-service stream queues (a service's own stream holds only
   * its newest snapshot for a slow client and is never cut: see
   * control_spec's 2,000 watchers) */
  slow = sse_attach(fx, sc, "/v1/watch/services", NULL);
  /* unregister the slow one from the pump: it never reads again */
  for (int i = 0; i < MAX_SSE; i++)
    if (fx->sse[i] == slow)
      fx->sse[i] = NULL;
  assert_int_equal(sse_wait(fast, 1, 2000), 1);
  spin(fx, 20);
  assert_int_equal(stats(fx).watchers, 2);
  while (stats(fx).watchers_dropped == 0 && rounds < 600) {
    char url[64];
    rounds++;
    snprintf(url, sizeof url, "{\"url\":\"http://h%d\",\"ttl_ms\":60000}",
             rounds);
    register_one(fx, "web", "flip", url, rounds == 1 ? "created" : "updated");
    /* the fast one keeps up: every event, in time */
    assert_int_equal(sse_wait(fast, rounds + 1, 2000), rounds + 1);
  }
  OM_TEST_NOTE("slow watcher cut after %d events of ~61 KB", rounds);
  assert_int_equal(stats(fx).watchers_dropped, 1);
  assert_int_equal(stats(fx).watchers, 1);
  /* the others keep getting events */
  want = fast->n + 3;
  for (int i = 0; i < 3; i++) {
    char url[64];
    snprintf(url, sizeof url, "{\"url\":\"http://x%d\",\"ttl_ms\":60000}", i);
    register_one(fx, "web", "flip", url, "updated");
  }
  assert_int_equal(sse_wait(fast, want, 2000), want);
  assert_false(fast->c->eof);
  /* the slow one reads what was queued, then the cut: no final chunk */
  {
    uint64_t t0 = htc_now_ms();
    while (!sc->eof && htc_now_ms() - t0 < 5000) {
      htc_read(sc);
      sc->len = 0; /* only the end matters */
      pump(fx, 1);
    }
    assert_true(sc->eof);
    assert_true(memcmp(sc->tail + 3, "0\r\n\r\n", 5) != 0);
  }
  assert_int_equal(GET(fx, "/metrics"), 200);
  assert_true(strstr(RAW, "openmesh_control_watchers_dropped_total{reason="
                          "\"backlog\"} 1\n") != NULL);
  htc_free(sc);
  om_sse_parser_free(slow->p);
  free(slow);
  free(big);
  fx_free(fx);
}

static void pings_keep_streams_alive(void **state) {
  om_control_opts_t o;
  fx_t *fx;
  sse_t *s;
  (void)state;
  memset(&o, 0, sizeof o);
  o.ping_interval_ms = 30;
  o.retry_ms = 1500;
  fx = fx_new(&o);
  s = sse_open(fx, "/v1/watch/config/none", NULL);
  spin(fx, 200);
  assert_int_equal(s->status, 200);
  assert_true(s->pings >= 2);
  assert_int_equal(s->n, 0);
  assert_int_equal(om_sse_parser_retry_ms(s->p), 1500);
  fx_free(fx);
}

static void close_ends_streams_cleanly(void **state) {
  fx_t *fx = fx_new(NULL);
  sse_t *a, *b;
  uint64_t t0;
  (void)state;
  register_one(fx, "web", "a", INST("http://10.0.0.1"), "created");
  a = sse_open(fx, "/v1/watch/services/web", NULL);
  b = sse_open(fx, "/v1/watch/services", NULL);
  assert_int_equal(sse_wait(a, 1, 2000), 1);
  assert_int_equal(sse_wait(b, 1, 2000), 1);
  assert_int_equal(om_control_close(fx->ctl, on_closed, fx), 0);
  assert_int_equal(om_control_close(fx->ctl, on_closed, fx), OM_ESTATE);
  t0 = htc_now_ms();
  while ((!a->c->eof || !b->c->eof || !fx->closed) && htc_now_ms() - t0 < 5000)
    pump(fx, 1);
  assert_true(fx->closed);
  fx->ctl = NULL;
  /* the terminating zero-length chunk: a complete response */
  assert_true(a->ended);
  assert_true(b->ended);
  assert_true(a->c->eof);
  fx_free(fx);
}

/* ------------------------------------------------------------------ */
/* configuration */

static const char good_policy[] =
    "return {\n"
    "  kind = \"traffic\",\n"
    "  subset = function(_, peers) return peers end,\n"
    "  examples = {{ peers = {{id = \"a\"}}, expect = {\"a\"} }},\n"
    "}\n";

static const char bad_syntax[] = "return {\n  kind = = \"traffic\"\n}\n";

static const char bad_example[] =
    "return {\n"
    "  kind = \"traffic\",\n"
    "  subset = function(_, peers) return {} end,\n"
    "  examples = {{ peers = {{id = \"a\"}}, expect = {\"a\"} }},\n"
    "}\n";

static void config_documents_and_policies(void **state) {
  fx_t *fx = fx_new(NULL);
  uint64_t r1, r2;
  json_t *j;
  char v[64];
  sse_t *s;
  (void)state;
  assert_int_equal(GET(fx, "/v1/config/routes"), 404);
  assert_int_equal(PUT(fx, "/v1/config/routes", "{\"a\":1}"), 200);
  j = body_json();
  assert_string_equal(jstr(j, "change"), "created");
  r1 = jint(j, "revision");
  json_decref(j);
  s = sse_open(fx, "/v1/watch/config/routes", NULL);
  assert_int_equal(sse_wait(s, 1, 2000), 1);
  assert_true(sse_rev(s) == r1);
  assert_string_equal(s->data, "{\"a\":1}");
  /* invalid JSON documents: refused, the last good one stays */
  assert_int_equal(PUT(fx, "/v1/config/routes", "{\"a\":"), 400);
  assert_error("invalid_json", NULL);
  assert_int_equal(PUT(fx, "/v1/config/routes", "[1,2]"), 400);
  assert_error("invalid_json", NULL);
  assert_int_equal(PUT(fx, "/v1/config/routes", "{\"a\":1,\"a\":2}"), 400);
  assert_int_equal(http(fx, "PUT", "/v1/config/routes",
                        "Content-Type: text/plain\r\n", "{}"),
                   415);
  assert_error("unsupported_media_type", NULL);
  assert_int_equal(PUT(fx, "/v1/config/bad%20name", "{}"), 400);
  assert_error("invalid_field", "name");
  assert_int_equal(GET(fx, "/v1/config/routes"), 200);
  assert_string_equal(RESP.body, "{\"a\":1}");
  assert_int_equal(htc_header(&RESP, "etag", v, sizeof v), 0);
  /* the same body again: unchanged, no event */
  assert_int_equal(http(fx, "PUT", "/v1/config/routes",
                        "Content-Type: application/json; charset=utf-8\r\n",
                        "{\"a\":1}"),
                   200);
  j = body_json();
  assert_string_equal(jstr(j, "change"), "unchanged");
  json_decref(j);
  assert_int_equal(PUT(fx, "/v1/config/routes", "{\"a\":2}"), 200);
  assert_int_equal(sse_wait(s, 2, 2000), 2);
  assert_string_equal(s->data, "{\"a\":2}");
  spin(fx, 30);
  assert_int_equal(s->n, 2);
  /* Lua policies: validated with the policy runtime */
  assert_int_equal(http(fx, "PUT", "/v1/config/traffic",
                        "Content-Type: text/x-lua\r\n", good_policy),
                   200);
  j = body_json();
  r2 = jint(j, "revision");
  json_decref(j);
  assert_int_equal(http(fx, "PUT", "/v1/config/traffic",
                        "Content-Type: text/x-lua\r\n", bad_syntax),
                   422);
  j = body_json();
  assert_string_equal(jstr(j, "error"), "invalid_policy");
  assert_true(strncmp(jstr(j, "message"), "traffic:2:", 10) == 0);
  json_decref(j);
  assert_int_equal(http(fx, "PUT", "/v1/config/traffic",
                        "Content-Type: text/x-lua\r\n", bad_example),
                   422);
  assert_error("invalid_policy", NULL);
  assert_int_equal(http_n(fx, "PUT", "/v1/config/traffic",
                          "Content-Type: text/x-lua\r\n", "return {}\xff", 10),
                   400);
  assert_error("invalid_field", "body");
  assert_int_equal(GET(fx, "/v1/config/traffic"), 200);
  assert_string_equal(RESP.body, good_policy);
  assert_int_equal(htc_header(&RESP, "content-type", v, sizeof v), 0);
  assert_string_equal(v, "text/x-lua");
  assert_int_equal(htc_header(&RESP, "openmesh-revision", v, sizeof v), 0);
  assert_true(strtoull(v, NULL, 10) == r2);
  /* status lists the documents */
  assert_int_equal(GET(fx, "/status"), 200);
  j = body_json();
  assert_int_equal(json_array_size(json_object_get(j, "config")), 2);
  json_decref(j);
  fx_free(fx);
}

/* ------------------------------------------------------------------ */
/* operations */

static void metrics_and_status(void **state) {
  fx_t *fx = fx_new(NULL);
  json_t *j;
  sse_t *s;
  static const char *names[] = {
      "openmesh_control_registrations_total 2\n",
      "openmesh_control_renewals_total 1\n",
      "openmesh_control_deletions_total 1\n",
      "openmesh_control_expiries_total 0\n",
      "openmesh_control_instances 1\n",
      "openmesh_control_services 1\n",
      "openmesh_control_watchers 1\n",
      "openmesh_control_watch_events_total ",
      "openmesh_control_watchers_dropped_total{reason=\"backlog\"} 0\n",
      "openmesh_control_rejections_total{reason=\"invalid_field\"} 1\n",
      "openmesh_control_rejections_total{reason=\"not_found\"} 1\n",
      "openmesh_control_rejections_total{reason=\"bad_request_line\"} 1\n",
      "openmesh_control_request_duration_seconds_bucket{route=\"register\","
      "le=\"",
      "openmesh_control_request_duration_seconds_count{route=\"register\"} 4",
      "openmesh_control_revision ",
      "openmesh_http_connections_active ",
      "# TYPE openmesh_control_registrations_total counter",
      "# TYPE openmesh_control_watchers gauge",
      "# TYPE openmesh_control_request_duration_seconds histogram",
  };
  (void)state;
  register_one(fx, "web", "a", INST("http://10.0.0.1"), "created");
  register_one(fx, "web", "b", INST("http://10.0.0.1"), "created");
  register_one(fx, "web", "b", INST("http://10.0.0.1"), "renewed");
  assert_int_equal(
      http(fx, "DELETE", "/v1/services/web/instances/b", NULL, NULL), 200);
  assert_int_equal(PUT(fx, "/v1/services/web/instances/c", "{}"), 400);
  assert_int_equal(GET(fx, "/nope"), 404);
  {
    htc_t *c = htc_new("127.0.0.1", fx->port);
    assert_int_equal(htc_sends(&fx->loop, c, "GET  / HTTP/1.1\r\n\r\n"), 0);
    wait_one(fx, c, 0, 2000);
    assert_int_equal(RESP.status, 400);
    htc_free(c);
  }
  s = sse_open(fx, "/v1/watch/services/web", NULL);
  assert_int_equal(sse_wait(s, 1, 2000), 1);
  assert_int_equal(GET(fx, "/metrics"), 200);
  assert_true(strstr(RAW, "Content-Type: text/plain; version=0.0.4") != NULL);
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strstr(RAW, names[i]) == NULL)
      fail_msg("/metrics lacks %s", names[i]);
  assert_int_equal(GET(fx, "/status"), 200);
  j = body_json();
  assert_string_equal(jstr(j, "store"), "memory");
  assert_true(json_is_false(json_object_get(j, "stale")));
  assert_int_equal(jint(j, "services"), 1);
  assert_int_equal(jint(j, "instances"), 1);
  assert_int_equal(jint(j, "watchers"), 1);
  assert_true(jint(j, "revision") == stats(fx).revision);
  assert_true(json_is_real(json_object_get(j, "uptime_s")));
  assert_true(json_is_false(json_object_get(j, "auth")));
  json_decref(j);
  fx_free(fx);
}

static void malicious_requests_leave_others_served(void **state) {
  fx_t *fx = fx_new(NULL);
  static const char *evil[] = {
      "PUT /v1/services/web/instances/x HTTP/1.1\r\nHost: t\r\n"
      "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
      "GET /v1/services HTTP/1.1\r\nHost: t\r\n\r\n",
      "PUT /v1/services/web/instances/x HTTP/1.1\r\nHost: t\r\n"
      "Content-Length: 3\r\nContent-Length: 40\r\n\r\nabc",
      "PUT /v1/services/web/instances/x HTTP/1.1\r\nHost: t\r\n"
      "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
      "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n",
      "GET /v1/services HTTP/1.1\r\nHost: t\r\nX: a\r\n b\r\n\r\n",
      "GET /v1/services\r\n\r\n",
  };
  sse_t *s;
  uint64_t rev;
  (void)state;
  rev = register_one(fx, "web", "a", INST("http://10.0.0.1"), "created");
  s = sse_open(fx, "/v1/watch/services/web", NULL);
  assert_int_equal(sse_wait(s, 1, 2000), 1);
  for (size_t i = 0; i < sizeof evil / sizeof evil[0]; i++) {
    htc_t *c = htc_new("127.0.0.1", fx->port);
    uint64_t t0 = htc_now_ms();
    int k;
    assert_int_equal(htc_sends(&fx->loop, c, evil[i]), 0);
    while (!c->eof && htc_now_ms() - t0 < 3000)
      htc_step(&fx->loop, c, 1);
    assert_true(c->eof); /* answered (or not) and closed */
    k = htc_responses(c, NULL, &RESP, 1);
    assert_true(k <= 1);
    if (k == 1)
      assert_true(RESP.status >= 400);
    htc_free(c);
  }
  /* nothing was registered by a smuggled request, the watcher lives */
  assert_int_equal(GET(fx, "/v1/services/web"), 200);
  {
    json_t *j = body_json();
    assert_true(jint(j, "revision") == rev);
    assert_int_equal(json_array_size(json_object_get(j, "instances")), 1);
    json_decref(j);
  }
  register_one(fx, "web", "b", INST("http://10.0.0.2"), "created");
  assert_int_equal(sse_wait(s, 2, 2000), 2);
  assert_false(s->c->eof);
  fx_free(fx);
}

/* Registration under allocation failure: 200 or 503 (or the connection
 * is lost), never half done. */
static void registration_survives_allocation_failures(void **state) {
  fx_t *fx = fx_new(NULL);
  int n, ok = 0, refused = 0, dropped = 0;
  static const char req[] =
      "PUT /v1/services/web/instances/b HTTP/1.1\r\nHost: t\r\n"
      "Content-Length: 39\r\n\r\n{\"url\":\"http://10.0.0.2\",\"ttl_ms\""
      ":5000}";
  (void)state;
  register_one(fx, "web", "a", INST("http://10.0.0.1"), "created");
  for (n = 0; n < 400 && !ok; n++) {
    htc_t *c = htc_new("127.0.0.1", fx->port);
    json_t *j;
    long failures;
    int k;
    htc_step(&fx->loop, c, 1); /* accepted before the window opens */
    om_test_fail_alloc_after(n);
    assert_int_equal(htc_sends(&fx->loop, c, req), 0);
    k = wait_one(fx, c, 0, 2000);
    failures = om_test_alloc_failures();
    om_test_alloc_reset();
    if (failures == 0)
      assert_int_equal(k, 1);
    if (k == 1 && RESP.status == 200) {
      ok = 1;
    } else if (k == 1) {
      assert_int_equal(RESP.status, 503);
      assert_true(strstr(RESP.body, "\"error\"") != NULL);
      refused++;
    } else {
      assert_true(c->eof);
      dropped++;
    }
    htc_free(c);
    assert_int_equal(GET(fx, "/v1/services/web"), 200);
    j = body_json();
    assert_int_equal(json_array_size(json_object_get(j, "instances")),
                     ok ? 2 : 1);
    json_decref(j);
  }
  assert_true(ok);
  OM_TEST_NOTE("registration: %d refused (503), %d connections lost, "
               "then registered",
               refused, dropped);
  fx_free(fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(new_rejects_bad_arguments),
      cmocka_unit_test(new_fails_cleanly_without_memory),
      cmocka_unit_test(register_renew_update_delete),
      cmocka_unit_test(registration_validation_changes_nothing),
      cmocka_unit_test(discovery_pages_and_tokens),
      cmocka_unit_test(routes_404_405_options),
      cmocka_unit_test(auth_roles),
      cmocka_unit_test(watch_first_snapshot_then_changes),
      cmocka_unit_test(watch_last_event_id),
      cmocka_unit_test(watch_unknown_service_then_all_services),
      cmocka_unit_test(warmup_window),
      cmocka_unit_test(lease_expiry_pushes_a_snapshot),
      cmocka_unit_test(backlog_limit_cuts_a_slow_all_services_watcher),
      cmocka_unit_test(pings_keep_streams_alive),
      cmocka_unit_test(close_ends_streams_cleanly),
      cmocka_unit_test(config_documents_and_policies),
      cmocka_unit_test(metrics_and_status),
      cmocka_unit_test(malicious_requests_leave_others_served),
      cmocka_unit_test(registration_survives_allocation_failures),
  };
  signal(SIGPIPE, SIG_IGN); /* libuv writes with writev */
  return cmocka_run_group_tests(tests, NULL, NULL);
}
