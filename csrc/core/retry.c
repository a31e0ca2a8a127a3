/* retry.c: when warmbox.core's transport tries a request again, and after
 * how long (see warmbox_retry.h and HACKING.md, "Retries").
 *
 * The rules: nothing is retried once stream output was handed out, after a
 * local failure, or past max_attempts. A completed response is retried when
 * its status is one the request lists as "refused" (the server says it did
 * not act: any request), or when the request is idempotent and its status is
 * listed (429 and 503 honour Retry-After). A failed or timed-out connection
 * is retried for an idempotent request, and for any request only when it
 * failed before a byte was sent: a body that is not idempotent is never
 * silently sent twice. The wait is a capped
 * exponential backoff with jitter in [d/2, d] (or Retry-After, capped at
 * retry_after_max when that is >= 0), and no retry starts that would end
 * past the budget. */
#include <string.h>
#include "warmbox_core.h"
#include "warmbox_retry.h"

double warmbox_retry_decide(const warmbox_retry_facts *f) {
  double delay, ra = -1;
  int retryable = 0, shift;
  if (f->attempts >= f->max_attempts || f->delivered > 0 || f->local_failure) return -1;
  if (f->completed) {
    int i;
    for (i = 0; i < f->nrefused; i++)
      if (f->refused[i] == f->status) retryable = 1;
    if (f->idempotent)
      for (i = 0; i < f->nstatuses; i++)
        if (f->statuses[i] == f->status) retryable = 1;
    if (retryable && (f->status == 429 || f->status == 503)) ra = f->retry_after;
  } else if (f->idempotent) {
    retryable = f->connection_error || f->timed_out || f->before_send;
  } else {
    retryable = f->before_send;
  }
  if (!retryable) return -1;
  shift = f->attempts - 1 < 20 ? f->attempts - 1 : 20;
  if (shift < 0) shift = 0;
  delay = f->base * (double)(1u << shift);
  if (delay > f->cap) delay = f->cap;
  delay = delay / 2 + f->jitter * delay / 2; /* jitter in [d/2, d] */
  if (ra >= 0) delay = f->retry_after_max >= 0 && ra > f->retry_after_max ? f->retry_after_max : ra;
  if (f->elapsed + delay > f->budget) return -1;
  return delay;
}

/* ---- test hook: core._retry_decide{...} -> delay | -1 ---- */

static double warmbox_field_number(lua_State *L, const char *k, double dflt) {
  double v = dflt;
  lua_getfield(L, 1, k);
  if (!lua_isnil(L, -1)) {
    if (!lua_isnumber(L, -1)) luaL_error(L, "field '%s' must be a number", k);
    v = (double)lua_tonumber(L, -1);
  }
  lua_pop(L, 1);
  return v;
}

static int warmbox_field_bool(lua_State *L, const char *k) {
  int v;
  lua_getfield(L, 1, k);
  v = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

static int warmbox_retry_decide_lua(lua_State *L) {
  warmbox_retry_facts f;
  long statuses[16] = {429, 502, 503, 504};
  long refused[16] = {0};
  luaL_checktype(L, 1, LUA_TTABLE);
  memset(&f, 0, sizeof f);
  f.attempts = (int)warmbox_field_number(L, "attempts", 1);
  f.max_attempts = (int)warmbox_field_number(L, "max_attempts", 3);
  f.idempotent = warmbox_field_bool(L, "idempotent");
  f.delivered = (int)warmbox_field_number(L, "delivered", 0);
  f.local_failure = warmbox_field_bool(L, "local_failure");
  f.completed = warmbox_field_bool(L, "completed");
  f.status = (long)warmbox_field_number(L, "status", 0);
  f.nstatuses = 4;
  lua_getfield(L, 1, "statuses");
  if (lua_istable(L, -1)) {
    lua_Integer i, n = luaL_len(L, -1);
    if (n > 16) luaL_error(L, "too many statuses");
    for (i = 1; i <= n; i++) {
      lua_geti(L, -1, i);
      statuses[i - 1] = (long)lua_tointeger(L, -1);
      lua_pop(L, 1);
    }
    f.nstatuses = (int)n;
  }
  lua_pop(L, 1);
  f.statuses = statuses;
  lua_getfield(L, 1, "refused");
  if (lua_istable(L, -1)) {
    lua_Integer i, n = luaL_len(L, -1);
    if (n > 16) luaL_error(L, "too many refused statuses");
    for (i = 1; i <= n; i++) {
      lua_geti(L, -1, i);
      refused[i - 1] = (long)lua_tointeger(L, -1);
      lua_pop(L, 1);
    }
    f.nrefused = (int)n;
  }
  lua_pop(L, 1);
  f.refused = refused;
  f.timed_out = warmbox_field_bool(L, "timed_out");
  f.retry_after = warmbox_field_number(L, "retry_after", -1);
  f.retry_after_max = warmbox_field_number(L, "retry_after_max", -1);
  f.connection_error = warmbox_field_bool(L, "connection_error");
  f.before_send = warmbox_field_bool(L, "before_send");
  f.base = warmbox_field_number(L, "base", 0.1);
  f.cap = warmbox_field_number(L, "cap", 2);
  f.budget = warmbox_field_number(L, "budget", 30);
  f.elapsed = warmbox_field_number(L, "elapsed", 0);
  f.jitter = warmbox_field_number(L, "jitter", 0);
  lua_pushnumber(L, (lua_Number)warmbox_retry_decide(&f));
  return 1;
}

void warmbox_retry_register(lua_State *L) {
  lua_pushcfunction(L, warmbox_retry_decide_lua);
  lua_setfield(L, -2, "_retry_decide");
}
