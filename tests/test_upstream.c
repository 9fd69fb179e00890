/*
 * test_upstream.c: the upstream HTTP/1.1 client against a fixture server
 * written here with raw libuv TCP, on real loopback sockets, on the same
 * loop. The fixture misbehaves on purpose (split bytes, stalls, resets,
 * malformed heads, keep-alive vs close); nothing of the client is mocked.
 *
 * The fixture allocates nothing once set up (its connections, buffers and
 * write requests are preallocated), so allocation fault injection hits
 * only the client.
 */
#include "om_test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <uv.h>

#include "om_errno.h"
#include "om_upstream.h"

/* ------------------------------------------------------------------ */
/* the fixture server */

#define MAX_SCONN 24
#define MAX_ACTS 64
#define SC_IN (64u * 1024u)

enum { A_WRITE, A_CLOSE, A_RESET };

typedef struct {
  int type;
  uint64_t delay_ms; /* wait this long before the action */
  const char *data;
  size_t len;
  uv_write_t wr;
} act_t;

typedef struct srv_s srv_t;

typedef struct sconn_s {
  uv_tcp_t tcp;
  uv_timer_t timer;
  uv_shutdown_t sd;
  srv_t *srv;
  int used, closing, handles, eof_seen;
  char in[SC_IN];
  size_t in_len;
  act_t acts[MAX_ACTS];
  unsigned nacts, cur; /* ring counters */
  int waited;
  int in_body, early;
  size_t body_left;
  char out[16384]; /* echo responses */
} sconn_t;

typedef struct {
  char method[16];
  char target[512];
  char head[8192];
  size_t head_len;
  char body[8192]; /* the first 8 KiB */
  size_t body_len;
  uint64_t body_sum;
} sreq_t;

typedef void (*handler_fn)(srv_t *s, sconn_t *sc, const sreq_t *q);

struct srv_s {
  uv_loop_t *loop;
  uv_tcp_t lis;
  int port;
  int lis_open;
  sconn_t sc[MAX_SCONN];
  handler_fn handler;
  const char *raw; /* for h_raw */
  size_t raw_len;
  int accepts, requests, n_get, n_post, n_head, closed;
  sreq_t last;
};

static void sc_run(sconn_t *sc);

static void on_sc_closed(uv_handle_t *h) {
  sconn_t *sc = h->data;
  if (--sc->handles == 0) {
    sc->used = 0;
    sc->srv->closed++;
  }
}

static void sc_close(sconn_t *sc, int reset) {
  if (sc->closing)
    return;
  sc->closing = 1;
  if (reset)
    uv_tcp_close_reset(&sc->tcp, on_sc_closed);
  else
    uv_close((uv_handle_t *)&sc->tcp, on_sc_closed);
  uv_close((uv_handle_t *)&sc->timer, on_sc_closed);
}

static void on_sc_shutdown(uv_shutdown_t *sd, int status) {
  sconn_t *sc = sd->data;
  (void)status;
  sc_close(sc, 0);
}

static void on_sc_write(uv_write_t *w, int status) {
  (void)w;
  (void)status;
}

static void sc_queue(sconn_t *sc, int type, uint64_t delay, const char *d,
                     size_t n) {
  act_t *a;
  OM_ASSERT_CMP(sc->nacts - sc->cur, <, MAX_ACTS);
  a = &sc->acts[sc->nacts++ % MAX_ACTS];
  a->type = type;
  a->delay_ms = delay;
  a->data = d;
  a->len = n;
}

#define SEND(sc, s) sc_queue(sc, A_WRITE, 0, s, strlen(s))
#define SEND_LATER(sc, ms, s) sc_queue(sc, A_WRITE, ms, s, strlen(s))

static void on_sc_timer(uv_timer_t *t) {
  sc_run(t->data);
}

static void sc_run(sconn_t *sc) {
  while (sc->cur != sc->nacts && !sc->closing) {
    act_t *a = &sc->acts[sc->cur % MAX_ACTS];
    uv_stream_t *st = (uv_stream_t *)&sc->tcp;
    if (a->delay_ms > 0 && !sc->waited) {
      sc->waited = 1;
      uv_timer_start(&sc->timer, on_sc_timer, a->delay_ms, 0);
      return;
    }
    sc->waited = 0;
    sc->cur++;
    if (a->type == A_WRITE) {
      uv_buf_t b = uv_buf_init((char *)a->data, (unsigned)a->len);
      int n = uv_stream_get_write_queue_size(st) == 0 ? uv_try_write(st, &b, 1)
                                                      : UV_EAGAIN;
      if (n == UV_EAGAIN)
        n = 0;
      if (n >= 0 && (size_t)n < a->len) {
        b.base += n;
        b.len -= (unsigned)n;
        a->wr.data = sc;
        uv_write(&a->wr, st, &b, 1, on_sc_write);
      }
    } else if (a->type == A_RESET) {
      sc_close(sc, 1);
    } else if (uv_stream_get_write_queue_size(st) == 0) {
      sc_close(sc, 0); /* FIN now, synchronously */
    } else {
      sc->sd.data = sc;
      uv_shutdown(&sc->sd, st, on_sc_shutdown);
      return;
    }
  }
}

static size_t find_head_end(const char *b, size_t n) {
  size_t i;
  for (i = 0; i + 3 < n; i++)
    if (b[i] == '\r' && b[i + 1] == '\n' && b[i + 2] == '\r' &&
        b[i + 3] == '\n')
      return i + 4;
  return 0;
}

static int ci_prefix(const char *a, const char *lit) {
  for (; *lit; a++, lit++) {
    char x = *a;
    if (x >= 'A' && x <= 'Z')
      x = (char)(x | 0x20);
    if (x != *lit)
      return 0;
  }
  return 1;
}

/* The value of a request field (lower-case name) in head, or NULL. */
static const char *head_field(const char *head, const char *name, char *out,
                              size_t cap) {
  const char *p = strstr(head, "\r\n");
  size_t nl = strlen(name);
  while (p != NULL && p[2] != '\r') {
    p += 2;
    if (ci_prefix(p, name) && p[nl] == ':') {
      const char *v = p + nl + 1, *e = strstr(v, "\r\n");
      size_t k;
      while (*v == ' ')
        v++;
      k = (size_t)(e - v) < cap - 1 ? (size_t)(e - v) : cap - 1;
      memcpy(out, v, k);
      out[k] = 0;
      return out;
    }
    p = strstr(p, "\r\n");
  }
  return NULL;
}

static void sc_dispatch(sconn_t *sc) {
  srv_t *s = sc->srv;
  sreq_t *q = &s->last;
  s->requests++;
  s->n_get += strcmp(q->method, "GET") == 0;
  s->n_post += strcmp(q->method, "POST") == 0;
  s->n_head += strcmp(q->method, "HEAD") == 0;
  s->handler(s, sc, q);
  sc_run(sc);
}

/* Requests in order; bodies of any size are consumed as they come (the
 * first 8 KiB kept, all of it summed). A target starting with /early is
 * answered as soon as its head is in, before its body. */
static void sc_parse(sconn_t *sc) {
  srv_t *s = sc->srv;
  sreq_t *q = &s->last;
  while (!sc->closing) {
    size_t take, keep;
    if (!sc->in_body) {
      size_t he = find_head_end(sc->in, sc->in_len);
      char v[32];
      if (he == 0)
        return;
      OM_ASSERT_CMP(he, <, sizeof q->head);
      memcpy(q->head, sc->in, he);
      q->head[he] = 0;
      q->head_len = he;
      q->body_len = 0;
      q->body[0] = 0;
      q->body_sum = 0;
      sscanf(q->head, "%15s %511s", q->method, q->target);
      sc->body_left = 0;
      if (head_field(q->head, "content-length", v, sizeof v) != NULL)
        sc->body_left = strtoul(v, NULL, 10);
      memmove(sc->in, sc->in + he, sc->in_len - he);
      sc->in_len -= he;
      sc->in_body = 1;
      sc->early = strncmp(q->target, "/early", 6) == 0;
      if (sc->early)
        sc_dispatch(sc);
      continue;
    }
    take = sc->body_left < sc->in_len ? sc->body_left : sc->in_len;
    keep =
        q->body_len < sizeof q->body - 1 ? sizeof q->body - 1 - q->body_len : 0;
    if (keep > take)
      keep = take;
    if (keep > 0) {
      memcpy(q->body + q->body_len, sc->in, keep);
      q->body[q->body_len + keep] = 0;
    }
    {
      size_t i;
      for (i = 0; i < take; i++)
        q->body_sum = q->body_sum * 31 + (unsigned char)sc->in[i];
    }
    q->body_len += take;
    memmove(sc->in, sc->in + take, sc->in_len - take);
    sc->in_len -= take;
    sc->body_left -= take;
    if (sc->body_left > 0)
      return;
    sc->in_body = 0;
    if (!sc->early)
      sc_dispatch(sc);
  }
}

static void on_sc_alloc(uv_handle_t *h, size_t sug, uv_buf_t *buf) {
  sconn_t *sc = h->data;
  (void)sug;
  buf->base = sc->in + sc->in_len;
  buf->len = SC_IN - sc->in_len;
}

static void on_sc_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
  sconn_t *sc = st->data;
  (void)buf;
  if (n < 0) {
    sc->eof_seen = 1;
    sc_close(sc, 0);
    return;
  }
  sc->in_len += (size_t)n;
  sc_parse(sc);
}

static void on_sc_conn(uv_stream_t *l, int status) {
  srv_t *s = l->data;
  sconn_t *sc = NULL;
  int i;
  if (status < 0)
    return;
  for (i = 0; i < MAX_SCONN; i++)
    if (!s->sc[i].used) {
      sc = &s->sc[i];
      break;
    }
  assert_non_null(sc);
  memset(sc, 0, offsetof(sconn_t, in));
  sc->nacts = sc->cur = 0;
  sc->in_len = 0;
  sc->waited = sc->in_body = sc->early = 0;
  sc->body_left = 0;
  sc->used = 1;
  sc->srv = s;
  sc->handles = 2;
  uv_tcp_init(s->loop, &sc->tcp);
  uv_timer_init(s->loop, &sc->timer);
  sc->tcp.data = sc->timer.data = sc;
  assert_int_equal(uv_accept(l, (uv_stream_t *)&sc->tcp), 0);
  uv_tcp_nodelay(&sc->tcp, 1); /* dribbled bytes go out as written */
  uv_read_start((uv_stream_t *)&sc->tcp, on_sc_alloc, on_sc_read);
  s->accepts++;
}

/* every open server connection, closed at once (FIN, synchronously) */
static void srv_drop_all(srv_t *s) {
  int i;
  for (i = 0; i < MAX_SCONN; i++)
    if (s->sc[i].used && !s->sc[i].closing)
      sc_close(&s->sc[i], 0);
}

static int srv_open_conns(const srv_t *s) {
  int i, n = 0;
  for (i = 0; i < MAX_SCONN; i++)
    n += s->sc[i].used && !s->sc[i].closing;
  return n;
}

static sconn_t *srv_last_conn(srv_t *s) {
  int i;
  for (i = MAX_SCONN - 1; i >= 0; i--)
    if (s->sc[i].used && !s->sc[i].closing)
      return &s->sc[i];
  return NULL;
}

/* ------------------------------------------------------------------ */
/* handlers */

static void respond_echo(sconn_t *sc, const sreq_t *q) {
  size_t n =
      q->body_len < sizeof q->body - 1 ? q->body_len : sizeof q->body - 1;
  int k = snprintf(sc->out, sizeof sc->out,
                   "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n", n);
  memcpy(sc->out + k, q->body, n);
  sc_queue(sc, A_WRITE, 0, sc->out, (size_t)k + n);
}

/* the body's length and sum, as the body */
static void respond_sum(sconn_t *sc, const sreq_t *q) {
  char b[64];
  int n = snprintf(b, sizeof b, "%zu %llu", q->body_len,
                   (unsigned long long)q->body_sum);
  int k = snprintf(sc->out, sizeof sc->out,
                   "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", n, b);
  sc_queue(sc, A_WRITE, 0, sc->out, (size_t)k);
}

/* /ok, /echo, /stall, /close, /raw (s->raw as is), /slow */
static void h_default(srv_t *s, sconn_t *sc, const sreq_t *q) {
  const char *t = q->target;
  if (strcmp(t, "/echo") == 0) {
    respond_echo(sc, q);
  } else if (strcmp(t, "/sum") == 0) {
    respond_sum(sc, q);
  } else if (strcmp(t, "/early") == 0) {
    SEND(sc, "HTTP/1.1 413 Too Large\r\nContent-Length: 3\r\n\r\nbig");
  } else if (strcmp(t, "/stall") == 0) {
    /* never answer */
  } else if (strcmp(t, "/close") == 0) {
    SEND(sc, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n"
             "\r\nbye");
  } else if (strcmp(t, "/raw-then-close") == 0) {
    sc_queue(sc, A_WRITE, 0, s->raw, s->raw_len);
    sc_queue(sc, A_CLOSE, 20, NULL, 0);
  } else if (strncmp(t, "/raw", 4) == 0) {
    sc_queue(sc, A_WRITE, 0, s->raw, s->raw_len);
  } else if (strcmp(t, "/then-close") == 0) {
    SEND(sc, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    sc_queue(sc, A_CLOSE, 0, NULL, 0);
  } else if (strcmp(q->method, "HEAD") == 0) {
    SEND(sc, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n");
  } else {
    SEND(sc, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
  }
}

/* ------------------------------------------------------------------ */
/* fixture */

typedef struct fx_s {
  uv_loop_t loop;
  uv_timer_t guard;
  srv_t srv;
  om_upstream_pool_t *pool;
  om_upstream_target_t tgt;
  int pool_closed;
} fx_t;

static void on_guard(uv_timer_t *t) {
  (void)t;
}

static void srv_listen(srv_t *s, uv_loop_t *loop, const char *ip) {
  struct sockaddr_storage ss;
  int len = sizeof ss;
  memset(s, 0, sizeof *s);
  s->loop = loop;
  s->handler = h_default;
  uv_tcp_init(loop, &s->lis);
  s->lis.data = s;
  if (strchr(ip, ':') != NULL)
    uv_ip6_addr(ip, 0, (struct sockaddr_in6 *)&ss);
  else
    uv_ip4_addr(ip, 0, (struct sockaddr_in *)&ss);
  assert_int_equal(uv_tcp_bind(&s->lis, (struct sockaddr *)&ss, 0), 0);
  assert_int_equal(uv_listen((uv_stream_t *)&s->lis, 128, on_sc_conn), 0);
  uv_tcp_getsockname(&s->lis, (struct sockaddr *)&ss, &len);
  s->port =
      ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                     : ((struct sockaddr_in *)&ss)->sin_port);
  s->lis_open = 1;
}

static fx_t *fx_new_at(const om_upstream_pool_opts_t *o, const char *ip) {
  fx_t *fx = calloc(1, sizeof *fx);
  assert_non_null(fx);
  assert_int_equal(uv_loop_init(&fx->loop), 0);
  uv_timer_init(&fx->loop, &fx->guard);
  uv_timer_start(&fx->guard, on_guard, 2, 2);
  srv_listen(&fx->srv, &fx->loop, ip);
  assert_int_equal(om_upstream_pool_new(&fx->loop, o, &fx->pool), 0);
  assert_int_equal(om_upstream_target_init(&fx->tgt, ip, fx->srv.port), 0);
  return fx;
}

static fx_t *fx_new(const om_upstream_pool_opts_t *o) {
  return fx_new_at(o, "127.0.0.1");
}

static void on_pool_closed(void *ud) {
  *(int *)ud = 1;
}

#define RUN_UNTIL(fx, cond, ms)                                                \
  do {                                                                         \
    uint64_t t0_ = uv_hrtime();                                                \
    while (!(cond) && uv_hrtime() - t0_ < (uint64_t)(ms)*1000000u)             \
      uv_run(&(fx)->loop, UV_RUN_ONCE);                                        \
  } while (0)

static void spin(fx_t *fx, int ms) {
  uint64_t t0 = uv_hrtime();
  while (uv_hrtime() - t0 < (uint64_t)ms * 1000000u)
    uv_run(&fx->loop, UV_RUN_ONCE);
}

static void fx_close_pool(fx_t *fx) {
  if (fx->pool != NULL) {
    assert_int_equal(
        om_upstream_pool_close(fx->pool, on_pool_closed, &fx->pool_closed), 0);
    RUN_UNTIL(fx, fx->pool_closed, 3000);
    assert_true(fx->pool_closed);
    fx->pool = NULL;
  }
}

static void fx_free(fx_t *fx) {
  int i;
  fx_close_pool(fx);
  srv_drop_all(&fx->srv);
  for (i = 0; i < MAX_SCONN; i++)
    RUN_UNTIL(fx, !fx->srv.sc[i].used, 2000);
  if (fx->srv.lis_open)
    uv_close((uv_handle_t *)&fx->srv.lis, NULL);
  uv_close((uv_handle_t *)&fx->guard, NULL);
  uv_run(&fx->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&fx->loop), 0);
  free(fx);
}

static om_upstream_stats_t peer_st(fx_t *fx) {
  om_upstream_stats_t st;
  memset(&st, 0, sizeof st);
  assert_int_equal(om_upstream_peer_stats(fx->pool, &fx->tgt, &st), 0);
  return st;
}

/* ------------------------------------------------------------------ */
/* a request's view */

enum {
  M_NONE,
  M_ABORT_HEADERS,
  M_CANCEL_HEADERS,
  M_CANCEL_BODY,
  M_PAUSE_BODY,
  M_CLOSE_POOL_BODY,
  M_SEND_AGAIN,
  M_TUNNEL
};

typedef struct cap_s {
  fx_t *fx;
  int mode;
  om_upstream_req_t *req;
  int headers, done, body_calls, bad_nul, late;
  int status, minor, has_body;
  int64_t cl;
  size_t nh;
  char hdump[4096];
  char body[65536];
  size_t body_len;
  uint64_t body_sum;
  om_upstream_result_t res;
  char detail[160];
  int cancel_rc, pause_rc, cancel_in_done_rc, pause_in_done_rc;
  int resume_in_done_rc;
  /* M_SEND_AGAIN: how many more to send from on_done */
  int again;
  const char *again_method, *again_target;
  int again_rc;
  /* M_TUNNEL: the connection taken after a 101 */
  om_tunnel_t *tun;
  int take_rc, take_again_rc, tun_eofs, tun_closes, tun_err;
  char upgrade[32];
  char tun_data[256];
  size_t tun_len;
} cap_t;

static cap_t C[8]; /* test-only, single thread */

static void tun_data(void *ud, const char *d, size_t n) {
  cap_t *c = ud;
  size_t k = n < sizeof c->tun_data - 1 - c->tun_len
                 ? n
                 : sizeof c->tun_data - 1 - c->tun_len;
  memcpy(c->tun_data + c->tun_len, d, k);
  c->tun_len += k;
  c->tun_data[c->tun_len] = 0;
}

static void tun_eof(void *ud) {
  cap_t *c = ud;
  c->tun_eofs++;
  om_tunnel_shutdown(c->tun); /* both closed: a clean end */
}

static void tun_closed(void *ud, int err) {
  cap_t *c = ud;
  c->tun_closes++;
  c->tun_err = err;
  c->tun = NULL;
}

static const om_tunnel_callbacks_t TCB = {tun_data, tun_eof, NULL, tun_closed};

static int cb_headers(void *ud, const om_upstream_response_t *r) {
  cap_t *c = ud;
  size_t i, off = 0;
  if (c->done)
    c->late++;
  c->headers++;
  c->status = r->status;
  c->minor = r->version_minor;
  c->nh = r->n_headers;
  c->cl = r->content_length;
  c->has_body = r->has_body;
  c->hdump[0] = 0;
  for (i = 0; i < r->n_headers; i++) {
    const om_http_header_t *h = &r->headers[i];
    if (strlen(h->name) != h->name_len || strlen(h->value) != h->value_len)
      c->bad_nul++;
    off += (size_t)snprintf(c->hdump + off, sizeof c->hdump - off, "%s: %s\n",
                            h->name, h->value);
    if (off >= sizeof c->hdump)
      off = sizeof c->hdump - 1;
  }
  if (strlen(r->reason) != r->reason_len)
    c->bad_nul++;
  if (r->upgrade != NULL)
    snprintf(c->upgrade, sizeof c->upgrade, "%s", r->upgrade);
  if (c->mode == M_TUNNEL && r->status == 101) {
    c->take_rc = om_upstream_take_tunnel(c->req, &TCB, c, &c->tun);
    c->take_again_rc = om_upstream_take_tunnel(c->req, &TCB, c, &c->tun);
  }
  switch (c->mode) {
  case M_ABORT_HEADERS:
    return 1;
  case M_CANCEL_HEADERS:
    c->cancel_rc = om_upstream_cancel(c->req);
    return 0;
  default:
    return 0;
  }
}

static void cb_body(void *ud, const char *d, size_t n) {
  cap_t *c = ud;
  size_t i, k;
  if (c->done)
    c->late++;
  c->body_calls++;
  OM_ASSERT_CMP(n, >, 0);
  k = n < sizeof c->body - 1 - c->body_len ? n
                                           : sizeof c->body - 1 - c->body_len;
  memcpy(c->body + c->body_len, d, k);
  c->body_len += k;
  c->body[c->body_len] = 0;
  for (i = 0; i < n; i++)
    c->body_sum = c->body_sum * 31 + (unsigned char)d[i];
  if (c->mode == M_CANCEL_BODY)
    c->cancel_rc = om_upstream_cancel(c->req);
  else if (c->mode == M_PAUSE_BODY && c->body_calls == 1)
    c->pause_rc = om_upstream_pause(c->req);
  else if (c->mode == M_CLOSE_POOL_BODY && c->body_calls == 1)
    om_upstream_pool_close(c->fx->pool, on_pool_closed, &c->fx->pool_closed);
}

static int send_simple(cap_t *c, const char *m, const char *t);

static void cb_done(void *ud, const om_upstream_result_t *res) {
  cap_t *c = ud;
  c->done++;
  c->res = *res;
  snprintf(c->detail, sizeof c->detail, "%s", res->detail);
  assert_string_equal(res->reason, om_upstream_fail_name(res->fail));
  c->cancel_in_done_rc = om_upstream_cancel(c->req);
  c->pause_in_done_rc = om_upstream_pause(c->req);
  c->resume_in_done_rc = om_upstream_resume(c->req);
  if (c->mode == M_SEND_AGAIN && c->again > 0) {
    c->again--;
    c->headers = 0;
    c->body_len = 0;
    c->body[0] = 0;
    c->done = 0;
    c->again_rc = send_simple(c, c->again_method, c->again_target);
    if (c->again_rc != 0)
      c->done = 1;
  }
}

static const om_upstream_callbacks_t CB = {cb_headers, cb_body, cb_done, NULL};

static void cap_init(cap_t *c, fx_t *fx, int mode) {
  memset(c, 0, sizeof *c);
  c->fx = fx;
  c->mode = mode;
  c->status = -1;
}

static int send_full(cap_t *c, const om_upstream_request_t *q) {
  return om_upstream_send(c->fx->pool, &c->fx->tgt, q, &CB, c, &c->req);
}

static int send_simple(cap_t *c, const char *m, const char *t) {
  om_upstream_request_t q;
  memset(&q, 0, sizeof q);
  q.method = m;
  q.target = t;
  q.timeout_ms = 5000;
  /* what the proxy sets for the idempotent methods these tests send */
  q.retry_stale = 1;
  return send_full(c, &q);
}

/* send and wait for on_done */
static void roundtrip(cap_t *c, const char *m, const char *t) {
  assert_int_equal(send_simple(c, m, t), 0);
  RUN_UNTIL(c->fx, c->done, 3000);
  assert_int_equal(c->done, 1);
}

static void expect_ok(const cap_t *c, int status, const char *body) {
  if (c->res.err != 0)
    fail_msg("request failed: %s (%s)", c->res.reason, c->detail);
  assert_int_equal(c->res.fail, OM_UPSTREAM_OK);
  assert_int_equal(c->status, status);
  assert_string_equal(c->body, body);
  assert_int_equal(c->bad_nul, 0);
  assert_int_equal(c->late, 0);
}

static void expect_fail(const cap_t *c, om_upstream_fail_t fail, int err) {
  if (c->res.fail != fail)
    fail_msg("want %s, got %s (%s)", om_upstream_fail_name(fail), c->res.reason,
             c->detail);
  assert_int_equal(c->res.err, err);
  assert_int_equal(c->done, 1);
  assert_int_equal(c->late, 0);
}

/* ------------------------------------------------------------------ */
/* URLs and targets */

static void parse_url_accepts_the_url_rule(void **state) {
  om_upstream_url_t u;
  const char *why = NULL;
  om_upstream_target_t t;
  (void)state;
  assert_int_equal(om_upstream_parse_url("http://127.0.0.1:9001", &u, &why), 0);
  assert_string_equal(u.host, "127.0.0.1");
  assert_int_equal(u.port, 9001);
  assert_int_equal(u.path_prefix_len, 0);
  assert_int_equal(om_upstream_parse_url("HTTP://10.0.0.1/api/v1", &u, &why),
                   0);
  assert_int_equal(u.port, 80);
  assert_int_equal(u.path_prefix_len, 7);
  assert_memory_equal(u.path_prefix, "/api/v1", 7);
  assert_int_equal(om_upstream_parse_url("http://[::1]:65535/a%20b", &u, &why),
                   0);
  assert_string_equal(u.host, "::1");
  assert_int_equal(u.port, 65535);
  assert_int_equal(om_upstream_target_from_url(&t, "http://[::1]:8080", &why),
                   0);
  assert_string_equal(t.authority, "[::1]:8080");
  assert_int_equal(t.addr.sa.sa_family, AF_INET6);
  assert_int_equal(om_upstream_target_from_url(&t, "http://127.0.0.1", &why),
                   0);
  assert_string_equal(t.authority, "127.0.0.1");
  assert_int_equal(ntohs(t.addr.in4.sin_port), 80);
  assert_int_equal(om_upstream_target_init(&t, "192.168.1.2", 443), 0);
  assert_string_equal(t.authority, "192.168.1.2:443");
  assert_int_equal(om_upstream_target_init(&t, "localhost", 80), OM_EINVAL);
  /* names and https: everything but the address, which the caller
   * resolves; no default port in the authority */
  assert_int_equal(om_upstream_parse_url("https://web-4.internal", &u, &why),
                   0);
  assert_string_equal(u.host, "web-4.internal");
  assert_int_equal(u.tls, 1);
  assert_int_equal(u.port, 443);
  assert_int_equal(
      om_upstream_target_from_url(&t, "http://web-4.internal:8080/x", &why),
      OM_ENOTFOUND);
  assert_string_equal(t.authority, "web-4.internal:8080");
  assert_int_equal(t.addr.sa.sa_family, AF_UNSPEC);
  assert_int_equal(t.tls, 0);
  assert_int_equal(om_upstream_target_from_url(&t, "https://[::1]:443", &why),
                   0);
  assert_string_equal(t.authority, "[::1]");
  assert_string_equal(t.host, "::1");
  assert_int_equal(t.tls, 1);
  assert_int_equal(om_upstream_target_from_url(&t, "https://10.0.0.1:80", &why),
                   0);
  assert_string_equal(t.authority, "10.0.0.1:80");
  assert_int_equal(om_upstream_target_init(&t, "::1", 0), OM_EINVAL);
  assert_int_equal(om_upstream_target_init(&t, "::1", 65536), OM_EINVAL);
  assert_int_equal(om_upstream_target_init(NULL, "::1", 1), OM_EINVAL);
}

static void parse_url_refuses_with_reasons(void **state) {
  static const struct {
    const char *url, *why;
  } bad[] = {
      {"ftp://127.0.0.1", "http:// or https://"},
      {"http://localhost_1:9001", "'_'"},
      {"http://999.1.1.1", "out of range"},
      {"http://127.0.0.1:", "empty port"},
      {"http://127.0.0.1:0", "1..65535"},
      {"http://127.0.0.1:65536", "1..65535"},
      {"http://127.0.0.1:123456", "1..65535"},
      {"http://127.0.0.1:80x", "invalid port"},
      {"http://user@127.0.0.1", "userinfo"},
      {"http://127.0.0.1/a?b=1", "query"},
      {"http://127.0.0.1/a#f", "fragment"},
      {"http://127.0.0.1?x", "query"},
      {"http://127.0.0.1/a%20b c", "whitespace"},
      {"http://127.0.0.1/%zz", "percent-escape"},
      {"http://[::1", "closing ']'"},
      {"http://[fe80::1%eth0]:80", "zone id"},
      {"http://[127.0.0.1]:80", "IPv6"},
      {"http://1.2.3:80", "malformed IPv4"},
      {"http://01.2.3.4:80", "leading zero"},
      {"http://", "no host"},
      {"http://:80", "no host"},
  };
  size_t i;
  om_upstream_url_t u;
  (void)state;
  for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *why = NULL;
    int rc = om_upstream_parse_url(bad[i].url, &u, &why);
    if (rc != OM_EPARSE || why == NULL || strstr(why, bad[i].why) == NULL)
      fail_msg("%s: rc %d why %s, want %s", bad[i].url, rc,
               why ? why : "(null)", bad[i].why);
  }
  assert_int_equal(om_upstream_parse_url(NULL, &u, NULL), OM_EINVAL);
  assert_int_equal(om_upstream_parse_url("http://1.2.3.4", NULL, NULL),
                   OM_EINVAL);
  assert_int_equal(om_upstream_parse_url("gopher://1.2.3.4", &u, NULL),
                   OM_EPARSE);
}

static void fail_names_are_stable(void **state) {
  (void)state;
  assert_string_equal(om_upstream_fail_name(OM_UPSTREAM_OK), "ok");
  assert_string_equal(om_upstream_fail_name(OM_UPSTREAM_FAIL_CONNECT),
                      "connect");
  assert_string_equal(
      om_upstream_fail_name(OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE),
      "reset_before_response");
  assert_string_equal(om_upstream_fail_name(OM_UPSTREAM_FAIL_RESET_MID_BODY),
                      "reset_mid_body");
  assert_string_equal(om_upstream_fail_name(OM_UPSTREAM_FAIL_LOCAL),
                      "local_resources");
  assert_string_equal(om_upstream_fail_name(OM_UPSTREAM_FAIL__COUNT),
                      "unknown");
  assert_string_equal(om_upstream_fail_name((om_upstream_fail_t)-1), "unknown");
}

/* ------------------------------------------------------------------ */
/* the pool */

static void pool_new_validates_and_survives_no_memory(void **state) {
  uv_loop_t loop;
  om_upstream_pool_t *p = NULL;
  om_upstream_pool_opts_t o;
  om_upstream_stats_t st;
  om_upstream_target_t t;
  int n, closed = 0;
  (void)state;
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(om_upstream_pool_new(NULL, NULL, &p), OM_EINVAL);
  assert_int_equal(om_upstream_pool_new(&loop, NULL, NULL), OM_EINVAL);
  memset(&o, 0, sizeof o);
  o.max_header_bytes = 70000;
  assert_int_equal(om_upstream_pool_new(&loop, &o, &p), OM_EINVAL);
  o.max_header_bytes = 100;
  assert_int_equal(om_upstream_pool_new(&loop, &o, &p), OM_EINVAL);
  memset(&o, 0, sizeof o);
  o.read_buffer_bytes = 10;
  assert_int_equal(om_upstream_pool_new(&loop, &o, &p), OM_EINVAL);
  memset(&o, 0, sizeof o);
  o.max_headers = 20000;
  assert_int_equal(om_upstream_pool_new(&loop, &o, &p), OM_EINVAL);
  assert_null(p);
  assert_int_equal(uv_loop_close(&loop), 0); /* nothing was added */
  assert_int_equal(uv_loop_init(&loop), 0);
  for (n = 0;; n++) {
    int rc;
    om_test_fail_alloc_after(n);
    rc = om_upstream_pool_new(&loop, NULL, &p);
    om_test_alloc_reset();
    if (rc == 0)
      break;
    assert_int_equal(rc, OM_ENOMEM);
  }
  OM_ASSERT_CMP(n, >=, 1);
  assert_int_equal(om_upstream_pool_stats(p, &st), 0);
  assert_int_equal(st.requests, 0);
  assert_int_equal(om_upstream_pool_stats(NULL, &st), OM_EINVAL);
  assert_int_equal(om_upstream_target_init(&t, "127.0.0.1", 9), 0);
  assert_int_equal(om_upstream_peer_stats(p, &t, &st), OM_ENOTFOUND);
  assert_int_equal(om_upstream_pool_close(p, on_pool_closed, &closed), 0);
  assert_int_equal(om_upstream_pool_close(p, NULL, NULL), OM_ESTATE);
  assert_int_equal(closed, 0); /* never synchronously */
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(closed, 1);
  assert_int_equal(om_upstream_pool_close(NULL, NULL, NULL), OM_EINVAL);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* ------------------------------------------------------------------ */
/* round trips */

static void get_and_post_round_trips(void **state) {
  fx_t *fx = fx_new(NULL);
  om_upstream_request_t q;
  om_http_header_t h[] = {{"X-Trace", "abc", 0, 0}, {"Accept", "*/*", 6, 3}};
  char v[64];
  (void)state;
  cap_init(&C[0], fx, M_NONE);
  roundtrip(&C[0], "GET", "/ok?x=1&y=%20");
  expect_ok(&C[0], 200, "hello");
  assert_int_equal(C[0].minor, 1);
  assert_int_equal(C[0].cl, 5);
  assert_int_equal(C[0].has_body, 1);
  assert_string_equal(C[0].hdump, "Content-Length: 5\n");
  assert_int_equal(C[0].res.sent, 1);
  assert_int_equal(C[0].res.attempts, 1);
  assert_int_equal(C[0].res.reused, 0);
  assert_int_equal(C[0].res.headers_delivered, 1);
  assert_int_equal(C[0].res.body_bytes, 5);
  assert_string_equal(C[0].res.detail, "");
  assert_string_equal(fx->srv.last.target, "/ok?x=1&y=%20");
  /* Host added from the target's authority */
  snprintf(v, sizeof v, "127.0.0.1:%d", fx->srv.port);
  {
    char got[64];
    assert_non_null(head_field(fx->srv.last.head, "host", got, sizeof got));
    assert_string_equal(got, v);
    /* no body, no Content-Length on a GET */
    assert_null(
        head_field(fx->srv.last.head, "content-length", got, sizeof got));
  }
  /* POST with a body: Content-Length, the body intact, on the same
   * connection */
  memset(&q, 0, sizeof q);
  q.method = "POST";
  q.target = "/echo";
  q.headers = h;
  q.n_headers = 2;
  q.body = "the request body";
  q.body_len = 16;
  cap_init(&C[1], fx, M_NONE);
  assert_int_equal(send_full(&C[1], &q), 0);
  RUN_UNTIL(fx, C[1].done, 3000);
  expect_ok(&C[1], 200, "the request body");
  assert_int_equal(C[1].res.reused, 1);
  assert_string_equal(fx->srv.last.body, "the request body");
  assert_non_null(head_field(fx->srv.last.head, "content-length", v, sizeof v));
  assert_string_equal(v, "16");
  assert_non_null(head_field(fx->srv.last.head, "x-trace", v, sizeof v));
  assert_string_equal(v, "abc");
  assert_non_null(head_field(fx->srv.last.head, "accept", v, sizeof v));
  assert_string_equal(v, "*/*");
  /* an empty POST still says Content-Length: 0 (RFC 9110 8.6) */
  q.body = NULL;
  q.body_len = 0;
  cap_init(&C[2], fx, M_NONE);
  assert_int_equal(send_full(&C[2], &q), 0);
  RUN_UNTIL(fx, C[2].done, 3000);
  expect_ok(&C[2], 200, "");
  assert_int_equal(C[2].has_body, 0);
  assert_int_equal(C[2].body_calls, 0);
  assert_non_null(head_field(fx->srv.last.head, "content-length", v, sizeof v));
  assert_string_equal(v, "0");
  assert_int_equal(fx->srv.accepts, 1);
  assert_int_equal(peer_st(fx).connects, 1);
  assert_int_equal(peer_st(fx).reuses, 2);
  assert_int_equal(peer_st(fx).requests, 3);
  assert_int_equal(peer_st(fx).idle, 1);
  assert_int_equal(peer_st(fx).active, 0);
  fx_free(fx);
}

static void ipv6_round_trip(void **state) {
  fx_t *fx = fx_new_at(NULL, "::1");
  char v[64];
  (void)state;
  cap_init(&C[0], fx, M_NONE);
  roundtrip(&C[0], "GET", "/v6");
  expect_ok(&C[0], 200, "hello");
  snprintf(v, sizeof v, "[::1]:%d", fx->srv.port);
  {
    char got[64];
    assert_non_null(head_field(fx->srv.last.head, "host", got, sizeof got));
    assert_string_equal(got, v);
  }
  fx_free(fx);
}

static const char chunked_resp[] =
    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\n\r\n"
    "5\r\nhello\r\n"
    "1;ext=val;q=\"a \\\" b\" ; e2\r\n \r\n"
    "000006\r\nworld!\r\n"
    "0\r\nX-Trailer: t\r\n\r\n";

static void chunked_response_and_split_bytes(void **state) {
  fx_t *fx = fx_new(NULL);
  size_t n = strlen(chunked_resp);
  (void)state;
  fx->srv.raw = chunked_resp;
  fx->srv.raw_len = n;
  cap_init(&C[0], fx, M_NONE);
  roundtrip(&C[0], "GET", "/raw");
  expect_ok(&C[0], 200, "hello world!");
  assert_int_equal(C[0].cl, -1);
  assert_int_equal(C[0].has_body, 1);
  /* Transfer-Encoding is hop-by-hop: not handed over */
  assert_string_equal(C[0].hdump, "X-A: 1\n");
  assert_int_equal(C[0].res.body_bytes, 12);
  assert_int_equal(peer_st(fx).idle, 1);
  fx_free(fx);
  /* the same responses dribbled a few bytes per segment, 1 ms apart:
   * same results, and the connection is reused after them */
  fx = fx_new(NULL);
  {
    static const char cl_resp[] =
        "HTTP/1.1 200 OK\r\nContent-Length: 11\r\nX-B: 2\r\n\r\nhello world";
    const char *resps[2] = {chunked_resp, cl_resp};
    int k;
    for (k = 0; k < 2; k++) {
      const char *r = resps[k];
      size_t rl = strlen(r), sent = 0;
      sconn_t *sc;
      cap_init(&C[2], fx, M_NONE);
      assert_int_equal(send_simple(&C[2], "GET", "/stall"), 0);
      RUN_UNTIL(fx, fx->srv.requests == k + 1, 2000);
      sc = srv_last_conn(&fx->srv);
      assert_non_null(sc);
      while (sent < rl) {
        /* a few bytes per step, in separate segments */
        size_t step = (sent % 3) + 1;
        if (step > rl - sent)
          step = rl - sent;
        sc_queue(sc, A_WRITE, 1, r + sent, step);
        sent += step;
        sc_run(sc);
        RUN_UNTIL(fx, sc->cur == sc->nacts, 500);
      }
      RUN_UNTIL(fx, C[2].done, 2000);
      expect_ok(&C[2], 200, k == 0 ? "hello world!" : "hello world");
      if (C[2].body_calls < 3)
        fail_msg("case %d: %d body calls", k, C[2].body_calls);
    }
    assert_int_equal(fx->srv.accepts, 1);
  }
  fx_free(fx);
}

static void close_delimited_response_is_not_reused(void **state) {
  fx_t *fx = fx_new(NULL);
  static const char resp[] = "HTTP/1.1 200 OK\r\nX-C: 1\r\n\r\nuntil the end";
  (void)state;
  fx->srv.raw = resp;
  fx->srv.raw_len = strlen(resp);
  cap_init(&C[0], fx, M_NONE);
  assert_int_equal(send_simple(&C[0], "GET", "/raw"), 0);
  RUN_UNTIL(fx, fx->srv.requests == 1, 2000);
  RUN_UNTIL(fx, C[0].headers == 1, 2000);
  spin(fx, 20);
  assert_int_equal(C[0].done, 0); /* the body runs until the FIN */
  assert_int_equal(C[0].cl, -1);
  srv_drop_all(&fx->srv);
  RUN_UNTIL(fx, C[0].done, 2000);
  expect_ok(&C[0], 200, "until the end");
  assert_int_equal(peer_st(fx).idle, 0);
  /* HTTP/1.0 keep-alive and Connection: close are not reused either */
  {
    static const char r10[] = "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n"
                              "Content-Length: 2\r\n\r\nok";
    fx->srv.raw = r10;
    fx->srv.raw_len = strlen(r10);
    cap_init(&C[1], fx, M_NONE);
    roundtrip(&C[1], "GET", "/raw");
    expect_ok(&C[1], 200, "ok");
    assert_int_equal(C[1].minor, 0);
    cap_init(&C[2], fx, M_NONE);
    roundtrip(&C[2], "GET", "/close");
    expect_ok(&C[2], 200, "bye");
    /* Connection is hop-by-hop */
    assert_string_equal(C[2].hdump, "Content-Length: 3\n");
  }
  spin(fx, 10);
  assert_int_equal(peer_st(fx).idle, 0);
  assert_int_equal(peer_st(fx).connects, 3);
  fx_free(fx);
}

static void keep_alive_reuses_one_connection(void **state) {
  fx_t *fx = fx_new(NULL);
  int i;
  (void)state;
  for (i = 0; i < 100; i++) {
    cap_init(&C[0], fx, M_NONE);
    roundtrip(&C[0], i % 2 ? "GET" : "HEAD", "/ok");
    expect_ok(&C[0], 200, i % 2 ? "hello" : "");
    assert_int_equal(C[0].res.reused, i > 0);
  }
  assert_int_equal(peer_st(fx).connects, 1);
  assert_int_equal(peer_st(fx).reuses, 99);
  assert_int_equal(peer_st(fx).requests, 100);
  assert_int_equal(fx->srv.accepts, 1);
  /* 100 more, each sent from the previous one's on_done */
  cap_init(&C[1], fx, M_SEND_AGAIN);
  C[1].again = 99;
  C[1].again_method = "GET";
  C[1].again_target = "/ok";
  assert_int_equal(send_simple(&C[1], "GET", "/ok"), 0);
  RUN_UNTIL(fx, C[1].done && C[1].again == 0, 5000);
  assert_int_equal(C[1].again, 0);
  assert_int_equal(C[1].again_rc, 0);
  expect_ok(&C[1], 200, "hello");
  assert_int_equal(peer_st(fx).connects, 1);
  assert_int_equal(peer_st(fx).requests, 200);
  fx_free(fx);
}

static void warm_requests_do_not_allocate(void **state) {
  fx_t *fx = fx_new(NULL);
  om_upstream_request_t q;
  om_http_header_t h[] = {{"X-A", "1", 0, 0}, {"Connection", "x-a", 0, 0}};
  int i;
  (void)state;
  memset(&q, 0, sizeof q);
  q.method = "POST";
  q.target = "/echo";
  q.headers = h;
  q.n_headers = 2;
  q.body = "abc";
  q.body_len = 3;
  q.timeout_ms = 2000;
  q.first_byte_timeout_ms = 1000;
  cap_init(&C[0], fx, M_NONE);
  assert_int_equal(send_full(&C[0], &q), 0);
  RUN_UNTIL(fx, C[0].done, 2000);
  expect_ok(&C[0], 200, "abc");
  /* every allocation fails from here on: a warm request needs none */
  om_test_fail_alloc_after(0);
  for (i = 0; i < 50; i++) {
    cap_init(&C[0], fx, M_NONE);
    assert_int_equal(send_full(&C[0], &q), 0);
    RUN_UNTIL(fx, C[0].done, 2000);
    expect_ok(&C[0], 200, "abc");
  }
  assert_int_equal(om_test_alloc_failures(), 0);
  om_test_alloc_reset();
  assert_null(head_field(fx->srv.last.head, "x-a", (char[8]){0}, 8));
  fx_free(fx);
}

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0), port;
  struct sockaddr_in a;
  socklen_t l = sizeof a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  getsockname(fd, (struct sockaddr *)&a, &l);
  port = ntohs(a.sin_port);
  close(fd); /* bound, never listening: refused */
  return port;
}

static char post_body[8u << 20];

static void large_bodies_and_early_responses(void **state) {
  fx_t *fx = fx_new(NULL);
  om_upstream_request_t q;
  uint64_t sum = 0;
  size_t i;
  char want[64];
  (void)state;
  for (i = 0; i < sizeof post_body; i++) {
    post_body[i] = (char)('A' + (i * 13) % 26);
    sum = sum * 31 + (unsigned char)post_body[i];
  }
  snprintf(want, sizeof want, "%zu %llu", sizeof post_body,
           (unsigned long long)sum);
  /* more than the socket takes at once: a short write, then uv_write */
  memset(&q, 0, sizeof q);
  q.method = "POST";
  q.target = "/sum";
  q.body = post_body;
  q.body_len = sizeof post_body;
  q.timeout_ms = 10000;
  cap_init(&C[0], fx, M_NONE);
  assert_int_equal(send_full(&C[0], &q), 0);
  RUN_UNTIL(fx, C[0].done, 10000);
  expect_ok(&C[0], 200, want);
  assert_int_equal(peer_st(fx).idle, 1); /* in sync: reusable */
  cap_init(&C[1], fx, M_NONE);
  roundtrip(&C[1], "GET", "/ok");
  expect_ok(&C[1], 200, "hello");
  assert_int_equal(C[1].res.reused, 1);
  /* the server answers before reading the body (413): the response
   * stands, the connection (a request half-written) is not pooled */
  q.target = "/early";
  cap_init(&C[2], fx, M_NONE);
  assert_int_equal(send_full(&C[2], &q), 0);
  RUN_UNTIL(fx, C[2].done, 10000);
  expect_ok(&C[2], 413, "big");
  spin(fx, 5);
  assert_int_equal(peer_st(fx).idle, 0);
  assert_int_equal(peer_st(fx).active, 0);
  fx_free(fx);
}

/* ------------------------------------------------------------------ */
/* pool limits */

static void forgotten_peers_within_max_peers(void **state) {
  om_upstream_pool_opts_t o = {0};
  om_upstream_target_t t[3];
  om_upstream_stats_t st;
  fx_t *fx;
  int i;
  (void)state;
  o.max_peers = 2;
  fx = fx_new(&o);
  for (i = 0; i < 3; i++) {
    assert_int_equal(om_upstream_target_init(&t[i], "127.0.0.1", free_port()),
                     0);
    fx->tgt = t[i];
    cap_init(&C[i], fx, M_NONE);
    assert_int_equal(send_simple(&C[i], "GET", "/"), 0);
    RUN_UNTIL(fx, C[i].done, 2000);
    expect_fail(&C[i], OM_UPSTREAM_FAIL_CONNECT, OM_EIO);
    spin(fx, 2); /* the failed connection's handles close */
  }
  /* one of the first two made room for the third */
  assert_int_equal(om_upstream_peer_stats(fx->pool, &t[2], &st), 0);
  assert_int_equal(st.failures, 1);
  assert_int_equal((om_upstream_peer_stats(fx->pool, &t[0], &st) == 0) +
                       (om_upstream_peer_stats(fx->pool, &t[1], &st) == 0),
                   1);
  assert_int_equal(om_upstream_pool_stats(fx->pool, &st), 0);
  assert_int_equal(st.failures, 3); /* the totals forget nothing */
  assert_int_equal(st.requests, 3);
  fx_free(fx);
}

static void idle_limit_per_peer(void **state) {
  om_upstream_pool_opts_t o = {0};
  fx_t *fx;
  int i;
  (void)state;
  o.max_idle_per_peer = 2;
  fx = fx_new(&o);
  for (i = 0; i < 5; i++) {
    cap_init(&C[i], fx, M_NONE);
    assert_int_equal(send_simple(&C[i], "GET", "/ok"), 0);
  }
  RUN_UNTIL(fx, C[0].done && C[1].done && C[2].done && C[3].done && C[4].done,
            3000);
  for (i = 0; i < 5; i++)
    expect_ok(&C[i], 200, "hello");
  assert_int_equal(peer_st(fx).connects, 5);
  assert_int_equal(peer_st(fx).idle, 2);
  RUN_UNTIL(fx, srv_open_conns(&fx->srv) == 2, 2000);
  assert_int_equal(srv_open_conns(&fx->srv), 2);
  /* the two kept are reused, most recent first */
  cap_init(&C[5], fx, M_NONE);
  roundtrip(&C[5], "GET", "/ok");
  assert_int_equal(C[5].res.reused, 1);
  assert_int_equal(peer_st(fx).connects, 5);
  fx_free(fx);
}

static void idle_timeout_closes_pooled_connections(void **state) {
  om_upstream_pool_opts_t o = {0};
  fx_t *fx;
  (void)state;
  o.idle_timeout_ms = 60;
  fx = fx_new(&o);
  cap_init(&C[0], fx, M_NONE);
  cap_init(&C[1], fx, M_NONE);
  assert_int_equal(send_simple(&C[0], "GET", "/ok"), 0);
  assert_int_equal(send_simple(&C[1], "GET", "/ok"), 0);
  RUN_UNTIL(fx, C[0].done && C[1].done, 2000);
  assert_int_equal(peer_st(fx).idle, 2);
  spin(fx, 20);
  assert_int_equal(peer_st(fx).idle, 2);
  RUN_UNTIL(fx, peer_st(fx).idle == 0, 2000);
  assert_int_equal(peer_st(fx).idle, 0);
  RUN_UNTIL(fx, srv_open_conns(&fx->srv) == 0, 2000);
  assert_int_equal(srv_open_conns(&fx->srv), 0);
  /* and the next request connects afresh */
  cap_init(&C[2], fx, M_NONE);
  roundtrip(&C[2], "GET", "/ok");
  expect_ok(&C[2], 200, "hello");
  assert_int_equal(C[2].res.reused, 0);
  assert_int_equal(peer_st(fx).connects, 3);
  fx_free(fx);
}

static void server_closing_idle_connection_removes_it(void **state) {
  fx_t *fx = fx_new(NULL);
  static const char extra[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"
                              "okHTTP/1.1 200 OK\r\n";
  (void)state;
  cap_init(&C[0], fx, M_NONE);
  roundtrip(&C[0], "GET", "/ok");
  assert_int_equal(peer_st(fx).idle, 1);
  srv_drop_all(&fx->srv); /* the server times it out */
  RUN_UNTIL(fx, peer_st(fx).idle == 0, 2000);
  assert_int_equal(peer_st(fx).idle, 0);
  /* bytes after a complete response: the response stands, the
   * connection goes */
  fx->srv.raw = extra;
  fx->srv.raw_len = strlen(extra);
  cap_init(&C[1], fx, M_NONE);
  roundtrip(&C[1], "GET", "/raw");
  expect_ok(&C[1], 200, "ok");
  spin(fx, 10);
  assert_int_equal(peer_st(fx).idle, 0);
  /* an unsolicited byte on an idle connection closes it */
  cap_init(&C[2], fx, M_NONE);
  roundtrip(&C[2], "GET", "/ok");
  assert_int_equal(peer_st(fx).idle, 1);
  {
    sconn_t *sc = srv_last_conn(&fx->srv);
    SEND(sc, "X");
    sc_run(sc);
  }
  RUN_UNTIL(fx, peer_st(fx).idle == 0, 2000);
  assert_int_equal(peer_st(fx).idle, 0);
  fx_free(fx);
}

/* ------------------------------------------------------------------ */
/* failures, by class */

static void connect_refused(void **state) {
  fx_t *fx = fx_new(NULL);
  (void)state;
  assert_int_equal(om_upstream_target_init(&fx->tgt, "127.0.0.1", free_port()),
                   0);
  cap_init(&C[0], fx, M_NONE);
  assert_int_equal(send_simple(&C[0], "POST", "/x"), 0);
  assert_int_equal(C[0].done, 0); /* never synchronously */
  RUN_UNTIL(fx, C[0].done, 2000);
  expect_fail(&C[0], OM_UPSTREAM_FAIL_CONNECT, OM_EIO);
  assert_string_equal(C[0].res.reason, "connect");
  assert_int_equal(C[0].res.sent, 0);
  assert_int_equal(C[0].res.headers_delivered, 0);
  assert_int_equal(C[0].headers, 0);
  assert_non_null(strstr(C[0].detail, "refused"));
  assert_int_equal(peer_st(fx).failures, 1);
  assert_int_equal(peer_st(fx).active, 0);
  assert_int_equal(peer_st(fx).idle, 0);
  fx_free(fx);
}

/* A listener whose accept queue is full drops SYNs: connect hangs. */
static void connect_timeout(void **state) {
  fx_t *fx = fx_new(NULL);
  int lfd = socket(AF_INET, SOCK_STREAM, 0), filler;
  struct sockaddr_in a;
  socklen_t l = sizeof a;
  uint64_t t0;
  (void)state;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(lfd, 0), 0);
  getsockname(lfd, (struct sockaddr *)&a, &l);
  filler = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  connect(filler, (struct sockaddr *)&a, sizeof a);
  uv_sleep(20); /* the filler sits in the accept queue */
  assert_int_equal(
      om_upstream_target_init(&fx->tgt, "127.0.0.1", ntohs(a.sin_port)), 0);
  {
    om_upstream_request_t q;
    memset(&q, 0, sizeof q);
    q.method = "GET";
    q.target = "/";
    q.connect_timeout_ms = 80;
    q.first_byte_timeout_ms = 10; /* not started before the connection */
    cap_init(&C[0], fx, M_NONE);
    t0 = uv_hrtime();
    assert_int_equal(send_full(&C[0], &q), 0);
  }
  RUN_UNTIL(fx, C[0].done, 3000);
  expect_fail(&C[0], OM_UPSTREAM_FAIL_TIMEOUT_CONNECT, OM_EDEADLINE);
  assert_int_equal(C[0].res.sent, 0);
  OM_ASSERT_CMP(uv_hrtime() - t0, >=, 75u * 1000000u);
  OM_ASSERT_CMP(uv_hrtime() - t0, <, 1000u * 1000000u);
  /* the total timeout also covers connecting */
  {
    om_upstream_request_t q;
    memset(&q, 0, sizeof q);
    q.method = "GET";
    q.target = "/";
    q.timeout_ms = 50;
    cap_init(&C[1], fx, M_NONE);
    assert_int_equal(send_full(&C[1], &q), 0);
    RUN_UNTIL(fx, C[1].done, 3000);
    expect_fail(&C[1], OM_UPSTREAM_FAIL_TIMEOUT_TOTAL, OM_EDEADLINE);
    assert_int_equal(C[1].res.sent, 0);
  }
  /* so does the head timeout, failing as a connect timeout */
  {
    om_upstream_request_t q;
    memset(&q, 0, sizeof q);
    q.method = "GET";
    q.target = "/";
    q.head_timeout_ms = 50;
    cap_init(&C[3], fx, M_NONE);
    t0 = uv_hrtime();
    assert_int_equal(send_full(&C[3], &q), 0);
    RUN_UNTIL(fx, C[3].done, 3000);
    expect_fail(&C[3], OM_UPSTREAM_FAIL_TIMEOUT_CONNECT, OM_EDEADLINE);
    assert_int_equal(C[3].res.sent, 0);
    OM_ASSERT_CMP(uv_hrtime() - t0, >=, 45u * 1000000u);
  }
  /* a cancel while connecting: no callback, nothing left */
  {
    cap_init(&C[2], fx, M_NONE);
    assert_int_equal(send_simple(&C[2], "GET", "/"), 0);
    spin(fx, 10);
    assert_int_equal(om_upstream_cancel(C[2].req), 0);
    spin(fx, 20);
    assert_int_equal(C[2].done, 0);
    assert_int_equal(peer_st(fx).active, 0);
  }
  close(filler);
  close(lfd);
  fx_free(fx);
}

static void first_byte_and_total_timeouts(void **state) {
  fx_t *fx = fx_new(NULL);
  om_upstream_request_t q;
  uint64_t t0;
  static const char head_only[] =
      "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial";
  (void)state;
  memset(&q, 0, sizeof q);
  q.method = "GET";
  q.target = "/stall";
  q.first_byte_timeout_ms = 60;
  q.timeout_ms = 2000;
  cap_init(&C[0], fx, M_NONE);
  t0 = uv_hrtime();
  assert_int_equal(send_full(&C[0], &q), 0);
  RUN_UNTIL(fx, C[0].done, 3000);
  expect_fail(&C[0], OM_UPSTREAM_FAIL_TIMEOUT_FIRST_BYTE, OM_EDEADLINE);
  assert_int_equal(C[0].res.sent, 1);
  assert_int_equal(C[0].res.headers_delivered, 0);
  OM_ASSERT_CMP(uv_hrtime() - t0, >=, 55u * 1000000u);
  /* a 100 Continue does not stop the first-byte clock */
  fx->srv.raw = "HTTP/1.1 100 Continue\r\n\r\n";
  fx->srv.raw_len = strlen(fx->srv.raw);
  q.target = "/raw";
  cap_init(&C[1], fx, M_NONE);
  assert_int_equal(send_full(&C[1], &q), 0);
  RUN_UNTIL(fx, C[1].done, 3000);
  expect_fail(&C[1], OM_UPSTREAM_FAIL_TIMEOUT_FIRST_BYTE, OM_EDEADLINE);
  /* headers in time, then the body stalls: the total timeout ends it,
   * after on_headers (a committed response) */
  fx->srv.raw = head_only;
  fx->srv.raw_len = strlen(head_only);
  q.timeout_ms = 100;
  cap_init(&C[2], fx, M_NONE);
  t0 = uv_hrtime();
  assert_int_equal(send_full(&C[2], &q), 0);
  RUN_UNTIL(fx, C[2].done, 3000);
  expect_fail(&C[2], OM_UPSTREAM_FAIL_TIMEOUT_TOTAL, OM_EDEADLINE);
  assert_int_equal(C[2].headers, 1);
  assert_int_equal(C[2].res.headers_delivered, 1);
  assert_string_equal(C[2].body, "partial");
  OM_ASSERT_CMP(uv_hrtime() - t0, >=, 95u * 1000000u);
  /* total shorter than first-byte: total wins */
  q.target = "/stall";
  q.first_byte_timeout_ms = 1000;
  q.timeout_ms = 40;
  cap_init(&C[3], fx, M_NONE);
  assert_int_equal(send_full(&C[3], &q), 0);
  RUN_UNTIL(fx, C[3].done, 3000);
  expect_fail(&C[3], OM_UPSTREAM_FAIL_TIMEOUT_TOTAL, OM_EDEADLINE);
  assert_int_equal(peer_st(fx).failures, 4);
  assert_int_equal(peer_st(fx).active, 0);
  assert_int_equal(peer_st(fx).idle, 0);
  fx_free(fx);
}

/* The head timeout bounds the wait for the head, never the body after it. */
static void head_timeout_bounds_the_head_never_the_body(void **state) {
  fx_t *fx = fx_new(NULL);
  om_upstream_request_t q;
  uint64_t t0;
  static const char head_only[] =
      "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial";
  (void)state;
  memset(&q, 0, sizeof q);
  q.method = "GET";
  q.target = "/stall";
  q.head_timeout_ms = 60;
  cap_init(&C[0], fx, M_NONE);
  t0 = uv_hrtime();
  assert_int_equal(send_full(&C[0], &q), 0);
  RUN_UNTIL(fx, C[0].done, 3000);
  expect_fail(&C[0], OM_UPSTREAM_FAIL_TIMEOUT_FIRST_BYTE, OM_EDEADLINE);
  assert_int_equal(C[0].res.headers_delivered, 0);
  OM_ASSERT_CMP(uv_hrtime() - t0, >=, 55u * 1000000u);
  /* the head in time, then a stalled body: still running at 4x the
   * timeout, until the caller gives up */
  fx->srv.raw = head_only;
  fx->srv.raw_len = strlen(head_only);
  q.target = "/raw";
  cap_init(&C[1], fx, M_NONE);
  assert_int_equal(send_full(&C[1], &q), 0);
  RUN_UNTIL(fx, C[1].headers == 1, 3000);
  spin(fx, 240);
  assert_int_equal(C[1].done, 0);
  assert_string_equal(C[1].body, "partial");
  assert_int_equal(om_upstream_cancel(C[1].req), 0);
  assert_int_equal(peer_st(fx).failures, 1);
  fx_free(fx);
}

static void stale_keep_alive_retried_for_get_reported_for_post(void **state) {
  fx_t *fx = fx_new(NULL);
  om_upstream_request_t q;
  (void)state;
  cap_init(&C[0], fx, M_NONE);
  roundtrip(&C[0], "GET", "/ok");
  assert_int_equal(peer_st(fx).idle, 1);
  /* the server closes the idle connection; we reuse it before the FIN
   * is read: a stale keep-alive */
  srv_drop_all(&fx->srv);
  cap_init(&C[1], fx, M_NONE);
  roundtrip(&C[1], "GET", "/ok");
  expect_ok(&C[1], 200, "hello");
  assert_int_equal(C[1].res.attempts, 2);
  assert_int_equal(C[1].res.reused, 0); /* the retry ran on a fresh one */
  assert_int_equal(peer_st(fx).retries, 1);
  assert_int_equal(peer_st(fx).connects, 2);
  assert_int_equal(peer_st(fx).failures, 0);
  assert_int_equal(fx->srv.n_get, 2);
  /* POST is not idempotent: reported, not retried */
  srv_drop_all(&fx->srv);
  memset(&q, 0, sizeof q);
  q.method = "POST";
  q.target = "/echo";
  q.body = "once";
  q.body_len = 4;
  cap_init(&C[2], fx, M_NONE);
  assert_int_equal(send_full(&C[2], &q), 0);
  RUN_UNTIL(fx, C[2].done, 3000);
  expect_fail(&C[2], OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, OM_EIO);
  assert_int_equal(C[2].res.attempts, 1);
  assert_int_equal(C[2].res.reused, 1);
  assert_int_equal(C[2].res.sent, 1);
  assert_int_equal(fx->srv.n_post, 0);
  assert_int_equal(peer_st(fx).retries, 1);
  /* the server answers keep-alive and closes at once; the next request,
   * sent from on_done, meets the closed connection */
  cap_init(&C[3], fx, M_SEND_AGAIN);
  C[3].again = 1;
  C[3].again_method = "DELETE";
  C[3].again_target = "/ok";
  assert_int_equal(send_simple(&C[3], "GET", "/then-close"), 0);
  RUN_UNTIL(fx, C[3].done && C[3].again == 0, 3000);
  expect_ok(&C[3], 200, "hello");
  assert_int_equal(C[3].res.attempts, 2);
  assert_int_equal(peer_st(fx).retries, 2);
  /* the retry itself fails (the server is gone): reported as what the
   * retry met, and only once */
  cap_init(&C[4], fx, M_NONE);
  roundtrip(&C[4], "GET", "/ok");
  assert_int_equal(peer_st(fx).idle, 1);
  srv_drop_all(&fx->srv);
  uv_close((uv_handle_t *)&fx->srv.lis, NULL);
  fx->srv.lis_open = 0;
  cap_init(&C[5], fx, M_NONE);
  roundtrip(&C[5], "HEAD", "/ok");
  expect_fail(&C[5], OM_UPSTREAM_FAIL_CONNECT, OM_EIO);
  assert_int_equal(C[5].res.attempts, 2);
  assert_int_equal(C[5].res.sent, 1); /* the first attempt was written */
  assert_int_equal(peer_st(fx).retries, 3);
  fx_free(fx);
}

/* The caller decides what a stale reuse may repeat: retry_stale. */
static void stale_keep_alive_retry_is_the_callers_call(void **state) {
  fx_t *fx = fx_new(NULL);
  om_upstream_request_t q;
  (void)state;
  cap_init(&C[0], fx, M_NONE);
  roundtrip(&C[0], "GET", "/ok");
  /* a GET the caller does not vouch for: reported, not re-sent */
  srv_drop_all(&fx->srv);
  memset(&q, 0, sizeof q);
  q.method = "GET";
  q.target = "/ok";
  q.timeout_ms = 5000;
  cap_init(&C[1], fx, M_NONE);
  assert_int_equal(send_full(&C[1], &q), 0);
  RUN_UNTIL(fx, C[1].done, 3000);
  expect_fail(&C[1], OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, OM_EIO);
  assert_int_equal(C[1].res.attempts, 1);
  assert_int_equal(C[1].res.reused, 1);
  assert_int_equal(C[1].res.sent, 1);
  OM_ASSERT_CMP(peer_st(fx).retries, ==, 0);
  /* a POST the caller vouches for (say, it carries an Idempotency-Key):
   * re-sent once on a fresh connection */
  cap_init(&C[2], fx, M_NONE);
  roundtrip(&C[2], "GET", "/ok");
  srv_drop_all(&fx->srv);
  memset(&q, 0, sizeof q);
  q.method = "POST";
  q.target = "/echo";
  q.body = "once";
  q.body_len = 4;
  q.timeout_ms = 5000;
  q.retry_stale = 1;
  cap_init(&C[3], fx, M_NONE);
  assert_int_equal(send_full(&C[3], &q), 0);
  RUN_UNTIL(fx, C[3].done, 3000);
  if (C[3].res.err != 0)
    fail_msg("POST failed: %s (%s)", C[3].res.reason, C[3].detail);
  OM_ASSERT_CMP(C[3].res.attempts, ==, 2);
  assert_int_equal(C[3].res.reused, 0);
  OM_ASSERT_CMP(fx->srv.n_post, ==, 1);
  OM_ASSERT_CMP(peer_st(fx).retries, ==, 1);
  fx_free(fx);
}

static void h_reset_on_request(srv_t *s, sconn_t *sc, const sreq_t *q) {
  (void)s;
  (void)q;
  sc_queue(sc, A_RESET, 0, NULL, 0);
}

static void h_close_on_request(srv_t *s, sconn_t *sc, const sreq_t *q) {
  (void)s;
  (void)q;
  sc_queue(sc, A_CLOSE, 0, NULL, 0);
}

static void reset_before_response_on_a_fresh_connection(void **state) {
  fx_t *fx = fx_new(NULL);
  (void)state;
  fx->srv.handler = h_reset_on_request;
  cap_init(&C[0], fx, M_NONE);
  roundtrip(&C[0], "GET", "/x");
  expect_fail(&C[0], OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, OM_EIO);
  /* a fresh connection is never retried transparently, even for GET */
  assert_int_equal(C[0].res.attempts, 1);
  assert_int_equal(fx->srv.requests, 1);
  fx->srv.handler = h_close_on_request;
  cap_init(&C[1], fx, M_NONE);
  roundtrip(&C[1], "GET", "/x");
  expect_fail(&C[1], OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, OM_EIO);
  assert_non_null(strstr(C[1].detail, "before any response byte"));
  /* a partial head, then FIN */
  fx->srv.handler = h_default;
  fx->srv.raw = "HTTP/1.1 200 OK\r\nContent-Le";
  fx->srv.raw_len = strlen(fx->srv.raw);
  cap_init(&C[2], fx, M_NONE);
  assert_int_equal(send_simple(&C[2], "GET", "/raw"), 0);
  RUN_UNTIL(fx, fx->srv.requests == 3, 2000);
  spin(fx, 10);
  srv_drop_all(&fx->srv);
  RUN_UNTIL(fx, C[2].done, 2000);
  expect_fail(&C[2], OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, OM_EIO);
  assert_non_null(strstr(C[2].detail, "inside the response head"));
  assert_int_equal(C[2].headers, 0);
  fx_free(fx);
}

static void h_cut_body(srv_t *s, sconn_t *sc, const sreq_t *q) {
  (void)s;
  if (strcmp(q->target, "/cl-fin") == 0) {
    SEND(sc, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc");
    sc_queue(sc, A_CLOSE, 20, NULL, 0);
  } else if (strcmp(q->target, "/chunked-reset") == 0) {
    SEND(sc, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
             "3\r\nabc\r\n");
    sc_queue(sc, A_RESET, 20, NULL, 0);
  } else if (strcmp(q->target, "/chunked-fin") == 0) {
    SEND(sc, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
             "3\r\nabc\r\n4\r\nde");
    sc_queue(sc, A_CLOSE, 20, NULL, 0);
  } else {
    SEND(sc, "HTTP/1.1 200 OK\r\n\r\nabc");
    sc_queue(sc, A_RESET, 20, NULL, 0);
  }
}

static void reset_mid_body(void **state) {
  static const char *paths[] = {"/cl-fin", "/chunked-reset", "/chunked-fin",
                                "/eof-reset"};
  static const char *bodies[] = {"abc", "abc", "abcde", "abc"};
  fx_t *fx = fx_new(NULL);
  int i;
  (void)state;
  fx->srv.handler = h_cut_body;
  for (i = 0; i < 4; i++) {
    cap_init(&C[i], fx, M_NONE);
    roundtrip(&C[i], "GET", paths[i]);
    expect_fail(&C[i], OM_UPSTREAM_FAIL_RESET_MID_BODY, OM_EIO);
    assert_int_equal(C[i].headers, 1);
    assert_int_equal(C[i].res.headers_delivered, 1);
    assert_string_equal(C[i].body, bodies[i]);
  }
  assert_int_equal(peer_st(fx).idle, 0);
  assert_int_equal(peer_st(fx).failures, 4);
  fx_free(fx);
}

typedef struct {
  const char *resp;
  int err;
  const char *detail; /* a substring */
} bad_t;

static void malformed_responses_are_refused(void **state) {
  static char big[70000];
  static char many[8000];
  static const bad_t bad[] = {
      {"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\nContent-Length: 0\r\n\r\n",
       OM_EPARSE, "obs-fold"},
      {"HTTP/1.1 200 OK\r\n X-A: 1\r\nContent-Length: 0\r\n\r\n", OM_EPARSE,
       "whitespace before the first field"},
      {"HTTP/1.1 200 OK\r\nX-A: a\rb\r\nContent-Length: 0\r\n\r\n", OM_EPARSE,
       "bare CR"},
      {"HTTP/1.1 200 OK\r\nX-A: a\nContent-Length: 0\r\n\r\n", OM_EPARSE,
       "bare LF"},
      {"HTTP/1.1 200 OK\nContent-Length: 0\n\n", OM_EPARSE, "bare LF"},
      {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: "
       "chunked\r\n\r\n0\r\n\r\n",
       OM_EPARSE, "both Content-Length and Transfer-Encoding"},
      {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok",
       OM_EPARSE, "more than one Content-Length"},
      {"HTTP/1.1 200 OK\r\nContent-Length: 1, 1\r\n\r\nok", OM_EPARSE,
       "invalid Content-Length"},
      {"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok", OM_EPARSE,
       "invalid Content-Length"},
      {"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\nok",
       OM_EPARSE, "invalid Content-Length"},
      {"HTTP/1.1 200 OK\r\nContent-Length: 0x2\r\n\r\nok", OM_EPARSE,
       "invalid Content-Length"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nok", OM_EPARSE,
       "other than chunked"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
       OM_EPARSE, "other than chunked"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: "
       "chunked\r\n\r\n0\r\n\r\n",
       OM_EPARSE, "more than one Transfer-Encoding"},
      {"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
       OM_EPARSE, "HTTP/1.0"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n\r\n",
       OM_EPARSE, "not hex digits"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
       "fffffffffffffffff\r\n",
       OM_EPARSE, "over 2^63-1"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n",
       OM_EPARSE, "not followed by CRLF"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\r",
       OM_EPARSE, "not followed by CRLF"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3 \r\nabc\r\n",
       OM_EPARSE, "chunk extension"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;=x\r\nabc\r\n",
       OM_EPARSE, "chunk extension"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;a=\"x\r\n",
       OM_EPARSE, "chunk extension"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\r\n",
       OM_EPARSE, "bare LF"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n bad\r\n\r\n",
       OM_EPARSE, "trailer"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX : "
       "y\r\n\r\n",
       OM_EPARSE, "trailer"},
      {"HTTP/1.1 101 Switching Protocols\r\nUpgrade: ws\r\nConnection: "
       "upgrade\r\n\r\n",
       OM_EPARSE, "101"},
      {"HTTP/1.1 099 Odd\r\n\r\n", OM_EPARSE, "100..599"},
      {"HTTP/1.1 600 Odd\r\n\r\n", OM_EPARSE, "100..599"},
      {"HTTP/1.1 20 OK\r\n\r\n", OM_EPARSE, "three digits"},
      {"HTTP/1.1 2000 OK\r\n\r\n", OM_EPARSE, "not followed by SP"},
      {"HTTP/2.0 200 OK\r\n\r\n", OM_EPARSE, "HTTP/1.0 or HTTP/1.1"},
      {"HTTP/1.2 200 OK\r\n\r\n", OM_EPARSE, "HTTP/1.0 or HTTP/1.1"},
      {"http/1.1 200 OK\r\n\r\n", OM_EPARSE, "HTTP/1.0 or HTTP/1.1"},
      {"HTTP/1.1  200 OK\r\n\r\n", OM_EPARSE, "three digits"},
      {"\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", OM_EPARSE,
       "HTTP/1.0 or HTTP/1.1"},
      {"HTTP/1.1 200 O\x01K\r\nContent-Length: 0\r\n\r\n", OM_EPARSE,
       "reason phrase"},
      {"HTTP/1.1 200 OK\r\nX-A : 1\r\nContent-Length: 0\r\n\r\n", OM_EPARSE,
       "between a field name and the colon"},
      {"HTTP/1.1 200 OK\r\nX(A): 1\r\nContent-Length: 0\r\n\r\n", OM_EPARSE,
       "not a token"},
      {"HTTP/1.1 200 OK\r\n: 1\r\nContent-Length: 0\r\n\r\n", OM_EPARSE,
       "not a token"},
      {"HTTP/1.1 200 OK\r\nX-A: a\x7f\r\nContent-Length: 0\r\n\r\n", OM_EPARSE,
       "control character"},
      {"HTTP/1.1 200 OK\r\nX-A: a\x01\r\nContent-Length: 0\r\n\r\n", OM_EPARSE,
       "control character"},
      {"HTTP/1.1 200 OK\r\nConnection: close x\r\nContent-Length: 0\r\n\r\n",
       OM_EPARSE, "Connection element"},
      /* HTAB where no whitespace may be: inside a chunk-size, before a
       * chunk's CRLF */
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\t0\r\n",
       OM_EPARSE, "chunk extension"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\t\r\n",
       OM_EPARSE, "not followed by CRLF"},
      {big, OM_ETOOBIG, "max_header_bytes"},
      {many, OM_ETOOBIG, "max_headers"},
  };
  fx_t *fx = fx_new(NULL);
  size_t i;
  (void)state;
  {
    size_t k = (size_t)snprintf(big, sizeof big, "HTTP/1.1 200 OK\r\nX-Big: ");
    memset(big + k, 'a', sizeof big - k - 1);
    big[sizeof big - 1] = 0;
  }
  {
    size_t k = (size_t)snprintf(many, sizeof many, "HTTP/1.1 200 OK\r\n");
    int j;
    for (j = 0; j < 101; j++)
      k += (size_t)snprintf(many + k, sizeof many - k, "X-%d: v\r\n", j);
    snprintf(many + k, sizeof many - k, "Content-Length: 0\r\n\r\n");
  }
  for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    fx->srv.raw = bad[i].resp;
    fx->srv.raw_len = strlen(bad[i].resp);
    cap_init(&C[0], fx, M_NONE);
    roundtrip(&C[0], "GET", "/raw");
    if (C[0].res.fail != OM_UPSTREAM_FAIL_MALFORMED ||
        C[0].res.err != bad[i].err ||
        strstr(C[0].detail, bad[i].detail) == NULL)
      fail_msg("case %zu: got %s %d (%s), want malformed %d (%s)", i,
               C[0].res.reason, C[0].res.err, C[0].detail, bad[i].err,
               bad[i].detail);
    spin(fx, 2);
    /* never pooled */
    assert_int_equal(peer_st(fx).idle, 0);
  }
  /* and the client still works against a good answer */
  cap_init(&C[1], fx, M_NONE);
  roundtrip(&C[1], "GET", "/ok");
  expect_ok(&C[1], 200, "hello");
  fx_free(fx);
}

static void valid_edge_cases_are_accepted(void **state) {
  static const struct {
    const char *resp, *body;
    int status;
  } ok[] = {
      {"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok", "ok", 200},
      {"HTTP/1.1 200 \r\nContent-Length: 2\r\n\r\nok", "ok", 200},
      {"HTTP/1.1 299 Whatever \xe9t\xe9\r\nContent-Length: 2\r\n\r\nok", "ok",
       299},
      {"HTTP/1.1 200 OK\r\nX-Empty:\r\nX-Sp:   \r\nX-Obs: caf\xc3\xa9\r\n"
       "Content-Length:  2 \r\n\r\nok",
       "ok", 200},
      {"HTTP/1.1 200 OK\r\ntransfer-encoding: CHUNKED\r\n\r\n"
       "A\r\n0123456789\r\n0;x=y\r\n\r\n",
       "0123456789", 200},
      {"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
       "HTTP/1.1 100 Continue\r\n\r\n"
       "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
       "ok", 200},
      /* OWS after the value is not part of it (RFC 9110 5.5) */
      {"HTTP/1.1 200 OK\r\nContent-Length: 2\t\r\n\r\nok", "ok", 200},
      /* HTAB as OWS after the coding and as BWS before a chunk-ext, read
       * as RFC 9110 5.6.3 and 9112 7.1.1 say */
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding:\tchunked\t\r\n\r\n"
       "3\t;a=b\r\no\tk\r\n0\r\n\r\n",
       "o\tk", 200},
      {"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", "", 404},
      {"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy", "busy", 503},
  };
  fx_t *fx = fx_new(NULL);
  size_t i;
  (void)state;
  for (i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    fx->srv.raw = ok[i].resp;
    fx->srv.raw_len = strlen(ok[i].resp);
    cap_init(&C[0], fx, M_NONE);
    roundtrip(&C[0], "GET", "/raw");
    if (C[0].res.err != 0)
      fail_msg("case %zu: %s (%s)", i, C[0].res.reason, C[0].detail);
    expect_ok(&C[0], ok[i].status, ok[i].body);
    assert_int_equal(C[0].headers, 1);
  }
  /* a chunked body of thousands of HTABs, across read slices, arrives as
   * it was sent */
  {
    static char resp[16384], body[8192];
    char *w = resp;
    size_t j;
    w += sprintf(w, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\t\r\n\r\n"
                    "1770\t;a=b\r\n");
    for (j = 0; j < 6000; j += 2)
      memcpy(body + j, "\tb", 2);
    body[6000] = 0;
    memcpy(w, body, 6000);
    w += 6000;
    w += sprintf(w, "\r\n0\r\n\r\n");
    fx->srv.raw = resp;
    fx->srv.raw_len = (size_t)(w - resp);
    cap_init(&C[0], fx, M_NONE);
    roundtrip(&C[0], "GET", "/raw");
    expect_ok(&C[0], 200, body);
  }
  /* every one of them left the connection reusable */
  assert_int_equal(fx->srv.accepts, 1);
  fx->srv.raw = "HTTP/1.1 200 OK\r\nX-Empty:\r\nX-Sp:   \r\n"
                "Content-Length: 0\r\n\r\n";
  fx->srv.raw_len = strlen(fx->srv.raw);
  cap_init(&C[0], fx, M_NONE);
  roundtrip(&C[0], "GET", "/raw");
  assert_string_equal(C[0].hdump, "X-Empty: \nX-Sp: \nContent-Length: 0\n");
  fx_free(fx);
}

/* ------------------------------------------------------------------ */
/* header handling */

static void hop_by_hop_fields_are_stripped(void **state) {
  fx_t *fx = fx_new(NULL);
  om_upstream_request_t q;
  om_http_header_t h[] = {
      {"Connection", "keep-alive, X-Private", 0, 0},
      {"X-Private", "secret", 0, 0},
      {"Keep-Alive", "timeout=5", 0, 0},
      {"Proxy-Connection", "keep-alive", 0, 0},
      {"TE", "trailers", 0, 0},
      {"Trailer", "X-T", 0, 0},
      {"Transfer-Encoding", "chunked", 0, 0},
      {"Upgrade", "websocket", 0, 0},
      {"Content-Length", "999", 0, 0},
      {"Host", "svc.internal", 0, 0},
      {"x-forwarded-for", "10.0.0.1", 0, 0},
      {"connection", "x-other", 0, 0},
      {"X-Other", "1", 0, 0},
  };
  static const char resp[] =
      "HTTP/1.1 200 OK\r\nConnection: X-Hop, keep-alive\r\nX-Hop: 1\r\n"
      "Keep-Alive: timeout=5\r\nProxy-Connection: x\r\nUpgrade: h2c\r\n"
      "Trailer: X-T\r\nTE: x\r\nX-Kept: 2\r\nContent-Length: 2\r\n\r\nok";
  const char *head;
  char v[64];
  (void)state;
  memset(&q, 0, sizeof q);
  q.method = "PUT";
  q.target = "/echo";
  q.headers = h;
  q.n_headers = sizeof h / sizeof h[0];
  q.body = "xy";
  q.body_len = 2;
  cap_init(&C[0], fx, M_NONE);
  assert_int_equal(send_full(&C[0], &q), 0);
  RUN_UNTIL(fx, C[0].done, 2000);
  expect_ok(&C[0], 200, "xy");
  head = fx->srv.last.head;
  {
    static const char *gone[] = {"connection",        "x-private", "keep-alive",
                                 "proxy-connection",  "te",        "trailer",
                                 "transfer-encoding", "upgrade",   "x-other"};
    size_t i;
    for (i = 0; i < sizeof gone / sizeof gone[0]; i++)
      if (head_field(head, gone[i], v, sizeof v) != NULL)
        fail_msg("%s was forwarded:\n%s", gone[i], head);
  }
  assert_non_null(head_field(head, "content-length", v, sizeof v));
  assert_string_equal(v, "2"); /* ours, not the caller's 999 */
  assert_non_null(head_field(head, "host", v, sizeof v));
  assert_string_equal(v, "svc.internal"); /* the caller's Host stays */
  assert_non_null(head_field(head, "x-forwarded-for", v, sizeof v));
  assert_non_null(strstr(head, "PUT /echo HTTP/1.1\r\n"));
  /* and in the response */
  fx->srv.raw = resp;
  fx->srv.raw_len = strlen(resp);
  cap_init(&C[1], fx, M_NONE);
  roundtrip(&C[1], "GET", "/raw");
  expect_ok(&C[1], 200, "ok");
  assert_string_equal(C[1].hdump, "X-Kept: 2\nContent-Length: 2\n");
  fx_free(fx);
}

static void bad_requests_are_refused_synchronously(void **state) {
  fx_t *fx = fx_new(NULL);
  om_upstream_request_t q;
  om_http_header_t crlf[] = {{"X-A", "a\r\nX-Injected: 1", 0, 0}};
  om_http_header_t sp[] = {{"X A", "1", 0, 0}};
  om_http_header_t nul[] = {{"X-A", "a\0b", 0, 3}};
  om_http_header_t conn[] = {{"Connection", "a b", 0, 0}};
  om_upstream_callbacks_t nodone = {cb_headers, cb_body, NULL, NULL};
  om_upstream_req_t *r = NULL;
  static const char *targets[] = {"",     "x",     "/a b", "/a#f",
                                  "/%zz", "/\x80", "*"};
  size_t i;
  (void)state;
  memset(&q, 0, sizeof q);
  q.method = "GET";
  q.target = "/";
  cap_init(&C[0], fx, M_NONE);
  assert_int_equal(om_upstream_send(NULL, &fx->tgt, &q, &CB, &C[0], &r),
                   OM_EINVAL);
  assert_int_equal(om_upstream_send(fx->pool, NULL, &q, &CB, &C[0], &r),
                   OM_EINVAL);
  assert_int_equal(om_upstream_send(fx->pool, &fx->tgt, NULL, &CB, &C[0], &r),
                   OM_EINVAL);
  assert_int_equal(om_upstream_send(fx->pool, &fx->tgt, &q, NULL, &C[0], &r),
                   OM_EINVAL);
  assert_int_equal(om_upstream_send(fx->pool, &fx->tgt, &q, &CB, &C[0], NULL),
                   OM_EINVAL);
  assert_int_equal(om_upstream_send(fx->pool, &fx->tgt, &q, &nodone, &C[0], &r),
                   OM_EINVAL);
  q.method = "CONNECT";
  assert_int_equal(send_full(&C[0], &q), OM_EINVAL);
  q.method = "G T";
  assert_int_equal(send_full(&C[0], &q), OM_EINVAL);
  q.method = "";
  assert_int_equal(send_full(&C[0], &q), OM_EINVAL);
  q.method = "GET";
  for (i = 0; i < sizeof targets / sizeof targets[0]; i++) {
    q.target = targets[i];
    if (send_full(&C[0], &q) != OM_EINVAL)
      fail_msg("target '%s' was accepted", targets[i]);
  }
  q.target = "/";
  q.headers = crlf;
  q.n_headers = 1;
  assert_int_equal(send_full(&C[0], &q), OM_EINVAL);
  q.headers = sp;
  assert_int_equal(send_full(&C[0], &q), OM_EINVAL);
  q.headers = nul;
  assert_int_equal(send_full(&C[0], &q), OM_EINVAL);
  q.headers = conn;
  assert_int_equal(send_full(&C[0], &q), OM_EINVAL);
  q.headers = NULL;
  assert_int_equal(send_full(&C[0], &q), OM_EINVAL);
  q.n_headers = 0;
  q.body_len = 3; /* no body pointer */
  assert_int_equal(send_full(&C[0], &q), OM_EINVAL);
  q.body_len = 0;
  /* OPTIONS * is fine */
  q.method = "OPTIONS";
  q.target = "*";
  assert_int_equal(send_full(&C[0], &q), 0);
  RUN_UNTIL(fx, C[0].done, 2000);
  expect_ok(&C[0], 200, "hello");
  spin(fx, 5);
  assert_int_equal(fx->srv.requests, 1); /* nothing else was sent */
  assert_int_equal(peer_st(fx).requests, 1);
  fx_free(fx);
}

static void bodiless_responses(void **state) {
  fx_t *fx = fx_new(NULL);
  static const struct {
    const char *method, *resp;
    int status;
  } cases[] = {
      {"HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", 200},
      {"HEAD", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", 200},
      {"GET", "HTTP/1.1 204 No Content\r\n\r\n", 204},
      {"GET", "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", 204},
      {"GET", "HTTP/1.1 304 Not Modified\r\nContent-Length: 1234\r\n\r\n", 304},
      {"GET", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
       204},
  };
  size_t i;
  (void)state;
  for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fx->srv.raw = cases[i].resp;
    fx->srv.raw_len = strlen(cases[i].resp);
    cap_init(&C[0], fx, M_NONE);
    roundtrip(&C[0], cases[i].method, "/raw");
    expect_ok(&C[0], cases[i].status, "");
    assert_int_equal(C[0].has_body, 0);
    assert_int_equal(C[0].cl, 0);
    assert_int_equal(C[0].body_calls, 0);
  }
  /* none of them left bytes behind: one connection throughout, and a
   * normal request after them reads its own response */
  cap_init(&C[1], fx, M_NONE);
  roundtrip(&C[1], "GET", "/ok");
  expect_ok(&C[1], 200, "hello");
  assert_int_equal(fx->srv.accepts, 1);
  assert_int_equal(fx->srv.n_head, 2);
  fx_free(fx);
}

/* ------------------------------------------------------------------ */
/* streaming and backpressure */

#define BIG (16u << 20)
static char big_body[BIG];
static char big_head[128];

static void h_big(srv_t *s, sconn_t *sc, const sreq_t *q) {
  int k, sndbuf = 65536;
  (void)s;
  (void)q;
  /* a fixed send buffer: what the kernel absorbs stays well below BIG */
  uv_send_buffer_size((uv_handle_t *)&sc->tcp, &sndbuf);
  k = snprintf(big_head, sizeof big_head,
               "HTTP/1.1 200 OK\r\nContent-Length: %u\r\n\r\n", BIG);
  sc_queue(sc, A_WRITE, 0, big_head, (size_t)k);
  sc_queue(sc, A_WRITE, 0, big_body, BIG);
}

static void streaming_with_pause_and_resume(void **state) {
  fx_t *fx = fx_new(NULL);
  sconn_t *sc;
  size_t queued, got;
  uint64_t want = 0;
  size_t i;
  (void)state;
  for (i = 0; i < BIG; i++) {
    big_body[i] = (char)('a' + (i * 7) % 26);
    want = want * 31 + (unsigned char)big_body[i];
  }
  fx->srv.handler = h_big;
  cap_init(&C[0], fx, M_PAUSE_BODY);
  assert_int_equal(send_simple(&C[0], "GET", "/big"), 0);
  RUN_UNTIL(fx, C[0].body_calls == 1, 2000);
  assert_int_equal(C[0].pause_rc, 0);
  spin(fx, 50);
  /* paused: nothing more delivered, and the server's write backs up */
  assert_int_equal(C[0].body_calls, 1);
  got = C[0].res.body_bytes;
  sc = srv_last_conn(&fx->srv);
  assert_non_null(sc);
  queued = uv_stream_get_write_queue_size((uv_stream_t *)&sc->tcp);
  OM_ASSERT_CMP(queued, >, BIG / 2);
  assert_int_equal(om_upstream_pause(C[0].req), 0); /* idempotent */
  /* resume: the rest arrives, from the loop */
  C[0].mode = M_NONE;
  assert_int_equal(om_upstream_resume(C[0].req), 0);
  assert_int_equal(C[0].body_calls, 1); /* not from inside resume */
  assert_int_equal(om_upstream_resume(C[0].req), 0);
  RUN_UNTIL(fx, C[0].done, 5000);
  assert_int_equal(C[0].res.err, 0);
  assert_int_equal(C[0].res.body_bytes, BIG);
  assert_int_equal(C[0].body_sum, want);
  OM_ASSERT_CMP(C[0].body_calls, >, 2);
  OM_ASSERT_CMP(got, <, BIG);
  assert_int_equal(peer_st(fx).idle, 1);
  /* timeouts keep running while paused */
  {
    om_upstream_request_t q;
    memset(&q, 0, sizeof q);
    q.method = "GET";
    q.target = "/big";
    q.timeout_ms = 80;
    fx->srv.handler = h_big;
    cap_init(&C[2], fx, M_PAUSE_BODY);
    assert_int_equal(send_full(&C[2], &q), 0);
    RUN_UNTIL(fx, C[2].done, 2000);
    expect_fail(&C[2], OM_UPSTREAM_FAIL_TIMEOUT_TOTAL, OM_EDEADLINE);
    assert_int_equal(C[2].body_calls, 1);
    assert_int_equal(C[2].res.headers_delivered, 1);
    assert_int_equal(C[2].pause_in_done_rc, OM_ESTATE);
    assert_int_equal(C[2].resume_in_done_rc, OM_ESTATE);
  }
  /* pause during on_headers: no body until resume */
  {
    cap_t *c = &C[1];
    cap_init(c, fx, M_NONE);
    fx->srv.handler = h_default;
    assert_int_equal(send_simple(c, "GET", "/ok"), 0);
    assert_int_equal(om_upstream_pause(c->req), 0);
    spin(fx, 30);
    assert_int_equal(c->headers, 0);
    assert_int_equal(c->done, 0);
    assert_int_equal(om_upstream_resume(c->req), 0);
    RUN_UNTIL(fx, c->done, 2000);
    expect_ok(c, 200, "hello");
  }
  /* pause inside the on_body that carried the last byte of a
   * Content-Length body: resume ends the response */
  {
    cap_t *c = &C[3];
    cap_init(c, fx, M_PAUSE_BODY);
    assert_int_equal(send_simple(c, "GET", "/ok"), 0);
    RUN_UNTIL(fx, c->body_calls == 1, 2000);
    assert_int_equal(c->pause_rc, 0);
    spin(fx, 30);
    assert_int_equal(c->done, 0);
    assert_int_equal(om_upstream_resume(c->req), 0);
    RUN_UNTIL(fx, c->done, 2000);
    assert_int_equal(c->done, 1);
    expect_ok(c, 200, "hello");
  }
  fx_free(fx);
}

/* Read up to n bytes of fd (non-blocking) into the running sum, the
 * loop turning meanwhile; how many came. */
static size_t lent_read(fx_t *fx, int fd, size_t n, uint64_t *sum) {
  static char buf[65536];
  size_t got = 0;
  for (int i = 0; i < 20000 && got < n; i++) {
    size_t want = n - got < sizeof buf ? n - got : sizeof buf;
    ssize_t k = read(fd, buf, want);
    if (k > 0) {
      for (ssize_t j = 0; j < k; j++)
        *sum = *sum * 31 + (unsigned char)buf[j];
      got += (size_t)k;
    } else {
      spin(fx, 1);
    }
  }
  return got;
}

/* The rest of a Content-Length body read from the lent socket: the
 * response completes and the connection is pooled; given back broken,
 * the attempt ends reset_mid_body and nothing is pooled. */
static void response_lend_hands_over_the_rest_of_the_body(void **state) {
  fx_t *fx = fx_new(NULL);
  uint64_t want = 0, sum, left = 0;
  int fd = -1;
  size_t i;
  (void)state;
  for (i = 0; i < BIG; i++) {
    big_body[i] = (char)('a' + (i * 7) % 26);
    want = want * 31 + (unsigned char)big_body[i];
  }
  fx->srv.handler = h_big;
  cap_init(&C[0], fx, M_PAUSE_BODY);
  assert_int_equal(send_simple(&C[0], "GET", "/big"), 0);
  /* not paused, nothing delivered yet: refused */
  assert_int_equal(om_upstream_response_lend(C[0].req, &fd, &left), OM_ESTATE);
  assert_int_equal(om_upstream_response_lend(NULL, &fd, &left), OM_EINVAL);
  RUN_UNTIL(fx, C[0].body_calls == 1, 2000);
  assert_int_equal(om_upstream_response_lend(C[0].req, &fd, &left), 0);
  /* what the first read held went to on_body; res.body_bytes adds up
   * both at the end */
  OM_ASSERT_CMP(left, <, BIG);
  OM_ASSERT_CMP(left, >, BIG / 2);
  assert_int_equal(om_upstream_response_lend(C[0].req, &fd, &left), OM_ESTATE);
  assert_int_equal(om_upstream_resume(C[0].req), OM_ESTATE); /* lent */
  sum = C[0].body_sum;
  OM_ASSERT_CMP(lent_read(fx, fd, (size_t)left, &sum), ==, left);
  assert_int_equal(C[0].body_calls, 1); /* nothing read behind our back */
  assert_int_equal(om_upstream_response_unlend(C[0].req, left + 1, 0),
                   OM_EINVAL);
  assert_int_equal(om_upstream_response_unlend(C[0].req, left, 0), 0);
  assert_int_equal(om_upstream_response_unlend(C[0].req, 0, 0), OM_ESTATE);
  assert_int_equal(sum, want);
  C[0].mode = M_NONE;
  assert_int_equal(om_upstream_resume(C[0].req), 0);
  RUN_UNTIL(fx, C[0].done, 5000);
  assert_int_equal(C[0].res.err, 0);
  assert_int_equal(C[0].res.body_bytes, BIG);
  assert_int_equal(C[0].body_calls, 1);
  assert_int_equal(peer_st(fx).idle, 1); /* pooled after a lent body */
  /* given back broken: the attempt fails, from the loop */
  cap_init(&C[1], fx, M_PAUSE_BODY);
  assert_int_equal(send_simple(&C[1], "GET", "/big"), 0);
  RUN_UNTIL(fx, C[1].body_calls == 1, 2000);
  assert_int_equal(om_upstream_response_lend(C[1].req, &fd, &left), 0);
  sum = 0;
  OM_ASSERT_CMP(lent_read(fx, fd, 1000, &sum), ==, 1000);
  assert_int_equal(om_upstream_response_unlend(C[1].req, 1000, 1), 0);
  assert_int_equal(C[1].done, 0); /* not from inside the call */
  RUN_UNTIL(fx, C[1].done, 2000);
  expect_fail(&C[1], OM_UPSTREAM_FAIL_RESET_MID_BODY, OM_EIO);
  assert_int_equal(peer_st(fx).idle, 0);
  fx_free(fx);
}

/* ------------------------------------------------------------------ */
/* cancel, abort, close */

static void cancel_at_every_phase(void **state) {
  fx_t *fx = fx_new(NULL);
  (void)state;
  /* before anything happened (connecting) */
  cap_init(&C[0], fx, M_NONE);
  assert_int_equal(send_simple(&C[0], "GET", "/ok"), 0);
  assert_int_equal(om_upstream_cancel(C[0].req), 0);
  /* waiting for the response */
  cap_init(&C[1], fx, M_NONE);
  assert_int_equal(send_simple(&C[1], "GET", "/stall"), 0);
  RUN_UNTIL(fx, fx->srv.requests >= 1, 2000);
  assert_int_equal(om_upstream_cancel(C[1].req), 0);
  /* inside on_headers */
  cap_init(&C[2], fx, M_CANCEL_HEADERS);
  assert_int_equal(send_simple(&C[2], "GET", "/ok"), 0);
  RUN_UNTIL(fx, C[2].headers, 2000);
  /* inside on_body */
  cap_init(&C[3], fx, M_CANCEL_BODY);
  assert_int_equal(send_simple(&C[3], "GET", "/ok"), 0);
  RUN_UNTIL(fx, C[3].body_calls, 2000);
  /* a request whose on_done is queued (a connect error) */
  {
    om_upstream_target_t keep = fx->tgt;
    assert_int_equal(
        om_upstream_target_init(&fx->tgt, "127.0.0.1", free_port()), 0);
    cap_init(&C[4], fx, M_NONE);
    assert_int_equal(send_simple(&C[4], "GET", "/"), 0);
    RUN_UNTIL(fx, 0, 20);
    fx->tgt = keep;
  }
  spin(fx, 30);
  assert_int_equal(C[0].done + C[1].done + C[2].done + C[3].done, 0);
  assert_int_equal(C[2].cancel_rc, 0);
  assert_int_equal(C[3].cancel_rc, 0);
  assert_int_equal(C[3].body_calls, 1);
  assert_int_equal(C[4].done, 1);
  assert_int_equal(C[4].cancel_in_done_rc, OM_ESTATE);
  assert_int_equal(om_upstream_cancel(NULL), OM_EINVAL);
  assert_int_equal(om_upstream_pause(NULL), OM_EINVAL);
  assert_int_equal(om_upstream_resume(NULL), OM_EINVAL);
  assert_int_equal(peer_st(fx).active, 0);
  /* a cancelled request's connection is never pooled */
  assert_int_equal(peer_st(fx).idle, 0);
  assert_int_equal(peer_st(fx).failures, 0);
  /* the pool is fine afterwards */
  cap_init(&C[5], fx, M_NONE);
  roundtrip(&C[5], "GET", "/ok");
  expect_ok(&C[5], 200, "hello");
  fx_free(fx);
}

static void abort_from_on_headers(void **state) {
  fx_t *fx = fx_new(NULL);
  (void)state;
  cap_init(&C[0], fx, M_ABORT_HEADERS);
  roundtrip(&C[0], "GET", "/ok");
  expect_fail(&C[0], OM_UPSTREAM_FAIL_ABORTED, OM_ESTATE);
  assert_int_equal(C[0].headers, 1);
  assert_int_equal(C[0].body_calls, 0);
  assert_int_equal(peer_st(fx).idle, 0);
  assert_int_equal(peer_st(fx).failures, 0);
  fx_free(fx);
}

static int send_upgrade(cap_t *c, const char *t) {
  om_http_header_t h[] = {{"Upgrade", "h2c", 0, 0},
                          {"Sec-WebSocket-Key", "k", 0, 0}};
  om_upstream_request_t q;
  memset(&q, 0, sizeof q);
  q.method = "GET";
  q.target = t;
  q.headers = h;
  q.n_headers = 2;
  q.upgrade = "echo";
  q.timeout_ms = 5000;
  return send_full(c, &q);
}

static void upgrade_101_hands_over_a_tunnel(void **state) {
  static const char resp[] =
      "HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\n"
      "Connection: upgrade\r\nSec-WebSocket-Accept: a\r\n\r\nfirst-frame";
  fx_t *fx = fx_new(NULL);
  char v[64];
  (void)state;
  fx->srv.raw = resp;
  fx->srv.raw_len = sizeof resp - 1;
  cap_init(&C[0], fx, M_TUNNEL);
  assert_int_equal(send_upgrade(&C[0], "/raw-then-close"), 0);
  RUN_UNTIL(fx, C[0].done && C[0].tun_closes, 3000);
  expect_ok(&C[0], 101, "");
  assert_int_equal(C[0].res.upgraded, 1);
  assert_int_equal(C[0].take_rc, 0);
  assert_int_equal(C[0].take_again_rc, OM_ESTATE);
  assert_string_equal(C[0].upgrade, "echo");
  /* the end-to-end fields of the 101, without the hop-by-hop ones */
  assert_string_equal(C[0].hdump, "Sec-WebSocket-Accept: a\n");
  /* the bytes behind the head, then the server's FIN, then ours */
  assert_string_equal(C[0].tun_data, "first-frame");
  assert_int_equal(C[0].tun_eofs, 1);
  assert_int_equal(C[0].tun_closes, 1);
  assert_int_equal(C[0].tun_err, 0);
  /* the request asked with our Upgrade, never the caller's */
  assert_non_null(head_field(fx->srv.last.head, "upgrade", v, sizeof v));
  assert_string_equal(v, "echo");
  assert_non_null(head_field(fx->srv.last.head, "connection", v, sizeof v));
  assert_string_equal(v, "upgrade");
  assert_null(strstr(fx->srv.last.head, "h2c"));
  assert_non_null(
      head_field(fx->srv.last.head, "sec-websocket-key", v, sizeof v));
  /* never pooled */
  assert_int_equal(peer_st(fx).idle, 0);
  assert_int_equal(peer_st(fx).active, 0);
  fx_free(fx);
}

static void upgrade_not_taken_or_not_granted(void **state) {
  static const char resp[] =
      "HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\n"
      "Connection: upgrade\r\n\r\n";
  static const char no_upgrade[] =
      "HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\n\r\n";
  fx_t *fx = fx_new(NULL);
  (void)state;
  /* a 101 nobody takes: the connection is closed, the request aborted */
  fx->srv.raw = resp;
  fx->srv.raw_len = sizeof resp - 1;
  cap_init(&C[0], fx, M_NONE);
  assert_int_equal(send_upgrade(&C[0], "/raw"), 0);
  RUN_UNTIL(fx, C[0].done, 3000);
  expect_fail(&C[0], OM_UPSTREAM_FAIL_ABORTED, OM_ESTATE);
  assert_int_equal(C[0].status, 101);
  assert_int_equal(peer_st(fx).idle, 0);
  /* a 101 without the protocol it switched to is malformed */
  fx->srv.raw = no_upgrade;
  fx->srv.raw_len = sizeof no_upgrade - 1;
  cap_init(&C[1], fx, M_TUNNEL);
  assert_int_equal(send_upgrade(&C[1], "/raw"), 0);
  RUN_UNTIL(fx, C[1].done, 3000);
  expect_fail(&C[1], OM_UPSTREAM_FAIL_MALFORMED, OM_EPARSE);
  assert_int_equal(C[1].headers, 0);
  /* any other answer is an ordinary response */
  cap_init(&C[2], fx, M_TUNNEL);
  assert_int_equal(send_upgrade(&C[2], "/ok"), 0);
  RUN_UNTIL(fx, C[2].done, 3000);
  expect_ok(&C[2], 200, "hello");
  assert_int_equal(C[2].res.upgraded, 0);
  assert_null(C[2].tun);
  fx_free(fx);
}

static void pool_close_with_requests_in_flight(void **state) {
  fx_t *fx = fx_new(NULL);
  int i;
  (void)state;
  for (i = 0; i < 3; i++) {
    cap_init(&C[i], fx, M_NONE);
    assert_int_equal(send_simple(&C[i], "GET", "/stall"), 0);
  }
  cap_init(&C[3], fx, M_NONE);
  assert_int_equal(send_simple(&C[3], "GET", "/ok"), 0);
  RUN_UNTIL(fx, fx->srv.requests == 4 && C[3].done, 2000);
  assert_int_equal(peer_st(fx).idle, 1);
  assert_int_equal(
      om_upstream_pool_close(fx->pool, on_pool_closed, &fx->pool_closed), 0);
  assert_int_equal(C[0].done, 0); /* not synchronously */
  cap_init(&C[4], fx, M_NONE);
  assert_int_equal(send_simple(&C[4], "GET", "/ok"), OM_ESTATE);
  RUN_UNTIL(fx, fx->pool_closed, 2000);
  assert_true(fx->pool_closed);
  for (i = 0; i < 3; i++)
    expect_fail(&C[i], OM_UPSTREAM_FAIL_CLOSED, OM_ESTATE);
  fx->pool = NULL;
  RUN_UNTIL(fx, srv_open_conns(&fx->srv) == 0, 2000);
  assert_int_equal(srv_open_conns(&fx->srv), 0);
  /* closing from inside on_body */
  {
    fx_t *fx2 = fx_new(NULL);
    fx2->srv.handler = h_cut_body; /* "/cl-fin": 3 of 10 bytes, then FIN */
    cap_init(&C[5], fx2, M_CLOSE_POOL_BODY);
    assert_int_equal(send_simple(&C[5], "GET", "/cl-fin"), 0);
    RUN_UNTIL(fx2, fx2->pool_closed, 2000);
    assert_true(fx2->pool_closed);
    expect_fail(&C[5], OM_UPSTREAM_FAIL_CLOSED, OM_ESTATE);
    assert_int_equal(C[5].body_calls, 1);
    fx2->pool = NULL;
    fx_free(fx2);
  }
  fx_free(fx);
}

/* ------------------------------------------------------------------ */
/* allocation failures */

static void allocation_failures_end_cleanly(void **state) {
  static char resp[40000];
  int n, ok = 0;
  (void)state;
  {
    /* a head over the read buffer (it must grow) with 40 fields (the
     * field array must grow) */
    size_t k = (size_t)snprintf(resp, sizeof resp, "HTTP/1.1 200 OK\r\n");
    int j;
    for (j = 0; j < 40; j++)
      k += (size_t)snprintf(resp + k, sizeof resp - k, "X-%d: v\r\n", j);
    k += (size_t)snprintf(resp + k, sizeof resp - k, "X-Big: ");
    memset(resp + k, 'b', 20000);
    k += 20000;
    snprintf(resp + k, sizeof resp - k,
             "\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n");
  }
  for (n = 0; n < 200 && !ok; n++) {
    fx_t *fx = fx_new(NULL);
    om_upstream_pool_t *p = NULL;
    om_upstream_request_t q;
    om_http_header_t h[] = {{"X-A", "1", 0, 0}};
    long failures;
    int rc, closed = 0, sent = 0;
    fx_close_pool(fx);
    fx->srv.raw = resp;
    fx->srv.raw_len = strlen(resp);
    memset(&q, 0, sizeof q);
    q.method = "POST";
    q.target = "/raw";
    q.headers = h;
    q.n_headers = 1;
    q.body = "b";
    q.body_len = 1;
    q.timeout_ms = 2000;
    cap_init(&C[0], fx, M_NONE);
    om_test_fail_alloc_after(n);
    rc = om_upstream_pool_new(&fx->loop, NULL, &p);
    if (rc == 0) {
      rc = om_upstream_send(p, &fx->tgt, &q, &CB, &C[0], &C[0].req);
      if (rc == 0) {
        sent = 1;
        RUN_UNTIL(fx, C[0].done, 2000);
      }
    }
    failures = om_test_alloc_failures();
    om_test_alloc_reset();
    if (p != NULL) {
      assert_int_equal(om_upstream_pool_close(p, on_pool_closed, &closed), 0);
      RUN_UNTIL(fx, closed, 2000);
      assert_true(closed);
    }
    if (!sent) {
      assert_int_equal(rc, OM_ENOMEM);
      assert_int_equal(C[0].done, 0);
    } else {
      assert_int_equal(C[0].done, 1);
      if (C[0].res.err == 0) {
        assert_string_equal(C[0].body, "ok");
        assert_int_equal(C[0].nh, 41);
      } else {
        /* mid-flight: the request ends, reported as internal */
        assert_int_equal(C[0].res.fail, OM_UPSTREAM_FAIL_INTERNAL);
        assert_int_equal(C[0].res.err, OM_ENOMEM);
      }
      if (failures == 0) {
        assert_int_equal(C[0].res.err, 0);
        ok = 1;
      }
    }
    fx->pool = NULL;
    fx_free(fx);
  }
  OM_TEST_NOTE("allocations to a first response: %d", n - 1);
  assert_true(ok);
}

/* ------------------------------------------------------------------ */
/* streamed request bodies */

static int drains;

static void cb_drain(void *ud) {
  (void)ud;
  drains++;
}

static void stream_request(om_upstream_request_t *q, const char *m,
                           const char *t, int64_t len) {
  memset(q, 0, sizeof *q);
  q->method = m;
  q->target = t;
  q->timeout_ms = 10000;
  q->body_stream = 1;
  q->body_stream_length = len;
}

/* Pieces written as they come, with Content-Length known up front, reach
 * the server whole; the first-byte timeout starts at the body's end. */
static void streamed_body_with_content_length(void **state) {
  fx_t *fx = fx_new(NULL);
  om_upstream_request_t q;
  uint64_t sum = 0;
  size_t i;
  char want[64];
  (void)state;
  for (i = 0; i < 300000; i++) {
    post_body[i] = (char)('a' + (i * 7) % 26);
    sum = sum * 31 + (unsigned char)post_body[i];
  }
  snprintf(want, sizeof want, "%d %llu", 300000, (unsigned long long)sum);
  stream_request(&q, "PUT", "/sum", 300000);
  q.first_byte_timeout_ms = 100;
  cap_init(&C[0], fx, M_NONE);
  assert_int_equal(send_full(&C[0], &q), 0);
  /* nothing of the body yet, longer than the first-byte timeout */
  spin(fx, 200);
  assert_int_equal(C[0].done, 0);
  for (i = 0; i < 290000; i += 10000) {
    assert_int_equal(om_upstream_body_write(C[0].req, post_body + i, 10000), 0);
    spin(fx, 1);
  }
  /* past the length: refused, nothing queued */
  assert_int_equal(om_upstream_body_write(C[0].req, post_body + i, 10001),
                   OM_EINVAL);
  assert_int_equal(om_upstream_body_end(C[0].req), OM_EINVAL); /* short */
  assert_int_equal(om_upstream_body_write(C[0].req, post_body + i, 10000), 0);
  assert_int_equal(om_upstream_body_end(C[0].req), 0);
  assert_int_equal(om_upstream_body_end(C[0].req), OM_ESTATE);
  assert_int_equal(om_upstream_body_write(C[0].req, "", 0), OM_ESTATE);
  RUN_UNTIL(fx, C[0].done, 5000);
  expect_ok(&C[0], 200, want);
  assert_int_equal(peer_st(fx).idle, 1); /* all written: reusable */
  /* a body shorter than its length cannot end */
  stream_request(&q, "PUT", "/sum", 10);
  cap_init(&C[1], fx, M_NONE);
  assert_int_equal(send_full(&C[1], &q), 0);
  assert_int_equal(om_upstream_body_write(C[1].req, "abc", 3), 0);
  OM_ASSERT_CMP(om_upstream_body_pending(C[1].req), ==, 3);
  assert_int_equal(om_upstream_cancel(C[1].req), 0);
  /* misuse */
  stream_request(&q, "PUT", "/sum", 10);
  q.body = "x";
  q.body_len = 1;
  cap_init(&C[2], fx, M_NONE);
  assert_int_equal(send_full(&C[2], &q), OM_EINVAL);
  cap_init(&C[2], fx, M_NONE);
  assert_int_equal(send_simple(&C[2], "GET", "/ok"), 0);
  assert_int_equal(om_upstream_body_write(C[2].req, "x", 1), OM_EINVAL);
  assert_int_equal(om_upstream_body_end(C[2].req), OM_EINVAL);
  OM_ASSERT_CMP(om_upstream_body_pending(C[2].req), ==, 0);
  RUN_UNTIL(fx, C[2].done, 3000);
  fx_free(fx);
}

static uint64_t fnv_u(uint64_t h, const char *p, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) {
    h ^= (unsigned char)p[i];
    h *= 1099511628211ull;
  }
  return h;
}

/* a strict server (om_http_server) that answers "LEN HASH" of the body */
static void h_hash(om_http_request_t *req, void *ud) {
  char b[64];
  int n = snprintf(b, sizeof b, "%zu %016llx", req->body_len,
                   (unsigned long long)fnv_u(14695981039346656037ull, req->body,
                                             req->body_len));
  (void)ud;
  om_http_respond(req, 200, NULL, 0, b, (size_t)n);
}

static int hsrv_closed;

static void on_hsrv_closed(om_http_server_t *s, void *ud) {
  (void)s;
  (void)ud;
  hsrv_closed = 1;
}

/* The rest of a streamed Content-Length body written to the lent
 * socket: refused while pieces are pending; given back, the body ends as
 * usual and the server sees every byte. */
static void body_lend_hands_over_the_rest_of_the_body(void **state) {
  fx_t *fx = fx_new(NULL);
  om_upstream_request_t q;
  uint64_t sum = 0, left = 0;
  size_t i, n = 300000, off = 1000;
  int fd = -1;
  char want[64];
  (void)state;
  for (i = 0; i < n; i++) {
    post_body[i] = (char)('a' + (i * 7) % 26);
    sum = sum * 31 + (unsigned char)post_body[i];
  }
  snprintf(want, sizeof want, "%zu %llu", n, (unsigned long long)sum);
  stream_request(&q, "PUT", "/sum", (int64_t)n);
  cap_init(&C[0], fx, M_NONE);
  assert_int_equal(send_full(&C[0], &q), 0);
  RUN_UNTIL(fx, peer_st(fx).active == 1 && peer_st(fx).connects == 1, 2000);
  spin(fx, 20); /* connected, the head written */
  assert_int_equal(om_upstream_body_write(C[0].req, post_body, off), 0);
  if (om_upstream_body_pending(C[0].req) > 0) /* in flight: refused */
    assert_int_equal(om_upstream_body_lend(C[0].req, &fd, &left), OM_ESTATE);
  RUN_UNTIL(fx, om_upstream_body_pending(C[0].req) == 0, 2000);
  assert_int_equal(om_upstream_body_lend(C[0].req, &fd, &left), 0);
  OM_ASSERT_CMP(left, ==, n - off);
  assert_int_equal(om_upstream_body_write(C[0].req, "x", 1), OM_ESTATE);
  for (i = off; i < n;) {
    ssize_t k = write(fd, post_body + i, n - i);
    if (k > 0)
      i += (size_t)k;
    else
      spin(fx, 1);
  }
  assert_int_equal(om_upstream_body_unlend(C[0].req, n - off + 1, 0),
                   OM_EINVAL);
  assert_int_equal(om_upstream_body_unlend(C[0].req, n - off, 0), 0);
  assert_int_equal(om_upstream_body_end(C[0].req), 0);
  RUN_UNTIL(fx, C[0].done, 5000);
  expect_ok(&C[0], 200, want);
  /* broken: the attempt fails before the response, sent */
  stream_request(&q, "PUT", "/sum", (int64_t)n);
  cap_init(&C[1], fx, M_NONE);
  assert_int_equal(send_full(&C[1], &q), 0);
  RUN_UNTIL(fx, om_upstream_body_lend(C[1].req, &fd, &left) == 0, 2000);
  assert_int_equal(om_upstream_body_unlend(C[1].req, 0, 1), 0);
  RUN_UNTIL(fx, C[1].done, 2000);
  expect_fail(&C[1], OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, OM_EIO);
  assert_int_equal(C[1].res.sent, 1);
  assert_int_equal(C[1].res.attempts, 1); /* never re-sent transparently */
  fx_free(fx);
}

/* Length not known up front: sent chunked, read back whole by the
 * server's strict chunked decoder. */
static void streamed_body_chunked(void **state) {
  fx_t *fx = fx_new(NULL);
  om_http_server_opts_t so;
  om_http_server_t *hs;
  om_upstream_target_t t;
  om_upstream_request_t q;
  size_t i, total = 0;
  uint64_t h = 14695981039346656037ull;
  char want[64];
  (void)state;
  hsrv_closed = 0;
  memset(&so, 0, sizeof so);
  so.max_body_bytes = 1u << 20;
  assert_int_equal(om_http_server_new(&fx->loop, &so, h_hash, NULL, &hs), 0);
  assert_int_equal(om_http_server_listen(hs, "127.0.0.1", 0), 0);
  assert_int_equal(
      om_upstream_target_init(&t, "127.0.0.1", om_http_server_port(hs)), 0);
  stream_request(&q, "POST", "/h", -1);
  cap_init(&C[0], fx, M_NONE);
  assert_int_equal(om_upstream_send(fx->pool, &t, &q, &CB, &C[0], &C[0].req),
                   0);
  for (i = 1; i <= 40; i++) { /* pieces of 1 .. 40 * 997 bytes */
    size_t n = i * 997;
    memset(post_body + total, (int)('a' + i % 26), n);
    h = fnv_u(h, post_body + total, n);
    assert_int_equal(om_upstream_body_write(C[0].req, post_body + total, n), 0);
    total += n;
    if (i % 5 == 0)
      spin(fx, 1);
  }
  assert_int_equal(om_upstream_body_end(C[0].req), 0);
  snprintf(want, sizeof want, "%zu %016llx", total, (unsigned long long)h);
  RUN_UNTIL(fx, C[0].done, 5000);
  expect_ok(&C[0], 200, want);
  assert_int_equal(om_http_server_close(hs, on_hsrv_closed), 0);
  RUN_UNTIL(fx, hsrv_closed, 3000);
  fx_free(fx);
}

static int lent_released[64];

static void on_lent_done(void *ud) {
  lent_released[(int *)ud - lent_released]++;
}

/* Lent pieces (om_upstream_body_write_ref) mixed with copied ones reach a
 * strict server whole, chunked and with Content-Length; each is given
 * back exactly once, after its write, and on a cancel with pieces still
 * queued; a refused write gives nothing back. */
static void streamed_body_lent_pieces(void **state) {
  enum { PIECES = 40 };
  fx_t *fx = fx_new(NULL);
  om_http_server_opts_t so;
  om_http_server_t *hs;
  om_upstream_target_t t;
  om_upstream_request_t q;
  size_t i, total, all = 0;
  uint64_t h;
  char want[64];
  int round;
  (void)state;
  hsrv_closed = 0;
  memset(&so, 0, sizeof so);
  so.max_body_bytes = 1u << 20;
  assert_int_equal(om_http_server_new(&fx->loop, &so, h_hash, NULL, &hs), 0);
  assert_int_equal(om_http_server_listen(hs, "127.0.0.1", 0), 0);
  assert_int_equal(
      om_upstream_target_init(&t, "127.0.0.1", om_http_server_port(hs)), 0);
  for (i = 1; i <= PIECES; i++)
    all += i * 997; /* 817,540 bytes */
  for (i = 0; i < all; i++)
    post_body[i] = (char)('a' + (i * 11) % 26);
  for (round = 0; round < 2; round++) { /* chunked, then Content-Length */
    memset(lent_released, 0, sizeof lent_released);
    stream_request(&q, "POST", "/h", round == 0 ? -1 : (int64_t)all);
    cap_init(&C[0], fx, M_NONE);
    assert_int_equal(om_upstream_send(fx->pool, &t, &q, &CB, &C[0], &C[0].req),
                     0);
    /* past the length: refused, and the bytes stay the caller's */
    if (round == 1)
      assert_int_equal(om_upstream_body_write_ref(C[0].req, post_body, all + 1,
                                                  on_lent_done,
                                                  &lent_released[0]),
                       OM_EINVAL);
    total = 0;
    h = 14695981039346656037ull;
    for (i = 1; i <= PIECES; i++) {
      size_t n = i * 997;
      h = fnv_u(h, post_body + total, n);
      if (i % 3 == 0) /* every third copied */
        assert_int_equal(om_upstream_body_write(C[0].req, post_body + total, n),
                         0);
      else
        assert_int_equal(om_upstream_body_write_ref(C[0].req, post_body + total,
                                                    n, on_lent_done,
                                                    &lent_released[i]),
                         0);
      total += n;
      if (i % 4 == 0)
        spin(fx, 1);
    }
    if (round == 0) {
      assert_int_equal(om_upstream_body_end(C[0].req), 0);
    } else {
      /* every byte a Content-Length promised may have gone out and been
       * answered already: the end then comes too late, and says so */
      int rc = om_upstream_body_end(C[0].req);
      if (rc != 0)
        assert_int_equal(rc, OM_ESTATE);
    }
    snprintf(want, sizeof want, "%zu %016llx", total, (unsigned long long)h);
    RUN_UNTIL(fx, C[0].done, 5000);
    expect_ok(&C[0], 200, want);
    OM_ASSERT_CMP(lent_released[0], ==, 0);
    for (i = 1; i <= PIECES; i++)
      if (lent_released[i] != (i % 3 != 0))
        fail_msg("piece %zu: given back %d times, want %d", i, lent_released[i],
                 i % 3 != 0);
  }
  /* cancelled before the connection took them: given back at the cancel */
  memset(lent_released, 0, sizeof lent_released);
  stream_request(&q, "POST", "/h", -1);
  cap_init(&C[1], fx, M_NONE);
  assert_int_equal(om_upstream_send(fx->pool, &t, &q, &CB, &C[1], &C[1].req),
                   0);
  for (i = 1; i <= 5; i++)
    assert_int_equal(om_upstream_body_write_ref(C[1].req, post_body, 100,
                                                on_lent_done,
                                                &lent_released[i]),
                     0);
  assert_int_equal(om_upstream_cancel(C[1].req), 0);
  spin(fx, 50);
  for (i = 1; i <= 5; i++)
    OM_ASSERT_CMP(lent_released[i], ==, 1);
  assert_int_equal(om_http_server_close(hs, on_hsrv_closed), 0);
  RUN_UNTIL(fx, hsrv_closed, 3000);
  fx_free(fx);
}

/* What is queued is what the caller lets pile up: pending and on_drain
 * let it write only when the connection took the rest. */
static void streamed_body_backpressure(void **state) {
  fx_t *fx = fx_new(NULL);
  om_upstream_request_t q;
  const size_t total = 8u << 20, piece = 64u << 10, high = 1u << 20;
  size_t off = 0, max_pending = 0;
  uint64_t sum = 0;
  char want[64];
  size_t i;
  (void)state;
  for (i = 0; i < total; i++) {
    post_body[i] = (char)('A' + (i * 13) % 26);
    sum = sum * 31 + (unsigned char)post_body[i];
  }
  snprintf(want, sizeof want, "%zu %llu", total, (unsigned long long)sum);
  stream_request(&q, "POST", "/sum", (int64_t)total);
  cap_init(&C[0], fx, M_NONE);
  drains = 0;
  assert_int_equal(
      om_upstream_send(fx->pool, &fx->tgt, &q, &CB, &C[0], &C[0].req), 0);
  while (off < total && !C[0].done) {
    size_t p;
    while (off < total && om_upstream_body_pending(C[0].req) < high) {
      assert_int_equal(om_upstream_body_write(C[0].req, post_body + off, piece),
                       0);
      off += piece;
    }
    p = om_upstream_body_pending(C[0].req);
    if (p > max_pending)
      max_pending = p;
    if (off < total &&
        om_upstream_body_on_drain(C[0].req, high / 4, cb_drain) == 0) {
      int d = drains;
      RUN_UNTIL(fx, drains > d || C[0].done, 5000);
      OM_ASSERT_CMP(om_upstream_body_pending(C[0].req), <=, high / 4);
    }
  }
  assert_int_equal(om_upstream_body_end(C[0].req), 0);
  RUN_UNTIL(fx, C[0].done, 10000);
  expect_ok(&C[0], 200, want);
  OM_ASSERT_CMP(max_pending, <, high + piece);
  OM_ASSERT_CMP(drains, >, 0);
  fx_free(fx);
}

/* A stale pooled connection: re-sent transparently while the client holds
 * every body byte; reported (sent, reused) once one left. An early answer
 * ends the request while its body is still coming. */
static void streamed_body_stale_keep_alive_and_early_answer(void **state) {
  fx_t *fx = fx_new(NULL);
  om_upstream_request_t q;
  (void)state;
  cap_init(&C[0], fx, M_NONE);
  roundtrip(&C[0], "GET", "/ok");
  srv_drop_all(&fx->srv);
  /* the body is written with the head: gone when the connection fails */
  stream_request(&q, "PUT", "/echo", 4);
  cap_init(&C[1], fx, M_NONE);
  assert_int_equal(send_full(&C[1], &q), 0);
  assert_int_equal(om_upstream_body_write(C[1].req, "once", 4), 0);
  assert_int_equal(om_upstream_body_end(C[1].req), 0);
  RUN_UNTIL(fx, C[1].done, 3000);
  expect_fail(&C[1], OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, OM_EIO);
  assert_int_equal(C[1].res.attempts, 1);
  assert_int_equal(C[1].res.sent, 1);
  assert_int_equal(C[1].res.reused, 1);
  /* the body comes after the failure: nothing was lost, re-sent (the
   * caller says a PUT may go twice) */
  q.retry_stale = 1;
  cap_init(&C[2], fx, M_NONE);
  roundtrip(&C[2], "GET", "/ok");
  srv_drop_all(&fx->srv);
  cap_init(&C[3], fx, M_NONE);
  assert_int_equal(send_full(&C[3], &q), 0);
  RUN_UNTIL(fx, peer_st(fx).retries == 1, 3000);
  assert_int_equal(peer_st(fx).retries, 1);
  assert_int_equal(om_upstream_body_write(C[3].req, "twic", 4), 0);
  assert_int_equal(om_upstream_body_end(C[3].req), 0);
  RUN_UNTIL(fx, C[3].done, 3000);
  expect_ok(&C[3], 200, "twic");
  assert_int_equal(C[3].res.attempts, 2);
  /* an answer before the body: the request ends, the rest is refused
   * and the connection is not pooled */
  stream_request(&q, "POST", "/early", 1000);
  cap_init(&C[4], fx, M_NONE);
  assert_int_equal(send_full(&C[4], &q), 0);
  assert_int_equal(om_upstream_body_write(C[4].req, "abc", 3), 0);
  RUN_UNTIL(fx, C[4].done, 3000);
  expect_ok(&C[4], 413, "big");
  spin(fx, 5);
  assert_int_equal(peer_st(fx).idle, 0);
  fx_free(fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(parse_url_accepts_the_url_rule),
      cmocka_unit_test(parse_url_refuses_with_reasons),
      cmocka_unit_test(fail_names_are_stable),
      cmocka_unit_test(pool_new_validates_and_survives_no_memory),
      cmocka_unit_test(get_and_post_round_trips),
      cmocka_unit_test(ipv6_round_trip),
      cmocka_unit_test(chunked_response_and_split_bytes),
      cmocka_unit_test(close_delimited_response_is_not_reused),
      cmocka_unit_test(keep_alive_reuses_one_connection),
      cmocka_unit_test(warm_requests_do_not_allocate),
      cmocka_unit_test(large_bodies_and_early_responses),
      cmocka_unit_test(forgotten_peers_within_max_peers),
      cmocka_unit_test(idle_limit_per_peer),
      cmocka_unit_test(idle_timeout_closes_pooled_connections),
      cmocka_unit_test(server_closing_idle_connection_removes_it),
      cmocka_unit_test(connect_refused),
      cmocka_unit_test(connect_timeout),
      cmocka_unit_test(first_byte_and_total_timeouts),
      cmocka_unit_test(stale_keep_alive_retried_for_get_reported_for_post),
      cmocka_unit_test(stale_keep_alive_retry_is_the_callers_call),
      cmocka_unit_test(reset_before_response_on_a_fresh_connection),
      cmocka_unit_test(reset_mid_body),
      cmocka_unit_test(malformed_responses_are_refused),
      cmocka_unit_test(valid_edge_cases_are_accepted),
      cmocka_unit_test(hop_by_hop_fields_are_stripped),
      cmocka_unit_test(bad_requests_are_refused_synchronously),
      cmocka_unit_test(bodiless_responses),
      cmocka_unit_test(streaming_with_pause_and_resume),
      cmocka_unit_test(response_lend_hands_over_the_rest_of_the_body),
      cmocka_unit_test(cancel_at_every_phase),
      cmocka_unit_test(abort_from_on_headers),
      cmocka_unit_test(upgrade_101_hands_over_a_tunnel),
      cmocka_unit_test(upgrade_not_taken_or_not_granted),
      cmocka_unit_test(pool_close_with_requests_in_flight),
      cmocka_unit_test(allocation_failures_end_cleanly),
      cmocka_unit_test(head_timeout_bounds_the_head_never_the_body),
      cmocka_unit_test(streamed_body_with_content_length),
      cmocka_unit_test(body_lend_hands_over_the_rest_of_the_body),
      cmocka_unit_test(streamed_body_chunked),
      cmocka_unit_test(streamed_body_lent_pieces),
      cmocka_unit_test(streamed_body_backpressure),
      cmocka_unit_test(streamed_body_stale_keep_alive_and_early_answer),
  };
  signal(SIGPIPE, SIG_IGN); /* libuv writes with writev */
  return cmocka_run_group_tests(tests, NULL, NULL);
}
