-- An intermediary in front of warmboxd's data plane (spec/helpers/after_proxy.py):
-- it forwards the execute and then answers a status of its own, or answers
-- without forwarding, as planned.
--
--   local proxy = require("spec.helpers.after_proxy").start(srv.url)
--   proxy:plan{ { mode = "after", status = 502 } }   -- the next execute
--   ... sandbox_url = proxy.url ...
--   proxy:stop()
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"

local M = {}
local Proxy = {}
Proxy.__index = Proxy

function M.start(upstream)
  local out = os.tmpname()
  local pipe = assert(io.popen(string.format("env -u LD_PRELOAD python3 %s %s >%s 2>&1",
    wbd.sh_quote(wbd.root() .. "/spec/helpers/after_proxy.py"), wbd.sh_quote(upstream), wbd.sh_quote(out)), "w"))
  for _ = 1, 200 do
    local f = io.open(out, "r")
    local port = f and f:read("a"):match("listening (%d+)")
    if f then f:close() end
    if port then
      os.remove(out)
      return setmetatable({ pipe = pipe, url = "http://127.0.0.1:" .. port }, Proxy)
    end
    wbd.sleep(0.05)
  end
  pipe:close()
  error("the intermediary did not start")
end

--- Queues what the next executes get (see after_proxy.py); `{ create = steps }`,
-- `{ kill = steps }`, `{ connect = steps }`, `{ snapshot = steps }`: what the next creates, kills,
-- connects, snapshots get.
function Proxy:plan(steps)
  local body = (steps.create or steps.kill or steps.connect or steps.snapshot) and steps or { execute = steps }
  local res = http.request{ method = "POST", url = self.url .. "/_proxy/plan", json = body }
  assert(res.status == 204, "plan: " .. tostring(res.status))
end

--- Forwards the held late copies (`{ mode = "late", held = true }`).
function Proxy:release()
  local res = http.request{ method = "POST", url = self.url .. "/_proxy/release" }
  assert(res.status == 204, "release: " .. tostring(res.status))
end

--- `{ executes = forwarded, answered = answered by the plan }`
function Proxy:stats()
  return assert(http.request{ url = self.url .. "/_proxy/stats" }.json)
end

function Proxy:stop()
  if self.pipe then self.pipe:close() end
  self.pipe = nil
end

return M
