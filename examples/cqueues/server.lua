-- The line-oriented TCP service of examples/luv/server.lua, on cqueues: one
-- coroutine per connection; `b:session(key):run(code)` yields to cqueues
-- while the run is in flight, so other connections are served meanwhile.
--
--   lua5.4 examples/cqueues/server.lua [PORT]   (0 or none: a free port)
--   -> prints "listening on 127.0.0.1:PORT"
--   request, one JSON line:  {"key": "conversation-1", "code": "x = 1\nx"}
--   answer, one JSON line:   {"ok": true, "text": "1", "stdout": ""} | {"ok": false, "message": ..., "code": ...}
--
-- warmbox.new{} uses the user's shared local server (or E2B with E2B_API_KEY).
-- From a source checkout: LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;".
local cqueues = require "cqueues"
local socket = require "cqueues.socket"
local signal = require "cqueues.signal"
local cjson = require "cjson"
local warmbox = require "warmbox"

local wb = assert(warmbox.new{})
local cq = cqueues.new()
local b = require("warmbox.loop.cqueues").new(wb, cq)

local function answer(line)
  local ok, req = pcall(cjson.decode, line)
  if not ok or type(req) ~= "table" or type(req.key) ~= "string" or type(req.code) ~= "string" then
    return { ok = false, message = "bad request", code = "BAD_REQUEST" }
  end
  local r, msg, code = b:session(req.key):run(req.code)   -- yields to cqueues
  if not r then return { ok = false, message = tostring(msg), code = tostring(code) } end
  return { ok = true, text = r.text or cjson.null, stdout = r.stdout }
end

local srv = assert(socket.listen{ host = "127.0.0.1", port = tonumber(arg[1]) or 0 })
assert(srv:listen())
local _, _, port = srv:localname()
print("listening on 127.0.0.1:" .. port)
io.stdout:flush()

local stopping = false
cq:wrap(function()
  while not stopping do
    local conn = srv:accept(0.5)
    if conn then
      cq:wrap(function()
        conn:setmode("tl", "tf")
        for line in conn:lines("*l") do
          conn:write(cjson.encode(answer(line)), "\n")
          conn:flush()
        end
        conn:close()
      end)
    end
  end
  srv:close()
end)

-- SIGTERM: stop accepting; the loop ends once the connections did.
signal.block(signal.SIGTERM)
local sigs = signal.listen(signal.SIGTERM)
cq:wrap(function()
  sigs:wait()
  stopping = true
end)
assert(cq:loop())
wb:close()
