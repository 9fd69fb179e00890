/*
 * om_upstream_tls.c: the upstream client's TLS connections (https://
 * peers) over om_tls.h's memory-BIO engine.
 *
 * A TLS connection stays in PH_CONNECTING through the handshake, so the
 * connect timeout covers TCP and TLS together and nothing of the request
 * is written before the peer proved its name. Reads land in a ciphertext
 * buffer (tin) and are fed to the engine; the response parser pulls
 * plaintext into the connection's ordinary read buffer as it needs it
 * (om__up_tls_pull from om__up_conn_process), so everything downstream
 * of the read buffer is the plaintext path unchanged. Writes are
 * encrypted into the engine, whose output buffer is the write queue:
 * at most one uv_write is in flight (tout), and what was encrypted
 * meanwhile goes out when it completes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_upstream_internal.h"

#define FLUSH_PIECES 16u /* streamed body pieces encrypted per write */

om_tls_ctx_t *om__up_tls_ctx_for(om_upstream_pool_t *p,
                                 const om_upstream_request_t *q) {
  if (q != NULL && q->tls_ctx != NULL)
    return om_tls_ctx_role(q->tls_ctx) == OM_TLS_CLIENT ? q->tls_ctx : NULL;
  if (p->tls_ctx != NULL)
    return p->tls_ctx;
  if (p->tls_default == NULL) {
    om_tls_opts_t o = {.role = OM_TLS_CLIENT};
    if (om_tls_ctx_new(&o, &p->tls_default, NULL, 0) != 0)
      return NULL;
  }
  return p->tls_default;
}

int om__up_tls_flush(conn_t *c) {
  size_t n;
  uv_buf_t b;
  int w, rc;
  if (c->writing || c->closing || c->tls == NULL)
    return 0;
  n = om_tls_out_pending(c->tls);
  if (n == 0)
    return 0;
  if (n > c->tout_cap) {
    char *nb = realloc(c->tout, n);
    if (nb == NULL)
      return UV_ENOMEM;
    c->tout = nb;
    c->tout_cap = n;
  }
  n = om_tls_out_take(c->tls, c->tout, n);
  b = uv_buf_init(c->tout, (unsigned)n);
  w = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
  if (w == UV_EAGAIN || w == UV_ENOSYS)
    w = 0;
  if (w < 0)
    return w;
  if ((size_t)w == n)
    return 0;
  b.base += w;
  b.len -= (unsigned)w;
  c->wreq.data = c;
  rc = uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &b, 1, om__up_on_write);
  if (rc != 0)
    return rc;
  c->writing = 1;
  return 0;
}

/* The handshake failed or could not go on: a connect failure of the peer
 * (nothing of the request was written). */
static void handshake_fail(conn_t *c, const char *detail) {
  om_upstream_pool_t *p = c->pool;
  c->peer->st.tls_failures++;
  p->st.tls_failures++;
  if (c->req != NULL) { /* a peer that hung up mid-handshake: protocol */
    om_tls_fail_t f = c->tls != NULL ? om_tls_fail(c->tls) : OM_TLS_FAIL_NONE;
    c->req->res.tls_fail =
        (int)(f != OM_TLS_FAIL_NONE ? f : OM_TLS_FAIL_PROTOCOL);
  }
  om__up_attempt_fail(c, OM_UPSTREAM_FAIL_CONNECT, 0, detail);
}

/* Drive the handshake with what was fed; start the request when done. */
static void handshake_step(conn_t *c) {
  om_upstream_pool_t *p = c->pool;
  int rc = om_tls_handshake(c->tls);
  int w = om__up_tls_flush(c); /* our flight, or the alert of a failure */
  if (rc == OM_EIO) {
    handshake_fail(c, om_tls_reason(c->tls));
    return;
  }
  if (w != 0) {
    om__up_attempt_fail(c, OM_UPSTREAM_FAIL_CONNECT, 0, uv_strerror(w));
    return;
  }
  if (rc != 0)
    return; /* OM_TLS_WANT_READ: the peer's next flight */
  c->peer->st.tls_handshakes++;
  p->st.tls_handshakes++;
  if (om_tls_session_reused(c->tls)) {
    c->peer->st.tls_resumed++;
    p->st.tls_resumed++;
  }
  c->req->res.tls_handshake = om_tls_session_reused(c->tls) ? 2 : 1;
  om__up_conn_start(c);
}

void om__up_tls_start(conn_t *c) {
  peer_t *e = c->peer;
  req_t *r = c->req;
  char ip[64], key[64 + 8 + sizeof e->target.host];
  unsigned port;
  const char *name = e->server_name[0] ? e->server_name : e->target.host;
  om_tls_conn_opts_t o = {.host = name, .session_key = key};
  int rc;
  r->res.tls_fail = 0;
  r->res.tls_handshake = 0;
  /* the session cache key: this address and the name it must prove */
  if (e->target.addr.sa.sa_family == AF_INET6) {
    uv_ip6_name(&e->target.addr.in6, ip, sizeof ip);
    port = ntohs(e->target.addr.in6.sin6_port);
  } else {
    uv_ip4_name(&e->target.addr.in4, ip, sizeof ip);
    port = ntohs(e->target.addr.in4.sin_port);
  }
  snprintf(key, sizeof key, "%s:%u|%s", ip, port, name);
  c->tin = malloc(OM__UP_TLS_IN);
  if (c->tin == NULL) {
    om__up_attempt_fail(c, OM_UPSTREAM_FAIL_INTERNAL, OM_ENOMEM,
                        "out of memory for a TLS connection");
    return;
  }
  rc = om_tls_new(e->tls_ctx, &o, &c->tls, NULL, 0);
  if (rc == OM_ENOMEM) {
    om__up_attempt_fail(c, OM_UPSTREAM_FAIL_INTERNAL, OM_ENOMEM,
                        "out of memory for a TLS connection");
    return;
  }
  if (rc != 0) {
    c->peer->st.tls_failures++;
    c->pool->st.tls_failures++;
    r->res.tls_fail = OM_TLS_FAIL_ENGINE;
    om__up_attempt_fail(c, OM_UPSTREAM_FAIL_CONNECT, 0,
                        "TLS: no server name to verify");
    return;
  }
  om__up_read_on(c);
  handshake_step(c);
}

/* A TLS failure after the handshake: the connection is unusable. */
static void tls_broke(conn_t *c) {
  const char *detail = om_tls_reason(c->tls);
  if (c->phase == PH_HEAD)
    om__up_attempt_fail(c, OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, 0, detail);
  else
    om__up_attempt_fail(c, OM_UPSTREAM_FAIL_RESET_MID_BODY, 0, detail);
}

int om__up_tls_pull(conn_t *c) {
  size_t room, n = 0;
  int rc, w;
  if (c->closing || c->req == NULL)
    return 0;
  room = om__up_buf_room(c);
  if (room == 0) {
    om__up_attempt_fail(c, OM_UPSTREAM_FAIL_INTERNAL, OM_ENOMEM,
                        "out of memory for the read buffer");
    return -1;
  }
  rc = om_tls_read(c->tls, c->buf + c->len, room, &n);
  /* a post-handshake message may want an answer (a key update) */
  w = om__up_tls_flush(c);
  if (rc == 0) {
    c->len += n;
    c->read_full = n == room;
    c->req->got_bytes = 1;
    return 1;
  }
  if (rc == OM_TLS_CLOSED) { /* close_notify: the peer's clean EOF */
    om__up_conn_eof(c, UV_EOF);
    return -1;
  }
  if (rc != OM_TLS_WANT_READ) {
    tls_broke(c);
    return -1;
  }
  if (w != 0) {
    om__up_conn_eof(c, w);
    return -1;
  }
  return 0;
}

int om__up_tls_stray(conn_t *c) {
  char tmp[256];
  size_t n = 0;
  /* session tickets and other post-handshake messages are taken here;
   * any plaintext, close_notify or error means the connection is done */
  return om_tls_read(c->tls, tmp, sizeof tmp, &n) != OM_TLS_WANT_READ ||
         om__up_tls_flush(c) != 0;
}

int om__up_tls_pending(const conn_t *c) {
  return om_tls_in_pending(c->tls);
}

void om__up_tls_on_read(conn_t *c, ssize_t nread) {
  if (nread < 0) {
    if (c->phase == PH_CONNECTING)
      handshake_fail(c, nread == UV_EOF
                            ? "the connection closed in the TLS handshake"
                            : uv_strerror((int)nread));
    else if (c->req == NULL)
      om__up_conn_close(c);
    else
      om__up_conn_eof(c, nread);
    return;
  }
  if (om_tls_feed(c->tls, c->tin, (size_t)nread) != 0) {
    if (c->req == NULL)
      om__up_conn_close(c);
    else
      om__up_attempt_fail(c, OM_UPSTREAM_FAIL_INTERNAL, OM_ENOMEM,
                          "out of memory for TLS input");
    return;
  }
  if (c->phase == PH_CONNECTING) {
    handshake_step(c);
    return;
  }
  if (c->req == NULL) {
    /* pooled: a ticket is fine, anything else closes it */
    if (om__up_tls_stray(c))
      om__up_conn_close(c);
    return;
  }
  om__up_conn_process(c);
}

void om__up_tls_write_request(conn_t *c) {
  req_t *r = c->req;
  int rc = om_tls_write(c->tls, r->head, r->head_len);
  if (rc == 0 && r->body_len > 0)
    rc = om_tls_write(c->tls, r->body, r->body_len);
  if (rc != 0) {
    om__up_attempt_fail(c, OM_UPSTREAM_FAIL_INTERNAL, OM_ENOMEM,
                        "out of memory encrypting the request");
    return;
  }
  rc = om__up_tls_flush(c);
  if (rc != 0) {
    /* refused at once: nothing of this attempt left */
    om__up_attempt_fail(c, OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, 0,
                        uv_strerror(rc));
    return;
  }
  r->res.sent = 1;
  if (!c->writing)
    om__up_body_flush(c);
}

void om__up_tls_body_flush(conn_t *c) {
  req_t *r = c->req;
  size_t bytes = 0, n;
  unsigned k = 0;
  uv_buf_t b;
  while (r->bq_head != NULL && k < FLUSH_PIECES) {
    bchunk_t *p = r->bq_head;
    uv_buf_t pb[3];
    unsigned i, np = om__up_piece_bufs(p, pb);
    int rc = 0;
    for (i = 0; i < np && rc == 0; i++)
      rc = om_tls_write(c->tls, pb[i].base, pb[i].len);
    if (rc != 0)
      break;
    r->bq_head = p->next;
    bytes += p->len;
    k++;
    om__up_piece_free(p);
  }
  if (r->bq_head == NULL)
    r->bq_tail = NULL;
  r->body_moved = 1;
  n = om_tls_out_pending(c->tls);
  if (k == 0 || n == 0) {
    c->broken = 1; /* the engine refused: the read side ends it */
    return;
  }
  if (n > c->tout_cap) {
    char *nb = realloc(c->tout, n);
    if (nb == NULL) {
      r->body_pending -= bytes;
      c->broken = 1;
      return;
    }
    c->tout = nb;
    c->tout_cap = n;
  }
  n = om_tls_out_take(c->tls, c->tout, n);
  b = uv_buf_init(c->tout, (unsigned)n);
  /* always through uv_write: its callback accounts for the pieces and
   * goes on with the next ones, as on the plaintext path */
  c->inflight_bytes = bytes;
  c->wreq.data = c;
  if (uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &b, 1, om__up_on_write) != 0) {
    r->body_pending -= bytes;
    c->inflight_bytes = 0;
    c->broken = 1;
    return;
  }
  c->writing = 1;
}
