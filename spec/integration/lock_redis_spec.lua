-- warmbox.core.redis and warmbox.lock's redis backend against a real
-- redis-server on a free loopback port.
local redis_helper = require "spec.helpers.redis"
local lock = require "warmbox.lock"
local core = require "warmbox.core"
local ha = require "spec.helpers.redis_ha"

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

    it("authenticates as an ACL user (or with a password alone) and selects the database", function()
      assert.equal("OK", r:command("ACL", "SETUSER", "wbapp", "on", ">s3cret", "~*", "+@all"))
      local c = assert(core.redis{ host = srv.host, port = srv.port, username = "wbapp", password = "s3cret", db = 3 })
      assert.equal("wbapp", c:command("ACL", "WHOAMI"))
      assert.equal("OK", c:command("SET", "in-db-3", "x"))
      assert.is_nil(r:command("GET", "in-db-3"))
      assert.equal("OK", r:command("SELECT", 3))
      assert.equal("x", r:command("GET", "in-db-3"))
      assert.equal("OK", r:command("SELECT", 0))
      c:close()
      local bad, err, code = core.redis{ host = srv.host, port = srv.port, username = "wbapp", password = "wrong" }
      assert.is_nil(bad)
      assert.matches("AUTH", err)
      assert.equal("TRANSPORT", code)
      -- the lock, its keeper thread included, as that user
      local lk = lock.new{ backend = "redis", redis = { host = srv.host, port = srv.port, prefix = "acl:" },
        username = "wbapp", password = "s3cret", db = 3, ttl = 0.3 }
      assert.truthy(lk:lock("k"))
      core.sleep(0.5) -- the keeper refreshed the key past its ttl
      assert.is_true(lk:held())
      assert.is_true(lk:unlock())
      assert.equal(1, r:command("ACL", "DELUSER", "wbapp"))
    end)

    it("refuses bad topology options", function()
      assert.has_error(function() core.redis{ master = "m" } end,
        "bad argument #1 to 'redis' (option 'master' needs 'sentinels')")
      assert.has_error(function() core.redis{ sentinels = { "h:1" } } end,
        "bad argument #1 to 'redis' (option 'sentinels' needs 'master')")
      assert.has_error(function() core.redis{ nodes = { "nope" } } end,
        "bad argument #1 to 'redis' (option 'nodes': \"host:port\" expected at 1)")
      assert.has_error(function() core.redis{ username = "u" } end,
        "bad argument #1 to 'redis' (option 'username' needs 'password')")
      assert.has_error(function() lock.new{ backend = "redis", nodes = { "127.0.0.1:1" }, db = 2 } end)
      assert.has_error(function() lock.new{ backend = "redis", url = "redis-cluster://a:1/x{y}" } end)
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
end)

for _, kind in ipairs(ha.kinds()) do
  describe("warmbox.lock (redis backend, " .. kind .. ")", function()
    local t
    lazy_setup(function() t = ha.start(kind) end)
    lazy_teardown(function() if t then t:stop() end end)

    local n = 0
    local function key()
      n = n + 1
      return "key-" .. n .. "/ü\0" .. tostring({}):sub(-6)
    end
    -- a command routed like the lock's (by k's hash tag); the lock's name of `what` for k
    local function R(k, ...) return t:call(k, ...) end
    local function N(what, k, prefix) return t:name(prefix or "t:", what, k) end
    local function ropts(prefix, extra)
      local o = t:opts(prefix)
      for kk, v in pairs(extra or {}) do o[kk] = v end
      return o
    end

    local function new(o)
      o = o or {}
      o.backend = "redis"
      o.redis = ropts("t:")
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
      assert.is_nil(R(k, "GET", N("lock", k)))
    end)

    it("waits for a lock that expires in redis (exptime of a dead holder)", function()
      local k = key()
      assert.equal("OK", R(k, "SET", N("lock", k), "dead-holder", "PX", 200))
      local a = new{ timeout = 10 }
      local elapsed = assert(a:lock(k))
      assert.is_true(elapsed > 0.05)
      local pttl = R(k, "PTTL", N("lock", k))
      assert.is_true(pttl > 1000)
      a:unlock()
    end)

    it("sets PX from ttl and keeps it alive from a thread across a long blocking call", function()
      local k = key()
      local a = new{ ttl = 0.3 }
      assert.truthy(a:lock(k))
      local token = R(k, "GET", N("lock", k))
      local pttl = R(k, "PTTL", N("lock", k))
      assert.is_true(pttl > 0 and pttl <= 300)
      core.sleep(1.2) -- four ttls inside C, no Lua runs: only the keeper refreshes
      assert.equal(token, R(k, "GET", N("lock", k)))
      assert.same({ nil, "busy" }, { new():try_lock(k) })
      assert.is_true(a:keepalive())
      assert.is_true(a:unlock())
      assert.is_nil(R(k, "GET", N("lock", k)))
    end)

    it("stops refreshing at exptime; :expire() moves that limit", function()
      local k = key()
      local a = new{ ttl = 0.2, exptime = 0.5 }
      assert.truthy(a:lock(k))
      core.sleep(1)
      assert.is_nil(R(k, "GET", N("lock", k)))
      assert.same({ nil, "expired (held past exptime)", "LOCK" }, { a:keepalive() })
      assert.truthy(new():lock(k)) -- collected (and so unlocked) below
      collectgarbage()
      local b = new{ ttl = 0.2, exptime = 0.5, timeout = 2 }
      assert.truthy(b:lock(k))
      assert.is_true(b:expire(60))
      core.sleep(1)
      assert.truthy(R(k, "GET", N("lock", k)))
      assert.is_true(b:keepalive())
      assert.is_true(b:unlock())
    end)

    it("with keeper = false, keepalive refreshes the key at most every ttl/3", function()
      local k = key()
      local a = new{ ttl = 0.3, keeper = false }
      assert.truthy(a:lock(k))
      for _ = 1, 20 do
        assert.is_true(a:keepalive())
        core.sleep(0.05)
      end
      -- 1 s later, still ours
      assert.truthy(R(k, "GET", N("lock", k)))
      -- not refreshed: gone within ttl
      core.sleep(0.5)
      assert.is_nil(R(k, "GET", N("lock", k)))
      assert.same({ nil, "expired", "LOCK" }, { a:keepalive() })
      assert.same({ nil, "expired", "LOCK" }, { a:unlock() })
    end)

    -- (Not on Sentinel: a primary paused past down-after-milliseconds is failed
    -- over, and the keeper goes on with the new primary: see the failover specs.)
    local it_paused = kind == "sentinel" and function() end or it

    it_paused("keepalive reports a keeper that cannot reach redis for a whole ttl", function()
      local k = key()
      local a = lock.new{ backend = "redis", redis = ropts("t:", { timeout = 0.2 }),
        ttl = 0.6, timeout = 0.2 }
      assert.truthy(a:lock(k))
      assert.is_true(a:keepalive())
      assert.equal("OK", t:on_primary(k, "CLIENT", "PAUSE", 2000, "WRITE"))
      local t0 = core.now()
      local ok, err, code
      repeat
        ok, err, code = a:keepalive()
        core.sleep(0.05)
      until not ok or core.now() - t0 > 1.8
      assert.is_nil(ok)
      assert.equal("TRANSPORT", code)
      assert.matches("it may have expired", err, 1, true)
      a:close()
      core.sleep(math.max(0, 2.1 - (core.now() - t0)))
    end)

    it("warmbox doctor checks it (and says what is wrong)", function()
      local doctor = require "warmbox.doctor"
      local checks = doctor.redis(t:opts("doc:"))
      assert.matches(kind, checks[1].detail, 1, true)
      for _, c in ipairs(checks) do assert.are_not.equal("fail", c.status, c.name .. ": " .. tostring(c.detail)) end
      local bad = t:opts("doc:")
      if kind == "sentinel" then bad.master = "no-such-master"
      elseif kind == "cluster" then bad.nodes = { "127.0.0.1:1" }
      else bad.port = 1 end
      local failed = false
      for _, c in ipairs(doctor.redis(bad)) do failed = failed or c.status == "fail" or c.status == "warn" end
      assert.is_true(failed)
    end)

    it("hands out a fencing number that grows with every hold, never below the server's clock in us", function()
      local k = key()
      local a, b = new(), new()
      assert.truthy(a:lock(k))
      local f1 = a:fence()
      assert.is_true(math.type(f1) == "integer" and f1 >= (os.time() - 5) * 1000000)
      assert.is_true(a:unlock())
      assert.truthy(b:try_lock(k))
      assert.is_true(b:fence() > f1)
      local f2 = b:fence()
      assert.is_true(b:unlock())
      -- the count lost (a flushed key): it starts again from the clock
      assert.equal(1, R(k, "DEL", N("fence", k)))
      assert.truthy(a:lock(k))
      assert.is_true(a:fence() > f2)
      a:close()
    end)

    it("never hands out a lower fence when the counter lost its last increments (a failover's new primary)",
      function()
        local k = key()
        local a = new()
        assert.truthy(a:lock(k))
        local f1 = a:fence()
        assert.is_true(a:unlock())
        -- what a replica that missed the last 1000 increments would hold
        assert.equal("OK", R(k, "SET", N("fence", k), f1 - 1000))
        assert.truthy(a:lock(k))
        assert.is_true(a:fence() > f1, a:fence() - f1)
        a:close()
      end)

    it("takes again a lock whose acquire reply was lost (the key already holds the ticket)", function()
      local k = key()
      local a = new{ timeout = 1 }
      -- the acquire ran, its reply never came: the key holds the waiter's ticket
      local ticket = "lost-reply-ticket"
      assert.equal("OK", R(k, "SET", N("lock", k), ticket, "PX", 60000))
      local e = { token = ticket, expires = core.now() + 60, pkey = "x", next_check = 0 }
      local got = assert(require("warmbox.lock.redis").acquire(a, k, e, nil, "wait", false))
      assert.truthy(got.fence)
      if got.keeper then got.keeper:stop() end
      assert.equal(1, R(k, "DEL", N("lock", k)))
    end)

    it("held() asks the primary: a lock key lost (as in a failover) is seen at once", function()
      local k = key()
      local a = new()
      assert.truthy(a:lock(k))
      assert.is_true(a:held())
      assert.equal(1, R(k, "DEL", N("lock", k)))
      assert.is_true(a:keepalive()) -- the keeper has not looked yet
      assert.same({ nil, "expired", "LOCK" }, { a:held() })
      a:close()
    end)

    it("retries an unlock whose connection dropped", function()
      local k = key()
      local a = new()
      assert.truthy(a:lock(k))
      assert.truthy(t:on_primary(k, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes") >= 1)
      assert.is_true(a:unlock())
      assert.is_nil(R(k, "GET", N("lock", k)))
    end)

    it_paused("reports an unlock that keeps failing; the key then frees itself within ttl", function()
      local k = key()
      local a = lock.new{ backend = "redis", redis = ropts("t:", { timeout = 0.2 }),
        ttl = 1, timeout = 0.2 }
      assert.truthy(a:lock(k))
      assert.equal("OK", t:on_primary(k, "CLIENT", "PAUSE", 1500, "WRITE"))
      local ok, err, code = a:unlock()
      assert.is_nil(ok)
      assert.equal("TRANSPORT", code, err)
      assert.matches("after 3 tries; the lock expires by itself within 1 s", err, 1, true)
      -- no keeper any more: the key lapses once the pause is over
      local b = new{ timeout = 5 }
      assert.truthy(b:lock(k))
      b:unlock()
    end)

    it("frees the key within ttl when its holder is killed or stopped", function()
      for _, sig in ipairs{ "KILL", "STOP" } do
        local k = key():gsub("%z", "")
        local work = os.tmpname()
        local f = assert(io.open(work, "w"))
        f:write(string.format([[
local lock = require "warmbox.lock"
local lk = lock.new{ backend = "redis", redis = %s, ttl = 1 }
assert(lk:lock(%q))
io.open(%q, "a"):write("held\n"):close()
require("warmbox.core").sleep(600)
]], t:lua_opts("t:"), k, work .. ".held"))
        f:close()
        local env = "LUA_PATH=" .. q(package.path) .. " LUA_CPATH=" .. q(package.cpath)
        local p = assert(io.popen(env .. " lua5.4 " .. q(work) .. " >/dev/null 2>&1 & echo $!"))
        local pid = tonumber(p:read("l"))
        p:close()
        local deadline = core.now() + 30
        while not io.open(work .. ".held") and core.now() < deadline do core.sleep(0.02) end
        assert.same({ nil, "busy" }, { new():try_lock(k) })
        os.execute("kill -" .. sig .. " " .. pid)
        -- far below the 600 s exptime: the keeper died (or stopped) with its process
        local b = new{ timeout = 5 }
        assert.truthy(b:lock(k), sig)
        b:unlock()
        os.execute("kill -KILL " .. pid .. "; kill -CONT " .. pid .. " 2>/dev/null")
        os.remove(work)
        os.remove(work .. ".held")
      end
    end)

    it("returns nil, msg, 'TRANSPORT' when redis is unreachable", function()
      local lk = lock.new{ backend = "redis", redis = { host = "127.0.0.1", port = 1, timeout = 1 }, timeout = 0 }
      local ok, err, code = lk:lock("k")
      assert.is_nil(ok)
      assert.matches("refused", err)
      assert.equal("TRANSPORT", code)
    end)

    it("serves processes in arrival order, and 3 get in while a fourth locks back to back", function()
      local work = os.tmpname()
      os.remove(work)
      assert(os.execute("mkdir -p " .. q(work)))
      local child = work .. "/child.lua"
      local f = assert(io.open(child, "w"))
      f:write("local ROPTS = " .. t:lua_opts("f:") .. "\n" .. [[
local port, mode, log, name, a = ...
local lock = require "warmbox.lock"
local core = require "warmbox.core"
local lk = lock.new{ backend = "redis", redis = ROPTS,
                     timeout = tonumber(a) or 60 }
if mode == "want" then
  local ok, err = lk:lock("fair")
  local g = assert(io.open(log, "a"))
  g:write(ok and ("got " .. name) or ("fail " .. name .. " " .. err), "\n")
  g:close()
  if ok then core.sleep(0.05); assert(lk:unlock()) end
else -- looper: back-to-back lock / 20 ms / unlock for `a` seconds
  local t_end, n = core.now() + tonumber(a), 0
  while core.now() < t_end do
    assert(lk:lock("fair")); core.sleep(0.02); assert(lk:unlock()); n = n + 1
  end
  local g = assert(io.open(log, "w")); g:write(n); g:close()
end
]])
      f:close()
      local env = "LUA_PATH=" .. q(package.path) .. " LUA_CPATH=" .. q(package.cpath)
      local function spawn(...)
        local args = {}
        for i, a in ipairs{ ... } do args[i] = q(a) end
        local p = assert(io.popen(string.format("%s lua5.4 %s %d %s >>%s 2>&1 & echo $!", env, q(child), 0,
          table.concat(args, " "), q(work .. "/out"))))
        local pid = tonumber(p:read("l"))
        p:close()
        return pid
      end
      local function wait_for(pred)
        local deadline = core.now() + 30
        while not pred() and core.now() < deadline do core.sleep(0.01) end
        return pred()
      end
      local function all_done(pids)
        return wait_for(function()
          for _, pid in ipairs(pids) do if os.execute("kill -0 " .. pid .. " 2>/dev/null") then return false end end
          return true
        end)
      end
      local function read(path)
        local h = io.open(path)
        if not h then return "" end
        local s = h:read("a")
        h:close()
        return s
      end
      -- arrival order
      local holder = lock.new{ backend = "redis", redis = ropts("f:") }
      assert.truthy(holder:lock("fair"))
      local log, pids = work .. "/log", {}
      for i = 1, 3 do
        pids[i] = spawn("want", log, "w" .. i)
        assert.is_true(wait_for(function() return R("fair", "ZCARD", N("queue", "fair", "f:")) == i end))
      end
      assert.is_true(holder:unlock())
      assert.truthy(holder:lock("fair"))
      local g = assert(io.open(log, "a")); g:write("got holder\n"); g:close()
      holder:unlock()
      assert.is_true(all_done(pids), read(work .. "/out"))
      assert.equal("got w1\ngot w2\ngot w3\ngot holder\n", read(log))
      assert.equal(0, R("fair", "ZCARD", N("queue", "fair", "f:")))
      -- a back-to-back locker does not starve 3 others (each may wait 2 s, the looper runs 4 s)
      local looper = spawn("looper", work .. "/n", "l", 4)
      core.sleep(0.3)
      local log2 = work .. "/log2"
      pids = {}
      for i = 1, 3 do pids[i] = spawn("want", log2, "w" .. i, 2) end
      pids[4] = looper
      assert.is_true(all_done(pids), read(work .. "/out"))
      local got = {}
      for l in read(log2):gmatch("[^\n]+") do got[#got + 1] = l end
      table.sort(got)
      assert.same({ "got w1", "got w2", "got w3" }, got)
      assert.truthy(tonumber(read(work .. "/n")) > 10)
      os.execute("rm -rf " .. q(work))
    end)

    it("drops an abandoned waiter's ticket after ticket_ttl; a timed-out waiter leaves at once", function()
      local k = key()
      local holder = new()
      assert.truthy(holder:lock(k))
      assert.same({ nil, "timeout" }, { new{ timeout = 0.05 }:lock(k) })
      assert.equal(0, R(k, "ZCARD", N("queue", k)))
      local abandoned = coroutine.create(function()
        new{ timeout = 60, max_step = 0.01, ticket_ttl = 0.5, wait = function() coroutine.yield() end }:lock(k)
      end)
      assert(coroutine.resume(abandoned)) -- it took a ticket and is never resumed
      assert.equal(1, R(k, "ZCARD", N("queue", k)))
      holder:unlock()
      assert.same({ nil, "busy" }, { new():try_lock(k) }) -- the head is the abandoned ticket
      local t0 = core.now()
      local b = new{ timeout = 10 }
      assert.truthy(b:lock(k))
      assert.is_true(core.now() - t0 >= 0.3)
      assert.equal(0, R(k, "ZCARD", N("queue", k)))
      b:unlock()
    end)

    it("serializes 4 processes x 25 iterations", function()
      local work = os.tmpname()
      os.remove(work)
      assert(os.execute("mkdir -p " .. q(work)))
      local child = work .. "/child.lua"
      local f = assert(io.open(child, "w"))
      f:write("local ROPTS = " .. t:lua_opts("p:") .. "\n" .. [[
local port, log, m = ...
local lock = require "warmbox.lock"
local core = require "warmbox.core"
local lk = lock.new{ backend = "redis", redis = ROPTS,
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
        cmd[i] = string.format("%s lua5.4 %s %d %s 25 >>%s 2>&1 &", env, q(child), 0, q(log), q(work .. "/out"))
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
end
