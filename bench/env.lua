-- What every Lua benchmark starts with, run as
--   local env = dofile(((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/env.lua")
-- It puts the checkout's lua/ (and its root, for spec.helpers) on package.path
-- and the build (WARMBOX_BUILD_DIR, default build/) on package.cpath, and
-- returns `{ root, build, warmboxd, status_kb }` (absolute or relative to the current
-- directory; `warmboxd` is $WARMBOXD_BIN, else the build's binary when it
-- exists, else nil: warmbox.server's own default).
local here = (debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$")) or "."
local root = here .. "/.."
local build = os.getenv("WARMBOX_BUILD_DIR") or "build"
if build:sub(1, 1) ~= "/" then build = root .. "/" .. build end
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. root .. "/?.lua;" .. package.path
package.cpath = build .. "/?.so;" .. build .. "/?/?.so;" .. package.cpath

local warmboxd = os.getenv("WARMBOXD_BIN")
if not warmboxd then
  local f = io.open(build .. "/warmboxd")
  if f then
    f:close()
    warmboxd = build .. "/warmboxd"
  end
end

-- A field of /proc/self/status in KB ("VmRSS", "VmHWM"), 0 when unknown.
local function status_kb(field)
  local f = io.open("/proc/self/status")
  if not f then return 0 end
  local s = f:read("a")
  f:close()
  return tonumber(s:match(field .. ":%s*(%d+)")) or 0
end

return { root = root, build = build, warmboxd = warmboxd, status_kb = status_kb }
