/*
 * test_tls.c: the TLS engine, a client and a server engine pumped into
 * each other in memory (no socket), with throwaway certificates made at
 * setup by tests/fixtures/tls_certs.sh.
 */
#include "om_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "om_errno.h"
#include "om_tls.h"

static char dir[] = "/tmp/om_test_tls_XXXXXX";
static char path_buf[8][512];
static int path_i;

/* DIR/name, in a small ring of buffers */
static const char *P(const char *name) {
  char *b = path_buf[path_i++ % 8];
  snprintf(b, sizeof path_buf[0], "%s/%s", dir, name);
  return b;
}

static int setup(void **state) {
  if (!mkdtemp(dir))
    return -1;
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s/tests/fixtures/tls_certs.sh %s", OM_SOURCE_DIR,
           dir);
  return system(cmd) == 0 ? 0 : -1;
}

static int teardown(void **state) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  return system(cmd) == 0 ? 0 : -1;
}

static om_tls_ctx_t *server_ctx(const char *cert, const char *key,
                                const char *client_ca) {
  om_tls_opts_t o = {.role = OM_TLS_SERVER,
                     .cert_file = P(cert),
                     .key_file = P(key),
                     .client_ca_file = client_ca ? P(client_ca) : NULL};
  om_tls_ctx_t *c = NULL;
  char err[256] = "";
  int rc = om_tls_ctx_new(&o, &c, err, sizeof err);
  if (rc != 0)
    fail_msg("server ctx: %s", err);
  return c;
}

static om_tls_ctx_t *client_ctx(const char *ca, const char *cert,
                                const char *key) {
  om_tls_opts_t o = {.role = OM_TLS_CLIENT,
                     .ca_file = ca ? P(ca) : NULL,
                     .cert_file = cert ? P(cert) : NULL,
                     .key_file = key ? P(key) : NULL};
  om_tls_ctx_t *c = NULL;
  char err[256] = "";
  int rc = om_tls_ctx_new(&o, &c, err, sizeof err);
  if (rc != 0)
    fail_msg("client ctx: %s", err);
  return c;
}

/* Move pending ciphertext from a to b; returns the bytes moved. */
static size_t move(om_tls_t *a, om_tls_t *b) {
  char buf[4096];
  size_t total = 0, n;
  while ((n = om_tls_out_take(a, buf, sizeof buf)) > 0) {
    assert_int_equal(om_tls_feed(b, buf, n), 0);
    total += n;
  }
  return total;
}

/* Pump both handshakes until neither moves; returns the client's and the
 * server's last results through *rc_c and *rc_s. */
static void pump(om_tls_t *c, om_tls_t *s, int *rc_c, int *rc_s) {
  for (int round = 0; round < 20; round++) {
    *rc_c = om_tls_handshake(c);
    size_t moved = move(c, s);
    *rc_s = om_tls_handshake(s);
    moved += move(s, c);
    if (moved == 0)
      break;
  }
}

static void connect_pair(om_tls_ctx_t *cc, om_tls_ctx_t *sc, const char *host,
                         const char *key, om_tls_t **c, om_tls_t **s) {
  char err[256] = "";
  om_tls_conn_opts_t o = {.host = host, .session_key = key};
  assert_int_equal(om_tls_new(cc, &o, c, err, sizeof err), 0);
  assert_int_equal(om_tls_new(sc, NULL, s, err, sizeof err), 0);
}

/* Read everything decryptable from t into buf (NUL-terminated). */
static size_t drain(om_tls_t *t, char *buf, size_t cap, int *last) {
  size_t total = 0, n = 0;
  while ((*last = om_tls_read(t, buf + total, cap - 1 - total, &n)) == 0)
    total += n;
  buf[total] = 0;
  return total;
}

static void handshake_and_data_both_ways(void **state) {
  om_tls_ctx_t *sc = server_ctx("server.pem", "server.key", NULL);
  om_tls_ctx_t *cc = client_ctx("ca.pem", NULL, NULL);
  om_tls_t *c, *s;
  connect_pair(cc, sc, "localhost", NULL, &c, &s);
  assert_int_equal(om_tls_handshake_done(c), 0);
  int rc_c, rc_s;
  pump(c, s, &rc_c, &rc_s);
  assert_int_equal(rc_c, 0);
  assert_int_equal(rc_s, 0);
  assert_int_equal(om_tls_handshake_done(c), 1);
  assert_int_equal(om_tls_handshake_done(s), 1);
  assert_int_equal(om_tls_verify_result(c), 0);
  assert_string_equal(om_tls_version(c), "TLSv1.3");
  char alpn[32];
  OM_ASSERT_CMP(om_tls_alpn(c, alpn, sizeof alpn), ==, 8);
  assert_string_equal(alpn, "http/1.1");
  OM_ASSERT_CMP(om_tls_alpn(s, alpn, sizeof alpn), ==, 8);

  /* client -> server, then server -> client, larger than one record */
  static char big[40000];
  for (size_t i = 0; i < sizeof big; i++)
    big[i] = (char)('a' + i % 26);
  assert_int_equal(om_tls_write(c, "GET / HTTP/1.1\r\n\r\n", 18), 0);
  OM_ASSERT_CMP(move(c, s), >, 18);
  char buf[65536];
  int last;
  OM_ASSERT_CMP(drain(s, buf, sizeof buf, &last), ==, 18);
  assert_int_equal(last, OM_TLS_WANT_READ);
  assert_string_equal(buf, "GET / HTTP/1.1\r\n\r\n");
  assert_int_equal(om_tls_write(s, big, sizeof big), 0);
  OM_ASSERT_CMP(move(s, c), >, sizeof big);
  OM_ASSERT_CMP(drain(c, buf, sizeof buf, &last), ==, sizeof big);
  assert_memory_equal(buf, big, sizeof big);

  /* a record split anywhere decrypts once it is whole */
  assert_int_equal(om_tls_write(c, "ping", 4), 0);
  char rec[256];
  size_t n = om_tls_out_take(c, rec, sizeof rec);
  OM_ASSERT_CMP(n, >, 4);
  assert_int_equal(om_tls_feed(s, rec, 3), 0);
  size_t got;
  assert_int_equal(om_tls_read(s, buf, sizeof buf, &got), OM_TLS_WANT_READ);
  assert_int_equal(om_tls_feed(s, rec + 3, n - 3), 0);
  assert_int_equal(om_tls_read(s, buf, sizeof buf, &got), 0);
  OM_ASSERT_CMP(got, ==, 4);

  /* close_notify */
  assert_int_equal(om_tls_shutdown(s), 0);
  OM_ASSERT_CMP(move(s, c), >, 0);
  assert_int_equal(om_tls_read(c, buf, sizeof buf, &got), OM_TLS_CLOSED);
  assert_int_equal(om_tls_read(c, buf, sizeof buf, &got), OM_TLS_CLOSED);

  om_tls_free(c);
  om_tls_free(s);
  om_tls_ctx_unref(cc);
  om_tls_ctx_unref(sc);
}

/* A client refused by verification, with the class and reason. */
static void expect_refused(const char *cert, const char *key, const char *host,
                           om_tls_fail_t want, const char *reason) {
  om_tls_ctx_t *sc = server_ctx(cert, key, NULL);
  om_tls_ctx_t *cc = client_ctx("ca.pem", NULL, NULL);
  om_tls_t *c, *s;
  connect_pair(cc, sc, host, NULL, &c, &s);
  int rc_c, rc_s;
  pump(c, s, &rc_c, &rc_s);
  assert_int_equal(rc_c, OM_EIO);
  if (om_tls_fail(c) != want)
    fail_msg("%s as %s: fail %s (%s), want %s", cert, host,
             om_tls_fail_name(om_tls_fail(c)), om_tls_detail(c),
             om_tls_fail_name(want));
  assert_string_equal(om_tls_reason(c), reason);
  OM_ASSERT_CMP(strlen(om_tls_detail(c)), >, 0);
  assert_int_not_equal(om_tls_verify_result(c), 0);
  /* the server saw the client's alert */
  assert_int_equal(rc_s, OM_EIO);
  assert_int_equal(om_tls_fail(s), OM_TLS_FAIL_ALERT);
  /* and the engine stays failed */
  assert_int_equal(om_tls_handshake(c), OM_EIO);
  assert_int_equal(om_tls_write(c, "x", 1), OM_EIO);
  om_tls_free(c);
  om_tls_free(s);
  om_tls_ctx_unref(cc);
  om_tls_ctx_unref(sc);
}

static void verification_failures_name_the_reason(void **state) {
  expect_refused("wrong.pem", "wrong.key", "localhost", OM_TLS_FAIL_HOSTNAME,
                 "certificate verify failed: hostname mismatch");
  expect_refused("server.pem", "server.key", "other.localhost",
                 OM_TLS_FAIL_HOSTNAME,
                 "certificate verify failed: hostname mismatch");
  /* an IP literal is checked against the IP SANs */
  expect_refused("server.pem", "server.key", "10.1.2.3", OM_TLS_FAIL_HOSTNAME,
                 "certificate verify failed: hostname mismatch");
  expect_refused("expired.pem", "expired.key", "localhost", OM_TLS_FAIL_EXPIRED,
                 "certificate verify failed: certificate has expired");
  expect_refused(
      "untrusted.pem", "untrusted.key", "localhost", OM_TLS_FAIL_UNTRUSTED,
      "certificate verify failed: unable to get local issuer certificate");
}

static void ip_literals_verify_against_ip_sans(void **state) {
  const char *hosts[] = {"127.0.0.1", "::1", "[::1]"};
  for (size_t i = 0; i < 3; i++) {
    om_tls_ctx_t *sc = server_ctx("server.pem", "server.key", NULL);
    om_tls_ctx_t *cc = client_ctx("ca.pem", NULL, NULL);
    om_tls_t *c, *s;
    connect_pair(cc, sc, hosts[i], NULL, &c, &s);
    int rc_c, rc_s;
    pump(c, s, &rc_c, &rc_s);
    if (rc_c != 0)
      fail_msg("%s: %s", hosts[i], om_tls_detail(c));
    assert_int_equal(rc_s, 0);
    om_tls_free(c);
    om_tls_free(s);
    om_tls_ctx_unref(cc);
    om_tls_ctx_unref(sc);
  }
}

static void no_verify_needs_no_name(void **state) {
  char err[256] = "";
  om_tls_ctx_t *cc = client_ctx("ca.pem", NULL, NULL);
  om_tls_t *c = NULL;
  om_tls_conn_opts_t none = {0};
  assert_int_equal(om_tls_new(cc, &none, &c, err, sizeof err), OM_EINVAL);
  assert_string_equal(err, "TLS: a verifying client needs a server name");
  om_tls_ctx_unref(cc);

  om_tls_opts_t o = {.role = OM_TLS_CLIENT, .no_verify = 1};
  assert_int_equal(om_tls_ctx_new(&o, &cc, err, sizeof err), 0);
  om_tls_ctx_t *sc = server_ctx("untrusted.pem", "untrusted.key", NULL);
  om_tls_t *s;
  assert_int_equal(om_tls_new(cc, &none, &c, err, sizeof err), 0);
  assert_int_equal(om_tls_new(sc, NULL, &s, err, sizeof err), 0);
  int rc_c, rc_s;
  pump(c, s, &rc_c, &rc_s);
  assert_int_equal(rc_c, 0);
  assert_int_equal(rc_s, 0);
  om_tls_identity_t *id = NULL;
  assert_int_equal(om_tls_peer_identity(c, &id), OM_ENOTFOUND);
  om_tls_free(c);
  om_tls_free(s);
  om_tls_ctx_unref(cc);
  om_tls_ctx_unref(sc);
}

static void client_certificate_identity_on_the_server(void **state) {
  om_tls_ctx_t *sc = server_ctx("server.pem", "server.key", "ca.pem");
  om_tls_ctx_t *cc = client_ctx("ca.pem", "client-a.pem", "client-a.key");
  om_tls_t *c, *s;
  connect_pair(cc, sc, "localhost", NULL, &c, &s);
  om_tls_identity_t *id = NULL;
  assert_int_equal(om_tls_peer_identity(s, &id), OM_ESTATE);
  int rc_c, rc_s;
  pump(c, s, &rc_c, &rc_s);
  assert_int_equal(rc_c, 0);
  if (rc_s != 0)
    fail_msg("server: %s", om_tls_detail(s));
  assert_int_equal(om_tls_peer_identity(s, &id), 0);
  assert_string_equal(id->subject, "CN=a,O=mesh");
  OM_ASSERT_CMP(id->n_uris, ==, 1);
  assert_string_equal(id->uris[0], "spiffe://mesh/ns/a/sa/x");
  OM_ASSERT_CMP(id->n_dns, ==, 0);
  om_tls_identity_free(id);
  /* the client sees the server's verified identity too */
  assert_int_equal(om_tls_peer_identity(c, &id), 0);
  assert_string_equal(id->subject, "CN=localhost");
  OM_ASSERT_CMP(id->n_dns, ==, 1);
  assert_string_equal(id->dns[0], "localhost");
  om_tls_identity_free(id);
  om_tls_free(c);
  om_tls_free(s);
  om_tls_ctx_unref(cc);

  /* a client without a certificate is refused by the server */
  cc = client_ctx("ca.pem", NULL, NULL);
  connect_pair(cc, sc, "localhost", NULL, &c, &s);
  pump(c, s, &rc_c, &rc_s);
  assert_int_equal(rc_s, OM_EIO);
  assert_int_equal(om_tls_fail(s), OM_TLS_FAIL_NO_PEER_CERT);
  assert_string_equal(om_tls_reason(s), "peer sent no certificate");
  /* TLS 1.3: the client learns it on its next read */
  char buf[64];
  size_t n;
  int r = om_tls_read(c, buf, sizeof buf, &n);
  assert_int_equal(r, OM_EIO);
  assert_int_equal(om_tls_fail(c), OM_TLS_FAIL_ALERT);
  om_tls_free(c);
  om_tls_free(s);
  om_tls_ctx_unref(cc);

  /* a certificate from another CA is refused too */
  cc = client_ctx("ca.pem", "untrusted.pem", "untrusted.key");
  connect_pair(cc, sc, "localhost", NULL, &c, &s);
  pump(c, s, &rc_c, &rc_s);
  assert_int_equal(rc_s, OM_EIO);
  assert_int_equal(om_tls_fail(s), OM_TLS_FAIL_UNTRUSTED);
  om_tls_free(c);
  om_tls_free(s);
  om_tls_ctx_unref(cc);
  om_tls_ctx_unref(sc);
}

static void sessions_resume_per_key(void **state) {
  om_tls_ctx_t *sc = server_ctx("server.pem", "server.key", NULL);
  om_tls_ctx_t *cc = client_ctx("ca.pem", NULL, NULL);
  const char *keys[] = {"127.0.0.1:1|localhost", "127.0.0.1:1|localhost",
                        "127.0.0.1:2|localhost"};
  int want[] = {0, 1, 0};
  for (int i = 0; i < 3; i++) {
    om_tls_t *c, *s;
    connect_pair(cc, sc, "localhost", keys[i], &c, &s);
    int rc_c, rc_s;
    pump(c, s, &rc_c, &rc_s);
    assert_int_equal(rc_c, 0);
    assert_int_equal(rc_s, 0);
    OM_ASSERT_CMP(om_tls_session_reused(c), ==, want[i]);
    /* TLS 1.3 tickets come after the handshake: the client reads them */
    char buf[64];
    size_t n;
    assert_int_equal(om_tls_read(c, buf, sizeof buf, &n), OM_TLS_WANT_READ);
    om_tls_free(c);
    om_tls_free(s);
  }
  /* after a reload, sessions verified against the old files are dropped */
  char err[256];
  assert_int_equal(om_tls_ctx_reload(cc, err, sizeof err), 0);
  om_tls_t *c, *s;
  connect_pair(cc, sc, "localhost", keys[0], &c, &s);
  int rc_c, rc_s;
  pump(c, s, &rc_c, &rc_s);
  assert_int_equal(rc_c, 0);
  assert_int_equal(om_tls_session_reused(c), 0);
  om_tls_free(c);
  om_tls_free(s);
  om_tls_ctx_unref(cc);
  om_tls_ctx_unref(sc);
}

static void copy_file(const char *from, const char *to) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "cp %s %s", from, to);
  assert_int_equal(system(cmd), 0);
}

static void reload_keeps_the_last_good(void **state) {
  copy_file(P("server.pem"), P("live.pem"));
  copy_file(P("server.key"), P("live.key"));
  om_tls_ctx_t *sc = server_ctx("live.pem", "live.key", NULL);
  om_tls_ctx_t *cc = client_ctx("ca.pem", NULL, NULL);
  OM_ASSERT_CMP(om_tls_ctx_generation(sc), ==, 1);

  /* an engine made before a reload keeps its SSL_CTX */
  om_tls_t *old_c, *old_s;
  connect_pair(cc, sc, "localhost", NULL, &old_c, &old_s);

  copy_file(P("garbage.pem"), P("live.pem"));
  char err[256] = "";
  assert_int_equal(om_tls_ctx_reload(sc, err, sizeof err), OM_EPARSE);
  char want[600];
  snprintf(want, sizeof want, "cert_file %s: not a PEM certificate",
           P("live.pem"));
  assert_string_equal(err, want);
  OM_ASSERT_CMP(om_tls_ctx_generation(sc), ==, 1);
  /* still serving the last good certificate */
  om_tls_t *c, *s;
  connect_pair(cc, sc, "localhost", NULL, &c, &s);
  int rc_c, rc_s;
  pump(c, s, &rc_c, &rc_s);
  assert_int_equal(rc_c, 0);
  om_tls_free(c);
  om_tls_free(s);

  /* a certificate without its key is refused as well */
  copy_file(P("wrong.pem"), P("live.pem"));
  assert_int_equal(om_tls_ctx_reload(sc, err, sizeof err), OM_EPARSE);
  snprintf(want, sizeof want,
           "key_file %s: the key does not match the certificate",
           P("live.key"));
  assert_string_equal(err, want);
  OM_ASSERT_CMP(om_tls_ctx_generation(sc), ==, 1);

  /* a good pair is taken: new connections see the new certificate */
  copy_file(P("wrong.key"), P("live.key"));
  assert_int_equal(om_tls_ctx_reload(sc, err, sizeof err), 0);
  OM_ASSERT_CMP(om_tls_ctx_generation(sc), ==, 2);
  connect_pair(cc, sc, "localhost", NULL, &c, &s);
  pump(c, s, &rc_c, &rc_s);
  assert_int_equal(rc_c, OM_EIO);
  assert_int_equal(om_tls_fail(c), OM_TLS_FAIL_HOSTNAME);
  om_tls_free(c);
  om_tls_free(s);
  /* the engine made earlier still has the old certificate */
  pump(old_c, old_s, &rc_c, &rc_s);
  assert_int_equal(rc_c, 0);
  assert_int_equal(rc_s, 0);
  om_tls_free(old_c);
  om_tls_free(old_s);
  /* released contexts outlive nothing: unref after the engines */
  om_tls_ctx_unref(cc);
  om_tls_ctx_unref(sc);
}

static void bad_files_give_named_errors(void **state) {
  char err[512], want[700];
  om_tls_ctx_t *c = NULL;
  om_tls_opts_t o = {.role = OM_TLS_SERVER,
                     .cert_file = P("garbage.pem"),
                     .key_file = P("server.key"),
                     .cert_label = "--tls-cert",
                     .key_label = "--tls-key"};
  assert_int_equal(om_tls_ctx_new(&o, &c, err, sizeof err), OM_EPARSE);
  snprintf(want, sizeof want, "--tls-cert %s: not a PEM certificate",
           P("garbage.pem"));
  assert_string_equal(err, want);
  assert_null(c);

  o.cert_file = P("server.pem");
  o.key_file = P("garbage.pem");
  assert_int_equal(om_tls_ctx_new(&o, &c, err, sizeof err), OM_EPARSE);
  snprintf(want, sizeof want, "--tls-key %s: not a PEM private key",
           P("garbage.pem"));
  assert_string_equal(err, want);

  /* a certificate given as the key */
  o.key_file = P("server.pem");
  assert_int_equal(om_tls_ctx_new(&o, &c, err, sizeof err), OM_EPARSE);

  o.key_file = P("client-a.key");
  assert_int_equal(om_tls_ctx_new(&o, &c, err, sizeof err), OM_EPARSE);
  snprintf(want, sizeof want,
           "--tls-key %s: the key does not match the certificate",
           P("client-a.key"));
  assert_string_equal(err, want);

  o.key_file = P("missing.key");
  assert_int_equal(om_tls_ctx_new(&o, &c, err, sizeof err), OM_EINVAL);
  snprintf(want, sizeof want,
           "--tls-key %s: cannot read: No such file or directory",
           P("missing.key"));
  assert_string_equal(err, want);

  /* unreadable by permissions (not testable as root: root reads all) */
  if (geteuid() != 0) {
    copy_file(P("server.key"), P("locked.key"));
    char cmd[600];
    snprintf(cmd, sizeof cmd, "chmod 000 %s", P("locked.key"));
    assert_int_equal(system(cmd), 0);
    o.key_file = P("locked.key");
    assert_int_equal(om_tls_ctx_new(&o, &c, err, sizeof err), OM_EINVAL);
    snprintf(want, sizeof want, "--tls-key %s: cannot read: Permission denied",
             P("locked.key"));
    assert_string_equal(err, want);
  }

  o.key_file = NULL;
  assert_int_equal(om_tls_ctx_new(&o, &c, err, sizeof err), OM_EINVAL);
  assert_string_equal(err, "--tls-key: required with --tls-cert");
  o.cert_file = NULL;
  assert_int_equal(om_tls_ctx_new(&o, &c, err, sizeof err), OM_EINVAL);
  assert_string_equal(err, "--tls-cert: required for a TLS listener");

  om_tls_opts_t oc = {.role = OM_TLS_CLIENT,
                      .ca_file = P("garbage.pem"),
                      .ca_label = "--upstream-ca"};
  assert_int_equal(om_tls_ctx_new(&oc, &c, err, sizeof err), OM_EPARSE);
  snprintf(want, sizeof want, "--upstream-ca %s: not a PEM certificate",
           P("garbage.pem"));
  assert_string_equal(err, want);
  oc.ca_file = NULL;
  oc.alpn = "h2,,http/1.1";
  assert_int_equal(om_tls_ctx_new(&oc, &c, err, sizeof err), OM_EINVAL);
  assert_null(c);
}

static void alpn_server_preference(void **state) {
  om_tls_opts_t so = {.role = OM_TLS_SERVER,
                      .cert_file = P("server.pem"),
                      .key_file = P("server.key"),
                      .alpn = "h2,http/1.1"};
  om_tls_opts_t co = {
      .role = OM_TLS_CLIENT, .ca_file = P("ca.pem"), .alpn = "http/1.1,h2"};
  om_tls_ctx_t *sc, *cc;
  char err[256];
  assert_int_equal(om_tls_ctx_new(&so, &sc, err, sizeof err), 0);
  assert_int_equal(om_tls_ctx_new(&co, &cc, err, sizeof err), 0);
  om_tls_t *c, *s;
  connect_pair(cc, sc, "localhost", NULL, &c, &s);
  int rc_c, rc_s;
  pump(c, s, &rc_c, &rc_s);
  assert_int_equal(rc_c, 0);
  char alpn[16];
  om_tls_alpn(c, alpn, sizeof alpn);
  assert_string_equal(alpn, "h2");
  om_tls_free(c);
  om_tls_free(s);
  om_tls_ctx_unref(cc);
  /* nothing shared: no ALPN, the handshake goes on */
  co.alpn = "spdy/3";
  assert_int_equal(om_tls_ctx_new(&co, &cc, err, sizeof err), 0);
  connect_pair(cc, sc, "localhost", NULL, &c, &s);
  pump(c, s, &rc_c, &rc_s);
  assert_int_equal(rc_c, 0);
  OM_ASSERT_CMP(om_tls_alpn(c, alpn, sizeof alpn), ==, 0);
  om_tls_free(c);
  om_tls_free(s);
  om_tls_ctx_unref(cc);
  om_tls_ctx_unref(sc);
}

/* Fail each allocation of ours in turn: an error, nothing half-made. */
static void allocation_failures(void **state) {
  om_tls_opts_t so = {.role = OM_TLS_SERVER,
                      .cert_file = P("server.pem"),
                      .key_file = P("server.key"),
                      .client_ca_file = P("ca.pem")};
  char err[256];
  om_tls_ctx_t *sc = NULL;
  for (long n = 0;; n++) {
    om_test_fail_alloc_after(n);
    int rc = om_tls_ctx_new(&so, &sc, err, sizeof err);
    om_test_alloc_reset();
    if (rc == 0)
      break;
    assert_int_equal(rc, OM_ENOMEM);
    assert_null(sc);
  }
  om_tls_ctx_t *cc = client_ctx("ca.pem", "client-b.pem", "client-b.key");
  for (long n = 0;; n++) {
    om_tls_t *c = NULL, *s = NULL;
    om_tls_conn_opts_t o = {.host = "localhost", .session_key = "k"};
    assert_int_equal(om_tls_new(cc, &o, &c, err, sizeof err), 0);
    om_test_fail_alloc_after(n);
    int rc = om_tls_new(sc, NULL, &s, err, sizeof err);
    om_test_alloc_reset();
    if (rc != 0) {
      assert_int_equal(rc, OM_ENOMEM);
      om_tls_free(c);
      continue;
    }
    int rc_c, rc_s;
    pump(c, s, &rc_c, &rc_s);
    assert_int_equal(rc_s, 0);
    om_tls_identity_t *id = NULL;
    om_test_fail_alloc_after(n);
    rc = om_tls_peer_identity(s, &id);
    om_test_alloc_reset();
    om_tls_free(c);
    om_tls_free(s);
    if (rc == 0) {
      assert_string_equal(id->uris[0], "spiffe://mesh/ns/b/sa/y");
      om_tls_identity_free(id);
      break;
    }
    assert_int_equal(rc, OM_ENOMEM);
  }
  om_tls_ctx_unref(cc);
  om_tls_ctx_unref(sc);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(handshake_and_data_both_ways),
      cmocka_unit_test(verification_failures_name_the_reason),
      cmocka_unit_test(ip_literals_verify_against_ip_sans),
      cmocka_unit_test(no_verify_needs_no_name),
      cmocka_unit_test(client_certificate_identity_on_the_server),
      cmocka_unit_test(sessions_resume_per_key),
      cmocka_unit_test(reload_keeps_the_last_good),
      cmocka_unit_test(bad_files_give_named_errors),
      cmocka_unit_test(alpn_server_preference),
      cmocka_unit_test(allocation_failures),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
