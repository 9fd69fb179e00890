/*
 * om_upstream_internal.h: what the files of the upstream client share:
 * the peer, connection, request and pool structs and the functions one
 * file calls in another. Not a public header: om_upstream.c (URLs,
 * peers, requests, the kick, the pool, sending), om_upstream_conn.c
 * (connections and reading responses) and om_upstream_body.c (streamed
 * request bodies) include it.
 */
#ifndef OM_UPSTREAM_INTERNAL_H
#define OM_UPSTREAM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "om_http1.h"
#include "om_list.h"
#include "om_upstream.h"

#define DEF_MAX_IDLE 32u
/* idle connections one peer key may keep: descriptors, not a policy */
#define MAX_IDLE_PER_PEER 1000000u
#define DEF_IDLE_TIMEOUT_MS 60000u
#define DEF_MAX_HEADER_BYTES (64u * 1024u)
#define MAX_HEADER_BYTES (64u * 1024u)
#define MIN_HEADER_BYTES 256u
#define DEF_MAX_HEADERS 100u
#define MAX_MAX_HEADERS 10000u
#define DEF_READ_BUFFER (16u * 1024u)
#define MIN_READ_BUFFER 1024u
#define DEF_MAX_PEERS 4096u

#define READ_MIN 1024u /* compact or grow below this much room */
/* the read buffer of a connection whose body fills every read */
#define BODY_READ (64u * 1024u)
#define FREE_REQS_MAX 256u  /* request objects kept for reuse */
#define REQ_HEAD_KEEP 8192u /* a recycled request keeps this much head */
#define HDRS_INITIAL 16u
/* a TLS connection's ciphertext reads: one whole record (16 KiB of
 * plaintext and its overhead, RFC 8446 5.2) */
#define OM__UP_TLS_IN (16u * 1024u + 512u)

/* ------------------------------------------------------------------ */
/* types */

typedef struct peer_s peer_t;

/* A piece of a streamed request body, framed (a chunk of a chunked body
 * carries its size line and CRLF): queued on the request, then owned by
 * the connection while its write is in flight. A copied piece has every
 * byte in data; a lent one (om_upstream_body_write_ref) has its framing
 * in data (head_len bytes before, CRLF after when tail) and the bytes at
 * ref, given back through release once the piece is freed. len: every
 * byte on the wire. */
typedef struct bchunk_s {
  struct bchunk_s *next;
  size_t len;
  const char *ref;
  size_t ref_len;
  om_upstream_release_fn release;
  void *rel_ud;
  unsigned head_len, tail;
  char data[];
} bchunk_t;
typedef struct conn_s conn_t;
typedef om_upstream_req_t req_t;

/* A peer's key: the address, and for TLS the context and a hash of the
 * host (the host itself is compared too: peer_find). Plain peers have
 * tls_ctx NULL and name_hash 0. */
typedef struct {
  uint16_t family;
  uint16_t port; /* network order */
  uint8_t addr[16];
  uint32_t name_hash;
  uint32_t http2; /* HTTP/2 connections are a peer of their own */
  const om_tls_ctx_t *tls_ctx;
} pkey_t;

struct peer_s {
  peer_t *hnext;
  uint64_t hash;
  pkey_t key;
  om_upstream_target_t target; /* the address to connect to */
  om_tls_ctx_t *tls_ctx;       /* TLS peers: a reference, NULL otherwise */
  char server_name[254];       /* TLS peers: the name to prove; "": host */
  om_list_t idle;              /* conn_t by ilink, most recently used first */
  om_list_t h2;                /* HTTP/2 connections (om__up_h2c_t) */
  size_t refs;                 /* connections and requests pointing here */
  om_upstream_stats_t st;
};

enum {
  PH_CONNECTING,
  PH_HEAD,
  PH_BODY_CL,
  PH_CHUNKED,
  PH_BODY_EOF,
  PH_IDLE,
  PH_TUNNEL /* taken after a 101: the tunnel reads and writes */
};

struct conn_s {
  uv_tcp_t tcp;
  uv_timer_t timer;
  uv_connect_t creq;
  uv_write_t wreq;
  om_upstream_pool_t *pool;
  peer_t *peer;
  om_list_t link;  /* on the pool's conns while open */
  om_list_t ilink; /* on the peer's idle list while PH_IDLE */
  req_t *req;
  int phase;
  int handles; /* libuv handles not yet closed */
  unsigned closing : 1, reading : 1, writing : 1, broken : 1, keepalive : 1;
  /* the socket is lent to the request's caller (om_upstream_response_lend):
   * nothing reads it here until it is given back */
  unsigned lent : 1;
  /* the socket is lent to write the request body (om_upstream_body_lend):
   * no body piece is written here until it is given back */
  unsigned lent_out : 1;
  uint64_t timer_due; /* loop ms the timer is armed for; 0: not armed */
  uint64_t idle_since;
  uint64_t idle_ms; /* the idle timeout its latest request asked for */
  uint64_t nreqs;   /* requests started on it */
  /* read buffer: unconsumed bytes are [pos, len) */
  char *buf;
  size_t cap, cap_max, len, pos;
  int read_full; /* the latest read filled the buffer: more was waiting */
  /* the head, relative to pos */
  om_http1_head_t head;
  om_http1_field_t *fields;
  size_t fields_cap;
  size_t interim_bytes; /* 1xx heads already skipped for this response */
  /* body */
  uint64_t remaining;
  om_http1_chunked_t ch; /* a chunked body being read */
  /* streamed request body pieces being written (owned here; freed by
   * on_write, which libuv runs for every write, cancelled ones too) */
  bchunk_t *inflight;
  size_t inflight_bytes;
  /* the head as handed to on_headers */
  om_http_header_t *hdrs;
  size_t hdrs_cap;
  om_upstream_response_t resp;
  struct om_tunnel_s *tunnel; /* the holder after a 101 (PH_TUNNEL) */
  /* TLS connections only (om_upstream_tls.c): the engine, the ciphertext
   * read buffer and the ciphertext of the write in flight */
  om_tls_t *tls;
  char *tin, *tout;
  size_t tout_cap;
};

enum { R_FREE, R_ACTIVE, R_DONE };
enum { PEND_NONE, PEND_DONE, PEND_PROCESS };

struct om_upstream_req_s {
  om_upstream_pool_t *pool;
  peer_t *peer; /* held (refs) until the request ends */
  conn_t *conn;
  req_t *next;     /* the free list */
  om_list_t plink; /* the pending list, while pend != PEND_NONE */
  om_upstream_callbacks_t cb;
  void *ud;
  const char *body;
  size_t body_len;
  char *head;
  size_t head_len, head_cap;
  uint64_t connect_ms, first_byte_ms;
  uint64_t connect_due, first_byte_due, total_due; /* loop ms; 0 none */
  uint64_t head_due;                               /* loop ms; 0 none */
  /* keep-alive limits for the connection (pool defaults filled in; 0
   * max_reqs: no limit) */
  size_t max_idle;
  uint64_t idle_ms, max_reqs;
  int state;
  int pend;
  unsigned retry_stale : 1, is_head : 1, in_cb : 1, cancelled : 1, paused : 1,
      got_bytes : 1, upgrade : 1, in_101 : 1;
  /* a streamed body: pieces not yet handed to a connection, the bytes
   * pending (queued and in flight), what a Content-Length still allows
   * (-1: chunked); ended by the caller; a piece was handed to a
   * connection (then no transparent retry); on_drain armed */
  bchunk_t *bq_head, *bq_tail;
  size_t body_pending, drain_low;
  om_upstream_drain_fn on_drain;
  int64_t body_left;
  unsigned streamed : 1, body_ended : 1, body_moved : 1, drain_armed : 1;
  om_upstream_result_t res;
  /* HTTP/2 (om_upstream_h2.c): the connection and stream while attached,
   * the response head and trailers as they arrive (names and values in
   * harena, by offset in hf until delivery), the bytes of a paused
   * stream, what of the body went into DATA frames, how it ended */
  struct om__up_h2c_s *h2;
  int32_t sid;
  om_list_t h2link;
  char *harena;
  size_t harena_len, harena_cap;
  struct om__up_h2f_s *hf;
  size_t n_hf, cap_hf, hbytes;
  char *held;
  size_t held_off, held_len, held_cap;
  size_t bq_off, body_off;
  int h2_status;
  om_upstream_fail_t h2_fail;
  int h2_err;
  const char *h2_detail;
  unsigned http2 : 1, h2_head : 1, h2_end : 1, h2_closed : 1, h2_deferred : 1,
      h2_drain_due : 1, h2_bad : 1;
};

struct om_upstream_pool_s {
  uv_loop_t *loop;
  om_tls_ctx_t *tls_ctx;     /* opts.tls_ctx (a reference) or NULL */
  om_tls_ctx_t *tls_default; /* made on first use when tls_ctx is NULL */
  uv_idle_t kick;
  om_upstream_pool_opts_t o;
  peer_t **buckets;
  size_t nbuckets, npeers;
  om_list_t conns; /* open (not closing) conn_t, by link */
  size_t nconns;   /* connections not yet freed */
  req_t *free_reqs;
  size_t nfree;
  om_list_t pend;    /* req_t with deferred work, by plink, oldest first */
  om_list_t h2conns; /* open HTTP/2 connections, by link */
  int api;           /* om_upstream_* calls on the stack */
  unsigned closing : 1, kick_on : 1, finishing : 1;
  om_upstream_closed_fn on_closed;
  void *closed_ud;
  om_upstream_stats_t st;
};

static inline uint64_t now_ms(const om_upstream_pool_t *p) {
  return uv_now(p->loop);
}

/* Field names the client handles itself, by kind. */
enum { F_OTHER, F_HOP, F_CONNECTION, F_CONTENT_LENGTH, F_TE, F_HOST };

/* What a Connection field says (RFC 9110 7.6.1). */
typedef struct {
  int close;  /* "close" seen */
  int others; /* a name other than close / keep-alive seen */
} conn_opts_t;

/* om_upstream.c */

/* The kind of a field name (F_*), for the fields the client handles. */
int om__up_field_kind(const char *n, size_t len);
/* Walk the elements of a Connection value (#token): fn per element, which
 * returns nonzero to stop; returns that, 0, or -1 for an element that is
 * not a token. */
int om__up_conn_walk(const char *v, size_t n,
                     int (*fn)(void *arg, const char *t, size_t len),
                     void *arg);
/* om__up_conn_walk's fn that fills a conn_opts_t. */
int om__up_conn_opt(void *arg, const char *t, size_t len);
/* Whether a Connection field of h[0, n) names the field name[0, len). */
int om__up_named_in_connection(const om_http_header_t *h, size_t n,
                               const char *name, size_t len);
/* Drop a reference to a peer (connections and requests hold one). */
void om__up_peer_unref(peer_t *e);
/* Detach c's request from c (the request goes on without it). */
void om__up_detach(conn_t *c);
/* End r with this outcome: on_done now, or from the kick when an
 * om_upstream_* call is on the stack. */
void om__up_req_end(req_t *r, om_upstream_fail_t fail, int err,
                    const char *detail);
/* Return a cancelled or finished request object to the free list. */
void om__up_req_recycle(req_t *r);
/* Free the pool once it is closing and nothing of it is left open. */
void om__up_pool_maybe_finish(om_upstream_pool_t *p);

/* Queue r for deferred work (PEND_DONE, PEND_PROCESS) on the kick. */
void om__up_pend_push(req_t *r, int kind);
/* Whether a header value is field-content (RFC 9110 5.5). */
int om__up_valid_value(const char *v, size_t n);

/* om_upstream_h2.c */

/* Start r (peer set, fields filled) on an HTTP/2 connection of its peer:
 * 0 (sent, or ended already by a synchronous failure), OM_EINVAL (a
 * field HTTP/2 cannot carry), OM_ENOMEM (nothing changed). */
int om__up_h2_send(req_t *r, const om_upstream_target_t *t,
                   const om_upstream_request_t *q);
/* om_upstream_cancel of an HTTP/2 request: reset its stream. */
void om__up_h2_cancel(req_t *r);
/* The stream was resumed: deliver what it holds from the kick. */
void om__up_h2_resume(req_t *r);
/* Deferred work of an HTTP/2 request, from the kick. */
void om__up_h2_process(req_t *r);
/* Body bytes or the end were queued: let nghttp2 frame them. */
void om__up_h2_body_more(req_t *r);
/* Close every HTTP/2 connection of the pool (om_upstream_pool_close). */
void om__up_h2_close_all(om_upstream_pool_t *p);
/* Free r's HTTP/2 buffers (a request object freed for good). */
void om__up_h2_req_free(req_t *r);

/* om_upstream_body.c */

/* Hand r's queued body pieces to c when it can write (head sent, no
 * write in flight). No callbacks run. */
void om__up_body_flush(conn_t *c);
/* c's write finished (status as libuv gives it): free what was in
 * flight, then go on writing and run on_drain when it is due. From
 * on_write only. Returns nonzero when c's request was released inside
 * on_drain. */
int om__up_body_written(conn_t *c, int status);
/* Free r's queued body pieces. */
void om__up_body_free(req_t *r);
/* The bytes of piece b as they go on the wire, in order: up to 3 buffers
 * into out; their count. */
unsigned om__up_piece_bufs(bchunk_t *b, uv_buf_t out[3]);
/* Free piece b, giving lent bytes back. */
void om__up_piece_free(bchunk_t *b);

/* om_upstream_conn.c */

/* Arm c's timer for its earliest deadline. */
void om__up_conn_arm(conn_t *c);
/* The write callback of every request write on a connection. */
void om__up_on_write(uv_write_t *w, int status);

/* Take c off its peer's idle list. */
void om__up_idle_unlink(conn_t *c);
/* Close c (its request, if any, must be detached first). */
void om__up_conn_close(conn_t *c);
/* Start or stop reading c. */
void om__up_read_on(conn_t *c);
void om__up_read_off(conn_t *c);
/* c (connected or pooled) starts carrying its request. */
void om__up_conn_start(conn_t *c);
/* A new connection for r to r->peer: 0 (connecting, or r already ended
 * by a synchronous connect error), OM_ENOMEM with nothing changed. */
int om__up_conn_connect(req_t *r);
/* Run c's request through what is buffered, until more bytes are needed
 * or the request stops. */
void om__up_conn_process(conn_t *c);
/* End the attempt on c (closed) with this failure: a stale keep-alive
 * retry when allowed, else the request ends. */
void om__up_attempt_fail(conn_t *c, om_upstream_fail_t fail, int err,
                         const char *detail);
/* The class of a failed connect (libuv code): LOCAL for this process's
 * own want of descriptors, buffers or ports, else CONNECT. */
om_upstream_fail_t om__up_connect_class(int uverr);
/* Make room in c's read buffer (compact, grow) and return it. */
size_t om__up_buf_room(conn_t *c);
/* EOF (UV_EOF) or a read error on a connection carrying a request. */
void om__up_conn_eof(conn_t *c, ssize_t err);

/* om_upstream_tls.c */

/* The TCP connection of a TLS peer is up: start the handshake; the
 * request starts when it completes (om__up_conn_start). */
void om__up_tls_start(conn_t *c);
/* on_read of a TLS connection. */
void om__up_tls_on_read(conn_t *c, ssize_t nread);
/* Decrypt more plaintext into c's read buffer: 1 when bytes came, 0 when
 * more ciphertext is needed, -1 when the attempt ended (c closed). */
int om__up_tls_pull(conn_t *c);
/* Encrypt and send r's head and body (conn_write's TLS path). */
void om__up_tls_write_request(conn_t *c);
/* Encrypt body pieces and write them (om__up_body_flush's TLS path):
 * the pieces are freed, their plaintext bytes count as in flight. */
void om__up_tls_body_flush(conn_t *c);
/* Write the pending ciphertext when no write is in flight: 0, or a
 * libuv error (nothing else done: the caller ends the attempt). */
int om__up_tls_flush(conn_t *c);
/* Nonzero when decrypted bytes or unread ciphertext wait in the engine. */
int om__up_tls_pending(const conn_t *c);
/* Nonzero when c must not be pooled: a byte after the response, a
 * close_notify or an error in what the engine holds. */
int om__up_tls_stray(conn_t *c);
/* The TLS context for a request to a tls target: the request's, the
 * pool's, or the pool's default (made now); NULL when the default cannot
 * be made. */
om_tls_ctx_t *om__up_tls_ctx_for(om_upstream_pool_t *p,
                                 const om_upstream_request_t *q);

#endif /* OM_UPSTREAM_INTERNAL_H */
