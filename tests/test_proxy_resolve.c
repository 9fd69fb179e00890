/*
 * test_proxy_resolve.c: peers by name inside the proxy (white-box, through
 * om_proxy_internal.h), with names answered by a hosts file
 * (OPENMESH_RESOLVE_HOSTS) so every case is deterministic: a name in the
 * file resolves and its peer becomes ready with the file's address and
 * the URL's port; a name missing from it stays unready (as an https peer
 * in this build); a name with two addresses moves to the second on a
 * connect failure and says when every address failed; a name that leaves
 * the file keeps its last good address; a new revision with the same id
 * and URL keeps the peer and its state; closing with a lookup due or in
 * flight frees everything (the sanitizers check that).
 */
#include "om_test.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <uv.h>

#include "om_errno.h"
#include "om_log.h"
#include "om_proxy.h"
#include "om_proxy_internal.h"
#include "om_snapshot.h"

static char g_dir[64], g_hosts[128];

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

typedef struct {
  uv_loop_t loop;
  om_proxy_t *proxy;
  int closed;
} env_t;

static void on_closed(void *ud) {
  *(int *)ud = 1;
}

static void env_start(env_t *e) {
  om_proxy_opts_t o;
  char policy[160], err[512];
  memset(e, 0, sizeof *e);
  assert_int_equal(uv_loop_init(&e->loop), 0);
  snprintf(policy, sizeof policy, "%s/traffic.lua", g_dir);
  write_file(policy, "return { kind = \"traffic\",\n"
                     "  subset = function(_, peers) return peers end,\n"
                     "  resolve_interval_ms = 20 }\n");
  memset(&o, 0, sizeof o);
  o.policy_path = policy;
  o.seed = 7;
  if (om_proxy_new(&e->loop, &o, &e->proxy, err, sizeof err) != 0)
    fail_msg("om_proxy_new: %s", err);
}

static void env_stop(env_t *e) {
  uint64_t t0 = uv_hrtime();
  assert_int_equal(om_proxy_close(e->proxy, on_closed, &e->closed), 0);
  while (!e->closed && uv_hrtime() - t0 < UINT64_C(5000000000))
    uv_run(&e->loop, UV_RUN_ONCE);
  assert_true(e->closed);
  uv_run(&e->loop, UV_RUN_NOWAIT);
  assert_int_equal(uv_loop_close(&e->loop), 0);
}

static void set_topology(env_t *e, uint64_t revision, const char **ids,
                         const char **urls, size_t n) {
  om_instance_t in[8];
  om_snapshot_t *s = NULL;
  char err[512];
  memset(in, 0, sizeof in);
  for (size_t i = 0; i < n; i++) {
    in[i].id = (char *)ids[i];
    in[i].url = (char *)urls[i];
    in[i].weight = 1;
    in[i].ttl_ms = 10000;
  }
  assert_int_equal(
      om_snapshot_new("web", revision, in, n, &s, NULL, NULL, NULL), 0);
  if (om_proxy_set_snapshot(e->proxy, s, err, sizeof err) != 0)
    fail_msg("om_proxy_set_snapshot: %s", err);
  om_snapshot_unref(s);
}

static om__proxy_peer_t *peer(env_t *e, const char *id) {
  om__proxy_service_t *s = om__proxy_find_service(e->proxy, "web", 3);
  assert_non_null(s);
  for (size_t i = 0; i < s->view->n; i++)
    if (strcmp(s->view->peers[i]->id, id) == 0)
      return s->view->peers[i];
  fail_msg("no peer %s", id);
  return NULL;
}

/* Run the loop until pred(peer) holds, at most 3 s. */
static int wait_until(env_t *e, const char *id,
                      int (*pred)(om__proxy_peer_t *p)) {
  uint64_t t0 = uv_hrtime();
  while (uv_hrtime() - t0 < UINT64_C(3000000000)) {
    if (pred(peer(e, id)))
      return 1;
    uv_run(&e->loop, UV_RUN_ONCE);
  }
  return pred(peer(e, id));
}

static int is_ready(om__proxy_peer_t *p) {
  return om__proxy_peer_ready(p);
}

/* The peer's /status object has a non-empty resolve_error. */
static int has_error(om__proxy_peer_t *p) {
  json_t *o = json_object();
  int yes;
  om__proxy_resolve_status(p, o, uv_hrtime());
  yes = strcmp(json_string_value(json_object_get(o, "resolve")), "stale") == 0;
  json_decref(o);
  return yes;
}

/* A literal resolution failure shows as "failed" once tried. */
static int has_failed(om__proxy_peer_t *p) {
  json_t *o = json_object();
  int yes;
  om__proxy_resolve_status(p, o, uv_hrtime());
  yes = strcmp(json_string_value(json_object_get(o, "resolve")), "failed") == 0;
  json_decref(o);
  return yes;
}

static void expect_addr(const om__proxy_peer_t *p, const char *ip, int port) {
  char got[INET_ADDRSTRLEN] = "";
  OM_ASSERT_CMP(p->target.addr.sa.sa_family, ==, AF_INET);
  uv_ip4_name(&p->target.addr.in4, got, sizeof got);
  if (strcmp(got, ip) != 0)
    fail_msg("peer %s at %s, want %s", p->id, got, ip);
  OM_ASSERT_CMP(ntohs(p->target.addr.in4.sin_port), ==, port);
}

static void names_resolve_and_fail_over(void **state) {
  static const char *ids[] = {"a", "https", "missing", "multi", "lit"};
  static const char *urls[] = {
      "http://a.test:8081/api", "https://127.0.0.1:8443",
      "http://missing.test:1", "http://multi.test:8082", "http://127.0.0.1:9"};
  env_t e;
  om__proxy_peer_t *a, *m;
  (void)state;
  write_file(g_hosts, "127.0.0.9 a.test\n"
                      "127.0.0.2 multi.test # first\n"
                      "127.0.0.3 multi.test\n");
  env_start(&e);
  set_topology(&e, 1, ids, urls, 5);
  /* a literal is ready at once; names once looked up */
  assert_true(om__proxy_peer_ready(peer(&e, "lit")));
  assert_null(peer(&e, "lit")->name);
  assert_true(wait_until(&e, "a", is_ready));
  a = peer(&e, "a");
  expect_addr(a, "127.0.0.9", 8081);
  assert_string_equal(a->target.authority, "a.test:8081");
  assert_string_equal(a->prefix, "/api");
  /* https: a literal, ready at once, with its TLS name */
  assert_true(om__proxy_peer_ready(peer(&e, "https")));
  assert_int_equal(peer(&e, "https")->target.tls, 1);
  assert_string_equal(peer(&e, "https")->target.host, "127.0.0.1");
  assert_string_equal(peer(&e, "https")->target.authority, "127.0.0.1:8443");
  /* a name the file does not know: unready, "failed" */
  assert_true(wait_until(&e, "missing", has_failed));
  assert_false(om__proxy_peer_ready(peer(&e, "missing")));
  /* two addresses: a connect failure moves on, and says when all failed */
  assert_true(wait_until(&e, "multi", is_ready));
  m = peer(&e, "multi");
  expect_addr(m, "127.0.0.2", 8082);
  OM_ASSERT_CMP(
      om__proxy_resolve_outcome(m, OM_UPSTREAM_FAIL_CONNECT, uv_hrtime()), ==,
      1);
  expect_addr(m, "127.0.0.3", 8082);
  OM_ASSERT_CMP(om__proxy_resolve_outcome(m, OM_UPSTREAM_FAIL_TIMEOUT_CONNECT,
                                          uv_hrtime()),
                ==, 0); /* both failed in this run: the peer's failure */
  expect_addr(m, "127.0.0.2", 8082);
  /* a response ends the run; other failures say nothing of the address */
  OM_ASSERT_CMP(
      om__proxy_resolve_outcome(m, OM_UPSTREAM_FAIL_MALFORMED, uv_hrtime()), ==,
      0);
  OM_ASSERT_CMP(m->addr_fails, ==, 0);
  OM_ASSERT_CMP(om__proxy_resolve_outcome(
                    peer(&e, "lit"), OM_UPSTREAM_FAIL_CONNECT, uv_hrtime()),
                ==, 0);
  /* a new revision with the same id and URL keeps the peer, resolved */
  set_topology(&e, 2, ids, urls, 5);
  assert_ptr_equal(peer(&e, "a"), a);
  assert_true(om__proxy_peer_ready(a));
  /* a.test leaves the file: lookups fail, the last good address stays */
  write_file(g_hosts, "127.0.0.2 multi.test\n");
  assert_true(wait_until(&e, "a", has_error));
  assert_true(om__proxy_peer_ready(a));
  expect_addr(a, "127.0.0.9", 8081);
  /* the list of multi.test changed: back to its first address */
  assert_true(wait_until(&e, "multi", is_ready));
  env_stop(&e);
}

/* Closing while lookups are due or in flight frees everything. */
static void close_with_lookups_pending(void **state) {
  static const char *ids[] = {"a", "b", "c"};
  static const char *urls[] = {"http://a.test:1", "http://b.test:2",
                               "http://c.test:3"};
  env_t e;
  (void)state;
  write_file(g_hosts, "127.0.0.1 a.test b.test c.test\n");
  for (int round = 0; round < 3; round++) {
    env_start(&e);
    set_topology(&e, 1, ids, urls, 3);
    for (int k = 0; k < round; k++)
      uv_run(&e.loop, UV_RUN_NOWAIT);
    env_stop(&e);
  }
}

/* The system resolver: closing does not wait for a lookup that runs; its
 * entry is freed when the answer comes (the loop still runs it). */
static void close_with_getaddrinfo_running(void **state) {
  static const char *ids[] = {"local"};
  static const char *urls[] = {"http://localhost:1"};
  env_t e;
  (void)state;
  unsetenv("OPENMESH_RESOLVE_HOSTS");
  for (int round = 0; round < 3; round++) {
    uint64_t t0;
    env_start(&e);
    set_topology(&e, 1, ids, urls, 1);
    for (int k = 0; k < round; k++)
      uv_run(&e.loop, UV_RUN_NOWAIT);
    t0 = uv_hrtime();
    assert_int_equal(om_proxy_close(e.proxy, on_closed, &e.closed), 0);
    while (!e.closed && uv_hrtime() - t0 < UINT64_C(5000000000))
      uv_run(&e.loop, UV_RUN_ONCE);
    assert_true(e.closed);
    uv_run(&e.loop, UV_RUN_DEFAULT); /* an orphaned answer, if any */
    assert_int_equal(uv_loop_close(&e.loop), 0);
  }
  setenv("OPENMESH_RESOLVE_HOSTS", g_hosts, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(names_resolve_and_fail_over),
      cmocka_unit_test(close_with_lookups_pending),
      cmocka_unit_test(close_with_getaddrinfo_running),
  };
  int rc;
  om_log_set_level(getenv("OM_TEST_LOG") != NULL ? OM_LOG_DEBUG : OM_LOG_ERROR);
  snprintf(g_dir, sizeof g_dir, "/tmp/om-resolve-test.XXXXXX");
  if (mkdtemp(g_dir) == NULL)
    return 1;
  snprintf(g_hosts, sizeof g_hosts, "%s/hosts", g_dir);
  setenv("OPENMESH_RESOLVE_HOSTS", g_hosts, 1);
  rc = cmocka_run_group_tests(tests, NULL, NULL);
  {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0)
      rc = rc ? rc : 1;
  }
  return rc;
}
