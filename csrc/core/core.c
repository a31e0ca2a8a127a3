/* warmbox.core: placeholder entry point; grows the libcurl transport and locks. */
#include <lua.h>
#include <lauxlib.h>

int luaopen_warmbox_core(lua_State *L);

int luaopen_warmbox_core(lua_State *L) {
  lua_newtable(L);
  lua_pushliteral(L, WARMBOX_VERSION);
  lua_setfield(L, -2, "_VERSION");
  return 1;
}
