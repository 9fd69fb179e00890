/* l_selection.c: placeholder until the selection bindings land. */
#include "om_lua.h"

void om__lua_open_selection(lua_State *L) {
  (void)L;
}
