/*
 * test_egress_policy.c: fallback and egress_heuristics policies called from
 * C, including policies that raise, loop, or answer garbage.
 */
#include "om_test.h"

#include <stdlib.h>
#include <string.h>

#include "om_egress_policy.h"
#include "om_errno.h"

#define LIB_DIR OM_SOURCE_DIR "/lua"

static const om_policy_opts_t opts = {
    .lib_dir = LIB_DIR, .instr_limit = 1000000, .wall_limit_ns = 20000000000u};

static om_policy_t *load_file(const char *path) {
  char err[1024];
  om_policy_t *p = NULL;
  int rc = om_policy_load_file(&opts, path, &p, err, sizeof err);
  if (rc != 0)
    fail_msg("%s: %s", path, err);
  return p;
}

static om_policy_t *load_src(const char *src) {
  char err[1024];
  om_policy_t *p = NULL;
  int rc =
      om_policy_load(&opts, "test.lua", src, strlen(src), &p, err, sizeof err);
  if (rc != 0)
    fail_msg("%s", err);
  return p;
}

/* ------------------------------------------------------------------ */
/* fallback                                                            */

static void fallback_config_of_the_default(void **state) {
  om_policy_t *p = load_file(OM_SOURCE_DIR "/policies/fallback.lua");
  om_route_t *routes = NULL;
  om_fallback_settings_t s;
  size_t n = 0;
  char err[256];
  (void)state;
  assert_int_equal(om_fallback_config(p, &routes, &n, &s, err, sizeof err), 0);
  assert_int_equal(n, 2);
  assert_string_equal(routes[0].name, "primary");
  assert_string_equal(routes[0].provider, "openai");
  assert_string_equal(routes[0].base_url, "http://127.0.0.1:9101/v1");
  assert_string_equal(routes[0].api_key_env, "OPENAI_API_KEY");
  assert_int_equal(routes[0].attempt_timeout_ms, 30000);
  assert_int_equal(routes[0].context_tokens, 128000);
  assert_string_equal(routes[1].provider, "anthropic");
  assert_int_equal(s.max_attempts, 3);
  assert_int_equal(s.deadline_ms, 60000);
  assert_int_equal(s.pending_retry_interval_ms, 60000);
  assert_int_equal(s.pending_max_age_ms, 3600000);
  assert_int_equal(s.commitment_ms, 120000);
  assert_string_equal(s.judge_route, "primary");
  assert_int_equal(s.judge_timeout_ms, 2000);
  assert_int_equal(s.cooldown_after_failures, 3);
  assert_int_equal(s.cooldown_ms, 2000);
  assert_int_equal(s.cooldown_max_ms, 60000);
  assert_true(s.has_order);
  assert_true(om_fallback_gate_enabled(&s, "support"));
  assert_false(om_fallback_gate_enabled(&s, "sales"));
  om_fallback_config_free(routes, n, &s);
  assert_null(s.judge_route);
  om_policy_free(p);
}

static void fallback_defaults_and_listed_order(void **state) {
  om_policy_t *p = load_src(
      "return { kind = 'fallback', routes = {"
      " { name = 'a', provider = 'openai', base_url = 'http://x/', model = "
      "'m' },"
      " { name = 'b', provider = 'openai', base_url = 'http://y/', model = "
      "'m', attempt_timeout_ms = 0.5 } } }");
  om_route_t *routes = NULL;
  om_fallback_settings_t s;
  size_t n = 0;
  uint32_t order[2];
  om_fallback_ctx_t ctx = {.agent = "x", .context = "async"};
  (void)state;
  assert_int_equal(om_fallback_config(p, &routes, &n, &s, NULL, 0), 0);
  assert_null(routes[0].api_key_env);
  assert_int_equal(routes[0].attempt_timeout_ms, 30000);
  assert_int_equal(routes[1].attempt_timeout_ms, 1); /* rounded up */
  assert_int_equal(s.backoff_base_ms, 500);
  assert_null(s.judge_route);
  assert_false(s.has_order);
  assert_false(om_fallback_gate_enabled(&s, "x"));
  n = 2;
  assert_int_equal(om_fallback_order(p, &ctx, order, &n, NULL, 0), 0);
  assert_int_equal(n, 2);
  assert_int_equal(order[0], 0);
  assert_int_equal(order[1], 1);
  om_fallback_config_free(routes, 2, &s);
  om_policy_free(p);
}

/* A policy's cooldown reaches C as given; a cap the policy lowered below
 * the period after loading (it can mutate its own table) is raised to it. */
static void fallback_cooldown_settings(void **state) {
  om_policy_t *p = load_src(
      "local P; P = { kind = 'fallback', routes = {"
      " { name = 'a', provider = 'openai', base_url = 'http://x/', model = "
      "'m' } }, cooldown_after_failures = 1, cooldown_ms = 0.5,"
      " cooldown_max_ms = 250,"
      " order = function(ctx) P.cooldown_max_ms = 0.1 return { 'a' } end }"
      " return P");
  om_route_t *routes = NULL;
  om_fallback_settings_t s;
  size_t n = 0;
  uint32_t order[1];
  om_fallback_ctx_t ctx = {.agent = "x", .context = "async"};
  (void)state;
  assert_int_equal(om_fallback_config(p, &routes, &n, &s, NULL, 0), 0);
  assert_int_equal(s.cooldown_after_failures, 1);
  assert_int_equal(s.cooldown_ms, 1); /* rounded up */
  assert_int_equal(s.cooldown_max_ms, 250);
  om_fallback_config_free(routes, n, &s);
  n = 1;
  {
    char err[256] = "";
    int rc = om_fallback_order(p, &ctx, order, &n, err, sizeof err);
    if (rc != 0)
      fail_msg("order: %d %s", rc, err);
  }
  assert_int_equal(om_fallback_config(p, &routes, &n, &s, NULL, 0), 0);
  assert_int_equal(s.cooldown_max_ms, 1);
  om_fallback_config_free(routes, n, &s);
  om_policy_free(p);
}

/* models: each alias's chain as route indices; order(ctx) sees the
 * caller's model; an alias naming an unknown route does not load. */
static void fallback_model_aliases(void **state) {
  om_policy_t *p = load_src(
      "return { kind = 'fallback', routes = {"
      " { name = 'a', provider = 'openai', base_url = 'http://x/', model = "
      "'m' },"
      " { name = 'b', provider = 'anthropic', base_url = 'http://y/', model = "
      "'c' } }, models = { fast = { 'b', 'a' } },"
      " order = function(ctx) if ctx.model == 'fast' then return { 'b', 'a' }"
      " end return { 'a', 'b' } end }");
  om_route_t *routes = NULL;
  om_fallback_settings_t s;
  size_t n = 0;
  uint32_t order[2];
  om_fallback_ctx_t ctx = {.agent = "x", .context = "async", .model = "fast"};
  char err[512] = "";
  om_policy_t *bad = NULL;
  const char *src =
      "return { kind = 'fallback', routes = { { name = 'a', provider = "
      "'openai', base_url = 'http://x/', model = 'm' } },"
      " models = { fast = { 'a', 'zz' } } }";
  (void)state;
  assert_int_equal(om_fallback_config(p, &routes, &n, &s, NULL, 0), 0);
  assert_int_equal(s.n_models, 1);
  assert_string_equal(s.models[0].name, "fast");
  assert_int_equal(s.models[0].n, 2);
  assert_int_equal(s.models[0].routes[0], 1);
  assert_int_equal(s.models[0].routes[1], 0);
  n = 2;
  assert_int_equal(om_fallback_order(p, &ctx, order, &n, NULL, 0), 0);
  assert_int_equal(order[0], 1); /* ctx.model reached order() */
  ctx.model = NULL;
  n = 2;
  assert_int_equal(om_fallback_order(p, &ctx, order, &n, NULL, 0), 0);
  assert_int_equal(order[0], 0);
  om_fallback_config_free(routes, 2, &s);
  assert_null(s.models);
  om_policy_free(p);
  assert_int_not_equal(
      om_policy_load(&opts, "bad.lua", src, strlen(src), &bad, err, sizeof err),
      0);
  assert_null(bad);
  if (strstr(err, "models.fast[2]") == NULL)
    fail_msg("error does not name the field: %s", err);
}

static void fallback_order_of_the_default(void **state) {
  om_policy_t *p = load_file(OM_SOURCE_DIR "/policies/fallback.lua");
  om_failed_attempt_t failed[] = {{"primary", 503, "server_error"}};
  om_fallback_ctx_t ctx = {.agent = "support",
                           .context = "interactive",
                           .channel = "web",
                           .failed = failed,
                           .n_failed = 1};
  uint32_t order[2];
  size_t n = 2;
  char err[256];
  (void)state;
  assert_int_equal(om_fallback_order(p, &ctx, order, &n, err, sizeof err), 0);
  assert_int_equal(n, 2);
  assert_int_equal(order[0], 1); /* backup first: primary is failing */
  assert_int_equal(order[1], 0);
  ctx.context = "async";
  n = 2;
  assert_int_equal(om_fallback_order(p, &ctx, order, &n, err, sizeof err), 0);
  assert_int_equal(order[0], 0);
  /* capacity too small is the caller's mistake */
  n = 1;
  assert_int_equal(om_fallback_order(p, &ctx, order, &n, err, sizeof err),
                   OM_EINVAL);
  assert_int_equal(n, 1);
  /* misuse */
  n = 2;
  assert_int_equal(om_fallback_order(NULL, &ctx, order, &n, err, sizeof err),
                   OM_EINVAL);
  ctx.failed = NULL;
  assert_int_equal(om_fallback_order(p, &ctx, order, &n, err, sizeof err),
                   OM_EINVAL);
  om_policy_free(p);
}

#define ROUTES                                                                 \
  "routes = { { name = 'a', provider = 'openai', base_url = 'http://x/', "     \
  "model = 'm' }, { name = 'b', provider = 'openai', base_url = "              \
  "'http://y/', model = 'm' } }"

/* Policies that misbehave at call time, and what C must say. */
static void fallback_hostile_order(void **state) {
  static const struct {
    const char *order;
    const char *want;
  } cases[] = {
      {"function(ctx) error('boom') end", "boom"},
      {"function(ctx) return 42 end", "non-table"},
      {"function(ctx) return { 'a', 'zzz' } end", "unknown route"},
      {"function(ctx) return { 'a', 'a' } end", "twice"},
      {"function(ctx) return {} end", "no routes"},
      {"function(ctx) return { 1, 2 } end", "route name"},
      {"function(ctx) while true do end end", "budget"},
      {"function(ctx) local t = {} for i = 1, 1e9 do t[i] = i end end",
       "budget"},
      {"function(ctx) return setmetatable({}, { __index = function() "
       "return 'a' end }) end",
       "no routes"},
  };
  (void)state;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char src[1024], err[512];
    om_policy_t *p;
    uint32_t order[2] = {7, 7};
    size_t n = 2;
    om_fallback_ctx_t ctx = {.agent = "x", .context = "async"};
    /* examples would refuse these at load: the policy has none */
    snprintf(src, sizeof src,
             "return { kind = 'fallback', " ROUTES ", order = %s }",
             cases[i].order);
    p = load_src(src);
    assert_int_equal(om_fallback_order(p, &ctx, order, &n, err, sizeof err),
                     OM_EPOLICY);
    if (strstr(err, cases[i].want) == NULL)
      fail_msg("case %zu: '%s' does not mention '%s'", i, err, cases[i].want);
    assert_int_equal(order[0], 7); /* untouched */
    assert_int_equal(n, 2);
    om_policy_free(p);
  }
}

/* order() renames a route: indices must still mean what config said. */
static void fallback_policy_mutating_itself(void **state) {
  om_policy_t *p = load_src(
      "local P P = { kind = 'fallback', " ROUTES ","
      " order = function(ctx) P.routes[1].name = 'b'; P.routes[2] = nil;"
      " return { 'b' } end } return P");
  om_route_t *routes = NULL;
  om_fallback_settings_t s;
  size_t n = 2, nr = 0;
  uint32_t order[2];
  om_fallback_ctx_t ctx = {0};
  char err[256];
  (void)state;
  assert_int_equal(om_fallback_config(p, &routes, &nr, &s, err, sizeof err), 0);
  assert_int_equal(om_fallback_order(p, &ctx, order, &n, err, sizeof err), 0);
  assert_int_equal(n, 1);
  assert_int_equal(order[0], 1); /* 'b' as it was loaded */
  om_fallback_config_free(routes, nr, &s);
  /* reading the config again sees the change and refuses it */
  assert_int_equal(om_fallback_config(p, &routes, &nr, &s, err, sizeof err),
                   OM_EPOLICY);
  assert_non_null(strstr(err, "routes"));
  om_policy_free(p);
}

static void fallback_config_fault_injection(void **state) {
  om_policy_t *p = load_file(OM_SOURCE_DIR "/policies/fallback.lua");
  (void)state;
  for (long k = 0;; k++) {
    om_route_t *routes = NULL;
    om_fallback_settings_t s;
    size_t n = 0;
    int rc;
    char err[256] = "";
    om_test_fail_alloc_after(k);
    rc = om_fallback_config(p, &routes, &n, &s, err, sizeof err);
    om_test_alloc_reset();
    if (rc == 0) {
      assert_int_equal(n, 2);
      om_fallback_config_free(routes, n, &s);
      break;
    }
    /* inside the policy's state an allocation failure looks like its
     * memory budget (om_sandbox_call): a policy error, not a crash */
    if (rc != OM_ENOMEM) {
      assert_int_equal(rc, OM_EPOLICY);
      assert_non_null(strstr(err, "memory"));
    }
    assert_null(routes);
  }
  om_policy_free(p);
}

static void wrong_kind(void **state) {
  om_policy_t *p = load_file(OM_SOURCE_DIR "/policies/fallback.lua");
  om_heuristics_input_t in = {.text = "x", .len = 1};
  om_heuristic_flag_t f[4];
  size_t n;
  (void)state;
  assert_int_equal(om_heuristics_run(p, &in, f, 4, &n, NULL, 0), OM_EINVAL);
  assert_null(om_heuristics_holding_line(p, "support"));
  om_policy_free(p);
}

/* ------------------------------------------------------------------ */
/* egress_heuristics                                                   */

static void heuristics_default_checks(void **state) {
  om_policy_t *p = load_file(OM_SOURCE_DIR "/policies/egress_heuristics.lua");
  om_heuristic_flag_t f[8];
  size_t n = 0;
  int overall = -1;
  char err[256];
  const char *sp = "You are the billing agent of Acme. Refunds above 50 EUR "
                   "need a supervisor's approval first.";
  om_heuristics_input_t in = {0};
  (void)state;
  in.text = "Your order shipped yesterday and arrives Friday.";
  in.len = strlen(in.text);
  assert_int_equal(
      om_heuristics_run_overall(p, &in, f, 8, &n, &overall, err, sizeof err),
      0);
  assert_int_equal(n, 0);
  assert_int_equal(overall, 0);

  in.text = "<thinking>stall</thinking> Hi. Your total is undefined.";
  in.len = strlen(in.text);
  assert_int_equal(
      om_heuristics_run_overall(p, &in, f, 8, &n, &overall, err, sizeof err),
      0);
  assert_int_equal(n, 2);
  assert_string_equal(f[0].name, "undefined");
  assert_int_equal(f[0].confidence, OM_FLAG_LOW);
  assert_string_equal(f[1].name, "leaked_thinking");
  assert_int_equal(f[1].confidence, OM_FLAG_HIGH);
  assert_int_equal(overall, OM_FLAG_HIGH);
  /* a full flags[] drops names, not the verdict */
  assert_int_equal(
      om_heuristics_run_overall(p, &in, f, 1, &n, &overall, err, sizeof err),
      0);
  assert_int_equal(n, 1);
  assert_int_equal(overall, OM_FLAG_HIGH);

  /* the system prompt and the question reach the checks */
  in.text = "Sure. Note: refunds above 50 EUR need a supervisor's approval "
            "first.";
  in.len = strlen(in.text);
  assert_int_equal(om_heuristics_run(p, &in, f, 8, &n, err, sizeof err), 0);
  assert_int_equal(n, 0);
  in.system_prompt = sp;
  in.system_prompt_len = strlen(sp);
  assert_int_equal(om_heuristics_run(p, &in, f, 8, &n, err, sizeof err), 0);
  assert_int_equal(n, 1);
  assert_string_equal(f[0].name, "system_prompt_leak");
  in.text = "I'm sorry, I cannot help with that.";
  in.len = strlen(in.text);
  in.question = "Where is my parcel right now, please?";
  in.question_len = strlen(in.question);
  assert_int_equal(om_heuristics_run(p, &in, f, 8, &n, err, sizeof err), 0);
  assert_int_equal(n, 1);
  assert_string_equal(f[0].name, "apology_only");
  assert_int_equal(f[0].confidence, OM_FLAG_LOW);
  /* text NULL with len 0 is the empty reply */
  in.text = NULL;
  in.len = 0;
  assert_int_equal(om_heuristics_run(p, &in, f, 8, &n, err, sizeof err), 0);
  assert_int_equal(n, 1);
  assert_string_equal(f[0].name, "empty");
  in.len = 3;
  assert_int_equal(om_heuristics_run(p, &in, f, 8, &n, err, sizeof err),
                   OM_EINVAL);
  om_policy_free(p);
}

static void heuristics_lines(void **state) {
  om_policy_t *p = load_file(OM_SOURCE_DIR "/policies/egress_heuristics.lua");
  const char *l;
  (void)state;
  l = om_heuristics_holding_line(p, "support");
  assert_non_null(l);
  assert_non_null(strstr(l, "teammate"));
  l = om_heuristics_holding_line(p, "nobody");
  assert_non_null(strstr(l, "patience"));
  assert_non_null(om_heuristics_holding_line(p, NULL));
  assert_non_null(strstr(om_heuristics_handoff(p, "support"), "support team"));
  assert_non_null(strstr(om_heuristics_handoff(p, "x"), "team"));
  assert_string_equal(om_heuristics_handoff_target(p, "support"),
                      "human-queue");
  assert_null(om_heuristics_handoff_target(p, "sales"));
  om_policy_free(p);
}

static void heuristics_hostile_checks(void **state) {
  static const struct {
    const char *check;
    const char *want;
  } cases[] = {
      {"function(t) error('kaput') end", "kaput"},
      {"function(t) while true do end end", "budget"},
      {"function(t) return string.rep('x', 1 << 40) end", "memory"},
  };
  (void)state;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char src[1024], err[512];
    om_policy_t *p;
    om_heuristic_flag_t f[2];
    size_t n = 99;
    om_heuristics_input_t in = {.text = "hello", .len = 5};
    snprintf(src, sizeof src,
             "return { kind = 'egress_heuristics', holding_lines = { default "
             "= 'wait' }, checks = { { name = 'c', confidence = 'high', check "
             "= %s } } }",
             cases[i].check);
    p = load_src(src);
    assert_int_equal(om_heuristics_run(p, &in, f, 2, &n, err, sizeof err),
                     OM_EPOLICY);
    if (strstr(err, cases[i].want) == NULL)
      fail_msg("case %zu: '%s' does not mention '%s'", i, err, cases[i].want);
    assert_int_equal(n, 99);
    /* the policy still answers afterwards */
    assert_string_equal(om_heuristics_holding_line(p, "x"), "wait");
    om_policy_free(p);
  }
}

/* A check that rewrites the policy's lines cannot free what C holds. */
static void heuristics_policy_mutating_itself(void **state) {
  om_policy_t *p = load_src(
      "local P P = { kind = 'egress_heuristics',"
      " holding_lines = { default = 'please wait' },"
      " checks = { { name = 'c', confidence = 'low', check = function(t)"
      "   P.holding_lines = { default = 42 } P.checks[1].confidence = 'zz'"
      "   return true end } } } return P");
  om_heuristic_flag_t f[2];
  size_t n;
  om_heuristics_input_t in = {.text = "hi", .len = 2};
  const char *line;
  (void)state;
  line = om_heuristics_holding_line(p, NULL);
  assert_string_equal(line, "please wait");
  for (int i = 0; i < 3; i++) {
    assert_int_equal(om_heuristics_run(p, &in, f, 2, &n, NULL, 0), 0);
    assert_int_equal(n, 1);
    assert_int_equal(f[0].confidence, OM_FLAG_LOW);
  }
  assert_string_equal(om_heuristics_holding_line(p, NULL), "please wait");
  assert_string_equal(line, "please wait");
  om_policy_free(p);
}

static void sanitize_removes_thinking(void **state) {
  static const struct {
    const char *in, *out;
  } cases[] = {
      {"<thinking>secret</thinking>\n\nHello there.", "Hello there."},
      {"Hi <think>a</think>you <thinking>b\nc</thinking>all.", "Hi you all."},
      {"Answer first. <thinking>never closed", "Answer first."},
      {"stray</thinking> rest", "stray rest"},
      {"no tags at all", "no tags at all"},
      {"<thinking>only</thinking>", ""},
      {"", ""},
      {"<thinkin>not a tag</thinkin>", "<thinkin>not a tag</thinkin>"},
  };
  (void)state;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *out = NULL;
    size_t len = 99;
    assert_int_equal(om_heuristics_sanitize(NULL, cases[i].in,
                                            strlen(cases[i].in), &out, &len),
                     0);
    assert_string_equal(out, cases[i].out);
    assert_int_equal(len, strlen(cases[i].out));
    free(out);
  }
  {
    char *out = NULL;
    size_t len;
    assert_int_equal(om_heuristics_sanitize(NULL, NULL, 3, &out, &len),
                     OM_EINVAL);
    om_test_fail_alloc_after(0);
    assert_int_equal(om_heuristics_sanitize(NULL, "x", 1, &out, &len),
                     OM_ENOMEM);
    om_test_alloc_reset();
    assert_null(out);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(fallback_config_of_the_default),
      cmocka_unit_test(fallback_cooldown_settings),
      cmocka_unit_test(fallback_model_aliases),
      cmocka_unit_test(fallback_defaults_and_listed_order),
      cmocka_unit_test(fallback_order_of_the_default),
      cmocka_unit_test(fallback_hostile_order),
      cmocka_unit_test(fallback_policy_mutating_itself),
      cmocka_unit_test(fallback_config_fault_injection),
      cmocka_unit_test(wrong_kind),
      cmocka_unit_test(heuristics_default_checks),
      cmocka_unit_test(heuristics_lines),
      cmocka_unit_test(heuristics_hostile_checks),
      cmocka_unit_test(heuristics_policy_mutating_itself),
      cmocka_unit_test(sanitize_removes_thinking),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
