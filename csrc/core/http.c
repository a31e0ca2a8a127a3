/* http.c: warmbox.Http, the libcurl transport of warmbox.core.
 *
 * One client holds a CURLSH (DNS cache + connection pool) and one easy handle
 * reused for every request, so connections stay alive across calls; batches
 * run extra easy handles over the multi interface, sharing the same pool.
 *
 * Rule: never raise a Lua error while libcurl is on the C stack. Responses
 * are collected in C buffers and turned into Lua values after the transfer;
 * streamed frames are handed to Lua under lua_pcall, and a callback's error is
 * stashed and re-raised once libcurl has returned. */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <curl/curl.h>
#include "warmbox_core.h"
#include "warmbox_clock.h"
#include "warmbox_buf.h"
#include "warmbox_stream.h"
#include "warmbox_retry.h"
#include "warmbox_http.h"

#define WARMBOX_MAX_FRAME    ((size_t)64 * 1024 * 1024)
#define WARMBOX_MAX_SECRETS  8
#define WARMBOX_MAX_STATUSES 16

/* ======================================================================
 * The client
 * ====================================================================== */

struct warmbox_http {
  CURL *easy;    /* reused for every h:request */
  CURLM *multi;  /* created on the first h:batch */
  CURLSH *share; /* DNS + connections, shared by every handle of this client */
  char *proxy;   /* NULL: libcurl's default (environment); "": none */
  char *user_agent;
  char *ca_file;
  long connect_timeout_ms;
  long timeout_ms;
  long max_connections;
  uint64_t rng; /* jitter; per client, so no mutable C statics */
  int busy;     /* h->easy is in a transfer (a callback may call us again) */
  int closed;
  long share_users; /* engine transfers using the share: it outlives h:close() */
};

static double warmbox_random(warmbox_http *h) {
  /* xorshift64*: plenty for jitter. */
  uint64_t x = h->rng;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  h->rng = x;
  return (double)((x * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
}

static char *warmbox_strdup(const char *s) {
  size_t n;
  char *d;
  if (!s) return NULL;
  n = strlen(s) + 1;
  d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

static void warmbox_http_release(warmbox_http *h) {
  /* Easy handles first: the share cannot be cleaned up while in use (an
   * engine transfer still using it cleans it up when it ends). */
  if (h->easy) curl_easy_cleanup(h->easy);
  if (h->multi) curl_multi_cleanup(h->multi);
  if (h->share && h->share_users == 0) {
    curl_share_cleanup(h->share);
    h->share = NULL;
  }
  free(h->proxy);
  free(h->user_agent);
  free(h->ca_file);
  h->easy = NULL;
  h->multi = NULL;
  h->proxy = h->user_agent = h->ca_file = NULL;
  h->closed = 1;
}

static warmbox_http *warmbox_check_http(lua_State *L, int idx) {
  warmbox_http *h = (warmbox_http *)luaL_checkudata(L, idx, WARMBOX_HTTP_MT);
  if (h->closed) luaL_error(L, "attempt to use a closed " WARMBOX_HTTP_MT);
  return h;
}

/* ======================================================================
 * Option checking (misuse raises, before any allocation)
 * ====================================================================== */

/* Option errors use lauxlib's words, as warmbox.errors.check_options does in
 * Lua: "bad argument #arg to 'f' (unknown option 'k')" and "(option 'k': T
 * expected, got U)". `prefix` names a nested table ("retry."), "" otherwise. */
static void warmbox_check_fields(lua_State *L, int idx, int arg, const char *prefix, const char *const *allowed) {
  idx = lua_absindex(L, idx);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    int ok = 0;
    const char *const *a;
    if (lua_type(L, -2) == LUA_TSTRING) {
      const char *k = lua_tostring(L, -2);
      for (a = allowed; *a; a++)
        if (strcmp(*a, k) == 0) ok = 1;
    }
    if (!ok) {
      lua_pop(L, 1);
      luaL_argerror(L, arg, lua_pushfstring(L, "unknown option '%s%s'", prefix, luaL_tolstring(L, -1, NULL)));
    }
    lua_pop(L, 1);
  }
}

/* Reads an optional number field; returns dflt when absent. */
static double warmbox_opt_number(lua_State *L, int idx, int arg, const char *key, double dflt, const char *prefix) {
  double v = dflt;
  lua_getfield(L, idx, key);
  if (!lua_isnil(L, -1)) {
    if (!lua_isnumber(L, -1))
      luaL_argerror(L, arg,
                    lua_pushfstring(L, "option '%s%s': number expected, got %s", prefix, key, luaL_typename(L, -1)));
    v = (double)lua_tonumber(L, -1);
    if (!(v >= 0)) luaL_argerror(L, arg, lua_pushfstring(L, "option '%s%s': a number >= 0 expected", prefix, key));
  }
  lua_pop(L, 1);
  return v;
}

/* Reads an optional string field (NULL when absent). The string stays
 * anchored in the table, which is on the stack for the whole call. */
static const char *warmbox_opt_string(lua_State *L, int idx, int arg, const char *key, size_t *len,
                                      const char *prefix) {
  const char *s = NULL;
  lua_getfield(L, idx, key);
  if (!lua_isnil(L, -1)) {
    if (lua_type(L, -1) != LUA_TSTRING)
      luaL_argerror(L, arg,
                    lua_pushfstring(L, "option '%s%s': string expected, got %s", prefix, key, luaL_typename(L, -1)));
    s = lua_tolstring(L, -1, len);
  }
  lua_pop(L, 1);
  return s;
}

/* ======================================================================
 * One transfer
 * ====================================================================== */

struct warmbox_xfer {
  warmbox_http *client;
  CURL *easy;
  int own_easy; /* batch handles are ours to clean up */
  struct curl_slist *headers;
  warmbox_buf body; /* response body (streamed 2xx bodies are not kept) */
  size_t max_body;  /* 0: no limit; else a longer body aborts the transfer */
  int too_large;    /* the body went past max_body */
  warmbox_buf head; /* header lines of the last response */
  char errbuf[CURL_ERROR_SIZE];
  char method[16];
  char *url; /* for messages: scheme://host/path, no query */
  char *secrets[WARMBOX_MAX_SECRETS];
  int nsecrets;
  /* retry policy */
  int idempotent;
  long statuses[WARMBOX_MAX_STATUSES]; /* retried statuses */
  int nstatuses;
  long refused[WARMBOX_MAX_STATUSES]; /* statuses retried even when not idempotent */
  int nrefused;
  int max_attempts;
  double budget, base, cap;
  double retry_after_max; /* retry.retry_after_max; -1: Retry-After uncapped */
  int attempts;
  double t0;
  double not_before;
  long new_connections;
  int oom;
  /* a non-idempotent body, sent through a read callback that cannot rewind */
  char *send_body;
  size_t send_len, send_pos;
  /* streaming */
  int stream_mode;
  warmbox_stream parser;
  lua_State *L;
  int cb_index; /* absolute stack index of on_chunk */
  int err_slot; /* absolute stack index where a callback error is stashed */
  int cb_state; /* 0 ok, 1 aborted (returned false), 2 raised */
  int parse_error;
  long delivered;
  int status_known;
  int streaming;         /* this response is 2xx: frames go to the callback */
  warmbox_frame_fn sink; /* engine transfers: frames go here, never to Lua */
  void *owner;           /* the sink's argument (the engine's transfer) */
  /* outcome */
  CURLcode rc;
  long status;
  int state; /* batch: 0 waiting, 1 running, 2 done */
};

typedef struct warmbox_frame_call {
  const char *data;
  size_t len;
  int flags;
} warmbox_frame_call;

/* Runs under lua_pcall: (on_chunk, frame*) -> on_chunk(frame, flags). */
static int warmbox_frame_trampoline(lua_State *L) {
  warmbox_frame_call *f = (warmbox_frame_call *)lua_touserdata(L, 2);
  lua_settop(L, 1);
  lua_pushlstring(L, f->data, f->len);
  lua_pushinteger(L, f->flags);
  lua_call(L, 2, 1);
  return 1;
}

static int warmbox_deliver(void *ud, const char *data, size_t len, int flags) {
  warmbox_xfer *x = (warmbox_xfer *)ud;
  lua_State *L = x->L;
  warmbox_frame_call f;
  int stop;
  f.data = data;
  f.len = len;
  f.flags = flags;
  /* None of these pushes allocate (the stack was reserved before perform). */
  lua_pushcfunction(L, warmbox_frame_trampoline);
  lua_pushvalue(L, x->cb_index);
  lua_pushlightuserdata(L, &f);
  if (lua_pcall(L, 2, 1, 0) != LUA_OK) {
    lua_replace(L, x->err_slot);
    x->cb_state = 2;
    return 1;
  }
  stop = lua_type(L, -1) == LUA_TBOOLEAN && !lua_toboolean(L, -1);
  lua_pop(L, 1);
  if (stop) {
    x->cb_state = 1;
    return 1;
  }
  return 0;
}

/* Every frame of a 2xx streamed body: counted (a retry would repeat it),
 * then handed to the engine's sink or to the Lua callback. */
static int warmbox_emit(void *ud, const char *data, size_t len, int flags) {
  warmbox_xfer *x = (warmbox_xfer *)ud;
  x->delivered++;
  if (x->sink) return x->sink(x->owner, data, len, flags);
  return warmbox_deliver(ud, data, len, flags);
}

static size_t warmbox_on_write(char *p, size_t size, size_t n, void *ud) {
  warmbox_xfer *x = (warmbox_xfer *)ud;
  size_t len = size * n;
  if (x->stream_mode != WARMBOX_STREAM_NONE) {
    if (!x->status_known) {
      long st = 0;
      curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &st);
      x->streaming = st >= 200 && st < 300;
      x->status_known = 1;
    }
    if (x->streaming) {
      int r = warmbox_stream_feed(&x->parser, p, len, warmbox_emit, x);
      if (r == WARMBOX_STREAM_OK) return len;
      if (r != WARMBOX_STREAM_STOPPED) x->parse_error = r;
      return 0; /* anything but len aborts the transfer */
    }
  }
  if (x->max_body && len > x->max_body - x->body.len) {
    /* Counted on the bytes that arrive, whatever the answer said its size is. */
    x->too_large = 1;
    return 0;
  }
  if (warmbox_buf_append(&x->body, p, len)) {
    x->oom = 1;
    return 0;
  }
  return len;
}

static size_t warmbox_on_header(char *p, size_t size, size_t n, void *ud) {
  warmbox_xfer *x = (warmbox_xfer *)ud;
  size_t len = size * n;
  /* A new status line starts a new response (after 1xx or a redirect). */
  if (len >= 5 && memcmp(p, "HTTP/", 5) == 0) warmbox_buf_reset(&x->head);
  if (warmbox_buf_append(&x->head, p, len)) {
    x->oom = 1;
    return 0;
  }
  return len;
}

/* Non-idempotent bodies go through here. libcurl silently re-sends a request
 * whose reused connection died before any response byte; that is fine for a
 * stale keep-alive connection but not for a POST the server may have acted
 * on. Refusing to rewind turns that case into CURLE_SEND_FAIL_REWIND. */
static size_t warmbox_on_read(char *p, size_t size, size_t n, void *ud) {
  warmbox_xfer *x = (warmbox_xfer *)ud;
  size_t want = size * n, left = x->send_len - x->send_pos;
  if (want > left) want = left;
  if (want) memcpy(p, x->send_body + x->send_pos, want);
  x->send_pos += want;
  return want;
}

static int warmbox_on_seek(void *ud, curl_off_t offset, int origin) {
  (void)ud;
  (void)offset;
  (void)origin;
  return CURL_SEEKFUNC_FAIL;
}

static int warmbox_is_secret_header(const char *name, size_t n) {
  static const char *const names[] = {"x-api-key",           "x-access-token",           "authorization",
                                      "proxy-authorization", "e2b-traffic-access-token", NULL};
  const char *const *s;
  for (s = names; *s; s++) {
    if (strlen(*s) == n) {
      size_t i;
      for (i = 0; i < n; i++)
        if (tolower((unsigned char)name[i]) != (*s)[i]) break;
      if (i == n) return 1;
    }
  }
  return 0;
}

static void warmbox_xfer_free(warmbox_xfer *x) {
  int i;
  if (x->own_easy && x->easy) curl_easy_cleanup(x->easy);
  x->easy = NULL;
  curl_slist_free_all(x->headers);
  x->headers = NULL;
  warmbox_buf_free(&x->body);
  warmbox_buf_free(&x->head);
  warmbox_stream_free(&x->parser);
  free(x->url);
  x->url = NULL;
  free(x->send_body);
  x->send_body = NULL;
  for (i = 0; i < x->nsecrets; i++) free(x->secrets[i]);
  x->nsecrets = 0;
}

/* Pass 1: validate a request table (raises on misuse; allocates nothing). */
static const char *const warmbox_req_fields[] = {"method",          "url",   "headers", "body",     "timeout",
                                                 "connect_timeout", "retry", "stream",  "on_chunk", "max_frame",
                                                 "max_body",        NULL};
static const char *const warmbox_retry_fields[] = {
  "attempts", "budget", "base", "cap", "idempotent", "statuses", "refused", "retry_after_max", NULL};

static void warmbox_check_status_list(lua_State *L, int t, int arg, const char *name) {
  lua_getfield(L, t, name);
  if (!lua_isnil(L, -1)) {
    lua_Integer i, n;
    int ok = lua_istable(L, -1);
    n = ok ? luaL_len(L, -1) : 0;
    for (i = 1; ok && i <= n; i++) {
      ok = lua_geti(L, -1, i) == LUA_TNUMBER;
      lua_pop(L, 1);
    }
    if (!ok) luaL_argerror(L, arg, lua_pushfstring(L, "option 'retry.%s': a list of status codes expected", name));
    if (n > WARMBOX_MAX_STATUSES)
      luaL_argerror(L, arg,
                    lua_pushfstring(L, "option 'retry.%s': at most %d codes expected", name, WARMBOX_MAX_STATUSES));
  }
  lua_pop(L, 1);
}

static int warmbox_read_status_list(lua_State *L, int t, const char *name, long *out) {
  int k = 0;
  lua_getfield(L, t, name);
  if (lua_istable(L, -1)) {
    lua_Integer i, cnt = luaL_len(L, -1);
    for (i = 1; i <= cnt && k < WARMBOX_MAX_STATUSES; i++) {
      lua_geti(L, -1, i);
      out[k++] = (long)lua_tointeger(L, -1);
      lua_pop(L, 1);
    }
  } else {
    k = -1;
  }
  lua_pop(L, 1);
  return k;
}

/* mode: WARMBOX_REQ_BATCH (no stream), WARMBOX_REQ_CALLBACK (a stream needs
 * on_chunk), WARMBOX_REQ_FRAMES (the engine: a stream without on_chunk). */
static void warmbox_check_request(lua_State *L, int idx, int arg, int mode) {
  const char *s;
  size_t len;
  idx = lua_absindex(L, idx);
  luaL_checktype(L, idx, LUA_TTABLE);
  warmbox_check_fields(L, idx, arg, "", warmbox_req_fields);
  s = warmbox_opt_string(L, idx, arg, "url", &len, "");
  if (!s) luaL_argerror(L, arg, "option 'url' is required");
  if (strlen(s) != len) luaL_argerror(L, arg, "option 'url' contains a zero byte");
  s = warmbox_opt_string(L, idx, arg, "method", &len, "");
  if (s && (len == 0 || len >= 16)) luaL_argerror(L, arg, "option 'method': not a valid method");
  warmbox_opt_string(L, idx, arg, "body", &len, "");
  warmbox_opt_number(L, idx, arg, "timeout", 0, "");
  warmbox_opt_number(L, idx, arg, "connect_timeout", 0, "");
  warmbox_opt_number(L, idx, arg, "max_frame", 1, "");
  warmbox_opt_number(L, idx, arg, "max_body", 0, "");
  lua_getfield(L, idx, "headers");
  if (!lua_isnil(L, -1)) {
    int t = lua_gettop(L);
    if (!lua_istable(L, t)) luaL_argerror(L, arg, "option 'headers': table expected");
    lua_pushnil(L);
    while (lua_next(L, t)) {
      if (lua_type(L, -2) != LUA_TSTRING || (lua_type(L, -1) != LUA_TSTRING && lua_type(L, -1) != LUA_TNUMBER))
        luaL_error(L, "request headers must map names to strings");
      s = lua_tolstring(L, -2, &len);
      if (len == 0 || strlen(s) != len || strpbrk(s, ":\r\n")) luaL_error(L, "invalid header name");
      if (lua_type(L, -1) == LUA_TSTRING) {
        s = lua_tolstring(L, -1, &len);
        if (strlen(s) != len || strpbrk(s, "\r\n")) luaL_error(L, "invalid header value");
      }
      lua_pop(L, 1);
    }
  }
  lua_pop(L, 1);
  lua_getfield(L, idx, "retry");
  if (lua_istable(L, -1)) {
    int t = lua_gettop(L);
    warmbox_check_fields(L, t, arg, "retry.", warmbox_retry_fields);
    warmbox_opt_number(L, t, arg, "attempts", 1, "retry.");
    warmbox_opt_number(L, t, arg, "budget", 0, "retry.");
    warmbox_opt_number(L, t, arg, "base", 0, "retry.");
    warmbox_opt_number(L, t, arg, "cap", 0, "retry.");
    warmbox_opt_number(L, t, arg, "retry_after_max", 0, "retry.");
    warmbox_check_status_list(L, t, arg, "statuses");
    warmbox_check_status_list(L, t, arg, "refused");
  } else if (!lua_isnil(L, -1) && !(lua_isboolean(L, -1) && !lua_toboolean(L, -1))) {
    luaL_argerror(L, arg, "option 'retry': table or false expected");
  }
  lua_pop(L, 1);
  s = warmbox_opt_string(L, idx, arg, "stream", &len, "");
  if (s) {
    if (mode == WARMBOX_REQ_BATCH) luaL_error(L, "streaming is not supported in a batch");
    if (strcmp(s, "lines") != 0 && strcmp(s, "connect") != 0)
      luaL_argerror(L, arg, "option 'stream': \"lines\" or \"connect\" expected");
    lua_getfield(L, idx, "on_chunk");
    if (mode == WARMBOX_REQ_FRAMES && !lua_isnil(L, -1))
      luaL_argerror(L, arg, "option 'on_chunk' is not used by the engine (read tr:frames())");
    if (mode == WARMBOX_REQ_CALLBACK && !lua_isfunction(L, -1))
      luaL_error(L, "a streamed request needs an 'on_chunk' function");
    lua_pop(L, 1);
  } else {
    lua_getfield(L, idx, "on_chunk");
    if (!lua_isnil(L, -1)) luaL_argerror(L, arg, "option 'on_chunk' needs 'stream'");
    lua_pop(L, 1);
  }
}

static char *warmbox_url_for_messages(const char *url) {
  size_t n = strcspn(url, "?#");
  char *d = malloc(n + 1);
  if (d) {
    memcpy(d, url, n);
    d[n] = '\0';
  }
  return d;
}

static long warmbox_ms(double s) {
  double ms = s * 1000.0;
  if (ms > 2e9) ms = 2e9;
  if (ms > 0 && ms < 1) ms = 1;
  return (long)ms;
}

/* The request's method, upper-cased (GET when none), and whether it is
 * idempotent by its name (GET, DELETE, HEAD; retry.idempotent may say
 * otherwise). */
static void warmbox_setup_method(lua_State *L, int idx, warmbox_xfer *x) {
  size_t n;
  const char *method = warmbox_opt_string(L, idx, 0, "method", &n, "");
  if (!method) method = "GET";
  for (n = 0; method[n] && n < sizeof x->method - 1; n++) x->method[n] = (char)toupper((unsigned char)method[n]);
  x->method[n] = '\0';
  x->idempotent = strcmp(x->method, "GET") == 0 || strcmp(x->method, "DELETE") == 0 || strcmp(x->method, "HEAD") == 0;
}

/* The retry rule's inputs (retry.c decides): the defaults (3 attempts in
 * 30 s, backoff from 0.1 s capped at 2 s, 429/502/503/504 retried), then
 * the request's retry table; retry = false is one attempt. */
static void warmbox_setup_retry(lua_State *L, int idx, warmbox_xfer *x) {
  const int arg = 0;
  x->max_attempts = 3;
  x->budget = 30;
  x->base = 0.1;
  x->cap = 2;
  x->retry_after_max = -1;
  x->statuses[0] = 429;
  x->statuses[1] = 502;
  x->statuses[2] = 503;
  x->statuses[3] = 504;
  x->nstatuses = 4;
  lua_getfield(L, idx, "retry");
  if (lua_istable(L, -1)) {
    int r = lua_gettop(L);
    x->max_attempts = (int)warmbox_opt_number(L, r, arg, "attempts", 3, "retry.");
    x->budget = warmbox_opt_number(L, r, arg, "budget", 30, "retry.");
    x->base = warmbox_opt_number(L, r, arg, "base", 0.1, "retry.");
    x->cap = warmbox_opt_number(L, r, arg, "cap", 2, "retry.");
    x->retry_after_max = warmbox_opt_number(L, r, arg, "retry_after_max", -1, "retry.");
    lua_getfield(L, r, "idempotent");
    if (!lua_isnil(L, -1)) x->idempotent = lua_toboolean(L, -1);
    lua_pop(L, 1);
    int k = warmbox_read_status_list(L, r, "statuses", x->statuses);
    if (k >= 0) x->nstatuses = k;
    k = warmbox_read_status_list(L, r, "refused", x->refused);
    if (k >= 0) x->nrefused = k;
  } else if (lua_isboolean(L, -1)) {
    x->max_attempts = 1;
  }
  lua_pop(L, 1);
  if (x->max_attempts < 1) x->max_attempts = 1;
}

/* Appends one request header "Name: value" ("Name;" for an empty value:
 * "Name:" would remove it) and keeps a copy of a secret header's value,
 * for scrubbing messages. 0, or -1 when out of memory. */
static int warmbox_add_header(warmbox_xfer *x, const char *k, size_t kl, const char *v, size_t vl) {
  char *line = malloc(kl + vl + 3);
  if (!line) return -1;
  memcpy(line, k, kl);
  if (vl == 0) {
    line[kl] = ';';
    line[kl + 1] = '\0';
  } else {
    line[kl] = ':';
    line[kl + 1] = ' ';
    memcpy(line + kl + 2, v, vl);
    line[kl + 2 + vl] = '\0';
  }
  struct curl_slist *nl = curl_slist_append(x->headers, line);
  free(line);
  if (!nl) return -1;
  x->headers = nl;
  if (warmbox_is_secret_header(k, kl) && vl > 0 && x->nsecrets < WARMBOX_MAX_SECRETS) {
    char *sec = malloc(vl + 1);
    if (!sec) return -1;
    memcpy(sec, v, vl);
    sec[vl] = '\0';
    x->secrets[x->nsecrets++] = sec;
  }
  return 0;
}

/* Headers: ours first so the caller's can override them. "Expect:" turns
 * off 100-continue, which would cost a round trip on large bodies. 0, or
 * -1 when out of memory. */
static int warmbox_setup_headers(lua_State *L, int idx, warmbox_xfer *x) {
  x->headers = curl_slist_append(NULL, "Expect:");
  if (!x->headers) return -1;
  lua_getfield(L, idx, "headers");
  if (lua_istable(L, -1)) {
    int t = lua_gettop(L);
    lua_pushnil(L);
    while (lua_next(L, t)) {
      size_t kl, vl;
      const char *k = lua_tolstring(L, -2, &kl);
      lua_pushvalue(L, -1); /* tolstring on a copy: never convert the value in place */
      const char *v = lua_tolstring(L, -1, &vl);
      if (warmbox_add_header(x, k, kl, v, vl) != 0) {
        lua_pop(L, 4);
        return -1;
      }
      lua_pop(L, 2);
    }
  }
  lua_pop(L, 1);
  return 0;
}

/* How the body is read: whole, or split into lines or Connect frames of at
 * most max_frame bytes; max_body caps a whole body (0: no cap). */
static void warmbox_setup_stream(lua_State *L, int idx, warmbox_xfer *x) {
  size_t n;
  const char *mode = warmbox_opt_string(L, idx, 0, "stream", &n, "");
  x->stream_mode = !mode                        ? WARMBOX_STREAM_NONE
                   : strcmp(mode, "lines") == 0 ? WARMBOX_STREAM_LINES
                                                : WARMBOX_STREAM_CONNECT;
  double mf = warmbox_opt_number(L, idx, 0, "max_frame", (double)WARMBOX_MAX_FRAME, "");
  if (mf > (double)WARMBOX_MAX_FRAME) mf = (double)WARMBOX_MAX_FRAME;
  if (mf < 1) mf = 1;
  warmbox_stream_init(&x->parser, x->stream_mode, (size_t)mf);
  mf = warmbox_opt_number(L, idx, 0, "max_body", 0, "");
  x->max_body = mf >= (double)SIZE_MAX ? SIZE_MAX : (size_t)mf;
}

/* The handle's options that every request has: the URL, our callbacks,
 * the client's connection settings, max_body and the timeouts (the
 * request's, else the client's). */
static void warmbox_setup_curl(lua_State *L, int idx, warmbox_http *h, warmbox_xfer *x, CURL *easy, const char *url) {
  curl_easy_setopt(easy, CURLOPT_URL, url);
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_SHARE, h->share);
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, x->headers);
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, warmbox_on_write);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, x);
  curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, warmbox_on_header);
  curl_easy_setopt(easy, CURLOPT_HEADERDATA, x);
  curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, x->errbuf);
  curl_easy_setopt(easy, CURLOPT_PRIVATE, x);
  curl_easy_setopt(easy, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(easy, CURLOPT_MAXCONNECTS, h->max_connections);
  curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
  if (h->proxy) curl_easy_setopt(easy, CURLOPT_PROXY, h->proxy);
  if (h->user_agent) curl_easy_setopt(easy, CURLOPT_USERAGENT, h->user_agent);
  if (h->ca_file) curl_easy_setopt(easy, CURLOPT_CAINFO, h->ca_file);
  /* A Content-Length past max_body is refused before any byte of the body. */
  if (x->max_body && x->stream_mode == WARMBOX_STREAM_NONE)
    curl_easy_setopt(easy, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)(x->max_body > INT64_MAX ? INT64_MAX : x->max_body));
  double t = warmbox_opt_number(L, idx, 0, "timeout", -1, "");
  curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, t >= 0 ? warmbox_ms(t) : h->timeout_ms);
  t = warmbox_opt_number(L, idx, 0, "connect_timeout", -1, "");
  curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, t >= 0 ? warmbox_ms(t) : h->connect_timeout_ms);
}

/* The method and body: GET (without a body) and HEAD send none; a body of
 * a method that is not idempotent is read from our copy by a callback that
 * refuses to rewind, so libcurl never silently re-sends it
 * (warmbox_on_read); else libcurl keeps a copy. 0, or -1 when out of
 * memory. */
static int warmbox_setup_body(warmbox_xfer *x, CURL *easy, const char *body, size_t body_len) {
  if (strcmp(x->method, "GET") == 0 && !body) {
    curl_easy_setopt(easy, CURLOPT_HTTPGET, 1L);
    return 0;
  }
  if (strcmp(x->method, "HEAD") == 0) {
    curl_easy_setopt(easy, CURLOPT_NOBODY, 1L);
    return 0;
  }
  int post = strcmp(x->method, "POST") == 0;
  if (!post) curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, x->method);
  if (!body && !post) return 0;
  if (!x->idempotent) {
    x->send_body = malloc(body_len ? body_len : 1);
    if (!x->send_body) return -1;
    if (body_len) memcpy(x->send_body, body, body_len);
    x->send_len = body_len;
    curl_easy_setopt(easy, CURLOPT_POST, 1L);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    curl_easy_setopt(easy, CURLOPT_READFUNCTION, warmbox_on_read);
    curl_easy_setopt(easy, CURLOPT_READDATA, x);
    curl_easy_setopt(easy, CURLOPT_SEEKFUNCTION, warmbox_on_seek);
    curl_easy_setopt(easy, CURLOPT_SEEKDATA, x);
    return 0;
  }
  /* The size first: COPYPOSTFIELDS copies that many bytes (binary safe),
   * so the body outlives the Lua string for every attempt. */
  curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
  return curl_easy_setopt(easy, CURLOPT_COPYPOSTFIELDS, body ? body : "") != CURLE_OK ? -1 : 0;
}

/* Pass 2: set up a transfer from a validated request table (pass 1,
 * warmbox_check_request, checked it: nothing here raises). Returns 0, or -1
 * when out of memory / libcurl refused an option (x->errbuf says why). */
static int warmbox_setup(lua_State *L, int idx, warmbox_http *h, warmbox_xfer *x, CURL *easy) {
  size_t n, body_len = 0;
  idx = lua_absindex(L, idx);
  x->client = h;
  x->easy = easy;
  const char *url = warmbox_opt_string(L, idx, 0, "url", &n, "");
  const char *body = warmbox_opt_string(L, idx, 0, "body", &body_len, "");
  warmbox_setup_method(L, idx, x);
  warmbox_setup_retry(L, idx, x);
  x->url = warmbox_url_for_messages(url);
  if (!x->url || warmbox_setup_headers(L, idx, x) != 0) return -1;
  warmbox_setup_stream(L, idx, x);
  warmbox_setup_curl(L, idx, h, x, easy, url);
  return warmbox_setup_body(x, easy, body, body_len);
}

static void warmbox_xfer_reset_attempt(warmbox_xfer *x) {
  warmbox_buf_reset(&x->body);
  warmbox_buf_reset(&x->head);
  x->parser.pending.len = 0;
  x->parser.skipping = 0;
  x->status_known = 0;
  x->streaming = 0;
  x->errbuf[0] = '\0';
  x->status = 0;
  x->oom = 0;
  x->too_large = 0;
  x->parse_error = 0;
  x->send_pos = 0;
}

/* The value of a response header in x->head (NULL if absent); *len set. */
static const char *warmbox_find_header(const warmbox_xfer *x, const char *name, size_t *len) {
  size_t nl = strlen(name), i = 0;
  const char *d = x->head.data;
  while (i < x->head.len) {
    size_t e = i;
    while (e < x->head.len && d[e] != '\n') e++;
    if (e - i > nl && d[i + nl] == ':') {
      size_t k;
      for (k = 0; k < nl; k++)
        if (tolower((unsigned char)d[i + k]) != name[k]) break;
      if (k == nl) {
        size_t s = i + nl + 1, t = e;
        while (s < t && (d[s] == ' ' || d[s] == '\t')) s++;
        while (t > s && (d[t - 1] == '\r' || d[t - 1] == ' ' || d[t - 1] == '\t')) t--;
        *len = t - s;
        return d + s;
      }
    }
    i = e + 1;
  }
  return NULL;
}

/* Retry-After in seconds (delta or HTTP date); -1 when absent or invalid. */
static double warmbox_retry_after(const warmbox_xfer *x) {
  size_t len;
  char tmp[64];
  const char *v = warmbox_find_header(x, "retry-after", &len);
  char *end;
  double d;
  if (!v || len == 0 || len >= sizeof tmp) return -1;
  memcpy(tmp, v, len);
  tmp[len] = '\0';
  d = strtod(tmp, &end);
  if (end != tmp && *end == '\0') return d >= 0 ? d : -1;
  {
    time_t when = curl_getdate(tmp, NULL);
    if (when == (time_t)-1) return -1;
    d = difftime(when, time(NULL));
    return d > 0 ? d : 0;
  }
}

static int warmbox_is_connection_error(CURLcode rc) {
  switch (rc) {
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_GOT_NOTHING:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return 1;
    default:
      return 0;
  }
}

/* Whether the failure happened before any byte of the request was sent
 * (so even a non-idempotent request is safe to send again). */
static int warmbox_failed_before_send(const warmbox_xfer *x, CURLcode rc) {
  curl_off_t up = 0;
  long connects = 0;
  if (rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_COULDNT_RESOLVE_PROXY || rc == CURLE_COULDNT_CONNECT) return 1;
  if (rc == CURLE_OPERATION_TIMEDOUT) {
    /* A connect timeout: no connection was ever made. */
    double pre = 0;
    curl_easy_getinfo(x->easy, CURLINFO_PRETRANSFER_TIME, &pre);
    curl_easy_getinfo(x->easy, CURLINFO_SIZE_UPLOAD_T, &up);
    curl_easy_getinfo(x->easy, CURLINFO_NUM_CONNECTS, &connects);
    return pre == 0 && up == 0 && connects == 0;
  }
  return 0;
}

/* After an attempt ended (x->rc, x->status set): seconds to wait before the
 * next one, or -1 for no retry (the rules: retry.c). */
static double warmbox_retry_delay(warmbox_xfer *x) {
  warmbox_retry_facts f;
  memset(&f, 0, sizeof f);
  f.attempts = x->attempts;
  f.max_attempts = x->max_attempts;
  f.idempotent = x->idempotent;
  f.delivered = x->delivered > 0;
  f.local_failure = x->cb_state || x->oom || x->parse_error || x->too_large || x->rc == CURLE_FILESIZE_EXCEEDED;
  f.completed = x->rc == CURLE_OK;
  f.status = x->status;
  f.statuses = x->statuses;
  f.nstatuses = x->nstatuses;
  f.refused = x->refused;
  f.nrefused = x->nrefused;
  f.retry_after = -1;
  f.retry_after_max = x->retry_after_max;
  if (f.completed && (x->status == 429 || x->status == 503)) f.retry_after = warmbox_retry_after(x);
  if (!f.completed) {
    f.connection_error = warmbox_is_connection_error(x->rc);
    f.before_send = warmbox_failed_before_send(x, x->rc);
    f.timed_out = x->rc == CURLE_OPERATION_TIMEDOUT;
  }
  f.base = x->base;
  f.cap = x->cap;
  f.budget = x->budget;
  f.elapsed = warmbox_clock_now() - x->t0;
  f.jitter = warmbox_random(x->client);
  return warmbox_retry_decide(&f);
}

static void warmbox_note_attempt(warmbox_xfer *x) {
  long connects = 0;
  if (curl_easy_getinfo(x->easy, CURLINFO_NUM_CONNECTS, &connects) == CURLE_OK) x->new_connections += connects;
  curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &x->status);
}

/* Finish a streamed 2xx body: flush a last line / detect a cut envelope. */
static void warmbox_finish_stream(warmbox_xfer *x) {
  int r;
  if (x->rc != CURLE_OK || x->stream_mode == WARMBOX_STREAM_NONE || !x->streaming || x->cb_state) return;
  r = warmbox_stream_finish(&x->parser, warmbox_emit, x);
  if (r < 0) x->parse_error = r;
}

/* ---- results ---- */

static void warmbox_scrub(luaL_Buffer *b, const char *msg, const warmbox_xfer *x) {
  /* Copy msg, replacing any secret header value by "***" and lower-casing
   * libcurl's capitalised sentences. */
  size_t i = 0, n = strlen(msg);
  while (i < n) {
    int j, hit = 0;
    for (j = 0; j < x->nsecrets; j++) {
      size_t sl = strlen(x->secrets[j]);
      if (sl > 0 && sl <= n - i && memcmp(msg + i, x->secrets[j], sl) == 0) {
        luaL_addstring(b, "***");
        i += sl;
        hit = 1;
        break;
      }
    }
    if (!hit) {
      luaL_addchar(b, (char)tolower((unsigned char)msg[i]));
      i++;
    }
  }
}

static int warmbox_push_error(lua_State *L, warmbox_xfer *x, const char *what, const char *code) {
  luaL_Buffer b;
  char tail[64];
  lua_pushnil(L);
  luaL_buffinit(L, &b);
  warmbox_scrub(&b, what, x);
  luaL_addstring(&b, " (");
  luaL_addstring(&b, x->method);
  luaL_addchar(&b, ' ');
  /* The URL keeps its case (paths are case-sensitive); no query string. */
  {
    luaL_Buffer *bp = &b;
    const char *u = x->url ? x->url : "";
    size_t i, n = strlen(u);
    for (i = 0; i < n;) {
      int j, hit = 0;
      for (j = 0; j < x->nsecrets; j++) {
        size_t sl = strlen(x->secrets[j]);
        if (sl <= n - i && memcmp(u + i, x->secrets[j], sl) == 0) {
          luaL_addstring(bp, "***");
          i += sl;
          hit = 1;
          break;
        }
      }
      if (!hit) luaL_addchar(bp, u[i++]);
    }
  }
  snprintf(tail, sizeof tail, ", attempt %d)", x->attempts);
  luaL_addstring(&b, tail);
  luaL_pushresult(&b);
  lua_pushstring(L, code);
  return 3;
}

static void warmbox_push_headers(lua_State *L, const warmbox_xfer *x) {
  size_t i = 0;
  const char *d = x->head.data;
  luaL_Buffer name;
  lua_newtable(L);
  while (i < x->head.len) {
    size_t e = i, c, s, t, k;
    while (e < x->head.len && d[e] != '\n') e++;
    for (c = i; c < e && d[c] != ':'; c++) {
    }
    if (c < e && c > i && !(e - i >= 5 && memcmp(d + i, "HTTP/", 5) == 0)) {
      s = c + 1;
      t = e;
      while (s < t && (d[s] == ' ' || d[s] == '\t')) s++;
      while (t > s && (d[t - 1] == '\r' || d[t - 1] == ' ' || d[t - 1] == '\t')) t--;
      luaL_buffinit(L, &name);
      for (k = i; k < c; k++) luaL_addchar(&name, (char)tolower((unsigned char)d[k]));
      luaL_pushresult(&name);
      lua_pushvalue(L, -1);
      if (lua_rawget(L, -3) == LUA_TSTRING) {
        /* Repeated header: join with ", " as RFC 9110 allows. */
        lua_pushliteral(L, ", ");
        lua_pushlstring(L, d + s, t - s);
        lua_concat(L, 3);
      } else {
        lua_pop(L, 1);
        lua_pushlstring(L, d + s, t - s);
      }
      lua_rawset(L, -3);
    }
    i = e + 1;
  }
}

/* Pushes the outcome of a finished transfer: res (1 value) or nil, msg, code. */
static int warmbox_push_outcome(lua_State *L, warmbox_xfer *x) {
  if (x->cb_state == 1) return warmbox_push_error(L, x, "aborted by the on_chunk callback", "ABORTED");
  if (x->oom) return warmbox_push_error(L, x, "out of memory", "TRANSPORT");
  if (x->too_large || x->rc == CURLE_FILESIZE_EXCEEDED)
    return warmbox_push_error(L, x, "response body larger than max_body", "TOO_LARGE");
  if (x->parse_error == WARMBOX_STREAM_TOOBIG)
    return warmbox_push_error(L, x, "stream frame larger than the limit", "TRANSPORT");
  if (x->parse_error == WARMBOX_STREAM_TRUNCATED)
    return warmbox_push_error(L, x, "stream ended inside a frame", "TRANSPORT");
  if (x->parse_error) return warmbox_push_error(L, x, "out of memory", "TRANSPORT");
  if (x->rc == CURLE_SEND_FAIL_REWIND)
    return warmbox_push_error(L, x, "the connection was lost after the request was sent", "TRANSPORT");
  if (x->rc != CURLE_OK) {
    const char *m = x->errbuf[0] ? x->errbuf : curl_easy_strerror(x->rc);
    warmbox_push_error(L, x, m, x->rc == CURLE_OPERATION_TIMEDOUT ? "TIMEOUT" : "TRANSPORT");
    /* 4th value: whether the request may have reached the server. */
    lua_pushboolean(L, !warmbox_failed_before_send(x, x->rc));
    return 4;
  }
  lua_createtable(L, 0, 5);
  lua_pushinteger(L, x->status);
  lua_setfield(L, -2, "status");
  warmbox_push_headers(L, x);
  lua_setfield(L, -2, "headers");
  lua_pushlstring(L, x->body.data ? x->body.data : "", x->body.len);
  lua_setfield(L, -2, "body");
  lua_pushinteger(L, x->attempts);
  lua_setfield(L, -2, "attempts");
  lua_pushinteger(L, x->new_connections);
  lua_setfield(L, -2, "new_connections");
  lua_pushinteger(L, x->delivered);
  lua_setfield(L, -2, "frames");
  return 1;
}

/* ======================================================================
 * h:request{}
 * ====================================================================== */

static int warmbox_http_request(lua_State *L) {
  warmbox_http *h = warmbox_check_http(L, 1);
  warmbox_xfer x;
  int nres;
  warmbox_check_request(L, 2, 2, WARMBOX_REQ_CALLBACK);
  lua_settop(L, 2);
  lua_pushnil(L);                 /* 3: a callback's error, stashed */
  lua_getfield(L, 2, "on_chunk"); /* 4: the callback */
  luaL_checkstack(L, 16, "warmbox.Http");
  memset(&x, 0, sizeof x);
  if (h->busy) {
    /* Called from a streaming callback of this client: h->easy is inside
     * curl_easy_perform, so use a handle of our own (same share, so the
     * same connection pool). */
    x.easy = curl_easy_init();
    x.own_easy = 1;
  } else {
    x.easy = h->easy;
    curl_easy_reset(h->easy);
  }
  if (!x.easy || warmbox_setup(L, 2, h, &x, x.easy) != 0) {
    x.oom = 1;
    x.attempts = 0;
    nres = warmbox_push_outcome(L, &x);
    warmbox_xfer_free(&x);
    return nres;
  }
  x.L = L;
  x.err_slot = 3;
  x.cb_index = 4;
  x.t0 = warmbox_clock_now();
  for (;;) {
    double delay;
    int was_busy = h->busy;
    warmbox_xfer_reset_attempt(&x);
    x.attempts++;
    h->busy = 1;
    x.rc = curl_easy_perform(x.easy);
    h->busy = was_busy;
    warmbox_note_attempt(&x);
    warmbox_finish_stream(&x);
    if (x.cb_state == 2) {
      /* Re-raise the callback's error, now that libcurl has returned. */
      warmbox_xfer_free(&x);
      lua_pushvalue(L, 3);
      return lua_error(L);
    }
    delay = warmbox_retry_delay(&x);
    if (delay < 0) break;
    warmbox_clock_sleep(delay);
  }
  nres = warmbox_push_outcome(L, &x);
  warmbox_xfer_free(&x);
  return nres;
}

/* ======================================================================
 * h:batch(reqs, {concurrency})
 * ====================================================================== */

static int warmbox_http_batch(lua_State *L) {
  static const char *const fields[] = {"concurrency", NULL};
  warmbox_http *h = warmbox_check_http(L, 1);
  lua_Integer n, i;
  long conc = 8, active = 0, done = 0;
  lua_Integer lo;
  warmbox_xfer *xs;
  luaL_checktype(L, 2, LUA_TTABLE);
  if (!lua_isnoneornil(L, 3)) {
    luaL_checktype(L, 3, LUA_TTABLE);
    warmbox_check_fields(L, 3, 3, "", fields);
    conc = (long)warmbox_opt_number(L, 3, 3, "concurrency", 8, "");
    if (conc < 1) conc = 1;
  }
  lua_settop(L, 2);
  n = luaL_len(L, 2);
  for (i = 1; i <= n; i++) {
    lua_geti(L, 2, i);
    warmbox_check_request(L, -1, 2, WARMBOX_REQ_BATCH);
    lua_pop(L, 1);
  }
  lua_createtable(L, (int)(n > 1000000 ? 0 : n), 0); /* 3: the results */
  if (n == 0) return 1;
  if (!h->multi) {
    h->multi = curl_multi_init();
    if (!h->multi) return luaL_error(L, "cannot create a libcurl multi handle");
  }
  xs = (warmbox_xfer *)lua_newuserdatauv(L, sizeof(warmbox_xfer) * (size_t)n, 0); /* 4: scratch */
  memset(xs, 0, sizeof(warmbox_xfer) * (size_t)n);
  for (i = 0; i < n; i++) {
    warmbox_xfer *x = &xs[i];
    CURL *e = curl_easy_init();
    x->own_easy = 1;
    lua_geti(L, 2, i + 1);
    if (!e || warmbox_setup(L, -1, h, x, e) != 0) {
      if (!x->easy) x->easy = e;
      x->oom = 1;
      x->state = 2;
      done++;
    }
    lua_pop(L, 1);
  }
  /* lo: no transfer below it is waiting (state 0), so a pass that fills the
   * free slots does not rescan the finished ones: O(n) over the batch. */
  lo = 0;
  while (done < n) {
    double now = warmbox_clock_now(), wait = 1.0;
    int running = 0, left = 0, finished = 0;
    CURLMsg *m;
    while (lo < n && xs[lo].state != 0) lo++;
    for (i = lo; i < n && active < conc; i++) {
      warmbox_xfer *x = &xs[i];
      if (x->state != 0) continue;
      if (x->not_before > now) {
        if (x->not_before - now < wait) wait = x->not_before - now;
        continue;
      }
      warmbox_xfer_reset_attempt(x);
      /* The retry budget runs from the first attempt, not from the start of
       * the batch: a transfer queued behind thousands of others keeps it. */
      if (x->attempts == 0) x->t0 = now;
      x->attempts++;
      if (curl_multi_add_handle(h->multi, x->easy) != CURLM_OK) {
        x->oom = 1;
        x->state = 2;
        done++;
        continue;
      }
      x->state = 1;
      active++;
    }
    curl_multi_perform(h->multi, &running);
    while ((m = curl_multi_info_read(h->multi, &left)) != NULL) {
      warmbox_xfer *x = NULL;
      double delay;
      if (m->msg != CURLMSG_DONE) continue;
      curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
      x->rc = m->data.result;
      curl_multi_remove_handle(h->multi, x->easy);
      active--;
      finished++;
      warmbox_note_attempt(x);
      delay = warmbox_retry_delay(x);
      if (delay >= 0) {
        x->state = 0;
        x->not_before = warmbox_clock_now() + delay;
        if (x - xs < lo) lo = x - xs;
      } else {
        x->state = 2;
        done++;
      }
    }
    /* A slot was freed: fill it at once. Polling first would wait for
     * activity on the transfers still running, or for the whole timeout
     * when none is (every transfer ended in the same perform): that wait
     * was a full second per round, the cliff of a large batch. */
    if (finished > 0) continue;
    if (done < n && (active > 0 || wait > 0)) {
      int ms = (int)(wait * 1000);
      if (active == 0 && ms == 0) ms = 1;
      curl_multi_poll(h->multi, NULL, 0, ms > 1000 ? 1000 : ms, NULL);
    }
  }
  for (i = 0; i < n; i++) {
    int k, nres;
    lua_createtable(L, 3, 1);
    nres = warmbox_push_outcome(L, &xs[i]);
    for (k = nres; k >= 1; k--) lua_seti(L, -1 - k, k);
    lua_pushinteger(L, nres);
    lua_setfield(L, -2, "n");
    lua_seti(L, 3, i + 1);
    warmbox_xfer_free(&xs[i]);
  }
  lua_settop(L, 3);
  return 1;
}

/* ======================================================================
 * Lifecycle
 * ====================================================================== */

static const char *const warmbox_http_fields[] = {"connect_timeout", "timeout", "proxy", "user_agent",
                                                  "max_connections", "ca_file", NULL};

static int warmbox_http_new(lua_State *L) {
  warmbox_http *h;
  double ct = 5, to = 60, mc = 16;
  const char *proxy = NULL, *ua = NULL, *ca = NULL;
  size_t len;
  int proxy_off = 0;
  if (!lua_isnoneornil(L, 1)) {
    luaL_checktype(L, 1, LUA_TTABLE);
    warmbox_check_fields(L, 1, 1, "", warmbox_http_fields);
    ct = warmbox_opt_number(L, 1, 1, "connect_timeout", ct, "");
    to = warmbox_opt_number(L, 1, 1, "timeout", to, "");
    mc = warmbox_opt_number(L, 1, 1, "max_connections", mc, "");
    ua = warmbox_opt_string(L, 1, 1, "user_agent", &len, "");
    ca = warmbox_opt_string(L, 1, 1, "ca_file", &len, "");
    lua_getfield(L, 1, "proxy");
    if (lua_isboolean(L, -1) && !lua_toboolean(L, -1)) {
      proxy_off = 1;
    } else if (!lua_isnil(L, -1)) {
      if (lua_type(L, -1) != LUA_TSTRING) luaL_argerror(L, 1, "option 'proxy': string or false expected");
      proxy = lua_tostring(L, -1);
    }
    lua_pop(L, 1);
  }
  lua_settop(L, 1);
  /* Created closed first, so a failure below leaves a consistent handle that
   * __gc can release. */
  h = (warmbox_http *)lua_newuserdatauv(L, sizeof *h, 0);
  memset(h, 0, sizeof *h);
  h->closed = 1;
  luaL_setmetatable(L, WARMBOX_HTTP_MT);
  h->connect_timeout_ms = warmbox_ms(ct);
  h->timeout_ms = warmbox_ms(to);
  h->max_connections = (long)(mc < 1 ? 1 : mc);
  h->rng = (uint64_t)(size_t)h ^ ((uint64_t)time(NULL) << 20) ^ (uint64_t)(warmbox_clock_now() * 1e9);
  if (h->rng == 0) h->rng = 88172645463325252ULL;
  h->share = curl_share_init();
  h->easy = curl_easy_init();
  if (proxy_off) {
    h->proxy = warmbox_strdup("");
  } else if (proxy) {
    h->proxy = warmbox_strdup(proxy);
  }
  if (ua) {
    h->user_agent = warmbox_strdup(ua);
  } else {
    h->user_agent = warmbox_strdup("warmbox/" WARMBOX_VERSION);
  }
  if (ca) h->ca_file = warmbox_strdup(ca);
  if (!h->share || !h->easy || !h->user_agent || ((proxy || proxy_off) && !h->proxy) || (ca && !h->ca_file)) {
    warmbox_http_release(h);
    lua_pushnil(L);
    lua_pushliteral(L, "cannot create a libcurl handle");
    lua_pushliteral(L, "TRANSPORT");
    return 3;
  }
  curl_share_setopt(h->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
  curl_share_setopt(h->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
  h->closed = 0;
  return 1;
}

static int warmbox_http_close(lua_State *L) {
  warmbox_http *h = (warmbox_http *)luaL_checkudata(L, 1, WARMBOX_HTTP_MT);
  if (h->busy) return luaL_error(L, "cannot close a " WARMBOX_HTTP_MT " from inside its own transfer");
  if (!h->closed) warmbox_http_release(h);
  return 0;
}

static int warmbox_http_tostring(lua_State *L) {
  warmbox_http *h = (warmbox_http *)luaL_checkudata(L, 1, WARMBOX_HTTP_MT);
  if (h->closed) {
    lua_pushliteral(L, WARMBOX_HTTP_MT " (closed)");
  } else {
    lua_pushfstring(L, WARMBOX_HTTP_MT ": %p", (void *)h);
  }
  return 1;
}

/* ======================================================================
 * Test hook: the stream splitter on a fake byte stream
 * ====================================================================== */

typedef struct warmbox_collect {
  lua_State *L;
  lua_Integer n;
} warmbox_collect;

static int warmbox_collect_frame(void *ud, const char *data, size_t len, int flags) {
  /* Not under libcurl: raising here (out of memory) is acceptable. */
  warmbox_collect *c = (warmbox_collect *)ud;
  lua_createtable(c->L, 2, 0);
  lua_pushlstring(c->L, data, len);
  lua_rawseti(c->L, -2, 1);
  lua_pushinteger(c->L, flags);
  lua_rawseti(c->L, -2, 2);
  lua_rawseti(c->L, -2, ++c->n);
  return 0;
}

/* core._split(mode, { chunk, ... }) -> { {frame, flags}, ... }, status */
static int warmbox_split(lua_State *L) {
  static const char *const modes[] = {"lines", "connect", NULL};
  int mode = luaL_checkoption(L, 1, NULL, modes) == 0 ? WARMBOX_STREAM_LINES : WARMBOX_STREAM_CONNECT;
  lua_Integer i, n;
  warmbox_stream s;
  warmbox_collect c;
  int r = WARMBOX_STREAM_OK;
  lua_Integer max = luaL_optinteger(L, 3, (lua_Integer)WARMBOX_MAX_FRAME);
  luaL_checktype(L, 2, LUA_TTABLE);
  n = luaL_len(L, 2);
  for (i = 1; i <= n; i++) {
    lua_geti(L, 2, i);
    luaL_argcheck(L, lua_type(L, -1) == LUA_TSTRING, 2, "chunks must be strings");
    lua_pop(L, 1);
  }
  lua_settop(L, 2);
  lua_newtable(L);
  c.L = L;
  c.n = 0;
  warmbox_stream_init(&s, mode, (size_t)(max > 0 ? max : 1));
  for (i = 1; i <= n && r == WARMBOX_STREAM_OK; i++) {
    size_t len;
    const char *p;
    lua_geti(L, 2, i);
    p = lua_tolstring(L, -1, &len);
    lua_pop(L, 1); /* still anchored in the table */
    r = warmbox_stream_feed(&s, p, len, warmbox_collect_frame, &c);
  }
  if (r == WARMBOX_STREAM_OK) r = warmbox_stream_finish(&s, warmbox_collect_frame, &c);
  warmbox_stream_free(&s);
  lua_pushstring(L, r == WARMBOX_STREAM_OK          ? "ok"
                    : r == WARMBOX_STREAM_TRUNCATED ? "truncated"
                    : r == WARMBOX_STREAM_TOOBIG    ? "too_big"
                                                    : "error");
  return 2;
}

/* ======================================================================
 * For the engine (warmbox_http.h)
 * ====================================================================== */

warmbox_http *warmbox_http_check(lua_State *L, int idx) {
  return warmbox_check_http(L, idx);
}

void warmbox_http_check_request(lua_State *L, int idx, int mode) {
  warmbox_check_request(L, idx, idx, mode);
}

warmbox_xfer *warmbox_xfer_new(warmbox_http *h) {
  warmbox_xfer *x = (warmbox_xfer *)calloc(1, sizeof *x);
  if (!x) return NULL;
  x->own_easy = 1;
  x->easy = curl_easy_init();
  x->client = h;
  h->share_users++;
  return x;
}

int warmbox_xfer_setup(lua_State *L, int idx, warmbox_xfer *x, warmbox_frame_fn sink, void *owner) {
  int failed = !x->easy || warmbox_setup(L, idx, x->client, x, x->easy) != 0;
  if (failed) x->oom = 1;
  x->sink = sink;
  x->owner = owner;
  x->t0 = warmbox_clock_now();
  return failed;
}

CURL *warmbox_xfer_easy(warmbox_xfer *x) {
  return x->easy;
}

void warmbox_xfer_begin(warmbox_xfer *x) {
  warmbox_xfer_reset_attempt(x);
  x->attempts++;
}

void warmbox_xfer_end(warmbox_xfer *x, CURLcode rc) {
  x->rc = rc;
  warmbox_note_attempt(x);
  warmbox_finish_stream(x);
}

double warmbox_xfer_retry_delay(warmbox_xfer *x) {
  return warmbox_retry_delay(x);
}

size_t warmbox_xfer_write(char *p, size_t size, size_t n, void *x) {
  return warmbox_on_write(p, size, n, x);
}

int warmbox_xfer_streaming(const warmbox_xfer *x) {
  return x->stream_mode != WARMBOX_STREAM_NONE && x->status_known && x->streaming;
}

int warmbox_xfer_push_outcome(lua_State *L, warmbox_xfer *x) {
  return warmbox_push_outcome(L, x);
}

int warmbox_xfer_push_error(lua_State *L, warmbox_xfer *x, const char *what, const char *code) {
  return warmbox_push_error(L, x, what, code);
}

void warmbox_xfer_destroy(warmbox_xfer *x) {
  warmbox_http *h = x->client;
  warmbox_xfer_free(x); /* the easy handle first: it holds the share */
  free(x);
  if (h && --h->share_users == 0 && h->closed && h->share) {
    curl_share_cleanup(h->share);
    h->share = NULL;
  }
}

/* ======================================================================
 * Registration
 * ====================================================================== */

static const luaL_Reg warmbox_http_methods[] = {
  {"request", warmbox_http_request}, {"batch", warmbox_http_batch}, {"close", warmbox_http_close}, {NULL, NULL}};

static const luaL_Reg warmbox_http_meta[] = {
  {"__gc", warmbox_http_close}, {"__close", warmbox_http_close}, {"__tostring", warmbox_http_tostring}, {NULL, NULL}};

void warmbox_http_register(lua_State *L) {
  /* Reference-counted by libcurl, so every Lua state loading us may call it.
   * (With CURL_VERSION_THREADSAFE it is also safe across threads.) */
  curl_global_init(CURL_GLOBAL_DEFAULT);
  if (luaL_newmetatable(L, WARMBOX_HTTP_MT)) {
    luaL_setfuncs(L, warmbox_http_meta, 0);
    luaL_newlib(L, warmbox_http_methods);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  lua_pushcfunction(L, warmbox_http_new);
  lua_setfield(L, -2, "http");
  lua_pushcfunction(L, warmbox_split);
  lua_setfield(L, -2, "_split");
}
