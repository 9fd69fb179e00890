/*
 * bench_lua.c: the cost of one protected call from C into Lua through
 * om_lua_pcall (traceback handler included), with a bare lua_call of the same
 * empty function as the baseline in the same run. Policy calls sit on this.
 */
#include "om_bench.h"

#include <lualib.h>

#include "om_lua.h"

#define ROUNDS 9
#define CALLS 1000000

static double per_call_ns(lua_State *L, int protected_call) {
  uint64_t t0 = om_bench_now_ns();
  for (int i = 0; i < CALLS; i++) {
    lua_pushvalue(L, 1); /* [f, f] */
    if (protected_call) {
      if (om_lua_pcall(L, 0, 0) != LUA_OK) {
        fprintf(stderr, "bench_lua: %s\n", lua_tostring(L, -1));
        exit(1);
      }
    } else {
      lua_call(L, 0, 0);
    }
  }
  return (double)(om_bench_now_ns() - t0) / CALLS;
}

int main(void) {
  double pcall[ROUNDS], bare[ROUNDS];
  lua_State *L = luaL_newstate();
  if (L == NULL)
    return 1;
  luaL_openlibs(L);
  if (luaL_loadstring(L, "return function() end") != LUA_OK ||
      om_lua_pcall(L, 0, 1) != LUA_OK) { /* [f] */
    fprintf(stderr, "bench_lua: %s\n", lua_tostring(L, -1));
    return 1;
  }
  per_call_ns(L, 1); /* warm-up */
  for (int r = 0; r < ROUNDS; r++) {
    pcall[r] = per_call_ns(L, 1);
    bare[r] = per_call_ns(L, 0);
  }
  double p = om_bench_median(pcall, ROUNDS), b = om_bench_median(bare, ROUNDS);
  om_bench_report("lua_pcall_empty", p, "ns");
  om_bench_report("lua_call_empty_baseline", b, "ns");
  om_bench_report("lua_pcall_empty_ratio", p / b, "x");
  lua_close(L);
  return 0;
}
