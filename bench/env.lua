-- What every Lua benchmark starts with, run as
--   local env = dofile(((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/env.lua")
-- It puts the checkout's lua/ (and its root, for spec.helpers) on package.path
-- and the build (WARMBOX_BUILD_DIR, default build/) on package.cpath, and
-- returns `{ root, build, warmboxd, status_kb, print_table }` (absolute or relative to the current
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

-- Prints a Markdown table: the `head` row, a rule, then `rows` (lists of
-- cells, any values), each column as wide as its widest cell.
local function print_table(head, rows)
  local w = {}
  for i, h in ipairs(head) do w[i] = #tostring(h) end
  for _, l in ipairs(rows) do for i, c in ipairs(l) do w[i] = math.max(w[i] or 0, #tostring(c)) end end
  local function fmt(l)
    local out = {}
    for i, c in ipairs(l) do out[i] = tostring(c) .. string.rep(" ", w[i] - #tostring(c)) end
    return "| " .. table.concat(out, " | ") .. " |"
  end
  local sep = {}
  for i = 1, #head do sep[i] = string.rep("-", w[i]) end
  print(fmt(head))
  print(fmt(sep))
  for _, l in ipairs(rows) do print(fmt(l)) end
end

return { root = root, build = build, warmboxd = warmboxd, status_kb = status_kb, print_table = print_table }
