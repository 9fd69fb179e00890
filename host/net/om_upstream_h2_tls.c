/*
 * om_upstream_h2_tls.c: the HTTP/2 client's TLS connections (https://
 * peers, om_upstream.h "HTTP/2"): a handshake that offers only h2 by
 * ALPN before anything of a request is written (the connect timeout
 * covers it), then frames gathered as plaintext and encrypted per write,
 * and ciphertext read, decrypted and handed to nghttp2.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_upstream_h2_internal.h"

/* TLS: encrypt the frames gathered and write the ciphertext waiting
 * (the handshake's too) when no write is in flight. 0 or a libuv error. */
int om__h2c_tls_push(h2c_t *h) {
  size_t n;
  uv_buf_t b;
  if (h->writing)
    return 0;
  if (h->qlen > 0 && h->connected) {
    if (om_tls_write(h->tls, h->qbuf, h->qlen) != 0)
      return UV_EIO;
    h->qlen = 0;
  }
  n = om_tls_out_pending(h->tls);
  if (n == 0)
    return 0;
  if (n > h->wcap) {
    char *nb = realloc(h->wbuf, n);
    if (nb == NULL)
      return UV_ENOMEM;
    h->wbuf = nb;
    h->wcap = n;
  }
  h->wlen = om_tls_out_take(h->tls, h->wbuf, n);
  b = uv_buf_init(h->wbuf, (unsigned)h->wlen);
  h->wreq.data = h;
  if (uv_write(&h->wreq, (uv_stream_t *)&h->tcp, &b, 1, om__h2c_on_write) != 0)
    return UV_EIO;
  h->writing = 1;
  return 0;
}

/* The handshake of h ended (rc 0) or failed: the streams learn how. */
static void tls_handshake_done(h2c_t *h, int rc) {
  char alpn[16];
  int tls_fail = rc != 0 ? (int)om_tls_fail(h->tls) : 0;
  int resumed = rc == 0 && om_tls_session_reused(h->tls);
  OM_LIST_FOREACH(it, &h->streams) {
    req_t *r = OM_LIST_ENTRY(it, req_t, h2link);
    r->res.tls_fail = tls_fail;
    r->res.tls_handshake = rc == 0 ? (resumed ? 2 : 1) : 0;
  }
  if (rc != 0) {
    h->peer->st.tls_failures++;
    h->pool->st.tls_failures++;
    om__h2c_connect_failed(h, OM_UPSTREAM_FAIL_CONNECT, 0,
                           om_tls_reason(h->tls));
    return;
  }
  h->peer->st.tls_handshakes++;
  h->pool->st.tls_handshakes++;
  if (resumed) {
    h->peer->st.tls_resumed++;
    h->pool->st.tls_resumed++;
  }
  if (om_tls_alpn(h->tls, alpn, sizeof alpn) != 2 || memcmp(alpn, "h2", 2)) {
    om__h2c_connect_failed(h, OM_UPSTREAM_FAIL_CONNECT, 0,
                           "the server did not select h2 by ALPN");
    return;
  }
  h->connected = 1;
  om__h2c_flush(h);
  om__h2c_rearm(h);
}

/* TLS: nread bytes of ciphertext in rbuf: the handshake, then the
 * plaintext to nghttp2. */
void om__h2c_tls_read(h2c_t *h, size_t nread) {
  om_upstream_pool_t *p = h->pool;
  int rc;
  if (om_tls_feed(h->tls, h->rbuf, nread) != 0) {
    om__h2c_fail(h, OM_UPSTREAM_FAIL_INTERNAL, OM_ENOMEM,
                 "out of memory for TLS input");
    return;
  }
  if (!h->connected) {
    rc = om_tls_handshake(h->tls);
    if (rc == OM_TLS_WANT_READ) {
      om__h2c_flush(h);
      return;
    }
    tls_handshake_done(h, rc);
    if (h->closing || !h->connected)
      return;
  }
  p->api++;
  for (;;) {
    size_t n = 0;
    ssize_t used;
    rc = om_tls_read(h->tls, h->pbuf, H2_READ, &n);
    if (rc == OM_TLS_WANT_READ)
      break;
    if (rc != 0) {
      om__h2c_close(h, OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, 0,
                    rc == OM_TLS_CLOSED ? "the server closed the TLS session"
                                        : om_tls_reason(h->tls));
      break;
    }
    h->in_ng = 1;
    used = nghttp2_session_mem_recv(h->ss, (const uint8_t *)h->pbuf, n);
    h->in_ng = 0;
    if (used < 0) {
      om__h2c_close(h, OM_UPSTREAM_FAIL_MALFORMED, OM_EPARSE,
                    nghttp2_strerror((int)used));
      break;
    }
    if (h->closing)
      break;
  }
  if (!h->closing)
    om__h2c_flush(h);
  p->api--;
  om__up_pool_maybe_finish(p);
}

/* The TLS engine of h, its ClientHello queued. 0, or h failed. */
int om__h2c_tls_start(h2c_t *h) {
  peer_t *e = h->peer;
  char ip[64], key[64 + 16 + sizeof e->target.host];
  unsigned port;
  const char *name = e->server_name[0] ? e->server_name : e->target.host;
  om_tls_conn_opts_t o = {.host = name, .session_key = key, .alpn = "h2"};
  int rc;
  /* the session cache key: this address, the name it must prove, h2 */
  if (e->target.addr.sa.sa_family == AF_INET6) {
    uv_ip6_name(&e->target.addr.in6, ip, sizeof ip);
    port = ntohs(e->target.addr.in6.sin6_port);
  } else {
    uv_ip4_name(&e->target.addr.in4, ip, sizeof ip);
    port = ntohs(e->target.addr.in4.sin_port);
  }
  snprintf(key, sizeof key, "%s:%u|%s|h2", ip, port, name);
  h->pbuf = malloc(H2_READ);
  rc = h->pbuf == NULL ? OM_ENOMEM
                       : om_tls_new(e->tls_ctx, &o, &h->tls, NULL, 0);
  if (rc == 0) {
    rc = om_tls_handshake(h->tls);
    rc = rc == OM_TLS_WANT_READ ? 0 : rc;
  }
  if (rc != 0) {
    om__h2c_connect_failed(
        h,
        rc == OM_ENOMEM ? OM_UPSTREAM_FAIL_INTERNAL : OM_UPSTREAM_FAIL_CONNECT,
        0,
        rc == OM_ENOMEM ? "out of memory for TLS"
                        : "the TLS handshake could not start");
    return -1;
  }
  return 0;
}
