-- Benchmark of warmboxd's sandbox state on disk: what copying a sandbox's
-- files costs a pause (kept for a restart), a snapshot, a fork and a create
-- from a snapshot, with 0, 10 and 100 MB written in its home.
-- Usage (from the repository root, after scripts/setup):
--   lua5.4 bench/warmboxd_state.lua [rounds=5]
-- WARMBOXD_BIN selects the server (e.g. an older build, for the pause before/after).
local env = dofile(((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/env.lua")

local core = require "warmbox.core"
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local cell = require "spec.helpers.cell"

local ROUNDS = tonumber(arg[1]) or 5
local srv = wbd.start{ bin = env.warmboxd }

local function timed(fn)
  local t = core.now()
  local res = fn()
  return (core.now() - t) * 1000, res
end

local function median(v)
  table.sort(v)
  return v[(#v + 1) // 2]
end

local function api(method, path, body, want)
  local res = http.api(srv, method, path, body)
  assert(res.status == want, method .. " " .. path .. ": " .. tostring(res.status) .. " " .. tostring(res.body))
  return res.json
end

local function round(mb)
  local sb = api("POST", "/sandboxes", { templateID = "base", timeout = 3600, secure = true }, 201)
  cell(srv, sb, string.format("head -c %dM /dev/urandom > /home/user/blob; true", mb))
  local p = "/sandboxes/" .. sb.sandboxID
  local t = {}
  t.pause = timed(function() return api("POST", p .. "/pause", {}, 204) end)
  t.resume = timed(function() return api("POST", p .. "/connect", { timeout = 3600 }, 201) end)
  local snap, child, forks
  -- an older warmboxd has no snapshots or fork: its pause and resume are still measured
  pcall(function()
    t.snapshot, snap = timed(function() return api("POST", p .. "/snapshots", {}, 201) end)
    t.from_snapshot, child = timed(function()
      return api("POST", "/sandboxes", { templateID = snap.snapshotID, timeout = 60 }, 201)
    end)
    t.fork, forks = timed(function() return api("POST", p .. "/fork", { count = 1 }, 201) end)
  end)
  for _, id in ipairs{ sb.sandboxID, child and child.sandboxID, forks and forks[1].sandbox.sandboxID } do
    http.api(srv, "DELETE", "/sandboxes/" .. id)
  end
  if snap then http.api(srv, "DELETE", "/templates/" .. snap.snapshotID) end
  return t
end

local keys = { "pause", "resume", "snapshot", "from_snapshot", "fork" }
print(string.format("%-8s %s (median of %d, ms)", "home", table.concat(keys, "  "), ROUNDS))
for _, mb in ipairs{ 0, 10, 100 } do
  local all = {}
  for _ = 1, ROUNDS do
    local ok, t = pcall(round, mb)
    if not ok then
      io.stderr:write(tostring(t), "\n")
      break
    end
    for _, k in ipairs(keys) do
      if t[k] then
        all[k] = all[k] or {}
        all[k][#all[k] + 1] = t[k]
      end
    end
  end
  local row = {}
  for _, k in ipairs(keys) do row[#row + 1] = all[k] and string.format("%.1f", median(all[k])) or "-" end
  print(string.format("%-8s %s", mb .. " MB", table.concat(row, "  ")))
end
srv:stop()
