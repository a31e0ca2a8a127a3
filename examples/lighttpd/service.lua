-- The pattern that keeps long cells apart behind lighttpd: lighttpd forwards
-- /run to this small warmbox service (its built-in mod_scgi; see
-- lighttpd-scgi.conf), which runs every request as a task on luv's loop. No
-- lighttpd worker waits for a cell (lighttpd proxies without blocking), and
-- cells of different conversations run at the same time, however many there are.
--
--   lua5.4 examples/lighttpd/service.lua [PORT]     (0 or none: a free port)
--   -> prints "listening on 127.0.0.1:PORT"
--   GET /run?key=KEY&code=CODE  or  POST /run?key=KEY (the code as the body)
--       -> 200 and the run's stdout then its text, 422 the cell raised, 502 warmbox failed
--   GET /ping -> "pong" (at once, even while cells run)
--
-- SCGI (lighttpd's mod_scgi) is a netstring of NUL-separated CGI variables,
-- then the body; the answer is CGI's (a Status header, a blank line, the body),
-- and the connection closes. warmbox.new{} uses the user's shared local server
-- (or E2B with E2B_API_KEY). From a source checkout:
-- LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;".
local uv = require "luv"
local warmbox = require "warmbox"

local wb = assert(warmbox.new{})
local hook = require("warmbox.loop.luv").attach(wb)

local MAX_REQUEST = 1024 * 1024

local function urldecode(s)
  return (s:gsub("+", " "):gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

local function query(qs)
  local t = {}
  for k, v in (qs or ""):gmatch("([^&=]+)=([^&]*)") do t[urldecode(k)] = urldecode(v) end
  return t
end

local function answer(client, status, body)
  if client:is_closing() then return end
  client:write(string.format("Status: %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n\r\n%s",
    status, #body, body))
  client:shutdown(function() client:close() end)
end

-- One request: its CGI variables and body. → answered now, or from a task's on_done.
local function serve(client, env, body)
  local path, q = env.DOCUMENT_URI or env.SCRIPT_NAME or "", query(env.QUERY_STRING)
  if path == "/ping" then return answer(client, "200 OK", "pong\n") end
  local code = env.REQUEST_METHOD == "POST" and body or q.code
  if path ~= "/run" or type(q.key) ~= "string" or q.key == "" or type(code) ~= "string" or code == "" then
    return answer(client, "400 Bad Request", "usage: GET /run?key=KEY&code=CODE or POST /run?key=KEY\n")
  end
  wb:spawn(function() return wb:session(q.key):run(code) end):on_done(function(t)
    local r, err, ecode = t:result()
    if not r then return answer(client, "502 Bad Gateway", tostring(err) .. " (" .. tostring(ecode) .. ")\n") end
    if r.error then return answer(client, "422 Unprocessable Content", r.stdout .. r.error.name .. ": "
      .. tostring(r.error.value) .. "\n") end
    answer(client, "200 OK", r.stdout .. (r.text and r.text .. "\n" or ""))
  end)
end

-- The SCGI request in buf, once whole: env, body | nil (more to read) | false (malformed).
local function parse(buf)
  local len, colon = buf:match("^(%d+)():")
  if not len then return (#buf > 10 or buf:find("[^%d]")) and false or nil end
  len = tonumber(len)
  if len > MAX_REQUEST then return false end
  local hstart = colon + 1
  if #buf < hstart + len then return nil end
  if buf:sub(hstart + len, hstart + len) ~= "," then return false end
  local env, fields = {}, {}
  for f in buf:sub(hstart, hstart + len - 1):gmatch("([^%z]*)%z") do fields[#fields + 1] = f end
  for i = 1, #fields - 1, 2 do env[fields[i]] = fields[i + 1] end
  local clen = tonumber(env.CONTENT_LENGTH or "")
  if not clen or clen > MAX_REQUEST then return false end
  local body = buf:sub(hstart + len + 1)
  if #body < clen then return nil end
  return env, body:sub(1, clen)
end

local tcp = uv.new_tcp()
assert(tcp:bind("127.0.0.1", tonumber(arg[1]) or 0))
assert(tcp:listen(128, function(err)
  assert(not err, err)
  local client = uv.new_tcp()
  tcp:accept(client)
  local buf, done = "", false
  client:read_start(function(rerr, data)
    if rerr or not data then
      if not client:is_closing() then client:close() end
      return
    end
    if done then return end
    buf = buf .. data
    local env, body = parse(buf)
    if env == false then
      done = true
      return answer(client, "400 Bad Request", "bad SCGI request\n")
    end
    if env then
      done = true
      client:read_stop()
      serve(client, env, body)
    end
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
