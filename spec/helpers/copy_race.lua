--- The race against a snapshot's or fork's copy, for specs and benches: a
-- sandbox whose /home/user/d holds large files (a copy spends a while in d)
-- and small ones, and whose /tmp/lnk is a symlink to a host directory of
-- files with the same names holding a secret (in /tmp: a tree copied after
-- home, so a copy that listed home before the swap finds all it listed). An
-- attempt starts the copy and, once the copy has reached d, two envd
-- Filesystem/Move calls swap d for lnk (then back once the copy is done). A
-- copy that walks d by path follows the symlink once it is swapped in and
-- puts the host's files (the secret) in the snapshot.
--
--   local race = require "spec.helpers.copy_race"
--   local r = race.new(srv, sb [, big_mb])   -- sb: a created (secure) sandbox
--   local res, moves = r:attempt("POST", "/sandboxes/ID/snapshots", {} [, timeout_s])
--   r:leaks(dir) -> paths of files under dir holding the secret
--   r:leaks_in(sb) -> the same, seen from inside a sandbox (a fork)
--   r:cleanup()
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local cell = require "spec.helpers.cell"

local q = wbd.sh_quote
local M = {}
M.__index = M

local FILES, BIGS, BIG_MB = 10, 3, 96

function M.new(srv, sb, big_mb)
  local self = setmetatable({ srv = srv, sb = sb }, M)
  self.host = os.tmpname()
  os.remove(self.host)
  assert(os.execute("mkdir -p " .. q(self.host)))
  self.secret = "HOSTSECRET" .. tostring(math.random(1e9))
  assert(os.execute("cd " .. q(self.host) .. " && for i in $(seq 0 " .. (FILES - 1) .. "); do echo "
    .. self.secret .. " > f$i; done; for i in $(seq 0 " .. (BIGS - 1) .. "); do echo " .. self.secret
    .. " > big$i; done"))
  -- a tmpfs lists the newest entry first: the large files are made last
  local _, err = cell(srv, sb, "mkdir -p /home/user/d && cd /home/user/d && for i in $(seq 0 " .. (FILES - 1)
    .. "); do echo inside > f$i; done; for i in $(seq 0 " .. (BIGS - 1) .. "); do head -c " .. (big_mb or BIG_MB)
    .. "M /dev/zero > big$i; done; ln -sfn " .. q(self.host) .. " /tmp/lnk")
  assert(err == nil, err)
  return self
end

-- The curl command of Moves (pairs of paths), one process, one connection,
-- each status a line of its output.
function M:moves_cmd(list)
  local sb, url = self.sb, self.srv.url .. "/filesystem.Filesystem/Move"
  local parts = { "env -u LD_PRELOAD curl -s" }
  for i, m in ipairs(list) do
    if i > 1 then parts[#parts + 1] = "--next" end
    parts[#parts + 1] = "-o /dev/null -w '%{http_code}\\n' -X POST"
      .. " -H " .. q("E2b-Sandbox-Id: " .. sb.sandboxID) .. " -H 'E2b-Sandbox-Port: 49983'"
      .. " -H " .. q("X-Access-Token: " .. (sb.envdAccessToken or ""))
      .. " -H 'Content-Type: application/json'"
      .. " --data " .. q('{"source":"' .. m[1] .. '","destination":"' .. m[2] .. '"}')
      .. " " .. q(url)
  end
  return table.concat(parts, " ")
end

local SWAP = { { "/home/user/d", "/tmp/d2" }, { "/tmp/lnk", "/home/user/d" } }
local BACK = { { "/home/user/d", "/tmp/lnk" }, { "/tmp/d2", "/home/user/d" } }

--- One attempt: a watcher in the background waits until the copy (under
-- the data directory's .state) has reached d, then swaps d for
-- lnk; the call (a copy) is made meanwhile; once it is answered the swap is
-- undone. The watcher only times the race (a tenant would retry instead).
-- Returns the call's answer and the statuses of the swap's two Moves
-- (timeout: the call's, in seconds; spec.helpers.http's default otherwise).
function M:attempt(method, path, json, timeout)
  local out = os.tmpname()
  local glob = q(self.srv.dir .. "/data/.state") .. "/*/*/files/home/d"
  local watcher = "for i in $(seq 1 3000); do ls " .. glob .. " >/dev/null 2>&1 && break; sleep 0.002; done; "
    .. self:moves_cmd(SWAP) .. " > " .. q(out .. ".part") .. "; mv " .. q(out .. ".part") .. " " .. q(out)
  os.remove(out)
  assert(os.execute("( " .. watcher .. " ) >/dev/null 2>&1 &"))
  local res = http.api(self.srv, method, path, json, { timeout = timeout })
  local moves = wbd.eventually(function() return wbd.read_all(out) end, 30) or ""
  os.remove(out)
  local p = assert(io.popen(self:moves_cmd(BACK)))   -- back as it was, whatever the swap did
  p:read("a")
  p:close()
  local statuses = {}
  for l in moves:gmatch("[^\n]+") do statuses[#statuses + 1] = l end
  return res, statuses
end

--- Files under `dir` (on the host, no symlink followed) that hold the host's
-- secret: a list of paths.
function M:leaks(dir)
  local p = assert(io.popen("grep -rl " .. q(self.secret) .. " " .. q(dir) .. " 2>/dev/null"))
  local out = {}
  for l in p:lines() do out[#out + 1] = l end
  p:close()
  return out
end

--- Files a sandbox (a fork, or one made from a snapshot) sees under its home
-- and /tmp that hold the host's secret, searched from inside it: a list of
-- paths.
function M:leaks_in(sb)
  -- a pattern that matches the secret but not itself (the cell's own script is in /tmp)
  local pattern = self.secret:sub(1, -2) .. "[" .. self.secret:sub(-1) .. "]"
  local out = cell(self.srv, sb, "grep -rl " .. q(pattern) .. " /home/user /tmp 2>/dev/null; true")
  local paths = {}
  for l in out:gmatch("[^\n]+") do paths[#paths + 1] = l end
  return paths
end

function M:cleanup() os.execute("rm -rf " .. q(self.host)) end

return M
