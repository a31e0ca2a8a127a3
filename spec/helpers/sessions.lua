-- Shared set-up for the session integration specs: one warmboxd, a lock
-- directory, warmbox objects wired to both, warmboxd's knobs, and the check
-- that no run ever overlapped another or had its sandbox paused or killed
-- underneath it.
--
--   local env = require("spec.helpers.sessions").new()
--   local srv, wb
--   lazy_setup(function() srv = env:start(); wb = env:warmbox{ exec_timeout = 60 } end)
--   lazy_teardown(function() env:stop() end)   -- closes every warmbox, asserts the counters
local luassert = require "luassert"
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"

local M = {}

--- Unix seconds of an RFC 3339 UTC time (spec.helpers.warmboxd's parser).
M.utc = wbd.utc

--- Runs `script` (Lua source) in a `lua5.4` of its own, in the background
-- (a holder or a later run of another host). → its pid
function M.spawn_lua(script)
  local p = io.popen("lua5.4 -e " .. wbd.sh_quote(script) .. " >/dev/null 2>&1 & echo $!")
  local pid = tonumber(p:read("l"))
  p:close()
  return pid
end

--- The line such a process wrote to file `out` (waits up to 60 s for it),
-- the file then removed. → the line's text, or nil
function M.result_line(out)
  local s
  wbd.eventually(function()
    local f = io.open(out)
    s = f and f:read("a")
    if f then f:close() end
    return s and s:find("\n")
  end, 60)
  os.remove(out)
  return s
end

local Env = {}
Env.__index = Env

function M.new()
  return setmetatable({ wbs = {} }, Env)
end

--- Starts warmboxd (options as spec.helpers.warmboxd.start) and makes the lock dir.
function Env:start(opts)
  self.srv = wbd.start(opts)
  self.lockdir = os.tmpname()
  os.remove(self.lockdir)
  return self.srv
end

--- A warmbox object on this warmboxd with a file lock in the lock dir; `o`
-- overrides any option. Closed by env:stop().
function Env:warmbox(o)
  local opts = { api_url = self.srv.url, sandbox_url = self.srv.url, api_key = self.srv.api_key,
    lock = { backend = "file", dir = self.lockdir } }
  for k, v in pairs(o or {}) do opts[k] = v end
  local wb = luassert(require("warmbox").new(opts))
  self.wbs[#self.wbs + 1] = wb
  return wb
end

function Env:stats()
  return http.request{ url = self.srv.url .. "/_warmboxd/stats" }.json
end

function Env:total()
  return self:stats().total_requests
end

function Env:reset_stats()
  luassert.equal(204, http.request{ method = "POST", url = self.srv.url .. "/_warmboxd/stats/reset" }.status)
end

--- How many requests a route got (from `st`, or from fresh stats).
function Env:route(name, st)
  return ((st or self:stats()).requests or {})[name] or 0
end

--- The next request(s) to `route` fail: by default one 500; `o` adds or overrides fields.
function Env:fault(route, o)
  local body = { route = route, count = 1, status = 500 }
  for k, v in pairs(o or {}) do body[k] = v end
  luassert.equal(204, http.request{ method = "POST", url = self.srv.url .. "/_warmboxd/faults", json = body }.status)
end

function Env:config(t)
  luassert.equal(204, http.request{ method = "POST", url = self.srv.url .. "/_warmboxd/config", json = t }.status)
end

--- Closes every warmbox made here, stops warmboxd, removes the lock dir, then
-- asserts that warmboxd never saw two runs of one sandbox overlap, nor a pause
-- or kill hit a sandbox during a run. `allow` names counters a spec provokes on
-- purpose (e.g. { kill_during_run = true } for a sandbox killed from outside).
function Env:stop(allow)
  allow = allow or {}
  local c = self:stats().counters
  for _, wb in ipairs(self.wbs) do wb:close() end
  self.srv:stop()
  os.execute("rm -rf " .. wbd.sh_quote(self.lockdir))
  local what = { exec_overlap = "two runs of one sandbox overlapped",
    kill_during_run = "a sandbox was killed during a run", pause_during_run = "a sandbox was paused during a run" }
  for name, msg in pairs(what) do
    if not allow[name] then luassert.equal(0, c[name] or 0, msg) end
  end
end

-- ------------------------------------------------------------------
-- Executions counted in the sandbox: each cell first appends its mark to
-- /home/user/runs.log, read from the host.
-- ------------------------------------------------------------------

--- How many times the cell marked `mark` ran in sandbox `id`.
function Env:executions(id, mark)
  local f = io.open(self.srv:sandbox_home(id) .. "/runs.log", "rb")
  if not f then return 0 end
  local n = 0
  for line in f:lines() do if line == mark then n = n + 1 end end
  f:close()
  return n
end

-- How a cell of each language appends its mark (see Env:cell).
local RECORD = {
  python = function(mark) return "open('/home/user/runs.log', 'a').write('" .. mark .. "\\n')\n" end,
  bash = function(mark) return "echo " .. mark .. " >> /home/user/runs.log\n" end,
  javascript = function(mark) return "require('fs').appendFileSync('/home/user/runs.log', '" .. mark .. "\\n')\n" end,
}
RECORD.typescript = RECORD.javascript

--- A cell of `language` (bash, javascript, typescript, python) that first
-- records that it ran, then runs `body`. → code, mark
function Env:cell_in(language, body)
  self.seq = (self.seq or 0) + 1
  local mark = "cell-" .. self.seq
  return RECORD[language](mark) .. (body or ""), mark
end

--- A python cell that first records that it ran, then runs `body`. → code, mark
function Env:cell(body) return self:cell_in("python", body) end

--- A session of `wb` with a warm sandbox and `x = 41` in its kernel. → s, sandbox id
function Env:warm(wb, key)
  local s = wb:session(key)
  local r = luassert(s:run((self:cell("x = 41"))))
  return s, r.sandbox_id
end

--- The state survived: same sandbox, `x` kept.
function Env.survived(_, s, id)
  local r = luassert(s:run("x + 1"))
  luassert.equal(id, r.sandbox_id)
  luassert.is_nil(r.error)
  luassert.equal("42", r.results[1] and r.results[1].text)
end

return M
