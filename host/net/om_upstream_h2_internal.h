/*
 * om_upstream_h2_internal.h: what the files of the HTTP/2 client share:
 * its connection struct and the functions om_upstream_h2.c (streams,
 * nghttp2, the connection) and om_upstream_h2_tls.c (h2 over TLS by
 * ALPN) call in each other. Not a public header.
 */
#ifndef OM_UPSTREAM_H2_INTERNAL_H
#define OM_UPSTREAM_H2_INTERNAL_H

#include <nghttp2/nghttp2.h>

#include "om_upstream_internal.h"

#define H2_MAX_STREAMS 100u
#define H2_STREAM_WINDOW (256u * 1024u)
#define H2_CONN_WINDOW (4u << 20)
#define H2_OUT_HIGH (64u * 1024u)
#define H2_READ (64u * 1024u)

typedef struct om__up_h2f_s {
  size_t no, nl, vo, vl; /* offsets and lengths in the request's harena */
} h2f_t;

typedef struct om__up_h2c_s {
  uv_tcp_t tcp;
  uv_timer_t timer;
  uv_connect_t creq;
  uv_write_t wreq;
  om_upstream_pool_t *pool;
  peer_t *peer;
  om_list_t link;    /* the pool's h2conns */
  om_list_t plink;   /* the peer's h2 */
  om_list_t streams; /* req_t by h2link */
  size_t nstreams;
  nghttp2_session *ss;
  int handles;
  unsigned connected : 1, closing : 1, goaway : 1, writing : 1, in_ng : 1,
      flush_due : 1, counted_idle : 1;
  uint64_t connect_due, idle_since, idle_ms;
  uint64_t timer_due; /* loop ms the timer fires at; 0: stopped */
  char *rbuf;
  /* TLS (an https:// peer): the engine, and the plaintext it decrypts
   * into; the connection is "connected" once the handshake selected h2 */
  om_tls_t *tls;
  char *pbuf;
  char *wbuf, *qbuf; /* in flight, and gathered meanwhile */
  size_t wlen, wcap, qlen, qcap;
} h2c_t;

/* om_upstream_h2.c */

/* Produce frames while little waits, and write what was produced. */
void om__h2c_flush(h2c_t *h);
/* Set the timer to the earliest due time of h and its streams. */
void om__h2c_rearm(h2c_t *h);
/* Close h, every stream on it ending with fail (on_done from the kick). */
void om__h2c_fail(h2c_t *h, om_upstream_fail_t fail, int err,
                  const char *detail);
/* om__h2c_fail without deferring on_done (the caller holds the api). */
void om__h2c_close(h2c_t *h, om_upstream_fail_t fail, int err,
                   const char *detail);
/* Every stream of h failed to get a connection (nothing was sent). */
void om__h2c_connect_failed(h2c_t *h, om_upstream_fail_t fail, int os_err,
                            const char *detail);
/* The write callback of every write on h. */
void om__h2c_on_write(uv_write_t *w, int status);

/* om_upstream_h2_tls.c */

/* Encrypt the frames gathered and write the ciphertext waiting (the
 * handshake's too) when no write is in flight: 0 or a libuv error. */
int om__h2c_tls_push(h2c_t *h);
/* nread bytes of ciphertext in h's read buffer: the handshake, then the
 * plaintext to nghttp2. */
void om__h2c_tls_read(h2c_t *h, size_t nread);
/* The TLS engine of h, its ClientHello queued: 0, or h failed. */
int om__h2c_tls_start(h2c_t *h);

#endif /* OM_UPSTREAM_H2_INTERNAL_H */
