-- warmbox.core.redis and warmbox.lock's redis backend against a real
-- redis-server on a free loopback port.
local redis_helper = require "spec.helpers.redis"
local lock = require "warmbox.lock"
local core = require "warmbox.core"

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local describe_redis = redis_helper.available() and describe or pending

describe_redis("redis", function()
  local srv, r

  lazy_setup(function()
    srv = redis_helper.start()
    r = assert(core.redis{ host = srv.host, port = srv.port, timeout = 5 })
  end)
  lazy_teardown(function()
    if r then r:close() end
    if srv then srv:stop() end
  end)

  local n = 0
  local function key()
    n = n + 1
    return "key-" .. n .. "/ü\0" .. tostring({}):sub(-6)
  end

  describe("core.redis", function()
    it("maps replies to Lua values, binary-safe", function()
      assert.equal("OK", r:command("SET", "bin\0key", "a\0b\r\nc"))
      assert.equal("a\0b\r\nc", r:command("GET", "bin\0key"))
      assert.is_nil(r:command("GET", "missing"))
      assert.equal(3, r:command("RPUSH", "list", "x", 12, 1.5))
      assert.same({ "x", "12", "1.5" }, r:command("LRANGE", "list", 0, -1))
      assert.same({ "a\0b\r\nc", false }, r:command("MGET", "bin\0key", "missing"))
      assert.equal(1, r:command("DEL", "list"))
      assert.equal("PONG", r:command("PING"))
    end)

    it("returns nil, msg, 'REDIS' for an error reply", function()
      local ok, err, code = r:command("NOSUCHCOMMAND", "x")
      assert.is_nil(ok)
      assert.matches("unknown command", err)
      assert.equal("REDIS", code)
      -- the connection is still usable
      assert.equal("PONG", r:command("PING"))
    end)

    it("returns nil, msg, 'TRANSPORT' when it cannot connect", function()
      local c, err, code = core.redis{ host = "127.0.0.1", port = 1, timeout = 1 }
      assert.is_nil(c)
      assert.matches("refused", err)
      assert.equal("TRANSPORT", code)
    end)

    it("reconnects after its connection was dropped", function()
      local c = assert(core.redis{ host = srv.host, port = srv.port })
      local id = c:command("CLIENT", "ID")
      assert.equal(1, r:command("CLIENT", "KILL", "ID", id))
      local ok, _, code = c:command("PING")
      if ok == nil then
        assert.equal("TRANSPORT", code)
        ok = c:command("PING")
      end
      assert.equal("PONG", ok)
      c:close()
    end)

    it("raises on misuse and after close", function()
      assert.has_error(function() core.redis{ hots = "x" } end,
        "bad argument #1 to 'redis' (unknown option 'hots')")
      assert.has_error(function() core.redis{ port = "x" } end)
      local c = assert(core.redis{ host = srv.host, port = srv.port })
      assert.has_error(function() c:command({}) end)
      assert.matches("^warmbox%.Redis: 0x", tostring(c))
      assert.is_true(c:close())
      assert.is_true(c:close())
      assert.equal("warmbox.Redis (closed)", tostring(c))
      assert.has_error(function() c:command("PING") end, "attempt to use a closed warmbox.Redis")
    end)
  end)

  describe("warmbox.lock (redis backend)", function()
    local function new(o)
      o = o or {}
      o.backend = "redis"
      o.redis = { host = srv.host, port = srv.port, prefix = "t:" }
      o.timeout = o.timeout or 0.2
      o.step = 0.005
      return lock.new(o)
    end

    it("excludes a second holder, then hands over with the state", function()
      local k = key()
      local a, b = new(), new{ timeout = 0.05 }
      assert.truthy(a:lock(k))
      assert.same({ nil, "busy" }, { b:try_lock(k) })
      assert.same({ nil, "timeout" }, { b:lock(k) })
      assert.is_nil(a:get_state())
      assert.is_true(a:set_state("sandbox\0state"))
      assert.equal("sandbox\0state", a:get_state())
      assert.is_true(a:unlock())
      assert.same({ nil, "unlocked" }, { a:unlock() })
      assert.truthy(b:lock(k))
      assert.equal("sandbox\0state", b:get_state())
      assert.is_true(b:set_state(nil))
      assert.is_nil(b:get_state())
      b:unlock()
      assert.is_nil(r:command("GET", "t:lock:" .. k))
    end)

    it("waits for a lock that expires in redis (exptime of a dead holder)", function()
      local k = key()
      assert.equal("OK", r:command("SET", "t:lock:" .. k, "dead-holder", "PX", 200))
      local a = new{ timeout = 10 }
      local elapsed = assert(a:lock(k))
      assert.is_true(elapsed > 0.05)
      local pttl = r:command("PTTL", "t:lock:" .. k)
      assert.is_true(pttl > 1000)
      a:unlock()
    end)

    it("sets PX from exptime and :expire() extends it", function()
      local k = key()
      local a = new{ exptime = 5 }
      assert.truthy(a:lock(k))
      local pttl = r:command("PTTL", "t:lock:" .. k)
      assert.is_true(pttl > 0 and pttl <= 5000)
      assert.is_true(a:expire(120))
      assert.is_true(r:command("PTTL", "t:lock:" .. k) > 100000)
      a:unlock()
    end)

    it("never releases or touches someone else's lock (compare-and-delete)", function()
      local k = key()
      local a = new()
      assert.truthy(a:lock(k))
      -- a's lock expired and another host took it
      assert.equal("OK", r:command("SET", "t:lock:" .. k, "intruder"))
      assert.same({ nil, "expired" }, { a:expire(60) })
      assert.same({ nil, "expired" }, { a:set_state("late") })
      assert.same({ nil, "expired" }, { a:unlock() })
      assert.equal("intruder", r:command("GET", "t:lock:" .. k))
      assert.is_nil(r:command("GET", "t:state:" .. k))
      r:command("DEL", "t:lock:" .. k)
    end)

    it("returns nil, msg, 'TRANSPORT' when redis is unreachable", function()
      local lk = lock.new{ backend = "redis", redis = { host = "127.0.0.1", port = 1, timeout = 1 }, timeout = 0 }
      local ok, err, code = lk:lock("k")
      assert.is_nil(ok)
      assert.matches("refused", err)
      assert.equal("TRANSPORT", code)
    end)

    it("serializes 4 processes x 25 iterations", function()
      local work = os.tmpname()
      os.remove(work)
      assert(os.execute("mkdir -p " .. q(work)))
      local child = work .. "/child.lua"
      local f = assert(io.open(child, "w"))
      f:write([[
local port, log, m = ...
local lock = require "warmbox.lock"
local core = require "warmbox.core"
local lk = lock.new{ backend = "redis", redis = { port = tonumber(port), prefix = "p:" },
                     timeout = 120, step = 0.001, max_step = 0.01 }
for i = 1, tonumber(m) do
  assert(lk:lock("shared"))
  local g = assert(io.open(log, "a")); g:write("enter ", core.getpid(), "\n"); g:close()
  core.sleep(0.001)
  g = assert(io.open(log, "a")); g:write("exit ", core.getpid(), "\n"); g:close()
  assert(lk:unlock())
end
]])
      f:close()
      local log = work .. "/log"
      local env = "LUA_PATH=" .. q(package.path) .. " LUA_PATH_5_4=" .. q(package.path)
      .. " LUA_CPATH=" .. q(package.cpath) .. " LUA_CPATH_5_4=" .. q(package.cpath)
      local cmd = {}
      for i = 1, 4 do
        cmd[i] = string.format("%s lua5.4 %s %d %s 25 >>%s 2>&1 &", env, q(child), srv.port, q(log), q(work .. "/out"))
      end
      assert(os.execute(table.concat(cmd, " ") .. " wait"))
      local lines = {}
      for l in io.open(log):lines() do lines[#lines + 1] = l end
      local out = io.open(work .. "/out"):read("a")
      assert.equal(200, #lines, out)
      for i = 1, #lines, 2 do
        local p1 = lines[i]:match("^enter (%d+)$")
        local p2 = lines[i + 1]:match("^exit (%d+)$")
        assert.truthy(p1, lines[i])
        assert.equal(p1, p2)
      end
      os.execute("rm -rf " .. q(work))
    end)
  end)
end)
