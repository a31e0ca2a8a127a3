-- The race against warmboxd's copies of a sandbox's files, many times: envd
-- Filesystem/Move calls swap a directory a snapshot (or a fork) is copying
-- for a symlink to a host directory (spec.helpers.copy_race says how), and
-- every snapshot and fork made meanwhile is searched for the host's secret.
-- Prints, for snapshots and forks: attempts, copies made, copies that failed,
-- Moves answered 200 / 409, the files from outside the sandbox found in a
-- copy (0 is the promise), an attempt's median and longest time (the call,
-- the swap and the search), then each reason copies failed for (status and
-- message; 0: the call timed out).
-- Usage (from the repository root, after scripts/setup):
--   lua5.4 bench/warmboxd_copy_race.lua [attempts=200] [large file MB=96] [kinds=snapshot,fork] [call timeout s=300]
-- WARMBOXD_BIN selects the server (e.g. an older build: the leak before the fix).
-- A call that times out on the client is not a failed copy: warmboxd makes
-- the copy anyway, and the next calls meet it (409 while it is being taken,
-- then 429 once the orphaned copies fill the team's --max-state-mb). On a
-- loaded host (load 50 and more) a 288 MB copy can take over the 30 s of
-- spec.helpers.http's default, hence the long default here.
local env = dofile(((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/env.lua")

local core = require "warmbox.core"
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local race = require "spec.helpers.copy_race"

local ATTEMPTS = tonumber(arg[1]) or 200
local BIG_MB = tonumber(arg[2]) or 96
local KINDS = {}
for k in (arg[3] or "snapshot,fork"):gmatch("[^,]+") do KINDS[#KINDS + 1] = k end
local CALL_TIMEOUT = tonumber(arg[4]) or 300
local srv = wbd.start{ bin = env.warmboxd }

-- One copy raced: whether it was made, the files of the host found in it,
-- and the statuses of the swap's Moves.
local function attempt(r, sb, kind)
  local p = "/sandboxes/" .. sb.sandboxID
  local res, moves = r:attempt("POST", p .. (kind == "fork" and "/fork" or "/snapshots"),
    kind == "fork" and { count = 1, timeout = 60 } or {}, CALL_TIMEOUT)
  local json = res.json
  local leaks = {}
  if res.status == 201 and kind == "snapshot" then
    leaks = r:leaks(srv.dir .. "/data/.state/snapshots")
    http.api(srv, "DELETE", "/templates/" .. json.snapshotID:match("^([^:]+)"))
  elseif res.status == 201 and json[1].sandbox then
    leaks = r:leaks_in(json[1].sandbox)
    http.api(srv, "DELETE", "/sandboxes/" .. json[1].sandbox.sandboxID)
  end
  local ok = res.status == 201 and (kind ~= "fork" or json[1].sandbox ~= nil)
  local why
  if not ok then
    local e = res.status == 201 and json[1].error or json or {}
    why = tostring(e.code or res.status) .. " " .. tostring(e.message or res.body or "")
  end
  return ok, #leaks, moves, why
end

print(string.format("%-9s %8s %6s %6s %8s %8s %7s %7s %7s", "copy", "attempts", "made", "failed", "move200",
  "move409", "leaked", "p50 s", "max s"))
for _, kind in ipairs(KINDS) do
  local sb = http.create(srv, { templateID = "base", timeout = 3600, secure = true })
  local r = race.new(srv, sb, BIG_MB)
  local made, failed, leaked, counts, whys, times = 0, 0, 0, {}, {}, {}
  for _ = 1, ATTEMPTS do
    local t0 = core.now()
    local ok, n, moves, why = attempt(r, sb, kind)
    times[#times + 1] = core.now() - t0
    if ok then made = made + 1 else failed = failed + 1 end
    if why then whys[why] = (whys[why] or 0) + 1 end
    leaked = leaked + n
    for _, c in ipairs(moves) do counts[c] = (counts[c] or 0) + 1 end
  end
  r:cleanup()
  http.api(srv, "DELETE", "/sandboxes/" .. sb.sandboxID)
  table.sort(times)
  print(string.format("%-9s %8d %6d %6d %8d %8d %7d %7.1f %7.1f", kind, ATTEMPTS, made, failed, counts["200"] or 0,
    counts["409"] or 0, leaked, times[(#times + 1) // 2], times[#times]))
  for why, n in pairs(whys) do print(string.format("  %-7s failed %4d: %s", kind, n, why)) end
end
srv:stop()
