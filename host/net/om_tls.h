/*
 * om_tls.h: TLS over memory BIOs (OpenSSL 3), for the upstream client and
 * the HTTP server alike.
 *
 * Two objects:
 *
 * - A context (om_tls_ctx_t): a refcounted SSL_CTX and the file names it
 *   was built from, for a client (trust, an optional certificate to
 *   present, the ALPN list, a cache of resumable sessions) or a server (a
 *   certificate and key, optional client certificate verification).
 *   om_tls_ctx_reload() re-reads the same files into a new SSL_CTX and
 *   swaps only when every file is valid: connections keep the SSL_CTX they
 *   started with, new connections get the new one, and a bad file leaves
 *   everything as it was.
 *
 * - A connection engine (om_tls_t) that never touches a socket: the caller
 *   feeds it the ciphertext it read (om_tls_feed), takes the ciphertext it
 *   must write (om_tls_out_take), and moves plaintext with om_tls_read and
 *   om_tls_write. That keeps the loop non-blocking and leaves every I/O
 *   decision (uv_try_write, backpressure, timeouts) to the caller.
 *
 * Pumping, after every om_tls_handshake / om_tls_read / om_tls_write /
 * om_tls_shutdown: write out whatever om_tls_out_pending() reports (a
 * handshake flight, an alert, a session ticket answer, a close_notify).
 * Functions return 0 (done), OM_TLS_WANT_READ (needs more ciphertext in:
 * feed it and call again), OM_TLS_CLOSED (the peer sent close_notify) or
 * a negative OM_E* code. A TLS failure is OM_EIO with a static reason
 * (om_tls_reason), a class (om_tls_fail) and OpenSSL's own text for logs
 * (om_tls_detail); the engine is unusable afterwards except for those and
 * om_tls_out_* (an alert may still be pending for the peer).
 *
 * Protocol: TLS 1.2 minimum. Clients verify the peer by default (the
 * system store via SSL_CTX_set_default_verify_paths, or ca_file), send
 * SNI for names only (never for IP literals, RFC 6066 section 3) and check
 * the name (SSL_set1_host) or the address (X509_VERIFY_PARAM_set1_ip_asc).
 *
 * Threading: a context and its engines belong to one thread (the loop's).
 */
#ifndef OM_TLS_H
#define OM_TLS_H

#include <stddef.h>
#include <stdint.h>

typedef struct om_tls_ctx om_tls_ctx_t;
typedef struct om_tls om_tls_t;

/* Positive results of the engine's calls (errors are negative OM_E*). */
enum {
  OM_TLS_WANT_READ = 1, /* more ciphertext from the peer is needed */
  OM_TLS_CLOSED = 2,    /* the peer sent close_notify */
};

typedef enum { OM_TLS_CLIENT = 0, OM_TLS_SERVER = 1 } om_tls_role_t;

/*
 * Why a handshake failed, for metrics and fail classes: XX(NAME, reason).
 * The reason is the static text om_tls_reason() returns.
 */
#define OM_TLS_FAIL_MAP(XX)                                                    \
  XX(NONE, "none")                                                             \
  XX(HOSTNAME, "certificate verify failed: hostname mismatch")                 \
  XX(EXPIRED, "certificate verify failed: certificate has expired")            \
  XX(NOT_YET_VALID, "certificate verify failed: certificate is not yet valid") \
  XX(UNTRUSTED,                                                                \
     "certificate verify failed: unable to get local issuer certificate")      \
  XX(SELF_SIGNED, "certificate verify failed: self-signed certificate")        \
  XX(VERIFY, "certificate verify failed")                                      \
  XX(NO_PEER_CERT, "peer sent no certificate")                                 \
  XX(ALERT, "peer sent an alert")                                              \
  XX(PROTOCOL, "handshake failed")                                             \
  XX(ENGINE, "TLS engine error")

typedef enum {
#define OM__TLS_FAIL_ENUM(name, reason) OM_TLS_FAIL_##name,
  OM_TLS_FAIL_MAP(OM__TLS_FAIL_ENUM)
#undef OM__TLS_FAIL_ENUM
      OM_TLS_FAIL__COUNT
} om_tls_fail_t;

/*
 * What a context is built from. Zero is the default for every field.
 * The file names are copied; the labels name each file in errors (e.g.
 * "--tls-key" gives "--tls-key k.pem: the key does not match the
 * certificate"); NULL labels default to "cert_file", "key_file", "ca_file"
 * and "client_ca_file".
 */
typedef struct {
  om_tls_role_t role;
  /* server: required. client: optional, presented when the server asks
   * (mutual TLS); key_file goes with it. PEM; cert_file may carry the
   * chain after the leaf. */
  const char *cert_file;
  const char *key_file;
  /* client: the CA certificates (PEM) to trust; NULL uses the system
   * store. Ignored by a server. */
  const char *ca_file;
  /* client: 1 turns verification off (testing only). */
  int no_verify;
  /* server: when set, ask for a client certificate and verify it against
   * these CAs; the handshake fails without one unless client_cert_optional.
   */
  const char *client_ca_file;
  int client_cert_optional;
  /* comma-separated ALPN protocols in preference order; NULL = "http/1.1".
   * A client offers them, a server picks the first of its own the client
   * offered (none if they share nothing: the handshake goes on). */
  const char *alpn;
  const char *cert_label, *key_label, *ca_label, *client_ca_label;
} om_tls_opts_t;

/*
 * om_tls_ctx_new: build a context from opts and store it in *out with one
 * reference. Every file is read and checked now: a missing or unreadable
 * file ("cannot read: Permission denied"), a file that is not PEM of the
 * expected kind ("not a PEM certificate", "not a PEM private key"), a key
 * that does not match its certificate. Returns 0; OM_EINVAL for a missing
 * required field or an unreadable file, OM_EPARSE for bad content,
 * OM_ENOMEM; on error *out is untouched, nothing is allocated and err
 * (may be NULL) names the file and the problem.
 */
int om_tls_ctx_new(const om_tls_opts_t *opts, om_tls_ctx_t **out, char *err,
                   size_t errlen);

/* om_tls_ctx_ref: take one more reference; returns ctx. */
om_tls_ctx_t *om_tls_ctx_ref(om_tls_ctx_t *ctx);

/*
 * om_tls_ctx_unref: drop one reference (NULL is a no-op); the last one
 * frees the context. Engines hold their own reference, so a context may be
 * released while connections made from it are alive.
 */
void om_tls_ctx_unref(om_tls_ctx_t *ctx);

/*
 * om_tls_ctx_reload: re-read the files the context was built from into a
 * new SSL_CTX and swap it in. On success the generation goes up and the
 * client session cache is emptied (sessions verified against the old trust
 * are not resumed). On error (as om_tls_ctx_new), nothing changed: the
 * last good files stay in use.
 */
int om_tls_ctx_reload(om_tls_ctx_t *ctx, char *err, size_t errlen);

/* om_tls_ctx_generation: 1 after om_tls_ctx_new, +1 per successful reload.
 */
uint64_t om_tls_ctx_generation(const om_tls_ctx_t *ctx);

/* om_tls_ctx_role: the role the context was built for. */
om_tls_role_t om_tls_ctx_role(const om_tls_ctx_t *ctx);

/*
 * Per-connection settings of a client engine (a server engine takes
 * NULL). host is the name or IP literal the peer must prove (brackets
 * around an IPv6 literal are allowed); server_name, when set, replaces it
 * for SNI and verification (a URL by address to a certificate for a
 * name). A verifying client needs one of them; alpn, when set, replaces
 * the context's ALPN list for this connection (OM_EINVAL when it is not
 * a comma list of 1..255-byte names). session_key, when set,
 * names the peer in the context's session cache ("addr:port|name" is
 * what the upstream client uses): a resumable session from an earlier
 * connection with the same key is offered, and new sessions are stored
 * under it. Strings are copied.
 */
typedef struct {
  const char *host;
  const char *server_name;
  const char *session_key;
  /* the ALPN protocols this connection offers instead of the context's
   * (a comma list, e.g. "h2"); NULL: the context's */
  const char *alpn;
} om_tls_conn_opts_t;

/*
 * om_tls_new: a connection engine for ctx in its role, holding a
 * reference to ctx's current SSL_CTX and to ctx. A client starts its
 * handshake on the first om_tls_handshake (or read/write). Returns 0;
 * OM_EINVAL (a verifying client without a name, a name too long),
 * OM_ENOMEM; on error *out is untouched and err says why.
 */
int om_tls_new(om_tls_ctx_t *ctx, const om_tls_conn_opts_t *o, om_tls_t **out,
               char *err, size_t errlen);

/* om_tls_free: free the engine (NULL is a no-op). Sends nothing. */
void om_tls_free(om_tls_t *t);

/*
 * om_tls_feed: hand the engine len bytes of ciphertext read from the
 * peer (copied). Returns 0 or OM_ENOMEM (nothing fed).
 */
int om_tls_feed(om_tls_t *t, const void *data, size_t len);

/*
 * om_tls_handshake: drive the handshake with what was fed so far. Returns
 * 0 once it is complete (and on every later call), OM_TLS_WANT_READ, or
 * OM_EIO (see om_tls_fail / om_tls_reason). Write out om_tls_out_* after.
 */
int om_tls_handshake(om_tls_t *t);

/* om_tls_handshake_done: 1 once the handshake completed, else 0. */
int om_tls_handshake_done(const om_tls_t *t);

/*
 * om_tls_read: decrypt up to cap bytes of plaintext into buf; *n is the
 * count (0 unless the result is 0). Returns 0 (*n > 0), OM_TLS_WANT_READ
 * (nothing decryptable yet), OM_TLS_CLOSED (close_notify received; no more
 * data), or OM_EIO. Drives the handshake first if it is not complete.
 * Call until it is not 0: records already fed are not announced again.
 */
int om_tls_read(om_tls_t *t, void *buf, size_t cap, size_t *n);

/*
 * om_tls_write: encrypt len bytes of plaintext (all of them: the output
 * buffer grows) into the pending output. Returns 0, OM_TLS_WANT_READ (the
 * handshake is not complete: nothing written) or OM_EIO / OM_ENOMEM.
 */
int om_tls_write(om_tls_t *t, const void *data, size_t len);

/*
 * om_tls_shutdown: queue a close_notify in the pending output (once).
 * Returns 0 or OM_EIO. The caller may close the socket after writing it;
 * waiting for the peer's close_notify is not required (RFC 8446 6.1).
 */
int om_tls_shutdown(om_tls_t *t);

/* om_tls_in_pending: 1 when decrypted bytes or ciphertext not yet
 * processed wait in the engine (a reader that paused must come back), else
 * 0. */
int om_tls_in_pending(const om_tls_t *t);

/* om_tls_out_pending: bytes of ciphertext waiting to be written. */
size_t om_tls_out_pending(const om_tls_t *t);

/*
 * om_tls_out_take: move up to cap bytes of pending ciphertext into buf;
 * returns the count.
 */
size_t om_tls_out_take(om_tls_t *t, void *buf, size_t cap);

/* om_tls_fail: the class of the failure that made a call return OM_EIO
 * (OM_TLS_FAIL_NONE before any). */
om_tls_fail_t om_tls_fail(const om_tls_t *t);

/* om_tls_reason: the static text of om_tls_fail(t), e.g. "certificate
 * verify failed: hostname mismatch". Never NULL. */
const char *om_tls_reason(const om_tls_t *t);

/* om_tls_fail_reason: the static text of a class; never NULL. */
const char *om_tls_fail_reason(om_tls_fail_t f);

/* om_tls_fail_name: a lowercase name of a class for labels and fail
 * classes ("hostname", "expired", "untrusted"...); never NULL. */
const char *om_tls_fail_name(om_tls_fail_t f);

/*
 * om_tls_detail: OpenSSL's text for the failure, for logs (e.g. "error:
 * 0A000086:SSL routines::certificate verify failed (verify: hostname
 * mismatch)"); "" when there is none. Valid until the engine is freed.
 */
const char *om_tls_detail(const om_tls_t *t);

/* om_tls_verify_result: the peer verification result (X509_V_OK = 0, or
 * an X509_V_ERR_* code). */
long om_tls_verify_result(const om_tls_t *t);

/* om_tls_session_reused: 1 when the handshake resumed a session. */
int om_tls_session_reused(const om_tls_t *t);

/* om_tls_version: "TLSv1.3" etc. after the handshake; never NULL. */
const char *om_tls_version(const om_tls_t *t);

/*
 * om_tls_alpn: the protocol the handshake selected, NUL-terminated into
 * buf (cut to fit); returns its length, 0 when none was selected.
 */
size_t om_tls_alpn(const om_tls_t *t, char *buf, size_t cap);

/*
 * The verified identity of the peer's certificate: its subject (RFC 2253,
 * e.g. "CN=a,O=mesh") and the URI and DNS subject alternative names in
 * certificate order (a SPIFFE ID is a URI SAN). Free with
 * om_tls_identity_free.
 */
typedef struct {
  char *subject;
  char **uris;
  size_t n_uris;
  char **dns;
  size_t n_dns;
} om_tls_identity_t;

/*
 * om_tls_peer_identity: after the handshake, the identity of a peer
 * certificate that was verified (a server asking for client certificates,
 * or a verifying client). Returns 0 and a new identity in *out (the caller
 * frees it); OM_ENOTFOUND when there is no verified peer certificate,
 * OM_ESTATE before the handshake completes, OM_ENOMEM.
 */
int om_tls_peer_identity(const om_tls_t *t, om_tls_identity_t **out);

/* om_tls_identity_free: free an identity (NULL is a no-op). */
void om_tls_identity_free(om_tls_identity_t *id);

#endif /* OM_TLS_H */
