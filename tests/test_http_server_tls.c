/*
 * test_http_server_tls.c: the HTTP server over TLS (om_http_tls.h) on real
 * loopback sockets. The client is the TLS engine (om_tls.h) over a raw
 * non-blocking socket, stepped in the same thread as the server's loop, so
 * the test decides how the ciphertext is split and when it is read:
 * keep-alive requests and the client's identity, a certificate required
 * and missing, ciphertext dribbled a byte at a time, pipelined records
 * held inside the engine while the server stops reading, an upgrade
 * tunnelled over TLS, a handshake that never comes, a client that never
 * reads a large answer, and reload keeping the last good files.
 * Certificates come from tests/fixtures/tls_certs.sh at setup.
 */
#define _GNU_SOURCE /* memmem */
#include "om_test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "om_errno.h"
#include "om_http_server.h"
#include "om_http_tls.h"
#include "om_tls.h"

static char dir[] = "/tmp/om_test_http_tls_XXXXXX";

static const char *P(const char *name) {
  static char b[8][512];
  static int i;
  char *s = b[i++ % 8];
  snprintf(s, sizeof b[0], "%s/%s", dir, name);
  return s;
}

static int setup(void **state) {
  char cmd[1024];
  (void)state;
  if (!mkdtemp(dir))
    return -1;
  snprintf(cmd, sizeof cmd, "%s/tests/fixtures/tls_certs.sh %s", OM_SOURCE_DIR,
           dir);
  return system(cmd) == 0 ? 0 : -1;
}

static int teardown(void **state) {
  char cmd[600];
  (void)state;
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  return system(cmd) == 0 ? 0 : -1;
}

/* ------------------------------------------------------------------ */
/* the server */

typedef struct {
  uv_loop_t loop;
  uv_timer_t later; /* answers that come after the handler returned */
  om_http_tls_t *tls;
  om_http_server_t *srv;
  int port;
  int requests;
  char identity[256]; /* the first URI SAN seen, or "-" */
  int was_tls;
  om_http_request_t *held; /* answered from the timer */
  om_tunnel_t *tun;
  int tun_closed;
} fx_t;

static void answer_held(uv_timer_t *t) {
  fx_t *fx = t->data;
  if (fx->held != NULL) {
    om_http_request_t *r = fx->held;
    fx->held = NULL;
    om_http_respond(r, 200, NULL, 0, "late", 4);
  }
}

static void tun_data(void *ud, const char *d, size_t n) {
  fx_t *fx = ud;
  om_tunnel_write(fx->tun, d, n); /* echo */
}

static void tun_eof(void *ud) {
  fx_t *fx = ud;
  om_tunnel_shutdown(fx->tun);
}

static void tun_close(void *ud, int err) {
  fx_t *fx = ud;
  (void)err;
  fx->tun_closed = 1;
  fx->tun = NULL;
}

static char big[4u << 20];

static void on_request(om_http_request_t *req, void *ud) {
  fx_t *fx = ud;
  const om_tls_identity_t *id = om_http_request_identity(req);
  fx->requests++;
  fx->was_tls = om_http_request_is_tls(req);
  snprintf(fx->identity, sizeof fx->identity, "%s",
           id != NULL && id->n_uris > 0 ? id->uris[0] : "-");
  if (strcmp(req->path, "/late") == 0) {
    fx->held = req;
    uv_timer_start(&fx->later, answer_held, 20, 0);
    return;
  }
  if (strcmp(req->path, "/big") == 0) {
    om_http_respond(req, 200, NULL, 0, big, sizeof big);
    return;
  }
  if (om_http_request_is_upgrade(req)) {
    static const om_tunnel_callbacks_t cb = {tun_data, tun_eof, NULL,
                                             tun_close};
    om_http_header_t h[1] = {{"Upgrade", "echo", 0, 0}};
    assert_int_equal(om_http_response_upgrade(req, h, 1, &cb, fx, &fx->tun), 0);
    return;
  }
  om_http_respond(req, 200, NULL, 0, fx->identity, strlen(fx->identity));
}

static void fx_start(fx_t *fx, const char *client_ca, uint64_t timeout_ms) {
  om_http_tls_opts_t to = {0};
  om_http_server_opts_t so = {0};
  char err[512] = "";
  memset(fx, 0, sizeof *fx);
  assert_int_equal(uv_loop_init(&fx->loop), 0);
  uv_timer_init(&fx->loop, &fx->later);
  fx->later.data = fx;
  to.cert_file = P("server.pem");
  to.key_file = P("server.key");
  to.client_ca_file = client_ca != NULL ? P(client_ca) : NULL;
  if (om_http_tls_new(&fx->loop, &to, &fx->tls, err, sizeof err) != 0)
    fail_msg("om_http_tls_new: %s", err);
  so.tls = fx->tls;
  so.max_pipelined = 1;
  so.header_timeout_ms = timeout_ms;
  so.idle_timeout_ms = timeout_ms;
  assert_int_equal(om_http_server_new(&fx->loop, &so, on_request, fx, &fx->srv),
                   0);
  assert_int_equal(om_http_server_listen(fx->srv, "127.0.0.1", 0), 0);
  fx->port = om_http_server_port(fx->srv);
}

static void fx_stop(fx_t *fx) {
  om_http_server_close(fx->srv, NULL);
  om_http_tls_close(fx->tls);
  uv_close((uv_handle_t *)&fx->later, NULL);
  uv_run(&fx->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&fx->loop), 0);
}

/* ------------------------------------------------------------------ */
/* the client: the engine over a raw socket */

typedef struct {
  int fd;
  om_tls_t *e;
  om_tls_ctx_t *ctx;
  int eof, failed, notified; /* notified: the server's close_notify came */
  size_t dribble; /* >0: send the ciphertext this many bytes at a time */
  char in[1u << 16];
  size_t in_len;
} cli_t;

static void cli_new(cli_t *c, int port, const char *cert) {
  om_tls_opts_t o = {.role = OM_TLS_CLIENT, .ca_file = P("ca.pem")};
  om_tls_conn_opts_t co = {.host = "localhost"};
  struct sockaddr_in a = {0};
  char err[256] = "";
  memset(c, 0, sizeof *c);
  if (cert != NULL) { /* "client-a": client-a.pem and client-a.key */
    char name[64];
    snprintf(name, sizeof name, "%.50s.pem", cert);
    o.cert_file = P(name);
    snprintf(name, sizeof name, "%.50s.key", cert);
    o.key_file = P(name);
  }
  if (om_tls_ctx_new(&o, &c->ctx, err, sizeof err) != 0)
    fail_msg("client ctx: %s", err);
  assert_int_equal(om_tls_new(c->ctx, &co, &c->e, err, sizeof err), 0);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  c->fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_int_equal(connect(c->fd, (struct sockaddr *)&a, sizeof a), 0);
  fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
}

static void cli_free(cli_t *c) {
  om_tls_free(c->e);
  om_tls_ctx_unref(c->ctx);
  if (c->fd >= 0)
    close(c->fd);
}

/* Ciphertext out, to the socket (dribbled when asked), the loop turned
 * between sends. */
static void cli_flush(fx_t *fx, cli_t *c) {
  char buf[16384];
  size_t n;
  while ((n = om_tls_out_take(c->e, buf, sizeof buf)) > 0) {
    size_t off = 0;
    while (off < n) {
      size_t k = c->dribble ? c->dribble : n - off;
      ssize_t w;
      if (k > n - off)
        k = n - off;
      w = send(c->fd, buf + off, k, MSG_NOSIGNAL);
      if (w > 0)
        off += (size_t)w;
      else if (errno != EAGAIN) {
        c->failed = 1;
        return;
      }
      uv_run(&fx->loop, UV_RUN_NOWAIT);
    }
  }
}

/* One turn: the loop, then ciphertext in (up to ms), decrypted. */
static void cli_step(fx_t *fx, cli_t *c, int ms) {
  struct pollfd p = {c->fd, POLLIN, 0};
  uv_run(&fx->loop, UV_RUN_NOWAIT);
  if (!c->eof && poll(&p, 1, ms) > 0) {
    char buf[16384];
    ssize_t n = recv(c->fd, buf, sizeof buf, 0);
    if (n > 0)
      assert_int_equal(om_tls_feed(c->e, buf, (size_t)n), 0);
    else if (n == 0 || errno != EAGAIN)
      c->eof = 1;
  }
  if (!om_tls_handshake_done(c->e)) {
    int rc = om_tls_handshake(c->e);
    if (rc < 0)
      c->failed = 1;
  }
  for (;;) {
    size_t got = 0;
    int rc;
    if (c->in_len == sizeof c->in)
      break;
    rc = om_tls_read(c->e, c->in + c->in_len, sizeof c->in - c->in_len, &got);
    if (rc == 0) {
      c->in_len += got;
      continue;
    }
    if (rc == OM_TLS_CLOSED)
      c->eof = c->notified = 1;
    else if (rc < 0)
      c->failed = 1;
    break;
  }
  cli_flush(fx, c);
  uv_run(&fx->loop, UV_RUN_NOWAIT);
}

static void cli_send(fx_t *fx, cli_t *c, const char *s) {
  assert_int_equal(om_tls_write(c->e, s, strlen(s)), 0);
  cli_flush(fx, c);
}

/* Turn until the handshake is done or failed (2 s at most). */
static int cli_handshake(fx_t *fx, cli_t *c) {
  uint64_t t0 = uv_hrtime();
  (void)om_tls_handshake(c->e);
  cli_flush(fx, c);
  while (!om_tls_handshake_done(c->e) && !c->failed && !c->eof &&
         uv_hrtime() - t0 < 2000000000u)
    cli_step(fx, c, 5);
  return om_tls_handshake_done(c->e) && !c->failed ? 0 : -1;
}

/* Turn until the decrypted input holds `n` copies of needle (or EOF). */
static int cli_wait(fx_t *fx, cli_t *c, const char *needle, int n) {
  uint64_t t0 = uv_hrtime();
  for (;;) {
    int k = 0;
    const char *p = c->in;
    while ((p = memmem(p, c->in_len - (size_t)(p - c->in), needle,
                       strlen(needle))) != NULL) {
      k++;
      p++;
    }
    if (k >= n)
      return 1;
    if (c->eof || c->failed || uv_hrtime() - t0 > 3000000000u)
      return 0;
    cli_step(fx, c, 5);
  }
}

/* ------------------------------------------------------------------ */

static void keep_alive_requests_see_the_client_identity(void **state) {
  fx_t fx;
  cli_t c;
  (void)state;
  fx_start(&fx, "ca.pem", 2000);
  cli_new(&c, fx.port, "client-a");
  assert_int_equal(cli_handshake(&fx, &c), 0);
  cli_send(&fx, &c, "GET /a HTTP/1.1\r\nHost: x\r\n\r\n");
  assert_true(cli_wait(&fx, &c, "spiffe://mesh/ns/a/sa/x", 1));
  cli_send(&fx, &c, "GET /b HTTP/1.1\r\nHost: x\r\n\r\n");
  assert_true(cli_wait(&fx, &c, "HTTP/1.1 200", 2));
  OM_ASSERT_CMP(fx.requests, ==, 2);
  OM_ASSERT_CMP(fx.was_tls, ==, 1);
  OM_ASSERT_CMP(om_http_tls_stats(fx.tls)->handshakes[OM_HTTP_TLS_OK], ==, 1);
  cli_free(&c);
  fx_stop(&fx);
}

/* Connection: close: the answer, then close_notify before the FIN. */
static void a_graceful_close_sends_close_notify(void **state) {
  fx_t fx;
  cli_t c;
  uint64_t t0;
  (void)state;
  fx_start(&fx, NULL, 2000);
  cli_new(&c, fx.port, NULL);
  assert_int_equal(cli_handshake(&fx, &c), 0);
  cli_send(&fx, &c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  t0 = uv_hrtime();
  while (!c.eof && uv_hrtime() - t0 < 2000000000u)
    cli_step(&fx, &c, 5);
  assert_non_null(memmem(c.in, c.in_len, "HTTP/1.1 200", 12));
  OM_ASSERT_CMP(c.notified, ==, 1);
  cli_free(&c);
  fx_stop(&fx);
}

static void a_missing_client_certificate_fails_the_handshake(void **state) {
  fx_t fx;
  cli_t c;
  uint64_t t0;
  (void)state;
  fx_start(&fx, "ca.pem", 2000);
  cli_new(&c, fx.port, NULL);
  (void)cli_handshake(&fx, &c);
  /* TLS 1.3: the client may finish first; its request meets the alert */
  cli_send(&fx, &c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  t0 = uv_hrtime();
  while (!c.eof && uv_hrtime() - t0 < 2000000000u)
    cli_step(&fx, &c, 5);
  OM_ASSERT_CMP(c.eof || c.failed, ==, 1);
  OM_ASSERT_CMP(fx.requests, ==, 0);
  OM_ASSERT_CMP(om_http_tls_stats(fx.tls)->handshakes[OM_HTTP_TLS_ERROR], ==,
                1);
  cli_free(&c);
  fx_stop(&fx);
}

static void ciphertext_dribbled_a_byte_at_a_time(void **state) {
  fx_t fx;
  cli_t c;
  (void)state;
  fx_start(&fx, NULL, 5000);
  cli_new(&c, fx.port, NULL);
  c.dribble = 1;
  assert_int_equal(cli_handshake(&fx, &c), 0);
  cli_send(&fx, &c, "GET /x HTTP/1.1\r\nHost: x\r\n\r\n");
  assert_true(cli_wait(&fx, &c, "HTTP/1.1 200", 1));
  assert_non_null(memmem(c.in, c.in_len, "\r\n\r\n-", 5)); /* no identity */
  cli_free(&c);
  fx_stop(&fx);
}

/* max_pipelined 1: after the first record the server stops reading with
 * the other requests still inside its engine; answering resumes it, and
 * no byte from the client comes to wake it up. */
static void pipelined_records_wait_inside_the_engine(void **state) {
  fx_t fx;
  cli_t c;
  (void)state;
  fx_start(&fx, NULL, 5000);
  cli_new(&c, fx.port, NULL);
  assert_int_equal(cli_handshake(&fx, &c), 0);
  for (int i = 0; i < 8; i++) /* one record each, one TCP send */
    assert_int_equal(
        om_tls_write(c.e, "GET /late HTTP/1.1\r\nHost: x\r\n\r\n", 31), 0);
  cli_flush(&fx, &c);
  assert_true(cli_wait(&fx, &c, "late", 8));
  OM_ASSERT_CMP(fx.requests, ==, 8);
  cli_free(&c);
  fx_stop(&fx);
}

static void an_upgrade_tunnels_over_tls(void **state) {
  fx_t fx;
  cli_t c;
  uint64_t t0;
  (void)state;
  fx_start(&fx, NULL, 5000);
  cli_new(&c, fx.port, NULL);
  assert_int_equal(cli_handshake(&fx, &c), 0);
  /* the tunnel's first bytes in the same record as the request */
  cli_send(&fx, &c,
           "GET /t HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\n"
           "Upgrade: echo\r\n\r\nping-1;");
  assert_true(cli_wait(&fx, &c, "ping-1;", 1));
  assert_non_null(memmem(c.in, c.in_len, "HTTP/1.1 101", 12));
  cli_send(&fx, &c, "ping-2;");
  assert_true(cli_wait(&fx, &c, "ping-2;", 1));
  /* our close_notify: the tunnel answers with its own, then closes */
  assert_int_equal(om_tls_shutdown(c.e), 0);
  cli_flush(&fx, &c);
  t0 = uv_hrtime();
  while (!c.eof && uv_hrtime() - t0 < 2000000000u)
    cli_step(&fx, &c, 5);
  OM_ASSERT_CMP(c.eof, ==, 1);
  t0 = uv_hrtime();
  while (!fx.tun_closed && uv_hrtime() - t0 < 2000000000u)
    cli_step(&fx, &c, 5);
  OM_ASSERT_CMP(fx.tun_closed, ==, 1);
  cli_free(&c);
  fx_stop(&fx);
}

static void a_handshake_that_never_comes_times_out(void **state) {
  fx_t fx;
  cli_t c;
  uint64_t t0;
  (void)state;
  fx_start(&fx, NULL, 150);
  cli_new(&c, fx.port, NULL); /* connected, never says hello */
  t0 = uv_hrtime();
  while (!c.eof && uv_hrtime() - t0 < 2000000000u) {
    char b[64];
    uv_run(&fx.loop, UV_RUN_NOWAIT);
    poll(NULL, 0, 5);
    if (recv(c.fd, b, sizeof b, 0) == 0)
      c.eof = 1;
  }
  OM_ASSERT_CMP(c.eof, ==, 1);
  OM_ASSERT_CMP((uv_hrtime() - t0) / 1000000u, <, 1500);
  while (om_http_server_metrics(fx.srv)->connections_active > 0 &&
         uv_hrtime() - t0 < 3000000000u) {
    uv_run(&fx.loop, UV_RUN_NOWAIT);
    poll(NULL, 0, 5);
  }
  OM_ASSERT_CMP(om_http_tls_stats(fx.tls)->handshakes[OM_HTTP_TLS_INCOMPLETE],
                ==, 1);
  cli_free(&c);
  fx_stop(&fx);
}

/* A client that asks for 4 MiB and never reads: the write stalls, the
 * idle timeout cuts it; everything is freed (the sanitizers check). */
static void a_client_that_never_reads_is_cut(void **state) {
  fx_t fx;
  cli_t c;
  uint64_t t0;
  (void)state;
  fx_start(&fx, NULL, 300);
  cli_new(&c, fx.port, NULL);
  assert_int_equal(cli_handshake(&fx, &c), 0);
  cli_send(&fx, &c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n");
  t0 = uv_hrtime();
  while (om_http_server_metrics(fx.srv)->connections_active > 0 &&
         uv_hrtime() - t0 < 3000000000u) {
    uv_run(&fx.loop, UV_RUN_NOWAIT);
    poll(NULL, 0, 10);
  }
  OM_ASSERT_CMP(om_http_server_metrics(fx.srv)->connections_active, ==, 0);
  cli_free(&c);
  fx_stop(&fx);
}

static void reload_keeps_the_last_good_files(void **state) {
  char cmd[2048], err[512];
  om_http_tls_opts_t to = {0};
  om_http_tls_t *t = NULL;
  uv_loop_t loop;
  (void)state;
  snprintf(cmd, sizeof cmd, "cp %s %s && cp %s %s", P("server.pem"),
           P("live.pem"), P("server.key"), P("live.key"));
  assert_int_equal(system(cmd), 0);
  assert_int_equal(uv_loop_init(&loop), 0);
  to.cert_file = P("live.pem");
  to.key_file = P("live.key");
  assert_int_equal(om_http_tls_new(&loop, &to, &t, err, sizeof err), 0);
  snprintf(cmd, sizeof cmd, "cp %s %s", P("garbage.pem"), P("live.pem"));
  assert_int_equal(system(cmd), 0);
  OM_ASSERT_CMP(om_http_tls_reload(t, err, sizeof err), !=, 0);
  assert_non_null(strstr(err, "live.pem: not a PEM certificate"));
  OM_ASSERT_CMP(om_http_tls_stats(t)->reloads_error, ==, 1);
  OM_ASSERT_CMP(om_http_tls_stats(t)->generation, ==, 1);
  snprintf(cmd, sizeof cmd, "cp %s %s && cp %s %s", P("wrong.pem"),
           P("live.pem"), P("wrong.key"), P("live.key"));
  assert_int_equal(system(cmd), 0);
  assert_int_equal(om_http_tls_reload(t, err, sizeof err), 0);
  OM_ASSERT_CMP(om_http_tls_stats(t)->reloads_ok, ==, 1);
  OM_ASSERT_CMP(om_http_tls_stats(t)->generation, ==, 2);
  om_http_tls_close(t);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(keep_alive_requests_see_the_client_identity),
      cmocka_unit_test(a_graceful_close_sends_close_notify),
      cmocka_unit_test(a_missing_client_certificate_fails_the_handshake),
      cmocka_unit_test(ciphertext_dribbled_a_byte_at_a_time),
      cmocka_unit_test(pipelined_records_wait_inside_the_engine),
      cmocka_unit_test(an_upgrade_tunnels_over_tls),
      cmocka_unit_test(a_handshake_that_never_comes_times_out),
      cmocka_unit_test(a_client_that_never_reads_is_cut),
      cmocka_unit_test(reload_keeps_the_last_good_files),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
