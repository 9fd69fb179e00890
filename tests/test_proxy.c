/*
 * test_proxy.c: the proxy's call path, in process, on real loopback
 * sockets: the proxy on a loop, upstream fixtures written here with
 * om_http_server on the same loop (fast, slow, failing N times, resetting
 * connections, dying mid-stream, streaming a lot, counting requests per
 * method), and raw-socket clients (tests/support/http_test_client.h).
 * Nothing of the proxy is mocked.
 *
 * Each test owns its loop and closes it fully (uv_loop_close must
 * succeed): every handle the proxy opened is closed by om_proxy_close.
 */
#include "om_test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <ctype.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <jansson.h>
#include <uv.h>

#include "http_test_client.h"
#include "om_errno.h"
#include "om_proxy.h"
#include "om_rendezvous.h"

/* ------------------------------------------------------------------ */
/* upstream fixtures */

typedef enum {
  FX_OK,         /* 200 at once, body "<id>\n" */
  FX_SLOW,       /* 200 after delay_ms */
  FX_FAIL,       /* fail_status for the first fail_n requests (-1: all) */
  FX_RESET,      /* close the connection without answering */
  FX_STREAM_DIE, /* 200 chunked SSE, one event, then cut */
  FX_STREAM_BIG, /* 200 with Content-Length big_total, written in chunks */
  FX_SSE,        /* 200 SSE: sse_count events sse_every_ms apart, then the
                    end (or, with sse_hang, silence) */
  FX_CL_STALL,   /* cl_status (0: 200) with Content-Length cl_total:
                    cl_sent bytes, then silence */
  FX_UPGRADE,    /* 101 to an upgrade request (but /plain), then echo */
} fx_mode_t;

#define FX_PEND 64
#define FLOOD_MB 64
#define BIG_CHUNK (64u * 1024u)

typedef struct fx_s fx_t;

typedef struct {
  uv_timer_t t;
  om_http_request_t *req;
  fx_t *fx;
  int used;
  size_t sent;
} fx_pend_t;

struct fx_s {
  uv_loop_t *loop;
  om_http_server_t *srv;
  int port, closed, timers_open;
  char id[32], url[96];
  const char *mkey, *mval; /* one metadata entry, optional */
  const char *path;        /* URL path prefix, optional */
  fx_mode_t mode;
  int fail_n, fail_status;
  const char *retry_after;
  uint64_t delay_ms;
  size_t big_total;
  unsigned requests, gets, posts, puts, others;
  char last_attempt[16], last_rid[64], last_xff[128], last_foo[32];
  char last_hop[32], last_deadline[32], last_target[256], last_host[64];
  char last_via[64], last_upgrade[64], last_connection[64];
  char last_headers[2048]; /* every field of the last request, one a line */
  const char *resp_name, *resp_value; /* an extra field of FX_OK answers */
  size_t last_body_len;
  om_tunnel_t *tun; /* FX_UPGRADE: the echo tunnel open now */
  int tun_closes, tun_err;
  uint64_t last_body_hash; /* FNV-1a of the last body */
  fx_pend_t pend[FX_PEND];
  unsigned sse_every_ms, sse_count;
  int sse_hang;
  size_t cl_total, cl_sent;
  int cl_status;
  uint64_t last_write_ms; /* htc_now_ms() of the latest body write */
};

static void copy_header(const om_http_request_t *req, const char *name,
                        char *out, size_t cap) {
  size_t len;
  const char *v = om_http_request_header(req, name, &len);
  if (v == NULL) {
    out[0] = '\0';
    return;
  }
  snprintf(out, cap, "%.*s", (int)len, v);
}

static void fx_on_gone(om_http_request_t *req) {
  fx_pend_t *pd = req->user;
  pd->req = NULL;
  uv_timer_stop(&pd->t);
  pd->used = 0;
}

static fx_pend_t *fx_slot(fx_t *fx, om_http_request_t *req) {
  for (int i = 0; i < FX_PEND; i++)
    if (!fx->pend[i].used) {
      fx_pend_t *pd = &fx->pend[i];
      pd->used = 1;
      pd->req = req;
      pd->sent = 0;
      req->user = pd;
      om_http_request_on_close(req, fx_on_gone);
      return pd;
    }
  fail_msg("fixture %s: more than %d pending requests", fx->id, FX_PEND);
  return NULL;
}

static void fx_release(fx_pend_t *pd) {
  pd->req = NULL;
  pd->used = 0;
  uv_timer_stop(&pd->t);
}

static void fx_answer(fx_t *fx, om_http_request_t *req, int status) {
  om_http_header_t h[2] = {{"content-type", "text/plain", 12, 10}};
  char body[64];
  int n = snprintf(body, sizeof body, "%s\n", fx->id);
  size_t nh = 1;
  if (fx->resp_name != NULL)
    h[nh++] = (om_http_header_t){fx->resp_name, fx->resp_value, 0, 0};
  om_http_respond(req, status, h, nh, body, (size_t)n);
}

static void on_slow(uv_timer_t *t) {
  fx_pend_t *pd = t->data;
  om_http_request_t *req = pd->req;
  fx_release(pd);
  if (req != NULL)
    fx_answer(pd->fx, req, 200);
}

static void on_die(uv_timer_t *t) {
  fx_pend_t *pd = t->data;
  om_http_request_t *req = pd->req;
  fx_release(pd);
  if (req != NULL)
    om_http_response_abort(req); /* cut mid-stream: no last chunk */
}

static void on_big(uv_timer_t *t) {
  fx_pend_t *pd = t->data;
  static char chunk[BIG_CHUNK];
  fx_t *fx = pd->fx;
  for (int k = 0; k < 8 && pd->req != NULL; k++) {
    size_t n = fx->big_total - pd->sent;
    if (om_http_response_pending(pd->req) > (1u << 20))
      return;
    if (n > sizeof chunk)
      n = sizeof chunk;
    memset(chunk, 'a' + (int)(pd->sent / BIG_CHUNK % 26), n);
    om_http_response_write(pd->req, chunk, n);
    pd->sent += n;
    if (pd->sent == fx->big_total) {
      om_http_request_t *req = pd->req;
      fx_release(pd);
      om_http_response_end(req);
      return;
    }
  }
}

static void on_sse(uv_timer_t *t) {
  fx_pend_t *pd = t->data;
  fx_t *fx = pd->fx;
  char ev[32];
  int n;
  if (pd->req == NULL)
    return;
  if (pd->sent >= fx->sse_count) {
    om_http_request_t *req = pd->req;
    if (fx->sse_hang) {
      uv_timer_stop(&pd->t); /* silent; the slot stays until the cut */
      return;
    }
    fx_release(pd);
    om_http_response_end(req);
    return;
  }
  n = snprintf(ev, sizeof ev, "data: %zu\n\n", pd->sent);
  om_http_response_write(pd->req, ev, (size_t)n);
  pd->sent++;
  fx->last_write_ms = htc_now_ms();
}

/* FX_UPGRADE's echo: what comes in goes back; the client's half-close
 * is answered with ours. */
static void fx_tun_data(void *ud, const char *d, size_t n) {
  fx_t *fx = ud;
  om_tunnel_write(fx->tun, d, n);
}

static void fx_tun_eof(void *ud) {
  fx_t *fx = ud;
  om_tunnel_shutdown(fx->tun);
}

static void fx_tun_close(void *ud, int err) {
  fx_t *fx = ud;
  fx->tun = NULL;
  fx->tun_closes++;
  fx->tun_err = err;
}

static void fx_upgrade(fx_t *fx, om_http_request_t *req) {
  static const om_tunnel_callbacks_t cb = {fx_tun_data, fx_tun_eof, NULL,
                                           fx_tun_close};
  om_http_header_t h[] = {
      {"Upgrade", "websocket", 0, 0},
      {"Sec-WebSocket-Accept", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", 0, 0}};
  int flood = req->path_len == 6 && memcmp(req->path, "/flood", 6) == 0;
  if (om_http_response_upgrade(req, h, 2, &cb, fx, &fx->tun) != 0) {
    om_http_response_abort(req);
    return;
  }
  if (flood) { /* FLOOD_MB at once, then our FIN */
    static char mb[1 << 20];
    memset(mb, 'z', sizeof mb);
    for (int i = 0; i < FLOOD_MB; i++)
      om_tunnel_write(fx->tun, mb, sizeof mb);
    om_tunnel_shutdown(fx->tun);
  }
}

static uint64_t fnv1a(const char *p, size_t n) {
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)p[i];
    h *= 1099511628211ull;
  }
  return h;
}

static void fx_on_request(om_http_request_t *req, void *ud) {
  fx_t *fx = ud;
  fx_pend_t *pd;
  fx->requests++;
  if (req->method_len == 3 && memcmp(req->method, "GET", 3) == 0)
    fx->gets++;
  else if (req->method_len == 4 && memcmp(req->method, "POST", 4) == 0)
    fx->posts++;
  else if (req->method_len == 3 && memcmp(req->method, "PUT", 3) == 0)
    fx->puts++;
  else
    fx->others++;
  copy_header(req, "x-openmesh-attempt", fx->last_attempt,
              sizeof fx->last_attempt);
  copy_header(req, "x-request-id", fx->last_rid, sizeof fx->last_rid);
  copy_header(req, "x-forwarded-for", fx->last_xff, sizeof fx->last_xff);
  copy_header(req, "foo", fx->last_foo, sizeof fx->last_foo);
  copy_header(req, "x-hop", fx->last_hop, sizeof fx->last_hop);
  copy_header(req, "x-openmesh-deadline-ms", fx->last_deadline,
              sizeof fx->last_deadline);
  copy_header(req, "host", fx->last_host, sizeof fx->last_host);
  copy_header(req, "via", fx->last_via, sizeof fx->last_via);
  {
    size_t k = 0;
    fx->last_headers[0] = '\0';
    for (size_t i = 0; i < req->n_headers && k < sizeof fx->last_headers; i++)
      k += (size_t)snprintf(fx->last_headers + k, sizeof fx->last_headers - k,
                            "%s: %s\n", req->headers[i].name,
                            req->headers[i].value);
  }
  copy_header(req, "upgrade", fx->last_upgrade, sizeof fx->last_upgrade);
  copy_header(req, "connection", fx->last_connection,
              sizeof fx->last_connection);
  snprintf(fx->last_target, sizeof fx->last_target, "%.*s",
           (int)req->target_len, req->target);
  fx->last_body_len = req->body_len;
  fx->last_body_hash = fnv1a(req->body, req->body_len);
  if (fx->mode == FX_FAIL &&
      (fx->fail_n < 0 || fx->requests <= (unsigned)fx->fail_n)) {
    om_http_header_t h[2] = {{"content-type", "text/plain", 12, 10}};
    size_t n = 1;
    if (fx->retry_after != NULL)
      h[n++] = (om_http_header_t){"retry-after", fx->retry_after, 11, 0};
    om_http_respond(req, fx->fail_status, h, n, "no\n", 3);
    return;
  }
  switch (fx->mode) {
  case FX_UPGRADE:
    if (om_http_request_is_upgrade(req) &&
        !(req->path_len == 6 && memcmp(req->path, "/plain", 6) == 0)) {
      fx_upgrade(fx, req);
      return;
    }
    fx_answer(fx, req, 200);
    return;
  case FX_SLOW:
    pd = fx_slot(fx, req);
    uv_timer_start(&pd->t, on_slow, fx->delay_ms, 0);
    return;
  case FX_RESET:
    om_http_response_abort(req);
    return;
  case FX_STREAM_DIE: {
    static const om_http_header_t h[] = {
        {"content-type", "text/event-stream", 12, 17}};
    pd = fx_slot(fx, req);
    om_http_response_start(req, 200, h, 1);
    om_http_response_write(req, "data: 1\n\n", 9);
    uv_timer_start(&pd->t, on_die, 30, 0);
    return;
  }
  case FX_STREAM_BIG: {
    char cl[32];
    om_http_header_t h[1] = {{"content-length", cl, 14, 0}};
    snprintf(cl, sizeof cl, "%zu", fx->big_total);
    pd = fx_slot(fx, req);
    om_http_response_start(req, 200, h, 1);
    uv_timer_start(&pd->t, on_big, 1, 1);
    return;
  }
  case FX_SSE: {
    static const om_http_header_t h[] = {
        {"content-type", "text/event-stream", 12, 17}};
    pd = fx_slot(fx, req);
    om_http_response_start(req, 200, h, 1);
    uv_timer_start(&pd->t, on_sse, fx->sse_every_ms, fx->sse_every_ms);
    return;
  }
  case FX_CL_STALL: {
    static char bytes[4096];
    char cl[32];
    om_http_header_t h[1] = {{"content-length", cl, 14, 0}};
    OM_ASSERT_CMP(fx->cl_sent, <=, sizeof bytes);
    memset(bytes, 'x', sizeof bytes);
    snprintf(cl, sizeof cl, "%zu", fx->cl_total);
    fx_slot(fx, req); /* held, silent, until the proxy cuts it */
    om_http_response_start(req, fx->cl_status ? fx->cl_status : 200, h, 1);
    om_http_response_write(req, bytes, fx->cl_sent);
    fx->last_write_ms = htc_now_ms();
    return;
  }
  default:
    fx_answer(fx, req, 200);
  }
}

static void fx_closed(om_http_server_t *srv, void *ud) {
  fx_t *fx = ud;
  (void)srv;
  fx->closed = 1;
}

static void fx_timer_closed(uv_handle_t *h) {
  fx_pend_t *pd = h->data;
  pd->fx->timers_open--;
}

static fx_t *fx_new(uv_loop_t *loop, const char *id, fx_mode_t mode) {
  fx_t *fx = calloc(1, sizeof *fx);
  om_http_server_opts_t so = {0};
  assert_non_null(fx);
  fx->loop = loop;
  fx->mode = mode;
  fx->fail_n = -1;
  fx->fail_status = 503;
  fx->delay_ms = 100;
  snprintf(fx->id, sizeof fx->id, "%s", id);
  so.drain_timeout_ms = 200;
  so.max_body_bytes = 64u << 20; /* uploads through the proxy */
  assert_int_equal(om_http_server_new(loop, &so, fx_on_request, fx, &fx->srv),
                   0);
  assert_int_equal(om_http_server_listen(fx->srv, "127.0.0.1", 0), 0);
  fx->port = om_http_server_port(fx->srv);
  snprintf(fx->url, sizeof fx->url, "http://127.0.0.1:%d", fx->port);
  for (int i = 0; i < FX_PEND; i++) {
    uv_timer_init(loop, &fx->pend[i].t);
    fx->pend[i].t.data = &fx->pend[i];
    fx->pend[i].fx = fx;
  }
  fx->timers_open = FX_PEND;
  return fx;
}

static void fx_close(fx_t *fx) {
  for (int i = 0; i < FX_PEND; i++)
    if (fx->pend[i].used && fx->pend[i].req != NULL) {
      om_http_request_t *req = fx->pend[i].req;
      fx_release(&fx->pend[i]);
      om_http_response_abort(req);
    }
  for (int i = 0; i < FX_PEND; i++)
    uv_close((uv_handle_t *)&fx->pend[i].t, fx_timer_closed);
  om_http_server_close(fx->srv, fx_closed);
}

/* ------------------------------------------------------------------ */
/* the environment: a loop, fixtures, a proxy */

#define MAX_FX 8

typedef struct {
  uv_loop_t loop;
  om_proxy_t *proxy;
  int port, admin_port, proxy_closed;
  fx_t *fx[MAX_FX];
  size_t nfx;
} env_t;

static char g_dir[64];

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* A traffic policy file in the test directory: all peers, the given pool
 * settings (a Lua table body, may be ""). */
static const char *policy_file(const char *name, const char *settings) {
  static char path[8][128];
  static int k;
  char text[4096];
  char *p = path[k++ % 8];
  snprintf(p, 128, "%s/%s", g_dir, name);
  snprintf(text, sizeof text,
           "return {\n  kind = \"traffic\",\n"
           "  subset = function(_, peers) return peers end,\n%s\n}\n",
           settings);
  write_file(p, text);
  return p;
}

static void env_init(env_t *e) {
  memset(e, 0, sizeof *e);
  assert_int_equal(uv_loop_init(&e->loop), 0);
}

static fx_t *env_fx(env_t *e, const char *id, fx_mode_t mode) {
  OM_ASSERT_CMP(e->nfx, <, MAX_FX);
  e->fx[e->nfx] = fx_new(&e->loop, id, mode);
  return e->fx[e->nfx++];
}

static void env_proxy(env_t *e, const om_proxy_opts_t *extra,
                      const char *policy) {
  om_proxy_opts_t o;
  char err[1024];
  int rc;
  if (extra != NULL)
    o = *extra;
  else
    memset(&o, 0, sizeof o);
  if (o.policy_path == NULL)
    o.policy_path = policy;
  if (o.seed == 0)
    o.seed = 42;
  if (o.server.drain_timeout_ms == 0)
    o.server.drain_timeout_ms = 500;
  rc = om_proxy_new(&e->loop, &o, &e->proxy, err, sizeof err);
  if (rc != 0)
    fail_msg("om_proxy_new: %s", err);
  assert_int_equal(om_proxy_listen(e->proxy, "127.0.0.1", 0), 0);
  assert_int_equal(om_proxy_listen_admin(e->proxy, "127.0.0.1", 0), 0);
  e->port = om_proxy_port(e->proxy);
  e->admin_port = om_proxy_admin_port(e->proxy);
}

/* A snapshot of service at revision over fixtures fx[0..n). */
static om_snapshot_t *snap_of(const char *service, uint64_t revision, fx_t **fx,
                              size_t n) {
  om_instance_t in[MAX_FX];
  om_kv_t md[MAX_FX];
  char urls[MAX_FX][160];
  om_snapshot_t *s = NULL;
  memset(in, 0, sizeof in);
  for (size_t i = 0; i < n; i++) {
    in[i].id = fx[i]->id;
    snprintf(urls[i], sizeof urls[i], "%s%s", fx[i]->url,
             fx[i]->path ? fx[i]->path : "");
    in[i].url = urls[i];
    in[i].weight = 1;
    in[i].ttl_ms = 10000;
    if (fx[i]->mkey != NULL) {
      md[i].key = (char *)fx[i]->mkey;
      md[i].value = (char *)fx[i]->mval;
      in[i].metadata = &md[i];
      in[i].n_metadata = 1;
    }
  }
  assert_int_equal(
      om_snapshot_new(service, revision, in, n, &s, NULL, NULL, NULL), 0);
  return s;
}

static void env_topology(env_t *e, const char *service, uint64_t revision) {
  om_snapshot_t *s = snap_of(service, revision, e->fx, e->nfx);
  char err[1024];
  int rc = om_proxy_set_snapshot(e->proxy, s, err, sizeof err);
  om_snapshot_unref(s);
  if (rc != 0)
    fail_msg("om_proxy_set_snapshot: %s", err);
}

static void on_proxy_closed(void *ud) {
  *(int *)ud = 1;
}

static void spin(env_t *e, int ms) {
  uint64_t t0 = htc_now_ms();
  while (htc_now_ms() - t0 < (uint64_t)ms)
    htc_step(&e->loop, NULL, 1);
}

static void env_close(env_t *e) {
  uint64_t t0 = htc_now_ms();
  int done;
  if (e->proxy != NULL)
    assert_int_equal(
        om_proxy_close(e->proxy, on_proxy_closed, &e->proxy_closed), 0);
  else
    e->proxy_closed = 1;
  for (size_t i = 0; i < e->nfx; i++)
    fx_close(e->fx[i]);
  do {
    done = e->proxy_closed;
    for (size_t i = 0; i < e->nfx; i++)
      done = done && e->fx[i]->closed && e->fx[i]->timers_open == 0;
    if (!done)
      htc_step(&e->loop, NULL, 1);
  } while (!done && htc_now_ms() - t0 < 10000);
  assert_true(done);
  uv_run(&e->loop, UV_RUN_NOWAIT);
  for (size_t i = 0; i < e->nfx; i++)
    free(e->fx[i]);
  assert_int_equal(uv_loop_close(&e->loop), 0);
}

static unsigned total_requests(const env_t *e) {
  unsigned n = 0;
  for (size_t i = 0; i < e->nfx; i++)
    n += e->fx[i]->requests;
  return n;
}

/* ------------------------------------------------------------------ */
/* clients */

typedef struct {
  int status, complete, eof;
  uint64_t ms;
  char head[512]; /* the first bytes received */
  char peer[64], attempts[16], reason[64];
  char body[1024];
  size_t total;
} res_t;

/* The "reason" member of a JSON error body, or "". */
static void reason_of(const char *body, char *out, size_t cap) {
  json_t *j = json_loads(body, 0, NULL);
  const char *r = j ? json_string_value(json_object_get(j, "reason")) : NULL;
  snprintf(out, cap, "%s", r ? r : "");
  json_decref(j);
}

static void fill_res(res_t *res, const htc_t *c, int n, const htc_resp_t *r,
                     uint64_t t0) {
  memset(res, 0, sizeof *res);
  res->ms = htc_now_ms() - t0;
  res->eof = c->eof;
  res->total = c->total;
  {
    size_t k = c->len < sizeof res->head - 1 ? c->len : sizeof res->head - 1;
    memcpy(res->head, c->buf, k);
    res->head[k] = '\0';
  }
  if (n >= 1) {
    res->complete = 1;
    res->status = r->status;
    htc_header(r, "x-openmesh-peer", res->peer, sizeof res->peer);
    htc_header(r, "x-openmesh-attempts", res->attempts, sizeof res->attempts);
    size_t k = strlen(r->body);
    if (k >= sizeof res->body)
      k = sizeof res->body - 1;
    memcpy(res->body, r->body, k);
    res->body[k] = '\0';
    reason_of(r->body, res->reason, sizeof res->reason);
  } else if (c->len >= 12 && memcmp(c->buf, "HTTP/1.1 ", 9) == 0) {
    res->status = atoi(c->buf + 9); /* a head arrived, the body did not end */
  }
}

static htc_resp_t g_r;

/*
 * One request on a fresh connection: "METHOD path", Host service, extra
 * raw header lines, a body. Waits up to 5 s.
 */
static void call(env_t *e, const char *method, const char *service,
                 const char *path, const char *extra, const char *body,
                 res_t *res) {
  char req[8192];
  size_t blen = body ? strlen(body) : 0;
  uint64_t t0 = htc_now_ms();
  htc_t *c = htc_new("127.0.0.1", e->port);
  int n = 0;
  assert_non_null(c);
  char cl[48] = "";
  if (body != NULL)
    snprintf(cl, sizeof cl, "Content-Length: %zu\r\n", blen);
  snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: %s:7601\r\n%s%s\r\n%s",
           method, path, service, extra ? extra : "", cl, body ? body : "");
  assert_int_equal(htc_sends(&e->loop, c, req), 0);
  while (htc_now_ms() - t0 < 5000) {
    htc_step(&e->loop, c, 1);
    n = htc_responses(c, NULL, &g_r, 1);
    if (n != 0 || c->eof)
      break;
  }
  if (n == 0)
    n = htc_responses(c, NULL, &g_r, 1);
  fill_res(res, c, n, &g_r, t0);
  htc_free(c);
}

static void get(env_t *e, const char *service, const char *extra, res_t *res) {
  call(e, "GET", service, "/", extra, NULL, res);
}

/* An admin GET; the body (malloc'd, NUL-ended) and status. */
static char *admin_get(env_t *e, const char *path, int *status) {
  char req[256];
  htc_t *c = htc_new("127.0.0.1", e->admin_port);
  uint64_t t0 = htc_now_ms();
  char *out = NULL;
  const char *end;
  assert_non_null(c);
  snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: admin\r\n\r\n", path);
  assert_int_equal(htc_sends(&e->loop, c, req), 0);
  while (htc_now_ms() - t0 < 5000 && htc_responses(c, NULL, &g_r, 1) == 0)
    htc_step(&e->loop, c, 1);
  assert_int_equal(htc_responses(c, NULL, &g_r, 1), 1);
  *status = g_r.status;
  end = c->buf + g_r.wire_len;
  out = malloc((size_t)(end - (g_r.head + g_r.head_len)) + 1);
  assert_non_null(out);
  memcpy(out, g_r.head + g_r.head_len,
         (size_t)(end - (g_r.head + g_r.head_len)));
  out[end - (g_r.head + g_r.head_len)] = '\0';
  htc_free(c);
  return out;
}

/* ------------------------------------------------------------------ */
/* concurrent clients */

typedef struct {
  htc_t *c;
  int done;
  res_t res;
  uint64_t t0;
} cli_t;

/* n one-shot GETs at once; waits until every one answered or ms passed. */
static void burst(env_t *e, const char *service, const char *extra, cli_t *cl,
                  int n, int ms, uint32_t *max_inflight, uint32_t *max_queued) {
  char req[1024];
  struct pollfd pf[128];
  uint64_t t0 = htc_now_ms();
  int left = n;
  OM_ASSERT_CMP(n, <=, 128);
  snprintf(req, sizeof req, "GET / HTTP/1.1\r\nHost: %s\r\n%s\r\n", service,
           extra ? extra : "");
  for (int i = 0; i < n; i++) {
    cl[i].c = htc_new("127.0.0.1", e->port);
    assert_non_null(cl[i].c);
    cl[i].done = 0;
    cl[i].t0 = htc_now_ms();
    assert_int_equal(htc_sends(&e->loop, cl[i].c, req), 0);
  }
  while (left > 0 && htc_now_ms() - t0 < (uint64_t)ms) {
    om_proxy_stats_t st;
    uv_run(&e->loop, UV_RUN_NOWAIT);
    if (max_inflight != NULL && om_proxy_stats(e->proxy, service, &st) == 0) {
      if (st.inflight > *max_inflight)
        *max_inflight = st.inflight;
      if (st.queued > *max_queued)
        *max_queued = st.queued;
    }
    for (int i = 0; i < n; i++)
      pf[i] = (struct pollfd){cl[i].c->fd, POLLIN, 0};
    poll(pf, (nfds_t)n, 1);
    for (int i = 0; i < n; i++) {
      int k;
      if (cl[i].done)
        continue;
      htc_read(cl[i].c);
      k = htc_responses(cl[i].c, NULL, &g_r, 1);
      if (k != 0 || cl[i].c->eof) {
        fill_res(&cl[i].res, cl[i].c, k, &g_r, cl[i].t0);
        cl[i].done = 1;
        left--;
      }
    }
  }
  for (int i = 0; i < n; i++) {
    if (!cl[i].done)
      fill_res(&cl[i].res, cl[i].c, 0, &g_r, cl[i].t0);
    htc_free(cl[i].c);
  }
}

/* ------------------------------------------------------------------ */
/* the static topology file */

static void static_file_is_validated_with_named_fields(void **state) {
  static const struct {
    const char *doc, *msg;
    int rc;
  } bad[] = {
      {"{", "invalid JSON", OM_EPARSE},
      {"[]", "must be an object", OM_EINVAL},
      {"{\"services\": {}}", "services: required", OM_EINVAL},
      {"{\"servics\": {}}", "servics: unknown field", OM_EINVAL},
      {"{\"services\": {\"a b\": {\"instances\": []}}}",
       "services.a b: not a valid service name", OM_EINVAL},
      {"{\"services\": {\"o\": {}}}", "services.o.instances: required",
       OM_EINVAL},
      {"{\"services\": {\"o\": {\"revision\": 0, \"instances\": []}}}",
       "services.o.revision: must be an integer >= 1", OM_EINVAL},
      {"{\"services\": {\"o\": {\"instances\": [{\"id\": \"a\"}]}}}",
       "services.o.instances[0].url: required", OM_EINVAL},
      {"{\"services\": {\"o\": {\"instances\": [{\"id\": \"a\", \"url\": "
       "\"http://127.0.0.1:1\", \"ttl\": 1}]}}}",
       "services.o.instances[0].ttl: unknown field", OM_EINVAL},
      {"{\"services\": {\"o\": {\"instances\": [{\"id\": \"a\", \"url\": "
       "\"ftp://x\"}]}}}",
       "services.o.instances[0].url: ", OM_EINVAL},
      {"{\"services\": {\"o\": {\"instances\": [{\"id\": \"a\", \"url\": "
       "\"http://999.1.1.1:1\"}]}}}",
       "services.o.instances[0].url: has an IPv4 literal out of range",
       OM_EINVAL},
      {"{\"services\": {\"o\": {\"instances\": [{\"id\": \"a\", \"url\": "
       "\"https://127.0.0.1:1/?q\"}]}}}",
       "services.o.instances[0].url: must not carry a query", OM_EINVAL},
      {"{\"services\": {\"o\": {\"instances\": [{\"id\": \"a\", \"url\": "
       "\"http://127.0.0.1:1\", \"weight\": -1}]}}}",
       "services.o.instances[0].weight: ", OM_EINVAL},
      {"{\"services\": {\"o\": {\"instances\": [{\"id\": \"a\", \"url\": "
       "\"http://127.0.0.1:1\"}, {\"id\": \"a\", \"url\": "
       "\"http://127.0.0.1:2\"}]}}}",
       "services.o.instances[1].id: duplicate id", OM_EDUPLICATE},
      {"{\"services\": {\"o\": {\"instances\": [{\"id\": \"a\", \"url\": "
       "\"http://127.0.0.1:1\", \"metadata\": {\"v\": 2}}]}}}",
       "services.o.instances[0].metadata.v: must be a string", OM_EINVAL},
  };
  static const char good[] =
      "{\"services\": {\"orders\": {\"revision\": 7, \"instances\": ["
      "{\"id\": \"b\", \"url\": \"http://127.0.0.1:9002/api\", \"weight\": 2,"
      " \"zone\": \"z1\", \"metadata\": {\"version\": \"v2\"}},"
      "{\"id\": \"a\", \"url\": \"http://[::1]:9001\"}]},"
      " \"users\": {\"instances\": []}}}";
  om_snapshot_t **snaps = NULL;
  size_t n = 0;
  char err[512], path[128];
  (void)state;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = om_proxy_static_parse(bad[i].doc, strlen(bad[i].doc), &snaps, &n,
                                   err, sizeof err);
    if (rc != bad[i].rc || strstr(err, bad[i].msg) == NULL)
      fail_msg("doc %zu: rc %d (want %d), err '%s' (want '%s')", i, rc,
               bad[i].rc, err, bad[i].msg);
  }
  assert_int_equal(
      om_proxy_static_parse(good, strlen(good), &snaps, &n, err, sizeof err),
      0);
  assert_int_equal(n, 2);
  assert_string_equal(om_snapshot_service(snaps[0]), "orders");
  assert_int_equal(om_snapshot_revision(snaps[0]), 7);
  assert_int_equal(om_snapshot_count(snaps[0]), 2);
  assert_string_equal(om_snapshot_instance(snaps[0], 0)->id, "a");
  OM_ASSERT_CMP(om_snapshot_instance(snaps[0], 1)->weight, ==, 2.0);
  assert_string_equal(om_snapshot_instance(snaps[0], 1)->metadata[0].value,
                      "v2");
  assert_int_equal(om_snapshot_revision(snaps[1]), 1);
  assert_int_equal(om_snapshot_count(snaps[1]), 0);
  om_proxy_static_free(snaps, n);
  /* from a file; a missing file */
  snprintf(path, sizeof path, "%s/static.json", g_dir);
  write_file(path, good);
  assert_int_equal(om_proxy_static_load(path, &snaps, &n, err, sizeof err), 0);
  om_proxy_static_free(snaps, n);
  assert_int_equal(
      om_proxy_static_load("/nonexistent/x.json", &snaps, &n, err, sizeof err),
      OM_ENOTFOUND);
  /* allocation failures: OM_ENOMEM, nothing leaked, then success */
  for (long k = 0;; k++) {
    int rc;
    om_test_fail_alloc_after(k);
    rc = om_proxy_static_parse(good, strlen(good), &snaps, &n, err, sizeof err);
    om_test_alloc_reset();
    if (rc == 0) {
      om_proxy_static_free(snaps, n);
      break;
    }
    assert_int_equal(rc, OM_ENOMEM);
  }
}

/* ------------------------------------------------------------------ */
/* proxy lifecycle and the snapshot seam */

static void on_nothing(void *ud) {
  *(int *)ud = 1;
}

static void new_validates_and_survives_no_memory(void **state) {
  uv_loop_t loop;
  om_proxy_opts_t o;
  om_proxy_service_policy_t sp = {"orders", "/nonexistent.lua"};
  om_proxy_t *p = NULL;
  char err[512];
  int closed = 0;
  (void)state;
  assert_int_equal(uv_loop_init(&loop), 0);
  memset(&o, 0, sizeof o);
  assert_int_equal(om_proxy_new(&loop, &o, &p, err, sizeof err), OM_EINVAL);
  o.policy_path = "/nonexistent/traffic.lua";
  assert_int_equal(om_proxy_new(&loop, &o, &p, err, sizeof err), OM_ENOTFOUND);
  assert_non_null(strstr(err, "/nonexistent/traffic.lua"));
  o.policy_path = policy_file("all.lua", "");
  o.service_policies = &sp;
  o.n_service_policies = 1;
  assert_int_equal(om_proxy_new(&loop, &o, &p, err, sizeof err), OM_ENOTFOUND);
  o.n_service_policies = 0;
  for (long k = 0;; k++) {
    int rc;
    om_test_fail_alloc_after(k);
    rc = om_proxy_new(&loop, &o, &p, err, sizeof err);
    om_test_alloc_reset();
    uv_run(&loop, UV_RUN_DEFAULT); /* handles opened before the failure */
    if (rc == 0)
      break;
    assert_int_equal(rc, OM_ENOMEM);
  }
  assert_int_equal(om_proxy_close(p, on_nothing, &closed), 0);
  assert_int_equal(om_proxy_close(p, NULL, NULL), OM_ESTATE);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_true(closed);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void
snapshot_seam_keeps_peer_state_and_refuses_bad_updates(void **state) {
  env_t e;
  fx_t *a, *b, *c;
  om_snapshot_t *s;
  om_proxy_stats_t st;
  om_circuit_state_t cs;
  om_circuit_opts_t co;
  om_proxy_opts_t o;
  res_t r;
  char err[512];
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_FAIL);
  b = env_fx(&e, "b", FX_FAIL);
  c = env_fx(&e, "c", FX_OK);
  memset(&o, 0, sizeof o);
  om_circuit_opts_default(&co);
  co.failures = 1; /* one failure opens a circuit */
  o.circuit = &co;
  env_proxy(&e, &o, policy_file("seam.lua", "retries = 0,"));
  {
    fx_t *two[] = {a, b};
    s = snap_of("orders", 5, two, 2);
    assert_int_equal(om_proxy_set_snapshot(e.proxy, s, err, sizeof err), 0);
    om_snapshot_unref(s);
  }
  assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
  assert_int_equal(st.revision, 5);
  assert_int_equal(st.peers, 2);
  assert_int_equal(st.policy_version, 1);
  assert_int_equal(om_proxy_stats(e.proxy, "users", &st), OM_ENOTFOUND);
  /* both fail once: both circuits open */
  get(&e, "orders", NULL, &r);
  get(&e, "orders", NULL, &r);
  assert_int_equal(a->requests + b->requests, 2);
  assert_int_equal(om_proxy_peer_circuit(e.proxy, "orders", "a", &cs), 0);
  assert_int_equal(cs, OM_CIRCUIT_OPEN);
  get(&e, "orders", NULL, &r);
  assert_int_equal(r.status, 503);
  assert_string_equal(r.reason, "all_circuits_open");
  assert_int_equal(a->requests + b->requests, 2);
  /* revision 6 adds c and keeps a and b (same URLs): their circuits stay */
  {
    fx_t *three[] = {a, b, c};
    s = snap_of("orders", 6, three, 3);
    assert_int_equal(om_proxy_set_snapshot(e.proxy, s, err, sizeof err), 0);
    om_snapshot_unref(s);
  }
  assert_int_equal(om_proxy_peer_circuit(e.proxy, "orders", "a", &cs), 0);
  assert_int_equal(cs, OM_CIRCUIT_OPEN);
  assert_int_equal(om_proxy_peer_circuit(e.proxy, "orders", "c", &cs), 0);
  assert_int_equal(cs, OM_CIRCUIT_CLOSED);
  get(&e, "orders", NULL, &r);
  assert_int_equal(r.status, 200);
  assert_string_equal(r.peer, "c");
  /* an older revision is refused, the same one is a no-op */
  {
    fx_t *one[] = {c};
    s = snap_of("orders", 5, one, 1);
    assert_int_equal(om_proxy_set_snapshot(e.proxy, s, err, sizeof err),
                     OM_ESTATE);
    assert_non_null(strstr(err, "older"));
    om_snapshot_unref(s);
    s = snap_of("orders", 6, one, 1);
    assert_int_equal(om_proxy_set_snapshot(e.proxy, s, err, sizeof err), 0);
    om_snapshot_unref(s);
  }
  assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
  assert_int_equal(st.peers, 3);
  /* a name or https: whatever the registry accepts, the proxy takes (the
   * one URL rule); such a peer is unresolved or unusable, not refused */
  {
    om_instance_t in[2] = {{0}, {0}};
    in[0].id = "x";
    in[0].url = "http://localhost:1";
    in[1].id = "y";
    in[1].url = "https://127.0.0.1:1";
    in[0].weight = in[1].weight = 1;
    in[0].ttl_ms = in[1].ttl_ms = 10000;
    assert_int_equal(om_snapshot_new("orders", 9, in, 2, &s, NULL, NULL, NULL),
                     0);
    assert_int_equal(om_proxy_check_snapshot(e.proxy, s, err, sizeof err), 0);
    om_snapshot_unref(s);
  }
  /* a peer whose URL changed is a new peer: fresh circuit */
  {
    fx_t *three[] = {a, b, c};
    a->path = "/v2";
    s = snap_of("orders", 7, three, 3);
    a->path = NULL;
    for (long k = 0;; k++) {
      int rc;
      om_test_fail_alloc_after(k);
      rc = om_proxy_set_snapshot(e.proxy, s, err, sizeof err);
      om_test_alloc_reset();
      if (rc == 0)
        break;
      assert_int_equal(rc, OM_ENOMEM);
      assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
      assert_int_equal(st.revision, 6); /* nothing changed */
      assert_int_equal(om_proxy_peer_circuit(e.proxy, "orders", "a", &cs), 0);
      assert_int_equal(cs, OM_CIRCUIT_OPEN);
    }
    om_snapshot_unref(s);
  }
  assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
  assert_int_equal(st.revision, 7);
  assert_int_equal(om_proxy_peer_circuit(e.proxy, "orders", "a", &cs), 0);
  assert_int_equal(cs, OM_CIRCUIT_CLOSED);
  assert_int_equal(om_proxy_peer_circuit(e.proxy, "orders", "b", &cs), 0);
  assert_int_equal(cs, OM_CIRCUIT_OPEN);
  env_close(&e);
}

/* ------------------------------------------------------------------ */
/* forwarding */

static void forwards_with_headers_and_relays_the_response(void **state) {
  env_t e;
  fx_t *a;
  res_t r;
  char v[64];
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_OK);
  a->path = "/api/";
  env_proxy(&e, NULL, policy_file("all.lua", ""));
  env_topology(&e, "orders", 1);
  call(&e, "GET", "orders", "/x?y=1",
       "Connection: x-hop\r\nx-hop: 1\r\nfoo: bar\r\n"
       "X-Forwarded-For: 10.0.0.1\r\nx-openmesh-attempt: 9\r\n",
       NULL, &r);
  assert_int_equal(r.status, 200);
  assert_string_equal(r.body, "a\n");
  assert_string_equal(r.peer, "a");
  assert_string_equal(r.attempts, "1");
  assert_string_equal(a->last_target, "/api/x?y=1");
  assert_string_equal(a->last_foo, "bar");
  assert_string_equal(a->last_hop, ""); /* named in Connection: hop-by-hop */
  assert_string_equal(a->last_xff, "10.0.0.1, 127.0.0.1");
  assert_string_equal(a->last_attempt, ""); /* the caller's 9 dropped; a
                                                first attempt says none */
  assert_string_equal(a->last_host, "orders:7601");
  assert_string_equal(a->last_via, "1.1 openmesh");
  assert_int_equal(strlen(a->last_rid), 32); /* generated */
  /* the policy's 10 s, less what the proxy spent before forwarding (at most
   * 1 s, even sanitized on a loaded machine) */
  assert_in_range(atoi(a->last_deadline), 9001, 10000);
  /* a caller's request id is kept; its deadline is forwarded as what is
   * left */
  call(&e, "POST", "ORDERS", "/p",
       "x-request-id: abc\r\n"
       "x-openmesh-deadline-ms: 2000\r\n",
       "hello", &r);
  assert_int_equal(r.status, 200);
  assert_string_equal(a->last_rid, "abc");
  assert_int_equal(a->last_body_len, 5);
  /* the caller's 2 s less at most 1 s spent here: what is left, never more
   * than the caller gave, nor the policy's 10 s */
  assert_in_range(atoi(a->last_deadline), 1001, 2000);
  assert_int_equal(a->posts, 1);
  /* unknown service, and a Host-less HTTP/1.0 request */
  get(&e, "nope", NULL, &r);
  assert_int_equal(r.status, 503);
  assert_string_equal(r.reason, "no_peers");
  assert_non_null(strstr(r.body, "nope"));
  (void)v;
  env_close(&e);
}

static void empty_subset_and_empty_service_are_no_peers(void **state) {
  env_t e;
  fx_t *a;
  res_t r;
  om_snapshot_t *s;
  char err[256];
  const char *pol;
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_OK);
  pol = policy_file("none.lua", "");
  {
    /* a policy that keeps nobody */
    char text[256];
    snprintf(text, sizeof text,
             "return { kind = \"traffic\", subset = function() return {} end "
             "}\n");
    write_file(pol, text);
  }
  env_proxy(&e, NULL, pol);
  env_topology(&e, "orders", 1);
  get(&e, "orders", NULL, &r);
  assert_int_equal(r.status, 503);
  assert_string_equal(r.reason, "no_peers");
  assert_int_equal(a->requests, 0);
  assert_int_equal(om_snapshot_new("empty", 1, NULL, 0, &s, NULL, NULL, NULL),
                   0);
  assert_int_equal(om_proxy_set_snapshot(e.proxy, s, err, sizeof err), 0);
  om_snapshot_unref(s);
  get(&e, "empty", NULL, &r);
  assert_int_equal(r.status, 503);
  assert_string_equal(r.reason, "no_peers");
  env_close(&e);
}

/* ------------------------------------------------------------------ */
/* selection */

static void keyed_affinity_holds_across_calls(void **state) {
  env_t e;
  res_t r;
  char first[20][64], extra[64];
  int used[3] = {0, 0, 0};
  (void)state;
  env_init(&e);
  env_fx(&e, "p1", FX_OK);
  env_fx(&e, "p2", FX_OK);
  env_fx(&e, "p3", FX_OK);
  env_proxy(&e, NULL, policy_file("all.lua", ""));
  env_topology(&e, "orders", 1);
  for (int round = 0; round < 3; round++)
    for (int k = 0; k < 20; k++) {
      snprintf(extra, sizeof extra, "x-openmesh-key: user-%d\r\n", k);
      get(&e, "orders", extra, &r);
      assert_int_equal(r.status, 200);
      if (round == 0) {
        snprintf(first[k], sizeof first[k], "%s", r.peer);
        used[r.peer[1] - '1'] = 1;
      } else if (strcmp(first[k], r.peer) != 0) {
        fail_msg("key user-%d went to %s, then to %s", k, first[k], r.peer);
      }
    }
  /* 20 keys over 3 equal peers: every peer owns some */
  assert_true(used[0] && used[1] && used[2]);
  /* the same keys after a revision that keeps the peers: same owners */
  env_topology(&e, "orders", 2);
  for (int k = 0; k < 20; k++) {
    snprintf(extra, sizeof extra, "x-openmesh-key: user-%d\r\n", k);
    get(&e, "orders", extra, &r);
    assert_string_equal(r.peer, first[k]);
  }
  env_close(&e);
}

/* Keep-alive clients issuing requests back to back until total answered. */
static void load(env_t *e, int nclients, int total, unsigned *by_peer,
                 const char **ids, int nids) {
  static const char req[] = "GET / HTTP/1.1\r\nHost: orders\r\n\r\n";
  htc_t *c[16];
  struct pollfd pf[16];
  int sent = 0, answered = 0, inflight[16] = {0};
  uint64_t t0 = htc_now_ms();
  for (int i = 0; i < nclients; i++) {
    c[i] = htc_new("127.0.0.1", e->port);
    assert_non_null(c[i]);
  }
  while (answered < total && htc_now_ms() - t0 < 20000) {
    for (int i = 0; i < nclients; i++)
      if (!inflight[i] && sent < total) {
        assert_int_equal(htc_sends(&e->loop, c[i], req), 0);
        inflight[i] = 1;
        sent++;
      }
    uv_run(&e->loop, UV_RUN_NOWAIT);
    for (int i = 0; i < nclients; i++)
      pf[i] = (struct pollfd){c[i]->fd, POLLIN, 0};
    poll(pf, (nfds_t)nclients, 1);
    for (int i = 0; i < nclients; i++) {
      char peer[64];
      htc_read(c[i]);
      if (inflight[i] && htc_responses(c[i], NULL, &g_r, 1) == 1) {
        assert_int_equal(g_r.status, 200);
        htc_header(&g_r, "x-openmesh-peer", peer, sizeof peer);
        for (int k = 0; k < nids; k++)
          if (strcmp(peer, ids[k]) == 0)
            by_peer[k]++;
        c[i]->len = 0; /* one response at a time: consume it */
        inflight[i] = 0;
        answered++;
      }
    }
  }
  assert_int_equal(answered, total);
  for (int i = 0; i < nclients; i++)
    htc_free(c[i]);
}

static void unkeyed_load_spreads_by_load(void **state) {
  env_t e;
  fx_t *slow;
  unsigned by_peer[3] = {0, 0, 0};
  const char *ids[] = {"fast-1", "fast-2", "slow"};
  (void)state;
  env_init(&e);
  env_fx(&e, "fast-1", FX_OK);
  env_fx(&e, "fast-2", FX_OK);
  slow = env_fx(&e, "slow", FX_SLOW);
  slow->delay_ms = 40;
  env_proxy(&e, NULL, policy_file("all.lua", ""));
  env_topology(&e, "orders", 1);
  load(&e, 6, 180, by_peer, ids, 3);
  OM_TEST_NOTE("P2C shares: fast-1 %u, fast-2 %u, slow %u", by_peer[0],
               by_peer[1], by_peer[2]);
  assert_int_equal(by_peer[0] + by_peer[1] + by_peer[2], 180);
  /* the slow peer gets far fewer calls than either fast one */
  OM_ASSERT_CMP(by_peer[2] * 4, <, by_peer[0]);
  OM_ASSERT_CMP(by_peer[2] * 4, <, by_peer[1]);
  assert_int_equal(slow->requests, by_peer[2]);
  env_close(&e);
}

static void adaptive_pool_stays_within_max_inflight(void **state) {
  env_t e;
  om_proxy_stats_t st;
  unsigned by_peer[2] = {0, 0};
  const char *ids[] = {"a", "b"};
  (void)state;
  env_init(&e);
  env_fx(&e, "a", FX_OK);
  env_fx(&e, "b", FX_OK);
  env_proxy(&e, NULL,
            policy_file("adaptive.lua", "adaptive = true, max_inflight = 10,"));
  env_topology(&e, "orders", 1);
  assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
  assert_int_equal(st.limit, 10); /* starts at the policy's ceiling */
  load(&e, 4, 120, by_peer, ids, 2);
  assert_int_equal(by_peer[0] + by_peer[1], 120);
  assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
  assert_in_range(st.limit, 1, 10);
  assert_int_equal(st.inflight, 0);
  env_close(&e);
}

static void canary_never_reaches_unmatched_requests(void **state) {
  env_t e;
  fx_t *a, *b, *v2;
  res_t r;
  char path[256];
  om_proxy_opts_t o;
  om_circuit_opts_t co;
  (void)state;
  env_init(&e);
  a = env_fx(&e, "v1-a", FX_OK);
  b = env_fx(&e, "v1-b", FX_OK);
  v2 = env_fx(&e, "v2-a", FX_OK);
  a->mkey = b->mkey = v2->mkey = "version";
  a->mval = b->mval = "v1";
  v2->mval = "v2";
  snprintf(path, sizeof path, "%s/examples/policies/canary.lua", OM_SOURCE_DIR);
  memset(&o, 0, sizeof o);
  om_circuit_opts_default(&co);
  co.cooldown_ns = UINT64_C(50000000); /* circuits reopen to probes often */
  o.circuit = &co;
  env_proxy(&e, &o, path);
  env_topology(&e, "orders", 1);
  for (int i = 0; i < 30; i++) {
    get(&e, "orders", i % 2 ? "x-user: user-1\r\n" : NULL, &r);
    assert_int_equal(r.status, 200);
  }
  assert_int_equal(v2->requests, 0);
  /* every stable peer failing: retries stay among them, never v2 */
  a->mode = b->mode = FX_FAIL;
  for (int i = 0; i < 40; i++) {
    get(&e, "orders", i % 2 ? "x-user: user-1\r\n" : "Cookie: user=user-1\r\n",
        &r);
    OM_ASSERT_CMP(r.status, ==, 503);
    if (strcmp(r.reason, "all_circuits_open") != 0)
      assert_string_equal(r.body, "no\n");
    if (i % 10 == 9)
      spin(&e, 60); /* let the circuits half-open: probes go to v1 too */
  }
  assert_int_equal(v2->requests, 0);
  OM_ASSERT_CMP(a->requests + b->requests, >, 30);
  /* a canary user does reach v2 */
  get(&e, "orders", "x-user: user-57\r\n", &r);
  assert_int_equal(r.status, 200);
  assert_string_equal(r.peer, "v2-a");
  assert_int_equal(v2->requests, 1);
  env_close(&e);
}

/*
 * A new revision gives the policy its peers again, keeping the Lua tables
 * of unchanged instances (om_proxy_view.c): what changed must show (a
 * peer whose metadata moved is routed on its new value) and what did not
 * must still be a table the policy may return.
 */
static void policy_sees_each_revision_of_its_peers(void **state) {
  env_t e;
  fx_t *a, *b, *c;
  res_t r;
  char path[256], key[64];
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_OK);
  b = env_fx(&e, "b", FX_OK);
  c = env_fx(&e, "c", FX_OK);
  a->mkey = b->mkey = c->mkey = "version";
  a->mval = "v2";
  b->mval = c->mval = "v1";
  snprintf(path, sizeof path, "%s/by_version.lua", g_dir);
  write_file(path, "return { kind = \"traffic\", vary = {},\n"
                   "  subset = function(_, peers)\n"
                   "    local out = {}\n"
                   "    for _, p in ipairs(peers) do\n"
                   "      if p.metadata.version == 'v2' then\n"
                   "        out[#out + 1] = p\n"
                   "      end\n"
                   "    end\n"
                   "    return out\n"
                   "  end }\n");
  env_proxy(&e, NULL, path);
  env_topology(&e, "orders", 1);
  for (int i = 0; i < 4; i++) {
    get(&e, "orders", NULL, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.peer, "a");
  }
  /* b moves to v2, a and c stay: a's table is kept, b's is new */
  b->mval = "v2";
  env_topology(&e, "orders", 2);
  a->requests = b->requests = 0;
  for (int i = 0; i < 40; i++) {
    snprintf(key, sizeof key, "x-openmesh-key: k%d\r\n", i);
    get(&e, "orders", key, &r); /* keyed: spread over the subset */
    assert_int_equal(r.status, 200);
  }
  OM_ASSERT_CMP(a->requests, >, 0);
  OM_ASSERT_CMP(b->requests, >, 0);
  assert_int_equal(c->requests, 0);
  /* a leaves v2, c joins: only b and c */
  a->mval = "v1";
  c->mval = "v2";
  env_topology(&e, "orders", 3);
  a->requests = b->requests = c->requests = 0;
  for (int i = 0; i < 40; i++) {
    snprintf(key, sizeof key, "x-openmesh-key: k%d\r\n", i);
    get(&e, "orders", key, &r); /* keyed: spread over the subset */
    assert_int_equal(r.status, 200);
  }
  assert_int_equal(a->requests, 0);
  OM_ASSERT_CMP(b->requests, >, 0);
  OM_ASSERT_CMP(c->requests, >, 0);
  env_close(&e);
}

/* ------------------------------------------------------------------ */
/* deadlines and admission */

static void deadline_bounds_total_latency(void **state) {
  env_t e;
  res_t r;
  (void)state;
  env_init(&e);
  for (int i = 0; i < 4; i++) {
    char id[8];
    fx_t *h;
    snprintf(id, sizeof id, "h%d", i);
    h = env_fx(&e, id, FX_SLOW);
    h->delay_ms = 5000; /* never in time */
  }
  env_proxy(&e, NULL,
            policy_file("deadline.lua", "per_try_timeout_ms = 100, retries = 5,"
                                        " deadline_ms = 10000,"));
  env_topology(&e, "orders", 1);
  get(&e, "orders", "x-openmesh-deadline-ms: 300\r\n", &r);
  OM_TEST_NOTE("300 ms deadline: answered after %llu ms, %s attempts",
               (unsigned long long)r.ms, r.attempts);
  assert_int_equal(r.status, 504);
  assert_string_equal(r.reason, "deadline_exceeded");
  /* Not before the 300 ms (the 30 ms below it are the proxy's cached loop
   * clock and ms rounding): a deadline that fires early is a bug. The upper
   * bound only says the reply did not wait for a 5 s peer; that the
   * deadline, not the retries, ended the call is what the reason above
   * proves, so the bound leaves a sanitized build on a loaded machine
   * room. */
  OM_ASSERT_CMP(r.ms, >=, 270);
  OM_ASSERT_CMP(r.ms, <, 1000);
  /* attempts at 0, ~100, ~200 (+ backoff), the last cut by the deadline */
  assert_in_range(total_requests(&e), 3, 4);
  assert_in_range(atoi(r.attempts), 3, 4);
  /* A malformed deadline header is ignored: the policy's 10 s applies. So
   * the call is not cut at 300 ms, as a lenient parse of "300ms" would cut
   * it, but ends when the retries (and their budget) run out; and every
   * attempt carries what is left of the policy's 10 s, where no deadline at
   * all would forward none (the proxy spends well under 5 s before the last
   * attempt, even sanitized on a loaded machine). */
  for (size_t i = 0; i < e.nfx; i++)
    e.fx[i]->last_deadline[0] = '\0';
  {
    unsigned seen = 0;
    get(&e, "orders", "x-openmesh-deadline-ms: 300ms\r\n", &r);
    OM_TEST_NOTE("malformed deadline: answered after %llu ms, %s attempts, %s",
                 (unsigned long long)r.ms, r.attempts, r.reason);
    assert_string_not_equal(r.reason, "deadline_exceeded");
    for (size_t i = 0; i < e.nfx; i++) {
      if (e.fx[i]->last_deadline[0] == '\0')
        continue;
      seen++;
      assert_in_range(atoi(e.fx[i]->last_deadline), 5001, 10000);
    }
    OM_ASSERT_CMP(seen, >, 0);
  }
  env_close(&e);
}

static void expired_in_queue_never_reaches_upstream(void **state) {
  env_t e;
  fx_t *s;
  cli_t cl[1];
  res_t r;
  char req[128];
  htc_t *first;
  uint64_t t0;
  (void)state;
  env_init(&e);
  s = env_fx(&e, "s", FX_SLOW);
  s->delay_ms = 400;
  env_proxy(&e, NULL,
            policy_file("queue.lua", "max_inflight = 1, max_queue = 4,"));
  env_topology(&e, "orders", 1);
  /* the first call holds the only slot for 400 ms */
  first = htc_new("127.0.0.1", e.port);
  snprintf(req, sizeof req, "GET / HTTP/1.1\r\nHost: orders\r\n\r\n");
  assert_int_equal(htc_sends(&e.loop, first, req), 0);
  t0 = htc_now_ms();
  while (s->requests == 0 && htc_now_ms() - t0 < 2000)
    htc_step(&e.loop, first, 1);
  assert_int_equal(s->requests, 1);
  /* a call with 100 ms waits in the queue and expires there */
  get(&e, "orders", "x-openmesh-deadline-ms: 100\r\n", &r);
  OM_TEST_NOTE("expired in the queue after %llu ms", (unsigned long long)r.ms);
  assert_int_equal(r.status, 504);
  assert_string_equal(r.reason, "deadline_exceeded");
  /* Not before its 100 ms (10 ms for the cached loop clock): early expiry
   * is a bug. Under the 400 ms at which the slot frees: it was answered by
   * its own deadline in the queue, not when it reached the front. */
  OM_ASSERT_CMP(r.ms, >=, 90);
  OM_ASSERT_CMP(r.ms, <, 350);
  assert_int_equal(s->requests, 1); /* no upstream request started */
  /* a zero deadline: refused before the queue */
  get(&e, "orders", "x-openmesh-deadline-ms: 0\r\n", &r);
  assert_int_equal(r.status, 504);
  assert_int_equal(s->requests, 1);
  /* the first call still completes */
  t0 = htc_now_ms();
  while (htc_responses(first, NULL, &g_r, 1) == 0 && htc_now_ms() - t0 < 2000)
    htc_step(&e.loop, first, 1);
  assert_int_equal(g_r.status, 200);
  htc_free(first);
  (void)cl;
  env_close(&e);
}

static void overload_fails_fast_with_bounded_state(void **state) {
  env_t e;
  fx_t *s;
  static cli_t cl[40];
  uint32_t max_inflight = 0, max_queued = 0;
  int ok = 0, overloaded = 0;
  uint64_t slowest_reject = 0;
  (void)state;
  env_init(&e);
  s = env_fx(&e, "s", FX_SLOW);
  s->delay_ms = 300;
  env_proxy(&e, NULL,
            policy_file("tight.lua", "max_inflight = 2, max_queue = 2,"));
  env_topology(&e, "orders", 1);
  /* 10x beyond max_inflight + max_queue */
  burst(&e, "orders", NULL, cl, 40, 5000, &max_inflight, &max_queued);
  for (int i = 0; i < 40; i++) {
    if (cl[i].res.status == 200) {
      ok++;
    } else {
      assert_int_equal(cl[i].res.status, 503);
      assert_string_equal(cl[i].res.reason, "overloaded");
      overloaded++;
      if (cl[i].res.ms > slowest_reject)
        slowest_reject = cl[i].res.ms;
    }
  }
  OM_TEST_NOTE("overload: %d ok, %d overloaded (slowest refusal %llu ms), "
               "peak inflight %u queued %u",
               ok, overloaded, (unsigned long long)slowest_reject, max_inflight,
               max_queued);
  assert_int_equal(ok, 4);
  assert_int_equal(overloaded, 36);
  /* before the first slot frees (the peer answers after 300 ms): rejected
   * at admission, not after a wait */
  OM_ASSERT_CMP(slowest_reject, <, 300);
  OM_ASSERT_CMP(max_inflight, <=, 2);
  OM_ASSERT_CMP(max_queued, <=, 2);
  assert_int_equal(s->requests, 4);
  env_close(&e);
}

/* ------------------------------------------------------------------ */
/* retries */

static void post_is_retried_only_with_idempotency_key(void **state) {
  env_t e;
  fx_t *a, *b;
  res_t r;
  om_proxy_stats_t st;
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_FAIL);
  b = env_fx(&e, "b", FX_FAIL);
  env_proxy(&e, NULL, policy_file("all.lua", ""));
  env_topology(&e, "orders", 1);
  call(&e, "POST", "orders", "/o", NULL, "{}", &r);
  assert_int_equal(r.status, 503); /* the upstream's answer, relayed */
  assert_int_equal(a->posts + b->posts, 1);
  call(&e, "PATCH", "orders", "/o", NULL, "{}", &r);
  assert_int_equal(a->others + b->others, 1);
  call(&e, "POST", "orders", "/o", "Idempotency-Key: k-1\r\n", "{}", &r);
  assert_int_equal(r.status, 503);
  assert_string_equal(r.attempts, "2");
  assert_int_equal(a->posts + b->posts, 3); /* one retry, on the other peer */
  OM_ASSERT_CMP(a->posts, >=, 1);
  OM_ASSERT_CMP(b->posts, >=, 1);
  /* safe methods retry */
  call(&e, "PUT", "orders", "/o", NULL, "{}", &r);
  assert_int_equal(a->puts + b->puts, 2);
  /* a reset connection: POST not retried (the request may have been
   * processed), GET is */
  a->mode = b->mode = FX_RESET;
  call(&e, "POST", "orders", "/o", NULL, "{}", &r);
  assert_int_equal(r.status, 502);
  assert_string_equal(r.reason, "upstream");
  assert_int_equal(a->posts + b->posts, 4);
  get(&e, "orders", NULL, &r);
  assert_int_equal(r.status, 502);
  assert_string_equal(r.reason, "upstream");
  assert_int_equal(r.attempts[0], '2');
  assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
  OM_ASSERT_CMP(st.retries, >=, 3);
  env_close(&e);
}

static void retry_policy_opt_in_replay_limit_and_budget(void **state) {
  env_t e;
  fx_t *a, *b;
  res_t r;
  om_proxy_opts_t o;
  om_retry_budget_opts_t bo;
  om_proxy_stats_t st;
  static char big[2048];
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_FAIL);
  b = env_fx(&e, "b", FX_FAIL);
  memset(&o, 0, sizeof o);
  o.replay_limit = 1024;
  env_proxy(&e, &o, policy_file("optin.lua", "retry_non_idempotent = true,"));
  env_topology(&e, "orders", 1);
  call(&e, "POST", "orders", "/o", NULL, "{}", &r);
  assert_int_equal(a->posts + b->posts, 2); /* the policy opted in */
  memset(big, 'x', sizeof big - 1);
  call(&e, "PUT", "orders", "/o", NULL, big, &r);
  assert_int_equal(r.status, 503);
  assert_int_equal(a->puts + b->puts, 1); /* larger than the replay limit */
  OM_ASSERT_CMP(a->last_body_len + b->last_body_len, >=, sizeof big - 1);
  env_close(&e);
  /* an empty retry budget refuses the retry and counts it */
  env_init(&e);
  a = env_fx(&e, "a", FX_FAIL);
  b = env_fx(&e, "b", FX_FAIL);
  memset(&o, 0, sizeof o);
  om_retry_budget_opts_default(&bo);
  bo.ratio = 0;
  bo.min_per_s = 0;
  o.budget = &bo;
  env_proxy(&e, &o, policy_file("all.lua", ""));
  env_topology(&e, "orders", 1);
  get(&e, "orders", NULL, &r);
  assert_int_equal(r.status, 503);
  assert_int_equal(total_requests(&e), 1);
  assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
  assert_int_equal(st.budget_exhausted, 1);
  assert_int_equal(st.retries, 0);
  env_close(&e);
}

/* A key whose rendezvous owner among {a, b} is `want`. */
static void key_owned_by(const char *want, char *out, size_t cap) {
  om_rendezvous_peer_t peers[2] = {{"a", 0, 1.0}, {"b", 0, 1.0}};
  om_rendezvous_opts_t ro = {peers, 2, 0};
  om_rendezvous_t *r;
  assert_int_equal(om_rendezvous_new(&ro, &r), 0);
  for (int k = 0;; k++) {
    snprintf(out, cap, "key-%d", k);
    if (strcmp(
            om_rendezvous_id(r, om_rendezvous_pick(r, out, strlen(out)), NULL),
            want) == 0)
      break;
  }
  om_rendezvous_free(r);
}

static void keyed_retry_walks_the_rank_and_429_waits_retry_after(void **state) {
  env_t e;
  fx_t *a, *b;
  res_t r;
  om_proxy_opts_t o;
  char key[32], extra[128];
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_FAIL);
  b = env_fx(&e, "b", FX_OK);
  assert_int_equal(b->mode, FX_OK);
  a->fail_status = 429;
  a->retry_after = "1";
  memset(&o, 0, sizeof o);
  o.retry_429 = 1;
  env_proxy(&e, &o, policy_file("all.lua", ""));
  env_topology(&e, "orders", 1);
  key_owned_by("a", key, sizeof key);
  /* a's Retry-After (1 s) fits in the deadline: honoured, then rank 2 */
  snprintf(extra, sizeof extra, "x-openmesh-key: %s\r\n", key);
  get(&e, "orders", extra, &r);
  OM_TEST_NOTE("429 + Retry-After: 1 -> retried after %llu ms",
               (unsigned long long)r.ms);
  assert_int_equal(r.status, 200);
  assert_string_equal(r.peer, "b");
  assert_string_equal(r.attempts, "2");
  OM_ASSERT_CMP(r.ms, >=, 950); /* the 1 s was waited (ms rounding aside) */
  assert_int_equal(a->requests, 1);
  /* it does not fit in a 500 ms deadline: the 429 is relayed at once */
  snprintf(extra, sizeof extra,
           "x-openmesh-key: %s\r\nx-openmesh-deadline-ms: 500\r\n", key);
  get(&e, "orders", extra, &r);
  assert_int_equal(r.status, 429);
  /* at once: well before the 500 ms deadline it would otherwise wait out */
  OM_ASSERT_CMP(r.ms, <, 450);
  assert_int_equal(a->requests, 2);
  /* a 503 on the owner: the retry goes to the next peer of the rank */
  a->fail_status = 503;
  a->retry_after = NULL;
  snprintf(extra, sizeof extra, "x-openmesh-key: %s\r\n", key);
  get(&e, "orders", extra, &r);
  assert_int_equal(r.status, 200);
  assert_string_equal(r.peer, "b");
  assert_int_equal(a->requests, 3);
  assert_string_equal(a->last_attempt, "");  /* the first */
  assert_string_equal(b->last_attempt, "2"); /* the retry says so */
  env_close(&e);
}

/* 429 is retryable only where the policy (or --retry-429) says so. */
static void policy_opts_in_to_429_retries(void **state) {
  env_t e;
  fx_t *a, *b;
  res_t r;
  om_proxy_opts_t o;
  char key[32], extra[128];
  (void)state;
  key_owned_by("a", key, sizeof key);
  snprintf(extra, sizeof extra, "x-openmesh-key: %s\r\n", key);
  /* silent policy, no flag: the owner's 429 is relayed, no retry */
  env_init(&e);
  a = env_fx(&e, "a", FX_FAIL);
  b = env_fx(&e, "b", FX_OK);
  a->fail_status = 429;
  memset(&o, 0, sizeof o);
  env_proxy(&e, &o, policy_file("silent.lua", ""));
  env_topology(&e, "orders", 1);
  get(&e, "orders", extra, &r);
  assert_int_equal(r.status, 429);
  assert_string_equal(r.attempts, "1");
  assert_int_equal(a->requests, 1);
  assert_int_equal(b->requests, 0);
  env_close(&e);
  /* the policy opts in: retried on the next peer of the rank */
  env_init(&e);
  a = env_fx(&e, "a", FX_FAIL);
  b = env_fx(&e, "b", FX_OK);
  a->fail_status = 429;
  env_proxy(&e, &o, policy_file("p429.lua", "  retry_429 = true,"));
  env_topology(&e, "orders", 1);
  get(&e, "orders", extra, &r);
  assert_int_equal(r.status, 200);
  assert_string_equal(r.peer, "b");
  assert_string_equal(r.attempts, "2");
  assert_int_equal(a->requests, 1);
  env_close(&e);
  /* the flag says yes, the policy says no: the policy wins */
  env_init(&e);
  a = env_fx(&e, "a", FX_FAIL);
  b = env_fx(&e, "b", FX_OK);
  a->fail_status = 429;
  o.retry_429 = 1;
  env_proxy(&e, &o, policy_file("no429.lua", "  retry_429 = false,"));
  env_topology(&e, "orders", 1);
  get(&e, "orders", extra, &r);
  assert_int_equal(r.status, 429);
  assert_int_equal(b->requests, 0);
  env_close(&e);
}

/*
 * A probe whose caller went away taught nothing about the peer: its slot
 * is given back (om_circuit_release), so the next call probes at once
 * instead of every call answering all_circuits_open until the probe
 * timeout.
 */
static void abandoned_probe_frees_the_circuit_slot(void **state) {
  env_t e;
  fx_t *a;
  res_t r;
  htc_t *c;
  om_proxy_opts_t o;
  om_circuit_opts_t co;
  om_circuit_state_t cs;
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_FAIL);
  a->fail_n = -1;
  memset(&o, 0, sizeof o);
  om_circuit_opts_default(&co);
  co.failures = 2;
  co.cooldown_ns = UINT64_C(100000000);
  co.probe_timeout_ns = UINT64_C(10000000000); /* far beyond the test */
  o.circuit = &co;
  env_proxy(&e, &o, policy_file("noretry.lua", "retries = 0,"));
  env_topology(&e, "orders", 1);
  for (int i = 0; i < 2; i++) {
    get(&e, "orders", NULL, &r);
    assert_int_equal(r.status, 503);
  }
  assert_int_equal(om_proxy_peer_circuit(e.proxy, "orders", "a", &cs), 0);
  assert_int_equal(cs, OM_CIRCUIT_OPEN);
  a->mode = FX_SLOW; /* recovered, but slow: 300 ms */
  a->delay_ms = 300;
  spin(&e, 150); /* the cooldown is over */
  /* the probe goes out; its caller leaves before the answer */
  c = htc_new("127.0.0.1", e.port);
  assert_non_null(c);
  assert_int_equal(
      htc_sends(&e.loop, c, "GET /p HTTP/1.1\r\nHost: orders\r\n\r\n"), 0);
  {
    uint64_t t0 = htc_now_ms();
    unsigned before = a->requests;
    while (a->requests == before && htc_now_ms() - t0 < 2000)
      htc_step(&e.loop, c, 1);
    OM_ASSERT_CMP(a->requests, ==, before + 1); /* the probe reached a */
  }
  htc_free(c);
  spin(&e, 20);
  /* the next call is the new probe, not all_circuits_open */
  get(&e, "orders", NULL, &r);
  OM_TEST_NOTE("after the abandoned probe: %d %s", r.status, r.reason);
  assert_int_equal(r.status, 200);
  assert_int_equal(om_proxy_peer_circuit(e.proxy, "orders", "a", &cs), 0);
  assert_int_equal(cs, OM_CIRCUIT_CLOSED);
  env_close(&e);
}

static void failing_peer_is_bypassed_until_cooldown_then_probed(void **state) {
  env_t e;
  fx_t *a, *b;
  res_t r;
  om_proxy_opts_t o;
  om_circuit_opts_t co;
  om_circuit_state_t cs;
  char key[32], extra[64];
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_FAIL);
  b = env_fx(&e, "b", FX_OK);
  memset(&o, 0, sizeof o);
  om_circuit_opts_default(&co);
  co.failures = 5;
  co.cooldown_ns = UINT64_C(300000000);
  co.max_cooldown_ns = UINT64_C(10000000000);
  o.circuit = &co;
  env_proxy(&e, &o, policy_file("all.lua", ""));
  env_topology(&e, "orders", 1);
  key_owned_by("a", key, sizeof key);
  snprintf(extra, sizeof extra, "x-openmesh-key: %s\r\n", key);
  for (int i = 0; i < 12; i++) {
    get(&e, "orders", extra, &r);
    assert_int_equal(r.status, 200); /* retried on b while a fails */
    assert_string_equal(r.peer, "b");
  }
  assert_int_equal(a->requests, 5); /* then bypassed */
  assert_int_equal(b->requests, 12);
  assert_int_equal(om_proxy_peer_circuit(e.proxy, "orders", "a", &cs), 0);
  assert_int_equal(cs, OM_CIRCUIT_OPEN);
  spin(&e, 320);
  assert_int_equal(om_proxy_peer_circuit(e.proxy, "orders", "a", &cs), 0);
  assert_int_equal(cs, OM_CIRCUIT_HALF_OPEN);
  for (int i = 0; i < 5; i++) {
    get(&e, "orders", extra, &r);
    assert_int_equal(r.status, 200);
  }
  assert_int_equal(a->requests, 6); /* one probe, which failed: open again */
  assert_int_equal(om_proxy_peer_circuit(e.proxy, "orders", "a", &cs), 0);
  assert_int_equal(cs, OM_CIRCUIT_OPEN);
  /* a recovers: the next probe closes the circuit and the key comes home */
  a->mode = FX_OK;
  spin(&e, 650); /* the second cooldown is twice the first */
  get(&e, "orders", extra, &r);
  assert_string_equal(r.peer, "a");
  get(&e, "orders", extra, &r);
  assert_string_equal(r.peer, "a");
  assert_int_equal(om_proxy_peer_circuit(e.proxy, "orders", "a", &cs), 0);
  assert_int_equal(cs, OM_CIRCUIT_CLOSED);
  env_close(&e);
}

/* ------------------------------------------------------------------ */
/* streams */

/* The policy's circuit settings replace the proxy's for its service. */
static void policy_sets_the_circuits(void **state) {
  env_t e;
  fx_t *a, *b;
  res_t r;
  om_circuit_state_t cs;
  char key[32], extra[64];
  const char *pol;
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_FAIL);
  b = env_fx(&e, "b", FX_OK);
  pol = policy_file("circuit.lua",
                    "  circuit = { failures = 2, cooldown_ms = 200 },\n");
  env_proxy(&e, NULL, pol); /* the proxy's default: 5 failures, 30 s */
  env_topology(&e, "orders", 1);
  key_owned_by("a", key, sizeof key);
  snprintf(extra, sizeof extra, "x-openmesh-key: %s\r\n", key);
  for (int i = 0; i < 6; i++) {
    get(&e, "orders", extra, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.peer, "b");
  }
  assert_int_equal(a->requests, 2); /* the policy's 2, not the default 5 */
  assert_int_equal(om_proxy_peer_circuit(e.proxy, "orders", "a", &cs), 0);
  assert_int_equal(cs, OM_CIRCUIT_OPEN);
  spin(&e, 230); /* the policy's 200 ms cooldown, not 30 s */
  assert_int_equal(om_proxy_peer_circuit(e.proxy, "orders", "a", &cs), 0);
  assert_int_equal(cs, OM_CIRCUIT_HALF_OPEN);
  assert_int_equal(b->requests, 6);
  /* an edit that changes them starts every circuit afresh */
  write_file(pol, "return { kind = \"traffic\",\n"
                  "  circuit = { failures = 3, cooldown_ms = 200 },\n"
                  "  subset = function(_, peers) return peers end }\n");
  assert_int_equal(om_proxy_reload_policies(e.proxy), 0);
  assert_int_equal(om_proxy_peer_circuit(e.proxy, "orders", "a", &cs), 0);
  assert_int_equal(cs, OM_CIRCUIT_CLOSED);
  for (int i = 0; i < 6; i++)
    get(&e, "orders", extra, &r);
  assert_int_equal(a->requests, 5); /* 2, then 3 more before it opened */
  env_close(&e);
}

static void stream_cut_after_headers_is_an_error_never_replayed(void **state) {
  env_t e;
  fx_t *a, *b;
  res_t r;
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_STREAM_DIE);
  b = env_fx(&e, "b", FX_STREAM_DIE);
  env_proxy(&e, NULL, policy_file("all.lua", ""));
  env_topology(&e, "orders", 1);
  get(&e, "orders", NULL, &r);
  /* the head and the first event arrived; the last chunk never did */
  assert_int_equal(r.complete, 0);
  assert_true(r.eof);
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(r.head, "Transfer-Encoding: chunked"));
  assert_non_null(strstr(r.head, "text/event-stream"));
  assert_non_null(strstr(r.head, "data: 1"));
  assert_int_equal(a->requests + b->requests, 1); /* GET, yet not replayed */
  {
    om_proxy_stats_t st;
    assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
    assert_int_equal(st.retries, 0);
  }
  env_close(&e);
}

/* A client that reads nothing for a while, then everything: the
 * ordinary relay pauses the upstream (splice off), a splice waits for the
 * client's socket; either way every byte arrives, in order. */
static void slow_reader_run(int splice) {
  env_t e;
  fx_t *a;
  om_proxy_opts_t o;
  om_proxy_stats_t st;
  htc_t *c;
  uint64_t t0;
  size_t head = 0;
  const size_t total = (size_t)24 << 20;
  env_init(&e);
  a = env_fx(&e, "a", FX_STREAM_BIG);
  a->big_total = total;
  memset(&o, 0, sizeof o);
  o.high_water = 64 * 1024;
  if (!splice)
    o.splice_min_bytes = UINT64_MAX;
  env_proxy(&e, &o, policy_file("all.lua", ""));
  env_topology(&e, "orders", 1);
  c = htc_new("127.0.0.1", e.port);
  assert_non_null(c);
  assert_int_equal(
      htc_sends(&e.loop, c, "GET / HTTP/1.1\r\nHost: orders\r\n\r\n"), 0);
  /* do not read for a while: the proxy must stop reading upstream */
  spin(&e, 400);
  assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
  if (!splice)
    OM_ASSERT_CMP(st.paused, >=, 1);
  /* then read everything: nothing lost */
  t0 = htc_now_ms();
  while (htc_now_ms() - t0 < 15000) {
    htc_step(&e.loop, c, 1);
    if (head == 0) {
      for (size_t i = 0; i + 3 < c->len; i++)
        if (memcmp(c->buf + i, "\r\n\r\n", 4) == 0) {
          head = i + 4;
          break;
        }
    }
    if (head != 0 && c->total >= head + total)
      break;
  }
  OM_ASSERT_CMP(head, >, 0);
  assert_int_equal(c->total, head + total);
  assert_non_null(strstr(c->buf, "content-length: 25165824"));
  assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
  OM_TEST_NOTE("slow reader, splice %s: %llu bytes spliced of %zu",
               splice ? "on" : "off", (unsigned long long)st.spliced_bytes,
               total);
  if (splice) /* all but what the first reads held */
    OM_ASSERT_CMP(st.spliced_bytes, >=, (uint64_t)total - (1u << 20));
  else
    assert_int_equal(st.spliced_bytes, 0);
  htc_free(c);
  env_close(&e);
}

static void slow_reader_pauses_the_upstream(void **state) {
  (void)state;
  slow_reader_run(0);
}

static void slow_reader_over_a_splice_gets_every_byte(void **state) {
  (void)state;
  slow_reader_run(1);
}

/* ------------------------------------------------------------------ */
/* policies */

/* The whole file at path, NUL-terminated (free it); fails the test when
 * it cannot be read. */
static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  char *buf;
  long n;
  assert_non_null(f);
  assert_int_equal(fseek(f, 0, SEEK_END), 0);
  n = ftell(f);
  assert_true(n >= 0);
  rewind(f);
  buf = malloc((size_t)n + 1);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

static void policy_error_never_widens(void **state) {
  env_t e;
  fx_t *a;
  res_t r;
  char path[128];
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_OK);
  snprintf(path, sizeof path, "%s/boom.lua", g_dir);
  write_file(path, "return {\n  kind = \"traffic\",\n"
                   "  subset = function(req, peers)\n"
                   "    if req.headers['x-boom'] then error('boom') end\n"
                   "    if req.headers['x-fake'] then return {{id = 'a'}} end\n"
                   "    if req.headers['x-loop'] then while true do end end\n"
                   "    return peers\n  end,\n}\n");
  env_proxy(&e, NULL, path);
  env_topology(&e, "orders", 1);
  get(&e, "orders", "x-boom: 1\r\n", &r);
  assert_int_equal(r.status, 500);
  assert_string_equal(r.reason, "policy_error");
  assert_non_null(strstr(r.body, "boom"));
  get(&e, "orders", "x-fake: 1\r\n", &r);
  assert_int_equal(r.status, 500);
  assert_string_equal(r.reason, "policy_error");
  get(&e, "orders", "x-loop: 1\r\n", &r);
  assert_int_equal(r.status, 500);
  assert_string_equal(r.reason, "policy_error");
  assert_int_equal(a->requests, 0); /* never widened to the full set */
  /* every error of the proxy's own carries an id: the caller's, echoed,
   * else a fresh one */
  get(&e, "orders", "x-boom: 1\r\nx-request-id: rid-boom-7\r\n", &r);
  assert_int_equal(r.status, 500);
  if (strstr(r.head, "x-request-id: rid-boom-7\r\n") == NULL)
    fail_msg("want x-request-id: rid-boom-7 in the 500, head:\n%s", r.head);
  get(&e, "orders", "x-fake: 1\r\n", &r);
  if (strstr(r.head, "x-request-id: ") == NULL)
    fail_msg("want an x-request-id in the 500, head:\n%s", r.head);
  get(&e, "nowhere", NULL, &r);
  assert_int_equal(r.status, 503);
  if (strstr(r.head, "x-request-id: ") == NULL)
    fail_msg("want an x-request-id in the 503, head:\n%s", r.head);
  /* the outcome label tells the three apart: 2 raised, 2 wrong answers,
   * 1 budget */
  {
    int st;
    char *m = admin_get(&e, "/metrics", &st);
    static const char *const want[] = {
        "openmesh_proxy_requests_total{service=\"orders\",outcome=\""
        "policy_runtime\"} 2",
        "openmesh_proxy_requests_total{service=\"orders\",outcome=\""
        "policy_answer\"} 2",
        "openmesh_proxy_requests_total{service=\"orders\",outcome=\""
        "policy_budget\"} 1",
    };
    assert_int_equal(st, 200);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
      if (strstr(m, want[i]) == NULL)
        fail_msg("want '%s' in /metrics, got:\n%s", want[i], m);
    free(m);
  }
  get(&e, "orders", NULL, &r);
  assert_int_equal(r.status, 200);
  assert_int_equal(a->requests, 1);
  /* a policy that raises on every call logs at most one line a second,
   * not one a call, and the next line says how many it held back: 50
   * failing calls in a burst, a second of quiet, one more, the log
   * captured */
  {
    char logpath[160], *text, *last = NULL;
    int saved = dup(2), fd, lines = 0, errors = 0;
    uint64_t t0;
    snprintf(logpath, sizeof logpath, "%s/policy-errors.log", g_dir);
    fd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(saved >= 0 && fd >= 0);
    fflush(stderr);
    dup2(fd, 2);
    close(fd);
    t0 = htc_now_ms();
    for (int i = 0; i < 50; i++) {
      get(&e, "orders", "x-boom: 1\r\n", &r);
      errors += r.status == 500;
    }
    t0 = htc_now_ms() - t0;
    spin(&e, 1100);
    get(&e, "orders", "x-boom: 1\r\n", &r);
    errors += r.status == 500;
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    text = read_file(logpath);
    for (char *at = text; (at = strstr(at, "proxy_policy_error")) != NULL;
         at++) {
      lines++;
      last = at;
    }
    OM_TEST_NOTE("50 failing calls in %llu ms, then one: %d log lines",
                 (unsigned long long)t0, lines);
    OM_ASSERT_CMP(errors, ==, 51); /* each caller still gets its error */
    OM_ASSERT_CMP(t0, <, 1000);
    /* the burst fell in the second of the lines the failing calls above
     * wrote (1 line: the last, holding back the burst and those calls'
     * own held-back ones), or just after it (its first call logs, 49 held
     * back) */
    OM_ASSERT_CMP(lines, >=, 1);
    OM_ASSERT_CMP(lines, <=, 2);
    assert_non_null(last);
    {
      const char *sup = strstr(last, "\"suppressed\":\"");
      int held = sup != NULL ? atoi(sup + 14) : -1;
      OM_TEST_NOTE("the last line held back %d", held);
      OM_ASSERT_CMP(held, >=, 49);
      OM_ASSERT_CMP(held, <=, 54); /* + the failing calls above */
    }
    /* the line finds the request and the policy that failed it */
    {
      static const char *const want[] = {"\"outcome\":\"policy_runtime\"",
                                         "\"request_id\":\"",
                                         "\"method\":\"GET\"",
                                         "\"path\":\"/\"",
                                         "\"policy_revision\":\"0\"",
                                         "\"policy_source\":\"file:"};
      for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (strstr(last, want[i]) == NULL)
          fail_msg("want %s in the log line: %.400s", want[i], last);
    }
    free(text);
  }
  env_close(&e);
}

/*
 * A policy that keeps overrunning its budget is shed: five overruns, then
 * calls are refused without running it (a looping request says "shed",
 * not "budget"). After the cooldown a cheap probe runs it and ends the
 * shedding; after five more overruns a probe that overruns too sheds it
 * again for twice as long.
 */
static void overrunning_policy_is_shed_then_probed(void **state) {
  env_t e;
  fx_t *a;
  res_t r;
  char path[128], *st;
  int status;
  om_proxy_opts_t o;
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_OK);
  snprintf(path, sizeof path, "%s/overrun.lua", g_dir);
  write_file(path, "return {\n  kind = \"traffic\",\n"
                   "  subset = function(req, peers)\n"
                   "    if req.headers['x-loop'] then while true do end end\n"
                   "    return peers\n  end,\n}\n");
  memset(&o, 0, sizeof o);
  o.policy_shed_cooldown_ms = 500;
  env_proxy(&e, &o, path);
  env_topology(&e, "orders", 1);
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < 5; i++) {
      get(&e, "orders", "x-loop: 1\r\n", &r);
      assert_int_equal(r.status, 500);
      assert_non_null(strstr(r.body, "budget: "));
    }
    get(&e, "orders", "x-loop: 1\r\n", &r);
    assert_int_equal(r.status, 500);
    assert_string_equal(r.reason, "policy_error");
    if (strstr(r.body, "is shed for") == NULL)
      fail_msg("round %d: not shed: %s", round, r.body);
    st = admin_get(&e, "/status", &status);
    assert_int_equal(status, 200);
    assert_non_null(strstr(st, "\"shed\":true"));
    free(st);
    spin(&e, 600); /* the cooldown passed: the next call probes */
    if (round == 0) {
      get(&e, "orders", NULL, &r); /* within budget: no longer shed */
      assert_int_equal(r.status, 200);
      assert_int_equal(a->requests, 1);
    }
  }
  /* the probe overruns: shed again, for 1,000 ms now */
  get(&e, "orders", "x-loop: 1\r\n", &r);
  assert_non_null(strstr(r.body, "budget: "));
  spin(&e, 600);
  get(&e, "orders", NULL, &r);
  assert_int_equal(r.status, 500);
  assert_non_null(strstr(r.body, "is shed for"));
  spin(&e, 600);
  get(&e, "orders", NULL, &r);
  assert_int_equal(r.status, 200);
  assert_int_equal(a->requests, 2);
  st = admin_get(&e, "/status", &status);
  assert_non_null(strstr(st, "\"budget_trips\":11"));
  assert_non_null(strstr(st, "\"sheds\":3"));
  free(st);
  env_close(&e);
}

static void policies_hot_reload_and_keep_the_last_good_one(void **state) {
  env_t e;
  res_t r;
  om_proxy_stats_t st;
  const char *pol;
  (void)state;
  env_init(&e);
  env_fx(&e, "a", FX_OK);
  env_fx(&e, "b", FX_OK);
  pol = policy_file("reload.lua", "");
  env_proxy(&e, NULL, pol);
  env_topology(&e, "orders", 1);
  write_file(pol, "return { kind = \"traffic\", max_inflight = 7,\n"
                  "  subset = function(_, peers)\n"
                  "    for _, p in ipairs(peers) do\n"
                  "      if p.id == 'b' then return {p} end end\n"
                  "    return {} end }\n");
  assert_int_equal(om_proxy_reload_policies(e.proxy), 0);
  assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
  assert_int_equal(st.policy_version, 2);
  assert_int_equal(st.limit, 7);
  for (int i = 0; i < 6; i++) {
    get(&e, "orders", NULL, &r);
    assert_string_equal(r.peer, "b");
  }
  write_file(pol, "return { kind = \"traffic\", max_inflight = -3,\n"
                  "  subset = function(_, peers) return peers end }\n");
  assert_int_equal(om_proxy_reload_policies(e.proxy), 1);
  assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
  assert_int_equal(st.policy_version, 2);
  assert_int_equal(st.policy_failures, 1);
  get(&e, "orders", NULL, &r);
  assert_string_equal(r.peer, "b");
  env_close(&e);
}

/*
 * A policy that declares vary sees only the service and those fields, and
 * its decision is reused for every request that agrees on them, until the
 * peer view or the policy changes.
 */
static void
vary_policies_are_cached_and_see_only_what_they_declare(void **state) {
  env_t e;
  fx_t *a, *b;
  res_t r;
  om_proxy_stats_t st;
  const char *pol;
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_OK);
  b = env_fx(&e, "b", FX_OK);
  pol = policy_file(
      "vary.lua",
      "  vary = { 'x-group' },\n"
      "  key = function(req) return req.headers['x-group'] end,\n"
      "  subset = function(req, peers)\n"
      "    if rawget(req.headers, 'x-other') or rawget(req, 'method')\n"
      "      or rawget(req, 'path') then return {} end -- not in the view\n"
      "    local g = req.headers['x-group']\n"
      "    if g == nil then return peers end\n"
      "    for _, p in ipairs(peers) do\n"
      "      if p.id == g then return {p} end end\n"
      "    return {} end,\n");
  env_proxy(&e, NULL, pol);
  env_topology(&e, "orders", 1);
  for (int i = 0; i < 5; i++) {
    get(&e, "orders", "x-group: b\r\nx-other: 1\r\n", &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.peer, "b");
  }
  assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
  assert_int_equal(st.policy_cache_misses, 1);
  assert_int_equal(st.policy_cache_hits, 4);
  /* another value, and no value at all: their own decisions */
  get(&e, "orders", "x-group: a\r\n", &r);
  assert_string_equal(r.peer, "a");
  get(&e, "orders", "x-group: zz\r\n", &r);
  assert_int_equal(r.status, 503);
  assert_string_equal(r.reason, "no_peers");
  get(&e, "orders", NULL, &r);
  assert_int_equal(r.status, 200);
  get(&e, "orders", "x-group: zz\r\n", &r); /* cached: still no peer */
  assert_string_equal(r.reason, "no_peers");
  assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
  assert_int_equal(st.policy_cache_misses, 4);
  assert_int_equal(st.policy_cache_hits, 5);
  /* a new view (b left): the cached {b} is void, the policy runs again */
  e.nfx = 1;
  env_topology(&e, "orders", 2);
  get(&e, "orders", "x-group: b\r\n", &r);
  assert_int_equal(r.status, 503);
  assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
  assert_int_equal(st.policy_cache_misses, 5);
  e.nfx = 2;
  env_topology(&e, "orders", 3);
  get(&e, "orders", "x-group: b\r\n", &r);
  assert_string_equal(r.peer, "b");
  /* a new policy version: void too */
  write_file(pol, "return { kind = \"traffic\", vary = {},\n"
                  "  subset = function(_, peers)\n"
                  "    for _, p in ipairs(peers) do\n"
                  "      if p.id == 'a' then return {p} end end\n"
                  "    return {} end }\n");
  assert_int_equal(om_proxy_reload_policies(e.proxy), 0);
  get(&e, "orders", "x-group: b\r\n", &r);
  assert_string_equal(r.peer, "a");
  get(&e, "orders", "x-group: b\r\n", &r);
  assert_string_equal(r.peer, "a");
  assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
  assert_int_equal(st.policy_cache_misses, 7);
  assert_int_equal(st.policy_cache_hits, 6);
  OM_ASSERT_CMP(b->requests, >=, 6);
  OM_ASSERT_CMP(a->requests, >=, 3);
  /* reading what vary does not name fails the call, never reads nil: a
   * decision that depended on it would be reused for other values */
  write_file(pol, "return { kind = \"traffic\", vary = { 'x-group' },\n"
                  "  subset = function(req, peers)\n"
                  "    if req.headers['x-group'] then return peers end\n"
                  "    if req.headers['x-other'] then return {} end\n"
                  "    return peers end }\n");
  assert_int_equal(om_proxy_reload_policies(e.proxy), 0);
  get(&e, "orders", "x-group: b\r\n", &r); /* declared, present */
  assert_int_equal(r.status, 200);
  get(&e, "orders", "x-other: 1\r\n", &r);
  assert_int_equal(r.status, 500);
  assert_string_equal(r.reason, "policy_error");
  assert_non_null(strstr(r.body,
                         "reads header 'x-other', which its vary "
                         "does not name (add \\\"x-other\\\" to vary)"));
  write_file(pol, "return { kind = \"traffic\", vary = { 'x-group' },\n"
                  "  subset = function(req, peers)\n"
                  "    if req.headers['X-Group'] == nil and req.method then\n"
                  "      return {} end\n"
                  "    return peers end }\n");
  assert_int_equal(om_proxy_reload_policies(e.proxy), 0);
  get(&e, "orders", NULL, &r); /* X-Group: declared, absent: nil */
  assert_int_equal(r.status, 500);
  assert_non_null(strstr(r.body, "reads req.method, which its vary does not "
                                 "name (add \\\":method\\\" to vary)"));
  write_file(pol, "return { kind = \"traffic\", vary = {},\n"
                  "  subset = function(req, peers)\n"
                  "    if req.metadata.zone then return {} end\n"
                  "    return peers end }\n");
  assert_int_equal(om_proxy_reload_policies(e.proxy), 0);
  get(&e, "orders", NULL, &r);
  assert_int_equal(r.status, 500);
  assert_non_null(strstr(r.body, "reads req.metadata.zone"));
  env_close(&e);
}

/*
 * authorize(req) refuses a call before any peer: 403 forbidden with the
 * policy's reason and an x-request-id. A policy with vary caches the
 * refusal with its reason; a wrong answer is a policy_error.
 */
static void authorize_refuses_before_any_peer(void **state) {
  env_t e;
  res_t r;
  om_proxy_stats_t st;
  const char *pol;
  (void)state;
  env_init(&e);
  env_fx(&e, "a", FX_OK);
  pol = policy_file(
      "authorize.lua",
      "  vary = { 'x-user' },\n"
      "  authorize = function(req)\n"
      "    local u = req.headers['x-user']\n"
      "    if u == 'ok' then return true end\n"
      "    if u == 'quiet' then return false end\n"
      "    if u == 'odd' then return 'yes' end\n"
      "    return false, 'user ' .. tostring(u) .. ' may not call ' .. "
      "req.service end,\n");
  env_proxy(&e, NULL, pol);
  env_topology(&e, "orders", 1);
  for (int i = 0; i < 3; i++) {
    get(&e, "orders", "x-user: eve\r\n", &r);
    OM_ASSERT_CMP(r.status, ==, 403);
    assert_string_equal(r.reason, "forbidden");
    assert_non_null(strstr(r.body, "\"message\":\"user eve may not call "
                                   "orders\""));
    assert_non_null(strstr(r.head, "x-request-id: "));
  }
  OM_ASSERT_CMP(total_requests(&e), ==, 0);
  get(&e, "orders", "x-user: ok\r\n", &r);
  OM_ASSERT_CMP(r.status, ==, 200);
  OM_ASSERT_CMP(total_requests(&e), ==, 1);
  get(&e, "orders", "x-user: quiet\r\n", &r); /* no reason: ours */
  OM_ASSERT_CMP(r.status, ==, 403);
  assert_non_null(strstr(r.body, "the traffic policy refused the call"));
  get(&e, "orders", "x-user: odd\r\n", &r);
  OM_ASSERT_CMP(r.status, ==, 500);
  assert_string_equal(r.reason, "policy_error");
  assert_non_null(strstr(r.body, "authorize returned a string"));
  get(&e, "orders", "x-user: eve\r\nx-request-id: rid-7\r\n", &r);
  assert_non_null(strstr(r.head, "x-request-id: rid-7"));
  assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
  OM_ASSERT_CMP(st.denied, ==, 5);
  /* misses: eve, ok, quiet, odd (an error is never cached); hits: eve */
  OM_ASSERT_CMP(st.policy_cache_misses, ==, 4);
  OM_ASSERT_CMP(st.policy_cache_hits, ==, 3);
  OM_ASSERT_CMP(total_requests(&e), ==, 1);
  env_close(&e);
}

/* An answer too big for a cache slot (here the policy's key) is not
 * cached: memory stays bounded whatever a policy returns. */
static void vary_cache_is_bounded(void **state) {
  env_t e;
  res_t r;
  om_proxy_stats_t st;
  (void)state;
  env_init(&e);
  env_fx(&e, "a", FX_OK);
  env_proxy(
      &e, NULL,
      policy_file("bigkey.lua",
                  "  vary = {},\n"
                  "  key = function() return string.rep('k', 5000) end,\n"));
  env_topology(&e, "orders", 1);
  for (int i = 0; i < 3; i++) {
    get(&e, "orders", NULL, &r);
    assert_int_equal(r.status, 200);
  }
  assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
  assert_int_equal(st.policy_cache_misses, 3);
  assert_int_equal(st.policy_cache_hits, 0);
  env_close(&e);
  /* so are request fields over 1 KiB: the policy runs for each */
  env_init(&e);
  env_fx(&e, "a", FX_OK);
  env_proxy(&e, NULL, policy_file("bigvalue.lua", "  vary = { 'x-big' },\n"));
  env_topology(&e, "orders", 1);
  {
    char extra[2100];
    memcpy(extra, "x-big: ", 7);
    memset(extra + 7, 'v', 2000);
    memcpy(extra + 2007, "\r\n", 3);
    for (int i = 0; i < 3; i++) {
      get(&e, "orders", extra, &r);
      assert_int_equal(r.status, 200);
    }
  }
  assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
  assert_int_equal(st.policy_cache_misses, 3);
  assert_int_equal(st.policy_cache_hits, 0);
  env_close(&e);
}

/* ------------------------------------------------------------------ */
/* admin and shutdown */

static void admin_serves_metrics_status_and_health(void **state) {
  env_t e;
  res_t r;
  int status;
  char *body;
  json_t *j;
  (void)state;
  env_init(&e);
  env_fx(&e, "a", FX_OK);
  env_proxy(&e, NULL, policy_file("all.lua", ""));
  env_topology(&e, "orders", 3);
  get(&e, "orders", NULL, &r);
  get(&e, "nope", NULL, &r);
  body = admin_get(&e, "/metrics", &status);
  assert_int_equal(status, 200);
  assert_non_null(strstr(body,
                         "openmesh_proxy_requests_total{service=\"orders\","
                         "outcome=\"ok\"} 1"));
  assert_non_null(strstr(body, "openmesh_proxy_requests_total{service=\"\","
                               "outcome=\"no_peers\"} 1"));
  assert_non_null(strstr(body, "openmesh_proxy_attempts_total{service="
                               "\"orders\"} 1"));
  assert_non_null(strstr(body, "openmesh_proxy_peer_circuit_state{service="
                               "\"orders\",peer=\"a\"} 0"));
  assert_non_null(strstr(body, "openmesh_proxy_snapshot_revision{service="
                               "\"orders\"} 3"));
  assert_non_null(strstr(body, "openmesh_proxy_policy_version{service="
                               "\"orders\"} 1"));
  assert_non_null(strstr(body, "openmesh_proxy_upstream_latency_seconds_count"
                               "{service=\"orders\"} 1"));
  assert_non_null(strstr(body, "openmesh_proxy_queue_depth{service="
                               "\"orders\"} 0"));
  free(body);
  body = admin_get(&e, "/status", &status);
  assert_int_equal(status, 200);
  j = json_loads(body, 0, NULL);
  assert_non_null(j);
  {
    json_t *o = json_object_get(json_object_get(j, "services"), "orders");
    assert_int_equal(json_integer_value(json_object_get(o, "revision")), 3);
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(o, "policy"), "version")),
                     1);
    assert_string_equal(
        json_string_value(json_object_get(
            json_array_get(json_object_get(o, "peers"), 0), "circuit")),
        "closed");
  }
  json_decref(j);
  free(body);
  body = admin_get(&e, "/healthz", &status);
  assert_int_equal(status, 200);
  free(body);
  body = admin_get(&e, "/nope", &status);
  assert_int_equal(status, 404);
  free(body);
  env_close(&e);
}

/* ------------------------------------------------------------------ */
/* upgrades */

/* Turn the loop until c's buffer holds what (n bytes), c closed, or ms
 * passed; whether it holds it. */
static int wait_bytes(env_t *e, htc_t *c, const char *what, size_t n, int ms) {
  uint64_t t0 = htc_now_ms();
  for (;;) {
    for (size_t i = 0; n <= c->len && i <= c->len - n; i++)
      if (memcmp(c->buf + i, what, n) == 0)
        return 1;
    if (c->eof || htc_now_ms() - t0 > (uint64_t)ms)
      return 0;
    htc_step(&e->loop, c, 1);
  }
}

static const char *metric_line(const char *text, const char *prefix) {
  const char *at = strstr(text, prefix);
  return at != NULL ? at + strlen(prefix) : "";
}

#define UPGRADE_REQ(path, token)                                               \
  "GET " path " HTTP/1.1\r\nHost: ws\r\nConnection: Upgrade\r\n"               \
  "Upgrade: " token "\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"

static void
upgrade_tunnels_past_the_deadline_until_a_side_closes(void **state) {
  env_t e;
  fx_t *a;
  htc_t *c;
  char *m;
  int st;
  uint64_t t0;
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_UPGRADE);
  env_proxy(&e, NULL,
            policy_file("ws.lua", "deadline_ms = 200, per_try_timeout_ms = 200,"
                                  " stream_idle_timeout_ms = 400"));
  env_topology(&e, "ws", 1);
  c = htc_new("127.0.0.1", e.port);
  assert_non_null(c);
  /* the first frame rides behind the head */
  assert_int_equal(
      htc_sends(&e.loop, c, UPGRADE_REQ("/chat", "WebSocket") "f0"), 0);
  assert_true(wait_bytes(&e, c, "\r\n\r\nf0", 6, 3000));
  assert_int_equal(strncmp(c->buf, "HTTP/1.1 101 Switching Protocols\r\n", 34),
                   0);
  assert_non_null(strstr(c->buf, "\r\nUpgrade: websocket\r\n"));
  assert_non_null(strstr(c->buf, "\r\nConnection: upgrade\r\n"));
  assert_non_null(
      strstr(c->buf, "\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo="));
  assert_non_null(strstr(c->buf, "\r\nx-openmesh-peer: a\r\n"));
  /* forwarded as the client named it, with Connection: upgrade */
  assert_string_equal(a->last_upgrade, "WebSocket");
  assert_string_equal(a->last_connection, "upgrade");
  /* frames well past the call's 200 ms deadline, each inside the idle
   * timeout: the tunnel lives as long as it flows */
  t0 = htc_now_ms();
  for (int i = 1; i <= 4; i++) {
    char f[8];
    uint64_t t1 = htc_now_ms();
    while (htc_now_ms() - t1 < 150)
      htc_step(&e.loop, c, 1);
    snprintf(f, sizeof f, "f%d", i);
    assert_int_equal(htc_sends(&e.loop, c, f), 0);
    assert_true(wait_bytes(&e, c, f, 2, 2000));
  }
  OM_ASSERT_CMP(htc_now_ms() - t0, >=, 600);
  m = admin_get(&e, "/metrics", &st);
  assert_int_equal(
      atoi(metric_line(m, "openmesh_proxy_tunnels_active{service=\"ws\"} ")),
      1);
  assert_int_equal(
      atoi(metric_line(m, "openmesh_proxy_upgrades_total{service=\"ws\","
                          "outcome=\"switched\"} ")),
      1);
  free(m);
  /* the client's half-close reaches the peer, whose FIN comes back */
  shutdown(c->fd, SHUT_WR);
  t0 = htc_now_ms();
  while (!c->eof && htc_now_ms() - t0 < 3000)
    htc_step(&e.loop, c, 1);
  assert_true(c->eof);
  assert_false(c->reset);
  t0 = htc_now_ms();
  while (a->tun_closes == 0 && htc_now_ms() - t0 < 3000)
    htc_step(&e.loop, NULL, 1);
  OM_ASSERT_CMP(a->tun_closes, ==, 1);
  OM_ASSERT_CMP(a->tun_err, ==, 0);
  spin(&e, 50);
  m = admin_get(&e, "/metrics", &st);
  assert_int_equal(
      atoi(metric_line(m, "openmesh_proxy_tunnels_active{service=\"ws\"} ")),
      0);
  assert_int_equal(atoi(metric_line(m, "openmesh_proxy_requests_total{service="
                                       "\"ws\",outcome=\"ok\"} ")),
                   1);
  OM_ASSERT_CMP(
      atoi(metric_line(m, "openmesh_proxy_tunnel_bytes_total{service=\"ws\","
                          "direction=\"upstream\"} ")),
      ==, 10);
  free(m);
  htc_free(c);
  /* silence in both directions for the idle timeout cuts both sides */
  c = htc_new("127.0.0.1", e.port);
  assert_int_equal(htc_sends(&e.loop, c, UPGRADE_REQ("/chat", "websocket")), 0);
  assert_true(wait_bytes(&e, c, "\r\n\r\n", 4, 3000));
  t0 = htc_now_ms();
  while (!c->eof && htc_now_ms() - t0 < 3000)
    htc_step(&e.loop, c, 1);
  assert_true(c->eof);
  OM_ASSERT_CMP(htc_now_ms() - t0, >=, 350);
  t0 = htc_now_ms();
  while (a->tun_closes < 2 && htc_now_ms() - t0 < 3000)
    htc_step(&e.loop, NULL, 1);
  OM_ASSERT_CMP(a->tun_closes, ==, 2);
  m = admin_get(&e, "/metrics", &st);
  assert_int_equal(atoi(metric_line(m, "openmesh_proxy_requests_total{service="
                                       "\"ws\",outcome=\"aborted\"} ")),
                   1);
  free(m);
  htc_free(c);
  env_close(&e);
}

/* A tunnel is a committed stream: max_stream_ms cuts it however it
 * flows, and the cut is counted with the streams'. */
static void upgrade_tunnel_is_cut_at_max_stream(void **state) {
  env_t e;
  htc_t *c;
  char *m;
  int st, frames = 0;
  uint64_t t0;
  (void)state;
  env_init(&e);
  env_fx(&e, "a", FX_UPGRADE);
  env_proxy(&e, NULL,
            policy_file("wsmax.lua", "stream_idle_timeout_ms = 400,"
                                     " max_stream_ms = 500"));
  env_topology(&e, "ws", 1);
  c = htc_new("127.0.0.1", e.port);
  assert_non_null(c);
  assert_int_equal(htc_sends(&e.loop, c, UPGRADE_REQ("/chat", "websocket")), 0);
  assert_true(wait_bytes(&e, c, "\r\n\r\n", 4, 3000));
  t0 = htc_now_ms();
  /* a frame every 100 ms: never idle, cut by max_stream_ms alone */
  while (!c->eof && htc_now_ms() - t0 < 3000) {
    uint64_t t1 = htc_now_ms();
    while (!c->eof && htc_now_ms() - t1 < 100)
      htc_step(&e.loop, c, 1);
    if (!c->eof && htc_sends(&e.loop, c, "fx") == 0)
      frames++;
  }
  OM_TEST_NOTE("tunnel cut after %llu ms, %d frames sent",
               (unsigned long long)(htc_now_ms() - t0), frames);
  assert_true(c->eof);
  OM_ASSERT_CMP(htc_now_ms() - t0, >=, 450);
  OM_ASSERT_CMP(htc_now_ms() - t0, <, 1500);
  OM_ASSERT_CMP(frames, >=, 3); /* it flowed past the idle timeout */
  spin(&e, 50);
  m = admin_get(&e, "/metrics", &st);
  assert_int_equal(
      atoi(metric_line(m, "openmesh_proxy_streams_cut_total{service=\"ws\","
                          "reason=\"max_stream\"} ")),
      1);
  assert_int_equal(
      atoi(metric_line(m, "openmesh_proxy_streams_cut_total{service=\"ws\","
                          "reason=\"idle\"} ")),
      0);
  free(m);
  htc_free(c);
  env_close(&e);
}

static void upgrade_refusals_h2c_and_non_101_answers(void **state) {
  env_t e;
  fx_t *a;
  res_t r;
  char *m;
  int st;
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_UPGRADE);
  env_proxy(&e, NULL, policy_file("ws2.lua", ""));
  env_topology(&e, "ws", 1);
  /* a token the policy does not allow: 403, the peer never asked */
  call(&e, "GET", "ws", "/chat",
       "Connection: upgrade\r\nUpgrade: websocket, x-raw\r\n", NULL, &r);
  assert_int_equal(r.status, 403);
  assert_string_equal(r.reason, "upgrade_not_allowed");
  assert_non_null(strstr(r.body, "x-raw"));
  assert_int_equal(a->requests, 0);
  /* h2c is served over HTTP/1.1: the Upgrade is dropped */
  call(&e, "GET", "ws", "/chat", "Connection: Upgrade\r\nUpgrade: h2c\r\n",
       NULL, &r);
  assert_int_equal(r.status, 200);
  assert_string_equal(r.body, "a\n");
  assert_int_equal(a->requests, 1);
  assert_string_equal(a->last_upgrade, "");
  /* the peer declines: its answer is an ordinary response */
  call(&e, "GET", "ws", "/plain",
       "Connection: Upgrade\r\nUpgrade: websocket\r\n", NULL, &r);
  assert_int_equal(r.status, 200);
  assert_string_equal(r.body, "a\n");
  assert_string_equal(a->last_upgrade, "websocket");
  m = admin_get(&e, "/metrics", &st);
  assert_int_equal(
      atoi(metric_line(m, "openmesh_proxy_upgrades_total{service=\"ws\","
                          "outcome=\"not_allowed\"} ")),
      1);
  assert_int_equal(
      atoi(metric_line(m, "openmesh_proxy_upgrades_total{service=\"ws\","
                          "outcome=\"declined\"} ")),
      1);
  free(m);
  m = admin_get(&e, "/status", &st);
  assert_int_equal(st, 200);
  assert_non_null(strstr(m, "\"allowed\":[\"websocket\"]"));
  assert_non_null(strstr(m, "\"stream_idle_timeout_ms\":60000"));
  free(m);
  env_close(&e);
}

static void
upgrade_tunnel_pushes_back_on_a_peer_faster_than_the_client(void **state) {
  env_t e;
  fx_t *a;
  htc_t *c;
  char *m;
  int st;
  double relayed;
  uint64_t t0;
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_UPGRADE);
  env_proxy(&e, NULL, policy_file("ws5.lua", ""));
  env_topology(&e, "ws", 1);
  c = htc_new("127.0.0.1", e.port);
  assert_non_null(c);
  assert_int_equal(htc_sends(&e.loop, c, UPGRADE_REQ("/flood", "websocket")),
                   0);
  /* the client reads nothing for a while: the proxy stops reading the
   * peer once high_water is queued, and the peer's bytes wait there */
  spin(&e, 500);
  m = admin_get(&e, "/metrics", &st);
  relayed = atof(metric_line(m, "openmesh_proxy_tunnel_bytes_total{service="
                                "\"ws\",direction=\"downstream\"} "));
  free(m);
  OM_ASSERT_CMP(relayed, <, (double)FLOOD_MB * (1 << 20) / 2);
  OM_ASSERT_CMP(om_tunnel_pending(a->tun), >, (size_t)FLOOD_MB << 19);
  /* reading again resumes the peer: every byte arrives, then its FIN */
  t0 = htc_now_ms();
  while (!c->eof && htc_now_ms() - t0 < 20000)
    htc_step(&e.loop, c, 1);
  assert_true(c->eof);
  assert_false(c->reset);
  {
    const char *end = NULL;
    for (size_t i = 0; i + 4 <= c->len && end == NULL; i++)
      if (memcmp(c->buf + i, "\r\n\r\n", 4) == 0)
        end = c->buf + i + 4;
    assert_non_null(end);
    OM_ASSERT_CMP(c->total - (size_t)(end - c->buf), ==,
                  (size_t)FLOOD_MB << 20);
  }
  fprintf(stderr,
          "# tunnel backpressure: %.1f MiB relayed of %d while the "
          "client did not read\n",
          relayed / (1 << 20), FLOOD_MB);
  htc_free(c);
  env_close(&e);
}

static void upgrade_goes_to_another_peer_only_before_send(void **state) {
  env_t e;
  fx_t *a, *dead;
  char *m;
  int st, switched = 0;
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_UPGRADE);
  dead = env_fx(&e, "dead", FX_OK);
  /* nothing listens on port 1: every connect is refused */
  snprintf(dead->url, sizeof dead->url, "http://127.0.0.1:1");
  env_proxy(&e, NULL, policy_file("ws3.lua", "retries = 2"));
  env_topology(&e, "ws", 1);
  for (int i = 0; i < 10; i++) {
    htc_t *c = htc_new("127.0.0.1", e.port);
    assert_non_null(c);
    assert_int_equal(htc_sends(&e.loop, c, UPGRADE_REQ("/chat", "websocket")),
                     0);
    if (wait_bytes(&e, c, "\r\n\r\n", 4, 3000) &&
        strncmp(c->buf, "HTTP/1.1 101 ", 13) == 0)
      switched++;
    htc_free(c);
  }
  OM_ASSERT_CMP(switched, ==, 10);
  OM_ASSERT_CMP(a->requests, ==, 10);
  m = admin_get(&e, "/metrics", &st);
  /* nothing was sent to the refusing peer: those went to the other one */
  OM_ASSERT_CMP(
      atoi(metric_line(m, "openmesh_proxy_retries_total{service=\"ws\","
                          "phase=\"pre_send\"} ")),
      >=, 1);
  free(m);
  env_close(&e);
  /* a peer that took the request and then failed is not asked again,
   * where a plain GET is retried on the other peer */
  env_init(&e);
  a = env_fx(&e, "r1", FX_RESET);
  dead = env_fx(&e, "r2", FX_RESET);
  env_proxy(&e, NULL, policy_file("ws4.lua", "retries = 2"));
  env_topology(&e, "ws", 1);
  {
    res_t r;
    call(&e, "GET", "ws", "/chat",
         "Connection: upgrade\r\nUpgrade: websocket\r\n", NULL, &r);
    assert_int_equal(r.status, 502);
    assert_string_equal(r.attempts, "1");
    OM_ASSERT_CMP(a->requests + dead->requests, ==, 1);
    call(&e, "GET", "ws", "/chat", NULL, NULL, &r);
    assert_int_equal(r.status, 502);
    OM_ASSERT_CMP(a->requests + dead->requests, >=, 3);
  }
  env_close(&e);
}

static void close_drains_in_flight_calls(void **state) {
  env_t e;
  fx_t *s;
  htc_t *c;
  uint64_t t0;
  (void)state;
  env_init(&e);
  s = env_fx(&e, "s", FX_SLOW);
  s->delay_ms = 150;
  env_proxy(&e, NULL, policy_file("all.lua", ""));
  env_topology(&e, "orders", 1);
  c = htc_new("127.0.0.1", e.port);
  assert_int_equal(
      htc_sends(&e.loop, c, "GET / HTTP/1.1\r\nHost: orders\r\n\r\n"), 0);
  t0 = htc_now_ms();
  while (s->requests == 0 && htc_now_ms() - t0 < 2000)
    htc_step(&e.loop, c, 1);
  assert_int_equal(om_proxy_close(e.proxy, on_proxy_closed, &e.proxy_closed),
                   0);
  e.proxy = NULL;
  while (!e.proxy_closed && htc_now_ms() - t0 < 3000)
    htc_step(&e.loop, c, 1);
  assert_true(e.proxy_closed);
  assert_int_equal(htc_responses(c, NULL, &g_r, 1), 1);
  assert_int_equal(g_r.status, 200); /* finished, not cut */
  htc_free(c);
  env_close(&e);
}

/*
 * The whole request path (listener, policy, admission, selection,
 * upstream client, relaying) with the Nth allocation failing, for every N
 * until a request goes through without a failure: each call ends with
 * some answer or a closed connection, nothing leaks (ASan), and the proxy
 * serves normally afterwards.
 */
static void request_path_survives_allocation_failures(void **state) {
  env_t e;
  res_t r;
  int clean = 0, post = 0;
  long k, get_k = 0;
  (void)state;
  env_init(&e);
  env_fx(&e, "a", FX_OK);
  env_fx(&e, "b", FX_OK);
  env_proxy(&e, NULL, policy_file("all.lua", ""));
  env_topology(&e, "orders", 1);
  for (k = 0; k < 4000 && !(clean && post); k++) {
    static const char get_req[] =
        "GET / HTTP/1.1\r\nHost: orders\r\nx-openmesh-key: k\r\n\r\n";
    /* a streamed body: its pieces, the replay copy, the chunked end */
    static const char post_req[] =
        "POST / HTTP/1.1\r\nHost: orders\r\nx-openmesh-key: k\r\n"
        "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    const char *req = post ? post_req : get_req;
    htc_t *c = htc_new("127.0.0.1", e.port);
    uint64_t t0 = htc_now_ms();
    long failures;
    int n = 0;
    assert_non_null(c);
    om_test_fail_alloc_after(post ? k - get_k : k);
    if (htc_sends(&e.loop, c, req) == 0)
      while (htc_now_ms() - t0 < 2000) {
        htc_step(&e.loop, c, 1);
        n = htc_responses(c, NULL, &g_r, 1);
        if (n != 0 || c->eof)
          break;
      }
    failures = om_test_alloc_failures();
    om_test_alloc_reset();
    if (!c->eof) /* an answer or a closed connection */
      assert_int_equal(n, 1);
    clean = failures == 0 && n == 1 && g_r.status == 200;
    htc_free(c);
    spin(&e, 2);
    if (clean && !post) { /* the same again with a body */
      OM_TEST_NOTE("a request needs %ld allocations (cold connections)", k);
      post = 1;
      clean = 0;
      get_k = k + 1;
    }
  }
  OM_TEST_NOTE("a streamed POST needs %ld allocations", k - get_k - 1);
  OM_ASSERT_CMP(k - get_k, >, 3); /* failures were injected in the body path */
  assert_true(clean);
  assert_true(post);
  OM_ASSERT_CMP(k, >, 5); /* the path did allocate, so failures were injected */
  for (int i = 0; i < 4; i++) {
    get(&e, "orders", NULL, &r);
    assert_int_equal(r.status, 200);
  }
  env_close(&e);
}

/* ------------------------------------------------------------------ */
/* retries by send phase, and what is forwarded */

/* A loopback port nothing listens on (bound, read, closed). */
static int closed_port(void) {
  struct sockaddr_in a;
  socklen_t len = sizeof a;
  int fd = socket(AF_INET, SOCK_STREAM, 0), port;
  assert_true(fd >= 0);
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  port = ntohs(a.sin_port);
  close(fd);
  return port;
}

static void post_is_retried_after_a_refused_connection(void **state) {
  env_t e;
  fx_t *live;
  res_t r;
  om_proxy_stats_t st;
  om_instance_t in[2];
  om_snapshot_t *snap = NULL;
  char err[256], dead_url[64], want[160], *body;
  int ok = 0, status;
  (void)state;
  env_init(&e);
  live = env_fx(&e, "live", FX_OK);
  env_proxy(&e, NULL, policy_file("all.lua", ""));
  snprintf(dead_url, sizeof dead_url, "http://127.0.0.1:%d", closed_port());
  memset(in, 0, sizeof in);
  in[0] = (om_instance_t){
      .id = "dead", .url = dead_url, .weight = 1, .ttl_ms = 10000};
  in[1] = (om_instance_t){
      .id = "live", .url = live->url, .weight = 1, .ttl_ms = 10000};
  assert_int_equal(om_snapshot_new("orders", 1, in, 2, &snap, NULL, NULL, NULL),
                   0);
  assert_int_equal(om_proxy_set_snapshot(e.proxy, snap, err, sizeof err), 0);
  om_snapshot_unref(snap);
  /* POST without Idempotency-Key: the refused connect sent nothing, so
   * it goes to the live peer; nginx does the same */
  for (int i = 0; i < 100; i++) {
    call(&e, "POST", "orders", "/o", NULL, "{}", &r);
    if (r.status == 200 && strcmp(r.peer, "live") == 0)
      ok++;
    else
      print_message("POST %d: %d %s %s\n", i, r.status, r.reason, r.body);
  }
  assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
  print_message("%d of 100 POSTs succeeded; %llu pre-send retries, %llu "
                "retries in all\n",
                ok, (unsigned long long)st.retries_pre_send,
                (unsigned long long)st.retries);
  OM_ASSERT_CMP(ok, ==, 100);
  OM_ASSERT_CMP(live->posts, ==, 100);
  /* the dead peer was picked (else the test proves nothing), and every
   * retry after it was pre-send */
  OM_ASSERT_CMP(st.retries_pre_send, >=, 1);
  OM_ASSERT_CMP(st.retries_pre_send, ==, st.retries);
  body = admin_get(&e, "/metrics", &status);
  snprintf(want, sizeof want,
           "openmesh_proxy_retries_total{service=\"orders\","
           "phase=\"pre_send\"} %llu",
           (unsigned long long)st.retries_pre_send);
  if (strstr(body, want) == NULL ||
      strstr(body, "openmesh_proxy_retries_total{service=\"orders\","
                   "phase=\"post_send\"} 0") == NULL)
    fail_msg("want '%s' and post_send 0 in:\n%s", want, body);
  free(body);
  body = admin_get(&e, "/status", &status);
  {
    json_t *j = json_loads(body, 0, NULL), *ph;
    assert_non_null(j);
    ph = json_object_get(
        json_object_get(
            json_object_get(json_object_get(j, "services"), "orders"), "calls"),
        "retries_by_phase");
    OM_ASSERT_CMP(json_integer_value(json_object_get(ph, "pre_send")), ==,
                  (json_int_t)st.retries_pre_send);
    OM_ASSERT_CMP(json_integer_value(json_object_get(ph, "post_send")), ==, 0);
    json_decref(j);
  }
  free(body);
  /* a failure after bytes left still follows the method: a reset POST is
   * not retried, and counts nothing */
  live->mode = FX_RESET;
  {
    om_proxy_stats_t before = st;
    fx_t *one[] = {live};
    snap = snap_of("orders", 2, one, 1);
    assert_int_equal(om_proxy_set_snapshot(e.proxy, snap, err, sizeof err), 0);
    om_snapshot_unref(snap);
    call(&e, "POST", "orders", "/o", NULL, "{}", &r);
    assert_int_equal(r.status, 502);
    assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
    OM_ASSERT_CMP(st.retries, ==, before.retries);
  }
  env_close(&e);
}

/*
 * The value of the field name in the upstream's last request; NULL when
 * absent. Fails, printing every field the upstream saw, when the field
 * is there more than once.
 */
static const char *fwd_value(const fx_t *fx, const char *name, char *out,
                             size_t cap) {
  size_t nl = strlen(name);
  int found = 0;
  for (const char *l = fx->last_headers; *l != '\0';) {
    const char *nlp = strchr(l, '\n');
    size_t len = nlp ? (size_t)(nlp - l) : strlen(l);
    if (len > nl + 1 && memcmp(l, name, nl) == 0 && l[nl] == ':') {
      if (found++)
        fail_msg("'%s' forwarded twice; the upstream saw:\n%s", name,
                 fx->last_headers);
      snprintf(out, cap, "%.*s", (int)(len - nl - 2), l + nl + 2);
    }
    l += len + (nlp != NULL);
  }
  return found ? out : NULL;
}

/* The upstream saw name with value want (NULL: not at all). */
static void expect_fwd(const fx_t *fx, const char *name, const char *want) {
  char v[512];
  const char *got = fwd_value(fx, name, v, sizeof v);
  if (want == NULL ? got != NULL : got == NULL || strcmp(got, want) != 0)
    fail_msg("upstream '%s': got '%s', want '%s'; it saw:\n%s", name,
             got ? got : "(absent)", want ? want : "(absent)",
             fx->last_headers);
}

static void connection_strips_only_what_the_caller_sent(void **state) {
  env_t e;
  fx_t *a, *b;
  res_t r;
  char v[512];
  const char *got;
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_OK);
  env_proxy(&e, NULL, policy_file("all.lua", ""));
  env_topology(&e, "orders", 1);
  /* naming the proxy's fields (with none of them sent): ours survive */
  call(&e, "GET", "orders", "/",
       "Connection: x-forwarded-for, via, x-request-id, "
       "x-openmesh-deadline-ms\r\n",
       NULL, &r);
  assert_int_equal(r.status, 200);
  expect_fwd(a, "x-forwarded-for", "127.0.0.1");
  expect_fwd(a, "via", "1.1 openmesh");
  expect_fwd(a, "connection", NULL);
  got = fwd_value(a, "x-request-id", v, sizeof v);
  if (got == NULL || strlen(got) != 32)
    fail_msg("want a generated x-request-id; the upstream saw:\n%s",
             a->last_headers);
  got = fwd_value(a, "x-openmesh-deadline-ms", v, sizeof v);
  if (got == NULL)
    fail_msg("want x-openmesh-deadline-ms; the upstream saw:\n%s",
             a->last_headers);
  assert_in_range(atoi(got), 9001, 10000);
  /* the caller's own copies, named: removed; ours in their place. The
   * caller's deadline is the proxy's to read (it still applies) */
  call(&e, "GET", "orders", "/",
       "Connection: X-Forwarded-For, via,,x-request-id , x-openmesh-attempt, "
       "keep-alive, x-hop\r\n"
       "X-Forwarded-For: 10.9.9.9\r\nVia: 1.0 client\r\n"
       "x-request-id: theirs\r\nx-openmesh-deadline-ms: 3000\r\n"
       "x-openmesh-attempt: 7\r\nx-hop: 1\r\nKeep-Alive: timeout=5\r\n"
       "foo: bar\r\n",
       NULL, &r);
  assert_int_equal(r.status, 200);
  expect_fwd(a, "x-forwarded-for", "127.0.0.1");
  expect_fwd(a, "via", "1.1 openmesh");
  expect_fwd(a, "x-hop", NULL);
  expect_fwd(a, "keep-alive", NULL);
  expect_fwd(a, "x-openmesh-attempt", NULL);
  expect_fwd(a, "foo", "bar");
  got = fwd_value(a, "x-request-id", v, sizeof v);
  if (got == NULL || strlen(got) != 32)
    fail_msg("want a generated x-request-id; the upstream saw:\n%s",
             a->last_headers);
  got = fwd_value(a, "x-openmesh-deadline-ms", v, sizeof v);
  if (got == NULL)
    fail_msg("want x-openmesh-deadline-ms; the upstream saw:\n%s",
             a->last_headers);
  assert_in_range(atoi(got), 2001, 3000);
  /* Connection: idempotency-key strips the key, and the retry rules see
   * the request as forwarded: a key-less POST, not retried */
  a->mode = FX_FAIL;
  b = env_fx(&e, "b", FX_FAIL);
  env_topology(&e, "orders", 2);
  call(&e, "POST", "orders", "/o",
       "Idempotency-Key: k-1\r\nConnection: idempotency-key\r\n", "{}", &r);
  assert_int_equal(r.status, 503);
  assert_string_equal(r.attempts, "1");
  OM_ASSERT_CMP(a->posts + b->posts, ==, 1);
  expect_fwd(a->posts ? a : b, "idempotency-key", NULL);
  /* the same key, not named: forwarded, and the POST is retried */
  call(&e, "POST", "orders", "/o", "Idempotency-Key: k-2\r\n", "{}", &r);
  assert_int_equal(r.status, 503);
  assert_string_equal(r.attempts, "2");
  OM_ASSERT_CMP(a->posts + b->posts, ==, 3);
  expect_fwd(a, "idempotency-key", "k-2");
  expect_fwd(b, "idempotency-key", "k-2");
  env_close(&e);
}

static void proxy_authentication_fields_are_not_forwarded(void **state) {
  env_t e;
  fx_t *a;
  res_t r;
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_OK);
  a->resp_name = "Proxy-Authenticate";
  a->resp_value = "Basic realm=\"upstream\"";
  env_proxy(&e, NULL, policy_file("all.lua", ""));
  env_topology(&e, "orders", 1);
  call(&e, "GET", "orders", "/",
       "Proxy-Authorization: Basic b206cGFzcw==\r\n"
       "Authorization: Bearer t\r\n",
       NULL, &r);
  assert_int_equal(r.status, 200);
  /* RFC 9110 11.7.2: consumed by the proxy it is addressed to */
  expect_fwd(a, "proxy-authorization", NULL);
  expect_fwd(a, "authorization", "Bearer t");
  /* RFC 9110 11.7.1: for the next outbound client only */
  {
    char low[sizeof r.head];
    for (size_t i = 0; i < sizeof low; i++)
      low[i] = (char)((r.head[i] >= 'A' && r.head[i] <= 'Z') ? r.head[i] | 0x20
                                                             : r.head[i]);
    if (strstr(low, "proxy-authenticate") != NULL ||
        strstr(low, "content-type: text/plain") == NULL)
      fail_msg("the caller got:\n%s", r.head);
  }
  env_close(&e);
}

/* The forwarded traceparent looks like one the proxy made: version 00,
 * lower-hex, non-zero ids, sampled. */
static void expect_new_traceparent(const fx_t *fx, const char *sent) {
  char v[512];
  const char *got = fwd_value(fx, "traceparent", v, sizeof v);
  int ok = got != NULL && strlen(got) == 55 && strncmp(got, "00-", 3) == 0 &&
           got[35] == '-' && strcmp(got + 52, "-01") == 0 &&
           strspn(got + 3, "0123456789abcdef") == 32 &&
           strspn(got + 36, "0123456789abcdef") == 16 &&
           strncmp(got + 3, "00000000000000000000000000000000", 32) != 0 &&
           strncmp(got + 36, "0000000000000000", 16) != 0 &&
           (sent == NULL || strcmp(got, sent) != 0);
  if (!ok)
    fail_msg("sent traceparent '%s': want a new one, the upstream saw:\n%s",
             sent ? sent : "(none)", fx->last_headers);
  expect_fwd(fx, "tracestate", NULL);
}

static void traceparent_is_passed_through_or_created(void **state) {
  static const char *const invalid[] = {
      /* upper-case hex */
      "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
      /* all-zero trace-id, all-zero parent-id */
      "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
      /* version ff is forbidden; 00 is exactly 55 characters */
      "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
      /* a later version must go on with '-' */
      "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
      /* not hex, wrong separators */
      "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
      "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0z"};
  static const char valid[] =
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  static const char later[] =
      "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what-comes";
  env_t e;
  fx_t *a;
  res_t r;
  char extra[512], first[64], v[512];
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_OK);
  env_proxy(&e, NULL, policy_file("all.lua", ""));
  env_topology(&e, "orders", 1);
  /* valid: passed through with its tracestate */
  snprintf(extra, sizeof extra,
           "traceparent: %s\r\ntracestate: congo=t61rcWkgMzE\r\n", valid);
  get(&e, "orders", extra, &r);
  assert_int_equal(r.status, 200);
  expect_fwd(a, "traceparent", valid);
  expect_fwd(a, "tracestate", "congo=t61rcWkgMzE");
  snprintf(extra, sizeof extra, "traceparent: %s\r\n", later);
  get(&e, "orders", extra, &r);
  expect_fwd(a, "traceparent", later);
  /* absent: created (a lone tracestate has no parent: dropped); two
   * calls, two traces */
  get(&e, "orders", "tracestate: congo=t61rcWkgMzE\r\n", &r);
  assert_int_equal(r.status, 200);
  expect_new_traceparent(a, NULL);
  snprintf(first, sizeof first, "%s", fwd_value(a, "traceparent", v, sizeof v));
  get(&e, "orders", NULL, &r);
  expect_new_traceparent(a, first);
  /* invalid, or more than one: replaced, and tracestate dropped with it */
  for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++) {
    snprintf(extra, sizeof extra,
             "traceparent: %s\r\ntracestate: congo=t61rcWkgMzE\r\n",
             invalid[i]);
    get(&e, "orders", extra, &r);
    assert_int_equal(r.status, 200);
    expect_new_traceparent(a, invalid[i]);
  }
  snprintf(extra, sizeof extra, "traceparent: %s\r\ntraceparent: %s\r\n", valid,
           valid);
  get(&e, "orders", extra, &r);
  expect_new_traceparent(a, valid);
  /* named in Connection: the caller's is gone, a new trace starts */
  snprintf(extra, sizeof extra,
           "traceparent: %s\r\nConnection: traceparent\r\n", valid);
  get(&e, "orders", extra, &r);
  expect_new_traceparent(a, valid);
  env_close(&e);
}

/* ------------------------------------------------------------------ */
/* the deadline ends at commit; stream timeouts after */

typedef struct {
  int complete, eof, status, events;
  uint64_t t0, last_byte_ms, end_ms; /* htc_now_ms() */
  size_t total, body_len;
  char head[512];
} stream_t;

/*
 * A GET read until its response ends, the connection closes or ms pass:
 * when the last byte and the end came (client clock), how many SSE events
 * ("data: ") arrived, whether the response ended cleanly.
 */
static void stream_get(env_t *e, const char *service, const char *extra, int ms,
                       stream_t *st) {
  char req[512];
  htc_t *c = htc_new("127.0.0.1", e->port);
  size_t seen = 0;
  assert_non_null(c);
  memset(st, 0, sizeof *st);
  snprintf(req, sizeof req, "GET /events HTTP/1.1\r\nHost: %s\r\n%s\r\n",
           service, extra ? extra : "");
  st->t0 = htc_now_ms();
  assert_int_equal(htc_sends(&e->loop, c, req), 0);
  while (htc_now_ms() - st->t0 < (uint64_t)ms) {
    htc_step(&e->loop, c, 1);
    if (c->total != seen) {
      seen = c->total;
      st->last_byte_ms = htc_now_ms();
    }
    if (htc_responses(c, NULL, &g_r, 1) == 1) {
      st->complete = 1;
      break;
    }
    if (c->eof)
      break;
  }
  st->end_ms = htc_now_ms();
  st->eof = c->eof;
  st->total = c->total;
  if (c->len >= 12 && memcmp(c->buf, "HTTP/1.1 ", 9) == 0)
    st->status = atoi(c->buf + 9);
  for (size_t i = 0; i + 6 <= c->len; i++)
    if (memcmp(c->buf + i, "data: ", 6) == 0)
      st->events++;
  for (size_t i = 0; i + 3 < c->len; i++)
    if (memcmp(c->buf + i, "\r\n\r\n", 4) == 0) {
      size_t k = i < sizeof st->head - 1 ? i : sizeof st->head - 1;
      memcpy(st->head, c->buf, k);
      st->head[k] = '\0';
      st->body_len = c->len - (i + 4);
      break;
    }
  htc_free(c);
}

/* The value of one series in the admin /metrics, -1 when absent. */
static double metric_value(env_t *e, const char *series) {
  int status;
  char *body = admin_get(e, "/metrics", &status);
  const char *at = strstr(body, series);
  double v = at ? atof(at + strlen(series)) : -1;
  assert_int_equal(status, 200);
  free(body);
  return v;
}

static void stream_outlives_the_deadline_while_it_flows(void **state) {
  env_t e;
  fx_t *a;
  stream_t st;
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_SSE);
  a->sse_every_ms = 40;
  a->sse_count = 20; /* 800 ms in all: four deadlines, eight per-tries */
  env_proxy(&e, NULL,
            policy_file("sse.lua", "deadline_ms = 200, per_try_timeout_ms = "
                                   "100, stream_idle_timeout_ms = 300,"));
  env_topology(&e, "orders", 1);
  stream_get(&e, "orders", NULL, 5000, &st);
  OM_TEST_NOTE("20 events 40 ms apart, deadline 200 ms: %d events, "
               "complete %d, after %llu ms",
               st.events, st.complete, (unsigned long long)(st.end_ms - st.t0));
  assert_int_equal(st.status, 200);
  assert_int_equal(st.complete, 1); /* the last chunk came: a clean end */
  assert_int_equal(st.events, 20);
  OM_ASSERT_CMP(st.end_ms - st.t0, >=, 700);
  OM_ASSERT_CMP(metric_value(&e, "openmesh_proxy_streams_cut_total{service="
                                 "\"orders\",reason=\"idle\"} "),
                ==, 0.0);
  OM_ASSERT_CMP(metric_value(&e, "openmesh_proxy_requests_total{service="
                                 "\"orders\",outcome=\"ok\"} "),
                ==, 1.0);
  env_close(&e);
}

static void silent_stream_is_cut_after_idle_never_before(void **state) {
  env_t e;
  fx_t *a;
  stream_t st;
  uint64_t gap;
  int status;
  char *body;
  json_t *j, *t;
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_SSE);
  a->sse_every_ms = 30;
  a->sse_count = 3;
  a->sse_hang = 1; /* then silence, the connection open */
  env_proxy(&e, NULL,
            policy_file("idle.lua", "deadline_ms = 100, "
                                    "stream_idle_timeout_ms = 300,"));
  env_topology(&e, "orders", 1);
  stream_get(&e, "orders", NULL, 5000, &st);
  gap = st.end_ms - a->last_write_ms;
  OM_TEST_NOTE("idle 300 ms: cut %llu ms after the upstream's last byte "
               "(bounds [300, 800)), %d events, complete %d, eof %d",
               (unsigned long long)gap, st.events, st.complete, st.eof);
  assert_int_equal(st.status, 200);
  assert_int_equal(st.events, 3);
  assert_int_equal(st.complete, 0); /* no last chunk: never a clean end */
  assert_int_equal(st.eof, 1);
  /* Never before the idle timeout: the proxy's clock for the last byte is
   * no earlier than the upstream's write, and the cut reaches the client
   * after it happens. The upper bound leaves a loaded machine room. */
  OM_ASSERT_CMP(gap, >=, 300);
  OM_ASSERT_CMP(gap, <, 800);
  OM_ASSERT_CMP(metric_value(&e, "openmesh_proxy_streams_cut_total{service="
                                 "\"orders\",reason=\"idle\"} "),
                ==, 1.0);
  OM_ASSERT_CMP(metric_value(&e, "openmesh_proxy_requests_total{service="
                                 "\"orders\",outcome=\"aborted\"} "),
                ==, 1.0);
  /* /status shows the service's timeouts; none is null */
  body = admin_get(&e, "/status", &status);
  assert_int_equal(status, 200);
  j = json_loads(body, 0, NULL);
  assert_non_null(j);
  t = json_object_get(json_object_get(json_object_get(j, "services"), "orders"),
                      "timeouts");
  assert_non_null(t);
  OM_ASSERT_NEAR(json_number_value(json_object_get(t, "deadline_ms")), 100.0,
                 1e-9);
  OM_ASSERT_NEAR(json_number_value(json_object_get(t, "max_deadline_ms")),
                 100.0, 1e-9);
  OM_ASSERT_NEAR(
      json_number_value(json_object_get(t, "stream_idle_timeout_ms")), 300.0,
      1e-9);
  assert_true(json_is_null(json_object_get(t, "per_try_timeout_ms")));
  assert_true(json_is_null(json_object_get(t, "max_stream_ms")));
  json_decref(j);
  free(body);
  env_close(&e);
}

static void max_stream_cuts_a_flowing_stream(void **state) {
  env_t e;
  fx_t *a;
  stream_t st;
  uint64_t dt;
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_SSE);
  a->sse_every_ms = 30;
  a->sse_count = 1000; /* 30 s: flows far past the limit */
  env_proxy(&e, NULL,
            policy_file("max.lua", "stream_idle_timeout_ms = 300, "
                                   "max_stream_ms = 400,"));
  env_topology(&e, "orders", 1);
  stream_get(&e, "orders", NULL, 5000, &st);
  dt = st.end_ms - st.t0;
  OM_TEST_NOTE("max_stream 400 ms, an event every 30 ms: cut after %llu ms "
               "(bounds [400, 900)), %d events",
               (unsigned long long)dt, st.events);
  assert_int_equal(st.status, 200);
  assert_int_equal(st.complete, 0);
  assert_int_equal(st.eof, 1);
  /* counted from the head, which came after the request left */
  OM_ASSERT_CMP(dt, >=, 400);
  OM_ASSERT_CMP(dt, <, 900);
  OM_ASSERT_CMP(st.events, >=, 5); /* it flowed until the cut */
  OM_ASSERT_CMP(metric_value(&e, "openmesh_proxy_streams_cut_total{service="
                                 "\"orders\",reason=\"max_stream\"} "),
                ==, 1.0);
  OM_ASSERT_CMP(metric_value(&e, "openmesh_proxy_streams_cut_total{service="
                                 "\"orders\",reason=\"idle\"} "),
                ==, 0.0);
  env_close(&e);
}

static void content_length_cut_is_a_short_read(void **state) {
  env_t e;
  fx_t *a;
  stream_t st;
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_CL_STALL);
  a->cl_total = 1000;
  a->cl_sent = 100;
  env_proxy(&e, NULL, policy_file("cl.lua", "stream_idle_timeout_ms = 200,"));
  env_topology(&e, "orders", 1);
  stream_get(&e, "orders", NULL, 5000, &st);
  OM_TEST_NOTE("Content-Length 1000, 100 bytes then silence: %zu body bytes, "
               "eof %d after %llu ms",
               st.body_len, st.eof, (unsigned long long)(st.end_ms - st.t0));
  assert_int_equal(st.status, 200);
  {
    const char *cl;
    for (char *h = st.head; *h; h++) /* field names are case-insensitive */
      *h = (char)tolower((unsigned char)*h);
    cl = strstr(st.head, "\r\ncontent-length: 1000");
    if (cl == NULL || (cl[22] != '\r' && cl[22] != '\0'))
      fail_msg("no Content-Length: 1000 in the head: %s", st.head);
  }
  assert_int_equal(st.complete, 0);
  assert_int_equal(st.eof, 1); /* the connection closed short of the length */
  assert_int_equal(st.body_len, 100);
  OM_ASSERT_CMP(st.end_ms - a->last_write_ms, >=, 200);
  env_close(&e);
}

/*
 * A client that reads slowly keeps the upstream paused and takes a little
 * now and then, mostly from the kernel's buffers, so the proxy sees
 * neither a drain callback nor upstream bytes for several idle timeouts:
 * bytes waiting for the caller are not silence (whether it reads at all
 * is the listener's write-progress timeout to judge).
 */
/* A client with a 4 KiB receive window (so the proxy's side is what
 * backs up) that sent GET / for orders; its descriptor. */
static int small_window_get(int port) {
  static const char req[] = "GET / HTTP/1.1\r\nHost: orders\r\n\r\n";
  struct sockaddr_in sa;
  int fd = socket(AF_INET, SOCK_STREAM, 0), rcv = 4096;
  OM_ASSERT_CMP(fd, >=, 0);
  assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv), 0);
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  OM_ASSERT_CMP(send(fd, req, sizeof req - 1, 0), ==,
                (ssize_t)(sizeof req - 1));
  return fd;
}

static void slow_reader_idle_run(int splice) {
  env_t e;
  fx_t *a;
  om_proxy_opts_t o;
  om_proxy_stats_t st;
  char buf[4096];
  int fd, eof = 0;
  size_t got = 0;
  uint64_t t0;
  env_init(&e);
  a = env_fx(&e, "a", FX_STREAM_BIG);
  a->big_total = (size_t)24 << 20;
  memset(&o, 0, sizeof o);
  o.high_water = 64 * 1024;
  if (!splice)
    o.splice_min_bytes = UINT64_MAX;
  env_proxy(&e, &o,
            policy_file("slowread.lua", "stream_idle_timeout_ms = 300,"));
  env_topology(&e, "orders", 1);
  /* a small receive window, so the proxy's queue is what backs up */
  fd = small_window_get(e.port);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  t0 = htc_now_ms();
  /* 4 KiB every 50 ms (80 KB/s) for 1.5 s: five idle timeouts */
  while (htc_now_ms() - t0 < 1500 && !eof) {
    ssize_t n;
    spin(&e, 50);
    n = recv(fd, buf, sizeof buf, 0);
    if (n > 0)
      got += (size_t)n;
    else if (n == 0 || errno != EAGAIN)
      eof = 1;
  }
  assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
  OM_TEST_NOTE(
      "slow reader, idle 300 ms, splice %s: %zu bytes in %llu ms, "
      "eof %d, paused %llu time(s), %llu bytes spliced",
      splice ? "on" : "off", got, (unsigned long long)(htc_now_ms() - t0), eof,
      (unsigned long long)st.paused, (unsigned long long)st.spliced_bytes);
  if (splice)
    OM_ASSERT_CMP(st.spliced_bytes, >, 0);
  else
    OM_ASSERT_CMP(st.paused, >=, 1);
  assert_int_equal(eof, 0);
  OM_ASSERT_CMP(got, >=, (size_t)64 * 1024);
  OM_ASSERT_CMP(metric_value(&e, "openmesh_proxy_streams_cut_total{service="
                                 "\"orders\",reason=\"idle\"} "),
                ==, 0.0);
  close(fd);
  env_close(&e);
}

/* A client that stops reading in the middle of a spliced body: the
 * splice waits for its socket, so the stream is not idle; the listener's
 * write-progress timeout (server idle_timeout_ms) judges the client and
 * closes it, which ends the call. */
static void a_client_that_stops_reading_a_splice_is_cut(void **state) {
  env_t e;
  fx_t *a;
  om_proxy_opts_t o;
  om_proxy_stats_t st;
  int fd;
  uint64_t t0, took = 0;
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_STREAM_BIG);
  a->big_total = (size_t)24 << 20;
  memset(&o, 0, sizeof o);
  o.server.idle_timeout_ms = 400;
  env_proxy(&e, &o, policy_file("stopread.lua", ""));
  env_topology(&e, "orders", 1);
  fd = small_window_get(e.port);
  t0 = htc_now_ms();
  /* the call is in flight, then ends once the write stalls long enough */
  while (htc_now_ms() - t0 < 5000) {
    spin(&e, 20);
    assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
    if (st.spliced_bytes > 0 && st.inflight == 0) {
      took = htc_now_ms() - t0;
      break;
    }
  }
  OM_TEST_NOTE("a client that never reads: %llu bytes spliced, the call "
               "ended after %llu ms",
               (unsigned long long)st.spliced_bytes, (unsigned long long)took);
  OM_ASSERT_CMP(st.spliced_bytes, >, 0);
  assert_int_equal(st.inflight, 0);
  OM_ASSERT_CMP(took, >=, (uint64_t)400);
  close(fd);
  env_close(&e);
}

static void slow_reader_is_traffic_not_idle(void **state) {
  (void)state;
  slow_reader_idle_run(0);
}

static void slow_reader_over_a_splice_is_traffic_not_idle(void **state) {
  (void)state;
  slow_reader_idle_run(1);
}

/* Before the commit the deadline bounds everything, also the discarded
 * body of a 503 that is to be retried when that body stalls. */
static void stalled_discarded_body_is_bounded_by_the_deadline(void **state) {
  env_t e;
  res_t r;
  (void)state;
  env_init(&e);
  for (int i = 0; i < 2; i++) {
    fx_t *f = env_fx(&e, i ? "b" : "a", FX_CL_STALL);
    f->cl_status = 503;
    f->cl_total = 1000;
    f->cl_sent = 10;
  }
  env_proxy(&e, NULL,
            policy_file("discard.lua", "deadline_ms = 300, retries = 2,"));
  env_topology(&e, "orders", 1);
  get(&e, "orders", NULL, &r);
  OM_TEST_NOTE("503 with a stalled body, deadline 300 ms: %d %s after %llu "
               "ms, %u request(s) upstream",
               r.status, r.reason, (unsigned long long)r.ms,
               total_requests(&e));
  assert_int_equal(r.status, 504);
  assert_string_equal(r.reason, "deadline_exceeded");
  OM_ASSERT_CMP(r.ms, >=, 270);
  OM_ASSERT_CMP(r.ms, <, 1000);
  assert_int_equal(total_requests(&e), 1);
  env_close(&e);
}

static void slow_first_byte_is_waited_for_within_the_deadline(void **state) {
  env_t e;
  fx_t *a;
  res_t r;
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_SLOW);
  /* 1.2x the per-try timeout the default policy used to pin (3 s); its
   * deadline (10 s) leaves room, and nothing else bounds the head now */
  a->delay_ms = 3600;
  env_proxy(&e, NULL, OM_SOURCE_DIR "/policies/traffic.lua");
  env_topology(&e, "orders", 1);
  get(&e, "orders", NULL, &r);
  OM_TEST_NOTE("first byte after 3.6 s, default policy: %d after %llu ms, "
               "%s attempt(s)",
               r.status, (unsigned long long)r.ms, r.attempts);
  assert_int_equal(r.status, 200);
  assert_string_equal(r.attempts, "1");
  OM_ASSERT_CMP(r.ms, >=, 3600);
  assert_int_equal(a->requests, 1);
  env_close(&e);
}

static void deadline_header_is_capped_at_max_deadline(void **state) {
  env_t e;
  fx_t *a;
  res_t r;
  om_proxy_opts_t o;
  om_proxy_service_policy_t sp;
  static const struct {
    const char *service, *asked;
    int lo, hi;
  } cases[] = {
      /* The upper bounds are the caps; the lower ones leave a loaded
       * machine room before the attempt and still tell the cap from the
       * other answers (the 1e12 asked, or the 1000 of no header). */
      /* max_deadline_ms = 2000 */
      {"orders", "1000000000000", 1500, 2000},
      {"orders", "2001", 1500, 2000},
      {"orders", "1500", 1001, 1500},
      {"orders", NULL, 500, 1000},
      /* no max_deadline_ms: the service's deadline_ms is the cap */
      {"users", "5000", 500, 1000},
      {"users", "400", 1, 400},
  };
  char header[64];
  (void)state;
  env_init(&e);
  a = env_fx(&e, "a", FX_OK);
  memset(&o, 0, sizeof o);
  sp.service = "users";
  sp.path = policy_file("users.lua", "deadline_ms = 1000,");
  o.service_policies = &sp;
  o.n_service_policies = 1;
  env_proxy(&e, &o,
            policy_file("cap.lua", "deadline_ms = 1000, max_deadline_ms = "
                                   "2000,"));
  env_topology(&e, "orders", 1);
  env_topology(&e, "users", 1);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    a->last_deadline[0] = '\0';
    snprintf(header, sizeof header, "x-openmesh-deadline-ms: %s\r\n",
             cases[i].asked ? cases[i].asked : "");
    get(&e, cases[i].service, cases[i].asked ? header : NULL, &r);
    OM_TEST_NOTE("%s, asked %s: forwarded x-openmesh-deadline-ms %s "
                 "(want %d..%d)",
                 cases[i].service, cases[i].asked ? cases[i].asked : "nothing",
                 a->last_deadline, cases[i].lo, cases[i].hi);
    assert_int_equal(r.status, 200);
    assert_in_range(atoi(a->last_deadline), cases[i].lo, cases[i].hi);
  }
  env_close(&e);
}

/* ------------------------------------------------------------------ */
/* streamed request bodies */

static char upload[8u << 20];

/* Send head, then body in pieces with loop turns between them; wait for
 * one response (or EOF) up to ms. Returns the client (free it). */
static htc_t *upload_call(env_t *e, const char *head, const char *body,
                          size_t len, size_t piece, int ms, res_t *res) {
  htc_t *c = htc_new("127.0.0.1", e->port);
  uint64_t t0 = htc_now_ms();
  int n = 0;
  assert_non_null(c);
  assert_int_equal(htc_sends(&e->loop, c, head), 0);
  for (size_t off = 0; off < len && !c->eof; off += piece) {
    size_t k = len - off < piece ? len - off : piece;
    if (htc_send(&e->loop, c, body + off, k) != 0)
      break;
    htc_step(&e->loop, c, 0);
  }
  while (htc_now_ms() - t0 < (uint64_t)ms) {
    htc_step(&e->loop, c, 1);
    n = htc_responses(c, NULL, &g_r, 1);
    if (n != 0 || c->eof)
      break;
  }
  if (n == 0)
    n = htc_responses(c, NULL, &g_r, 1);
  fill_res(res, c, n, &g_r, t0);
  return c;
}

/* A proxy for orders over a peer that refuses connections and a live
 * one; replay_limit 0: the default. */
static fx_t *env_dead_and_live(env_t *e, uint64_t replay_limit) {
  fx_t *live;
  om_proxy_opts_t o;
  om_instance_t in[2];
  om_snapshot_t *snap = NULL;
  char err[256], dead_url[64];
  env_init(e);
  live = env_fx(e, "live", FX_OK);
  memset(&o, 0, sizeof o);
  o.replay_limit = replay_limit;
  env_proxy(e, &o, policy_file("all.lua", "deadline_ms = 20000,"));
  snprintf(dead_url, sizeof dead_url, "http://127.0.0.1:%d", closed_port());
  memset(in, 0, sizeof in);
  in[0] = (om_instance_t){
      .id = "dead", .url = dead_url, .weight = 1, .ttl_ms = 10000};
  in[1] = (om_instance_t){
      .id = "live", .url = live->url, .weight = 1, .ttl_ms = 10000};
  assert_int_equal(om_snapshot_new("orders", 1, in, 2, &snap, NULL, NULL, NULL),
                   0);
  assert_int_equal(om_proxy_set_snapshot(e->proxy, snap, err, sizeof err), 0);
  om_snapshot_unref(snap);
  return live;
}

/* A 200 KiB POST whose first attempt meets a refused connection is sent
 * again whole from the spans held for the replay; past replay_limit the
 * retry is refused at once rather than sent short. */
static void upload_is_replayed_whole_after_a_refused_connection(void **state) {
  enum { LEN = 200u << 10, CALLS = 40 };
  env_t e;
  fx_t *live;
  res_t r;
  htc_t *c;
  om_proxy_stats_t st;
  char head[256];
  int ok = 0, refused = 0;
  (void)state;
  for (size_t i = 0; i < LEN; i++)
    upload[i] = (char)('a' + (i * 13 + i / 11) % 26);
  snprintf(head, sizeof head,
           "POST /up HTTP/1.1\r\nHost: orders\r\nContent-Length: %u\r\n\r\n",
           (unsigned)LEN);
  live = env_dead_and_live(&e, 0);
  for (int i = 0; i < CALLS; i++) {
    live->last_body_len = 0;
    c = upload_call(&e, head, upload, LEN, 64u << 10, 10000, &r);
    htc_free(c);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.peer, "live");
    OM_ASSERT_CMP(live->last_body_len, ==, (size_t)LEN);
    assert_true(live->last_body_hash == fnv1a(upload, LEN));
  }
  assert_int_equal(om_proxy_stats(e.proxy, "orders", &st), 0);
  /* the dead peer was met first (else nothing was replayed) */
  OM_ASSERT_CMP(st.retries_pre_send, >=, 1);
  env_close(&e);

  /* replay_limit 1 KiB: what went to the refused attempt is not kept */
  live = env_dead_and_live(&e, 1024);
  for (int i = 0; i < CALLS; i++) {
    live->last_body_len = 0;
    c = upload_call(&e, head, upload, LEN, 64u << 10, 10000, &r);
    htc_free(c);
    if (r.status == 200) {
      ok++;
      OM_ASSERT_CMP(live->last_body_len, ==, (size_t)LEN);
      assert_true(live->last_body_hash == fnv1a(upload, LEN));
    } else {
      refused++;
      OM_ASSERT_CMP(r.status, ==, 502);
      OM_ASSERT_CMP(r.ms, <, 3000); /* no wait for a body that never ends */
    }
  }
  print_message("replay_limit 1 KiB: %d whole, %d refused\n", ok, refused);
  OM_ASSERT_CMP(ok + refused, ==, CALLS);
  OM_ASSERT_CMP(ok, >=, 1);
  env_close(&e);
}

/* An upload is forwarded as it arrives, with Content-Length or chunked,
 * and reaches the peer byte for byte; the bytes are counted. */
static void upload_is_streamed_to_the_peer_whole(void **state) {
  env_t e;
  fx_t *a;
  res_t r;
  htc_t *c;
  char head[256], *body;
  int status;
  (void)state;
  for (size_t i = 0; i < sizeof upload; i++)
    upload[i] = (char)('a' + (i * 31 + i / 7) % 26);
  env_init(&e);
  a = env_fx(&e, "a", FX_OK);
  env_proxy(&e, NULL, policy_file("all.lua", "deadline_ms = 20000,"));
  env_topology(&e, "orders", 1);
  snprintf(head, sizeof head,
           "PUT /up HTTP/1.1\r\nHost: orders\r\nContent-Length: %zu\r\n\r\n",
           sizeof upload);
  c = upload_call(&e, head, upload, sizeof upload, 256u << 10, 10000, &r);
  htc_free(c);
  assert_int_equal(r.status, 200);
  OM_ASSERT_CMP(a->last_body_len, ==, sizeof upload);
  assert_true(a->last_body_hash == fnv1a(upload, sizeof upload));
  /* chunked from the client, and the length unknown to the proxy */
  {
    static const char chunked[] = "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
    c = upload_call(&e,
                    "POST /up HTTP/1.1\r\nHost: orders\r\n"
                    "Transfer-Encoding: chunked\r\n\r\n",
                    chunked, sizeof chunked - 1, 7, 5000, &r);
    htc_free(c);
    assert_int_equal(r.status, 200);
    OM_ASSERT_CMP(a->last_body_len, ==, 11);
    assert_true(a->last_body_hash == fnv1a("hello world", 11));
  }
  body = admin_get(&e, "/metrics", &status);
  {
    char want[128];
    snprintf(want, sizeof want,
             "openmesh_proxy_request_body_bytes_total{service=\"orders\"} %zu",
             sizeof upload + 11);
    if (strstr(body, want) == NULL)
      fail_msg("no '%s' in /metrics", want);
  }
  free(body);
  env_close(&e);
}

/* max_body_bytes: 413 at the head for a Content-Length (readable by a
 * client that sends the body anyway), 413 when a chunked count passes
 * it, 413 for a small body that came whole with its head; a body that stalls
 * past body_idle_timeout_ms gets 408. The settings show in /status and the
 * refusals in /metrics. */
static void body_limits_and_stalls(void **state) {
  env_t e;
  fx_t *a;
  res_t r;
  htc_t *c;
  char *body;
  int status;
  uint64_t t0;
  (void)state;
  memset(upload, 'u', 64u << 10);
  env_init(&e);
  a = env_fx(&e, "a", FX_OK);
  env_proxy(&e, NULL,
            policy_file("limits.lua", "max_body_bytes = 1000,\n"
                                      "body_idle_timeout_ms = 150,\n"
                                      "replay_limit = 4096,"));
  env_topology(&e, "orders", 1);
  c = upload_call(&e,
                  "PUT /up HTTP/1.1\r\nHost: orders\r\n"
                  "Content-Length: 65536\r\n\r\n",
                  upload, 65536, 8192, 5000, &r);
  assert_int_equal(r.status, 413);
  assert_string_equal(r.reason, "body_too_large");
  assert_false(c->reset);
  htc_free(c);
  assert_int_equal(a->requests, 0);
  /* chunked: refused when the running count passes the limit */
  {
    char chunked[3000];
    int k = snprintf(chunked, sizeof chunked, "800\r\n");
    memset(chunked + k, 'c', 2048);
    k += 2048;
    k += snprintf(chunked + k, sizeof chunked - (size_t)k, "\r\n0\r\n\r\n");
    c = upload_call(&e,
                    "POST /up HTTP/1.1\r\nHost: orders\r\n"
                    "Transfer-Encoding: chunked\r\n\r\n",
                    chunked, (size_t)k, 512, 5000, &r);
    htc_free(c);
    assert_int_equal(r.status, 413);
    assert_string_equal(r.reason, "body_too_large");
  }
  /* a small body that came with its head (taken whole, not streamed):
   * refused by its length the same way, the peer never sees it */
  {
    static char small[2001];
    memset(small, 's', sizeof small - 1);
    call(&e, "PUT", "orders", "/up", NULL, small, &r);
    assert_int_equal(r.status, 413);
    assert_string_equal(r.reason, "body_too_large");
    assert_int_equal(a->requests, 0);
  }
  /* a stall: 408 after the idle timeout, not before */
  t0 = htc_now_ms();
  c = upload_call(&e,
                  "PUT /up HTTP/1.1\r\nHost: orders\r\n"
                  "Content-Length: 900\r\n\r\n",
                  "partial", 7, 7, 3000, &r);
  htc_free(c);
  assert_int_equal(r.status, 408);
  OM_ASSERT_CMP(htc_now_ms() - t0, >=, 140);
  body = admin_get(&e, "/metrics", &status);
  assert_non_null(strstr(body, "openmesh_proxy_requests_total{service=\""
                               "orders\",outcome=\"body_too_large\"} 3"));
  assert_non_null(strstr(body, "openmesh_proxy_requests_total{service=\""
                               "orders\",outcome=\"request_timeout\"} 1"));
  free(body);
  body = admin_get(&e, "/status", &status);
  {
    json_t *j = json_loads(body, 0, NULL), *b;
    assert_non_null(j);
    b = json_object_get(
        json_object_get(json_object_get(j, "services"), "orders"), "body");
    assert_int_equal(json_integer_value(json_object_get(b, "max_body_bytes")),
                     1000);
    assert_int_equal(json_integer_value(json_object_get(b, "replay_limit")),
                     4096);
    assert_int_equal(
        json_integer_value(json_object_get(b, "body_idle_timeout_ms")), 150);
    json_decref(j);
  }
  free(body);
  env_close(&e);
}

/* A retried POST (the policy opts in) reaches the second peer whole: the
 * body sent to the first is replayed from the replay buffer. */
static void retried_post_reaches_the_second_peer_whole(void **state) {
  env_t e;
  fx_t *a, *b;
  res_t r;
  htc_t *c;
  char head[256], key[32];
  (void)state;
  for (size_t i = 0; i < 20000; i++)
    upload[i] = (char)('A' + (i * 7) % 26);
  env_init(&e);
  a = env_fx(&e, "a", FX_FAIL);
  b = env_fx(&e, "b", FX_OK);
  env_proxy(&e, NULL, policy_file("optin.lua", "retry_non_idempotent = true,"));
  env_topology(&e, "orders", 1);
  key_owned_by("a", key, sizeof key); /* a first, then b */
  snprintf(head, sizeof head,
           "POST /o HTTP/1.1\r\nHost: orders\r\nx-openmesh-key: %s\r\n"
           "Content-Length: 20000\r\n\r\n",
           key);
  for (unsigned i = 1; i <= 3; i++) {
    c = upload_call(&e, head, upload, 20000, 4096, 5000, &r);
    htc_free(c);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.attempts, "2");
    assert_int_equal(a->posts, i);
    OM_ASSERT_CMP(a->last_body_len, ==, 20000);
    OM_ASSERT_CMP(b->last_body_len, ==, 20000);
    assert_true(b->last_body_hash == fnv1a(upload, 20000));
  }
  { /* the copies were given back when the calls ended */
    int status;
    char *body = admin_get(&e, "/status", &status);
    json_t *j = json_loads(body, 0, NULL);
    assert_non_null(j);
    OM_ASSERT_CMP(json_integer_value(json_object_get(
                      json_object_get(j, "replay"), "held_bytes")),
                  ==, 0);
    json_decref(j);
    free(body);
  }
  env_close(&e);
}

/* The replay copies of all calls share the proxy's replay_budget: a body
 * whose copy would pass it goes on without one, so it is not retried, and
 * /status says so. */
static void replay_budget_bounds_the_copies_of_all_calls(void **state) {
  env_t e;
  fx_t *a, *b;
  res_t r;
  htc_t *c;
  om_proxy_opts_t o;
  char head[256], key[32], *body;
  int status;
  (void)state;
  for (size_t i = 0; i < 20000; i++)
    upload[i] = (char)('A' + (i * 7) % 26);
  env_init(&e);
  a = env_fx(&e, "a", FX_FAIL);
  b = env_fx(&e, "b", FX_OK);
  memset(&o, 0, sizeof o);
  o.replay_budget = 16384; /* below the 20000-byte body's copy */
  env_proxy(&e, &o, policy_file("optin.lua", "retry_non_idempotent = true,"));
  env_topology(&e, "orders", 1);
  key_owned_by("a", key, sizeof key);
  snprintf(head, sizeof head,
           "POST /o HTTP/1.1\r\nHost: orders\r\nx-openmesh-key: %s\r\n"
           "Content-Length: 20000\r\n\r\n",
           key);
  c = upload_call(&e, head, upload, 20000, 4096, 5000, &r);
  htc_free(c);
  OM_TEST_NOTE("over the replay budget: %d after %s attempt(s)", r.status,
               r.attempts);
  OM_ASSERT_CMP(r.status, >=, 500); /* a's failure, relayed: no replay */
  assert_string_equal(r.attempts, "1");
  OM_ASSERT_CMP(a->posts, ==, 1);
  OM_ASSERT_CMP(b->posts, ==, 0);
  body = admin_get(&e, "/status", &status);
  {
    json_t *j = json_loads(body, 0, NULL), *rp;
    assert_non_null(j);
    rp = json_object_get(j, "replay");
    OM_ASSERT_CMP(json_integer_value(json_object_get(rp, "refused")), ==, 1);
    OM_ASSERT_CMP(json_integer_value(json_object_get(rp, "held_bytes")), ==, 0);
    OM_ASSERT_CMP(json_integer_value(json_object_get(rp, "budget_bytes")), ==,
                  16384);
    json_decref(j);
  }
  free(body);
  env_close(&e);
}

static int group_setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/om-proxy-test.XXXXXX");
  if (mkdtemp(g_dir) == NULL)
    return -1;
  return 0;
}

static int group_teardown(void **state) {
  char cmd[128];
  (void)state;
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(static_file_is_validated_with_named_fields),
      cmocka_unit_test(new_validates_and_survives_no_memory),
      cmocka_unit_test(snapshot_seam_keeps_peer_state_and_refuses_bad_updates),
      cmocka_unit_test(forwards_with_headers_and_relays_the_response),
      cmocka_unit_test(empty_subset_and_empty_service_are_no_peers),
      cmocka_unit_test(keyed_affinity_holds_across_calls),
      cmocka_unit_test(unkeyed_load_spreads_by_load),
      cmocka_unit_test(adaptive_pool_stays_within_max_inflight),
      cmocka_unit_test(canary_never_reaches_unmatched_requests),
      cmocka_unit_test(policy_sees_each_revision_of_its_peers),
      cmocka_unit_test(deadline_bounds_total_latency),
      cmocka_unit_test(expired_in_queue_never_reaches_upstream),
      cmocka_unit_test(overload_fails_fast_with_bounded_state),
      cmocka_unit_test(post_is_retried_only_with_idempotency_key),
      cmocka_unit_test(retry_policy_opt_in_replay_limit_and_budget),
      cmocka_unit_test(keyed_retry_walks_the_rank_and_429_waits_retry_after),
      cmocka_unit_test(policy_opts_in_to_429_retries),
      cmocka_unit_test(failing_peer_is_bypassed_until_cooldown_then_probed),
      cmocka_unit_test(abandoned_probe_frees_the_circuit_slot),
      cmocka_unit_test(policy_sets_the_circuits),
      cmocka_unit_test(stream_cut_after_headers_is_an_error_never_replayed),
      cmocka_unit_test(slow_reader_pauses_the_upstream),
      cmocka_unit_test(slow_reader_over_a_splice_gets_every_byte),
      cmocka_unit_test(policy_error_never_widens),
      cmocka_unit_test(overrunning_policy_is_shed_then_probed),
      cmocka_unit_test(policies_hot_reload_and_keep_the_last_good_one),
      cmocka_unit_test(vary_policies_are_cached_and_see_only_what_they_declare),
      cmocka_unit_test(authorize_refuses_before_any_peer),
      cmocka_unit_test(vary_cache_is_bounded),
      cmocka_unit_test(admin_serves_metrics_status_and_health),
      cmocka_unit_test(upgrade_tunnels_past_the_deadline_until_a_side_closes),
      cmocka_unit_test(upgrade_tunnel_is_cut_at_max_stream),
      cmocka_unit_test(upgrade_refusals_h2c_and_non_101_answers),
      cmocka_unit_test(upgrade_goes_to_another_peer_only_before_send),
      cmocka_unit_test(
          upgrade_tunnel_pushes_back_on_a_peer_faster_than_the_client),
      cmocka_unit_test(close_drains_in_flight_calls),
      cmocka_unit_test(request_path_survives_allocation_failures),
      cmocka_unit_test(post_is_retried_after_a_refused_connection),
      cmocka_unit_test(connection_strips_only_what_the_caller_sent),
      cmocka_unit_test(proxy_authentication_fields_are_not_forwarded),
      cmocka_unit_test(traceparent_is_passed_through_or_created),
      cmocka_unit_test(stream_outlives_the_deadline_while_it_flows),
      cmocka_unit_test(silent_stream_is_cut_after_idle_never_before),
      cmocka_unit_test(max_stream_cuts_a_flowing_stream),
      cmocka_unit_test(content_length_cut_is_a_short_read),
      cmocka_unit_test(slow_reader_is_traffic_not_idle),
      cmocka_unit_test(slow_reader_over_a_splice_is_traffic_not_idle),
      cmocka_unit_test(a_client_that_stops_reading_a_splice_is_cut),
      cmocka_unit_test(stalled_discarded_body_is_bounded_by_the_deadline),
      cmocka_unit_test(slow_first_byte_is_waited_for_within_the_deadline),
      cmocka_unit_test(deadline_header_is_capped_at_max_deadline),
      cmocka_unit_test(upload_is_streamed_to_the_peer_whole),
      cmocka_unit_test(upload_is_replayed_whole_after_a_refused_connection),
      cmocka_unit_test(body_limits_and_stalls),
      cmocka_unit_test(retried_post_reaches_the_second_peer_whole),
      cmocka_unit_test(replay_budget_bounds_the_copies_of_all_calls),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
