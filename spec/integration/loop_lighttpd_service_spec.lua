-- The pattern that keeps long cells apart behind lighttpd: lighttpd (2
-- workers) forwards to the warmbox service on luv (examples/lighttpd/
-- service.lua, lighttpd-service.conf) over SCGI. Two long cells of different
-- conversations run at the same time (their intervals overlap, which two
-- mod_magnet workers do not promise), and a ping is answered while they run.
local wbd = require "spec.helpers.warmboxd"
local hosts = require "spec.helpers.hosts"

local q = wbd.sh_quote

-- A cell that prints when it started and ended (the host's clock: the jails share it).
local LONG = "import time\nt0 = time.time()\ntime.sleep(3)\nprint('%.3f %.3f' % (t0, time.time()))"

describe("lighttpd in front of the warmbox service (examples/lighttpd/service.lua)", function()
  local service, host, errlog, base

  lazy_setup(function()
    require("warmbox.server").stop_local()
    service = hosts.start("lua5.4 examples/lighttpd/service.lua 0", "listening on 127%.0%.0%.1:(%d+)")
    local port = hosts.free_port()
    errlog = os.tmpname()
    host = hosts.start("WARMBOX_EXAMPLE_DIR=" .. q(hosts.root() .. "/examples/lighttpd") .. " PORT=" .. port
      .. " SERVICE_PORT=" .. service.port .. " LIGHTTPD_ERRORLOG=" .. q(errlog)
      .. " lighttpd -D -f examples/lighttpd/lighttpd-service.conf", "()", 5)
    base = "http://127.0.0.1:" .. port
    assert.is_true(wbd.eventually(function() return hosts.http("GET", base .. "/ping", nil, 5) == 200 end, 30),
      "lighttpd did not serve: " .. tostring(wbd.read_all(errlog)) .. tostring(wbd.read_all(host.log)))
  end)
  lazy_teardown(function()
    hosts.stop(host)
    hosts.stop(service)
    if errlog then os.remove(errlog) end
    require("warmbox.server").stop_local()
  end)

  it("serves a conversation: the counter gives 1, 2, 3; a print comes back; a raise is 422", function()
    for i = 1, 3 do
      local status, body = hosts.http("POST", base .. "/run?key=svc%3A1", hosts.COUNTER)
      assert.equal(200, status, body)
      assert.equal(i .. "\n", body)
    end
    local status, body = hosts.http("GET", base .. "/run?key=svc%3A1&code=print(%22hi%22)")
    assert.equal(200, status)
    assert.equal("hi\n", body)
    status, body = hosts.http("POST", base .. "/run?key=svc%3A1", "1/0")
    assert.equal(422, status)
    assert.matches("ZeroDivisionError", body)
    assert.equal(400, (hosts.http("GET", base .. "/run?key=svc%3A1")))
  end)

  it("runs two long cells of different conversations at once, and answers a ping meanwhile", function()
    for _, k in ipairs({ "a", "b" }) do
      assert.equal(200, (hosts.http("POST", base .. "/run?key=svc%3A" .. k, "0")))
    end
    -- the executes the service's shared server has received
    local st = assert(require("warmbox.server").local_server())
    local http = require("warmbox.core").http{ timeout = 10 }
    local function executes()
      local res = http:request{ method = "GET", url = st.url .. "/_warmboxd/stats",
        headers = { ["X-Warmboxd-Token"] = st.admin_token } }
      local s = res and require("cjson").decode(res.body) or {}
      return (s.requests or {})["interp POST /execute"] or 0
    end
    local before = executes()
    local outs = {}
    for i, k in ipairs({ "a", "b" }) do
      outs[i] = os.tmpname()
      assert.is_true(os.execute("(curl -s -X POST --data-binary " .. q(LONG) .. " " .. q(base .. "/run?key=svc%3A" .. k)
        .. " >" .. q(outs[i]) .. " 2>&1 &)"))
    end
    -- both cells in flight: their executes reached the server
    assert.is_true(wbd.eventually(function() return executes() >= before + 2 end, 60))
    http:close()
    local status, body = hosts.http("GET", base .. "/ping")
    assert.equal(200, status)
    assert.equal("pong\n", body)
    assert.equal("", wbd.read_all(outs[1]) or "")
    local spans = {}
    for i = 1, 2 do
      assert.is_true(wbd.eventually(function() return (wbd.read_all(outs[i]) or ""):find("\n") ~= nil end, 60))
      local a, b = (wbd.read_all(outs[i]) or ""):match("^([%d%.]+) ([%d%.]+)\n")
      assert.is_truthy(a, wbd.read_all(outs[i]))
      spans[i] = { tonumber(a), tonumber(b) }
      os.remove(outs[i])
    end
    -- the two cells ran at the same time: each started before the other ended
    assert.is_true(spans[1][1] < spans[2][2] and spans[2][1] < spans[1][2],
      string.format("the cells ran one after the other: %.3f-%.3f, %.3f-%.3f", spans[1][1], spans[1][2], spans[2][1],
        spans[2][2]))
  end)
end)
