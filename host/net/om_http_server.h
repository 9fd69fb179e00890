/*
 * om_http_server.h: the HTTP/1.1 server under every OpenMesh process
 * (control plane, proxy, egress gateway), on one libuv loop.
 *
 * Message framing follows RFC 9112 strictly, because the server sits in
 * front of a proxy: a request whose framing two implementations could read
 * differently is a request-smuggling vector, so it is refused, never
 * "repaired". Every refusal is answered with a small JSON body
 * {"error":"<reason>"} and `Connection: close`; the connection is then
 * half-closed and no further byte on it is interpreted (RFC 9112 9.6:
 * lingering close, so the client reads the answer instead of a reset).
 *
 * Every request is read once, by the HTTP/1.1 framing module
 * (core/om_http1.h: request line, field lines, Content-Length and
 * Transfer-Encoding, chunked framing), which the upstream client shares.
 * http-parser 2.9 is its differential oracle in the tests
 * (tests/test_http1_fuzz.c), not a second parse. What it refused beyond
 * our rules when it was one is refused by ours with the same answers
 * (an unknown method, a malformed Content-Length among the trailers).
 * The answer never depends on how the client's bytes were split into
 * reads.
 *
 * Deliberate choices where RFC 9112 leaves one: a bare LF is never a line
 * terminator (2.2 says MAY), anywhere: request line, field lines, chunk
 * lines, trailers; a bare CR is refused (2.2); obs-fold is refused
 * (5.2), as is whitespace before the first field line (2.2); a message
 * with both Content-Length and Transfer-Encoding is refused (6.1), and
 * so is a repeated Content-Length (RFC 9110 8.6 allows merging equal
 * values). After a request that ends the connection ("close", or HTTP/1.0
 * without keep-alive) no further byte is parsed (9.6); while its response
 * is on its way, what follows is read and dropped up to 1 MiB, then no
 * longer read (TCP holds the client back) until the response is done.
 * After it (our FIN sent), what the client still sends is read and
 * dropped up to 64 MiB, 30 s in all or 2 s without a byte, then the
 * connection closes (lingering close, as nginx's lingering_close): a
 * client that sends a whole body before reading, as most do without
 * Expect, reads an early answer (413, 503) instead of a reset.
 *
 * Threading: everything runs on the loop thread; no function here may be
 * called from another thread. The process must ignore SIGPIPE (libuv
 * writes with writev; a peer reset would otherwise kill the process).
 */
#ifndef OM_HTTP_SERVER_H
#define OM_HTTP_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include <sys/socket.h>
#include <uv.h>

typedef struct om_http_server_s om_http_server_t;

/*
 * Why the server refused a request: XX(name, status, reason string). The
 * reason string is the "error" member of the JSON body and the label in
 * metrics; names and statuses are stable.
 *
 * - BAD_REQUEST_LINE: method not a token, not exactly one SP between the
 *   parts, version not `HTTP/DIGIT.DIGIT`, bare CR or LF in the request line
 *   (RFC 9112 3, 2.3, 2.2).
 * - BAD_TARGET: request-target not origin-form (or absolute-form http/https,
 *   or `*` with OPTIONS), a byte outside RFC 3986, a bad %-escape, a
 *   fragment, userinfo (RFC 9112 3.2, RFC 9110 4.2.4).
 * - TARGET_TOO_LONG: the limit max_header_bytes was reached inside the
 *   request-target (RFC 9112 3: 414).
 * - VERSION_NOT_SUPPORTED: a well-formed version whose major is not 1
 *   (RFC 9110 15.6.6: 505). HTTP/1.2 .. HTTP/1.9 are processed as
 *   HTTP/1.1 (RFC 9110 6.2).
 * - BAD_HEADER: a field name that is not a token, whitespace between the
 *   name and the colon (RFC 9112 5.1), a CTL, NUL, DEL or bare CR/LF in a
 *   value (RFC 9110 5.5, RFC 9112 2.2), whitespace before the first field
 *   line (RFC 9112 2.2); the same in a trailer field line.
 * - OBS_FOLD: a field line continued on the next line (RFC 9112 5.2).
 * - BAD_HOST: HTTP/1.1 without Host, more than one Host, or a Host value
 *   that is not uri-host [":" port] (RFC 9112 3.2, RFC 9110 7.2).
 * - BAD_CONTENT_LENGTH: Content-Length not 1*DIGIT after trimming OWS, or
 *   given more than once, even with equal values ("1, 1" included; RFC 9110
 *   8.6 and RFC 9112 6.3 allow accepting identical values: we do not); in
 *   the trailer section, a Content-Length that is empty, not 1*DIGIT or
 *   repeated (trailers are dropped, but no reader may frame on one).
 * - CONTENT_LENGTH_AND_TRANSFER_ENCODING: both present (RFC 9112 6.1,
 *   6.3 item 3).
 * - BAD_TRANSFER_ENCODING: chunked not the final coding (RFC 9112 6.3 item
 *   4), chunked applied twice or with parameters (RFC 9112 7), a list
 *   element that is not a transfer-coding or is empty, or any
 *   Transfer-Encoding in an HTTP/1.0 request (RFC 9112 6.1).
 * - UNSUPPORTED_TRANSFER_CODING: a coding other than chunked before the
 *   final chunked (RFC 9112 6.1: 501).
 * - BAD_CHUNK: chunk-size not 1*HEXDIG, malformed
 *   chunk-ext, a chunk line over 4 KiB, more framing bytes (chunk lines,
 *   trailers) than max(64 KiB, max_body_bytes), no CRLF after chunk-data,
 *   no CRLF ending the message (RFC 9112 7.1).
 * - METHOD_NOT_IMPLEMENTED: CONNECT, or a method token that
 *   om_http1_method_known does not know (RFC 9110 9.1: 501; the set
 *   http-parser knows), checked after the rest of the head; answered as
 *   soon as the method passes 16 bytes, longer than any known one (RFC
 *   9112 3).
 * - EXPECTATION_FAILED: an Expect member other than 100-continue in an
 *   HTTP/1.1 request (RFC 9110 10.1.1: 417).
 * - HEADERS_TOO_LARGE: the header section (request line included, leading
 *   empty lines included) or the trailer section exceeds max_header_bytes,
 *   or has more than max_headers fields (RFC 6585 5: 431).
 * - BODY_TOO_LARGE: Content-Length or the sum of chunk sizes exceeds
 *   max_body_bytes (RFC 9110 15.5.14: 413), answered before the body is
 *   read: a chunk-size at the hex digit that takes it past the limit, a
 *   value too big for 64 bits included, as for Content-Length.
 * - REQUEST_TIMEOUT: the header section did not complete within
 *   header_timeout_ms of its first byte, or the body stalled for
 *   idle_timeout_ms (with stream_bodies: the request's body idle timeout,
 *   see om_http_request_body_start) (RFC 9110 15.5.9: 408).
 * - BAD_REQUEST: a refusal of the framing module without a more precise
 *   reason above (no request reaches it today; the name stays stable).
 *   Stricter than RFC 9110 5.6.1.2, empty elements in a Transfer-Encoding
 *   list ("chunked,", ", chunked") are bad_transfer_encoding: for the
 *   framing field the strict reading is the safe one.
 */
#define OM_HTTP_REJECT_MAP(XX)                                                 \
  XX(BAD_REQUEST_LINE, 400, "bad_request_line")                                \
  XX(BAD_TARGET, 400, "bad_target")                                            \
  XX(TARGET_TOO_LONG, 414, "target_too_long")                                  \
  XX(VERSION_NOT_SUPPORTED, 505, "version_not_supported")                      \
  XX(BAD_HEADER, 400, "bad_header")                                            \
  XX(OBS_FOLD, 400, "obs_fold")                                                \
  XX(BAD_HOST, 400, "bad_host")                                                \
  XX(BAD_CONTENT_LENGTH, 400, "bad_content_length")                            \
  XX(CONTENT_LENGTH_AND_TRANSFER_ENCODING, 400,                                \
     "content_length_and_transfer_encoding")                                   \
  XX(BAD_TRANSFER_ENCODING, 400, "bad_transfer_encoding")                      \
  XX(UNSUPPORTED_TRANSFER_CODING, 501, "unsupported_transfer_coding")          \
  XX(BAD_CHUNK, 400, "bad_chunk")                                              \
  XX(METHOD_NOT_IMPLEMENTED, 501, "method_not_implemented")                    \
  XX(EXPECTATION_FAILED, 417, "expectation_failed")                            \
  XX(HEADERS_TOO_LARGE, 431, "headers_too_large")                              \
  XX(BODY_TOO_LARGE, 413, "body_too_large")                                    \
  XX(REQUEST_TIMEOUT, 408, "request_timeout")                                  \
  XX(BAD_REQUEST, 400, "bad_request")

typedef enum {
#define OM__HTTP_REJECT_ENUM(name, status, reason) OM_HTTP_REJECT_##name,
  OM_HTTP_REJECT_MAP(OM__HTTP_REJECT_ENUM)
#undef OM__HTTP_REJECT_ENUM
      OM_HTTP_REJECT__COUNT
} om_http_reject_t;

/* The reason string of a rejection ("bad_chunk"); "unknown" when out of
 * range. Never NULL; static. */
const char *om_http_reject_name(om_http_reject_t reason);

/* The status code the server answers a rejection with; 0 when out of
 * range. */
int om_http_reject_status(om_http_reject_t reason);

/*
 * Counters, updated on the loop thread; read them from the loop thread
 * (om_http_server_metrics) and copy what you export.
 */
typedef struct om_http_server_metrics_s {
  uint64_t connections_accepted; /* accepted and served */
  uint64_t connections_active;   /* open now (gauge), lingering included */
  uint64_t connections_rejected; /* over max_connections: 503 and closed */
  uint64_t requests;             /* dispatched to the handler */
  uint64_t responses_aborted;    /* client gone or response aborted */
  uint64_t rejected[OM_HTTP_REJECT__COUNT]; /* by om_http_reject_t */
  uint64_t upgrades; /* connections handed over as tunnels (101) */
  /* accepted on the reserve descriptor while the process was out of
   * descriptors (EMFILE, ENFILE): 503 and closed */
  uint64_t connections_shed;
  /* over max_connections, taken into the reserve (reserve_connections):
   * served when the request was for a reserved path, else 503; reserve
   * connections closed unread to make room for a newer one */
  uint64_t connections_reserved;
  uint64_t reserve_evicted;
  /* HTTP/2 (opts.http2): connections, streams (requests), streams refused
   * over SETTINGS_MAX_CONCURRENT_STREAMS, RST_STREAM frames received,
   * connections told ENHANCE_YOUR_CALM for too many of them in a second
   * (rapid reset), header lists over max_header_bytes / max_headers
   * (431), header blocks cut for too many CONTINUATION frames, sessions
   * ended by a protocol error, GOAWAY sent because the server drains */
  uint64_t h2_connections;
  uint64_t h2_streams;
  uint64_t h2_refused;
  uint64_t h2_resets;
  uint64_t h2_rapid_reset;
  uint64_t h2_headers_too_large;
  uint64_t h2_continuation_flood;
  uint64_t h2_protocol_errors;
  uint64_t h2_goaway_drain;
} om_http_server_metrics_t;

/*
 * Limits. Zero in any field means its default, so `{0}` and NULL are the
 * defaults; there is no way to ask for "no limit".
 */
typedef struct om_http_server_opts_s {
  /* Request line + field lines + the empty line, and separately the
   * trailer section of a chunked body: beyond it 431 (414 inside the
   * request-target). Default 16 KiB, at most 64 KiB. */
  size_t max_header_bytes;
  /* Field lines in the header or in the trailer section: beyond it 431.
   * Default 100. */
  size_t max_headers;
  /* Decoded body bytes: beyond it 413. Default 1 MiB. */
  size_t max_body_bytes;
  /* The whole header section must arrive within this many ms of its first
   * byte (of the accept, for a connection's first request), however it is
   * dribbled in: 408 and close (a silent close when not one byte of the
   * request came). Default 10 s. */
  uint64_t header_timeout_ms;
  /* A keep-alive connection with nothing in flight is closed after this
   * long; a body that stalls this long gets 408; a response that makes no
   * write progress this long (the client stopped reading) is cut.
   * Default 60 s. */
  uint64_t idle_timeout_ms;
  /* om_http_server_close waits this long for in-flight responses before it
   * cuts them. Default 5 s. */
  uint64_t drain_timeout_ms;
  /* Open connections (lingering ones included); a connection beyond it is
   * accepted, sent a 503 and closed at once, and counted. Default 10000. */
  size_t max_connections;
  /* Connections beyond max_connections kept for liveness and readiness
   * probes under a connection flood. Such a connection must bring its
   * whole first request head within reserve_timeout_ms (default 1000); a
   * GET or HEAD of one of reserve_paths (NULL-terminated, exact paths,
   * borrowed: they must outlive the server) is served and the connection
   * closed after the answer; anything else gets the same 503
   * too_many_connections as a connection over the limit. When every
   * reserve slot is taken, the oldest one still waiting for its head is
   * closed to make room, so idle connections cannot hold the reserve.
   * Default 0: no reserve (HTTP/1.1 only: a reserve connection is never
   * HTTP/2). */
  size_t reserve_connections;
  uint64_t reserve_timeout_ms;
  const char *const *reserve_paths;
  /* Complete requests read ahead of the one being handled on a connection;
   * at the limit the server stops reading that connection until responses
   * drain. Default 16. */
  size_t max_pipelined;
  /* Nonzero: streamed request bodies. The handler is called as soon as
   * the header section is complete and checked; a request with a body has
   * body_streamed set and gets its bytes (de-chunked) through
   * om_http_request_body_start, with backpressure (pause / resume stop
   * and start reading the socket, so TCP holds the client back): memory
   * per connection stays the read buffer. max_body_bytes 0 then means no
   * limit (the holder counts); a nonzero one is still enforced (413 at
   * the head for Content-Length, at the chunk-size that passes it).
   * Zero (the default): the whole body is read before the handler runs,
   * as the control plane and the egress gateway want. */
  int stream_bodies;
  /* With stream_bodies: a Content-Length body of at most this many bytes
   * that came complete with its head (one read, the usual case for a
   * small JSON call) is dispatched whole, as without stream_bodies
   * (body_streamed 0, body holding its bytes): the holder can send head
   * and body in one write. Only a request with none queued or being
   * answered before it: a connection holds one such copy at most,
   * however deep its pipeline. A body still on its way, a chunked one
   * and one behind "Expect: 100-continue" are streamed whatever their
   * size, so what a holder does at the head (limits, timeouts, the
   * invitation to send) is unchanged for them. 0 (the default): every
   * body streamed. */
  size_t whole_body_max;
  /* Non-NULL: HTTPS. Every connection handshakes first (bounded by
   * header_timeout_ms) with this listener TLS (om_http_tls.h: not owned,
   * it must outlive the server). NULL (the default): plaintext. */
  struct om_http_tls_s *tls;
  /* Nonzero: HTTP/2 too (requires stream_bodies). A plaintext connection
   * whose first bytes are the client preface (RFC 9113 3.3, prior
   * knowledge) and a TLS connection that selected "h2" by ALPN become
   * HTTP/2 connections (host/net/om_http2_server.c); each stream is a
   * request with version_major 2, served through the same functions as
   * an HTTP/1.1 request. Zero: such a preface is answered 505. */
  int http2;
  /* Connections taken per readiness of the listening socket. Default 64.
   * Servers on several loops sharing one socket (om_http_listen_socket)
   * want 1, as nginx takes one without multi_accept: every loop's poll
   * wakes and the first to run takes one and returns to its loop, so the
   * others get a chance at a burst (a client opening its pool). Alone it
   * does not level them (the loop already running still wins most: 4
   * and 29 of 33 seen); open_count and on_accept below do. At most 64. */
  size_t accept_batch;
  /* Servers on several loops sharing one socket (workers), to keep their
   * connections level. Non-NULL open_count: the server keeps it at its
   * open connections (relaxed atomic stores, for any thread to read;
   * borrowed: it must outlive the server). Non-NULL on_accept: called
   * with every connection accepted, before the server takes it; nonzero
   * means the callee took fd (handed it to another server's loop, which
   * calls om_http_server_adopt), zero that this server takes it. */
  _Atomic uint32_t *open_count;
  int (*on_accept)(om_http_server_t *srv, int fd, void *ud);
  void *on_accept_ud;
} om_http_server_opts_t;

/*
 * A header field. In a request: name lower-cased, value with OWS trimmed,
 * both NUL-terminated, lengths exact. In a response (passed by the
 * caller): a zero length means "NUL-terminated, use strlen".
 */
typedef struct om_http_header_s {
  const char *name;
  const char *value;
  size_t name_len;
  size_t value_len;
} om_http_header_t;

/*
 * One request, as the handler sees it. Every field is read-only except
 * `user`; every string is NUL-terminated and owned by the server.
 *
 * Lifetime (exactly): the request is valid from the handler call until
 *  (a) om_http_respond, om_http_response_end or om_http_response_abort
 *      returns (whatever it returns), or
 *  (b) the on_close callback returns, when the client went away (EOF,
 *      reset, write error, write stall, server shutdown) before the
 *      response ended.
 * If the client goes away and no on_close is registered, the request stays
 * valid ("orphaned": writes fail with OM_ESTATE) until the holder calls
 * om_http_response_end/abort or om_http_respond, which release it. The
 * server never frees a request behind the back of a holder that has not
 * asked to be told.
 */
typedef struct om_http_request_s {
  const char *method; /* as sent (methods are case-sensitive) */
  size_t method_len;
  const char *target; /* the raw request-target */
  size_t target_len;
  /* The path as sent, NOT percent-decoded (decode per segment after
   * routing, so an encoded "/" stays data): the part of the target before
   * '?'; for absolute-form the path of the URI ("/" when empty); "*" for
   * OPTIONS *, and for OPTIONS with an absolute-form target with neither
   * path nor query (RFC 9112 3.2.4). */
  const char *path;
  size_t path_len;
  const char *query; /* after '?', raw; NULL when the target has no '?' */
  size_t query_len;
  int version_major; /* 1 */
  int version_minor; /* 0 or 1 (1.2 .. 1.9 are read as 1.1) */
  /* In arrival order, duplicates kept. With an absolute-form target the
   * host field's value is the target's authority, whatever Host said
   * (RFC 9112 3.2.2: the server MUST ignore Host then), and an HTTP/1.0
   * request without Host gets a host field with it, last. */
  const om_http_header_t *headers;
  size_t n_headers;
  /* decoded (de-chunked), NUL-terminated; "" if none. Trailer fields are
   * checked like header fields and dropped (RFC 9112 7.1.2 allows it):
   * one that cannot be a trailer (Content-Length, Transfer-Encoding,
   * Host: RFC 9110 6.5.1) is never applied. */
  const char *body;
  size_t body_len;
  struct sockaddr_storage remote;
  char remote_ip[46]; /* numeric, no brackets */
  int remote_port;
  void *user; /* the holder's slot; the server never touches it */
  /* With stream_bodies: 1 when the request has a body to be read through
   * om_http_request_body_start (body is "" then), else 0 (no body, or a
   * small one dispatched whole: see whole_body_max). */
  int body_streamed;
  /* A streamed body's Content-Length; -1 when chunked (not known up
   * front); 0 without a body. */
  int64_t content_length;
  /* -1, or the om_http_reject_t that ended a streamed body (a stall past
   * the body idle timeout: REQUEST_TIMEOUT; bad chunked framing: its
   * reason; a chunk past max_body_bytes: BODY_TOO_LARGE): readable in the
   * on_close callback that tells the holder, after which the server
   * answers it (no response started) or cuts the response. */
  int body_error;
} om_http_request_t;

/*
 * Called once per complete request (header section and the whole body).
 * Requests on one connection are dispatched strictly one at a time, in
 * order: the next is dispatched only after this one's response ended. The
 * handler must eventually end the response (respond, start...end, or
 * abort), synchronously or later from the loop.
 */
typedef void (*om_http_handler_fn)(om_http_request_t *req, void *ud);

/* The client went away before the response ended; see om_http_request_t.
 * Runs from the loop, never from inside an om_http_* call. */
typedef void (*om_http_close_fn)(om_http_request_t *req);

/* The server is closed; srv is readable (metrics) during the call and
 * freed right after it returns. */
typedef void (*om_http_closed_fn)(om_http_server_t *srv, void *ud);

/*
 * om_http_server_new: a server on loop that will call on_request(req, ud).
 * opts may be NULL (defaults). Returns 0 and *out, OM_EINVAL for a NULL
 * argument or a limit out of range (max_header_bytes above 64 KiB or below
 * 64), OM_ENOMEM; on error nothing was allocated and nothing was added to
 * the loop. The server is freed only by om_http_server_close (always, even
 * if it never listened), because it owns libuv handles.
 */
int om_http_server_new(uv_loop_t *loop, const om_http_server_opts_t *opts,
                       om_http_handler_fn on_request, void *ud,
                       om_http_server_t **out);

/*
 * om_http_server_listen: bind host:port and start accepting. host is an
 * IPv4 or IPv6 literal ("127.0.0.1", "::1", "0.0.0.0", "::"); no name
 * resolution. port 0 picks a free port (see om_http_server_port).
 * Returns 0, OM_EINVAL for a bad host or port, OM_ESTATE when already
 * listening or closing, OM_EIO when the socket cannot be bound or listened
 * on (the libuv error is logged as event "http_listen_failed"; the server
 * cannot listen again after that and should be closed).
 */
int om_http_server_listen(om_http_server_t *srv, const char *host, int port);

/*
 * om_http_server_listen_error: why the last om_http_server_listen or
 * om_http_server_listen_fd failed, as libuv words it ("address already in
 * use"), for the message an operator reads; NULL when none failed. The
 * string is static.
 */
const char *om_http_server_listen_error(const om_http_server_t *srv);

/*
 * om_http_listen_socket: a listening TCP socket on host:port (literals as
 * om_http_server_listen; SO_REUSEADDR, not SO_REUSEPORT: a port another
 * process listens on is refused), non-blocking and close-on-exec, for
 * several servers on several loops to accept from (each through its own
 * dup, om_http_server_listen_fd): whichever loop is free takes the next
 * connection. Returns 0 and *fd (the caller's to close); OM_EINVAL (bad
 * host or port), OM_EIO (cannot bind or listen: err says why, as
 * "address already in use"). Nothing is left open on error.
 */
int om_http_listen_socket(const char *host, int port, int *fd, char *err,
                          size_t errlen);

/*
 * om_http_server_listen_fd: start accepting on fd, a socket already bound
 * and listening (om_http_listen_socket, or a dup of one). On success the
 * server owns fd and closes it with itself. Returns 0, OM_EINVAL (NULL
 * srv, negative fd), OM_ESTATE (already listening or closing), OM_EIO
 * (libuv refused the socket: logged, om_http_server_listen_error; the
 * server cannot listen again and should be closed). fd is the server's
 * from the call on, even on error (then closed): never close it after.
 */
int om_http_server_listen_fd(om_http_server_t *srv, int fd);

/*
 * om_http_server_adopt: serve fd, a connection another server of the same
 * socket accepted (opts.on_accept), as if this server had accepted it:
 * counted in connections_accepted, subject to max_connections (a 503 over
 * it) and answered 503 while closing. Call on the server's loop; fd is
 * the server's from the call on.
 */
void om_http_server_adopt(om_http_server_t *srv, int fd);

/* The bound port, or OM_ESTATE when not listening. */
int om_http_server_port(const om_http_server_t *srv);

/*
 * om_http_server_close: stop accepting and close every connection: idle
 * ones at once; one with a response in flight once that response ends
 * (pipelined requests behind it are dropped unanswered, and the response
 * says `Connection: close` if it has not started), or after
 * drain_timeout_ms, when it is cut (on_close runs). on_closed (may be
 * NULL) then runs from the loop and srv is freed after it returns.
 * Returns 0, OM_EINVAL for NULL, OM_ESTATE if already closing (nothing
 * changed). Never calls on_closed synchronously.
 */
int om_http_server_close(om_http_server_t *srv, om_http_closed_fn on_closed);

/* Live counters, valid until on_closed returns. */
const om_http_server_metrics_t *
om_http_server_metrics(const om_http_server_t *srv);

/*
 * om_http_request_header: the value of the first field named name
 * (case-insensitive), NUL-terminated, and its length in *len if len is not
 * NULL; NULL when absent. For repeated fields walk req->headers.
 */
const char *om_http_request_header(const om_http_request_t *req,
                                   const char *name, size_t *len);

/*
 * om_http_respond: the whole response at once. The server adds
 * Content-Length (none for 204 and 304), Date (unless given) and
 * Connection (close when the request or the caller asked for it, the
 * request is HTTP/1.0 without keep-alive, or the server is draining;
 * keep-alive for an HTTP/1.0 keep-alive request). The body is copied if it
 * cannot be written at once. HEAD gets Content-Length: len and no body.
 * Headers must not include Content-Length or Transfer-Encoding; Connection
 * only as "close" (the connection then closes after this response).
 * Returns 0 and releases req; OM_ESTATE when the client is gone (req
 * released all the same); OM_EINVAL (req NOT released, nothing sent) for
 * a status outside 200..599, a body with 204/304, a header that is not a
 * token / has CR, LF, NUL or another CTL in its value, or a forbidden
 * header; OM_ESTATE (not released) if a response was already started.
 * Inside on_close it returns OM_ESTATE and does nothing.
 */
int om_http_respond(om_http_request_t *req, int status,
                    const om_http_header_t *headers, size_t n, const char *body,
                    size_t len);

/*
 * om_http_response_start: send the status and headers of a streamed
 * response. With a Content-Length header the body is exactly that long;
 * otherwise HTTP/1.1 gets Transfer-Encoding: chunked and HTTP/1.0 a
 * close-delimited body (Connection: close). HEAD, 204 and 304 carry no
 * body (writes are accepted and dropped). Returns 0; OM_EINVAL as for
 * om_http_respond (Content-Length allowed, not with 204); OM_ESTATE if
 * already started, or if the client is gone (req is NOT released: end or
 * abort it).
 */
int om_http_response_start(om_http_request_t *req, int status,
                           const om_http_header_t *headers, size_t n);

/*
 * om_http_response_start_checked: om_http_response_start for fields whose
 * bytes the caller has already held to the same rules (names are tokens,
 * values field-content), as om_upstream does for a response head it
 * delivers: the proxy relays them without a second pass over every byte.
 * The framing fields (Content-Length, Transfer-Encoding, Connection) are
 * examined and refused as by om_http_response_start. Passing fields that
 * were not checked this way can split the response: never do it with
 * fields from anywhere else.
 */
int om_http_response_start_checked(om_http_request_t *req, int status,
                                   const om_http_header_t *headers, size_t n);

/*
 * om_http_response_write: append len bytes to a started response (copied
 * if they cannot be written at once; len 0 does nothing). Returns 0,
 * OM_ESTATE when not started or the client is gone, OM_EINVAL when the
 * bytes would exceed a given Content-Length (nothing written). Use
 * om_http_response_pending to bound what a slow client makes you queue.
 */
int om_http_response_write(om_http_request_t *req, const char *data,
                           size_t len);

typedef void (*om_http_release_fn)(void *ud);

/*
 * om_http_response_write_lent: om_http_response_write without the copy,
 * for one large buffer written to many clients (a watch snapshot): what
 * the kernel does not take at once stays queued as a pointer into data,
 * which must stay valid and unchanged until release(ud) is called. That
 * happens exactly once, when the server no longer needs the bytes: after
 * the kernel took them, when the connection goes, or before return (the
 * bytes were written or copied at once, or an error). On TLS and HTTP/2
 * connections, and for small writes gathered into the corked buffer, the
 * bytes are copied and release runs before return. release may be NULL
 * (then this is om_http_response_write). Returns as om_http_response_write.
 */
int om_http_response_write_lent(om_http_request_t *req, const char *data,
                                size_t len, om_http_release_fn release,
                                void *ud);

/*
 * om_http_response_end: finish a started response (the zero chunk for
 * chunked; the connection closes for a close-delimited body) and release
 * req. Returns 0; OM_ESTATE (released all the same) when the client is
 * gone or a Content-Length was not reached (the connection is then cut);
 * OM_ESTATE (not released) if the response was never started. Inside
 * on_close it returns OM_ESTATE and does nothing.
 */
int om_http_response_end(om_http_request_t *req);

/*
 * om_http_response_end_trailers: om_http_response_end with trailer
 * fields (RFC 9110 6.5; n may be 0). Over HTTP/2 they are a HEADERS frame
 * that ends the stream (RFC 9113 8.1; gRPC's grpc-status travels so);
 * over HTTP/1.1 they go in the trailer section of a chunked response
 * when the request's TE lists "trailers" (RFC 9110 10.1.4), and are
 * dropped otherwise (a Content-Length body has no place for them).
 * Fields that frame or route a message (Content-Length,
 * Transfer-Encoding, Host, Trailer, TE, Connection and the other
 * hop-by-hop names) are never sent as trailers (RFC 9110 6.5.1), and a
 * field whose name is not a token or whose value is not field-content
 * is dropped. Returns as om_http_response_end; OM_ENOMEM (the response
 * is cut).
 */
int om_http_response_end_trailers(om_http_request_t *req,
                                  const om_http_header_t *trailers, size_t n);

/*
 * om_http_response_abort: give up on the response and release req. The
 * connection is cut so that the client sees an incomplete message: after
 * the queued bytes a FIN without the terminating zero chunk (chunked) or
 * short of Content-Length, a reset for a close-delimited body, a plain
 * close when nothing was sent. Pipelined requests behind it are dropped.
 * A no-op inside on_close.
 */
void om_http_response_abort(om_http_request_t *req);

/*
 * om_http_response_lend: lend the caller the client's socket, to write
 * the rest of a Content-Length body itself (splice(2) from an upstream:
 * om_splice.h). Only for a streaming HTTP/1.1 response on a plaintext
 * connection, declared with Content-Length, with body bytes left, and
 * nothing of it queued: what is corked is sent first; when the kernel
 * does not take it all, 1 is returned (nothing lent: wait for
 * om_http_response_on_drain with low water 0, then call again). On 0,
 * *fd is the socket and *left the body bytes still owed; until
 * om_http_response_unlend the caller alone writes the socket, and
 * om_http_response_write and _end are refused (OM_ESTATE); reading
 * goes on (a client's close still reaches on_close: stop writing the
 * socket there). om_http_response_abort ends a lent response (the
 * connection closes). OM_EINVAL (NULL); OM_ESTATE (a condition above
 * unmet: write the ordinary way).
 */
int om_http_response_lend(om_http_request_t *req, int *fd, uint64_t *left);

/*
 * om_http_response_lent_progress: bytes of a lent response reached the
 * kernel: the connection's write-progress timeout (idle_timeout_ms, which
 * judges a client that stops reading) restarts, as after a write of its
 * own. While lent and without progress, that timeout closes the
 * connection as it does a stalled queue (on_close runs).
 */
void om_http_response_lent_progress(om_http_request_t *req);

/*
 * om_http_response_unlend: the caller is done writing the lent socket and
 * wrote wrote bytes of the body (at most *left of the lend); the response
 * is the server's again, to write the rest or end. Returns 0; OM_EINVAL
 * (NULL, or more than was owed); OM_ESTATE (not lent).
 */
int om_http_response_unlend(om_http_request_t *req, uint64_t wrote);

/* Bytes of this connection's responses queued in memory, not yet taken by
 * the kernel; 0 when the client is gone. */
size_t om_http_response_pending(const om_http_request_t *req);

/*
 * om_http_request_set_send_buffer: cap the kernel's send buffer of req's
 * connection at about bytes (SO_SNDBUF; Linux doubles the value for its
 * bookkeeping and keeps a floor). For a long stream to a client that may
 * stop reading: past that, output waits in user space where the producer
 * sees it (om_http_response_pending) and can replace what a newer state
 * supersedes, instead of megabytes of stale bytes queued in the kernel.
 * 0, OM_ESTATE when the client is gone, OM_EIO when the kernel refused.
 */
int om_http_request_set_send_buffer(om_http_request_t *req, int bytes);

typedef void (*om_http_drain_fn)(om_http_request_t *req);

/*
 * om_http_response_on_drain: have cb(req) run once, from the loop, when
 * om_http_response_pending(req) falls to low_water or below: the way to
 * resume a producer paused because a slow client let output pile up (no
 * polling). Returns 0 when registered; 1 when pending is already at or
 * below low_water (cb not registered: resume now); OM_ESTATE when the
 * response is not started or the client is gone. A later call replaces
 * cb; NULL unregisters. Never runs after the response ended or aborted.
 */
int om_http_response_on_drain(om_http_request_t *req, size_t low_water,
                              om_http_drain_fn cb);

/*
 * om_http_request_on_close: have cb(req) run if the client goes away
 * before the response ends (see om_http_request_t for the lifetime). A
 * later call replaces cb; NULL unregisters. Returns 0, or OM_ESTATE when
 * the client is already gone (cb not registered; req stays valid).
 */
int om_http_request_on_close(om_http_request_t *req, om_http_close_fn cb);

/* ------------------------------------------------------------------ */
/* upgrades and tunnels */

/*
 * A connection that left HTTP after 101 Switching Protocols (RFC 9110
 * 7.8, 15.2.2): raw bytes both ways, owned by one holder. Both the server
 * (om_http_response_upgrade) and the upstream client
 * (om_upstream_take_tunnel, om_upstream.h) hand connections over as one.
 *
 * The callbacks run from the loop, never from inside an om_tunnel_* call;
 * inside any of them every om_tunnel_* function may be called, on this
 * tunnel or another.
 *
 * on_data (required): bytes from the peer, in order (bytes the peer sent
 *   right behind its HTTP head first); valid only during the call; never
 *   len 0. Not called while paused.
 * on_eof (may be NULL): the peer's FIN: no more data will come; writing
 *   may go on (a half-close, to be carried with om_tunnel_shutdown on the
 *   other leg of a relay).
 * on_drain (may be NULL): what om_tunnel_on_drain asked for.
 * on_close (required): the tunnel ended without om_tunnel_close: err 0
 *   when both directions closed cleanly (the peer's FIN and ours), OM_EIO
 *   for a reset or a failed read or write, OM_ESTATE when the server or
 *   the pool it came from closed. The handle is invalid once it returns.
 */
typedef struct om_tunnel_s om_tunnel_t;
typedef struct om_tunnel_callbacks_s {
  void (*on_data)(void *ud, const char *data, size_t len);
  void (*on_eof)(void *ud);
  void (*on_drain)(void *ud);
  void (*on_close)(void *ud, int err);
} om_tunnel_callbacks_t;

/*
 * om_tunnel_write: queue len bytes after everything written before
 * (copied when the socket does not take them at once). Returns 0;
 * OM_EINVAL (NULL); OM_ESTATE after om_tunnel_shutdown or once the
 * tunnel is failing (on_close follows); OM_ENOMEM (nothing queued). Bound
 * what a slow peer makes you queue with om_tunnel_pending.
 */
int om_tunnel_write(om_tunnel_t *t, const char *data, size_t len);

/*
 * om_tunnel_shutdown: half-close: our FIN once the queued bytes are out;
 * reading goes on. When the peer's FIN came too the tunnel ends cleanly
 * (on_close with 0). Idempotent. Returns 0, OM_EINVAL, or OM_ESTATE when
 * the tunnel is failing.
 */
int om_tunnel_shutdown(om_tunnel_t *t);

/* om_tunnel_pause / om_tunnel_resume: stop and restart reading (TCP then
 * pushes back on the peer). Idempotent. 0, or OM_EINVAL for NULL. */
int om_tunnel_pause(om_tunnel_t *t);
int om_tunnel_resume(om_tunnel_t *t);

/* Bytes written and not yet taken by the kernel; 0 for NULL. */
size_t om_tunnel_pending(const om_tunnel_t *t);

/*
 * om_tunnel_on_drain: have on_drain run once, from the loop, when
 * om_tunnel_pending falls to low_water or below. Returns 0 when armed, 1
 * when pending is already there (not armed), OM_EINVAL for NULL.
 */
int om_tunnel_on_drain(om_tunnel_t *t, size_t low_water);

/*
 * om_tunnel_close: end the tunnel now: queued bytes are flushed when they
 * can be at once, then FIN (reset: RST, queued bytes dropped). No callback
 * runs after this returns and the handle is invalid. NULL does nothing.
 */
void om_tunnel_close(om_tunnel_t *t, int reset);

/*
 * om_http_request_is_upgrade: nonzero when req asked to switch protocols
 * (an Upgrade field and "upgrade" among its Connection options, no body)
 * and is the last request the server parsed on its connection: nothing
 * behind it has been read as HTTP, so om_http_response_upgrade can hand
 * the connection over. Any other response ends the upgrade attempt and
 * the connection goes on as HTTP.
 */
int om_http_request_is_upgrade(const om_http_request_t *req);

/*
 * om_http_response_upgrade: answer 101 Switching Protocols with headers
 * (the Upgrade field included: RFC 9110 7.8 makes it the caller's choice
 * of protocol; `Connection: upgrade` is added; Connection,
 * Content-Length and Transfer-Encoding must not be given), then hand the
 * connection over as a tunnel with callbacks cb and ud: bytes the client
 * sent behind its request head are the tunnel's first data. req is
 * released. The connection counts in connections_active until the tunnel
 * ends, and in the upgrades counter. Returns 0 and *out; OM_EINVAL (req
 * not an upgrade request, a bad header, a NULL argument; nothing sent,
 * req not released); OM_ESTATE (a response already started, or the
 * client is gone: req not released, end or abort it); OM_ENOMEM (req not
 * released).
 */
int om_http_response_upgrade(om_http_request_t *req,
                             const om_http_header_t *headers, size_t n,
                             const om_tunnel_callbacks_t *cb, void *ud,
                             om_tunnel_t **out);

/* ------------------------------------------------------------------ */
/* streamed request bodies (stream_bodies) */

/* Body bytes, de-chunked; data is the server's and valid only during the
 * call. The holder may pause, respond, end or abort from inside it. */
typedef void (*om_http_body_fn)(om_http_request_t *req, const char *data,
                                size_t len);

/* The streamed body ended whole (trailers are checked and dropped). The
 * holder may respond from inside it. */
typedef void (*om_http_body_end_fn)(om_http_request_t *req);

/*
 * A reference on the server's read buffer that holds body bytes, so a
 * holder can keep a span past on_data (queue it for a write, hold it for
 * a replay) without copying it: while any reference is out the server
 * never moves, overwrites or frees the bytes it covers, and reads into a
 * fresh buffer once the held one is full. The count is not atomic: refs
 * are taken and released on the server's loop only. The reference
 * outlives the request and the connection alike.
 */
typedef struct om_http_body_ref_s om_http_body_ref_t;

/* Inside on_data only: a new reference on the buffer that holds the span
 * just handed (data .. data + len stay valid until it is released). NULL
 * outside on_data, for NULL, or for a request whose client is gone. */
om_http_body_ref_t *om_http_request_body_ref(om_http_request_t *req);

/* One more reference on ref (NULL does nothing). */
void om_http_body_ref_retain(om_http_body_ref_t *ref);

/* Drop one reference; the last one frees the buffer. NULL does nothing. */
void om_http_body_ref_release(om_http_body_ref_t *ref);

/*
 * om_http_request_body_start: begin delivering a streamed body: on_data
 * per span as bytes arrive, then on_end once. Delivery runs from the loop,
 * never from inside this call. An HTTP/1.1 request with
 * "Expect: 100-continue" gets its 100 Continue now, and only now (RFC 9110
 * 10.1.1: a holder that answers without reading never invites the body).
 * From this call on the body is under the body idle timeout (see
 * om_http_request_body_idle_timeout): a stall past it ends the request
 * with body_error REQUEST_TIMEOUT (408 when no response started, else the
 * response is cut). Returns 0; OM_EINVAL for NULL callbacks; OM_ESTATE
 * (nothing changed) when the request has no streamed body, it was started
 * already, or the client is gone.
 *
 * A response ended before the body was read whole is legal (an early 413,
 * or an upstream that answers before the upload ends): it says
 * Connection: close, and after it the server reads and drops what the
 * client keeps sending, up to 64 MiB, 30 s in all, or 2 s without a
 * byte, whichever comes first, then closes (RFC 9112 9.6, as nginx's
 * lingering_close), so a client that did not send Expect reads the
 * answer, not a reset.
 */
int om_http_request_body_start(om_http_request_t *req, om_http_body_fn on_data,
                               om_http_body_end_fn on_end);

/* Stop delivering body bytes (reading the socket stops; the body idle
 * timer stops: the holder's wait is not the client's stall). Callable
 * from inside on_data. No-op unless the body is being delivered. */
void om_http_request_body_pause(om_http_request_t *req);

/* Deliver again after a pause, from the loop (bytes already read first).
 * No-op unless paused. */
void om_http_request_body_resume(om_http_request_t *req);

/* The body idle timeout of this request: how long a started, unpaused
 * body may go without a byte. Default the server's idle_timeout_ms;
 * 0 keeps it. Returns 0, OM_EINVAL for NULL or a value over UINT32_MAX. */
int om_http_request_body_idle_timeout(om_http_request_t *req, uint64_t ms);

/*
 * om_http_request_body_lend: lend the caller the client's socket, to read
 * the rest of a streamed Content-Length body itself (splice(2) into an
 * upstream: om_splice.h). Only for an HTTP/1.1 request on a plaintext
 * connection whose body delivery started (om_http_request_body_start),
 * with bytes of it still to come, none of them in the read buffer (call
 * it after the on_data that emptied it), and no FIN from the client yet.
 * *fd is the socket and *left the body bytes still to come; nothing reads
 * the socket here until om_http_request_body_unlend. The body idle
 * timeout keeps running (restarted by om_http_request_body_lent_progress)
 * and ends the request as usual (on_close). Returns 0; OM_EINVAL (NULL);
 * OM_ESTATE (a condition above unmet: go on the ordinary way).
 */
int om_http_request_body_lend(om_http_request_t *req, int *fd, uint64_t *left);

/* om_http_request_body_lent_progress: bytes of a lent body were read: the
 * body idle timeout restarts. */
void om_http_request_body_lent_progress(om_http_request_t *req);

/*
 * om_http_request_body_unlend: the caller read taken bytes of the body
 * (at most *left of the lend) from the lent socket and gives it back:
 * delivery goes on from the rest (from the loop; a pause stays), and when
 * nothing was left on_end follows from the loop. Returns 0; OM_EINVAL
 * (NULL, or more than was left); OM_ESTATE (not lent). After on_close
 * (the client went away) it only ends the lend.
 */
int om_http_request_body_unlend(om_http_request_t *req, uint64_t taken);

#endif /* OM_HTTP_SERVER_H */
