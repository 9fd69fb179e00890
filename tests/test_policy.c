/*
 * test_policy.c: load -> validate -> swap and the traffic call path, with
 * the real openmesh.contract and the shipped policies.
 */
#include "om_test.h"

#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_policy.h"

#define LIB_DIR OM_SOURCE_DIR "/lua"

/* A generous wall clock: the instruction budget must be what trips, even
 * under ASan on a loaded machine. */
static const om_policy_opts_t opts = {
    .lib_dir = LIB_DIR, .instr_limit = 1000000, .wall_limit_ns = 20000000000u};

static om_policy_t *load_ok(const char *name, const char *src) {
  char err[1024];
  om_policy_t *p = NULL;
  int rc = om_policy_load(&opts, name, src, strlen(src), &p, err, sizeof err);
  if (rc != 0)
    fail_msg("%s: rc %d: %s", name, rc, err);
  return p;
}

static void expect_rejected(const char *name, const char *src,
                            const char *want) {
  char err[1024];
  om_policy_t *p = NULL;
  int rc = om_policy_load(&opts, name, src, strlen(src), &p, err, sizeof err);
  if (rc != OM_EPOLICY || p != NULL || strstr(err, want) == NULL)
    fail_msg("%s: rc %d, err '%s', want OM_EPOLICY and '%s'", name, rc, err,
             want);
}

static void shipped_policies_load(void **state) {
  (void)state;
  static const struct {
    const char *path;
    om_policy_kind_t kind;
  } files[] = {
      {OM_SOURCE_DIR "/policies/traffic.lua", OM_POLICY_TRAFFIC},
      {OM_SOURCE_DIR "/policies/fallback.lua", OM_POLICY_FALLBACK},
      {OM_SOURCE_DIR "/policies/egress_heuristics.lua",
       OM_POLICY_EGRESS_HEURISTICS},
      {OM_SOURCE_DIR "/examples/policies/canary.lua", OM_POLICY_TRAFFIC},
      {OM_SOURCE_DIR "/examples/policies/metadata_match.lua",
       OM_POLICY_TRAFFIC},
      {OM_SOURCE_DIR "/examples/policies/zone_local.lua", OM_POLICY_TRAFFIC},
      {OM_SOURCE_DIR "/examples/policies/keyed_affinity.lua",
       OM_POLICY_TRAFFIC},
      {OM_SOURCE_DIR "/examples/policies/streaming.lua", OM_POLICY_TRAFFIC},
      {OM_SOURCE_DIR "/examples/policies/identity_authorize.lua",
       OM_POLICY_TRAFFIC},
  };
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char err[1024];
    om_policy_t *p = NULL;
    int rc = om_policy_load_file(&opts, files[i].path, &p, err, sizeof err);
    if (rc != 0)
      fail_msg("%s: %s", files[i].path, err);
    assert_int_equal(om_policy_kind(p), files[i].kind);
    om_policy_free(p);
  }
}

static void rejections_name_the_place(void **state) {
  (void)state;
  expect_rejected("syntax.lua", "return {kind = 'traffic',\n subset = }",
                  "syntax.lua:2:");
  expect_rejected("top.lua", "local x = nil\nreturn x.y", "top.lua:2:");
  expect_rejected("notable.lua", "return 42", "must return a table");
  expect_rejected("nosubset.lua", "return {kind = 'traffic'}", "subset");
  expect_rejected("kind.lua", "return {kind = 'trafic'}", "kind");
  expect_rejected("field.lua",
                  "return {kind = 'traffic', subset = function(r, p) "
                  "return p end, max_inflight = -3}",
                  "max_inflight");
  expect_rejected("typo.lua",
                  "return {kind = 'traffic', subset = function(r, p) "
                  "return p end, max_inflght = 3}",
                  "max_inflght");
  expect_rejected("example.lua",
                  "return {kind = 'traffic', subset = function(r, p) "
                  "return p end, examples = {{peers = {{id = 'a'}, "
                  "{id = 'b'}}, expect = {'a'}}}}",
                  "example 1");
  expect_rejected("budget.lua", "while true do end", "budget");
  expect_rejected("budget.lua", "local x = 0\nwhile true do x = x + 1 end",
                  "budget.lua: budget: instruction limit exceeded at "
                  "budget.lua:2");
  /* A budget that trips in an example names the example and the line. */
  expect_rejected(
      "spin.lua",
      "return {kind = 'traffic',\n"
      "  subset = function(r, p)\n"
      "    if r.path == '/spin' then\n"
      "      while true do end\n"
      "    end\n"
      "    return p\n"
      "  end,\n"
      "  examples = {\n"
      "    {req = {path = '/'}, peers = {{id = 'a'}}, expect = {'a'}},\n"
      "    {req = {path = '/spin'}, peers = {{id = 'a'}},\n"
      "     expect = {'a'}},\n"
      "  }}",
      "spin.lua: example 2: budget: instruction limit exceeded "
      "at spin.lua:4");
  expect_rejected("memory.lua",
                  "local t = {} for i = 1, 1e9 do "
                  "t[i] = ('x'):rep(64) .. i end",
                  "budget");
}

/* A policy cannot subvert the validator by poisoning its own _ENV. */
static void validator_is_out_of_reach(void **state) {
  (void)state;
  expect_rejected("poison.lua",
                  "require = function() return {validate = function() "
                  "return true end} end\n"
                  "pairs = function() error('poisoned') end\n"
                  "next = nil type = function() return 'function' end\n"
                  "return {kind = 'traffic'}",
                  "subset");
  expect_rejected("meta.lua",
                  "return setmetatable({kind = 'traffic'}, {__index = "
                  "function(t, k) return function(r, p) return p end end})",
                  "subset");
}

static const char *canary_src =
    "local om = require 'openmesh'\n"
    "return {kind = 'traffic',\n"
    "  key = function(req) return req.headers['x-user'] end,\n"
    "  subset = function(req, peers)\n"
    "    if req.path == '/foreign' then return {{id = 'a'}} end\n"
    "    if req.path == '/dup' then return {peers[1], peers[1]} end\n"
    "    if req.path == '/hole' then return {peers[1], nil, peers[3]} end\n"
    "    if req.path == '/string' then return 'a' end\n"
    "    if req.path == '/raise' then error('no luck') end\n"
    "    if req.path == '/loop' then while true do end end\n"
    "    local out = {}\n"
    "    for _, p in ipairs(peers) do\n"
    "      if (p.metadata.version == 'v2') == (req.headers['x-canary'] == "
    "'1') then out[#out + 1] = p end\n"
    "    end\n"
    "    return out\n"
    "  end}\n";

static void route_returns_subset_indices(void **state) {
  (void)state;
  om_policy_t *p = load_ok("canary.lua", canary_src);
  const om_policy_kv_t v2[] = {{"version", 7, "v2", 2}};
  const om_policy_peer_t peers[] = {
      {"a", "http://127.0.0.1:1/", "z1", 1, NULL, 0},
      {"b", "http://127.0.0.1:2/", NULL, 2, v2, 1},
      {"c", "http://127.0.0.1:3/", "z2", 1, NULL, 0},
  };
  const om_policy_kv_t hdr[] = {{"x-canary", 8, "1", 1},
                                {"x-user", 6, "u-42", 4}};
  om_policy_req_t req = {"svc", "GET", "/",  hdr,  2, NULL,
                         0,     NULL,  NULL, NULL, 0, 0};
  uint32_t out[3];
  size_t n = 99, klen = 0;
  const char *key = NULL;
  char err[512];
  assert_int_equal(om_policy_set_peers(p, peers, 3), 0);
  assert_int_equal(om_policy_peer_count(p), 3);
  assert_int_equal(
      om_policy_route(p, &req, out, &n, &key, &klen, err, sizeof err), 0);
  assert_int_equal(n, 1);
  assert_int_equal(out[0], 1); /* only the v2 peer */
  assert_non_null(key);
  assert_int_equal(klen, 4);
  assert_memory_equal(key, "u-42", 4);
  req.n_headers = 0; /* no canary header, no key */
  assert_int_equal(
      om_policy_route(p, &req, out, &n, &key, &klen, err, sizeof err), 0);
  assert_int_equal(n, 2);
  assert_int_equal(out[0], 0);
  assert_int_equal(out[1], 2);
  assert_null(key);
  om_policy_free(p);
}

static void route_never_widens(void **state) {
  (void)state;
  static const struct {
    const char *path, *want;
  } cases[] = {
      {"/foreign", "subset returned a peer that was not offered (id 'a')"},
      {"/dup", "subset returned the peer 'a' twice"},
      {"/hole", "subset returned a table that is not an array (a hole at [2])"},
      {"/string", "subset returned a non-table ('a'), expected an array"},
      {"/raise", "canary.lua:9: no luck"},
      {"/loop", "budget: instruction limit exceeded"},
  };
  om_policy_t *p = load_ok("canary.lua", canary_src);
  const om_policy_peer_t peers[] = {{"a", NULL, NULL, 1, NULL, 0},
                                    {"b", NULL, NULL, 1, NULL, 0},
                                    {"c", NULL, NULL, 1, NULL, 0}};
  uint32_t out[3];
  char err[512];
  assert_int_equal(om_policy_set_peers(p, peers, 3), 0);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    om_policy_req_t req = {"svc", "GET", cases[i].path, NULL, 0, NULL,
                           0,     NULL,  NULL,          NULL, 0, 0};
    size_t n = 77;
    int rc = om_policy_route(p, &req, out, &n, NULL, NULL, err, sizeof err);
    if (rc != OM_EPOLICY || n != 77 || strstr(err, cases[i].want) == NULL)
      fail_msg("%s: rc %d n %zu err '%s', want '%s'", cases[i].path, rc, n, err,
               cases[i].want);
  }
  /* ... and the same state still routes afterwards */
  om_policy_req_t ok = {"svc", "GET", "/",  NULL, 0, NULL,
                        0,     NULL,  NULL, NULL, 0, 0};
  size_t n = 0;
  assert_int_equal(
      om_policy_route(p, &ok, out, &n, NULL, NULL, err, sizeof err), 0);
  assert_int_equal(n, 3);
  om_policy_free(p);
}

/* A policy that declares vary has its decisions reused, so chance and the
 * clock are gone from its functions (its examples and the proxy alike);
 * its top level may still use them, and a policy without vary keeps them. */
static void vary_policies_lose_chance_and_the_clock(void **state) {
  static const char *const gone[] = {"math.random()", "math.randomseed(1)",
                                     "os.time()", "os.clock()"};
  char src[512], want[64];
  om_policy_t *p;
  const om_policy_peer_t peers[] = {{"a", NULL, NULL, 1, NULL, 0}};
  uint32_t out[1];
  size_t n = 0;
  char err[512];
  om_policy_req_t req = {"svc", "GET", "/",  NULL, 0, NULL,
                         0,     NULL,  NULL, NULL, 0, 0};
  (void)state;
  for (size_t i = 0; i < sizeof gone / sizeof gone[0]; i++) {
    snprintf(
        src, sizeof src,
        "return { kind = 'traffic', vary = {},\n"
        "  subset = function(_, peers) local _ = %s return peers end,\n"
        "  examples = { { peers = { { id = 'a' } }, expect = { 'a' } } } }",
        gone[i]);
    snprintf(want, sizeof want, "v.lua:2: %.*s is not available",
             (int)(strchr(gone[i], '(') - gone[i]), gone[i]);
    expect_rejected("v.lua", src, want);
    /* without vary: allowed */
    snprintf(
        src, sizeof src,
        "return { kind = 'traffic',\n"
        "  subset = function(_, peers) local _ = %s return peers end,\n"
        "  examples = { { peers = { { id = 'a' } }, expect = { 'a' } } } }",
        gone[i]);
    om_policy_free(load_ok("plain.lua", src));
  }
  /* at the top level, before vary is known: allowed; in the call path
   * (no example reached it): that request fails */
  p = load_ok("late.lua",
              "local t0 = os.time() + math.random()\n"
              "return { kind = 'traffic', vary = {},\n"
              "  subset = function(_, peers)\n"
              "    if #peers > 0 then return { peers[1], os.time() } end\n"
              "    return peers end }");
  assert_int_equal(om_policy_set_peers(p, peers, 1), 0);
  assert_int_equal(
      om_policy_route(p, &req, out, &n, NULL, NULL, err, sizeof err),
      OM_EPOLICY);
  assert_non_null(strstr(err, "late.lua:4: os.time is not available to a "
                              "policy that declares vary"));
  om_policy_free(p);
  /* a guard keeps the guarded function's own errors, at the policy's line */
  expect_rejected("argerr.lua",
                  "local x = math.random(2, 1)\n"
                  "return { kind = 'traffic', vary = {},\n"
                  "  subset = function(_, peers) return peers end }",
                  "argerr.lua:1: bad argument #1 to 'math.random' (interval "
                  "is empty)");
  /* captured at the top level, by value or through the library table: the
   * capture is sealed too; the top level itself still drew its numbers */
  p = load_ok(
      "capture.lua",
      "local r, m, t = math.random, math, os.time\n"
      "local seed = r(1000) + t()\n"
      "return { kind = 'traffic', vary = { 'x-a' },\n"
      "  subset = function(req, peers)\n"
      "    if req.headers['x-a'] == 'r' then return { peers[r(#peers)] } end\n"
      "    if req.headers['x-a'] == 'm' then return { peers[m.random(1)] } "
      "end\n"
      "    if req.headers['x-a'] == 't' then return { peers[t() % 1 + 1] } "
      "end\n"
      "    return peers end }");
  assert_int_equal(om_policy_set_peers(p, peers, 1), 0);
  {
    static const char *const how[][2] = {{"r", "capture.lua:5: math.random"},
                                         {"m", "capture.lua:6: math.random"},
                                         {"t", "capture.lua:7: os.time"}};
    for (size_t i = 0; i < sizeof how / sizeof how[0]; i++) {
      om_policy_kv_t h = {"x-a", 3, how[i][0], 1};
      om_policy_req_t hreq = {"svc", "GET", "/",  &h,   1, NULL,
                              0,     NULL,  NULL, NULL, 0, 0};
      assert_int_equal(
          om_policy_route(p, &hreq, out, &n, NULL, NULL, err, sizeof err),
          OM_EPOLICY);
      assert_non_null(strstr(err, how[i][1]));
      assert_non_null(strstr(err, "is not available to a policy that "
                                  "declares vary"));
    }
  }
  assert_int_equal(
      om_policy_route(p, &req, out, &n, NULL, NULL, err, sizeof err), 0);
  assert_int_equal(n, 1);
  om_policy_free(p);
}

/* om.select_metadata answers from the C copy of the view's metadata: it
 * must agree with a plain Lua filter over the same peers. */
static void select_metadata_fast_path_agrees(void **state) {
  (void)state;
  om_policy_t *p = load_ok(
      "select.lua",
      "local om = require 'openmesh'\n"
      "local function slow(peers, match, keep)\n"
      "  local out = {}\n"
      "  for _, peer in ipairs(peers) do\n"
      "    local ok = true\n"
      "    for k, v in pairs(match) do\n"
      "      if peer.metadata[k] ~= v then ok = false end end\n"
      "    if ok == keep then out[#out + 1] = peer end end\n"
      "  return out end\n"
      "local matches = {{version = 'v2'}, {version = 'v1', tier = 'gold'},\n"
      "  {}, {zone = 'none'}, {tier = 'gold'}}\n"
      "return {kind = 'traffic', subset = function(req, peers)\n"
      "  for _, m in ipairs(matches) do for _, keep in ipairs{true, false} do\n"
      "    local a, b = om.select_metadata(peers, m, keep), slow(peers, m, "
      "keep)\n"
      "    assert(#a == #b, 'count differs')\n"
      "    for i = 1, #a do assert(a[i] == b[i], 'peer differs') end\n"
      "  end end\n"
      "  return om.select_metadata(peers, matches[1], true) end}\n");
  const om_policy_kv_t v2[] = {{"version", 7, "v2", 2}};
  const om_policy_kv_t gold[] = {{"tier", 4, "gold", 4},
                                 {"version", 7, "v1", 2}};
  const om_policy_kv_t v2x[] = {{"version", 7, "v2x", 3}};
  const om_policy_peer_t peers[] = {
      {"a", NULL, NULL, 1, v2, 1},   {"b", NULL, NULL, 1, gold, 2},
      {"c", NULL, NULL, 1, NULL, 0}, {"d", NULL, NULL, 1, v2x, 1},
      {"e", NULL, NULL, 1, v2, 1},
  };
  om_policy_req_t req = {"svc", "GET", "/",  NULL, 0, NULL,
                         0,     NULL,  NULL, NULL, 0, 0};
  uint32_t out[5];
  size_t n = 0;
  char err[512];
  for (size_t count = 0; count <= 5; count++) { /* views of every size */
    assert_int_equal(om_policy_set_peers(p, peers, count), 0);
    if (om_policy_route(p, &req, out, &n, NULL, NULL, err, sizeof err) != 0)
      fail_msg("%zu peers: %s", count, err);
    assert_int_equal(n, count >= 5 ? 2 : count >= 1 ? 1 : 0);
  }
  om_policy_free(p);
}

static void key_must_be_a_string(void **state) {
  (void)state;
  om_policy_t *p = load_ok("key.lua", "return {kind = 'traffic', "
                                      "key = function() return 42 end, "
                                      "subset = function(r, p) return p end}");
  om_policy_req_t req = {"svc", "GET", "/",  NULL, 0, NULL,
                         0,     NULL,  NULL, NULL, 0, 0};
  char err[512];
  size_t n;
  assert_int_equal(
      om_policy_route(p, &req, NULL, &n, NULL, NULL, err, sizeof err),
      OM_EPOLICY);
  assert_non_null(strstr(err, "key returned a number"));
  om_policy_free(p);
}

/* authorize runs first: a refusal skips key and subset and says why; any
 * other answer fails the call, as for subset. */
static void authorize_refuses_first(void **state) {
  static const char src[] =
      "local calls = 0\n"
      "return { kind = 'traffic',\n"
      "  authorize = function(req)\n"
      "    local s = req.identity and req.identity.spiffe\n"
      "    if req.path == '/bad' then return false, 1 end\n"
      "    if s == 'spiffe://mesh/ns/a/sa/x' then return true end\n"
      "    return false, 'not a: ' .. tostring(s) end,\n"
      "  key = function(req) calls = calls + 1 return tostring(calls) end,\n"
      "  subset = function(_, p) return p end }\n";
  om_policy_t *p = load_ok("authorize.lua", src);
  const om_policy_peer_t peers[] = {{"a", NULL, NULL, 1, NULL, 0}};
  const char *uri_a[] = {"urn:x", "spiffe://mesh/ns/a/sa/x"};
  const char *uri_b[] = {"spiffe://mesh/ns/b/sa/y"};
  om_policy_identity_t a = {"CN=a", uri_a, 2, NULL, 0};
  om_policy_identity_t b = {"CN=b", uri_b, 1, NULL, 0};
  om_policy_req_t req = {"svc", "GET", "/",  NULL, 0, NULL,
                         0,     &a,    NULL, NULL, 0, 0};
  uint32_t out[1];
  size_t n = 9, klen = 0;
  const char *key = NULL;
  char err[512];
  assert_int_equal(om_policy_has_authorize(p), 1);
  assert_int_equal(om_policy_set_peers(p, peers, 1), 0);
  assert_int_equal(
      om_policy_route(p, &req, out, &n, &key, &klen, err, sizeof err), 0);
  OM_ASSERT_CMP(n, ==, 1);
  assert_string_equal(key, "1");
  req.identity = &b;
  OM_ASSERT_CMP(om_policy_route(p, &req, out, &n, &key, &klen, err, sizeof err),
                ==, OM_POLICY_DENIED);
  assert_string_equal(err, "not a: spiffe://mesh/ns/b/sa/y");
  OM_ASSERT_CMP(n, ==, 0);
  assert_null(key);
  req.identity = NULL;
  OM_ASSERT_CMP(om_policy_authorize(p, &req, err, sizeof err), ==,
                OM_POLICY_DENIED);
  assert_string_equal(err, "not a: nil");
  req.identity = &a;
  OM_ASSERT_CMP(om_policy_authorize(p, &req, err, sizeof err), ==, 0);
  /* key ran only on the allowed route call: the next key is "2" */
  assert_int_equal(
      om_policy_route(p, &req, out, &n, &key, &klen, err, sizeof err), 0);
  assert_string_equal(key, "2");
  req.path = "/bad";
  OM_ASSERT_CMP(om_policy_route(p, &req, out, &n, NULL, NULL, err, sizeof err),
                ==, OM_EPOLICY);
  assert_non_null(strstr(err, "authorize returned false and a number (1)"));
  om_policy_free(p);
  p = load_ok("plain.lua", canary_src);
  assert_int_equal(om_policy_has_authorize(p), 0);
  OM_ASSERT_CMP(om_policy_authorize(p, &req, err, sizeof err), ==, 0);
  om_policy_free(p);
}

/* vary = { ":identity" } shows req.identity; without it a vary policy
 * sees nil. */
static void vary_identity_is_declared(void **state) {
  static const char with[] =
      "return { kind = 'traffic', vary = { ':identity' },\n"
      "  authorize = function(req)\n"
      "    return false, req.identity and req.identity.subject or 'nil' end,\n"
      "  subset = function(_, p) return p end }\n";
  static const char without[] =
      "return { kind = 'traffic', vary = { 'x-a' },\n"
      "  authorize = function(req)\n"
      "    return false, req.identity and req.identity.subject or 'nil' end,\n"
      "  subset = function(_, p) return p end }\n";
  om_policy_identity_t a = {"CN=a", NULL, 0, NULL, 0};
  om_policy_req_t req = {"svc", "GET", "/",  NULL, 0, NULL,
                         0,     &a,    NULL, NULL, 0, 0};
  const char *const *names;
  size_t n;
  int method, path, identity;
  char err[512];
  om_policy_t *p = load_ok("with.lua", with);
  assert_int_equal(om_policy_vary(p, &names, &n, &method, &path, &identity), 1);
  OM_ASSERT_CMP(n, ==, 0);
  OM_ASSERT_CMP(identity, ==, 1);
  OM_ASSERT_CMP(om_policy_authorize(p, &req, err, sizeof err), ==,
                OM_POLICY_DENIED);
  assert_string_equal(err, "CN=a");
  om_policy_free(p);
  p = load_ok("without.lua", without);
  assert_int_equal(om_policy_vary(p, &names, &n, &method, &path, &identity), 1);
  OM_ASSERT_CMP(identity, ==, 0);
  OM_ASSERT_CMP(om_policy_authorize(p, &req, err, sizeof err), ==,
                OM_POLICY_DENIED);
  assert_string_equal(err, "nil");
  om_policy_free(p);
}

static void load_survives_allocation_failures(void **state) {
  (void)state;
  const char *src = "return {kind = 'traffic', subset = function(r, p) "
                    "return p end}";
  int succeeded = 0;
  /* Dense at first, then sparser: a load makes thousands of allocations. */
  for (long n = 0; n < 200000 && !succeeded; n += n < 300 ? 1 : n / 8) {
    char err[512];
    om_policy_t *p = NULL;
    om_test_fail_alloc_after(n);
    int rc = om_policy_load(&opts, "alloc.lua", src, strlen(src), &p, err,
                            sizeof err);
    om_test_alloc_reset();
    if (rc == 0) {
      succeeded = 1;
      om_policy_free(p);
    } else {
      static const LargestIntegralType oom_codes[] = {OM_ENOMEM, OM_EPOLICY};
      assert_in_set(rc, oom_codes, 2);
      assert_null(p);
    }
  }
  assert_true(succeeded);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(shipped_policies_load),
      cmocka_unit_test(rejections_name_the_place),
      cmocka_unit_test(validator_is_out_of_reach),
      cmocka_unit_test(route_returns_subset_indices),
      cmocka_unit_test(route_never_widens),
      cmocka_unit_test(select_metadata_fast_path_agrees),
      cmocka_unit_test(vary_policies_lose_chance_and_the_clock),
      cmocka_unit_test(key_must_be_a_string),
      cmocka_unit_test(authorize_refuses_first),
      cmocka_unit_test(vary_identity_is_declared),
      cmocka_unit_test(load_survives_allocation_failures),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
