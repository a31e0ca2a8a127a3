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
#include "warmbox_redis_topo.h"

#define WARMBOX_REDIS_MT       "warmbox.Redis"
#define WARMBOX_REDIS_MAX_ARGS 1024

typedef struct {
  redisContext *ctx; /* NULL when not connected (yet or after an error) */
  int closed;
  warmbox_redis_conf *conf; /* where it connects; freed with the object */
} warmbox_redis;

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

/* Connects when needed (sentinel mode: to the primary the sentinels name).
 * Returns 1 or pushes nil, msg, "TRANSPORT" and returns 0. */
static int warmbox_redis_ensure(lua_State *L, warmbox_redis *r) {
  char err[512];
  if (r->ctx) return 1;
  err[0] = '\0';
  r->ctx = warmbox_redis_connect(r->conf, err, sizeof err);
  if (r->ctx) return 1;
  luaL_pushfail(L);
  if (r->conf->master)
    lua_pushfstring(L, "redis: no primary for '%s' through %d sentinel(s): %s", r->conf->master, r->conf->naddrs, err);
  else
    lua_pushstring(L, err[0] ? err : "redis: cannot connect");
  lua_pushliteral(L, "TRANSPORT");
  lua_pushboolean(L, 0); /* not sent */
  return 0;
}

static const char *warmbox_redis_opt_keys[] = {"host", "port",      "timeout", "username", "password",
                                               "db",   "sentinels", "master",  "nodes",    NULL};

/* Raises a bad option after freeing c. */
static int warmbox_redis_bad(lua_State *L, warmbox_redis_conf *c, const char *msg) {
  warmbox_redis_conf_free(c);
  return luaL_argerror(L, 1, msg);
}

/* An optional string option `name` of the table at 1: a malloc'd copy, or NULL. */
static char *warmbox_redis_str_opt(lua_State *L, warmbox_redis_conf *c, const char *name) {
  char *d = NULL;
  if (lua_getfield(L, 1, name) != LUA_TNIL) {
    size_t len;
    const char *s;
    if (lua_type(L, -1) != LUA_TSTRING)
      warmbox_redis_bad(L, c, lua_pushfstring(L, "option '%s': string expected", name));
    s = lua_tolstring(L, -1, &len);
    if (strlen(s) != len || len == 0)
      warmbox_redis_bad(L, c, lua_pushfstring(L, "option '%s': a non-empty string without NUL expected", name));
    d = (char *)malloc(len + 1);
    if (!d) {
      warmbox_redis_conf_free(c);
      luaL_error(L, "not enough memory");
    }
    memcpy(d, s, len + 1);
  }
  lua_pop(L, 1);
  return d;
}

/* The list option `name` ({ "host:port", ... }) into c's addrs. */
static void warmbox_redis_addrs_opt(lua_State *L, warmbox_redis_conf *c, const char *name) {
  lua_Integer i, n;
  if (lua_getfield(L, 1, name) == LUA_TNIL) {
    lua_pop(L, 1);
    return;
  }
  n = lua_type(L, -1) == LUA_TTABLE ? (lua_Integer)lua_rawlen(L, -1) : 0;
  if (n < 1 || n > 64 || c->naddrs > 0)
    warmbox_redis_bad(L, c, lua_pushfstring(L, "option '%s': a list of 1 to 64 \"host:port\" expected", name));
  c->addr_host = (char **)calloc((size_t)n, sizeof *c->addr_host);
  c->addr_port = (int *)calloc((size_t)n, sizeof *c->addr_port);
  if (!c->addr_host || !c->addr_port) {
    warmbox_redis_conf_free(c);
    luaL_error(L, "not enough memory");
  }
  for (i = 1; i <= n; i++) {
    int t = lua_rawgeti(L, -1, i);
    if (t != LUA_TSTRING || warmbox_redis_split(lua_tostring(L, -1), &c->addr_host[i - 1], &c->addr_port[i - 1]) != 0)
      warmbox_redis_bad(L, c, lua_pushfstring(L, "option '%s': \"host:port\" expected at %d", name, (int)i));
    c->naddrs = (int)i;
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

static void warmbox_redis_check_keys(lua_State *L) {
  int i;
  lua_pushnil(L);
  while (lua_next(L, 1)) {
    int known = 0;
    lua_pop(L, 1);
    if (lua_type(L, -1) == LUA_TSTRING) {
      for (i = 0; warmbox_redis_opt_keys[i]; i++)
        if (strcmp(lua_tostring(L, -1), warmbox_redis_opt_keys[i]) == 0) known = 1;
    }
    if (!known) luaL_argerror(L, 1, lua_pushfstring(L, "unknown option '%s'", luaL_tolstring(L, -1, NULL)));
  }
}

/* The numbers: port, timeout, db. Raises (freeing c) on a bad one. */
static void warmbox_redis_num_opts(lua_State *L, warmbox_redis_conf *c) {
  const char *bad = NULL;
  if (lua_getfield(L, 1, "port") != LUA_TNIL) {
    int ok;
    lua_Integer port = lua_tointegerx(L, -1, &ok);
    if (!ok || port < 0 || port > 65535) bad = "option 'port': an integer in 0..65535 expected";
    c->port = (int)port;
  }
  lua_pop(L, 1);
  if (lua_getfield(L, 1, "timeout") != LUA_TNIL) {
    if (lua_type(L, -1) != LUA_TNUMBER || !(lua_tonumber(L, -1) > 0))
      bad = "option 'timeout': a positive number expected";
    c->timeout = lua_tonumber(L, -1);
  }
  lua_pop(L, 1);
  if (lua_getfield(L, 1, "db") != LUA_TNIL) {
    int ok;
    lua_Integer db = lua_tointegerx(L, -1, &ok);
    if (!ok || db < 0 || db > 1000000) bad = "option 'db': an integer >= 0 expected";
    c->db = (long long)db;
  }
  lua_pop(L, 1);
  if (bad) warmbox_redis_bad(L, c, bad);
}

/* The options of the table at 1 into a new conf (raises on misuse). */
static warmbox_redis_conf *warmbox_redis_conf_new(lua_State *L) {
  warmbox_redis_conf *c = (warmbox_redis_conf *)calloc(1, sizeof *c);
  if (!c) luaL_error(L, "not enough memory");
  c->port = 6379;
  c->timeout = 5;
  warmbox_redis_num_opts(L, c);
  c->host = warmbox_redis_str_opt(L, c, "host");
  c->username = warmbox_redis_str_opt(L, c, "username");
  c->password = warmbox_redis_str_opt(L, c, "password");
  c->master = warmbox_redis_str_opt(L, c, "master");
  warmbox_redis_addrs_opt(L, c, "sentinels");
  if (c->master && c->naddrs == 0) warmbox_redis_bad(L, c, "option 'master' needs 'sentinels'");
  if (!c->master && c->naddrs > 0) warmbox_redis_bad(L, c, "option 'sentinels' needs 'master'");
  if (!c->master) {
    warmbox_redis_addrs_opt(L, c, "nodes");
    c->cluster = c->naddrs > 0;
  }
  if (c->username && !c->password) warmbox_redis_bad(L, c, "option 'username' needs 'password'");
  if (!c->host) {
    c->host = (char *)malloc(sizeof "127.0.0.1");
    if (!c->host) {
      warmbox_redis_conf_free(c);
      luaL_error(L, "not enough memory");
    }
    memcpy(c->host, "127.0.0.1", sizeof "127.0.0.1");
  }
  return c;
}

/* core.redis{ host = "127.0.0.1", port = 6379, timeout = 5, username =, password =, db = 0,
 *             sentinels = { "host:port", ... }, master = "name" | nodes = { "host:port", ... } }
 *   -> warmbox.Redis | nil, msg, "TRANSPORT". host may be a unix socket path.
 * sentinels + master: the primary is the one the sentinels name, found again
 * after a failover; nodes: host:port is a Redis Cluster node and nodes its
 * seeds (the keeper follows MOVED/ASK; the object returns them as errors). */
static int warmbox_redis_new(lua_State *L) {
  warmbox_redis *r;
  warmbox_redis_conf *c;
  if (lua_isnoneornil(L, 1)) {
    lua_settop(L, 0);
    lua_newtable(L);
  }
  luaL_checktype(L, 1, LUA_TTABLE);
  warmbox_redis_check_keys(L);
  c = warmbox_redis_conf_new(L);
  r = (warmbox_redis *)lua_newuserdatauv(L, sizeof *r, 0);
  r->ctx = NULL;
  r->closed = 0;
  r->conf = c;
  luaL_setmetatable(L, WARMBOX_REDIS_MT);
  lua_replace(L, 1);
  lua_settop(L, 1);
  if (!warmbox_redis_ensure(L, r)) return 4;
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

/* Sends one command (connecting first). An answer saying the node is no
 * longer the primary (READONLY after a failover, ...) drops the connection;
 * in sentinel mode the command, which did not run, is sent once more to the
 * primary the sentinels name now. NULL after pushing nil, msg, "TRANSPORT". */
static redisReply *warmbox_redis_run(lua_State *L, warmbox_redis *r, int n, const char **argv, const size_t *argvlen) {
  int tries;
  redisReply *rep = NULL;
  for (tries = 0; tries < 2; tries++) {
    if (!warmbox_redis_ensure(L, r)) return NULL;
    rep = (redisReply *)redisCommandArgv(r->ctx, n, argv, argvlen);
    if (rep == NULL) {
      luaL_pushfail(L);
      lua_pushfstring(L, "redis %s:%d: %s", r->conf->host, r->conf->port, r->ctx->err ? r->ctx->errstr : "no reply");
      lua_pushliteral(L, "TRANSPORT");
      lua_pushboolean(L, 1); /* it may have run */
      warmbox_redis_drop(r);
      return NULL;
    }
    if (!warmbox_redis_failover_reply(rep)) return rep;
    warmbox_redis_drop(r);
    if (!r->conf->master || tries == 1) return rep;
    freeReplyObject(rep);
  }
  return rep;
}

/* r:command(name, ...) -> value | nil, msg, "REDIS" | nil, msg, "TRANSPORT", sent
 * Arguments are strings or numbers, sent byte for byte. `sent` (4th) is
 * false when the command cannot have run (no connection, or the node
 * answered that it is not the primary): it may then be sent elsewhere. */
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
    if (t != LUA_TSTRING && t != LUA_TNUMBER) return luaL_typeerror(L, i + 2, "string or number");
  }
  /* Convert numbers in place (lua_tolstring does), after the type checks. */
  for (i = 0; i < n; i++) argv[i] = lua_tolstring(L, i + 2, &argvlen[i]);
  rep = warmbox_redis_run(L, r, n, argv, argvlen);
  if (rep == NULL) return 4;
  if (rep->type == REDIS_REPLY_ERROR) {
    int failover = warmbox_redis_failover_reply(rep);
    luaL_pushfail(L);
    lua_pushlstring(L, rep->str, rep->len);
    /* not the primary (any more): the command did not run; try again later */
    if (failover)
      lua_pushliteral(L, "TRANSPORT");
    else
      lua_pushliteral(L, "REDIS");
    lua_pushboolean(L, !failover);
    freeReplyObject(rep);
    return 4;
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
  warmbox_redis_conf_free(r->conf);
  r->conf = NULL;
  return 0;
}

/* r:address() -> host, port: the node it talks to (sentinel mode: the
 * primary last found; before any, the configured host). */
static int warmbox_redis_address(lua_State *L) {
  warmbox_redis *r = warmbox_redis_check(L);
  lua_pushstring(L, r->conf->host);
  lua_pushinteger(L, r->conf->port);
  return 2;
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
  /* immutable while the thread runs (conf: the thread's own copy) */
  double ttl;
  warmbox_redis_conf *conf;
  char *key, *token;
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
  warmbox_redis_conf_free(k->conf);
  free(k->key);
  free(k->token);
  free(k);
}

/* Sends the compare-and-pexpire on ctx: its reply or NULL (transport). */
static redisReply *warmbox_keeper_send(warmbox_keeper_shared *k, redisContext *ctx) {
  const char *argv[6];
  size_t argvlen[6];
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
  return (redisReply *)redisCommandArgv(ctx, 6, argv, argvlen);
}

/* A cluster's ASK: the one command on host:port after ASKING. */
static redisReply *warmbox_keeper_ask(warmbox_keeper_shared *k, const char *host, int port, char *err, size_t errlen) {
  const char *asking[1] = {"ASKING"};
  redisReply *rep;
  redisContext *c = warmbox_redis_open(k->conf, host, port, err, errlen);
  if (!c) return NULL;
  rep = (redisReply *)redisCommandArgv(c, 1, asking, NULL);
  if (rep) {
    freeReplyObject(rep);
    rep = warmbox_keeper_send(k, c);
  }
  if (!rep) snprintf(err, errlen, "redis %s:%d: %s", host, port, c->err ? c->errstr : "no reply");
  redisFree(c);
  return rep;
}

/* One compare-and-pexpire: 1 refreshed, 0 lost (the key is not ours), -1
 * transport or server error (err filled, *ctx dropped: the next try connects
 * again, to the primary the sentinels name now, or a cluster's seed). A
 * cluster's MOVED is followed (the node remembered), an ASK asked once. */
static int warmbox_keeper_refresh(warmbox_keeper_shared *k, redisContext **ctx, char *err, size_t errlen) {
  redisReply *rep = NULL;
  int r = -1, hops;
  double t = k->ttl / 3 < k->conf->timeout ? k->ttl / 3 : k->conf->timeout;
  k->conf->timeout = t < 0.05 ? 0.05 : t;
  for (hops = 0; hops < 4; hops++) {
    char *host = NULL;
    int port = 0, kind;
    if (*ctx == NULL && (*ctx = warmbox_redis_connect(k->conf, err, errlen)) == NULL) return -1;
    rep = warmbox_keeper_send(k, *ctx);
    if (rep == NULL) {
      snprintf(err, errlen, "redis %s:%d: %s", k->conf->host, k->conf->port, (*ctx)->err ? (*ctx)->errstr : "no reply");
      redisFree(*ctx);
      *ctx = NULL;
      return -1;
    }
    kind = k->conf->cluster ? warmbox_redis_redirect(rep, &host, &port) : 0;
    if (kind == 0) break;
    freeReplyObject(rep);
    rep = NULL;
    if (kind == 2) {
      rep = warmbox_keeper_ask(k, host, port, err, errlen);
      free(host);
      if (!rep) return -1;
      break;
    }
    free(k->conf->host); /* MOVED: that node serves the key from now on */
    k->conf->host = host;
    k->conf->port = port;
    redisFree(*ctx);
    *ctx = NULL;
  }
  if (rep == NULL) {
    snprintf(err, errlen, "redis: too many redirections");
    return -1;
  }
  if (rep->type == REDIS_REPLY_INTEGER) {
    r = rep->integer == 1 ? 1 : 0;
  } else {
    snprintf(err, errlen, "redis: %.*s", rep->type == REDIS_REPLY_ERROR ? (int)(rep->len > 200 ? 200 : rep->len) : 16,
             rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    if (warmbox_redis_failover_reply(rep)) {
      redisFree(*ctx);
      *ctx = NULL;
    }
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
  luaL_argcheck(L, ttl >= 0.01 && ttl <= 1e6, 4, "ttl must be in [0.01, 1e6] seconds");
  luaL_argcheck(L, cap > 0 && cap <= 1e9, 5, "cap must be in (0, 1e9] seconds");
  kp = (warmbox_keeper *)lua_newuserdatauv(L, sizeof *kp, 0);
  kp->k = NULL;
  luaL_setmetatable(L, WARMBOX_KEEPER_MT);
  k = (warmbox_keeper_shared *)calloc(1, sizeof *k);
  if (!k) return luaL_error(L, "not enough memory");
  k->conf = warmbox_redis_conf_dup(r->conf);
  k->key = warmbox_dup(key, keylen);
  k->token = warmbox_dup(token, toklen);
  if (!k->conf || !k->key || !k->token) {
    warmbox_redis_conf_free(k->conf);
    free(k->key);
    free(k->token);
    free(k);
    return luaL_error(L, "not enough memory");
  }
  k->keylen = keylen;
  k->toklen = toklen;
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
  {"status", warmbox_keeper_status}, {"extend", warmbox_keeper_extend}, {"stop", warmbox_keeper_stop_l}, {NULL, NULL}};

static const luaL_Reg warmbox_keeper_meta[] = {
  {"__gc", warmbox_keeper_gc}, {"__close", warmbox_keeper_gc}, {"__index", NULL}, {NULL, NULL}};

static const luaL_Reg warmbox_redis_methods[] = {{"command", warmbox_redis_command},
                                                 {"address", warmbox_redis_address},
                                                 {"keeper", warmbox_redis_keeper},
                                                 {"close", warmbox_redis_close},
                                                 {NULL, NULL}};

static const luaL_Reg warmbox_redis_meta[] = {{"__gc", warmbox_redis_gc},
                                              {"__close", warmbox_redis_gc},
                                              {"__tostring", warmbox_redis_tostring},
                                              {"__index", NULL},
                                              {NULL, NULL}};

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
