-- warmbox.lock: semantics of the memory and file backends within one process.
local lock = require "warmbox.lock"
local core = require "warmbox.core"

local lockdir = require "spec.helpers.lockdir"
local tmpdir, rmrf = lockdir.tmpdir, lockdir.rmrf

local function ls(dir)
  local p = io.popen("ls -A '" .. dir .. "' 2>/dev/null")
  local t = {}
  for l in p:lines() do t[#t + 1] = l end
  p:close()
  table.sort(t)
  return t
end

describe("warmbox.lock", function()
  describe(".new()", function()
    it("raises on misuse", function()
      assert.has_error(function() lock.new("file") end, "bad argument #1 to 'new' (table expected, got string)")
      assert.has_error(function() lock.new{ bogus = 1 } end, "bad argument #1 to 'new' (unknown option 'bogus')")
      assert.has_error(function() lock.new{ timeout = "1" } end,
        "bad argument #1 to 'new' (option 'timeout': number expected, got string)")
      assert.has_error(function() lock.new{ backend = "etcd" } end, "bad argument #1 to 'new' (unknown backend 'etcd')")
      assert.has_error(function() lock.new{ redis = { hots = "x" } } end,
        "bad argument #1 to 'new' (unknown option 'redis.hots')")
      assert.has_error(function() lock.new{ exptime = 0 } end,
        "bad argument #1 to 'new' (option 'exptime': a number > 0 and finite expected)")
      assert.has_error(function() lock.new{ exptime = math.huge } end,
        "bad argument #1 to 'new' (option 'exptime': a number > 0 and finite expected)")
      assert.has_error(function() lock.new{ timeout = 0 / 0 } end,
        "bad argument #1 to 'new' (option 'timeout': a number >= 0 and finite expected)")
      assert.has_error(function() lock.new{ ratio = 0.5 } end,
        "bad argument #1 to 'new' (option 'ratio': a number >= 1 and finite expected)")
      assert.has_error(function() lock.new{ ttl = 0 } end,
        "bad argument #1 to 'new' (option 'ttl': a number in [0.05, 86400] expected)")
      assert.has_error(function() lock.new{ ticket_ttl = 0.5 } end,
        "bad argument #1 to 'new' (option 'ticket_ttl': a number in [2 x max_step, 86400] expected)")
      assert.has_error(function() lock.new{ keeper = 1 } end,
        "bad argument #1 to 'new' (option 'keeper': boolean expected, got number)")
      assert.has_error(function() lock.new{ backend = "memory" }:lock(42) end,
        "bad argument #1 to 'lock' (string expected, got number)")
      assert.has_error(function() lock.new{ backend = "memory" }:set_state(1) end,
        "bad argument #1 to 'set_state' (string or nil expected, got number)")
    end)

    it("does not mutate the caller's options", function()
      local o = { backend = "memory", timeout = 1 }
      lock.new(o)
      assert.same({ backend = "memory", timeout = 1 }, o)
    end)
  end)

  for _, backend in ipairs{ "memory", "file" } do
    describe("(" .. backend .. " backend)", function()
      local dir
      local n = 0
      local function key()
        n = n + 1
        return "k" .. n .. "-" .. tostring(os.time()) .. tostring({}):sub(-6)
      end
      local function new(o)
        o = o or {}
        o.backend, o.dir = backend, dir
        o.timeout = o.timeout or 0.2
        o.step = o.step or 0.005
        return lock.new(o)
      end
      before_each(function() dir = tmpdir() end)
      after_each(function()
        collectgarbage()
        rmrf(dir)
      end)

      describe(":fence()", function()
        it("grows with every hold of a key, also across lock objects and a takeover past exptime", function()
          local k = key()
          local a = new()
          assert.is_nil(a:fence())
          assert.truthy(a:lock(k))
          local f1 = a:fence()
          assert.is_true(math.type(f1) == "integer" and f1 >= os.time() * 1000 - 5000)
          assert.is_true(a:unlock())
          assert.is_nil(a:fence())
          local b = new{ exptime = 0.05 }
          assert.truthy(b:lock(k))
          local f2 = b:fence()
          assert.is_true(f2 > f1)
          require("warmbox.core").sleep(0.1)
          local c = new()
          assert.truthy(c:lock(k))            -- b overran its exptime: taken over
          assert.is_true(c:fence() > f2)
          assert.is_nil(b:fence())
          c:close()
        end)
      end)

      describe(":lock()", function()
        it("returns the seconds waited", function()
          local lk = new()
          local elapsed, err = lk:lock(key())
          assert.is_nil(err)
          assert.is_number(elapsed)
          assert.is_true(elapsed >= 0)
          assert.is_true(lk:unlock())
        end)

        it("returns nil, 'timeout' when held elsewhere", function()
          local k = key()
          local a, b = new(), new{ timeout = 0.05 }
          assert.truthy(a:lock(k))
          local ok, err = b:lock(k)
          assert.is_nil(ok)
          assert.equal("timeout", err)
          assert.is_true(a:unlock())
          assert.truthy(b:lock(k))
          assert.is_true(b:unlock())
        end)

        it("returns nil, 'locked' when this object already holds a lock", function()
          local a = new()
          assert.truthy(a:lock(key()))
          assert.same({ nil, "locked" }, { a:lock(key()) })
          assert.same({ nil, "locked" }, { a:try_lock(key()) })
          a:unlock()
        end)

        it("lets different keys proceed independently", function()
          local a, b = new(), new()
          assert.truthy(a:lock(key()))
          assert.truthy(b:lock(key()))
          a:unlock()
          b:unlock()
        end)

        it("with timeout 0 makes one attempt", function()
          local k = key()
          local a, b = new(), new{ timeout = 0 }
          assert.truthy(a:lock(k))
          assert.same({ nil, "timeout" }, { b:lock(k) })
          a:unlock()
          assert.truthy(b:lock(k))
          b:unlock()
        end)
      end)

      describe(":try_lock()", function()
        it("returns nil, 'busy' when held and true when free", function()
          local k = key()
          local a, b = new(), new()
          assert.is_true(a:try_lock(k))
          assert.same({ nil, "busy" }, { b:try_lock(k) })
          a:unlock()
          assert.is_true(b:try_lock(k))
          b:unlock()
        end)
      end)

      describe(":unlock()", function()
        it("returns nil, 'unlocked' when nothing is held", function()
          local a = new()
          assert.same({ nil, "unlocked" }, { a:unlock() })
          assert.truthy(a:lock(key()))
          assert.is_true(a:unlock())
          assert.same({ nil, "unlocked" }, { a:unlock() })
        end)
      end)

      describe("state", function()
        it("is readable and writable only while held, and shared between holders", function()
          local k = key()
          local a, b = new(), new()
          assert.same({ nil, "unlocked" }, { a:get_state() })
          assert.same({ nil, "unlocked" }, { a:set_state("x") })
          assert.truthy(a:lock(k))
          assert.is_nil(a:get_state())
          assert.is_true(a:set_state("sandbox=abc\0lease=12\n"))
          assert.equal("sandbox=abc\0lease=12\n", a:get_state())
          a:unlock()
          assert.truthy(b:lock(k))
          assert.equal("sandbox=abc\0lease=12\n", b:get_state())
          assert.is_true(b:set_state(nil))
          assert.is_nil(b:get_state())
          b:unlock()
          assert.truthy(a:lock(k))
          assert.is_nil(a:get_state())
          a:unlock()
        end)

        it("is per key", function()
          local k1, k2 = key(), key()
          local a = new()
          assert.truthy(a:lock(k1))
          a:set_state("one")
          a:unlock()
          assert.truthy(a:lock(k2))
          assert.is_nil(a:get_state())
          a:unlock()
        end)
      end)

      describe("<close>", function()
        it("unlocks when the block is left by an error", function()
          local k = key()
          local ok = pcall(function()
            local lk <close> = new()
            assert(lk:lock(k))
            error("boom")
          end)
          assert.is_false(ok)
          local b = new{ timeout = 0 }
          assert.truthy(b:lock(k))
          b:unlock()
        end)

        it("and collection unlock an abandoned lock", function()
          local k = key()
          do
            local lk = new()
            assert(lk:lock(k))
          end
          collectgarbage()
          collectgarbage()
          local b = new{ timeout = 0 }
          assert.truthy(b:lock(k))
          b:unlock()
        end)
      end)

      describe("exptime", function()
        it("lets another holder take over a lock held past it; the old holder gets 'expired'", function()
          local k = key()
          local a, b = new{ exptime = 0.05 }, new{ timeout = 5 }
          assert.truthy(a:lock(k))
          a:set_state("kept")
          local elapsed = assert(b:lock(k))
          assert.is_true(elapsed > 0)
          assert.equal("kept", b:get_state())
          assert.same({ nil, "expired", "LOCK" }, { a:set_state("late") })
          assert.same({ nil, "unlocked" }, { a:unlock() })
          assert.equal("kept", b:get_state())
          -- b still holds it
          assert.same({ nil, "busy" }, { new():try_lock(k) })
          assert.is_true(b:unlock())
          assert.is_true(new():try_lock(k))
        end)

        it(":expire() extends the lock", function()
          local k = key()
          local a, b = new{ exptime = 0.05 }, new{ timeout = 0.1 }
          assert.truthy(a:lock(k))
          assert.truthy(a:expire(60))
          assert.same({ nil, "timeout" }, { b:lock(k) })
          assert.is_true(a:unlock())
          assert.same({ nil, "unlocked" }, { a:expire() })
        end)
      end)

      describe("coroutines", function()
        it("serialize with a custom wait and interleave correctly", function()
          local k = key()
          local log, active, max_active = {}, 0, 0
          local function worker(name)
            return coroutine.create(function()
              local lk = new{ timeout = 10, wait = function() coroutine.yield() end }
              for i = 1, 3 do
                assert(lk:lock(k))
                active = active + 1
                if active > max_active then max_active = active end
                log[#log + 1] = name .. i .. "+"
                for _ = 1, 3 do coroutine.yield() end -- "work" while holding it
                log[#log + 1] = name .. i .. "-"
                active = active - 1
                assert(lk:unlock())
                coroutine.yield()
              end
            end)
          end
          local cos = { worker("a"), worker("b"), worker("c") }
          local alive = #cos
          local rounds = 0
          while alive > 0 and rounds < 10000 do
            rounds = rounds + 1
            alive = 0
            for _, c in ipairs(cos) do
              if coroutine.status(c) ~= "dead" then
                assert(coroutine.resume(c))
                alive = alive + 1
              end
            end
          end
          assert.equal(0, alive)
          assert.equal(1, max_active)
          assert.equal(18, #log)
          for i = 1, #log, 2 do
            assert.equal(log[i]:sub(1, -2), log[i + 1]:sub(1, -2))
          end
          -- they really interleaved: not all of a before b
          local firsts = {}
          for i = 1, 6, 2 do firsts[log[i]:sub(1, 1)] = true end
          assert.is_true(firsts.a and (firsts.b or firsts.c) and true or false)
        end)

        it("never yields into the caller's coroutine by default: the wait blocks", function()
          local k = key()
          local a = new()
          assert.truthy(a:lock(k))
          local c = coroutine.create(function()
            local b = new{ timeout = 0.15 }
            local t0 = core.now()
            local ok, err = b:lock(k)
            return ok, err, core.now() - t0
          end)
          -- one resume runs the whole wait: no yield reached us
          local resumed, ok, err, waited = coroutine.resume(c)
          assert.is_true(resumed)
          assert.equal("dead", coroutine.status(c))
          assert.is_nil(ok)
          assert.equal("timeout", err)
          assert.is_true(waited >= 0.15)
          a:unlock()
        end)

        it("waits through lock.wait, the scheduler hook, when no wait is given", function()
          local k = key()
          local a = new()
          assert.truthy(a:lock(k))
          local saved, calls = lock.wait, 0
          lock.wait = function(s)
            calls = calls + 1
            assert.is_true(s > 0)
            if calls == 3 then a:unlock() end
          end
          local ok, err = pcall(function() return assert(new{ timeout = 5 }:lock(k)) end)
          lock.wait = saved
          assert.is_true(ok, err)
          assert.equal(3, calls)
        end)
      end)

      describe(":close() and :keepalive()", function()
        it("close releases, is idempotent, and keepalive reports whether it is held", function()
          local k = key()
          local a = new()
          assert.is_true(a:close())
          assert.same({ nil, "unlocked" }, { a:keepalive() })
          assert.truthy(a:lock(k))
          assert.is_true(a:keepalive())
          assert.is_true(a:keepalive())
          assert.same({ nil, "busy" }, { new():try_lock(k) })
          assert.is_true(a:close())
          assert.is_true(a:close())
          assert.same({ nil, "unlocked" }, { a:keepalive() })
          local b = new()
          assert.is_true(b:try_lock(k))
          b:close()
        end)

        it("keepalive reports 'expired' once the lock was taken over", function()
          local k = key()
          local a, b = new{ exptime = 0.05 }, new{ timeout = 5 }
          assert.truthy(a:lock(k))
          assert.truthy(b:lock(k))
          assert.same({ nil, "expired", "LOCK" }, { a:keepalive() })
          b:close()
        end)
      end)
    end)
  end

  describe(":remove()", function()
    local dir
    before_each(function() dir = tmpdir() end)
    after_each(function() rmrf(dir) end)

    it("(file) releases the lock and leaves no file of the key; the next locker starts afresh", function()
      local lk = lock.new{ backend = "file", dir = dir, timeout = 1 }
      assert(lk:lock("ws:gone"))
      assert.is_true(lk:set_state("remembered"))
      local other = lock.new{ backend = "file", dir = dir, timeout = 0 }
      assert(other:lock("ws:kept"))
      assert.same({ ".break", "ws%3Agone.lock", "ws%3Agone.lockq", "ws%3Akept.lock", "ws%3Akept.lockq" }, ls(dir))
      assert.is_true(lk:remove())
      assert.same({ ".break", "ws%3Akept.lock", "ws%3Akept.lockq" }, ls(dir))
      assert.is_nil(lk:key())
      assert.same({ nil, "unlocked" }, { lk:remove() })
      -- the key works as before, with no state
      local again = lock.new{ backend = "file", dir = dir, timeout = 1 }
      assert(again:lock("ws:gone"))
      assert.is_nil(again:get_state())
      assert.is_true(again:unlock())
      assert.is_true(other:unlock())
    end)

    it("(file) is safe against a locker that opened the old file: it retries on the fresh one", function()
      local lk = lock.new{ backend = "file", dir = dir, timeout = 1 }
      assert(lk:lock("k"))
      -- another process's view: the old inode opened, its flock waited for
      local old = assert(core.flock_open(dir .. "/k.lock"))
      assert.is_true(lk:remove())
      assert.is_true(old:try_lock())
      assert.is_true(old:stale()) -- what a locker checks (under the break lock) before it writes
      old:close()
      local b = lock.new{ backend = "file", dir = dir, timeout = 1 }
      assert(b:lock("k"))
      assert.is_true(b:set_state("fresh"))
      assert.is_true(b:unlock())
    end)

    it("(memory) forgets the state", function()
      local lk = lock.new{ backend = "memory" }
      assert(lk:lock("m:gone"))
      assert.is_true(lk:set_state("s"))
      assert.is_true(lk:remove())
      assert(lk:lock("m:gone"))
      assert.is_nil(lk:get_state())
      assert.is_true(lk:unlock())
    end)
  end)

  describe("(redis backend) in a core built without hiredis", function()
    it("says the Redis lock is not built, for lock and try_lock", function()
      local redis_new = core.redis
      core.redis = nil -- what csrc/core/optional/redis_none.c leaves (WARMBOX_REDIS=OFF)
      local ok, a, b = pcall(function()
        -- a port no other spec uses: no connection of theirs is cached for it
        local lk = lock.new{ backend = "redis", timeout = 1, redis = { port = 1 } }
        local r1, m1, c1 = lk:lock("k")
        local r2, m2, c2 = lk:try_lock("k")
        return { r1, m1, c1 }, { r2, m2, c2 }
      end)
      core.redis = redis_new
      assert(ok, a)
      for _, r in ipairs({ a, b }) do
        assert.is_nil(r[1])
        assert.matches("the redis lock is not built: warmbox.core was built without hiredis", r[2], 1, true)
        assert.equals("LOCK", r[3])
      end
    end)
  end)

  describe("(file backend) keys", function()
    local dir
    before_each(function() dir = tmpdir() .. "/nested/dir" end)
    after_each(function()
      collectgarbage()
      rmrf(dir:match("^(.*)/nested/dir$"))
    end)

    it("creates the directory and maps hostile keys to distinct files inside it", function()
      local keys = { "../../x", "a/b", "a%2Fb", "a%2fb", ".", "..", "", "/", "ws:thread",
                     ("k"):rep(2000), ("k"):rep(1999) .. "j", "Ünïcödé ✓", "Ünïcödé ✓ ",
                     "a\nb", "a b", "A", "a", "x.lock", "x%2Elock" }
      local held = {}
      for i, k in ipairs(keys) do
        held[i] = lock.new{ backend = "file", dir = dir, timeout = 0 }
        assert.is_true(held[i]:try_lock(k), "key #" .. i)
        assert.is_true(held[i]:set_state("state " .. i))
      end
      local files = ls(dir)
      -- one file and one queue file per key plus the break lock, all directly inside dir
      assert.equal(2 * #keys + 1, #files)
      for _, f in ipairs(files) do
        assert.is_nil(f:find("/", 1, true))
        assert.truthy(#f <= 255)
      end
      for i, k in ipairs(keys) do
        assert.equal("state " .. i, held[i]:get_state())
        assert.same({ nil, "busy" }, { lock.new{ backend = "file", dir = dir }:try_lock(k) })
        held[i]:unlock()
      end
      -- nothing escaped: the parent of dir holds only dir
      assert.same({ "dir" }, ls(dir:match("^(.*)/dir$")))
    end)

    it("returns nil, msg, 'IO' when the directory cannot be made", function()
      local lk = lock.new{ backend = "file", dir = "/proc/warmbox-nope", timeout = 0 }
      local ok, err, code = lk:lock("k")
      assert.is_nil(ok)
      assert.matches("lock directory: cannot use directory '/proc/warmbox-nope'", err, 1, true)
      assert.equal("IO", code)
    end)
  end)

  describe("warmbox.core Flock", function()
    local dir
    before_each(function()
      dir = tmpdir()
      os.execute("mkdir -p '" .. dir .. "'")
    end)
    after_each(function() rmrf(dir) end)

    it("follows the handle lifecycle", function()
      local fl = assert(core.flock_open(dir .. "/f"))
      assert.matches("^warmbox%.Flock: 0x", tostring(fl))
      assert.is_true(fl:close())
      assert.is_true(fl:close())
      assert.equal("warmbox.Flock (closed)", tostring(fl))
      assert.has_error(function() fl:lock(0) end, "attempt to use a closed warmbox.Flock")
      local ok, err, code = core.flock_open(dir .. "/no/such/dir")
      assert.is_nil(ok)
      assert.matches("No such file", err)
      assert.equal("IO", code)
    end)

    it("excludes a second handle in the same process, reads and writes, and notices removal", function()
      local a = assert(core.flock_open(dir .. "/f"))
      local b = assert(core.flock_open(dir .. "/f"))
      assert.is_true(a:lock(1))
      assert.same({ nil, "busy" }, { b:try_lock() })
      assert.same({ nil, "timeout" }, { b:lock(0.02) })
      assert.is_true(a:write("hello\0world"))
      assert.equal("hello\0world", b:read())
      assert.is_true(a:write("x"))
      assert.equal("x", b:read())
      assert.is_false(a:stale())
      os.remove(dir .. "/f")
      assert.is_true(a:stale())
      assert.is_true(a:unlock())
      assert.is_true(b:try_lock())
      do local c <close> = b; assert(c) end
      assert.equal("warmbox.Flock (closed)", tostring(b))
      a:close()
    end)

    it("shared locks coexist and exclude an exclusive one", function()
      local a = assert(core.flock_open(dir .. "/f"))
      local b = assert(core.flock_open(dir .. "/f"))
      local c = assert(core.flock_open(dir .. "/f"))
      assert.is_true(a:try_lock(true))
      assert.is_true(b:try_lock(true))
      assert.same({ nil, "busy" }, { c:try_lock() })
      a:close()
      b:close()
      assert.is_true(c:try_lock())
      c:close()
    end)
  end)
end)

describe("warmbox.lock as a resource", function()
  it("factory: one maker of lock objects from every spec a caller may give", function()
    local made = lock.factory("memory", { timeout = 7, exptime = 9 })()
    assert.equal("memory", made.backend)
    assert.equal(7, made.timeout)
    assert.equal(9, made.exptime)
    assert.equal(1, lock.factory({ backend = "memory", timeout = 1 }, { timeout = 7 })().timeout)
    local fn = function() return made end
    assert.equal(fn, lock.factory(fn))
    local got
    local module = { new = function(o) got = o return made end }
    assert.equal(made, lock.factory(module, nil, { x = 1 })())
    assert.same({ x = 1 }, got)
    assert.has_error(function() lock.factory(42, nil, nil, "run") end,
      "bad argument #1 to 'run' (option 'lock': string, table or function expected, got number)")
    -- options are checked when the factory is made, not at the first lock
    assert.has_error(function() lock.factory({ backend = "nfs" }) end,
      "bad argument #1 to 'new' (unknown backend 'nfs')")
  end)

  it("failure: timeout is BUSY, anything else LOCK", function()
    assert.same({ nil, "session 'k' is busy (another run holds it)", "BUSY" },
      { lock.failure("session 'k'", "timeout") })
    assert.same({ nil, "cannot lock session 'k': connection refused", "LOCK" },
      { lock.failure("session 'k'", "connection refused") })
  end)

  it("closing: <close> releases a warmbox lock, and a plain object through its close", function()
    local lk = lock.new{ backend = "memory", timeout = 0 }
    do
      local guard <close> = lock.closing(lk) -- luacheck: ignore 211
      assert.truthy(lk:lock("res-1"))
    end
    assert.is_nil(lk:key())
    assert.truthy(lock.new{ backend = "memory", timeout = 0 }:lock("res-1"))
    local closed = 0
    local plain = { close = function() closed = closed + 1 end }
    do
      local guard <close> = lock.closing(plain) -- luacheck: ignore 211
    end
    assert.equal(1, closed)
    do
      local guard <close> = lock.closing({}) -- luacheck: ignore 211 (no close at all: nothing to call)
    end
  end)
end)
