/* warmbox.core: the module table. Each part registers its own functions. */
#include "warmbox_core.h"

int luaopen_warmbox_core(lua_State *L);

int luaopen_warmbox_core(lua_State *L) {
  lua_newtable(L);
  lua_pushliteral(L, WARMBOX_VERSION);
  lua_setfield(L, -2, "_VERSION");
  warmbox_http_register(L);
  warmbox_lock_register(L);
  return 1;
}
