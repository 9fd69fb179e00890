/*
 * test_sandbox.c: the policy state refuses every escape with a clear error
 * within its budget, and stays usable afterwards.
 */
#include "om_test.h"

#include <string.h>

#include <uv.h>

#include "om_errno.h"
#include "om_sandbox.h"

static om_sandbox_t *sandbox(void) {
  om_sandbox_opts_t opts = {.mem_limit = 8u << 20,
                            .instr_limit = 2000000,
                            .wall_limit_ns = 20000000000u,
                            .lib_dir = NULL};
  om_sandbox_t *sb = NULL;
  assert_int_equal(om_sandbox_new(&opts, &sb), 0);
  return sb;
}

/* Run src as a chunk; return its status, leaving the message or result. */
static int run(om_sandbox_t *sb, const char *src) {
  lua_settop(om_sandbox_state(sb), 0);
  return om_sandbox_load(sb, "=policy", src, strlen(src));
}

static void expect_error(om_sandbox_t *sb, const char *src, const char *want) {
  int status = run(sb, src);
  const char *msg = lua_tostring(om_sandbox_state(sb), -1);
  if (status == LUA_OK || msg == NULL || strstr(msg, want) == NULL)
    fail_msg("%s\n  status %d, message: %s\n  want a message containing: %s",
             src, status, msg ? msg : "(none)", want);
}

/* After any escape attempt the same state still runs ordinary code. */
static void expect_usable(om_sandbox_t *sb) {
  assert_int_equal(run(sb, "local t = {} for i = 1, 100 do t[i] = i end "
                           "return #t"),
                   LUA_OK);
  assert_int_equal(lua_tointeger(om_sandbox_state(sb), -1), 100);
}

static void plain_code_runs(void **state) {
  (void)state;
  om_sandbox_t *sb = sandbox();
  assert_int_equal(run(sb, "return ('%d-%s'):format(4, string.upper('x'))"),
                   LUA_OK);
  assert_string_equal(lua_tostring(om_sandbox_state(sb), -1), "4-X");
  om_sandbox_free(sb);
}

static void cpu_budget(void **state) {
  (void)state;
  om_sandbox_t *sb = sandbox();
  const char *loops[] = {
      "while true do end",
      "while true do pcall(function() while true do end end) end",
      "local co = coroutine.wrap(function() while true do end end) co()",
      "while true do local co = coroutine.create(function() "
      "  while true do end end) coroutine.resume(co) end",
      "local function f() return pcall(f) end while true do f() end",
      /* a stock message handler would run with hooks off */
      "while true do xpcall(function() while true do end end, "
      "  function() while true do end end) end",
      "xpcall(error, function() while true do end end)",
      "local ok, e = xpcall(function() while true do end end, "
      "  function(m) return m end) while true do end",
      "local t = setmetatable({}, {__index = function(t, k) "
      "  while true do end end}) return t.x",
  };
  for (size_t i = 0; i < sizeof loops / sizeof loops[0]; i++) {
    expect_error(sb, loops[i], "budget: instruction limit exceeded");
    expect_usable(sb);
  }
  om_sandbox_free(sb);
}

/* A trip names the chunk and line of the frame it stopped, the line the
 * author has to change, also from inside a function and a coroutine. */
static void trips_name_the_line(void **state) {
  (void)state;
  om_sandbox_t *sb = sandbox();
  static const struct {
    const char *src, *want;
  } cases[] = {
      {"local x = 0\nwhile true do\n  x = x + 1\nend",
       "budget: instruction limit exceeded at policy:3"},
      {"local function spin()\n  while true do end\nend\nspin()",
       "budget: instruction limit exceeded at policy:2"},
      {"local co = coroutine.wrap(function()\n\n  while true do end\n"
       "end)\nco()",
       "budget: instruction limit exceeded at policy:3"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *msg;
    assert_int_equal(run(sb, cases[i].src), LUA_ERRRUN);
    msg = lua_tostring(om_sandbox_state(sb), -1);
    if (msg == NULL || strcmp(msg, cases[i].want) != 0)
      fail_msg("%s\n  got:  %s\n  want: %s", cases[i].src, msg ? msg : "(none)",
               cases[i].want);
  }
  /* memory: where the call ran at the last tick past half the cap */
  assert_int_equal(run(sb, "local t = {}\nfor i = 1, 1e9 do\n"
                           "  t[i] = ('x'):rep(64) .. i\nend"),
                   LUA_ERRRUN);
  const char *msg = lua_tostring(om_sandbox_state(sb), -1);
  if (msg == NULL || strstr(msg, "budget: memory limit") == NULL ||
      strstr(msg, " near policy:") == NULL)
    fail_msg("memory trip: got %s, want 'budget: memory limit ... near "
             "policy:LINE'",
             msg ? msg : "(none)");
  expect_usable(sb);
  om_sandbox_free(sb);
}

static void wall_clock_budget(void **state) {
  (void)state;
  om_sandbox_opts_t opts = {.instr_limit = UINT64_MAX / 2,
                            .wall_limit_ns = 50000000u};
  om_sandbox_t *sb = NULL;
  assert_int_equal(om_sandbox_new(&opts, &sb), 0);
  expect_error(sb, "while true do end", "budget: wall-clock limit exceeded");
  expect_usable(sb);
  om_sandbox_free(sb);
}

/* A chunk as a function, called with om_sandbox_call_limited. */
static int call_limited(om_sandbox_t *sb, const char *src, uint64_t instr,
                        uint64_t wall_ns) {
  lua_State *L = om_sandbox_state(sb);
  lua_settop(L, 0);
  assert_int_equal(run(sb, src), LUA_OK); /* the chunk returns a function */
  return om_sandbox_call_limited(sb, 0, 1, instr, wall_ns);
}

/*
 * Per-call limits: a wall-clock cap of 2 ms stops a loop after about
 * 2.25 ms of CPU (the cap and its grace slice), far under the state's own
 * 20 s; an instruction limit trips as an instruction limit; the next
 * plain call runs under the state's budgets again. last_trip says which.
 */
static void per_call_limits(void **state) {
  om_sandbox_t *sb = sandbox();
  const char *loop = "return function() while true do end end";
  uint64_t t0;
  double ms;
  (void)state;
  t0 = uv_hrtime();
  assert_int_equal(call_limited(sb, loop, UINT64_MAX / 2, 2000000), LUA_ERRRUN);
  ms = (double)(uv_hrtime() - t0) / 1e6;
  assert_string_equal(lua_tostring(om_sandbox_state(sb), -1),
                      "budget: wall-clock limit exceeded at policy:1");
  assert_int_equal(om_sandbox_last_trip(sb), OM_SANDBOX_TRIP_WALL);
  OM_ASSERT_CMP(ms, >=, 2.0);
  OM_ASSERT_CMP(ms, <, 1000.0); /* not the state's 20 s */
  assert_int_equal(call_limited(sb, loop, 50000, 0), LUA_ERRRUN);
  assert_string_equal(lua_tostring(om_sandbox_state(sb), -1),
                      "budget: instruction limit exceeded at policy:1");
  assert_int_equal(om_sandbox_last_trip(sb), OM_SANDBOX_TRIP_INSTR);
  assert_int_equal(
      call_limited(sb, "return function() return 7 end", 50000, 2000000),
      LUA_OK);
  assert_int_equal(om_sandbox_last_trip(sb), OM_SANDBOX_TRIP_NONE);
  /* a loop of 1,000,000 instructions: over 50,000, under the state's 2M */
  assert_int_equal(call_limited(sb,
                                "return function() local n = 0 for i = 1, "
                                "250000 do n = n + i end return n end",
                                0, 0),
                   LUA_OK);
  expect_usable(sb);
  om_sandbox_free(sb);
}

/* The memory cap reads as a MEM trip; a plain error as none. */
static void last_trip_memory(void **state) {
  om_sandbox_t *sb = sandbox();
  (void)state;
  assert_int_not_equal(
      call_limited(sb,
                   "return function() local t = {} for i = 1, 1e9 do "
                   "t[i] = ('x'):rep(1000) .. i end end",
                   0, 0),
      LUA_OK);
  assert_int_equal(om_sandbox_last_trip(sb), OM_SANDBOX_TRIP_MEM);
  assert_int_equal(call_limited(sb, "return function() error('no') end", 0, 0),
                   LUA_ERRRUN);
  assert_int_equal(om_sandbox_last_trip(sb), OM_SANDBOX_TRIP_NONE);
  expect_usable(sb);
  om_sandbox_free(sb);
}

static void memory_budget(void **state) {
  (void)state;
  om_sandbox_t *sb = sandbox();
  const char *bombs[] = {
      "local s = 'x' while true do s = s .. s end",
      "local t = {} local i = 0 while true do i = i + 1 "
      "t[i] = {i, i, i, i} end",
      "local t = {} for i = 1, 1e9 do t[i] = tostring(i) end",
      "return ('x'):rep(1e9)",
      "return string.rep('abc', 2^40, ',')",
      "return table.concat(setmetatable({}, {__index = function(_, i) "
      "  return ('y'):rep(1e6) end}), '', 1, 1e6)",
  };
  for (size_t i = 0; i < sizeof bombs / sizeof bombs[0]; i++) {
    int status = run(sb, bombs[i]);
    const char *msg = lua_tostring(om_sandbox_state(sb), -1);
    if (status == LUA_OK || msg == NULL ||
        (strstr(msg, "budget: memory limit") == NULL &&
         strstr(msg, "exceeds the memory limit") == NULL &&
         strstr(msg, "budget: instruction") == NULL))
      fail_msg("%s: status %d, %s", bombs[i], status, msg ? msg : "(none)");
    OM_ASSERT_CMP(om_sandbox_mem_used(sb), <=, (8u << 20));
    expect_usable(sb);
  }
  om_sandbox_free(sb);
}

static void c_loops_are_bounded(void **state) {
  (void)state;
  om_sandbox_t *sb = sandbox();
  /* The stock string.rep would spin 2^50 times on empty pieces. */
  assert_int_equal(run(sb, "return ('').rep('', 2^50)"), LUA_OK);
  assert_string_equal(lua_tostring(om_sandbox_state(sb), -1), "");
  expect_error(sb, "return table.move({}, 1, 2^50, 2)",
               "range longer than 1000000");
  om_sandbox_free(sb);
}

static void no_escape_hatches(void **state) {
  (void)state;
  om_sandbox_t *sb = sandbox();
  assert_int_equal(run(sb, "return io == nil and debug == nil and "
                           "package == nil and dofile == nil and "
                           "loadfile == nil and collectgarbage == nil and "
                           "os.execute == nil and os.getenv == nil and "
                           "os.exit == nil and os.remove == nil and "
                           "string.dump == nil and ('').dump == nil and "
                           "type(os.time) == 'function' and "
                           "type(os.clock) == 'function'"),
                   LUA_OK);
  assert_true(lua_toboolean(om_sandbox_state(sb), -1));
  expect_error(sb,
               "local f, err = load(string.char(27) .. 'Lua') "
               "assert(f == nil) error(err)",
               "attempt to load a binary chunk");
  expect_error(sb, "return load('return 1', 'x', 'b')", "only text chunks");
  expect_error(sb, "return load('return 1', 'x', 'bt')", "only text chunks");
  expect_error(sb, "require 'io'", "may only require");
  expect_error(sb, "require 'openmesh_evil'", "may only require");
  expect_error(sb, "require 'openmesh.../etc/passwd'", "may only require");
  /* load without an env gets the sandbox _ENV, not the real globals */
  assert_int_equal(run(sb, "return load('return io == nil and "
                           "require ~= nil')()"),
                   LUA_OK);
  assert_true(lua_toboolean(om_sandbox_state(sb), -1));
  om_sandbox_free(sb);
}

static void string_metatable_is_protected(void **state) {
  (void)state;
  om_sandbox_t *sb = sandbox();
  assert_int_equal(run(sb, "return getmetatable('')"), LUA_OK);
  assert_false(lua_toboolean(om_sandbox_state(sb), -1));
  expect_error(sb, "setmetatable('', {})", "bad argument #1");
  /* Poisoning the env's string table does not reach string methods. */
  assert_int_equal(run(sb, "string.upper = function() return 'pwned' end "
                           "return ('a'):upper()"),
                   LUA_OK);
  assert_string_equal(lua_tostring(om_sandbox_state(sb), -1), "A");
  om_sandbox_free(sb);
}

static void gc_metamethods_refused(void **state) {
  (void)state;
  om_sandbox_t *sb = sandbox();
  expect_error(sb,
               "setmetatable({}, {__gc = function() while true do end end})",
               "__gc metamethods are not allowed");
  expect_error(sb, "setmetatable({}, {__gc = true})",
               "__gc metamethods are not allowed");
  /* __gc added after setmetatable never marks the object (Lua 5.4 2.5.3). */
  assert_int_equal(run(sb, "local mt = {} "
                           "for i = 1, 1000 do setmetatable({}, mt) end "
                           "mt.__gc = function() while true do end end "
                           "local junk = {} for i = 1, 1e5 do junk[i % 100] "
                           "= {i} end return true"),
                   LUA_OK);
  expect_usable(sb);
  om_sandbox_free(sb);
}

/*
 * The stock pattern functions backtrack in C, out of the count hook's
 * sight; the sandbox's own ones end a blow-up in a clear error within the
 * budget, count their steps as instructions, and leave the state usable.
 */
static void pattern_blowups_are_bounded(void **state) {
  (void)state;
  om_sandbox_t *sb = sandbox();
  const char *bombs[] = {
      "return (('a'):rep(40)):find(('a*'):rep(30) .. 'b')",
      "return string.match(('a'):rep(40), ('a*'):rep(30) .. 'b')",
      "return (('a'):rep(1000)):find('.-.-.-.-.-.-.-.-x')",
      "for k in (('a'):rep(40)):gmatch(('a*'):rep(30) .. 'b') do end",
      "return (('a'):rep(40)):gsub(('a-'):rep(30) .. 'b', '')",
      "return ('ab'):gsub('.', function() return (('a'):rep(40))"
      "  :gsub(('a*'):rep(30) .. 'b', '') end)",
      "return coroutine.wrap(function() return (('a'):rep(40))"
      "  :find(('a*'):rep(30) .. 'b') end)()",
      "return ('a'):rep(300):find(('a?'):rep(300))",
  };
  for (size_t i = 0; i < sizeof bombs / sizeof bombs[0]; i++) {
    expect_error(sb, bombs[i], "pattern too complex");
    expect_usable(sb);
  }
  /* Caught and retried, the steps still add up to the instruction budget. */
  const char *loops[] = {
      "while true do pcall(string.find, ('a'):rep(40), "
      "  ('a*'):rep(30) .. 'b') end",
      "(('x'):rep(1000)):gsub('.', function() "
      "  pcall(string.find, ('a'):rep(40), ('a*'):rep(30) .. 'b') end)",
      /* each call just under the per-call budget */
      "local s = ('a'):rep(1200) while true do "
      "  s:find(('a'):rep(600) .. 'b$') end",
  };
  for (size_t i = 0; i < sizeof loops / sizeof loops[0]; i++) {
    expect_error(sb, loops[i], "budget: instruction limit exceeded");
    expect_usable(sb);
  }
  /* Ordinary pattern code gives the stock answers. */
  assert_int_equal(
      run(sb, "local k, v = ('key = value'):match('(%w+)%s*=%s*(%w+)') "
              "local t = {} for w in ('a,b,,c'):gmatch('([^,]*)') do "
              "t[#t + 1] = w end "
              "return k .. v .. table.concat(t, '|') .. "
              "select(2, string.gsub('hello world', 'o', '0')) .. "
              "string.find('a.b', '.', 1, true)"),
      LUA_OK);
  assert_string_equal(lua_tostring(om_sandbox_state(sb), -1),
                      "keyvaluea|b||c22");
  om_sandbox_free(sb);
}

static void budget_resets_per_call(void **state) {
  (void)state;
  om_sandbox_t *sb = sandbox();
  /* Each call gets the full budget: 1.5M instructions twice is fine. */
  for (int i = 0; i < 3; i++)
    assert_int_equal(run(sb, "local x = 0 for i = 1, 300000 do x = x + i end "
                             "return x"),
                     LUA_OK);
  om_sandbox_free(sb);
}

static void new_survives_allocation_failures(void **state) {
  (void)state;
  for (long n = 0;; n++) {
    om_sandbox_t *sb = NULL;
    om_test_fail_alloc_after(n);
    int rc = om_sandbox_new(NULL, &sb);
    om_test_alloc_reset();
    if (rc == 0) {
      om_sandbox_free(sb);
      OM_ASSERT_CMP(n, >, 0);
      break;
    }
    assert_int_equal(rc, OM_ENOMEM);
    assert_null(sb);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(plain_code_runs),
      cmocka_unit_test(cpu_budget),
      cmocka_unit_test(trips_name_the_line),
      cmocka_unit_test(wall_clock_budget),
      cmocka_unit_test(memory_budget),
      cmocka_unit_test(per_call_limits),
      cmocka_unit_test(last_trip_memory),
      cmocka_unit_test(c_loops_are_bounded),
      cmocka_unit_test(no_escape_hatches),
      cmocka_unit_test(string_metatable_is_protected),
      cmocka_unit_test(gc_metamethods_refused),
      cmocka_unit_test(pattern_blowups_are_bounded),
      cmocka_unit_test(budget_resets_per_call),
      cmocka_unit_test(new_survives_allocation_failures),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
