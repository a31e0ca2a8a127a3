-- warmbox.loop.luv. Attached once, tasks spawned at any time
-- (from a timer long after the loop went idle, from a TCP handler) run and
-- complete with no manual kick; task:on_done answers. And the luv example
-- (examples/luv/server.lua) serves a conversation as a real process.
local sessions = require "spec.helpers.sessions"
local hosts = require "spec.helpers.hosts"
local cjson = require "cjson"
local uv = require "luv"

describe("warmbox.loop.luv", function()
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

  it("runs tasks spawned from a timer after the loop went idle, and from a TCP handler", function()
    local hook = require("warmbox.loop.luv").attach(wb)
    local log = {}
    local idle = uv.new_timer()
    local on_idle
    -- a first task, then nothing pending for a while (the old pump stopped the poll here)
    wb:spawn(function() return assert(wb:session("luv:a"):run("1 + 1")).text end)
      :on_done(function(t)
        log[#log + 1] = "first " .. t:result()
        idle:start(300, 0, on_idle)
      end)
    local tcp = uv.new_tcp()
    assert(tcp:bind("127.0.0.1", 0))
    local client_got
    assert(tcp:listen(8, function()
      local c = uv.new_tcp()
      tcp:accept(c)
      c:read_start(function(_, data)
        if not data then return c:close() end
        -- spawned from the TCP handler, answered from on_done
        wb:spawn(function() return assert(wb:session("luv:b"):run(data)).text end)
          :on_done(function(t) c:write(tostring((t:result())) .. "\n") end)
      end)
    end))
    on_idle = function()
      log[#log + 1] = "idle " .. wb:pending()
      -- spawned from a timer, long after the last task ended
      wb:spawn(function() return assert(wb:session("luv:a"):run("2 * 21")).text end)
        :on_done(function(t)
          log[#log + 1] = "timer " .. t:result()
          local conn = uv.new_tcp()
          conn:connect("127.0.0.1", tcp:getsockname().port, function(err)
            assert(not err, err)
            conn:read_start(function(_, data)
              client_got = data
              conn:close()
              tcp:close()
              idle:close()
            end)
            conn:write("6 * 7")
          end)
        end)
    end
    uv.run()                 -- ends when the TCP server and timer are closed
    hook:detach()
    uv.run("nowait")
    assert.same({ "first 2", "idle 0", "timer 42" }, log)
    assert.equal("42\n", client_got)
    assert.equal(0, wb:pending())
  end)

  it("keeps the loop alive while tasks are pending, and not after", function()
    local hook = require("warmbox.loop.luv").attach(wb)
    local t = wb:spawn(function()
      return assert(wb:session("luv:c"):run("import time\ntime.sleep(0.5)\n'slept'")).text
    end)
    uv.run()                 -- nothing but the task: it returns once the task is done
    hook:detach()
    uv.run("nowait")
    assert.is_true(t:done())
    assert.equal("slept", t:result())
  end)
end)

describe("examples/luv/server.lua", function()
  local host
  lazy_teardown(function()
    hosts.stop(host)
    require("warmbox.server").stop_local()
  end)

  it("serves one conversation: the counter cell gives 1, 2, 3", function()
    host = hosts.start("lua5.4 examples/luv/server.lua 0", "listening on 127%.0%.0%.1:(%d+)")
    local socket = require "socket"
    local c = assert(socket.connect("127.0.0.1", host.port))
    c:settimeout(120)
    local got = {}
    for _ = 1, 3 do
      assert(c:send(cjson.encode({ key = "luv-example:1", code = hosts.COUNTER }) .. "\n"))
      local line = assert(c:receive("*l"))
      local a = cjson.decode(line)
      assert.is_true(a.ok, line)
      got[#got + 1] = a.text
    end
    c:close()
    assert.same({ "1", "2", "3" }, got)
  end)
end)
