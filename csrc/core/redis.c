/* redis.c: warmbox.Redis, a minimal blocking Redis client over hiredis for
 * the cross-host lock. No protocol code here: hiredis builds the commands
 * (redisCommandArgv, binary-safe) and parses the replies; we only map the
 * replies to Lua values.
 *
 * A transport failure leaves a hiredis context unusable, so it is freed and
 * the next command reconnects with the saved parameters: one bad moment of
 * the network does not poison the object. close() is the only way to close.
 *
 * warmbox.RedisKeeper (r:keeper(key, token, ttl, cap)) keeps a held lock key
 * alive from a thread of its own: every ttl/3 it runs a compare-and-pexpire
 * (PX = ttl) on its own connection, so the key outlives the holder's long
 * blocking C calls (a silent cell) but dies within ttl of the holder's
 * process (crash, SIGKILL, SIGSTOP, lost network). It stops by itself when
 * the key no longer holds the token ("lost") or when `cap` seconds have
 * passed ("capped": the hard limit for a holder whose Lua side hangs); the
 * owner polls k:status(). The thread touches no Lua state: everything it
 * needs is copied into a heap block shared under a mutex. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "warmbox_core.h"
#include "warmbox_clock.h"

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
      return luaL_argerror(L, 1, lua_pushfstring(L, "unknown option '%s'", luaL_tolstring(L, -1, NULL)));
    }
  }
  if (lua_getfield(L, 1, "host") != LUA_TNIL) {
    size_t len;
    if (lua_type(L, -1) != LUA_TSTRING)
      return luaL_argerror(L, 1, "option 'host': string expected");
    host = lua_tolstring(L, -1, &len);
    if (strlen(host) != len || len == 0)
      return luaL_argerror(L, 1, "option 'host': a non-empty string without NUL expected");
  }
  lua_pop(L, 1);
  if (lua_getfield(L, 1, "port") != LUA_TNIL) {
    int ok;
    port = lua_tointegerx(L, -1, &ok);
    if (!ok || port < 0 || port > 65535)
      return luaL_argerror(L, 1, "option 'port': an integer in 0..65535 expected");
  }
  lua_pop(L, 1);
  if (lua_getfield(L, 1, "timeout") != LUA_TNIL) {
    if (lua_type(L, -1) != LUA_TNUMBER || !(lua_tonumber(L, -1) > 0))
      return luaL_argerror(L, 1, "option 'timeout': a positive number expected");
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

/* ---------- warmbox.RedisKeeper ---------- */

#define WARMBOX_KEEPER_MT "warmbox.RedisKeeper"

static const char warmbox_keeper_script[] =
  "if redis.call('get', KEYS[1]) == ARGV[1] then "
  "return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0";

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  /* guarded by mu */
  int stop, done, lost, capped, failing;
  double last_ok, cap_at;
  char err[256];
  /* immutable while the thread runs */
  double ttl, timeout;
  int port;
  char *host, *key, *token;
  size_t keylen, toklen;
  char ttlms[32];
} warmbox_keeper_shared;

typedef struct {
  warmbox_keeper_shared *k; /* NULL once stopped and freed */
  pthread_t th;
} warmbox_keeper;

static void warmbox_keeper_free(warmbox_keeper_shared *k) {
  pthread_cond_destroy(&k->cv);
  pthread_mutex_destroy(&k->mu);
  free(k->host);
  free(k->key);
  free(k->token);
  free(k);
}

/* One compare-and-pexpire: 1 refreshed, 0 lost (the key is not ours), -1
 * transport or server error (err filled, *ctx dropped on transport errors). */
static int warmbox_keeper_refresh(warmbox_keeper_shared *k, redisContext **ctx, char *err, size_t errlen) {
  const char *argv[6];
  size_t argvlen[6];
  redisReply *rep;
  int r;
  double t = k->ttl / 3 < k->timeout ? k->ttl / 3 : k->timeout;
  struct timeval tv = warmbox_redis_tv(t < 0.05 ? 0.05 : t);
  if (*ctx == NULL) {
    if (k->host[0] == '/')
      *ctx = redisConnectUnixWithTimeout(k->host, tv);
    else
      *ctx = redisConnectWithTimeout(k->host, k->port, tv);
    if (*ctx == NULL || (*ctx)->err || redisSetTimeout(*ctx, tv) != REDIS_OK) {
      snprintf(err, errlen, "redis %s:%d: %s", k->host, k->port,
               *ctx && (*ctx)->err ? (*ctx)->errstr : "cannot connect");
      if (*ctx) redisFree(*ctx);
      *ctx = NULL;
      return -1;
    }
  }
  argv[0] = "EVAL";
  argvlen[0] = 4;
  argv[1] = warmbox_keeper_script;
  argvlen[1] = sizeof warmbox_keeper_script - 1;
  argv[2] = "1";
  argvlen[2] = 1;
  argv[3] = k->key;
  argvlen[3] = k->keylen;
  argv[4] = k->token;
  argvlen[4] = k->toklen;
  argv[5] = k->ttlms; /* ARGV[2]: the PX */
  argvlen[5] = strlen(k->ttlms);
  rep = (redisReply *)redisCommandArgv(*ctx, 6, argv, argvlen);
  if (rep == NULL) {
    snprintf(err, errlen, "redis: %s", (*ctx)->err ? (*ctx)->errstr : "no reply");
    redisFree(*ctx);
    *ctx = NULL;
    return -1;
  }
  if (rep->type == REDIS_REPLY_INTEGER) {
    r = rep->integer == 1 ? 1 : 0;
  } else {
    snprintf(err, errlen, "redis: %.*s", rep->type == REDIS_REPLY_ERROR ? (int)rep->len : 16,
             rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    r = -1;
  }
  freeReplyObject(rep);
  return r;
}

static struct timespec warmbox_keeper_abstime(double mono) {
  struct timespec ts;
  ts.tv_sec = (time_t)mono;
  ts.tv_nsec = (long)((mono - (double)ts.tv_sec) * 1e9);
  if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
  if (ts.tv_nsec < 0) ts.tv_nsec = 0;
  return ts;
}

static void *warmbox_keeper_main(void *arg) {
  warmbox_keeper_shared *k = (warmbox_keeper_shared *)arg;
  redisContext *ctx = NULL;
  double next;
  pthread_mutex_lock(&k->mu);
  next = k->last_ok + k->ttl / 3;
  while (!k->stop) {
    double now = warmbox_clock_now();
    char err[256];
    int r;
    if (now < next) {
      struct timespec ts = warmbox_keeper_abstime(next);
      pthread_cond_timedwait(&k->cv, &k->mu, &ts);
      continue;
    }
    if (now >= k->cap_at) {
      k->capped = 1;
      break;
    }
    pthread_mutex_unlock(&k->mu);
    err[0] = '\0';
    r = warmbox_keeper_refresh(k, &ctx, err, sizeof err);
    pthread_mutex_lock(&k->mu);
    now = warmbox_clock_now();
    if (r == 1) {
      k->last_ok = now;
      k->failing = 0;
      next = now + k->ttl / 3;
    } else if (r == 0) {
      k->lost = 1;
      break;
    } else {
      k->failing = 1;
      memcpy(k->err, err, sizeof k->err);
      next = now + k->ttl / 10; /* retry soon: the key lives ttl from last_ok */
    }
  }
  k->done = 1;
  pthread_mutex_unlock(&k->mu);
  if (ctx) redisFree(ctx);
  return NULL;
}

static void warmbox_keeper_stop(warmbox_keeper *kp) {
  warmbox_keeper_shared *k = kp->k;
  if (!k) return;
  pthread_mutex_lock(&k->mu);
  k->stop = 1;
  pthread_cond_signal(&k->cv);
  pthread_mutex_unlock(&k->mu);
  pthread_join(kp->th, NULL);
  warmbox_keeper_free(k);
  kp->k = NULL;
}

static char *warmbox_dup(const char *s, size_t len) {
  char *d = (char *)malloc(len + 1);
  if (d) {
    memcpy(d, s, len);
    d[len] = '\0';
  }
  return d;
}

/* r:keeper(key, token, ttl, cap) -> warmbox.RedisKeeper | nil, msg, "IO"
 * ttl: the PX (seconds) the key is refreshed to every ttl/3; cap: seconds
 * from now after which refreshing stops. The key must already hold token. */
static int warmbox_redis_keeper(lua_State *L) {
  warmbox_redis *r = warmbox_redis_check(L);
  size_t keylen, toklen;
  const char *key = luaL_checklstring(L, 2, &keylen);
  const char *token = luaL_checklstring(L, 3, &toklen);
  double ttl = luaL_checknumber(L, 4);
  double cap = luaL_checknumber(L, 5);
  warmbox_keeper *kp;
  warmbox_keeper_shared *k;
  pthread_condattr_t ca;
  int rc;
  const char *host;
  luaL_argcheck(L, ttl >= 0.01 && ttl <= 1e6, 4, "ttl must be in [0.01, 1e6] seconds");
  luaL_argcheck(L, cap > 0 && cap <= 1e9, 5, "cap must be in (0, 1e9] seconds");
  lua_getiuservalue(L, 1, 1);
  host = lua_tostring(L, -1);
  kp = (warmbox_keeper *)lua_newuserdatauv(L, sizeof *kp, 0);
  kp->k = NULL;
  luaL_setmetatable(L, WARMBOX_KEEPER_MT);
  k = (warmbox_keeper_shared *)calloc(1, sizeof *k);
  if (!k) return luaL_error(L, "not enough memory");
  k->host = warmbox_dup(host, strlen(host));
  k->key = warmbox_dup(key, keylen);
  k->token = warmbox_dup(token, toklen);
  if (!k->host || !k->key || !k->token) {
    free(k->host);
    free(k->key);
    free(k->token);
    free(k);
    return luaL_error(L, "not enough memory");
  }
  k->keylen = keylen;
  k->toklen = toklen;
  k->port = r->port;
  k->timeout = r->timeout;
  k->ttl = ttl;
  snprintf(k->ttlms, sizeof k->ttlms, "%lld", (long long)(ttl * 1000 + 0.5));
  k->last_ok = warmbox_clock_now();
  k->cap_at = k->last_ok + cap;
  pthread_mutex_init(&k->mu, NULL);
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&k->cv, &ca);
  pthread_condattr_destroy(&ca);
  rc = pthread_create(&kp->th, NULL, warmbox_keeper_main, k);
  if (rc != 0) {
    warmbox_keeper_free(k);
    luaL_pushfail(L);
    lua_pushfstring(L, "cannot start the lock keeper thread: %s", strerror(rc));
    lua_pushliteral(L, "IO");
    return 3;
  }
  kp->k = k;
  return 1;
}

/* k:status() -> state, seconds since the last refresh, last error | nil
 * state: "ok" | "failing" (the last refresh failed; retried every ttl/10)
 *        | "lost" (the key no longer holds the token) | "capped" | "stopped" */
static int warmbox_keeper_status(lua_State *L) {
  warmbox_keeper *kp = (warmbox_keeper *)luaL_checkudata(L, 1, WARMBOX_KEEPER_MT);
  warmbox_keeper_shared *k = kp->k;
  const char *state;
  if (!k) {
    lua_pushliteral(L, "stopped");
    return 1;
  }
  pthread_mutex_lock(&k->mu);
  state = k->lost ? "lost" : k->capped ? "capped" : k->done ? "stopped" : k->failing ? "failing" : "ok";
  lua_pushstring(L, state);
  lua_pushnumber(L, warmbox_clock_now() - k->last_ok);
  if (k->err[0] && k->failing)
    lua_pushstring(L, k->err);
  else
    lua_pushnil(L);
  pthread_mutex_unlock(&k->mu);
  return 3;
}

/* k:extend(cap) -> true | false (the keeper already stopped): refresh until
 * `cap` seconds from now. */
static int warmbox_keeper_extend(lua_State *L) {
  warmbox_keeper *kp = (warmbox_keeper *)luaL_checkudata(L, 1, WARMBOX_KEEPER_MT);
  double cap = luaL_checknumber(L, 2);
  warmbox_keeper_shared *k = kp->k;
  int ok;
  luaL_argcheck(L, cap > 0 && cap <= 1e9, 2, "cap must be in (0, 1e9] seconds");
  if (!k) {
    lua_pushboolean(L, 0);
    return 1;
  }
  pthread_mutex_lock(&k->mu);
  ok = !k->done;
  if (ok) k->cap_at = warmbox_clock_now() + cap;
  pthread_mutex_unlock(&k->mu);
  lua_pushboolean(L, ok);
  return 1;
}

/* k:stop(): stops and joins the thread (idempotent; waits at most one
 * refresh in flight, bounded by the connection timeout). */
static int warmbox_keeper_stop_l(lua_State *L) {
  warmbox_keeper *kp = (warmbox_keeper *)luaL_checkudata(L, 1, WARMBOX_KEEPER_MT);
  warmbox_keeper_stop(kp);
  lua_pushboolean(L, 1);
  return 1;
}

static int warmbox_keeper_gc(lua_State *L) {
  warmbox_keeper *kp = (warmbox_keeper *)luaL_checkudata(L, 1, WARMBOX_KEEPER_MT);
  warmbox_keeper_stop(kp);
  return 0;
}

static const luaL_Reg warmbox_keeper_methods[] = {
  {"status", warmbox_keeper_status},
  {"extend", warmbox_keeper_extend},
  {"stop", warmbox_keeper_stop_l},
  {NULL, NULL}
};

static const luaL_Reg warmbox_keeper_meta[] = {
  {"__gc", warmbox_keeper_gc},
  {"__close", warmbox_keeper_gc},
  {"__index", NULL},
  {NULL, NULL}
};

static const luaL_Reg warmbox_redis_methods[] = {
  {"command", warmbox_redis_command},
  {"keeper", warmbox_redis_keeper},
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
  if (luaL_newmetatable(L, WARMBOX_KEEPER_MT)) {
    luaL_setfuncs(L, warmbox_keeper_meta, 0);
    luaL_newlib(L, warmbox_keeper_methods);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  if (luaL_newmetatable(L, WARMBOX_REDIS_MT)) {
    luaL_setfuncs(L, warmbox_redis_meta, 0);
    luaL_newlib(L, warmbox_redis_methods);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  lua_pushcfunction(L, warmbox_redis_new);
  lua_setfield(L, -2, "redis");
}
