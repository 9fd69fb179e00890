/*
 * om_http_server_tunnel.c: connections that left HTTP after a 101
 * (om_tunnel_t), and the server's side of the hand-over
 * (om_http_response_upgrade).
 *
 * A tunnel reads and writes the owner's TCP handle (a server connection
 * or an upstream connection: libuv handles cannot move out of the struct
 * they live in) and hands it back through the owner's release function
 * when it is done. Its own timer handle carries everything that must not
 * run inside an API call: the bytes read past the HTTP head, failures
 * noticed while writing, the owner's shutdown. The tunnel is freed once
 * that timer is closed and every write and shutdown request it issued has
 * called back (libuv calls them, cancelled, when the handle closes).
 */
#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_http_chars.h"
#include "om_http_server_internal.h"
#include "om_tls.h"
#include "om_tunnel_internal.h"

#define TUN_READ_BYTES (16u * 1024u)

/* A tunnel's lifecycle, in order; a phase is never re-entered. */
enum tphase {
  TP_OPEN,     /* the holder's: reading, writing */
  TP_FAILING,  /* a failure noticed inside an API call: ends from the kick */
  TP_RELEASED, /* the handle is the owner's again; no callback runs */
};

struct om_tunnel_s {
  uv_tcp_t *tcp;
  uv_timer_t kick;
  uv_shutdown_t shut;
  om__tunnel_release_fn release;
  void *owner;
  om_tunnel_callbacks_t cb;
  void *ud;
  enum tphase phase;
  int fail_err;    /* what on_close reports from the kick */
  char *pre;       /* bytes read past the head, not yet delivered */
  size_t pre_len;  /* 0 once delivered */
  char *rbuf;      /* the read buffer */
  size_t pending;  /* bytes in uv_write requests */
  size_t low;      /* on_drain threshold, while want_drain */
  unsigned writes; /* uv_write requests not yet called back */
  /* a TLS connection's engine (the owner's): reads are decrypted, writes
   * encrypted; tls_in: plaintext may wait inside it (read on the kick) */
  om_tls_t *tls;
  unsigned tls_in : 1;
  unsigned paused : 1, reading : 1, eof_in : 1, shut_asked : 1, shut_busy : 1,
      shut_done : 1, want_drain : 1, kick_closed : 1, owner_gone : 1;
};

typedef struct {
  uv_write_t req;
  om_tunnel_t *t;
  size_t len;
  char data[];
} twreq_t;

static void tun_update(om_tunnel_t *t);
static void on_kick(uv_timer_t *h);
static void tls_drain(om_tunnel_t *t);

static void maybe_free(om_tunnel_t *t) {
  if (t->phase != TP_RELEASED || !t->kick_closed || t->writes > 0 ||
      t->shut_busy)
    return;
  free(t->pre);
  free(t->rbuf);
  free(t);
}

static void on_kick_closed(uv_handle_t *h) {
  om_tunnel_t *t = h->data;
  t->kick_closed = 1;
  maybe_free(t);
}

/* Give the handle back (reset: RST) and stop for good. */
static void release(om_tunnel_t *t, int reset) {
  if (t->phase == TP_RELEASED)
    return;
  t->phase = TP_RELEASED;
  /* after om__tunnel_owner_gone the handle (and the owner) may already
   * be freed: never touch it again */
  if (!t->owner_gone) {
    if (t->reading) {
      uv_read_stop((uv_stream_t *)t->tcp);
      t->reading = 0;
    }
    t->tcp->data = t->owner;
    t->release(t->owner, reset);
  }
  uv_close((uv_handle_t *)&t->kick, on_kick_closed);
}

/* End from a loop callback: the handle goes back, then the holder hears. */
static void finish(om_tunnel_t *t, int err, int reset) {
  om_tunnel_callbacks_t cb = t->cb;
  void *ud = t->ud;
  if (t->phase == TP_RELEASED)
    return;
  release(t, reset);
  cb.on_close(ud, err);
}

/* A failure inside an API call: reported from the kick. */
static void fail_later(om_tunnel_t *t, int err) {
  if (t->phase != TP_OPEN)
    return;
  t->phase = TP_FAILING;
  t->fail_err = err;
  if (t->reading) {
    uv_read_stop((uv_stream_t *)t->tcp);
    t->reading = 0;
  }
  uv_timer_start(&t->kick, on_kick, 0, 0);
}

static void deliver(om_tunnel_t *t, const char *data, size_t len) {
  t->cb.on_data(t->ud, data, len);
}

/* Both directions are closed: a clean end. */
static int both_closed(const om_tunnel_t *t) {
  return t->eof_in && t->shut_done;
}

static void on_kick(uv_timer_t *h) {
  om_tunnel_t *t = h->data;
  if (t->phase == TP_FAILING) {
    finish(t, t->fail_err, 1);
    return;
  }
  if (t->phase != TP_OPEN)
    return;
  if (t->pre_len > 0 && !t->paused) {
    size_t n = t->pre_len;
    t->pre_len = 0;
    deliver(t, t->pre, n);
    if (t->phase != TP_OPEN)
      return;
  }
  if (t->tls_in && !t->paused) {
    tls_drain(t);
    if (t->phase != TP_OPEN)
      return;
  }
  tun_update(t);
}

static void kick_soon(om_tunnel_t *t) {
  if (t->phase == TP_OPEN)
    uv_timer_start(&t->kick, on_kick, 0, 0);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  om_tunnel_t *t = h->data;
  (void)suggested;
  *buf = uv_buf_init(t->rbuf, TUN_READ_BYTES);
}

/* The peer's end of the stream (FIN, or a TLS close_notify). */
static void got_eof(om_tunnel_t *t) {
  t->eof_in = 1;
  tun_update(t);
  if (t->cb.on_eof != NULL)
    t->cb.on_eof(t->ud);
  if (t->phase == TP_OPEN && both_closed(t))
    finish(t, 0, 0);
}

static int raw_write(om_tunnel_t *t, const char *data, size_t len);

/* Send the engine's pending ciphertext. */
static int tls_flush(om_tunnel_t *t) {
  char buf[TUN_READ_BYTES];
  size_t n;
  while ((n = om_tls_out_take(t->tls, buf, sizeof buf)) > 0) {
    int rc = raw_write(t, buf, n);
    if (rc != 0)
      return rc;
  }
  return 0;
}

/* Deliver the plaintext inside the engine while the holder wants it. */
static void tls_drain(om_tunnel_t *t) {
  t->tls_in = 0;
  while (t->phase == TP_OPEN && !t->paused && !t->eof_in) {
    size_t n = 0;
    int rc = om_tls_read(t->tls, t->rbuf, TUN_READ_BYTES, &n);
    if (rc < 0 || tls_flush(t) != 0) {
      finish(t, OM_EIO, 1);
      return;
    }
    if (rc == OM_TLS_WANT_READ)
      return;
    if (rc == OM_TLS_CLOSED) {
      got_eof(t);
      return;
    }
    deliver(t, t->rbuf, n);
  }
  if (t->phase == TP_OPEN && t->paused)
    t->tls_in = 1;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  om_tunnel_t *t = st->data;
  (void)buf;
  if (t->phase != TP_OPEN || nread == 0)
    return;
  if (nread > 0 && t->tls != NULL) {
    if (om_tls_feed(t->tls, t->rbuf, (size_t)nread) != 0) {
      finish(t, OM_ENOMEM, 1);
      return;
    }
    tls_drain(t);
    return;
  }
  if (nread > 0) {
    deliver(t, t->rbuf, (size_t)nread);
    return;
  }
  if (nread != UV_EOF) {
    finish(t, OM_EIO, 1);
    return;
  }
  got_eof(t);
}

/* Read when the holder wants bytes, the pre-read ones are out and no EOF
 * came. */
static void tun_update(om_tunnel_t *t) {
  int want = t->phase == TP_OPEN && !t->paused && !t->eof_in && t->pre_len == 0;
  if (want && !t->reading) {
    if (uv_read_start((uv_stream_t *)t->tcp, on_alloc, on_read) == 0)
      t->reading = 1;
    else
      fail_later(t, OM_EIO);
  } else if (!want && t->reading) {
    uv_read_stop((uv_stream_t *)t->tcp);
    t->reading = 0;
  }
}

static void check_drain(om_tunnel_t *t) {
  if (t->phase != TP_OPEN || !t->want_drain || t->pending > t->low ||
      t->cb.on_drain == NULL)
    return;
  t->want_drain = 0;
  t->cb.on_drain(t->ud);
}

static void on_write(uv_write_t *wr, int status) {
  twreq_t *w = (twreq_t *)wr;
  om_tunnel_t *t = w->t;
  t->pending -= w->len;
  t->writes--;
  free(w);
  if (t->phase == TP_RELEASED) {
    maybe_free(t);
    return;
  }
  if (t->phase != TP_OPEN)
    return;
  if (status < 0) {
    finish(t, OM_EIO, 1);
    return;
  }
  check_drain(t);
}

static void on_shut(uv_shutdown_t *sr, int status) {
  om_tunnel_t *t = sr->data;
  t->shut_busy = 0;
  if (t->phase == TP_RELEASED) {
    maybe_free(t);
    return;
  }
  if (t->phase != TP_OPEN)
    return;
  if (status < 0) {
    finish(t, OM_EIO, 1);
    return;
  }
  t->shut_done = 1;
  if (both_closed(t))
    finish(t, 0, 0);
}

/* ------------------------------------------------------------------ */
/* the owner's side */

int om__tunnel_new(uv_tcp_t *tcp, const char *pre, size_t pre_len,
                   om__tunnel_release_fn release_fn, void *owner,
                   const om_tunnel_callbacks_t *cb, void *ud,
                   om_tunnel_t **out) {
  om_tunnel_t *t = calloc(1, sizeof *t);
  if (t == NULL)
    return OM_ENOMEM;
  t->rbuf = malloc(TUN_READ_BYTES);
  if (t->rbuf == NULL || (pre_len > 0 && (t->pre = malloc(pre_len)) == NULL)) {
    free(t->rbuf);
    free(t);
    return OM_ENOMEM;
  }
  if (pre_len > 0)
    memcpy(t->pre, pre, pre_len);
  t->pre_len = pre_len;
  t->tcp = tcp;
  t->release = release_fn;
  t->owner = owner;
  t->cb = *cb;
  t->ud = ud;
  uv_timer_init(tcp->loop, &t->kick);
  t->kick.data = t;
  t->shut.data = t;
  tcp->data = t;
  /* reading starts from the kick, after the pre-read bytes */
  kick_soon(t);
  *out = t;
  return 0;
}

void om__tunnel_use_tls(om_tunnel_t *t, struct om_tls *tls, int pending) {
  t->tls = tls;
  t->tls_in = pending ? 1 : 0;
}

void om__tunnel_owner_gone(om_tunnel_t *t) {
  if (t == NULL || t->phase == TP_RELEASED)
    return;
  t->owner_gone = 1;
  if (t->reading) {
    uv_read_stop((uv_stream_t *)t->tcp);
    t->reading = 0;
  }
  t->tcp->data = t->owner;
  if (t->phase == TP_OPEN) {
    t->phase = TP_FAILING;
    t->fail_err = OM_ESTATE;
  }
  uv_timer_start(&t->kick, on_kick, 0, 0);
}

/* ------------------------------------------------------------------ */
/* the holder's side */

int om_tunnel_write(om_tunnel_t *t, const char *data, size_t len) {
  if (t == NULL || (data == NULL && len > 0))
    return OM_EINVAL;
  if (t->phase != TP_OPEN || t->shut_asked)
    return OM_ESTATE;
  if (len == 0)
    return 0;
  if (t->tls == NULL)
    return raw_write(t, data, len);
  if (om_tls_write(t->tls, data, len) != 0) {
    fail_later(t, OM_EIO);
    return OM_ESTATE;
  }
  return tls_flush(t);
}

/* Write bytes as they go on the wire, after everything written before. */
static int raw_write(om_tunnel_t *t, const char *data, size_t len) {
  uv_stream_t *st = (uv_stream_t *)t->tcp;
  uv_buf_t b;
  size_t done = 0;
  twreq_t *w;
  if (t->writes == 0) {
    int n;
    b = uv_buf_init((char *)data, (unsigned)len);
    n = uv_try_write(st, &b, 1);
    if (n >= 0)
      done = (size_t)n;
    else if (n != UV_EAGAIN && n != UV_ENOSYS) {
      fail_later(t, OM_EIO);
      return OM_ESTATE;
    }
    if (done == len)
      return 0;
  }
  w = malloc(sizeof *w + (len - done));
  if (w == NULL)
    return OM_ENOMEM;
  w->t = t;
  w->len = len - done;
  memcpy(w->data, data + done, w->len);
  b = uv_buf_init(w->data, (unsigned)w->len);
  if (uv_write(&w->req, st, &b, 1, on_write) != 0) {
    free(w);
    fail_later(t, OM_EIO);
    return OM_ESTATE;
  }
  t->writes++;
  t->pending += w->len;
  return 0;
}

int om_tunnel_shutdown(om_tunnel_t *t) {
  if (t == NULL)
    return OM_EINVAL;
  if (t->phase != TP_OPEN)
    return OM_ESTATE;
  if (t->shut_asked)
    return 0;
  t->shut_asked = 1;
  if (t->tls != NULL &&
      (om_tls_shutdown(t->tls) != 0 || tls_flush(t) != 0)) { /* close_notify */
    fail_later(t, OM_EIO);
    return OM_ESTATE;
  }
  if (uv_shutdown(&t->shut, (uv_stream_t *)t->tcp, on_shut) != 0) {
    fail_later(t, OM_EIO);
    return OM_ESTATE;
  }
  t->shut_busy = 1;
  return 0;
}

int om_tunnel_pause(om_tunnel_t *t) {
  if (t == NULL)
    return OM_EINVAL;
  t->paused = 1;
  tun_update(t);
  return 0;
}

int om_tunnel_resume(om_tunnel_t *t) {
  if (t == NULL)
    return OM_EINVAL;
  if (!t->paused)
    return 0;
  t->paused = 0;
  if (t->pre_len > 0 || t->tls_in)
    kick_soon(t); /* delivered from the loop, never from here */
  else
    tun_update(t);
  return 0;
}

size_t om_tunnel_pending(const om_tunnel_t *t) {
  return t != NULL ? t->pending : 0;
}

int om_tunnel_on_drain(om_tunnel_t *t, size_t low_water) {
  if (t == NULL)
    return OM_EINVAL;
  if (t->pending <= low_water) {
    t->want_drain = 0;
    return 1;
  }
  t->low = low_water;
  t->want_drain = 1;
  return 0;
}

void om_tunnel_close(om_tunnel_t *t, int reset) {
  if (t == NULL || t->phase == TP_RELEASED)
    return;
  uv_timer_stop(&t->kick);
  release(t, reset);
}

/* ------------------------------------------------------------------ */
/* the server's hand-over */

int om_http_request_is_upgrade(const om_http_request_t *req) {
  const req_t *r = (const req_t *)req;
  if (OM__HTTP_IS_H2(req))
    return 0; /* RFC 9113 8.6: no Upgrade in HTTP/2 */
  return r != NULL && r->upgrade;
}

/* The tunnel is done with a server connection. */
static void server_release(void *owner, int reset) {
  conn_t *c = owner;
  c->tunnel = NULL;
  om__http_conn_close(c, reset);
}

int om_http_response_upgrade(om_http_request_t *req,
                             const om_http_header_t *headers, size_t n,
                             const om_tunnel_callbacks_t *cb, void *ud,
                             om_tunnel_t **out) {
  req_t *r = (req_t *)req;
  char stackbuf[1024], *head;
  conn_t *c;
  rh_t rh;
  size_t len;
  uv_buf_t b;
  om_tunnel_t *t;
  int rc;
  if (OM__HTTP_IS_H2(req))
    return OM_EINVAL;
  if (r == NULL || cb == NULL || cb->on_data == NULL || cb->on_close == NULL ||
      out == NULL || !r->upgrade || r->in_close_cb)
    return r != NULL && r->in_close_cb ? OM_ESTATE : OM_EINVAL;
  c = r->conn;
  if (c == NULL || r->rstate != RS_NONE || c->phase >= PH_SHUTTING)
    return OM_ESTATE;
  if (om__http_check_resp_headers(headers, n, 0, 0, &rh) != 0 || rh.close)
    return OM_EINVAL;
  head = om__http_build_head(c->srv, stackbuf, sizeof stackbuf, 101, headers, n,
                             &rh, 0, 0, 0, CH_UPGRADE, &len);
  if (head == NULL)
    return OM_ENOMEM;
  rc = om__tunnel_new(&c->tcp, c->in + c->in_off, c->in_len - c->in_off,
                      server_release, c, cb, ud, &t);
  if (rc != 0) {
    if (head != stackbuf)
      free(head);
    return rc;
  }
  c->in_off = c->in_len = 0;
  if (c->tls != NULL)
    om__http_tls_tunnel(c, t);
  if (c->reading) {
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = 0;
  }
  uv_timer_stop(&c->timer);
  c->phase = PH_TUNNEL;
  c->tunnel = t;
  c->held = 0;
  c->active = NULL;
  c->srv->m.upgrades++;
  /* the head goes out now, before any byte the holder writes */
  b = uv_buf_init(head, (unsigned)len);
  (void)om__http_conn_write(c, &b, 1); /* a failure ends the tunnel */
  om__http_conn_flush(c);
  if (head != stackbuf)
    free(head);
  om__http_req_free(r);
  *out = t;
  return 0;
}
