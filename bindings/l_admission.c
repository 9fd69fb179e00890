/* l_admission.c: placeholder until the admission bindings land. */
#include "om_lua.h"

void om__lua_open_admission(lua_State *L) {
  (void)L;
}
