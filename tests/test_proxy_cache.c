/*
 * test_proxy_cache.c: the decision cache at any peer count. A cached
 * subset is "every peer" as a flag or a list shared by reference (a hit
 * copies nothing), equal answers share one list, a new generation runs
 * the policy again; om_policy_route_view says "every peer" for a policy
 * that returns its peers table and fills the indices otherwise.
 */
#include "om_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_policy.h"
#include "om_proxy_cache.h"

#define LIB_DIR OM_SOURCE_DIR "/lua"
#define NPEERS 5000 /* past the 4,096 a slot once held */

static const om_policy_opts_t opts = {
    .lib_dir = LIB_DIR, .instr_limit = 1000000, .wall_limit_ns = 20000000000u};

static char ids[NPEERS][16];
static om_policy_kv_t md[NPEERS];
static om_policy_peer_t peers[NPEERS];

/* NPEERS peers; peer i has metadata g = "even" or "odd". */
static om_policy_t *load_with_peers(const char *src) {
  char err[1024];
  om_policy_t *p = NULL;
  int rc =
      om_policy_load(&opts, "cache.lua", src, strlen(src), &p, err, sizeof err);
  if (rc != 0)
    fail_msg("rc %d: %s", rc, err);
  for (size_t i = 0; i < NPEERS; i++) {
    snprintf(ids[i], sizeof ids[i], "p%05zu", i);
    md[i] = (om_policy_kv_t){"g", 1, i % 2 ? "odd" : "even", i % 2 ? 3u : 4u};
    peers[i] =
        (om_policy_peer_t){ids[i], "http://127.0.0.1:1", NULL, 1.0, &md[i], 1};
  }
  assert_int_equal(om_policy_set_peers(p, peers, NPEERS), 0);
  return p;
}

static om_policy_req_t req_with(om_policy_kv_t *h, const char *g) {
  om_policy_req_t r;
  memset(&r, 0, sizeof r);
  r.service = "s";
  r.method = "GET";
  r.path = "/";
  *h = (om_policy_kv_t){"x-g", 3, g, strlen(g)};
  r.headers = h;
  r.n_headers = 1;
  return r;
}

static uint32_t scratch[NPEERS];
static om_policy_decision_t dscratch;

static void every_peer_is_a_flag(void **state) {
  om_policy_t *p = load_with_peers(
      "return { kind = 'traffic', vary = {}, subset = function(_, peers) "
      "return peers end }");
  om__proxy_cache_t c;
  om__proxy_route_t rt;
  om_policy_kv_t h;
  om_policy_req_t r = req_with(&h, "x");
  char err[256];
  (void)state;
  memset(&c, 0, sizeof c);
  for (int i = 0; i < 3; i++) { /* a miss, then hits */
    memset(scratch, 0xff, sizeof scratch);
    assert_int_equal(om__proxy_cache_route(&c, p, &r, scratch, &dscratch, &rt,
                                           err, sizeof err),
                     0);
    OM_ASSERT_CMP(rt.all, ==, 1);
    OM_ASSERT_CMP(rt.n_subset, ==, NPEERS);
    assert_null(rt.shared);
    OM_ASSERT_CMP(scratch[0], ==, UINT32_MAX); /* nothing written */
  }
  OM_ASSERT_CMP(c.misses, ==, 1);
  OM_ASSERT_CMP(c.hits, ==, 2);
  om__proxy_cache_free(&c);
  om_policy_free(p);
}

static void lists_are_shared_by_reference(void **state) {
  om_policy_t *p =
      load_with_peers("local policy = require 'openmesh.policy'\n"
                      "return { kind = 'traffic', vary = { 'x-g' },\n"
                      "  subset = function(req, peers)\n"
                      "    local g = req.headers['x-g']\n"
                      "    if g == 'any-even' then g = 'even' end\n"
                      "    return policy.by(peers, 'g', g) end }");
  om__proxy_cache_t c;
  om__proxy_route_t rt, again, other;
  om_policy_kv_t h1, h2;
  om_policy_req_t r1 = req_with(&h1, "even"), r2 = req_with(&h2, "any-even");
  char err[256];
  (void)state;
  memset(&c, 0, sizeof c);
  assert_int_equal(om__proxy_cache_route(&c, p, &r1, scratch, &dscratch, &rt,
                                         err, sizeof err),
                   0);
  assert_non_null(rt.shared);
  OM_ASSERT_CMP(rt.n_subset, ==, NPEERS / 2);
  OM_ASSERT_CMP(rt.shared->n, ==, NPEERS / 2);
  OM_ASSERT_CMP(rt.shared->ids[0], ==, 0);
  OM_ASSERT_CMP(rt.shared->ids[NPEERS / 2 - 1], ==, NPEERS - 2);
  /* a hit: the same list, one more reference, nothing copied */
  memset(scratch, 0xff, sizeof scratch);
  assert_int_equal(om__proxy_cache_route(&c, p, &r1, scratch, &dscratch, &again,
                                         err, sizeof err),
                   0);
  assert_ptr_equal(again.shared, rt.shared);
  OM_ASSERT_CMP(scratch[0], ==, UINT32_MAX);
  OM_ASSERT_CMP(c.hits, ==, 1);
  /* another key, the same answer: one list for both slots */
  assert_int_equal(om__proxy_cache_route(&c, p, &r2, scratch, &dscratch, &other,
                                         err, sizeof err),
                   0);
  assert_ptr_equal(other.shared, rt.shared);
  OM_ASSERT_CMP(c.misses, ==, 2);
  /* a new generation: the policy runs again */
  om__proxy_cache_invalidate(&c);
  om__proxy_subset_unref(again.shared);
  assert_int_equal(om__proxy_cache_route(&c, p, &r1, scratch, &dscratch, &again,
                                         err, sizeof err),
                   0);
  OM_ASSERT_CMP(c.misses, ==, 3);
  assert_non_null(again.shared);
  OM_ASSERT_CMP(again.shared->n, ==, NPEERS / 2);
  /* the calls' references outlive the cache */
  om__proxy_cache_free(&c);
  OM_ASSERT_CMP(rt.shared->ids[1], ==, 2);
  om__proxy_subset_unref(rt.shared);
  om__proxy_subset_unref(other.shared);
  om__proxy_subset_unref(again.shared);
  om_policy_free(p);
}

static void route_view_without_vary(void **state) {
  om_policy_t *p = load_with_peers(
      "local policy = require 'openmesh.policy'\n"
      "return { kind = 'traffic',\n"
      "  subset = function(req, peers)\n"
      "    local g = req.headers['x-g']\n"
      "    if g == 'all' then return peers end\n"
      "    if g == 'copy' then local t = {} for i = 1, 3 do t[i] = "
      "peers[i] end return t end\n"
      "    return policy.by(peers, 'g', g) end }");
  om_policy_kv_t h;
  om_policy_req_t r = req_with(&h, "all");
  size_t n = 0;
  int all = -1;
  const char *key;
  size_t key_len;
  char err[256];
  (void)state;
  assert_int_equal(om_policy_route_view(p, &r, scratch, &n, &all, &key,
                                        &key_len, err, sizeof err),
                   0);
  OM_ASSERT_CMP(all, ==, 1);
  OM_ASSERT_CMP(n, ==, NPEERS);
  /* the plain route fills the indices */
  assert_int_equal(
      om_policy_route(p, &r, scratch, &n, &key, &key_len, err, sizeof err), 0);
  OM_ASSERT_CMP(n, ==, NPEERS);
  OM_ASSERT_CMP(scratch[NPEERS - 1], ==, NPEERS - 1);
  /* a group: its indices, in view order */
  r = req_with(&h, "odd");
  assert_int_equal(om_policy_route_view(p, &r, scratch, &n, &all, &key,
                                        &key_len, err, sizeof err),
                   0);
  OM_ASSERT_CMP(all, ==, 0);
  OM_ASSERT_CMP(n, ==, NPEERS / 2);
  OM_ASSERT_CMP(scratch[0], ==, 1);
  OM_ASSERT_CMP(scratch[NPEERS / 2 - 1], ==, NPEERS - 1);
  /* any other table: checked entry by entry, as before */
  r = req_with(&h, "copy");
  assert_int_equal(om_policy_route_view(p, &r, scratch, &n, &all, &key,
                                        &key_len, err, sizeof err),
                   0);
  OM_ASSERT_CMP(all, ==, 0);
  OM_ASSERT_CMP(n, ==, 3);
  OM_ASSERT_CMP(scratch[2], ==, 2);
  om_policy_free(p);
}

/* A vary policy's decision is cached with its subset: a hit answers the
 * decision the policy gave for those fields, header edits and all, and
 * a request that differs in them gets its own. */
static void decisions_are_cached_with_the_subset(void **state) {
  om_policy_t *p = load_with_peers(
      "return { kind = 'traffic', vary = { 'x-g' },\n"
      "  subset = function(_, peers) return peers end,\n"
      "  decide = function(req)\n"
      "    if req.headers['x-g'] == 'none' then return nil end\n"
      "    return { deadline_ms = #req.headers['x-g'] * 100,\n"
      "      headers = { ['x-from'] = req.headers['x-g'] } } end }");
  om__proxy_cache_t c;
  om__proxy_route_t rt;
  om_policy_kv_t h1, h2, h3;
  om_policy_req_t r1 = req_with(&h1, "even"), r2 = req_with(&h2, "odd"),
                  r3 = req_with(&h3, "none");
  char err[256];
  (void)state;
  memset(&c, 0, sizeof c);
  for (int i = 0; i < 2; i++) { /* a miss, then a hit */
    assert_int_equal(om__proxy_cache_route(&c, p, &r1, scratch, &dscratch, &rt,
                                           err, sizeof err),
                     0);
    assert_non_null(rt.decision);
    OM_ASSERT_CMP(rt.decision->fields, ==, OM_DECIDE_DEADLINE);
    OM_ASSERT_CMP(rt.decision->deadline_ms, ==, 400);
    OM_ASSERT_CMP(rt.decision->n_headers, ==, 1);
    assert_memory_equal(rt.decision->bytes + rt.decision->headers[0].value,
                        "even", 4);
    memset(&dscratch, 0, sizeof dscratch); /* a hit must not read it */
  }
  OM_ASSERT_CMP(c.hits, ==, 1);
  assert_int_equal(om__proxy_cache_route(&c, p, &r2, scratch, &dscratch, &rt,
                                         err, sizeof err),
                   0);
  OM_ASSERT_CMP(rt.decision->deadline_ms, ==, 300);
  for (int i = 0; i < 2; i++) { /* nil is cached as no decision */
    assert_int_equal(om__proxy_cache_route(&c, p, &r3, scratch, &dscratch, &rt,
                                           err, sizeof err),
                     0);
    assert_null(rt.decision);
  }
  OM_ASSERT_CMP(c.hits, ==, 2);
  om__proxy_cache_free(&c);
  om_policy_free(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_peer_is_a_flag),
      cmocka_unit_test(lists_are_shared_by_reference),
      cmocka_unit_test(decisions_are_cached_with_the_subset),
      cmocka_unit_test(route_view_without_vary),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
