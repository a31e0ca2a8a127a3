/* redis.c: warmbox.Redis, a minimal blocking Redis client over hiredis for
 * the cross-host lock. No protocol code here: hiredis builds the commands
 * (redisCommandArgv, binary-safe) and parses the replies; we only map the
 * replies to Lua values.
 *
 * A transport failure leaves a hiredis context unusable, so it is freed and
 * the next command reconnects with the saved parameters: one bad moment of
 * the network does not poison the object. close() is the only way to close. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <hiredis/hiredis.h>

#include "warmbox_core.h"
#include "lock_internal.h"

#define WARMBOX_REDIS_MT "warmbox.Redis"
#define WARMBOX_REDIS_MAX_ARGS 1024

typedef struct {
  redisContext *ctx; /* NULL when not connected (yet or after an error) */
  int closed;
  int port;
  double timeout;
  /* host or unix socket path: user value 1 */
} warmbox_redis;

static struct timeval warmbox_redis_tv(double s) {
  struct timeval tv;
  if (!(s > 0)) s = 0.001;
  tv.tv_sec = (time_t)s;
  tv.tv_usec = (suseconds_t)((s - (double)tv.tv_sec) * 1e6);
  return tv;
}

static warmbox_redis *warmbox_redis_check(lua_State *L) {
  warmbox_redis *r = (warmbox_redis *)luaL_checkudata(L, 1, WARMBOX_REDIS_MT);
  if (r->closed) luaL_error(L, "attempt to use a closed " WARMBOX_REDIS_MT);
  return r;
}

static void warmbox_redis_drop(warmbox_redis *r) {
  if (r->ctx) {
    redisFree(r->ctx);
    r->ctx = NULL;
  }
}

/* Connects when needed. Returns 1 or pushes nil, msg, "TRANSPORT" and returns 0.
 * Expects the userdata at index 1. */
static int warmbox_redis_ensure(lua_State *L, warmbox_redis *r) {
  const char *host;
  struct timeval tv;
  if (r->ctx) return 1;
  lua_getiuservalue(L, 1, 1);
  host = lua_tostring(L, -1);
  tv = warmbox_redis_tv(r->timeout);
  if (host[0] == '/')
    r->ctx = redisConnectUnixWithTimeout(host, tv);
  else
    r->ctx = redisConnectWithTimeout(host, r->port, tv);
  if (r->ctx == NULL || r->ctx->err) {
    luaL_pushfail(L);
    if (r->ctx == NULL)
      lua_pushfstring(L, "redis %s:%d: cannot allocate a connection", host, r->port);
    else
      lua_pushfstring(L, "redis %s:%d: %s", host, r->port, r->ctx->errstr);
    lua_pushliteral(L, "TRANSPORT");
    lua_remove(L, -4); /* the host */
    warmbox_redis_drop(r);
    return 0;
  }
  lua_pop(L, 1);
  if (redisSetTimeout(r->ctx, tv) != REDIS_OK) {
    luaL_pushfail(L);
    lua_pushliteral(L, "redis: cannot set the socket timeout");
    lua_pushliteral(L, "TRANSPORT");
    warmbox_redis_drop(r);
    return 0;
  }
  return 1;
}

static const char *warmbox_redis_opt_keys[] = {"host", "port", "timeout", NULL};

/* core.redis{ host = "127.0.0.1", port = 6379, timeout = 5 }
 *   -> warmbox.Redis | nil, msg, "TRANSPORT". host may be a unix socket path. */
static int warmbox_redis_new(lua_State *L) {
  warmbox_redis *r;
  const char *host = "127.0.0.1";
  lua_Integer port = 6379;
  double timeout = 5;
  int i;
  if (lua_isnoneornil(L, 1)) {
    lua_settop(L, 0);
    lua_newtable(L);
  }
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_pushnil(L);
  while (lua_next(L, 1)) {
    int known = 0;
    lua_pop(L, 1);
    if (lua_type(L, -1) == LUA_TSTRING) {
      for (i = 0; warmbox_redis_opt_keys[i]; i++)
        if (strcmp(lua_tostring(L, -1), warmbox_redis_opt_keys[i]) == 0) known = 1;
    }
    if (!known) {
      return luaL_error(L, "bad argument #1 to 'redis' (unknown option '%s')",
                        luaL_tolstring(L, -1, NULL));
    }
  }
  if (lua_getfield(L, 1, "host") != LUA_TNIL) {
    size_t len;
    if (lua_type(L, -1) != LUA_TSTRING)
      return luaL_argerror(L, 1, "'host' must be a string");
    host = lua_tolstring(L, -1, &len);
    if (strlen(host) != len || len == 0)
      return luaL_argerror(L, 1, "'host' must be a non-empty string without NUL");
  }
  lua_pop(L, 1);
  if (lua_getfield(L, 1, "port") != LUA_TNIL) {
    int ok;
    port = lua_tointegerx(L, -1, &ok);
    if (!ok || port < 0 || port > 65535)
      return luaL_argerror(L, 1, "'port' must be an integer in 0..65535");
  }
  lua_pop(L, 1);
  if (lua_getfield(L, 1, "timeout") != LUA_TNIL) {
    if (lua_type(L, -1) != LUA_TNUMBER || !(lua_tonumber(L, -1) > 0))
      return luaL_argerror(L, 1, "'timeout' must be a positive number");
    timeout = lua_tonumber(L, -1);
  }
  lua_pop(L, 1);

  r = (warmbox_redis *)lua_newuserdatauv(L, sizeof *r, 1);
  r->ctx = NULL;
  r->closed = 0;
  r->port = (int)port;
  r->timeout = timeout;
  luaL_setmetatable(L, WARMBOX_REDIS_MT);
  lua_pushstring(L, host);
  lua_setiuservalue(L, -2, 1);
  lua_replace(L, 1);
  lua_settop(L, 1);
  if (!warmbox_redis_ensure(L, r)) return 3;
  return 1;
}

/* Pushes a reply as a Lua value. Nested nil replies become false (a Lua
 * array cannot hold nil), nested errors become { err = msg }. */
static void warmbox_redis_push(lua_State *L, const redisReply *rep, int nested) {
  size_t i;
  luaL_checkstack(L, 4, "redis reply too deep");
  switch (rep->type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
      lua_pushlstring(L, rep->str, rep->len);
      break;
    case REDIS_REPLY_INTEGER:
      lua_pushinteger(L, (lua_Integer)rep->integer);
      break;
    case REDIS_REPLY_ARRAY:
      lua_createtable(L, (int)rep->elements, 0);
      for (i = 0; i < rep->elements; i++) {
        warmbox_redis_push(L, rep->element[i], 1);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
      }
      break;
    case REDIS_REPLY_ERROR:
      lua_createtable(L, 0, 1);
      lua_pushlstring(L, rep->str, rep->len);
      lua_setfield(L, -2, "err");
      break;
    case REDIS_REPLY_NIL:
    default:
      if (nested)
        lua_pushboolean(L, 0);
      else
        lua_pushnil(L);
      break;
  }
}

/* r:command(name, ...) -> value | nil, msg, "REDIS" | nil, msg, "TRANSPORT"
 * Arguments are strings or numbers, sent byte for byte. */
static int warmbox_redis_command(lua_State *L) {
  warmbox_redis *r = warmbox_redis_check(L);
  int n = lua_gettop(L) - 1, i;
  const char *argv[WARMBOX_REDIS_MAX_ARGS];
  size_t argvlen[WARMBOX_REDIS_MAX_ARGS];
  redisReply *rep;
  luaL_argcheck(L, n >= 1, 2, "command name expected");
  luaL_argcheck(L, n <= WARMBOX_REDIS_MAX_ARGS, WARMBOX_REDIS_MAX_ARGS + 2, "too many arguments");
  for (i = 0; i < n; i++) {
    int t = lua_type(L, i + 2);
    if (t != LUA_TSTRING && t != LUA_TNUMBER)
      return luaL_typeerror(L, i + 2, "string or number");
  }
  /* Convert numbers in place (lua_tolstring does), after the type checks. */
  for (i = 0; i < n; i++) argv[i] = lua_tolstring(L, i + 2, &argvlen[i]);
  if (!warmbox_redis_ensure(L, r)) return 3;
  rep = (redisReply *)redisCommandArgv(r->ctx, n, argv, argvlen);
  if (rep == NULL) {
    luaL_pushfail(L);
    lua_pushfstring(L, "redis: %s", r->ctx->err ? r->ctx->errstr : "no reply");
    lua_pushliteral(L, "TRANSPORT");
    warmbox_redis_drop(r);
    return 3;
  }
  if (rep->type == REDIS_REPLY_ERROR) {
    luaL_pushfail(L);
    lua_pushlstring(L, rep->str, rep->len);
    lua_pushliteral(L, "REDIS");
    freeReplyObject(rep);
    return 3;
  }
  warmbox_redis_push(L, rep, 0);
  freeReplyObject(rep);
  return 1;
}

static int warmbox_redis_close(lua_State *L) {
  warmbox_redis *r = (warmbox_redis *)luaL_checkudata(L, 1, WARMBOX_REDIS_MT);
  warmbox_redis_drop(r);
  r->closed = 1;
  lua_pushboolean(L, 1);
  return 1;
}

static int warmbox_redis_gc(lua_State *L) {
  warmbox_redis *r = (warmbox_redis *)luaL_checkudata(L, 1, WARMBOX_REDIS_MT);
  warmbox_redis_drop(r);
  r->closed = 1;
  return 0;
}

static int warmbox_redis_tostring(lua_State *L) {
  warmbox_redis *r = (warmbox_redis *)luaL_checkudata(L, 1, WARMBOX_REDIS_MT);
  if (r->closed)
    lua_pushliteral(L, WARMBOX_REDIS_MT " (closed)");
  else
    lua_pushfstring(L, WARMBOX_REDIS_MT ": %p", (void *)r);
  return 1;
}

static const luaL_Reg warmbox_redis_methods[] = {
  {"command", warmbox_redis_command},
  {"close", warmbox_redis_close},
  {NULL, NULL}
};

static const luaL_Reg warmbox_redis_meta[] = {
  {"__gc", warmbox_redis_gc},
  {"__close", warmbox_redis_gc},
  {"__tostring", warmbox_redis_tostring},
  {"__index", NULL},
  {NULL, NULL}
};

void warmbox_redis_register(lua_State *L) {
  if (luaL_newmetatable(L, WARMBOX_REDIS_MT)) {
    luaL_setfuncs(L, warmbox_redis_meta, 0);
    luaL_newlib(L, warmbox_redis_methods);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  lua_pushcfunction(L, warmbox_redis_new);
  lua_setfield(L, -2, "redis");
}
