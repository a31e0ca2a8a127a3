-- The code interpreter's /health from inside the sandbox, over real HTTP: as
-- on E2B, a process of the sandbox asks `http://0.0.0.0:49999/health` (200,
-- "OK"); warmboxd answers it on port 49999 of the sandbox's own network
-- namespace (health.c), so it survives whatever the sandbox's processes do
-- (E2B's systemd brings its server back), comes back after a pause, is not
-- on the host's port 49999, and one sandbox cannot reach another's.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"

local cjson = http.cjson

describe("warmboxd interpreter health in the sandbox", function()
  local srv

  local function bash(sb, code)
    local res = http.sandbox(srv, sb, 49999, "POST", "/execute",
      { json = { code = code, language = "bash" }, timeout = 60 })
    assert.are.equal(200, res.status, res.body)
    local out = {}
    for line in res.body:gmatch("[^\n]+") do
      local l = cjson.decode(line)
      if l.type == "stdout" then out[#out + 1] = l.text end
    end
    return table.concat(out)
  end

  local CURL = 'curl -s -m 5 -o /dev/null -w "%{http_code}" '

  lazy_setup(function() srv = wbd.start{} end)
  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  local function create()
    local res = http.api(srv, "POST", "/sandboxes", { templateID = "code-interpreter-v1", timeout = 600 })
    assert.are.equal(201, res.status, res.body)
    return res.json
  end

  it("answers GET /health with 200 \"OK\" on 0.0.0.0, localhost and ::1, 404 elsewhere", function()
    local sb = create()
    assert.are.equal("200", bash(sb, CURL .. "http://0.0.0.0:49999/health"))
    assert.are.equal('"OK"', bash(sb, "curl -s -m 5 http://127.0.0.1:49999/health"))
    assert.are.equal("200", bash(sb, CURL .. "http://localhost:49999/health"))
    assert.are.equal("404", bash(sb, CURL .. "http://0.0.0.0:49999/execute"))
    -- the port is the interpreter's: a process of the sandbox cannot take it
    assert.matches("in use",
      bash(sb, "python3 -c \"import socket; s=socket.socket(); s.bind(('0.0.0.0', 49999))\" 2>&1 | tail -1"))
  end)

  it("survives the sandbox's processes being killed, and a pause", function()
    local sb = create()
    -- as E2B's systemd test: kill what looks like the interpreter, then health and code still work
    bash(sb, "kill -9 $(pgrep -f 'jupyter server') $(pgrep -f 'uvicorn main:app') 2>/dev/null; true")
    assert.are.equal("200", bash(sb, CURL .. "http://0.0.0.0:49999/health"))
    local path = "/sandboxes/" .. sb.sandboxID
    for _, memory in ipairs({ true, false }) do
      assert.are.equal(204, http.api(srv, "POST", path .. "/pause", { memory = memory }).status)
      assert.are.equal(201, http.api(srv, "POST", path .. "/connect", { timeout = 60 }).status)
      assert.are.equal("200", bash(sb, CURL .. "http://0.0.0.0:49999/health"))
    end
  end)

  it("is each sandbox's own: not on the host, and one sandbox's is not another's", function()
    local a, b = create(), create()
    assert.are.equal("200", bash(a, CURL .. "http://0.0.0.0:49999/health"))
    assert.are.equal("200", bash(b, CURL .. "http://0.0.0.0:49999/health"))
    -- nothing of warmboxd listens on the host's 49999
    local p = io.popen("ss -Hltn 'sport = :49999' 2>/dev/null")
    local listening = p:read("a")
    p:close()
    assert.are.equal("", listening)
    -- a killed sandbox's port is closed: its namespace is gone, the others' stay
    assert.are.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. a.sandboxID).status)
    assert.are.equal("200", bash(b, CURL .. "http://0.0.0.0:49999/health"))
  end)
end)
