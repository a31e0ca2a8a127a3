-- warmbox: one warm E2B sandbox per conversation.
-- On Debian with Lua from apt (lua5.4 liblua5.4-dev lua-cjson libcurl4-openssl-dev
-- libssl-dev libhiredis-dev libmicrohttpd-dev libjansson-dev cmake):
--   luarocks --lua-version=5.4 make --deps-mode=none warmbox-0.1.0-1.rockspec
-- (--deps-mode=none because apt's lua-cjson is not registered in a rocks tree.)
local package_name = "warmbox"
local package_version = "0.1.0"
local rockspec_revision = "1"
local github_account_name = "warmbox"
local github_repo_name = "warmbox"

rockspec_format = "3.0"
package = package_name
version = package_version .. "-" .. rockspec_revision

source = {
  url = "git+https://github.com/" .. github_account_name .. "/" .. github_repo_name .. ".git",
  tag = "v" .. package_version,
}

description = {
  summary = "One warm E2B sandbox per conversation, with a local E2B-compatible server",
  detailed = [[
warmbox gives a Lua program one warm E2B sandbox per conversation: it finds the
conversation's sandbox, resumes it when paused, runs the code and leaves it
warm, and garbage-collects paused sandboxes under a Lua policy. warmbox.core is
a libcurl transport in C; warmboxd is a local E2B-compatible server.
]],
  homepage = "https://github.com/" .. github_account_name .. "/" .. github_repo_name,
  license = "MIT",
  labels = { "e2b", "sandbox", "curl" },
}

dependencies = {
  "lua >= 5.4, < 5.5",
  "lua-cjson",
}

-- The C libraries warmbox.core (curl, libcrypto) and warmboxd (libmicrohttpd,
-- jansson, zlib) link. curl and libcrypto by library, not header: Debian keeps
-- curl.h and opensslconf.h in the multiarch directory /usr/include/x86_64-linux-gnu,
-- which LuaRocks 3.8 does not search for headers (it does for libraries). CMake
-- finds the headers itself. hiredis is optional (not declared): CMake builds the
-- Redis lock when it finds it, and without it `lock = "redis"` says it is not built.
external_dependencies = {
  CURL = { library = "curl" },
  CRYPTO = { library = "crypto" },
  MICROHTTPD = { header = "microhttpd.h", library = "microhttpd" },
  JANSSON = { header = "jansson.h", library = "jansson" },
  ZLIB = { header = "zlib.h", library = "z" },
}

-- `luarocks test` runs the suite (scripts/test) on the build `luarocks make`
-- left in build.luarocks/, building one first when there is none. It needs
-- busted on PATH (Debian: lua-busted; or `luarocks install busted`), so no
-- test_dependencies: apt's busted is not in a rocks tree, and LuaRocks would
-- try to download one.
test = {
  type = "command",
  command = "scripts/luarocks-test",
}

build = {
  type = "cmake",
  variables = {
    CMAKE_C_FLAGS = "$(CFLAGS)",
    CMAKE_MODULE_LINKER_FLAGS = "$(LIBFLAG)",
    CMAKE_BUILD_TYPE = "Release",
    WARMBOX_WERROR = "OFF",
    LUA_INCDIR = "$(LUA_INCDIR)",
    LUADIR = "$(LUADIR)",
    LIBDIR = "$(LIBDIR)",
    CURL_INCDIR = "$(CURL_INCDIR)",
    CURL_LIBDIR = "$(CURL_LIBDIR)",
  },
  -- core.so and warmboxd (beside it, where warmbox.server looks) are installed
  -- by CMake; the command by LuaRocks, wrapped to find the tree's modules.
  install = {
    bin = { warmbox = "bin/warmbox" },
  },
}
