-- A lighttpd mod_magnet script (Debian `lighttpd-modules-lua`, Lua 5.4) that
-- runs code in one warm sandbox per conversation:
--   GET /run?key=KEY&code=CODE   ->  200 and the run's stdout then its text (r.text), or 422
--   (the cell raised: its error) or 502 (warmbox failed: the message and code)
--
-- mod_magnet cannot suspend a request: a run BLOCKS THIS WORKER (every other
-- request of the worker waits until the cell ends), and more workers do not
-- keep long cells apart (the kernel hands a new connection to any worker, a
-- busy one too). For long cells put lighttpd in front of a warmbox service on
-- an event loop instead: service.lua with lighttpd-service.conf, next to this file.
--
-- Every worker is a process of its own: `warmbox.new{}` uses the user's shared
-- local server (or E2B with E2B_API_KEY), so all workers see the same sandbox
-- and share the lock state of each conversation. mod_magnet resets the
-- script's globals at each request: the warmbox object lives in package.loaded.
-- See lighttpd.conf next to this file.
local CACHE = "warmbox.example.lighttpd"

local function warmbox_object()
  local wb = package.loaded[CACHE]
  if wb and not wb.closed then return wb end
  local err, code
  wb, err, code = require("warmbox").new{}
  if not wb then return nil, err, code end
  package.loaded[CACHE] = wb
  return wb
end

-- This worker's pid (the example's spec checks that both workers served).
local function worker_pid()
  local f = io.open("/proc/self/stat")
  local pid = f and f:read("l"):match("^%d+")
  if f then f:close() end
  return pid or "?"
end

local function reply(status, text)
  lighty.r.resp_header["Content-Type"] = "text/plain; charset=utf-8"
  lighty.r.resp_header["X-Worker"] = worker_pid()
  lighty.r.resp_body.set({ text, text:sub(-1) == "\n" and "" or "\n" })
  return status
end

local q = lighty.c.urldec_query(lighty.r.req_attr["uri.query"] or "")
if lighty.r.req_attr["uri.path"] ~= "/run" or type(q.key) ~= "string" or type(q.code) ~= "string" then
  return reply(400, "usage: GET /run?key=KEY&code=CODE")
end
local wb, err, code = warmbox_object()
if not wb then return reply(502, tostring(err) .. " (" .. tostring(code) .. ")") end
local r
r, err, code = wb:session(q.key):run(q.code)
if not r then return reply(502, tostring(err) .. " (" .. tostring(code) .. ")") end
-- what the cell printed, then its value (as a notebook shows them)
if r.error then return reply(422, r.stdout .. r.error.name .. ": " .. tostring(r.error.value)) end
return reply(200, r.stdout .. (r.text or ""))
