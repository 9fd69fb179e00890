/* l_sse.c: placeholder until the sse bindings land. */
#include "om_lua.h"

void om__lua_open_sse(lua_State *L) {
  (void)L;
}
