-- warmbox.lock: waiters are served in arrival order (memory and file
-- backends, coroutines of one process driven through the `wait` hook), a
-- lapsed ticket stops blocking the queue, and warmbox.sim.lock keeps the
-- lock object's interface.
local lock = require "warmbox.lock"
local core = require "warmbox.core"

local tmpdir = require("spec.helpers.lockdir").tmpdir

describe("warmbox.lock fairness", function()
  for _, backend in ipairs{ "memory", "file" } do
    describe("(" .. backend .. " backend)", function()
      local dir
      local n = 0
      local function key()
        n = n + 1
        return "fair" .. n .. "-" .. tostring({}):sub(-6)
      end
      local function new(o)
        o = o or {}
        o.backend, o.dir = backend, dir
        o.step = o.step or 0.001
        return lock.new(o)
      end
      before_each(function() dir = tmpdir() end)
      after_each(function()
        collectgarbage()
        if dir:match("^/tmp/") then os.execute("rm -rf '" .. dir .. "'") end
      end)

      -- A coroutine that waits for `k` (yielding between attempts), logs
      -- its name when it holds the lock, holds it for one resume, releases.
      local function waiter(k, name, log, o)
        return coroutine.create(function()
          o = o or {}
          o.timeout = o.timeout or 10
          o.wait = function() coroutine.yield() end
          local lk = new(o)
          local ok, err = lk:lock(k)
          log[#log + 1] = ok and name or (name .. ":" .. tostring(err))
          if ok then
            coroutine.yield()
            assert(lk:unlock())
          end
        end)
      end

      local function run_all(cos, order)
        for _ = 1, 100000 do
          local alive = false
          for _, i in ipairs(order) do
            if coroutine.status(cos[i]) ~= "dead" then
              assert(coroutine.resume(cos[i]))
              alive = true
            end
          end
          if not alive then return end
        end
        error("waiters did not finish")
      end

      it("serves waiters in arrival order, whatever order they are resumed in", function()
        local k = key()
        local holder = new()
        assert.truthy(holder:lock(k))
        local log = {}
        local cos = { waiter(k, "b", log), waiter(k, "c", log), waiter(k, "d", log) }
        for _, c in ipairs(cos) do assert(coroutine.resume(c)) end -- b, c, d take tickets in that order
        assert.is_true(holder:unlock())
        -- the former holder comes back at once: it queues behind them
        cos[4] = waiter(k, "a", log)
        assert(coroutine.resume(cos[4]))
        run_all(cos, { 4, 3, 2, 1 })
        assert.same({ "b", "c", "d", "a" }, log)
      end)

      it("try_lock does not jump the queue", function()
        local k = key()
        local holder = new()
        assert.truthy(holder:lock(k))
        local log = {}
        local b = waiter(k, "b", log)
        assert(coroutine.resume(b))
        holder:unlock()
        assert.same({ nil, "busy" }, { new():try_lock(k) })
        run_all({ b }, { 1 })
        assert.same({ "b" }, log)
        assert.is_true(new():try_lock(k))
      end)

      it("drops an abandoned waiter's ticket after ticket_ttl", function()
        local k = key()
        local holder = new()
        assert.truthy(holder:lock(k))
        local log = {}
        local o = { max_step = 0.01, ticket_ttl = 0.3 }
        local abandoned = waiter(k, "gone", log, o)
        assert(coroutine.resume(abandoned)) -- takes a ticket, never resumed again
        holder:unlock()
        local lk = new{ max_step = 0.01, ticket_ttl = 0.3, timeout = 10 }
        local t0 = core.now()
        assert.truthy(lk:lock(k))
        -- it had to wait for the abandoned ticket to lapse
        assert.is_true(core.now() - t0 >= 0.25)
        lk:unlock()
        assert.same({}, log)
      end)

      it("keeps the order of waiters with different ticket_ttl", function()
        local k = key()
        local holder = new()
        assert.truthy(holder:lock(k))
        local log = {}
        local cos = { waiter(k, "long", log, { ticket_ttl = 600 }), waiter(k, "short", log, { ticket_ttl = 2 }) }
        for _, c in ipairs(cos) do assert(coroutine.resume(c)) end
        holder:unlock()
        run_all(cos, { 2, 1 })
        assert.same({ "long", "short" }, log)
      end)

      it("a waiter that times out leaves the queue at once", function()
        local k = key()
        local holder = new()
        assert.truthy(holder:lock(k))
        assert.same({ nil, "timeout" }, { new{ timeout = 0.05 }:lock(k) })
        holder:unlock()
        assert.is_true(new():try_lock(k))
      end)
    end)
  end
end)

describe("warmbox.lock file queue", function()
  it("drops a ticket whose deadline is beyond twice its ttl (the clock was reset by a reboot)", function()
    local dir = tmpdir()
    local lk = lock.new{ backend = "file", dir = dir, timeout = 5 }
    assert.truthy(lk:lock("k")) -- makes the directory
    lk:unlock()
    local f = assert(io.open(dir .. "/" .. lock._file_name("k") .. "q", "w"))
    -- a ticket from before a reboot: 5 s ttl, deadline an uptime of ~11 days away
    f:write(string.format("warmbox-queue 1 8\n7 %d 5000 %s\n", math.floor(core.now() * 1000) + 1e9, ("ab"):rep(16)))
    f:close()
    assert.is_true(lock.new{ backend = "file", dir = dir }:try_lock("k"))
    os.execute("rm -rf '" .. dir .. "'")
  end)
end)

describe("warmbox.sim.lock", function()
  it("has every method of a warmbox.lock object, with the same idle answers", function()
    local lk = require("warmbox.sim.lock").factory()()
    local real = lock.new{ backend = "memory" }
    for name, fn in pairs(lock) do
      local module_fn = { new = true, wait = true, factory = true, failure = true, closing = true, default_dir = true,
                          stats = true, step_while_blocked = true }
      if type(fn) == "function" and not module_fn[name] and not name:match("^_") then
        assert.is_function(lk[name], name)
      end
    end
    assert.same({ real:keepalive() }, { lk:keepalive() })
    assert.same({ real:held() }, { lk:held() })
    assert.same({ real:unlock() }, { lk:unlock() })
    assert.same({ real:close() }, { lk:close() })
    assert.same({ real:remove() }, { lk:remove() })
    assert.truthy(lk:lock("k"))
    assert.is_true(lk:set_state("s"))
    assert.is_true(lk:remove())
    assert.truthy(lk:lock("k"))
    assert.is_nil(lk:get_state())
    assert.is_true(lk:keepalive())
    assert.is_true(lk:close())
    assert.is_true(lk:close())
    assert.is_nil(lk:key())
    do
      local scoped <close> = require("warmbox.sim.lock").factory()()
      assert.truthy(scoped:lock("k"))
    end
  end)
end)
