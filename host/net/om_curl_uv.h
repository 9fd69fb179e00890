/*
 * om_curl_uv.h: libcurl's multi interface driven by a libuv loop.
 *
 * Every outbound HTTP exchange of a host process (control-plane calls,
 * long-lived SSE watch streams, model calls) is an easy handle in one
 * CURLM per loop. libcurl tells us which sockets to watch
 * (CURLMOPT_SOCKETFUNCTION: one uv_poll_t per socket) and when to wake it
 * (CURLMOPT_TIMERFUNCTION: one uv_timer_t); we answer with
 * curl_multi_socket_action and collect finished transfers with
 * curl_multi_info_read (libcurl's "multi_socket" API,
 * https://curl.se/libcurl/c/libcurl-multi.html "BLOCKING" and
 * "MULTI_SOCKET"). Nothing blocks and nothing scans every transfer per
 * event, so thousands of idle watch streams cost only their sockets.
 *
 * Re-entrancy: a completion callback may add transfers, cancel others
 * (including ones that finished in the same batch: their completion is
 * then never reported) and close the glue; each completion is reported
 * at most once. What libcurl forbids stays forbidden: from inside a
 * libcurl callback (a CURLOPT_WRITEFUNCTION, HEADERFUNCTION, ...) none of
 * om_curl_uv_add, _cancel or _close may be called (they return
 * OM_ESTATE); a write function ends its own transfer by returning a short
 * count, and its completion (CURLE_WRITE_ERROR) follows.
 *
 * The glue uses CURLOPT_PRIVATE of every easy handle while it is added
 * (to find the transfer in O(1)); the caller's value is saved and put
 * back before the completion callback runs or om_curl_uv_cancel returns.
 *
 * Threading: everything runs on the loop thread.
 */
#ifndef OM_CURL_UV_H
#define OM_CURL_UV_H

#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>
#include <uv.h>

typedef struct om_curl_uv_s om_curl_uv_t;

/* A transfer ended (completed, failed or timed out: result says which).
 * The easy handle is no longer in the multi: the caller owns it again and
 * may reuse it (om_curl_uv_add) or curl_easy_cleanup it. */
typedef void (*om_curl_done_cb)(void *ud, CURL *easy, CURLcode result);

/* The glue finished closing; it is freed right after this returns. */
typedef void (*om_curl_closed_cb)(void *ud);

/*
 * om_curl_uv_new: a glue with its own CURLM on loop (which must outlive
 * it). Calls curl_global_init (reference-counted by libcurl; released when
 * the glue is freed). Returns 0 and *out, OM_EINVAL for a NULL argument,
 * OM_ENOMEM; on error nothing was allocated or added to the loop. The
 * glue owns a libuv handle, so it is freed only by om_curl_uv_close.
 */
int om_curl_uv_new(uv_loop_t *loop, om_curl_uv_t **out);

/*
 * om_curl_easy_base: what every transfer of ours sets on its easy handle
 * before its own options: the URL, http and https as the only protocols
 * (also after a redirect), no signals (libcurl's resolver timeouts would
 * use SIGALRM in a threaded, evented process), and errbuf (may be NULL,
 * else CURL_ERROR_SIZE bytes the caller keeps alive) for libcurl's
 * message. Returns 0; OM_EINVAL when libcurl refuses the URL; OM_ENOMEM.
 */
int om_curl_easy_base(CURL *e, const char *url, char *errbuf);

/*
 * TLS client settings for https:// transfers (the control plane's clients).
 * Every field may be NULL. Peer and host verification are always on; these
 * only say what to trust and what to present.
 */
typedef struct om_curl_tls_s {
  const char *ca_file;   /* CA certificates (PEM) to trust; NULL: system */
  const char *cert_file; /* client certificate (PEM) presented on request */
  const char *key_file;  /* its private key (PEM); with cert_file only */
} om_curl_tls_t;

/*
 * om_curl_easy_tls: apply tls (NULL: defaults only) to e: CURLOPT_CAINFO,
 * CURLOPT_SSLCERT and CURLOPT_SSLKEY (PEM) when set, and
 * CURLOPT_SSL_VERIFYPEER 1 and CURLOPT_SSL_VERIFYHOST 2 always, so no
 * caller can turn verification off by omission. libcurl copies the names:
 * tls may go away on return. The files are read at each handshake, not
 * here: validate them beforehand (the commands do, at start). Returns 0;
 * OM_EINVAL when cert_file and key_file are not both set or both NULL, or
 * libcurl refuses an option (a TLS backend without file support); OM_ENOMEM.
 */
int om_curl_easy_tls(CURL *e, const om_curl_tls_t *tls);

/*
 * om_curl_error_text: a failed transfer's message for logs, into out (cap
 * bytes, NUL-terminated, truncated if needed): errbuf (the transfer's
 * CURLOPT_ERRORBUFFER, may be NULL or empty) or libcurl's text for
 * result, and for a certificate that failed verification a prefix saying
 * so ("TLS verification of the server failed: SSL certificate problem:
 * unable to get local issuer certificate"), since libcurl's own words do
 * not name verification. Returns out ("" when cap is 0).
 */
const char *om_curl_error_text(CURLcode result, const char *errbuf, char *out,
                               size_t cap);

/*
 * om_curl_uv_add: start the transfer of easy, fully configured by the
 * caller. cb(ud, easy, result) is called exactly once, from the loop,
 * when it ends, unless it is cancelled (om_curl_uv_cancel) or the glue is
 * closed first. Until then the glue holds easy: do not cleanup it, change
 * its options, or set CURLOPT_PRIVATE. Returns 0; OM_EINVAL (NULL
 * argument); OM_ESTATE when easy is already added (here or to another
 * multi), the glue is closing, or the call comes from inside a libcurl
 * callback; OM_ENOMEM. On error easy is untouched and cb will not run.
 */
int om_curl_uv_add(om_curl_uv_t *cu, CURL *easy, om_curl_done_cb cb, void *ud);

/*
 * om_curl_uv_cancel: stop a transfer added to cu without calling its cb;
 * the caller owns easy again when this returns 0. The connection of a
 * transfer cut mid-way is closed, never reused. Returns 0, OM_EINVAL
 * (NULL), OM_ENOTFOUND (easy is not a running transfer of cu: it already
 * completed, was cancelled, or never was added), OM_ESTATE from inside a
 * libcurl callback (nothing changed).
 */
int om_curl_uv_cancel(om_curl_uv_t *cu, CURL *easy);

/* Transfers added and not yet ended or cancelled. */
size_t om_curl_uv_active(const om_curl_uv_t *cu);

/*
 * om_curl_uv_close: cancel every transfer without calling its callback
 * (easy handles the caller added stay the caller's; requests started with
 * om_curl_uv_request are freed, their callbacks not called), close the
 * libuv handles, and free the glue once they have closed: cb(ud) (may be
 * NULL) runs from the loop just before that, never synchronously. Called
 * from a completion callback, the closing finishes when the callback
 * returns. Returns 0; OM_EINVAL (NULL); OM_ESTATE when already closing or
 * from inside a libcurl callback (nothing changed).
 */
int om_curl_uv_close(om_curl_uv_t *cu, om_curl_closed_cb cb, void *ud);

/* ------------------------------------------------------------------ */
/* Simple requests: one call, the whole response body in memory.      */

#define OM_CURL_MAX_BODY ((size_t)1 << 20) /* default body cap: 1 MiB */
#define OM_CURL_DEFAULT_TIMEOUT_MS 30000u

typedef struct om_curl_req_s {
  const char *method; /* a token; NULL means "GET" */
  const char *url;    /* required; http:// or https:// only */
  /* "Name: value" lines, sent as given (a line "Name:" removes a header
   * libcurl would add). No CR, LF or NUL. */
  const char *const *headers;
  size_t n_headers;
  /* Copied. A body, or a POST/PUT/PATCH without one, is sent with
   * Content-Length; no Content-Type unless given in headers. */
  const char *body;
  size_t body_len;
  uint64_t timeout_ms; /* the whole exchange; 0: 30 s */
  size_t max_body;     /* response body cap; 0: OM_CURL_MAX_BODY */
  /* https:// trust and client certificate (om_curl_easy_tls); NULL: the
   * system store, no certificate. Copied. */
  const om_curl_tls_t *tls;
} om_curl_req_t;

typedef struct om_curl_resp_s {
  /* CURLE_OK when a whole response arrived, whatever its status;
   * CURLE_FILESIZE_EXCEEDED when the body passed max_body (the transfer
   * is cut there); CURLE_OUT_OF_MEMORY; otherwise libcurl's code
   * (CURLE_COULDNT_CONNECT, CURLE_OPERATION_TIMEDOUT, ...). */
  CURLcode result;
  long status; /* the final response's status; 0 when none arrived */
  /* NUL-terminated, or NULL when empty. Freed after the callback
   * returns, unless the callback takes it (sets body to NULL). */
  char *body;
  size_t body_len;
  const char *error; /* "" on CURLE_OK, else a message; static or the
                        request's: valid during the callback */
  CURL *easy;        /* for curl_easy_getinfo during the callback */
} om_curl_resp_t;

typedef void (*om_curl_resp_cb)(void *ud, om_curl_resp_t *resp);

typedef struct om_curl_request_s om_curl_request_t;

/*
 * om_curl_uv_request: start req on cu; cb(ud, resp) runs exactly once from
 * the loop, unless the request is cancelled or the glue closed first. req
 * and everything it points to are copied: they may go away on return.
 * *out (out may be NULL) is a handle for om_curl_request_cancel, valid
 * until cb returns. Returns 0; OM_EINVAL (NULL cu, cb or url; a method
 * that is not a token; a header line with CR, LF or NUL; body NULL with
 * body_len > 0; a URL libcurl refuses; tls that om_curl_easy_tls
 * refuses); OM_ESTATE (closing, or from inside
 * a libcurl callback); OM_ENOMEM. On error cb will not run.
 */
int om_curl_uv_request(om_curl_uv_t *cu, const om_curl_req_t *req,
                       om_curl_resp_cb cb, void *ud, om_curl_request_t **out);

/*
 * om_curl_request_cancel: stop r and free it without calling its cb.
 * NULL, or r inside its own callback, does nothing. Returns 0, or
 * OM_ESTATE from inside a libcurl callback (nothing changed).
 */
int om_curl_request_cancel(om_curl_request_t *r);

/*
 * om_curl_resp_header: the value of the last field called name
 * (case-insensitive) of the final response, or NULL. Valid during the
 * callback only.
 */
const char *om_curl_resp_header(const om_curl_resp_t *resp, const char *name);

#endif /* OM_CURL_UV_H */
