/* warmbox.core: the module table. Each part registers its own functions
 * (the table `parts` below lists them all): http.c the libcurl transport,
 * engine.c its event engine, retry.c the retry rules, lock.c/redis.c the
 * lock primitives. This file holds the small OS and
 * crypto helpers and the python programs compiled in. Every other symbol is hidden (CMake's visibility preset):
 * luaopen_warmbox_core is the module's only export. */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include "warmbox_core.h"
#include "warmbox_clock.h"

__attribute__((visibility("default"))) int luaopen_warmbox_core(lua_State *L);

/* ---- module_path: where core.so was loaded from (warmboxd sits beside it) ---- */

static int warmbox_module_path(lua_State *L) {
  Dl_info info;
  char resolved[PATH_MAX];
  /* Any address inside this shared object will do; a function's is stable. */
  if (!dladdr((void *)(size_t)&warmbox_module_path, &info) || !info.dli_fname) {
    lua_pushnil(L);
    lua_pushliteral(L, "cannot find the path of warmbox.core");
    return 2;
  }
  if (realpath(info.dli_fname, resolved)) {
    lua_pushstring(L, resolved);
  } else {
    lua_pushstring(L, info.dli_fname);
  }
  return 1;
}

/* ---- digests (libcrypto) ---- */

static void warmbox_push_hex(lua_State *L, const unsigned char *md, unsigned int n) {
  static const char digits[] = "0123456789abcdef";
  char hex[2 * EVP_MAX_MD_SIZE];
  unsigned int i;
  for (i = 0; i < n; i++) {
    hex[2 * i] = digits[md[i] >> 4];
    hex[2 * i + 1] = digits[md[i] & 15];
  }
  lua_pushlstring(L, hex, 2 * (size_t)n);
}

static int warmbox_sha256(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  if (!EVP_Digest(s, n, md, &mdlen, EVP_sha256(), NULL)) return luaL_error(L, "sha256 failed");
  warmbox_push_hex(L, md, mdlen);
  return 1;
}

static int warmbox_hmac_sha256(lua_State *L) {
  size_t klen, n;
  const char *k = luaL_checklstring(L, 1, &klen);
  const char *s = luaL_checklstring(L, 2, &n);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  if (klen > INT_MAX) return luaL_argerror(L, 1, "key too long");
  if (!HMAC(EVP_sha256(), k, (int)klen, (const unsigned char *)s, n, md, &mdlen))
    return luaL_error(L, "hmac_sha256 failed");
  warmbox_push_hex(L, md, mdlen);
  return 1;
}

/* ---- time ---- */

static int warmbox_now(lua_State *L) {
  lua_pushnumber(L, (lua_Number)warmbox_clock_now());
  return 1;
}

static int warmbox_sleep(lua_State *L) {
  warmbox_clock_sleep((double)luaL_checknumber(L, 1));
  return 0;
}

/* ---- embedded: the python programs the build compiled in (cmake/embed.cmake) ---- */

const unsigned char *warmbox_embedded(const char *name, size_t *len);

/* core.embedded(name): the bytes of python/<name> as built, or nil. */
static int warmbox_embedded_file(lua_State *L) {
  size_t len = 0;
  const unsigned char *data = warmbox_embedded(luaL_checkstring(L, 1), &len);
  if (data)
    lua_pushlstring(L, (const char *)data, len);
  else
    lua_pushnil(L);
  return 1;
}

static const luaL_Reg warmbox_core_funcs[] = {{"embedded", warmbox_embedded_file},
                                              {"module_path", warmbox_module_path},
                                              {"sha256", warmbox_sha256},
                                              {"hmac_sha256", warmbox_hmac_sha256},
                                              {"now", warmbox_now},
                                              {"sleep", warmbox_sleep},
                                              {NULL, NULL}};

/* The parts, each adding its functions and metatables to the module table
 * on the top of the stack (luasocket's mod[]). */
static void (*const parts[])(lua_State *L) = {
  warmbox_http_register, warmbox_lock_register, warmbox_redis_register, warmbox_engine_register, warmbox_retry_register,
};

int luaopen_warmbox_core(lua_State *L) {
  lua_newtable(L);
  lua_pushliteral(L, WARMBOX_VERSION);
  lua_setfield(L, -2, "_VERSION");
  luaL_setfuncs(L, warmbox_core_funcs, 0);
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) parts[i](L);
  return 1;
}
