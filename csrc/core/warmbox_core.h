/* warmbox_core.h: the parts of warmbox.core, each adding its functions to
 * the module table on top of the stack. core.c: luaopen_warmbox_core.
 * http.c (+ helpers): warmbox.Http (libcurl); engine.c: warmbox.Engine (its
 * event engine); retry.c: the retry rules. lock.c, redis.c: the lock primitives. */
#ifndef WARMBOX_CORE_H
#define WARMBOX_CORE_H
#include <lua.h>
#include <lauxlib.h>

void warmbox_http_register(lua_State *L);
void warmbox_lock_register(lua_State *L);
void warmbox_redis_register(lua_State *L);
void warmbox_engine_register(lua_State *L);
void warmbox_retry_register(lua_State *L);

#endif
