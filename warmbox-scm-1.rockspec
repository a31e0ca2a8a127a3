-- warmbox: one warm E2B sandbox per conversation.
-- On Debian with Lua from apt (lua5.4 liblua5.4-dev lua-cjson libcurl4-openssl-dev
-- libssl-dev libhiredis-dev libmicrohttpd-dev libjansson-dev cmake):
--   luarocks --lua-version=5.4 make --deps-mode=none
-- (--deps-mode=none because apt's lua-cjson is not registered in a rocks tree.)
local package_name = "warmbox"
local package_version = "scm"
local rockspec_revision = "1"
local github_account_name = "warmbox"
local github_repo_name = "warmbox"

rockspec_format = "3.0"
package = package_name
version = package_version .. "-" .. rockspec_revision

source = {
  url = "git+https://github.com/" .. github_account_name .. "/" .. github_repo_name .. ".git",
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

-- A library check, not `header = "curl/curl.h"`: Debian keeps curl.h in the
-- multiarch directory /usr/include/x86_64-linux-gnu, which LuaRocks 3.8 does not
-- search for headers (it does for libraries). CMake finds the headers itself.
external_dependencies = {
  CURL = { library = "curl" },
}

test_dependencies = {
  "busted",
}

test = {
  type = "busted",
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
}
