/* l_resilience.c: placeholder until the resilience bindings land. */
#include "om_lua.h"

void om__lua_open_resilience(lua_State *L) {
  (void)L;
}
