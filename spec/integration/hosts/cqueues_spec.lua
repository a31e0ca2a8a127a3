-- warmbox.loop.cqueues. s:run and the other waiting calls,
-- made from any cq:wrap coroutine, yield to cqueues (other coroutines run
-- meanwhile); cq:loop() does not end while a call is in flight, nor when a
-- coroutine makes its call after the others finished. And the cqueues
-- example (examples/cqueues/server.lua) serves a conversation as a real process.
local sessions = require "spec.helpers.sessions"
local hosts = require "spec.helpers.hosts"
local cjson = require "cjson"
local cqueues = require "cqueues"

local CELL = "import time\ntime.sleep(0.5)\nk"

describe("warmbox.loop.cqueues", function()
  local env = sessions.new()
  local wb

  lazy_setup(function()
    env:start()
    wb = env:warmbox{ exec_timeout = 60, idle_timeout = 60 }
  end)
  lazy_teardown(function()
    wb:close()
    env:stop()
  end)

  it("runs from cq:wrap coroutines yield to cqueues; a late caller still completes", function()
    local cq = cqueues.new()
    local b = require("warmbox.loop.cqueues").new(wb, cq)
    for i = 1, 3 do assert(wb:session("cq:" .. i):run("k = " .. i)) end
    local got, ticks, running = {}, 0, 0
    for i = 1, 3 do
      cq:wrap(function()
        running = running + 1
        got[i] = assert(b:session("cq:" .. i):run(CELL)).text
        running = running - 1
      end)
    end
    cq:wrap(function()
      cqueues.sleep(0)
      while running > 0 do
        ticks = ticks + 1
        cqueues.sleep(0.02)
      end
      -- every call finished (the driver ended); one more, from this coroutine
      got[4] = assert(b:session("cq:1"):run("k * 10")).text
      got.sessions = #assert(b:sessions())
    end)
    assert(cq:loop())
    assert.same({ "1", "2", "3", "10", sessions = 3 }, got)
    -- three 0.5 s cells at once: the 20 ms ticker ran meanwhile (a call that
    -- blocked the thread would have let it tick only between runs)
    assert.is_true(ticks >= 5, "ticks while the cells ran: " .. ticks)
    assert.equal(0, wb:pending())
  end)

  it("returns nil, msg, code as the direct call does, and raises what it raises", function()
    local cq = cqueues.new()
    local b = require("warmbox.loop.cqueues").new(wb, cq)
    local r1, r2
    cq:wrap(function()
      r1 = { b:session("cq:err"):run("1 +") }
      r2 = { pcall(function() return b:session("cq:err"):run(42) end) }
    end)
    assert(cq:loop())
    assert.is_table(r1[1])
    assert.equal("SyntaxError", r1[1].error.name)
    assert.is_false(r2[1])
    assert.matches("bad argument #1 to 'run'", r2[2])
    -- outside a cqueues coroutine: a direct (blocking) call
    assert.equal("3", assert(b:session("cq:err"):run("1 + 2")).text)
  end)
end)

describe("examples/cqueues/server.lua", function()
  local host
  lazy_teardown(function()
    hosts.stop(host)
    require("warmbox.server").stop_local()
  end)

  it("serves one conversation: the counter cell gives 1, 2, 3", function()
    host = hosts.start("lua5.4 examples/cqueues/server.lua 0", "listening on 127%.0%.0%.1:(%d+)")
    local socket = require "socket"
    local c = assert(socket.connect("127.0.0.1", host.port))
    c:settimeout(120)
    local got = {}
    for _ = 1, 3 do
      assert(c:send(cjson.encode({ key = "cq-example:1", code = hosts.COUNTER }) .. "\n"))
      local line = assert(c:receive("*l"))
      local a = cjson.decode(line)
      assert.is_true(a.ok, line)
      got[#got + 1] = a.text
    end
    c:close()
    assert.same({ "1", "2", "3" }, got)
  end)
end)
