/*
 * om_upstream.h: the proxy's upstream HTTP/1.1 client, on one libuv loop.
 *
 * Why not libcurl: a bare libcurl multi client costs ~31 us of CPU per
 * request on the reference machine, and the proxy's whole budget is 35 us
 * (its CPU bar). This client does only what the data plane needs: HTTP/1.1 over
 * plain TCP to numeric addresses, a keep-alive pool per peer, buffered
 * request bodies, streamed response bodies. libcurl stays for watches and
 * model calls (TLS, HTTP/2, names).
 *
 * Cost model (the hot path after warm-up, a request on a pooled
 * connection): no allocation (request objects and their buffers are
 * recycled, connections keep their read buffer), one write syscall for the
 * whole request (head and body in one writev via uv_try_write; uv_write
 * only takes over a short write), responses parsed in the connection's read
 * buffer and body bytes handed to on_body in place, never copied.
 *
 * Framing is strict (RFC 9112), as in om_http_server.h: a response whose
 * framing two implementations could read differently is refused
 * ("malformed"), never repaired, and its connection is never reused.
 * Every response is read once, by the HTTP/1.1 framing module the server
 * shares (core/om_http1.h); http-parser 2.9 is its differential oracle in
 * the tests (tests/test_http1_fuzz.c), not a second parse.
 *
 * Refused as malformed (RFC 9112 unless noted): a status line other than
 * `HTTP/1.0` or `HTTP/1.1` SP 3DIGIT (100..599) [SP reason] (4; the SP
 * before an empty reason may be omitted: it does not change framing); a
 * bare CR or a bare LF anywhere in the head (2.2); whitespace before the
 * first field line (2.2); obs-fold (5.2: a proxy MUST either replace it or
 * discard the message with a 502; we discard); a field name that is not a
 * token or whitespace before the colon (5.1); a CTL, NUL or DEL in a value
 * (RFC 9110 5.5); Content-Length not 1*DIGIT, over 2^63-1, or present more
 * than once, even with equal values (6.3 item 5; RFC 9110 8.6 allows
 * merging equal values, we do not); Content-Length with Transfer-Encoding
 * (6.3 item 3); Transfer-Encoding other than exactly `chunked` (a final
 * non-chunked coding would make the body close-delimited, 6.3 item 4,
 * which the proxy cannot re-frame) or in an HTTP/1.0 response (6.1); a
 * chunk-size that is not 1*HEXDIG or exceeds 2^63-1, a malformed
 * chunk-ext, a chunk line over 4 KiB, chunk-data not followed by CRLF, a
 * malformed trailer field, or a Content-Length among the trailers that is
 * not one 1*DIGIT (7.1); 101 Switching Protocols to a request that did
 * not ask to upgrade, or without an Upgrade field (RFC 9110 15.2.2); a
 * head larger than max_header_bytes or with
 * more than max_headers fields (OM_ETOOBIG). Other 1xx responses (100,
 * 102, 103) are read and skipped (RFC 9110 15.2). Responses to HEAD, and
 * 1xx, 204 and 304 responses, have no body whatever their framing fields
 * say (6.3 items 1-2); the fields are still checked.
 *
 * Connection reuse: only after a complete response, when the response is
 * HTTP/1.1 without `Connection: close`, the whole request was written, and
 * no byte followed the response. HTTP/1.0 responses, close-delimited
 * bodies and every failure close the connection. An idle pooled connection
 * keeps reading: an EOF or any unsolicited byte closes it.
 *
 * Stale keep-alive (the server closed an idle connection just as we reused
 * it): when a request sent on a pooled connection sees EOF, a reset or a
 * write error before any response byte, it is re-sent ONCE on a fresh
 * connection, transparently, only if the caller set retry_stale (it knows
 * whether the request is safe to repeat: an idempotent method, an
 * Idempotency-Key, a policy opt-in, a body it can replay), or if the first
 * write failed at once so that provably nothing left. Otherwise the
 * failure is reported as "reset_before_response" with res.sent = 1 and
 * res.reused = 1, and the caller decides: the server may have read the
 * request, even acted on it. nginx (proxy_next_upstream without
 * non_idempotent) and Envoy (reset-before-request retries only where the
 * route's retry policy allows) draw the same line; Go's net/http transport
 * too, honouring Idempotency-Key.
 *
 * Upgrades (RFC 9110 7.8): a request with `upgrade` set is sent with
 * that Upgrade field and `Connection: upgrade`, and never re-sent
 * transparently. A 101 answer is handed to on_headers, which takes the
 * connection as a raw tunnel with om_upstream_take_tunnel (bytes behind
 * the head included); such a connection is never pooled. Any other answer
 * is an ordinary response.
 *
 * TLS (a target with tls set: an https:// peer): the connection is TCP,
 * then a TLS handshake over om_tls.h's engine, before the request is
 * written; reads are decrypted into the same read buffer and parsed the
 * same way, writes are encrypted. The connect timeout (and a head
 * timeout) covers TCP and the handshake together. Where the TLS context
 * comes from: the request's tls_ctx, else the pool's (opts.tls_ctx),
 * else one the pool makes on first use (the system CA store, verifying);
 * so a proxy builds a context per distinct policy setting and passes it
 * per request. SNI and the name verified are the target's host (an IP
 * literal is verified against the certificate's IP addresses, without
 * SNI). Pooled connections are keyed by address, host and context, so a
 * TLS connection is only reused for the same name and the same trust;
 * new connections resume the last session of the same address and name
 * (res.tls_handshake 2). A handshake or verification failure is a
 * connect failure of that peer: "connect", res.sent 0, res.tls_fail the
 * class and res.detail its reason ("certificate verify failed: hostname
 * mismatch"). A 101 over TLS is tunnelled through the connection's engine
 * (om_upstream_take_tunnel). The plaintext path is unchanged and pays nothing
 * for TLS but a key compare.
 *
 * HTTP/2 (om_upstream_request_t.http2; host/net/om_upstream_h2.c, an
 * nghttp2 client session per connection): a request is a stream on a
 * connection of its peer that has room (the peer's concurrent-stream
 * limit, at most 100 of ours), else on a new one; an idle connection
 * (no stream) closes after idle_timeout_ms. The callbacks, timeouts,
 * pause/resume and streamed bodies behave as for HTTP/1.1, with these
 * differences: the request goes out as HEADERS (:method, :scheme,
 * :authority from Host or the target, :path; names lower-cased; the
 * hop-by-hop fields dropped, `te: trailers` kept) and DATA frames; the
 * response's trailer fields reach on_trailers; a paused stream's bytes
 * wait in the request (at most one stream window, 256 KiB) and its
 * window is given back only as they are delivered, so a slow caller
 * holds back its own stream, not the connection's others. Failures
 * map to the same classes: a stream the server refused (RST_STREAM
 * REFUSED_STREAM, or beyond a GOAWAY's last stream: RFC 9113 8.7, not
 * processed) ends "reset_before_response" with sent 0, safe to retry
 * whatever the method; a reset or a lost connection after the
 * HEADERS went out, sent 1; after the head, "reset_mid_body"; a
 * response head over max_header_bytes (name + value + 32 per field,
 * RFC 9113 6.5.2) or max_headers, or a protocol error, "malformed".
 *
 * Threading: everything runs on the loop thread. The process must ignore
 * SIGPIPE (libuv writes with writev; a peer reset would kill the process).
 */
#ifndef OM_UPSTREAM_H
#define OM_UPSTREAM_H

#include <stddef.h>
#include <stdint.h>

#include <netinet/in.h>
#include <uv.h>

#include "om_http_server.h" /* om_http_header_t */
#include "om_tls.h"

typedef struct om_upstream_pool_s om_upstream_pool_t;
typedef struct om_upstream_req_s om_upstream_req_t;

/* ------------------------------------------------------------------ */
/* peers */

/*
 * A peer URL split by om_upstream_parse_url. host is the URL's host as
 * written (an IP literal without brackets, or a DNS name), NUL-terminated;
 * path_prefix points into the URL ("" when the URL has no path; never
 * includes a query).
 */
typedef struct om_upstream_url_s {
  char host[254];
  int tls;  /* https:// */
  int port; /* 80 (443 for https) when the URL gives none */
  const char *path_prefix;
  size_t path_prefix_len;
} om_upstream_url_t;

/*
 * om_upstream_parse_url: split a peer URL by the mesh's one URL rule
 * (core/om_url.h, om_url_parse: http or https, an IPv4 or IPv6 literal or
 * a DNS name, a port, a path prefix; no userinfo, query or fragment).
 * Nothing is resolved here: a name is for the caller to resolve.
 * Returns 0 and fills *out; OM_EINVAL for a NULL url or out; OM_EPARSE
 * with *why (if why is not NULL) set to om_url_parse's static reason. On
 * error *out is unspecified.
 */
int om_upstream_parse_url(const char *url, om_upstream_url_t *out,
                          const char **why);

/*
 * Where a request goes: a numeric socket address and the authority the
 * client sends as Host when the caller gives none. A plain value: copy
 * it, keep it in a snapshot; the pool keys its connections by the address.
 */
typedef struct om_upstream_target_s {
  union {
    struct sockaddr sa;
    struct sockaddr_in in4;
    struct sockaddr_in6 in6;
  } addr;
  /* the Host the client sends when the caller gives none: "127.0.0.1:9001",
   * "[::1]:9001", "web-4.internal:8080"; no ":80" (no ":443" for TLS) */
  char authority[264];
  /* nonzero: the connection is TLS (an https:// peer) */
  int tls;
  /* with tls: the URL's host as written, without brackets: a DNS name
   * (sent as SNI, RFC 6066 section 3, and matched against the
   * certificate's DNS names) or an IP literal (no SNI; matched against its
   * IP addresses, RFC 6125); "" otherwise */
  char host[254];
} om_upstream_target_t;

/*
 * om_upstream_target_init: a target for host (a numeric IPv4 literal or
 * an IPv6 literal, without brackets, as in om_upstream_url_t) and port
 * 1..65535. The authority omits the port when it is 80 (RFC 9110 4.2.1,
 * RFC 3986 6.2.3). Returns 0; OM_EINVAL (NULL, a host that is not a
 * numeric literal, a port out of range), *t then unspecified.
 */
int om_upstream_target_init(om_upstream_target_t *t, const char *host,
                            int port);

/*
 * om_upstream_target_from_url: a target for a peer URL (the rule of
 * om_upstream_parse_url). authority is the URL's host and port, without
 * the scheme's default port (":80", ":443"); tls and host are set for
 * https. For an IP literal the address is set and 0 is returned. For a
 * DNS name everything but the address is set (its family is AF_UNSPEC,
 * which om_upstream_send refuses) and OM_ENOTFOUND is returned: the
 * caller resolves the name and fills addr (the port in network order).
 * The path prefix, if any, is for the caller to put in front of request
 * targets. OM_EINVAL for NULL; OM_EPARSE with *why as for parse_url.
 */
int om_upstream_target_from_url(om_upstream_target_t *t, const char *url,
                                const char **why);

/* ------------------------------------------------------------------ */
/* the pool */

/*
 * Pool options. Zero in any field means its default, so `{0}` and NULL are
 * the defaults.
 */
typedef struct om_upstream_pool_opts_s {
  /* Idle keep-alive connections kept per peer for requests that set no
   * limit of their own (om_upstream_request_t.max_idle_per_peer);
   * returning one more closes the least recently used. Default 32. */
  size_t max_idle_per_peer;
  /* An idle connection is closed after this long, unless its latest
   * request said otherwise. Default 60 s. */
  uint64_t idle_timeout_ms;
  /* The response head (status line, fields, the empty line, and every 1xx
   * head before it), and separately a trailer section. Default and
   * maximum 64 KiB, at least 256. */
  size_t max_header_bytes;
  /* Fields in a response head. Default 100, at most 10000. */
  size_t max_headers;
  /* Each connection's read buffer; it grows (rarely, once) only to hold a
   * head, trailer section or chunk line larger than this. Larger reads
   * mean fewer syscalls for large bodies. Default 16 KiB, at least 1 KiB. */
  size_t read_buffer_bytes;
  /* Peers remembered (with their counters). Beyond it a peer with no
   * connection and no request is forgotten to make room. Default 4096. */
  size_t max_peers;
  /* The client TLS context for https:// targets of requests that carry
   * none (the pool takes a reference); NULL: one made on first use, the
   * system CA store, verifying. */
  om_tls_ctx_t *tls_ctx;
  /* Requests a connection carries before it is closed instead of pooled,
   * for requests that set no limit of their own. Default 0: no limit. */
  uint64_t max_requests_per_connection;
} om_upstream_pool_opts_t;

/*
 * Counters of one peer, or of the whole pool. Gauges (active, idle) are
 * connections now; the rest count since the peer was first used.
 */
typedef struct om_upstream_stats_s {
  uint64_t active;         /* connections carrying a request (connecting too) */
  uint64_t idle;           /* connections in the pool */
  uint64_t connects;       /* connection attempts started */
  uint64_t reuses;         /* attempts sent on a pooled connection */
  uint64_t requests;       /* requests started (om_upstream_send returned 0) */
  uint64_t failures;       /* requests that ended with an upstream failure:
                              every class but aborted, closed, internal and
                              local */
  uint64_t retries;        /* transparent stale keep-alive retries */
  uint64_t tls_handshakes; /* TLS handshakes completed (resumed too) */
  uint64_t tls_resumed;    /* of those, sessions resumed */
  uint64_t tls_failures;   /* TLS handshakes that failed */
  /* pooled connections closed because the peer's idle list was over the
   * returning request's max_idle_per_peer (the oldest go first) */
  uint64_t idle_evicted;
  /* connections closed after max_requests_per_connection requests */
  uint64_t retired;
} om_upstream_stats_t;

/*
 * om_upstream_pool_new: a pool on loop (which must outlive it). opts may
 * be NULL. Returns 0 and *out; OM_EINVAL for a NULL loop or out, or an
 * option out of range; OM_ENOMEM. On error nothing was allocated and
 * nothing was added to the loop. The pool owns a libuv handle, so it is
 * freed only by om_upstream_pool_close (always, even if never used).
 */
int om_upstream_pool_new(uv_loop_t *loop, const om_upstream_pool_opts_t *opts,
                         om_upstream_pool_t **out);

/* The pool is closed; it is freed right after this returns. */
typedef void (*om_upstream_closed_fn)(void *ud);

/*
 * om_upstream_pool_close: close every connection at once. Each request in
 * flight ends with on_done ("closed", OM_ESTATE), from the loop, after
 * this returns; then on_closed(ud) (may be NULL) runs and the pool is
 * freed. From then on om_upstream_send returns OM_ESTATE. Callable from
 * inside any callback of this pool. Returns 0; OM_EINVAL (NULL);
 * OM_ESTATE when already closing (nothing changed). Never calls anything
 * synchronously.
 */
int om_upstream_pool_close(om_upstream_pool_t *pool,
                           om_upstream_closed_fn on_closed, void *ud);

/*
 * om_upstream_pool_stats: the pool's totals into *out. Returns 0, or
 * OM_EINVAL for NULL.
 */
int om_upstream_pool_stats(const om_upstream_pool_t *pool,
                           om_upstream_stats_t *out);

/*
 * om_upstream_peer_stats: the counters of the peer at target's address.
 * Returns 0; OM_EINVAL (NULL); OM_ENOTFOUND when the pool has never sent
 * to it (or forgot it, see max_peers). *out is untouched on error.
 */
int om_upstream_peer_stats(const om_upstream_pool_t *pool,
                           const om_upstream_target_t *target,
                           om_upstream_stats_t *out);

/* ------------------------------------------------------------------ */
/* requests */

/*
 * One request. Every pointer is the caller's and only read during
 * om_upstream_send, except body, which must stay valid and unchanged until
 * the request ends (on_done returns or om_upstream_cancel returns): a
 * short write, and a transparent retry, send it again from there.
 */
typedef struct om_upstream_request_s {
  const char *method; /* a token; CONNECT is refused */
  size_t method_len;  /* 0: NUL-terminated */
  /* origin-form, raw: "/path?query" (RFC 9112 3.2.1), or "*" with
   * OPTIONS; RFC 3986 characters and valid %-escapes only */
  const char *target;
  size_t target_len; /* 0: NUL-terminated */
  /*
   * Header fields to send, in order (a zero length means NUL-terminated,
   * as for om_http_respond). Names must be tokens; values must not hold
   * CR, LF, NUL or another CTL but HTAB. Never sent: the hop-by-hop fields
   * (Connection, Keep-Alive, Proxy-Connection, TE, Trailer,
   * Transfer-Encoding, Upgrade) and every field named in a Connection
   * field (RFC 9110 7.6.1), and Content-Length (the client frames the
   * body itself). Host is added (the target's authority) when absent.
   * The server's request headers can be passed as they are.
   */
  const om_http_header_t *headers;
  size_t n_headers;
  /* The body, sent with Content-Length (also `Content-Length: 0` for an
   * empty POST, PUT or PATCH, RFC 9110 8.6). */
  const char *body;
  size_t body_len;
  /* Timeouts in ms, 0 = none. connect: until the TCP connection is
   * established. first_byte: from the start of the request write until
   * the response head is complete (1xx heads do not stop it). total: from
   * om_upstream_send to the end of the response, retry included, pauses
   * included. */
  uint64_t connect_timeout_ms;
  uint64_t first_byte_timeout_ms;
  uint64_t timeout_ms;
  /* Timeout in ms, 0 = none: from om_upstream_send until the response
   * head is complete, connect included (a stale keep-alive retry too), so
   * one bound covers the whole wait for a head without bounding the body:
   * a proxy's per-try timeout. It fails as TIMEOUT_CONNECT while
   * connecting, else as TIMEOUT_FIRST_BYTE. */
  uint64_t head_timeout_ms;
  /* The caller vouches that every header name is a token and every value
   * field-content (they were parsed by om_http_server, or built by the
   * caller): the per-byte checks are skipped, the hop-by-hop rules kept. */
  int headers_valid;
  /* Nonzero: the request is safe to send twice (a safe or idempotent
   * method, an Idempotency-Key, an opt-in), so a stale pooled connection
   * that closes under it before any response byte re-sends it once on a
   * fresh connection (res.attempts 2). Zero: that failure is reported
   * (reset_before_response, sent 1, reused 1) for the caller's own rules.
   * Either way a request whose first write failed with nothing written is
   * re-sent: no server saw it. */
  int retry_stale;
  /* The Upgrade field to send (RFC 9110 7.8: a token list, e.g.
   * "websocket"; field-content), with `Connection: upgrade`; NULL or ""
   * for none. The Upgrade field in headers is never sent either way. */
  const char *upgrade;
  size_t upgrade_len; /* 0: NUL-terminated */
  /* Nonzero: the body is streamed: body must be NULL and body_len 0, and
   * the caller supplies the bytes as they come with om_upstream_body_write
   * and ends them with om_upstream_body_end (see there). body_stream_length
   * is the length when it is known up front (sent as Content-Length, and
   * the bytes must add up to it), or -1 (sent chunked). */
  int body_stream;
  int64_t body_stream_length;
  /* The client TLS context for a tls target (borrowed: connections take
   * their own reference); NULL: the pool's. Ignored for plain targets. */
  om_tls_ctx_t *tls_ctx;
  /* The name a tls target must prove (SNI and verification) instead of
   * its host: a URL by address to a certificate for a name. NULL or "":
   * the host. Connections are pooled per name, so this is part of the
   * key too. At most 253 bytes (OM_EINVAL beyond). */
  const char *tls_server_name;
  /*
   * Keep-alive limits for the connection that carries this request,
   * applied when it goes back to the pool; 0 in any field: the pool's
   * option. A pool serves every caller of a peer key (address, server
   * name, TLS context), whose limits may differ, so each request carries
   * its own: a connection given back is kept when, with it, the peer key
   * holds at most max_idle_per_peer idle connections (beyond that the
   * least recently used are closed); it is closed after idle_timeout_ms
   * idle (at most 2^62); once it carried max_requests_per_connection
   * requests (this one included) it is closed instead of pooled.
   */
  size_t max_idle_per_peer;
  uint64_t idle_timeout_ms;
  uint64_t max_requests_per_connection;
  /*
   * Nonzero: HTTP/2 (RFC 9113) instead of HTTP/1.1: prior knowledge
   * (h2c) to a plain target, "h2" by ALPN to a tls target (a server that
   * does not select it fails the connect: "no h2 by ALPN"). Requests to
   * one peer share its connections, up to the peer's
   * SETTINGS_MAX_CONCURRENT_STREAMS (and at most 100) streams on each;
   * see "HTTP/2" above. An upgrade is refused (OM_EINVAL); retry_stale
   * and max_requests_per_connection do not apply.
   */
  int http2;
} om_upstream_request_t;

/*
 * om_upstream_peer_stats_for: the counters of the peer key a request q
 * to target would use (its tls_ctx and tls_server_name, for a tls
 * target; the pool's context when q gives none): a TLS peer reached with
 * a caller's own context is a key of its own, which om_upstream_peer_stats
 * does not find. q may be NULL (the pool's defaults). Returns as
 * om_upstream_peer_stats.
 */
int om_upstream_peer_stats_for(const om_upstream_pool_t *pool,
                               const om_upstream_target_t *target,
                               const om_upstream_request_t *q,
                               om_upstream_stats_t *out);

/*
 * A response head, as on_headers sees it. Valid only during on_headers
 * (it points into the connection's read buffer): copy what you keep.
 * Strings are NUL-terminated, lengths exact.
 */
typedef struct om_upstream_response_s {
  int status; /* 200..599 (1xx are skipped), or 101 to an upgrade request */
  int version_minor; /* 0 or 1 */
  const char *reason;
  size_t reason_len;
  /*
   * The end-to-end fields, in arrival order, names as sent (not
   * lower-cased), values with OWS trimmed. Removed: the hop-by-hop fields
   * listed for requests and those named in Connection. Content-Length
   * stays (it is end-to-end; the body is de-chunked either way).
   */
  const om_http_header_t *headers;
  size_t n_headers;
  /* body bytes may follow: 0 for a response to HEAD, 1xx/204/304 and
   * Content-Length: 0 (on_done then follows on_headers at once) */
  int has_body;
  /* the body length when it is fixed (Content-Length); -1 for a chunked
   * or close-delimited body; 0 when has_body is 0 */
  int64_t content_length;
  /* with status 101: the Upgrade field's value (the protocol switched
   * to), NUL-terminated; NULL otherwise */
  const char *upgrade;
  size_t upgrade_len;
} om_upstream_response_t;

/*
 * Why a request failed: XX(name, reason string, error code). The reason
 * strings are stable (logs, metrics, the proxy's retry rules).
 *
 * - CONNECT: the connection could not be established (refused,
 *   unreachable, no file descriptors, ...). Nothing was sent: any method
 *   may be retried elsewhere.
 * - TIMEOUT_CONNECT: connect_timeout_ms passed while connecting. Nothing
 *   was sent.
 * - RESET_BEFORE_RESPONSE: the connection closed or was reset, or the
 *   write failed, before the response head was complete. With res.sent 1
 *   (part of) the request left: the server may have received, even
 *   processed, it: retry only what is idempotent. With res.sent 0 (a
 *   fresh connection refused our first write) nothing left.
 * - TIMEOUT_FIRST_BYTE: first_byte_timeout_ms passed before the response
 *   head was complete.
 * - TIMEOUT_TOTAL: timeout_ms passed (in any phase; see res->sent and
 *   res->headers_delivered for which).
 * - MALFORMED: the response broke the framing rules above (OM_EPARSE), or
 *   exceeded max_header_bytes / max_headers (OM_ETOOBIG).
 * - RESET_MID_BODY: the connection closed or was reset after the head,
 *   before the body's end (Content-Length not reached, no last chunk; a
 *   reset, not a FIN, for a close-delimited body). A committed stream
 *   broke: never replay it.
 * - ABORTED: on_headers returned nonzero.
 * - CLOSED: om_upstream_pool_close ended the request.
 * - INTERNAL: out of memory mid-flight (growing a buffer).
 * - LOCAL: this process could not make the connection for want of its own
 *   resources (EMFILE, ENFILE, ENOBUFS, ENOMEM, EADDRNOTAVAIL: no
 *   descriptor, buffer or ephemeral port). Nothing was sent (sent = 0) and
 *   it says nothing about the peer: never count it against the peer's
 *   health. res->os_err holds the libuv code.
 */
#define OM_UPSTREAM_FAIL_MAP(XX)                                               \
  XX(CONNECT, "connect", OM_EIO)                                               \
  XX(TIMEOUT_CONNECT, "timeout_connect", OM_EDEADLINE)                         \
  XX(RESET_BEFORE_RESPONSE, "reset_before_response", OM_EIO)                   \
  XX(TIMEOUT_FIRST_BYTE, "timeout_first_byte", OM_EDEADLINE)                   \
  XX(TIMEOUT_TOTAL, "timeout_total", OM_EDEADLINE)                             \
  XX(MALFORMED, "malformed", OM_EPARSE)                                        \
  XX(RESET_MID_BODY, "reset_mid_body", OM_EIO)                                 \
  XX(ABORTED, "aborted", OM_ESTATE)                                            \
  XX(CLOSED, "closed", OM_ESTATE)                                              \
  XX(INTERNAL, "internal", OM_ENOMEM)                                          \
  XX(LOCAL, "local_resources", OM_EIO)

typedef enum {
  OM_UPSTREAM_OK = 0,
#define OM__UPSTREAM_FAIL_ENUM(name, reason, err) OM_UPSTREAM_FAIL_##name,
  OM_UPSTREAM_FAIL_MAP(OM__UPSTREAM_FAIL_ENUM)
#undef OM__UPSTREAM_FAIL_ENUM
      OM_UPSTREAM_FAIL__COUNT
} om_upstream_fail_t;

/* The reason string of a class ("ok" for OM_UPSTREAM_OK, "unknown" out of
 * range). Never NULL; static. */
const char *om_upstream_fail_name(om_upstream_fail_t fail);

/*
 * How a request ended, as on_done sees it (valid during on_done only).
 */
typedef struct om_upstream_result_s {
  /* 0: the response ended cleanly, its framing respected (Content-Length
   * reached, last chunk and trailer section read, or the FIN of a
   * close-delimited body). Else the class's code (OM_EIO, OM_EDEADLINE,
   * OM_EPARSE, OM_ETOOBIG, OM_ESTATE, OM_ENOMEM). */
  int err;
  om_upstream_fail_t fail;
  const char *reason; /* om_upstream_fail_name(fail) */
  /* a static human-readable detail for logs ("connection refused",
   * "obs-fold in the response head", ...); "" when err is 0 */
  const char *detail;
  /* 0 when provably no byte of the request left this process on any
   * attempt: the failure came before the connection was up (connect
   * refused, connect timeout, address errors, a total timeout while
   * connecting) or the first write was refused with nothing written.
   * Safe to retry whatever the method. 1 as soon as a write took a byte
   * or was queued. */
  int sent;
  int headers_delivered; /* on_headers ran: the response is committed */
  int reused;            /* the last attempt ran on a pooled connection */
  unsigned attempts;     /* 1, or 2 after a stale keep-alive retry */
  uint64_t body_bytes;   /* delivered to on_body */
  int upgraded; /* a 101 whose connection om_upstream_take_tunnel took */
  /* the libuv error code (negative errno) behind a CONNECT or LOCAL
   * failure; 0 otherwise */
  int os_err;
  /* a CONNECT failure in the TLS handshake: its class (om_tls_fail_t,
   * detail is its reason); 0 otherwise */
  int tls_fail;
  /* the last attempt's connection made a TLS handshake: 1 full, 2
   * resumed; 0 for a pooled or plain connection */
  int tls_handshake;
  /* connections this request opened (a stale keep-alive retry's
   * included) and the pooled ones it was sent on: what a caller counts to
   * see whether its pool reuses */
  unsigned connects, reuses;
} om_upstream_result_t;

/*
 * The callbacks of one request; the struct is copied by om_upstream_send.
 * They run from the loop, never from inside an om_upstream_* call. Inside
 * any of them every om_upstream_* function may be called (send more,
 * cancel this or another request, pause, resume, close the pool).
 *
 * on_headers (may be NULL: continue): the final response head arrived
 *   (or a 101 to an upgrade request: take its tunnel here, or the
 *   request ends "aborted").
 *   Return 0 to go on, nonzero to abort: the connection is closed and
 *   on_done follows at once with "aborted" (unless om_upstream_cancel was
 *   called inside, then nothing follows).
 * on_body (may be NULL: discard): body bytes, de-chunked, as they arrive,
 *   in order; data is valid only during the call. Never called with
 *   len 0.
 * on_done (required): exactly once per request that om_upstream_send
 *   accepted, unless om_upstream_cancel returned first. The request
 *   handle is released when it returns.
 */
typedef struct om_upstream_callbacks_s {
  int (*on_headers)(void *ud, const om_upstream_response_t *resp);
  void (*on_body)(void *ud, const char *data, size_t len);
  void (*on_done)(void *ud, const om_upstream_result_t *res);
  /* (may be NULL: dropped) the trailer fields of an HTTP/2 response
   * (RFC 9113 8.1: a HEADERS frame after the body, gRPC's grpc-status),
   * names lower-cased, valid during the call only; runs once, after the
   * last on_body and right before an on_done that reports success */
  void (*on_trailers)(void *ud, const om_http_header_t *h, size_t n);
} om_upstream_callbacks_t;

/*
 * om_upstream_send: start a request to target on a pooled connection (the
 * most recently used idle one) or a new one. The request head is built
 * and checked here, once; a retry re-sends the same bytes.
 * Returns 0 and *out (the handle, valid until on_done returns or
 * om_upstream_cancel returns): from then on the outcome, failures to
 * connect included, comes through the callbacks. Returns OM_EINVAL (a
 * NULL argument, no on_done, a target not made by om_upstream_target_*,
 * a method or target or header refused as described in
 * om_upstream_request_t, a target or body over 4 GiB, a tls target with
 * no context and none could be made), OM_ESTATE (the pool is
 * closing) or OM_ENOMEM, and then no callback will run and nothing was sent (a
 * pooled connection stays pooled).
 */
int om_upstream_send(om_upstream_pool_t *pool,
                     const om_upstream_target_t *target,
                     const om_upstream_request_t *req,
                     const om_upstream_callbacks_t *cb, void *ud,
                     om_upstream_req_t **out);

/*
 * om_upstream_req_reused: 1 when req went out on a pooled connection, 0
 * when it opened one (or is opening it), so a caller counts a request's
 * connection when it sends, whether or not on_done follows (a cancelled
 * request has none); -1 for NULL. A stale keep-alive retry's connection
 * shows in on_done's res.connects.
 */
int om_upstream_req_reused(const om_upstream_req_t *req);

/*
 * om_upstream_cancel: give up on a request. Its connection, if it has
 * one, is closed (never pooled: the server may be mid-response); no
 * callback of this request runs after this returns, on_done included, and
 * the handle is invalid. Callable from inside this request's on_headers
 * or on_body (which then return into a released request: the client
 * handles that). Returns 0; OM_EINVAL (NULL); OM_ESTATE from inside its
 * own on_done (the request is already ending; nothing changed).
 */
int om_upstream_cancel(om_upstream_req_t *req);

/*
 * om_upstream_pause: stop reading the response (uv_read_stop) so a slow
 * downstream client does not make us buffer without bound; TCP flow
 * control then pushes back on the upstream. No on_headers or on_body runs
 * until om_upstream_resume, not even for bytes already read. Timeouts
 * keep running. Idempotent. Returns 0; OM_EINVAL (NULL); OM_ESTATE when
 * the request is ending (its on_done is due or running).
 */
int om_upstream_pause(om_upstream_req_t *req);

/*
 * om_upstream_resume: undo om_upstream_pause. Bytes already read are
 * delivered from the loop after this returns, never from inside it.
 * Idempotent. Returns 0; OM_EINVAL (NULL); OM_ESTATE as for pause.
 */
int om_upstream_resume(om_upstream_req_t *req);

/*
 * om_upstream_response_lend: lend the caller the response's socket, to read
 * the rest of a Content-Length body itself (splice(2) into a client:
 * om_splice.h). Only for a paused request (om_upstream_pause) on a
 * plaintext HTTP/1.1 connection whose response head was delivered, whose
 * body has bytes left, and whose read buffer holds none of them (call it
 * from the on_body that emptied it, after pausing). *fd is the socket and
 * *left the bytes still to come; the connection stops reading until
 * om_upstream_response_unlend, and om_upstream_resume is refused (OM_ESTATE)
 * until then. Timeouts keep running (a total timeout ends the request as
 * usual: the caller stops reading the socket in on_done). Returns 0;
 * OM_EINVAL (NULL); OM_ESTATE (any condition above unmet: go on the
 * ordinary way).
 */
int om_upstream_response_lend(om_upstream_req_t *req, int *fd, uint64_t *left);

/*
 * om_upstream_response_unlend: the caller is done with the socket it was lent
 * and read moved bytes of the body from it (at most *left). broken 0: the
 * request is the client's again, still paused; om_upstream_resume goes on
 * reading (or completes the response when moved was all of it, pooling
 * the connection). broken nonzero: bytes were read but lost, or the
 * socket failed: the connection closes and on_done follows
 * ("reset_mid_body") from the loop. Returns 0; OM_EINVAL (NULL, or moved
 * over what was left); OM_ESTATE (not lent).
 */
int om_upstream_response_unlend(om_upstream_req_t *req, uint64_t moved,
                                int broken);

/*
 * om_upstream_take_tunnel: inside on_headers of a 101 response, take the
 * connection as a tunnel (om_http_server.h) with callbacks cb and ud; the
 * bytes the server sent behind the 101 head are its first data. When
 * on_headers returns (with 0), on_done follows with ok and
 * res->upgraded; the connection is the tunnel's, never pooled. The
 * tunnel survives the request and ends with om_tunnel_close or its
 * on_close (OM_ESTATE when the pool closes). Returns 0 and *out;
 * OM_EINVAL (NULL, no on_data or on_close); OM_ESTATE (not inside
 * on_headers of a 101, or already taken); OM_ENOMEM (not taken).
 */
int om_upstream_take_tunnel(om_upstream_req_t *req,
                            const om_tunnel_callbacks_t *cb, void *ud,
                            om_tunnel_t **out);

/* ------------------------------------------------------------------ */
/* streamed request bodies (om_upstream_request_t.body_stream) */

/*
 * om_upstream_body_write: append len bytes to a streamed request body.
 * They are copied (data is the caller's, only read during the call) and
 * sent as soon as the connection takes them: the request head goes out
 * first, and bytes written while connecting wait. Use
 * om_upstream_body_pending and om_upstream_body_on_drain to bound what is
 * queued: the client queues whatever it is given.
 * Returns 0 (len 0 does nothing); OM_EINVAL (NULL data with len, not a
 * streamed request, more than body_stream_length in all: nothing queued);
 * OM_ESTATE when the body was ended or the request is ending (its
 * response may have come before the body was whole: legal, and the bytes
 * are then dropped); OM_ENOMEM (nothing queued).
 *
 * The transparent stale keep-alive retry (see above) re-sends only what
 * the client still holds: once a body byte was handed to a connection it
 * is gone, and a pooled connection that fails before any response byte
 * ends the request with "reset_before_response", sent 1 and reused 1,
 * for the caller (which may hold a replay copy) to decide.
 */
int om_upstream_body_write(om_upstream_req_t *req, const char *data,
                           size_t len);

/* Called once when the upstream is done with bytes lent to it. */
typedef void (*om_upstream_release_fn)(void *ud);

/*
 * om_upstream_body_write_ref: om_upstream_body_write without the copy:
 * the len bytes at data are lent, not copied, and must stay unchanged
 * until release(ud) runs, exactly once, when the write that carried them
 * completed or failed, or the request or its connection was freed
 * (from the loop, or inside this or a later om_upstream_* call: keep it
 * to giving the bytes back). Returns as om_upstream_body_write; on any
 * error nothing was queued and release is not called (the bytes are
 * still the caller's). release may be NULL when the bytes outlive the
 * request anyway.
 */
int om_upstream_body_write_ref(om_upstream_req_t *req, const char *data,
                               size_t len, om_upstream_release_fn release,
                               void *ud);

/*
 * om_upstream_body_end: the streamed body is complete (chunked: the last
 * chunk goes out, no trailers). The first-byte timeout of a streamed
 * request starts here, not at the head: an upload is not a slow server.
 * Returns 0; OM_EINVAL (not streamed, or a Content-Length not reached:
 * cancel the request then); OM_ESTATE (ended already, or the request is
 * ending); OM_ENOMEM.
 */
int om_upstream_body_end(om_upstream_req_t *req);

/*
 * om_upstream_body_lend: lend the caller the request's socket, to write
 * the rest of a streamed Content-Length body itself (splice(2) from a
 * client: om_splice.h). Only on a plaintext HTTP/1.1 connection whose
 * head went out, with nothing of the body queued or in flight
 * (om_upstream_body_pending 0: wait for om_upstream_body_on_drain with
 * low water 0) and body bytes still owed. *fd is the socket and *left
 * the bytes owed; om_upstream_body_write is refused (OM_ESTATE) until
 * om_upstream_body_unlend. The response is read as usual meanwhile (an
 * early answer reaches on_headers; its on_done means: stop writing). The
 * request is never re-sent transparently after this. Returns 0;
 * OM_EINVAL (NULL); OM_ESTATE (a condition above unmet).
 */
int om_upstream_body_lend(om_upstream_req_t *req, int *fd, uint64_t *left);

/*
 * om_upstream_body_unlend: the caller wrote wrote bytes of the body (at
 * most *left of the lend) to the lent socket and gives it back; the body
 * goes on (om_upstream_body_write, _end) from there. broken nonzero: the
 * socket failed or bytes were lost on the way: the connection closes and
 * on_done follows from the loop ("reset_before_response" before the
 * head, "reset_mid_body" after; sent 1). Returns 0; OM_EINVAL (NULL, or
 * more than was owed); OM_ESTATE (not lent).
 */
int om_upstream_body_unlend(om_upstream_req_t *req, uint64_t wrote, int broken);

/* Bytes of the streamed body queued in memory, not yet taken by the
 * kernel; 0 for NULL or a request that is not streamed. */
size_t om_upstream_body_pending(const om_upstream_req_t *req);

typedef void (*om_upstream_drain_fn)(void *ud);

/*
 * om_upstream_body_on_drain: have cb(ud) (ud: the request's) run once,
 * from the loop, when om_upstream_body_pending falls to low_water or
 * below: the way to resume a producer paused because the upstream reads
 * slower than it writes (no polling). Returns 0 when armed; 1 when
 * pending is already at or below it (not armed: write now); OM_EINVAL
 * (NULL request or cb, not streamed); OM_ESTATE (the request is ending).
 * A later call replaces cb. Inside cb every om_upstream_* call may be
 * made, cancel included.
 */
int om_upstream_body_on_drain(om_upstream_req_t *req, size_t low_water,
                              om_upstream_drain_fn cb);

#endif /* OM_UPSTREAM_H */
