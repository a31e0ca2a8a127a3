-- A line-oriented TCP service on luv (libuv) that runs code in one warm
-- sandbox per conversation, asynchronously: every request is a task spawned
-- from the TCP handler, answered from its on_done; the loop never blocks on a run.
--
--   lua5.4 examples/luv/server.lua [PORT]      (0 or none: a free port)
--   -> prints "listening on 127.0.0.1:PORT"
--   request, one JSON line:  {"key": "conversation-1", "code": "x = 1\nx"}
--   answer, one JSON line:   {"ok": true, "text": "1", "stdout": ""} | {"ok": false, "message": ..., "code": ...}
--
-- warmbox.new{} uses the user's shared local server (or E2B with E2B_API_KEY).
-- From a source checkout: LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;".
local uv = require "luv"
local cjson = require "cjson"
local warmbox = require "warmbox"

local wb = assert(warmbox.new{})
local hook = require("warmbox.loop.luv").attach(wb)

-- One request: a task; its answer goes back on the connection when it ends.
local function serve(client, line)
  local ok, req = pcall(cjson.decode, line)
  if not ok or type(req) ~= "table" or type(req.key) ~= "string" or type(req.code) ~= "string" then
    client:write(cjson.encode({ ok = false, message = "bad request", code = "BAD_REQUEST" }) .. "\n")
    return
  end
  wb:spawn(function() return wb:session(req.key):run(req.code) end):on_done(function(t)
    local r, msg, code = t:result()
    local answer = r and { ok = true, text = r.text or cjson.null, stdout = r.stdout }
      or { ok = false, message = tostring(msg), code = tostring(code) }
    if not client:is_closing() then client:write(cjson.encode(answer) .. "\n") end
  end)
end

local tcp = uv.new_tcp()
assert(tcp:bind("127.0.0.1", tonumber(arg[1]) or 0))
assert(tcp:listen(64, function(err)
  assert(not err, err)
  local client = uv.new_tcp()
  tcp:accept(client)
  local buf = ""
  client:read_start(function(rerr, data)
    if rerr or not data then
      client:close()
      return
    end
    buf = buf .. data
    for line in buf:gmatch("([^\n]*)\n") do serve(client, line) end
    buf = buf:match("[^\n]*$")
  end)
end))
print("listening on 127.0.0.1:" .. tcp:getsockname().port)
io.stdout:flush()

-- SIGTERM: finish the runs in flight (up to 10 s), then stop.
local sig = uv.new_signal()
sig:start("sigterm", function()
  hook:detach()
  wb:close{ drain = 10 }
  sig:close()
  tcp:close()
end)
uv.run()
