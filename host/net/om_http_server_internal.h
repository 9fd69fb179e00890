/*
 * om_http_server_internal.h: what the files of the HTTP server share (the
 * connection, request and server structs, the lifecycle phases and the
 * functions one file calls in another). Not a public header: only
 * om_http_server.c (accepting, the server, the request and response
 * API), om_http_server_read.c (rejections, parsing, reading, timers),
 * om_http_server_write.c (writing, response heads, teardown) and
 * om_http_server_body.c (streamed request bodies) include it.
 */
#ifndef OM_HTTP_SERVER_INTERNAL_H
#define OM_HTTP_SERVER_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "om_http1.h"
#include "om_list.h"
#include "om_http_server.h"
#include "om_tls.h"

/* ------------------------------------------------------------------ */
/* limits and defaults */

#define DEF_MAX_HEADER_BYTES (16u * 1024u)
#define CAP_MAX_HEADER_BYTES (64u * 1024u)
#define MIN_MAX_HEADER_BYTES 64u
#define DEF_MAX_HEADERS 100u
#define DEF_MAX_BODY_BYTES (1024u * 1024u)
#define DEF_HEADER_TIMEOUT_MS 10000u
#define DEF_IDLE_TIMEOUT_MS 60000u
#define DEF_DRAIN_TIMEOUT_MS 5000u
#define DEF_MAX_CONNECTIONS 10000u
#define DEF_MAX_PIPELINED 16u
#define DEF_RESERVE_TIMEOUT_MS 1000u

/* framing bytes allowed in one chunked body */
#define OVERHEAD_MAX(max_body) ((max_body) > 65536u ? (max_body) : 65536u)
/* RFC 9112 9.6: after our FIN, read and drop until the client's EOF, at
 * most LINGER_MS without a byte, LINGER_TOTAL_MS in all, and
 * LINGER_DISCARD_MAX bytes: enough for a client that sends a whole upload
 * (a 9 MiB PUT) before it reads an early answer, as nginx's
 * lingering_close (lingering_time 30 s) */
#define LINGER_MS 2000u
#define LINGER_TOTAL_MS 30000u
#define LINGER_DISCARD_MAX (64u << 20)
#define DISCARD_MAX (1u << 20) /* bytes dropped after an error before a cut */
#define READ_MIN 2048u         /* smallest read buffer we hand libuv */
/* A request's first read: a head and a small body (a 4 KiB JSON call)
 * in one, so whole_body_max can take the body whole. An idle keep-alive
 * connection gives its buffer back, so this is per busy connection. */
#define READ_FIRST 8192u
#define READ_SLACK (16u * 1024u)
/* the read buffer while a streamed body flows (freed when the connection
 * is idle again): a 1 GiB upload in 64 KiB reads, not 32 KiB ones */
#define STREAM_READ_MAX (64u * 1024u)
#define SCRATCH_BYTES (16u * 1024u)

/* ------------------------------------------------------------------ */
/* types */

/* The body being read: a Content-Length count, or the chunked decoder
 * (core/om_http1.c). */
typedef struct {
  int chunked;
  uint64_t left; /* Content-Length bytes still to come */
  om_http1_chunked_t ch;
} dec_t;

typedef struct om_http_conn_s conn_t;

/* A connection's read buffer (om_http_body_ref_t): reference-counted so
 * streamed body spans in it can be held past on_data. The connection
 * holds one reference; cap bytes of data follow. */
struct om_http_body_ref_s {
  unsigned refs;
  size_t cap;
  char data[];
};

/*
 * Output corking. A response's head, its body and the end of a chunked
 * stream are usually written from one callback (an upstream read that
 * carried all of them), and pipelined responses from one read of the
 * client. Small writes are gathered per connection and sent in one
 * syscall at the end of the loop turn (uv_check runs right after the I/O
 * callbacks), so a small response costs one write, as nginx's writev
 * does. Larger writes go out at once, behind what was gathered. Buffers
 * are lent by the server and returned at the flush, so an idle connection
 * holds none.
 */
#define OB_CAP 4096
#define OB_SPARES 16

enum { RS_NONE, RS_STREAMING };
enum { RF_NOBODY, RF_FIXED, RF_CHUNKED, RF_CLOSE };

typedef struct req_s {
  om_http_request_t pub; /* first: the handler's pointer is ours */
  conn_t *conn;          /* NULL once the client is gone */
  struct req_s *next;
  om_http_close_fn on_close;
  om_http_drain_fn on_drain;
  size_t drain_low;
  char *body;
  size_t body_cap;
  uint64_t resp_left;
  int rstate, rframe;
  unsigned keep_alive : 1, is_head : 1, want_continue : 1, continue_sent : 1,
      in_close_cb : 1, resp_close : 1, upgrade : 1,
      lent : 1; /* the socket is the caller's (om_http_response_lend) */
  /* a streamed body (stream_bodies): the holder's callbacks, its idle
   * timeout; delivery started (body_on) and paused by the holder */
  om_http_body_fn on_body;
  om_http_body_end_fn on_body_end;
  uint64_t body_idle_ms;
  unsigned body_on : 1, body_paused : 1;
  unsigned body_lent : 1; /* the socket is the caller's to read the body */
} req_t;

/*
 * A connection's lifecycle, in order; a phase is never re-entered. Any
 * phase before FAILED may end in FAILED (a broken connection inside an
 * API call: closed from its timer on the next loop turn) or CLOSING.
 */
enum phase {
  PH_READING,   /* requests are parsed (ps) and dispatched in order */
  PH_LAST,      /* the last request is in ("close", HTTP/1.0): nothing
                   more is parsed, later bytes are read and dropped */
  PH_H2,        /* HTTP/2: every byte read goes to the session (c->h2) */
  PH_ERRORING,  /* a request was refused: nothing more is parsed; the
                   answer goes out once the responses before it end */
  PH_SHUTTING,  /* queued bytes flushed, then our FIN (uv_shutdown) */
  PH_LINGERING, /* FIN sent: reading and dropping until the client's EOF
                   or LINGER_MS (RFC 9112 9.6) */
  PH_TUNNEL,    /* handed over after a 101: the tunnel reads and writes */
  PH_FAILED,    /* to be closed from the timer on the next loop turn */
  PH_CLOSING    /* uv_close called: the handles are closing */
};

/* Where the parse of the next request stands, while PH_READING. */
enum { P_HEAD, P_BODY };

struct om_http_conn_s {
  uv_tcp_t tcp;
  uv_timer_t timer;
  uv_shutdown_t shut;
  om_http_server_t *srv;
  om_list_t link; /* on the server's conns */
  int handles;
  /* the read buffer: in is inb->data (NULL with inb); while others hold
   * references on inb, bytes before in_len are never moved or rewritten */
  struct om_http_body_ref_s *inb;
  char *in;
  size_t in_off, in_len, in_cap;
  om_http1_head_t sc; /* the header section being read */
  om_http1_field_t *fields;
  size_t fields_cap;
  enum phase phase;
  int ps;
  req_t *cur; /* request whose body is being read (buffered) */
  /* stream_bodies: the request whose body is next on the wire (queued or
   * active; not owned: cleared when it is freed); kick: deliver buffered
   * body bytes from the timer */
  req_t *sbody;
  unsigned kick : 1;
  unsigned span_live : 1; /* inside on_data: om_http_request_body_ref works */
  dec_t dec;
  req_t *q_head, *q_tail;
  size_t q_len;
  req_t *active; /* dispatched, response not ended */
  om_http_reject_t err;
  /* facts independent of the phase: the error answer is to a HEAD; the
   * header timer's start (the accept for the first request, hstart_set
   * once its first byte came); the client's FIN came; libuv is reading;
   * the pump is running or asked to run again; how the FIN ends
   * (no_linger: no lingering read after it) */
  unsigned err_head : 1, fresh : 1, hstart_set : 1, eof : 1, reading : 1,
      in_pump : 1, pump_again : 1, no_linger : 1, held : 1;
  char *ob; /* corked output (OB_CAP), flushed at the loop's check phase */
  size_t ob_len;
  om_list_t dlink; /* on the server's dirty list while output is corked */
  /* held: an upgrade request was parsed; nothing behind it is parsed until
   * its answer says whether the connection stays HTTP. tunnel: the holder
   * of the connection after a 101 (PH_TUNNEL). */
  struct om_tunnel_s *tunnel;
  uint64_t t_header, t_read, t_idle, t_write, t_linger;
  size_t discarded;
  struct sockaddr_storage remote;
  char remote_ip[46];
  int remote_port;
  /* HTTPS (srv->o.tls): the engine, the verified client certificate
   * (NULL: none); the handshake was counted; the engine failed (only
   * its pending alert may still go out); plaintext may wait inside the
   * engine while reading is stopped (om_http_server_tls.c) */
  om_tls_t *tls;
  om_tls_identity_t *peer;
  unsigned tls_counted : 1, tls_dead : 1, tls_in : 1;
  struct om_http2_s *h2; /* PH_H2: the session (om_http2_server.c) */
  /* taken over max_connections into the reserve (opts.reserve_*): on the
   * server's reserved list by rlink, oldest first, until it closes */
  unsigned reserved : 1;
  om_list_t rlink;
};

struct om_http_server_s {
  uv_loop_t *loop;
  uv_tcp_t listener; /* owns the listening socket; libuv never accepts on it */
  uv_poll_t accept_poll;   /* readiness of the listening socket: we accept */
  uv_timer_t accept_timer; /* resumes accepting after a pause */
  int reserve_fd; /* /dev/null, given up to answer 503 under EMFILE; -1 */
  uint64_t accept_log_ms; /* the last accept-pressure log line; suppressed */
  uint64_t accept_suppressed;
  uv_timer_t drain_timer;
  uv_check_t flush_check; /* flushes corked output once per loop turn */
  /* active with flush_check: output corked outside the poll phase (a
   * timer's write) must not wait for the next I/O to wake the loop */
  uv_idle_t flush_idle;
  om_list_t dirty; /* conn_t with corked output, by dlink */
  char *ob_spare[OB_SPARES];
  size_t n_ob_spare;
  om_http_server_opts_t o;
  om_http_handler_fn on_request;
  void *ud;
  om_http_closed_fn on_closed;
  om_list_t conns;    /* every conn_t not yet freed, by link */
  om_list_t reserved; /* conn_t in the reserve, by rlink, oldest first */
  size_t n_reserved;
  size_t handles;
  int listen_error; /* the libuv error of a failed listen, else 0 */
  unsigned listening : 1, listen_spent : 1, closing : 1, timer_closing : 1,
      poll_open : 1, polling : 1, finished : 1;
  om_http_server_metrics_t m;
  time_t date_sec;
  char date[40];
  char scratch[SCRATCH_BYTES];
};

/* The caller's response header fields, as check_resp_headers found them. */
typedef struct {
  int close, has_cl, has_date;
  uint64_t cl;
  size_t bytes; /* their size on the wire */
} rh_t;

/* The Connection field a response head carries. */
enum { CH_NONE, CH_CLOSE, CH_KEEP_ALIVE, CH_UPGRADE };

/* om_http_server.c */

/* uv_now of c's loop, in ms. */
uint64_t om__http_now_ms(const conn_t *c);
/* Free a request and its body; NULL does nothing. */
void om__http_req_free(req_t *r);
/* Drop the queued requests and the one whose body is being read. */
void om__http_conn_drop_requests(conn_t *c);
/* Mark c FAILED and close it from its timer on the next loop turn: the
 * way to break a connection inside an API call. */
void om__http_conn_fail(conn_t *c);
/* A reserve connection leaves the reserve (closing, or evicted). */
void om__http_unreserve(conn_t *c);
/* Whether r may be served on a reserve connection: a GET or HEAD of one
 * of opts.reserve_paths. */
int om__http_reserve_admits(const om_http_server_t *s, const req_t *r);
/* The answer to a connection over max_connections. */
extern const char om__http_busy_503[];
extern const size_t om__http_busy_503_len;
/* The IMF-fixdate for Date (RFC 9110 5.6.7), cached per second. */
const char *om__http_date(om_http_server_t *s);
/* Free the server once it is closing and nothing of it is left open. */
void om__http_srv_maybe_finish(om_http_server_t *s);

/* om_http_server_read.c */

/* A fresh header-section parser for the next request on c. */
void om__http_scan_reset(conn_t *c);
/* Advance c: parse, dispatch, answer a refusal, notice EOF; re-entrant
 * calls ask the running pump to go again. Loop callbacks and API calls
 * alike. */
void om__http_conn_pump(conn_t *c);
/* Start or stop reading and re-arm the timer to match c's phase. */
void om__http_conn_update(conn_t *c);
/* c's timer: the earliest deadline of its phase passed. */
void om__http_on_timer(uv_timer_t *t);
/* The plaintext read callbacks (libuv's, and the TLS glue's after
 * decryption). */
void om__http_on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
void om__http_on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);

/* Give up c's reference on its read buffer (others may keep it alive):
 * c has none after. */
void om__http_in_release(conn_t *c);
/* The answer to a refusal of the framing module. */
om_http_reject_t om__http_reject_of(om_http1_err_t e);
/* Send r's 100 Continue if it asked for one and has none yet. */
void om__http_send_continue(conn_t *c, req_t *r);

/* om_http_server_body.c */

/* The streamed body of c->sbody is wanted now: active, started, not
 * paused. */
int om__http_body_wanted(const conn_t *c);
/* Deliver the buffered body bytes of c->sbody (loop callbacks only: the
 * holder's callbacks run, and an error runs on_close). */
void om__http_body_pump(conn_t *c);
/* End c->sbody's body with why (loop callbacks only): 408 or the framing
 * reason when no response started, else the response is cut. */
void om__http_body_fail(conn_t *c, om_http_reject_t why);

/* om_http_server_write.c */

/* Send bytes as they go on the wire, in order after everything sent
 * before (straight to the socket when nothing is queued). 0, or
 * OM_ESTATE / OM_ENOMEM with the connection marked failed. */
int om__http_conn_send_raw(conn_t *c, const uv_buf_t *bufs, unsigned nb);

/* Write bufs on c: gathered in the corked buffer when small, else at
 * once behind it; 0, or OM_ESTATE when c is gone (a broken write marks
 * it FAILED). */
int om__http_conn_write(conn_t *c, const uv_buf_t *bufs, unsigned nb);
/* om__http_conn_write with bufs[lent] lent, not copied, on a plaintext
 * connection (om_http_response_write_lent): release(ud) runs once when
 * the server is done with it, possibly before return. */
int om__http_conn_write_lent(conn_t *c, const uv_buf_t *bufs, unsigned nb,
                             unsigned lent, om_http_release_fn release,
                             void *ud);
/* Close c now (reset: RST instead of FIN); runs on_close of the active
 * request, so only from loop callbacks or with no request active. */
void om__http_conn_close(conn_t *c, int reset);
/* Send what is corked now, ahead of anything written later. */
void om__http_conn_flush(conn_t *c);
/* Flush, FIN and (unless no_linger) linger: nothing more is parsed or
 * dispatched. Safe inside API calls. */
void om__http_conn_finish(conn_t *c, int no_linger);
/* The reason phrase for status ("" when it has none). */
const char *om__http_reason_phrase(int status);
/* Check the caller's response fields (OM_EINVAL for what could split the
 * response or that frames it: see om_http_respond); *out what they say. */
int om__http_check_resp_headers(const om_http_header_t *h, size_t n,
                                int allow_cl, int checked, rh_t *out);
/* The response head in stackbuf when it fits, else malloc'd (the caller
 * frees what is not stackbuf); NULL when out of memory. */
char *om__http_build_head(om_http_server_t *s, char *stackbuf, size_t stackcap,
                          int status, const om_http_header_t *h, size_t n,
                          const rh_t *rh, int add_cl, uint64_t cl, int chunked,
                          int conn_hdr, size_t *len);

/* om_http_server_tls.c (only for connections of a server with o.tls) */

/* A new engine for an accepted connection: 0, or an error (logged). */
int om__http_tls_accept(conn_t *c);
/* The read callbacks of a TLS connection: ciphertext in, the plaintext
 * ones called with what it decrypts to. */
void om__http_tls_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
void om__http_tls_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);
/* Drive the handshake and deliver the plaintext inside the engine (loop
 * callbacks only: the read path runs). */
void om__http_tls_pump(conn_t *c);
/* Encrypt and send (om__http_conn_send_raw's contract). */
int om__http_tls_send(conn_t *c, const uv_buf_t *bufs, unsigned nb);
/* Queue close_notify before our FIN. */
void om__http_tls_notify(conn_t *c);
/* Closing: what is corked and a close_notify, as far as the socket takes
 * them now. */
void om__http_tls_goodbye(conn_t *c);
/* Hand the engine over to the tunnel after a 101. */
void om__http_tls_tunnel(conn_t *c, struct om_tunnel_s *t);
/* The connection is freed: count an unfinished handshake, free the
 * engine and the identity. */
void om__http_tls_free(conn_t *c);

/* om_http2_server.c (connections of a server with o.http2) */

/* c becomes an HTTP/2 connection (PH_H2); the bytes in its read buffer
 * are the session's first. 0, or OM_ENOMEM with nothing changed. */
int om__http2_take(conn_t *c);
/* Feed what is in c's read buffer to the session and run it (loop
 * callbacks only). */
void om__http2_on_read(conn_t *c);
/* Run the session: the holder's callbacks, then frames out (loop
 * callbacks only). */
void om__http2_pump(conn_t *c);
/* The session wants bytes and output is under its bound. */
int om__http2_want_read(const conn_t *c);
/* No stream is open. */
int om__http2_idle(const conn_t *c);
/* The server drains: GOAWAY; the connection ends with its last stream. */
void om__http2_drain(conn_t *c);
/* c is closing: tell every holder (on_close) and free the session. */
void om__http2_close(conn_t *c);
/* The connection of an HTTP/2 request, NULL once it is gone. */
conn_t *om__http2_conn_of(const om_http_request_t *req);
int om__http2_respond(om_http_request_t *req, int status,
                      const om_http_header_t *headers, size_t n,
                      const char *body, size_t len);
int om__http2_response_start(om_http_request_t *req, int status,
                             const om_http_header_t *headers, size_t n,
                             int checked);
int om__http2_response_write(om_http_request_t *req, const char *data,
                             size_t len);
int om__http2_response_end(om_http_request_t *req);
int om__http2_response_end_trailers(om_http_request_t *req,
                                    const om_http_header_t *t, size_t n);
/* Whether a trailer field may be sent: a token name that does not frame
 * or route the message, a field-content value (lengths exact). */
int om__http_trailer_ok(const char *name, size_t nl, const char *value,
                        size_t vl);
void om__http2_response_abort(om_http_request_t *req);
size_t om__http2_response_pending(const om_http_request_t *req);
int om__http2_response_on_drain(om_http_request_t *req, size_t low_water,
                                om_http_drain_fn cb);
int om__http2_on_close(om_http_request_t *req, om_http_close_fn cb);
int om__http2_body_start(om_http_request_t *req, om_http_body_fn on_data,
                         om_http_body_end_fn on_end);
void om__http2_body_pause(om_http_request_t *req);
void om__http2_body_resume(om_http_request_t *req);

/* A request of an HTTP/2 stream: the om_http_* functions hand it to the
 * om__http2_* ones. */
#define OM__HTTP_IS_H2(req) ((req) != NULL && (req)->version_major == 2)

/* om_http_server_write.c, for the HTTP/2 session */

/* Send bytes as the HTTP layer's (encrypted on TLS), in order. */
int om__http_conn_send(conn_t *c, const uv_buf_t *bufs, unsigned nb);
/* Have c's session pumped at the end of this loop turn. */
void om__http_conn_mark_dirty(conn_t *c);

/* Keep opts.open_count, when set, at the open connections (workers read
 * it from their threads to keep their shares level). */
static inline void om__http_publish_open(om_http_server_t *s) {
  if (s->o.open_count != NULL)
    atomic_store_explicit(s->o.open_count, (uint32_t)s->m.connections_active,
                          memory_order_relaxed);
}

#endif /* OM_HTTP_SERVER_INTERNAL_H */
