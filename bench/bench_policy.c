/*
 * bench_policy.c: the policy runtime's figures.
 *
 * policy_traffic_call_16: examples/policies/canary.lua over 16 peers, called
 * from C as the proxy calls it: the peer view built once (as per snapshot
 * revision), then per request a req table with typical headers, key(req)
 * and subset(req, peers) in the sandbox under its budgets, and the subset
 * checked. Baseline in the same run: lua_pcall_empty through the same
 * protected wrapper.
 * policy_decide_call_16: the same canary and decide(req) answering a
 * POST's deadline and a payment's retries (DECIDE_SRC below) over the
 * same peers, decide's answer checked as the proxy checks it; its ratio
 * to policy_traffic_call_16, rounds alternating (bar <= 1.5).
 * policy_decide_headers_call_16: examples/policies/per_request.lua, whose
 * decide builds a table with header edits per request: what that costs
 * beside it (no bar).
 * policy_hostile_call_us: tests/fixtures/hostile_policy.lua (quadratic in
 * a header) with an 8 KiB x-tags: what one call that overruns its budget
 * holds the loop, at the default budget (budget_ms = 1), and
 * policy_hostile_call_10M_us under 10,000,000 instructions and 100 ms
 * (load options that replace budget_ms: the per-call budgets route calls
 * ran under before budget_ms).
 * Median of 31.
 * policy_reload_ms: load -> validate -> run examples of a 200-line traffic
 * policy with 20 examples (generated here), as a hot reload does.
 */
#include "om_bench.h"

#include <string.h>

#include "om_policy.h"

#define LIB_DIR OM_SOURCE_DIR "/lua"
#define ROUNDS 9
#define CALLS 20000

static const om_policy_opts_t opts = {.lib_dir = LIB_DIR};

static om_policy_t *load_file(const char *path) {
  char err[1024];
  om_policy_t *p = NULL;
  if (om_policy_load_file(&opts, path, &p, err, sizeof err) != 0) {
    fprintf(stderr, "bench_policy: %s\n", err);
    exit(1);
  }
  return p;
}

/* 16 peers, 2 of them v2 (the canary), in two zones. */
static void set_peers16(om_policy_t *p) {
  static const om_policy_kv_t v2[] = {{"version", 7, "v2", 2}};
  static const om_policy_kv_t v1[] = {{"version", 7, "v1", 2}};
  static char ids[16][16], urls[16][40];
  om_policy_peer_t peers[16];
  for (int i = 0; i < 16; i++) {
    snprintf(ids[i], sizeof ids[i], "peer-%d", i);
    snprintf(urls[i], sizeof urls[i], "http://10.0.0.%d:8080/", i + 1);
    peers[i] = (om_policy_peer_t){
        ids[i], urls[i], i % 2 ? "zone-a" : "zone-b", 1.0, i < 2 ? v2 : v1, 1};
  }
  if (om_policy_set_peers(p, peers, 16) != 0)
    exit(1);
}

/* ns per route call of p for a typical POST; with decide, decide(req)
 * too and its answer checked, as the proxy calls it. */
static double route_ns(om_policy_t *p, int decide) {
  static const om_policy_kv_t headers[] = {
      {"host", 4, "orders", 6},
      {"user-agent", 10, "curl/7.88.1", 11},
      {"accept", 6, "*/*", 3},
      {"x-user", 6, "user-1234", 9},
      {"x-request-id", 12, "5f0c2a8e-1", 10},
  };
  static om_policy_decision_t d;
  om_policy_req_t req = {"orders", "POST", "/payments/42", headers, 5, NULL,
                         0,        NULL,   NULL,           NULL,    0, 0};
  uint32_t out[16];
  size_t n;
  char err[256];
  uint64_t t0 = om_bench_now_ns();
  for (int i = 0; i < CALLS; i++) {
    const char *key;
    size_t klen;
    int decided = 0;
    if (om_policy_route_decide(p, &req, out, &n, NULL, &key, &klen,
                               decide ? &d : NULL, decide ? &decided : NULL,
                               err, sizeof err) != 0 ||
        decided != decide) {
      fprintf(stderr, "bench_policy: %s (decided %d)\n", err, decided);
      exit(1);
    }
    OM_BENCH_SINK(n);
  }
  return (double)(om_bench_now_ns() - t0) / CALLS;
}

/* canary.lua's split, and per request a deadline for POST and no
 * retries for a payment: decisions that depend on the request's class
 * only, returned as tables made once (docs/POLICIES.md "How to write
 * fast policies"). */
static const char DECIDE_SRC[] =
    "local policy = require 'openmesh.policy'\n"
    "local function user(req) return policy.header(req, 'x-user') end\n"
    "local POST = { deadline_ms = 2000 }\n"
    "local PAYMENT = { deadline_ms = 2000, retries = 0 }\n"
    "return { kind = 'traffic', key = user,\n"
    "  vary = { ':method', ':path', 'x-user' },\n"
    "  subset = function(req, peers)\n"
    "    return policy.canary(peers, user(req), 10, { version = 'v2' }) end,\n"
    "  decide = function(req)\n"
    "    if req.method ~= 'POST' then return nil end\n"
    "    if req.path:find('^/payments') then return PAYMENT end\n"
    "    return POST end }\n";

/* The three in alternating rounds, so drift hits them alike. */
static void bench_traffic_call(void) {
  om_policy_t *p = load_file(OM_SOURCE_DIR "/examples/policies/canary.lua");
  om_policy_t *d = NULL;
  om_policy_t *h =
      load_file(OM_SOURCE_DIR "/examples/policies/per_request.lua");
  double t[ROUNDS], td[ROUNDS], th[ROUNDS], rd[ROUNDS], rh[ROUNDS];
  char err[1024];
  if (om_policy_load(&opts, "decide.lua", DECIDE_SRC, strlen(DECIDE_SRC), &d,
                     err, sizeof err) != 0) {
    fprintf(stderr, "bench_policy: %s\n", err);
    exit(1);
  }
  set_peers16(p);
  set_peers16(d);
  set_peers16(h);
  for (int r = -1; r < ROUNDS; r++) { /* round -1 warms up */
    double a = route_ns(p, 0), b = route_ns(d, 1), c = route_ns(h, 1);
    if (r >= 0) {
      t[r] = a;
      td[r] = b;
      th[r] = c;
      rd[r] = b / a;
      rh[r] = c / a;
    }
  }
  om_bench_report("policy_traffic_call_16", om_bench_median(t, ROUNDS), "ns");
  om_bench_report("policy_decide_call_16", om_bench_median(td, ROUNDS), "ns");
  om_bench_report("policy_decide_call_16_ratio", om_bench_median(rd, ROUNDS),
                  "x (bar <= 1.5)");
  om_bench_report("policy_decide_headers_call_16", om_bench_median(th, ROUNDS),
                  "ns");
  om_bench_report("policy_decide_headers_call_16_ratio",
                  om_bench_median(rh, ROUNDS), "x");
  om_policy_free(h);
  om_policy_free(d);
  om_policy_free(p);
}

/* The hostile policy with budget_ms spliced in (0: the default). */
static om_policy_t *load_hostile(double budget_ms, uint64_t instr_limit,
                                 uint64_t wall_limit_ns) {
  om_policy_opts_t o = opts;
  FILE *f = fopen(OM_SOURCE_DIR "/tests/fixtures/hostile_policy.lua", "rb");
  char src[4096], err[1024], *at;
  size_t n;
  om_policy_t *p = NULL;
  if (f == NULL)
    exit(1);
  n = fread(src, 1, sizeof src - 64, f);
  fclose(f);
  src[n] = '\0';
  if (budget_ms > 0 && (at = strstr(src, "kind = \"traffic\",")) != NULL) {
    char tail[4096];
    snprintf(tail, sizeof tail, "%s", at);
    snprintf(at, sizeof src - (size_t)(at - src), "budget_ms = %g, %s",
             budget_ms, tail);
  }
  o.instr_limit = instr_limit;
  o.wall_limit_ns = wall_limit_ns;
  if (om_policy_load(&o, "hostile_policy.lua", src, strlen(src), &p, err,
                     sizeof err) != 0) {
    fprintf(stderr, "bench_policy: %s\n", err);
    exit(1);
  }
  return p;
}

static void bench_hostile(const char *name, double budget_ms,
                          uint64_t instr_limit, uint64_t wall_limit_ns) {
  om_policy_t *p = load_hostile(budget_ms, instr_limit, wall_limit_ns);
  om_policy_peer_t peer = {"a", "http://10.0.0.1:8080/", NULL, 1.0, NULL, 0};
  static char tags[8193];
  om_policy_kv_t h[1];
  om_policy_req_t req;
  uint32_t out[1];
  size_t n;
  char err[256];
  double t[31];
  for (size_t i = 0; i < sizeof tags - 1; i++)
    tags[i] = (char)('a' + i % 26);
  h[0] = (om_policy_kv_t){"x-tags", 6, tags, sizeof tags - 1};
  req = (om_policy_req_t){"svc", "GET", "/",  h,    1, NULL,
                          0,     NULL,  NULL, NULL, 0, 0};
  if (om_policy_set_peers(p, &peer, 1) != 0)
    exit(1);
  for (int r = 0; r < 31; r++) {
    uint64_t t0 = om_bench_now_ns();
    const char *key;
    size_t klen;
    if (om_policy_route(p, &req, out, &n, &key, &klen, err, sizeof err) == 0) {
      fprintf(stderr, "bench_policy: the hostile policy did not trip\n");
      exit(1);
    }
    t[r] = (double)(om_bench_now_ns() - t0) / 1e3;
  }
  om_bench_report(name, om_bench_median(t, 31), "us");
  om_policy_free(p);
}

/* A 200-line traffic policy with 20 examples. */
static char *big_policy(void) {
  size_t cap = 64 * 1024, len = 0;
  char *s = malloc(cap);
  int lines = 0;
#define ADD(...)                                                               \
  do {                                                                         \
    len += (size_t)snprintf(s + len, cap - len, __VA_ARGS__);                  \
    lines++;                                                                   \
  } while (0)
  ADD("local policy = require 'openmesh.policy'\n");
  for (int i = 0; i < 30; i++) { /* helpers: 5 lines each */
    ADD("local function rule_%d(req, peer)\n", i);
    ADD("  local v = peer.metadata.tier\n");
    ADD("  if v == 'gold-%d' and req.headers['x-tier'] ~= 'gold' then\n", i);
    ADD("    return false end\n");
    ADD("  return true end\n");
  }
  ADD("return {kind = 'traffic',\n");
  ADD("  subset = function(req, peers)\n");
  ADD("    return policy.filter(peers, function(p)\n");
  for (int i = 0; i < 30; i++)
    ADD("      if not rule_%d(req, p) then return false end\n", i);
  ADD("      return true end) end,\n");
  ADD("  examples = {\n");
  for (int i = 0; i < 20; i++)
    ADD("    {req = {headers = {['x-tier'] = '%s'}}, peers = {{id = 'a'}, "
        "{id = 'b', metadata = {tier = 'gold-%d'}}}, expect = %s},\n",
        i % 2 ? "gold" : "free", i, i % 2 ? "{'a', 'b'}" : "{'a'}");
  while (lines < 199)
    ADD("    -- (padding to 200 lines)\n");
  ADD("  }}\n");
#undef ADD
  return s;
}

static void bench_reload(void) {
  char *src = big_policy();
  double t[ROUNDS];
  char err[1024];
  for (int r = -1; r < ROUNDS; r++) {
    om_policy_t *p = NULL;
    uint64_t t0 = om_bench_now_ns();
    if (om_policy_load(&opts, "big.lua", src, strlen(src), &p, err,
                       sizeof err) != 0) {
      fprintf(stderr, "bench_policy: %s\n", err);
      exit(1);
    }
    if (r >= 0)
      t[r] = (double)(om_bench_now_ns() - t0) / 1e6;
    om_policy_free(p);
  }
  om_bench_report("policy_reload_ms", om_bench_median(t, ROUNDS), "ms");
  free(src);
}

int main(void) {
  bench_traffic_call();
  bench_hostile("policy_hostile_call_us", 0, 0, 0);
  bench_hostile("policy_hostile_call_10M_us", 0, 10000000, 100000000);
  bench_reload();
  return 0;
}
