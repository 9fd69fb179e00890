/*
 * om_http_tls.h: TLS on an HTTP server's listener (HTTPS), with optional
 * client certificates, and the reload of its files.
 *
 * An om_http_tls_t is a server context of the TLS engine (om_tls.h) plus
 * what a listener needs around it: the handshake and reload counters,
 * their metrics, and a watch on the directories of the certificate, key
 * and client-CA files. It is given to om_http_server_new through
 * om_http_server_opts_t.tls (not owned: it must outlive the servers that
 * use it; several may share one). Every accepted connection of such a
 * server handshakes before a byte of HTTP is read: the header timeout
 * bounds the handshake too, and a failed one is counted and closes the
 * connection. The HTTP layer then reads decrypted bytes and its writes
 * are encrypted; tunnels after a 101 run over the same TLS connection;
 * a graceful close sends close_notify. A server without it is the
 * plaintext server, with no TLS code on its path.
 *
 * Reload (om_http_tls_reload, SIGHUP; and on change when watching): the
 * files are read again and validated before use; a bad file keeps the
 * last good certificate, is logged and counted (result "error").
 * Connections keep the certificate they started with.
 */
#ifndef OM_HTTP_TLS_H
#define OM_HTTP_TLS_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "om_http_server.h"
#include "om_metrics.h"
#include "om_tls.h"

typedef struct om_http_tls_s om_http_tls_t;

typedef struct om_http_tls_opts_s {
  const char *cert_file; /* PEM, the chain after the leaf: required */
  const char *key_file;  /* PEM: required */
  /* PEM CA certificates: ask for a client certificate and verify it.
   * NULL: no client certificates. */
  const char *client_ca_file;
  /* with client_ca_file: a client without a certificate is still served
   * (anonymous: no identity); one with a certificate that does not verify
   * is refused at the handshake. 0: a certificate is required. */
  int client_cert_optional;
  /* how errors name the files (the command-line flags): NULL gives
   * "--tls-cert", "--tls-key", "--tls-client-ca" */
  const char *cert_label, *key_label, *client_ca_label;
  /* nonzero: reload when one of the files changes (its directory is
   * watched; debounce_ms after the last event, default 200 ms) */
  int watch;
  uint64_t debounce_ms;
  /* the ALPN protocols offered, in preference order, comma-separated
   * ("h2,http/1.1" for a server with http2: a client that selects h2 is
   * served HTTP/2, om_http_server.h); NULL: "http/1.1" */
  const char *alpn;
} om_http_tls_opts_t;

/* Handshake results, as counted and labelled. */
#define OM_HTTP_TLS_RESULT_MAP(XX)                                             \
  XX(OK, "ok")                 /* completed */                                 \
  XX(ERROR, "error")           /* refused: protocol, certificate */            \
  XX(INCOMPLETE, "incomplete") /* the client left or timed out first */

typedef enum {
#define OM__HTTP_TLS_RESULT_ENUM(name, label) OM_HTTP_TLS_##name,
  OM_HTTP_TLS_RESULT_MAP(OM__HTTP_TLS_RESULT_ENUM)
#undef OM__HTTP_TLS_RESULT_ENUM
      OM_HTTP_TLS_RESULT__COUNT
} om_http_tls_result_t;

typedef struct om_http_tls_stats_s {
  uint64_t handshakes[OM_HTTP_TLS_RESULT__COUNT];
  uint64_t reloads_ok, reloads_error;
  uint64_t generation; /* 1 at start, +1 per reload that took effect */
} om_http_tls_stats_t;

/*
 * om_http_tls_new: load and check the files now (a certificate and key
 * that do not match, garbage, an unreadable file: the error names the
 * flag and the file, e.g. "--tls-key k.pem: the key does not match the
 * certificate"), and start watching when opts->watch. Returns 0 and
 * *out; OM_EINVAL / OM_EPARSE / OM_ENOMEM with err set and nothing
 * allocated.
 */
int om_http_tls_new(uv_loop_t *loop, const om_http_tls_opts_t *opts,
                    om_http_tls_t **out, char *err, size_t errlen);

/*
 * om_http_tls_reload: read the files again; valid ones take effect for new
 * connections. Returns 0, or the error (as om_http_tls_new, err set) with
 * the last good files still in use. Logged and counted either way.
 */
int om_http_tls_reload(om_http_tls_t *t, char *err, size_t errlen);

/*
 * om_http_tls_metrics: register PREFIX_tls_handshakes_total{result} and
 * PREFIX_tls_reloads_total{result} in reg and keep them up to date (e.g.
 * prefix "openmesh_control"). Once per registry; NULL t does nothing.
 */
void om_http_tls_metrics(om_http_tls_t *t, om_metrics_t *reg,
                         const char *prefix);

/* The counters (valid while t lives). */
const om_http_tls_stats_t *om_http_tls_stats(const om_http_tls_t *t);

/* The engine context the listener uses (not a new reference). */
om_tls_ctx_t *om_http_tls_ctx(const om_http_tls_t *t);

/* 1 when client certificates are asked for. */
int om_http_tls_verifies_clients(const om_http_tls_t *t);

/*
 * om_http_tls_close: stop watching and free t once its handles closed (on
 * the loop) and no connection holds its context. NULL is a no-op. No
 * server may use t afterwards.
 */
void om_http_tls_close(om_http_tls_t *t);

/*
 * om_http_request_identity: the verified client certificate of the
 * connection req came on (subject, URI and DNS SANs); NULL for a
 * plaintext connection, a client that presented none, or once the client
 * is gone. Owned by the connection: valid during the handler call and
 * while the request's connection lives.
 */
const om_tls_identity_t *om_http_request_identity(const om_http_request_t *req);

/* 1 when req came over TLS. */
int om_http_request_is_tls(const om_http_request_t *req);

#endif /* OM_HTTP_TLS_H */
