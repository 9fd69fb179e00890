/*
 * om_http_server_tls.c: TLS on the HTTP server's connections (see
 * om_http_tls.h): the listener's context with its counters and file
 * watch, and the connection glue between libuv and the engine.
 *
 * A TLS connection reads ciphertext into the server's scratch buffer,
 * feeds it to its engine (om_tls.h, memory BIOs) and then hands the
 * decrypted bytes to the plaintext read path exactly as libuv would have
 * (om__http_on_alloc gives the destination, om__http_on_read takes it),
 * so parsing, limits, backpressure and timers are the plaintext ones.
 * Writes go through the engine and their ciphertext through the raw
 * sender (om__http_conn_send_raw). When the read path stops reading with
 * plaintext still inside the engine, the connection's timer brings it out
 * once reading resumes (tls_in), so nothing waits for a byte that will
 * never come. Memory per connection stays bounded: at most one read of
 * ciphertext (16 KiB) is ever fed ahead of the read path.
 */
#include "om_http_tls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_file_watch.h"
#include "om_http_server_internal.h"
#include "om_log.h"
#include "om_tunnel_internal.h"

#define DEF_DEBOUNCE_MS 200u
#define MAX_FILES 3
#define OUT_CHUNK (16u * 1024u)

static const char *const result_label[] = {
#define OM__HTTP_TLS_RESULT_LABEL(name, label) label,
    OM_HTTP_TLS_RESULT_MAP(OM__HTTP_TLS_RESULT_LABEL)
#undef OM__HTTP_TLS_RESULT_LABEL
};

struct om_http_tls_s {
  uv_loop_t *loop;
  om_tls_ctx_t *ctx;
  int verifies;
  om_http_tls_stats_t st;
  om_metric_t *m_hs[OM_HTTP_TLS_RESULT__COUNT];
  om_metric_t *m_reload_ok, *m_reload_error;
  char *cert_path;        /* for the reload log line */
  om_file_watch_t *watch; /* NULL unless opts.watch */
  uint64_t debounce_ms;
  int closing;
};

/* ------------------------------------------------------------------ */
/* the listener's context */

static void tls_free(om_http_tls_t *t) {
  om_tls_ctx_unref(t->ctx);
  free(t->cert_path);
  free(t);
}

int om_http_tls_reload(om_http_tls_t *t, char *err, size_t errlen) {
  char msg[512], gen[24];
  int rc;
  if (t == NULL) {
    om_errbuf(err, errlen, "invalid arguments");
    return OM_EINVAL;
  }
  rc = om_tls_ctx_reload(t->ctx, msg, sizeof msg);
  if (rc != 0) {
    t->st.reloads_error++;
    om_metric_inc(t->m_reload_error);
    om_log(OM_LOG_ERROR, "tls_reload_failed", "error", msg, "kept",
           "the last good certificate", NULL);
    om_errbuf(err, errlen, "%s", msg);
    return rc;
  }
  t->st.reloads_ok++;
  t->st.generation = om_tls_ctx_generation(t->ctx);
  om_metric_inc(t->m_reload_ok);
  snprintf(gen, sizeof gen, "%llu", (unsigned long long)t->st.generation);
  om_log(OM_LOG_INFO, "tls_reloaded", "cert", t->cert_path, "generation", gen,
         NULL);
  if (err != NULL && errlen > 0)
    err[0] = '\0';
  return 0;
}

static void on_files_changed(void *ud) {
  (void)om_http_tls_reload(ud, NULL, 0);
}

int om_http_tls_new(uv_loop_t *loop, const om_http_tls_opts_t *opts,
                    om_http_tls_t **out, char *err, size_t errlen) {
  om_tls_opts_t o;
  om_http_tls_t *t;
  const char *files[MAX_FILES];
  int rc;
  if (loop == NULL || opts == NULL || out == NULL || opts->cert_file == NULL ||
      opts->key_file == NULL) {
    om_errbuf(err, errlen, "a certificate and a key are required");
    return OM_EINVAL;
  }
  memset(&o, 0, sizeof o);
  o.role = OM_TLS_SERVER;
  o.cert_file = opts->cert_file;
  o.key_file = opts->key_file;
  o.client_ca_file = opts->client_ca_file;
  o.client_cert_optional = opts->client_cert_optional;
  o.alpn = opts->alpn;
  o.cert_label = opts->cert_label != NULL ? opts->cert_label : "--tls-cert";
  o.key_label = opts->key_label != NULL ? opts->key_label : "--tls-key";
  o.client_ca_label =
      opts->client_ca_label != NULL ? opts->client_ca_label : "--tls-client-ca";
  t = calloc(1, sizeof *t);
  if (t == NULL) {
    om_errbuf(err, errlen, "out of memory");
    return OM_ENOMEM;
  }
  rc = om_tls_ctx_new(&o, &t->ctx, err, errlen);
  if (rc != 0) {
    free(t);
    return rc;
  }
  t->loop = loop;
  t->verifies = opts->client_ca_file != NULL;
  t->st.generation = om_tls_ctx_generation(t->ctx);
  t->debounce_ms = opts->debounce_ms ? opts->debounce_ms : DEF_DEBOUNCE_MS;
  files[0] = opts->cert_file;
  files[1] = opts->key_file;
  files[2] = opts->client_ca_file;
  if ((t->cert_path = strdup(opts->cert_file)) == NULL) {
    tls_free(t);
    om_errbuf(err, errlen, "out of memory");
    return OM_ENOMEM;
  }
  if (opts->watch && (rc = om_file_watch_start(
                          loop, files, MAX_FILES, t->debounce_ms,
                          on_files_changed, t, &t->watch, err, errlen)) != 0) {
    tls_free(t);
    return rc;
  }
  *out = t;
  return 0;
}

void om_http_tls_metrics(om_http_tls_t *t, om_metrics_t *reg,
                         const char *prefix) {
  char name[128], labels[64];
  if (t == NULL || reg == NULL || prefix == NULL)
    return;
  snprintf(name, sizeof name, "%s_tls_handshakes_total", prefix);
  for (int r = 0; r < OM_HTTP_TLS_RESULT__COUNT; r++) {
    snprintf(labels, sizeof labels, "result=\"%s\"", result_label[r]);
    t->m_hs[r] = om_metrics_counter(
        reg, name, "TLS handshakes on the listener, by result.", labels);
    om_metric_add(t->m_hs[r], (double)t->st.handshakes[r]);
  }
  snprintf(name, sizeof name, "%s_tls_reloads_total", prefix);
  t->m_reload_ok = om_metrics_counter(
      reg, name,
      "Reloads of the listener's certificate files (error: the last good "
      "stayed).",
      "result=\"ok\"");
  t->m_reload_error = om_metrics_counter(
      reg, name,
      "Reloads of the listener's certificate files (error: the last good "
      "stayed).",
      "result=\"error\"");
  om_metric_add(t->m_reload_ok, (double)t->st.reloads_ok);
  om_metric_add(t->m_reload_error, (double)t->st.reloads_error);
}

const om_http_tls_stats_t *om_http_tls_stats(const om_http_tls_t *t) {
  return t != NULL ? &t->st : NULL;
}

om_tls_ctx_t *om_http_tls_ctx(const om_http_tls_t *t) {
  return t != NULL ? t->ctx : NULL;
}

int om_http_tls_verifies_clients(const om_http_tls_t *t) {
  return t != NULL && t->verifies;
}

void om_http_tls_close(om_http_tls_t *t) {
  if (t == NULL || t->closing)
    return;
  t->closing = 1;
  om_file_watch_close(t->watch);
  tls_free(t);
}

/* ------------------------------------------------------------------ */
/* the request's view */

const om_tls_identity_t *
om_http_request_identity(const om_http_request_t *req) {
  const req_t *r = (const req_t *)req;
  if (OM__HTTP_IS_H2(req)) {
    const conn_t *c = om__http2_conn_of(req);
    return c != NULL ? c->peer : NULL;
  }
  return r != NULL && r->conn != NULL ? r->conn->peer : NULL;
}

int om_http_request_is_tls(const om_http_request_t *req) {
  const req_t *r = (const req_t *)req;
  if (OM__HTTP_IS_H2(req)) {
    const conn_t *c = om__http2_conn_of(req);
    return c != NULL && c->tls != NULL;
  }
  return r != NULL && r->conn != NULL && r->conn->tls != NULL;
}

/* ------------------------------------------------------------------ */
/* connections */

static void count(conn_t *c, om_http_tls_result_t r) {
  om_http_tls_t *t = c->srv->o.tls;
  c->tls_counted = 1;
  t->st.handshakes[r]++;
  om_metric_inc(t->m_hs[r]);
}

int om__http_tls_accept(conn_t *c) {
  char err[256];
  int rc = om_tls_new(c->srv->o.tls->ctx, NULL, &c->tls, err, sizeof err);
  if (rc != 0)
    om_log(OM_LOG_WARN, "tls_accept_failed", "remote", c->remote_ip, "error",
           err, NULL);
  return rc;
}

void om__http_tls_free(conn_t *c) {
  if (c->tls == NULL)
    return;
  if (!c->tls_counted)
    count(c, OM_HTTP_TLS_INCOMPLETE);
  om_tls_identity_free(c->peer);
  c->peer = NULL;
  om_tls_free(c->tls);
  c->tls = NULL;
}

/* Send the engine's pending ciphertext (a handshake flight, records, an
 * alert, a close_notify). */
static int flush_out(conn_t *c) {
  char buf[OUT_CHUNK];
  size_t n;
  while ((n = om_tls_out_take(c->tls, buf, sizeof buf)) > 0) {
    uv_buf_t b = uv_buf_init(buf, (unsigned)n);
    if (om__http_conn_send_raw(c, &b, 1) != 0)
      return OM_ESTATE;
  }
  return 0;
}

/* A TLS failure: logged, counted when it ends the handshake, the alert
 * sent, the connection closed. */
static void tls_failed(conn_t *c) {
  const char *detail = om_tls_detail(c->tls);
  if (!c->tls_counted)
    count(c, OM_HTTP_TLS_ERROR);
  c->tls_dead = 1;
  om_log(OM_LOG_INFO, "tls_handshake_failed", "remote", c->remote_ip, "reason",
         om_tls_reason(c->tls), "detail", detail, NULL);
  (void)flush_out(c);
  om__http_conn_close(c, 0);
}

/* The handshake is complete: count it and read the client's identity. */
static void established(conn_t *c) {
  count(c, OM_HTTP_TLS_OK);
  if (om_http_tls_verifies_clients(c->srv->o.tls) &&
      om_tls_peer_identity(c->tls, &c->peer) != 0)
    c->peer = NULL; /* anonymous (optional certificates) */
}

void om__http_tls_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  conn_t *c = h->data;
  (void)suggested;
  *buf = uv_buf_init(c->srv->scratch, sizeof c->srv->scratch);
}

void om__http_tls_pump(conn_t *c) {
  uv_stream_t *st = (uv_stream_t *)&c->tcp;
  c->tls_in = 0;
  if (c->tls_dead)
    return;
  if (!om_tls_handshake_done(c->tls)) {
    int rc = om_tls_handshake(c->tls);
    if (rc < 0) {
      tls_failed(c);
      return;
    }
    if (flush_out(c) != 0)
      return;
    if (rc == OM_TLS_WANT_READ)
      return;
    established(c);
  }
  while (c->reading && c->phase < PH_TUNNEL) {
    uv_buf_t b;
    size_t n = 0;
    int rc;
    om__http_on_alloc((uv_handle_t *)st, OUT_CHUNK, &b);
    if (b.base == NULL || b.len == 0) {
      om__http_on_read(st, UV_ENOBUFS, &b); /* as libuv would */
      return;
    }
    rc = om_tls_read(c->tls, b.base, b.len, &n);
    if (rc < 0) {
      tls_failed(c);
      return;
    }
    if (flush_out(c) != 0)
      return;
    if (rc == OM_TLS_WANT_READ)
      return;
    if (rc == OM_TLS_CLOSED) {
      om__http_on_read(st, UV_EOF, &b);
      return;
    }
    om__http_on_read(st, (ssize_t)n, &b);
  }
  /* reading stopped with records perhaps still inside the engine: the
   * timer brings them out once reading resumes */
  if (c->phase < PH_TUNNEL)
    c->tls_in = 1;
}

void om__http_tls_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  conn_t *c = st->data;
  if (c->phase == PH_CLOSING || nread == 0)
    return;
  if (nread < 0) {
    om__http_on_read(st, nread, buf);
    return;
  }
  c->t_read = om__http_now_ms(c);
  if (om_tls_feed(c->tls, buf->base, (size_t)nread) != 0) {
    om__http_conn_close(c, 0);
    return;
  }
  om__http_tls_pump(c);
}

int om__http_tls_send(conn_t *c, const uv_buf_t *bufs, unsigned nb) {
  if (c->phase >= PH_FAILED)
    return OM_ESTATE;
  for (unsigned i = 0; i < nb; i++) {
    if (bufs[i].len == 0)
      continue;
    if (c->tls_dead || om_tls_write(c->tls, bufs[i].base, bufs[i].len) != 0) {
      c->tls_dead = 1;
      om__http_conn_fail(c);
      return OM_ESTATE;
    }
  }
  return flush_out(c);
}

void om__http_tls_notify(conn_t *c) {
  if (c->tls_dead || !om_tls_handshake_done(c->tls) ||
      om_tls_shutdown(c->tls) != 0)
    return;
  (void)flush_out(c);
}

void om__http_tls_goodbye(conn_t *c) {
  char buf[OUT_CHUNK];
  size_t n;
  if (c->tls_dead || !om_tls_handshake_done(c->tls))
    return;
  if (c->ob_len > 0 && om_tls_write(c->tls, c->ob, c->ob_len) != 0)
    return;
  if (om_tls_shutdown(c->tls) != 0)
    return;
  /* what a write before the close would have sent at once; the rest is
   * dropped with the connection */
  if (uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) > 0)
    return;
  while ((n = om_tls_out_take(c->tls, buf, sizeof buf)) > 0) {
    uv_buf_t b = uv_buf_init(buf, (unsigned)n);
    if (uv_try_write((uv_stream_t *)&c->tcp, &b, 1) != (int)n)
      return;
  }
}

void om__http_tls_tunnel(conn_t *c, om_tunnel_t *t) {
  om__tunnel_use_tls(t, c->tls, c->tls_in);
  c->tls_in = 0;
}
