-- warmbox.core's Http against a scripted raw HTTP/1.1 server (luasocket, in a
-- child process): kept-alive connections, streamed bodies arriving in pieces,
-- retries, drops and timeouts, batches, pagination. The same behaviours are
-- checked against warmboxd in core_warmboxd_spec.lua.
local core = require "warmbox.core"
local cjson = require("cjson.safe").new()

local SERVER = [==[
local socket = require "socket"
local cjson = require "cjson"
local srv = assert(socket.bind("127.0.0.1", 0))
local _, port = srv:getsockname()
io.stdout:write(port, "\n")
io.stdout:flush()
srv:settimeout(0)
local bufs, list = {}, {}
local counts, conns = {}, 0
local faults = {}   -- path -> { n = remaining, kind = "status"|"drop", status, ra }

local function send(c, status, headers, body)
  local h = { ("HTTP/1.1 %d X\r\n"):format(status) }
  headers = headers or {}
  if body and not headers["Content-Length"] then headers["Content-Length"] = #body end
  for k, v in pairs(headers) do h[#h + 1] = k .. ": " .. tostring(v) .. "\r\n" end
  h[#h + 1] = "\r\n"
  c:send(table.concat(h) .. (body or ""))
end

local function chunk(c, s)
  c:send(("%x\r\n"):format(#s) .. s .. "\r\n")
end

local function env(flags, payload)
  local n = #payload
  return string.char(flags, (n >> 24) & 255, (n >> 16) & 255, (n >> 8) & 255, n & 255) .. payload
end

local function handle(c, req, conn_id)
  local path, query = req.path:match("^([^?]*)%??(.*)$")
  local q = {}
  for k, v in query:gmatch("([^&=]+)=([^&]*)") do
    q[k] = v:gsub("%%(%x%x)", function(x) return string.char(tonumber(x, 16)) end)
  end
  counts[path] = (counts[path] or 0) + 1
  local f = faults[path]
  if f and f.n > 0 then
    f.n = f.n - 1
    if f.kind == "drop" then return false end
    local h = {}
    if f.ra then h["Retry-After"] = f.ra end
    send(c, f.status, h, '{"code":' .. f.status .. ',"message":"fault"}')
    return true
  end
  if path == "/hello" then
    send(c, 200, { ["X-Conn"] = conn_id, ["Set-Thing"] = "a", ["X-Multi"] = "1" }, "hello")
  elseif path == "/fault" then
    faults[q.path] = { n = tonumber(q.n), kind = q.kind, status = tonumber(q.status), ra = q.ra }
    send(c, 204, {}, "")
  elseif path == "/counts" then
    send(c, 200, { ["Content-Type"] = "application/json" }, cjson.encode({ counts = counts, conns = conns }))
  elseif path == "/reset" then
    counts, faults = {}, {}
    send(c, 204, {}, "")
  elseif path == "/echo" then
    send(c, 200, {}, cjson.encode({ method = req.method, headers = req.headers, body = req.body, path = req.path }))
  elseif path == "/slow" then
    socket.sleep(tonumber(q.ms) / 1000)
    send(c, 200, {}, "slow")
  elseif path == "/lines" then
    send(c, 200, { ["Transfer-Encoding"] = "chunked" })
    for _, piece in ipairs({ '{"a":1}\n{"b"', ':2}\n', '\n{"c"', ":3}\r\n", '{"d":4}' }) do
      chunk(c, piece)
      socket.sleep(0.02)
    end
    c:send("0\r\n\r\n")
  elseif path == "/frames" then
    local s = env(0, '{"n":1}') .. env(0, '{"n":2}') .. env(2, "{}")
    send(c, 200, { ["Transfer-Encoding"] = "chunked", ["Content-Type"] = "application/connect+json" })
    for i = 1, #s do
      chunk(c, s:sub(i, i))
      socket.sleep(0.003)
    end
    c:send("0\r\n\r\n")
  elseif path == "/lines_then_drop" then
    send(c, 200, { ["Transfer-Encoding"] = "chunked" })
    chunk(c, '{"a":1}\n')
    socket.sleep(0.02)
    return false
  elseif path == "/many_lines" then
    send(c, 200, { ["Transfer-Encoding"] = "chunked" })
    for i = 1, 100 do chunk(c, '{"i":' .. i .. '}\n') end
    c:send("0\r\n\r\n")
  elseif path == "/big" then
    send(c, 200, {}, string.rep("0123456789", 100000))
  elseif path == "/big_chunked" then
    -- no Content-Length: only the bytes that arrive tell the size
    send(c, 200, { ["Transfer-Encoding"] = "chunked" })
    for _ = 1, 100 do chunk(c, string.rep("0123456789", 1000)) end
    c:send("0\r\n\r\n")
  elseif path == "/status" then
    send(c, tonumber(q.code), {}, "status " .. q.code)
  else
    send(c, 404, {}, "no route")
  end
  return req.headers["connection"] ~= "close"
end

local function try_parse(c)
  local buf = bufs[c].buf
  local hend = buf:find("\r\n\r\n", 1, true)
  if not hend then return nil end
  local head = buf:sub(1, hend - 1)
  local method, path = head:match("^(%S+) (%S+)")
  local headers = {}
  for line in head:gmatch("[^\r\n]+") do
    local k, v = line:match("^([^:]+):%s*(.*)$")
    if k then headers[k:lower()] = v end
  end
  local cl = tonumber(headers["content-length"] or 0)
  if #buf < hend + 3 + cl then return nil end
  local body = buf:sub(hend + 4, hend + 3 + cl)
  bufs[c].buf = buf:sub(hend + 4 + cl)
  return { method = method, path = path, headers = headers, body = body }
end

local function drop(c)
  c:close()
  bufs[c] = nil
  for i, x in ipairs(list) do if x == c then table.remove(list, i) break end end
end

local last = socket.gettime()
while true do
  local rd = socket.select({ srv, table.unpack(list) }, nil, 1)
  if #rd > 0 then last = socket.gettime() elseif socket.gettime() - last > 60 then os.exit(0) end
  for _, s in ipairs(rd) do
    if s == srv then
      local c = srv:accept()
      if c then
        c:settimeout(0)
        c:setoption("tcp-nodelay", true)
        conns = conns + 1
        bufs[c] = { buf = "", id = conns }
        list[#list + 1] = c
      end
    elseif bufs[s] then
      local data, err, partial = s:receive(65536)
      local got = data or partial
      if got and #got > 0 then bufs[s].buf = bufs[s].buf .. got end
      local alive = err ~= "closed"
      while alive do
        local req = try_parse(s)
        if not req then break end
        if req.path == "/quit" then os.exit(0) end
        s:settimeout(nil)
        alive = handle(s, req, bufs[s].id)
        s:settimeout(0)
      end
      if not alive then drop(s) end
    end
  end
end
]==]

-- The server runs detached (its output in a file), so nothing here waits on
-- it; it also exits by itself after a minute without requests.
local function start_server()
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(SERVER)
  f:close()
  local out = path .. ".out"
  local p = assert(io.popen(("lua5.4 %s >%s 2>&1 </dev/null & echo $!"):format(path, out), "r"))
  local pid = assert(tonumber(p:read("l")))
  p:close()
  local port
  for _ = 1, 400 do
    local o = io.open(out, "r")
    port = o and tonumber(o:read("l"))
    if o then o:close() end
    if port then break end
    os.execute("sleep 0.05")
  end
  assert(port, "the raw server did not start")
  return { url = "http://127.0.0.1:" .. port, pid = pid, script = path, out = out }
end

describe("warmbox.Http against a raw server", function()
  local srv, h

  lazy_setup(function()
    srv = start_server()
    h = core.http{ timeout = 10, connect_timeout = 5 }
  end)

  lazy_teardown(function()
    h:close()
    os.execute("kill " .. srv.pid .. " 2>/dev/null")
    os.remove(srv.script)
    os.remove(srv.out)
  end)

  local function get(path, extra)
    local req = { url = srv.url .. path }
    for k, v in pairs(extra or {}) do req[k] = v end
    return h:request(req)
  end

  local function counts()
    local res = assert(get("/counts"))
    return cjson.decode(res.body)
  end

  before_each(function()
    assert(get("/reset"))
  end)

  describe(":request()", function()
    it("returns status, lower-case headers, body, attempts", function()
      local res = assert(get("/hello"))
      assert.equals(200, res.status)
      assert.equals("hello", res.body)
      assert.equals("a", res.headers["set-thing"])
      assert.equals("5", res.headers["content-length"])
      assert.equals(1, res.attempts)
    end)

    it("keeps the connection alive across requests", function()
      local a = assert(get("/hello"))
      local b = assert(get("/hello"))
      local c = assert(get("/hello"))
      assert.equals(a.headers["x-conn"], b.headers["x-conn"])
      assert.equals(a.headers["x-conn"], c.headers["x-conn"])
      assert.equals(0, b.new_connections)
      assert.equals(0, c.new_connections)
    end)

    it("a new client opens a new connection", function()
      local a = assert(get("/hello"))
      local h2 = core.http{}
      local b = assert(h2:request{ url = srv.url .. "/hello" })
      h2:close()
      assert.are_not.equal(a.headers["x-conn"], b.headers["x-conn"])
      assert.equals(1, b.new_connections)
    end)

    it("sends the method, headers and a binary body", function()
      local body = "a\0b\255" .. string.rep("x", 5000)
      local res = assert(h:request{ method = "PUT", url = srv.url .. "/echo", body = body,
        headers = { ["X-Thing"] = "1", ["Content-Type"] = "application/octet-stream" } })
      local e = cjson.decode(res.body)
      assert.equals("PUT", e.method)
      assert.equals("1", e.headers["x-thing"])
      assert.equals(body, e.body)
      assert.is_nil(e.headers["expect"])
    end)

    it("sends an empty body on a bare POST", function()
      local res = assert(h:request{ method = "POST", url = srv.url .. "/echo" })
      local e = cjson.decode(res.body)
      assert.equals("POST", e.method)
      assert.equals("0", e.headers["content-length"])
    end)

    it("reads a large body", function()
      local res = assert(get("/big"))
      assert.equals(1000000, #res.body)
    end)

    it("cuts a body past max_body off while it downloads (TOO_LARGE), with or without a Content-Length", function()
      for _, path in ipairs({ "/big", "/big_chunked" }) do
        local res, msg, code = get(path, { max_body = 4096 })
        assert.is_nil(res, path)
        assert.equals("TOO_LARGE", code, path)
        assert.truthy(msg:find("max_body", 1, true), path)
        -- exactly the size fits
        res = assert(get(path, { max_body = 1000000 }))
        assert.equals(1000000, #res.body, path)
      end
      -- a small body under the limit, and the client still works after a cut
      assert.equals("hello", assert(get("/hello", { max_body = 5 })).body)
      assert.has_error(function() h:request{ url = srv.url .. "/hello", max_body = -1 } end)
    end)

    it("returns non-2xx statuses as responses", function()
      local res = assert(get("/status?code=418"))
      assert.equals(418, res.status)
      assert.equals("status 418", res.body)
    end)

    it("times out with TIMEOUT", function()
      local res, msg, code = get("/slow?ms=1500", { timeout = 0.2, retry = false })
      assert.is_nil(res)
      assert.equals("TIMEOUT", code)
      assert.truthy(msg:find("timed out", 1, true))
    end)
  end)

  describe("retries", function()
    local fast = { attempts = 3, base = 0.001, cap = 0.002 }

    it("retries a GET on 503 and succeeds", function()
      assert(get("/fault?path=/hello&n=2&kind=status&status=503"))
      local res = assert(get("/hello", { retry = fast }))
      assert.equals(200, res.status)
      assert.equals(3, res.attempts)
      assert.equals(3, counts().counts["/hello"])
    end)

    it("gives up after the attempts and returns the last response", function()
      assert(get("/fault?path=/hello&n=5&kind=status&status=502"))
      local res = assert(get("/hello", { retry = fast }))
      assert.equals(502, res.status)
      assert.equals(3, res.attempts)
    end)

    it("honours Retry-After on 429", function()
      assert(get("/fault?path=/hello&n=1&kind=status&status=429&ra=0"))
      local res = assert(get("/hello", { retry = { attempts = 2, base = 5, cap = 5 } }))
      assert.equals(200, res.status)
      assert.equals(2, res.attempts)
    end)

    it("stops when Retry-After exceeds the budget", function()
      assert(get("/fault?path=/hello&n=1&kind=status&status=429&ra=100"))
      local res = assert(get("/hello", { retry = { attempts = 3, budget = 1 } }))
      assert.equals(429, res.status)
      assert.equals(1, res.attempts)
    end)

    it("does not retry a POST on 503", function()
      assert(get("/fault?path=/echo&n=1&kind=status&status=503"))
      local res = assert(h:request{ method = "POST", url = srv.url .. "/echo", body = "x", retry = fast })
      assert.equals(503, res.status)
      assert.equals(1, res.attempts)
    end)

    it("retries a POST marked idempotent", function()
      assert(get("/fault?path=/echo&n=1&kind=status&status=503"))
      local res = assert(h:request{ method = "POST", url = srv.url .. "/echo", body = "x",
        retry = { attempts = 3, base = 0.001, idempotent = true } })
      assert.equals(200, res.status)
      assert.equals(2, res.attempts)
    end)

    it("retries a GET whose connection was dropped", function()
      assert(get("/fault?path=/hello&n=1&kind=drop"))
      local res = assert(get("/hello", { retry = fast }))
      assert.equals(200, res.status)
      -- libcurl itself re-sends on a reused connection, or we do
      assert.equals(2, counts().counts["/hello"])
    end)

    it("never retries a POST whose connection was dropped after sending", function()
      assert(get("/fault?path=/echo&n=1&kind=drop"))
      local res, msg, code = h:request{ method = "POST", url = srv.url .. "/echo", body = "x", retry = fast }
      assert.is_nil(res)
      assert.equals("TRANSPORT", code)
      assert.truthy(msg:find("attempt 1", 1, true))
      assert.equals(1, counts().counts["/echo"])
    end)

    it("retries only the listed statuses", function()
      assert(get("/fault?path=/hello&n=1&kind=status&status=502"))
      local res = assert(get("/hello", { retry = { attempts = 3, base = 0.001, statuses = { 503 } } }))
      assert.equals(502, res.status)
      assert.equals(1, res.attempts)
      assert(get("/fault?path=/hello&n=1&kind=status&status=500"))
      res = assert(get("/hello", { retry = { attempts = 3, base = 0.001, statuses = { 500 } } }))
      assert.equals(200, res.status)
      assert.equals(2, res.attempts)
    end)

    it("retry = false means one attempt", function()
      assert(get("/fault?path=/hello&n=1&kind=status&status=503"))
      local res = assert(get("/hello", { retry = false }))
      assert.equals(503, res.status)
      assert.equals(1, res.attempts)
    end)
  end)

  describe("streaming", function()
    it("delivers NDJSON lines as they arrive", function()
      local lines = {}
      local res = assert(get("/lines", { stream = "lines", on_chunk = function(l, flags)
        lines[#lines + 1] = l
        assert.equals(0, flags)
      end }))
      assert.equals(200, res.status)
      assert.same({ '{"a":1}', '{"b":2}', '{"c":3}', '{"d":4}' }, lines)
      assert.equals("", res.body)
      assert.equals(4, res.frames)
    end)

    it("delivers connect frames sent one byte at a time", function()
      local frames = {}
      local res = assert(get("/frames", { stream = "connect", on_chunk = function(f, flags)
        frames[#frames + 1] = { f, flags }
      end }))
      assert.equals(200, res.status)
      assert.same({ { '{"n":1}', 0 }, { '{"n":2}', 0 }, { "{}", 2 } }, frames)
    end)

    it("aborts cleanly when the callback returns false", function()
      local n = 0
      local res, msg, code = get("/many_lines", { stream = "lines", on_chunk = function()
        n = n + 1
        if n == 3 then return false end
      end })
      assert.is_nil(res)
      assert.equals("ABORTED", code)
      assert.equals(3, n)
      assert.truthy(msg:find("aborted", 1, true))
      -- the client still works
      assert.equals(200, assert(get("/hello")).status)
    end)

    it("re-raises the callback's error after the transfer", function()
      local ok, err = pcall(get, "/many_lines", { stream = "lines", on_chunk = function(l)
        if l:find('"i":5', 1, true) then error({ custom = l }) end
      end })
      assert.is_false(ok)
      assert.same({ custom = '{"i":5}' }, err)
      assert.equals(200, assert(get("/hello")).status)
    end)

    it("runs callbacks inside a coroutine", function()
      local co = coroutine.wrap(function()
        local got = 0
        assert(get("/many_lines", { stream = "lines", on_chunk = function() got = got + 1 end }))
        return got
      end)
      assert.equals(100, co())
    end)

    it("lets a callback make requests on the same client", function()
      local inner = {}
      local res = assert(get("/lines", { stream = "lines", on_chunk = function()
        local r = assert(get("/hello"))
        inner[#inner + 1] = r.status
      end }))
      assert.equals(200, res.status)
      assert.same({ 200, 200, 200, 200 }, inner)
    end)

    it("refuses to close the client from its own callback", function()
      local ok, err = pcall(get, "/lines", { stream = "lines", on_chunk = function() h:close() end })
      assert.is_false(ok)
      assert.truthy(tostring(err):find("cannot close a warmbox.Http from inside its own transfer", 1, true))
      assert.equals(200, assert(get("/hello")).status)
    end)

    it("reports a stream cut after output and does not retry it", function()
      local lines = {}
      local res, _, code = get("/lines_then_drop", { stream = "lines", retry = { attempts = 3, base = 0.001 },
        on_chunk = function(l) lines[#lines + 1] = l end })
      assert.is_nil(res)
      assert.equals("TRANSPORT", code)
      assert.same({ '{"a":1}' }, lines)
      assert.equals(1, counts().counts["/lines_then_drop"])
    end)

    it("collects the body of a non-2xx streamed response", function()
      local called = false
      local res = assert(get("/status?code=502", { stream = "lines", retry = false,
        on_chunk = function() called = true end }))
      assert.equals(502, res.status)
      assert.equals("status 502", res.body)
      assert.is_false(called)
    end)
  end)

  describe(":batch()", function()
    it("runs requests in parallel with a bound and keeps order", function()
      local reqs = {}
      for i = 1, 20 do reqs[i] = { url = srv.url .. "/echo?i=" .. i } end
      reqs[21] = { url = "http://127.0.0.1:1/", retry = false }
      local out = h:batch(reqs, { concurrency = 4 })
      assert.equals(21, #out)
      for i = 1, 20 do
        assert.equals(200, out[i][1].status)
        assert.equals("/echo?i=" .. i, cjson.decode(out[i][1].body).path)
      end
      assert.is_nil(out[21][1])
      assert.equals("TRANSPORT", out[21][3])
    end)

    it("retries inside a batch", function()
      assert(get("/fault?path=/hello&n=1&kind=status&status=503"))
      local out = h:batch({ { url = srv.url .. "/hello", retry = { attempts = 3, base = 0.001 } } })
      assert.equals(200, out[1][1].status)
      assert.equals(2, out[1][1].attempts)
    end)
  end)
end)
