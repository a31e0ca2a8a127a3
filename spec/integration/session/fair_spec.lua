-- the unfairness case against a real warmboxd: one process runs
-- back-to-back 0.1 s cells on a session (until the others are done and 3
-- runs more, at most 10 s); three other processes
-- sharing the session key each get a run in within a few run times (their
-- lock wait is capped at 2 s), none gets BUSY. Once with the file lock, once
-- with the Redis lock (when redis-server is installed). And a silent cell
-- longer than the Redis lock's ttl keeps the session locked (the keeper
-- thread renews the key while the run sits in curl).
local wbd = require "spec.helpers.warmboxd"
local sessions = require "spec.helpers.sessions"
local redis_helper = require "spec.helpers.redis"
local core = require "warmbox.core"

local LOOP_SECONDS, OTHERS, OTHER_WAIT = 10, 3, 2

describe("sessions: a back-to-back runner does not starve others (warmboxd)", function()
  local env = sessions.new()
  local srv, redis_srv

  lazy_setup(function()
    srv = env:start()
    if redis_helper.available() then redis_srv = redis_helper.start() end
  end)
  lazy_teardown(function()
    if redis_srv then redis_srv:stop() end
    env:stop()
  end)

  local function script(lock_src, body)
    return string.format([[
      package.path = %q
      package.cpath = %q
      local core = require "warmbox.core"
      local warmbox = require "warmbox"
      local wb = assert(warmbox.new{ api_url = %q, sandbox_url = %q, api_key = %q,
        lock = %s, exec_timeout = 60, idle_timeout = 60 })
      local s = wb:session("fair:one")
    ]], package.path, package.cpath, srv.url, srv.url, srv.api_key, lock_src) .. body .. "\nwb:close()\n"
  end

  local function spawn(src, out)
    local p = assert(io.popen("lua5.4 -e " .. wbd.sh_quote(src) .. " >" .. out .. " 2>&1 & echo $!"))
    local pid = tonumber(p:read("l"))
    p:close()
    return pid
  end

  local function read(path) return wbd.read_all(path) or "" end

  local function contend(lock_src)
    local looper_out, ready, stop = os.tmpname(), os.tmpname(), os.tmpname()
    os.remove(ready)
    os.remove(stop)
    -- The looper stops 3 runs after the spec saw every other process end (or
    -- at LOOP_SECONDS, which fails the spec: the others did not get in).
    local looper = spawn(script(lock_src, string.format([[
      assert(s:run("x = 0"))
      io.open(%q, "w"):close()
      local t_end, n, after = core.now() + %d, 0, 0
      while core.now() < t_end and after < 3 do
        local r, err, code = s:run("import time\ntime.sleep(0.1)\nx += 1")
        if not r then print("looper failed", err, code) os.exit(1) end
        n = n + 1
        local f = io.open(%q)
        if f then f:close() after = after + 1 end
      end
      print("looper runs " .. n .. " after " .. after .. " ended " .. string.format("%%.3f", core.now()))
    ]], ready, LOOP_SECONDS, stop)), looper_out)
    assert.truthy(wbd.eventually(function() return io.open(ready) end, 60), read(looper_out))
    os.remove(ready)
    core.sleep(0.5) -- the looper is in its stride
    local outs, pids = {}, { looper }
    for i = 1, OTHERS do
      outs[i] = os.tmpname()
      pids[i + 1] = spawn(script(lock_src, [[
        local t0 = core.now()
        local r, err, code = s:run("import time\ntime.sleep(0.1)\n'other'")
        if not r then print("other failed", err, code) os.exit(1) end
        print(string.format("other ok %.3f ended %.3f", core.now() - t0, core.now()))
      ]]), outs[i])
    end
    local function all_done(list)
      for _, pid in ipairs(list) do
        if wbd.alive(pid) then return false end
      end
      return true
    end
    assert.truthy(wbd.eventually(function() return all_done{ table.unpack(pids, 2) } end, LOOP_SECONDS + 60))
    io.open(stop, "w"):close()
    assert.truthy(wbd.eventually(function() return all_done(pids) end, LOOP_SECONDS + 60))
    os.remove(stop)
    local looper_log = read(looper_out)
    os.remove(looper_out)
    local runs, after, looper_end = looper_log:match("looper runs (%d+) after (%d+) ended ([%d.]+)")
    assert.truthy(runs, looper_log)
    -- the looper kept going back to back until the others were done (and 3
    -- runs more), so the others had to get in between its runs
    assert.equal("3", after, looper_log)
    assert.truthy(tonumber(runs) > 3, looper_log)
    for i = 1, OTHERS do
      local log = read(outs[i])
      os.remove(outs[i])
      -- no BUSY: the run got in (its lock wait was capped at OTHER_WAIT s)
      local took, ended = log:match("other ok ([%d.]+) ended ([%d.]+)")
      assert.truthy(took, "process " .. i .. ": " .. log)
      assert.truthy(tonumber(ended) < tonumber(looper_end), "process " .. i .. " only got in after the looper stopped")
    end
  end

  it("with the file lock", function()
    contend(string.format("{ backend = 'file', dir = %q, timeout = %d }", env.lockdir, OTHER_WAIT))
  end)

  it("a silent cell 3x longer than the redis ttl keeps the session to itself", function()
    if not redis_srv then
      pending("redis-server is not installed")
      return
    end
    local lock_src = string.format("{ backend = 'redis', redis = { port = %d, prefix = 'silent:' }, ttl = 1, "
      .. "timeout = 30 }", redis_srv.port)
    local a_out, b_out, started = os.tmpname(), os.tmpname(), os.tmpname()
    os.remove(started)
    local warm = spawn(script(lock_src, 'assert(s:run("y = 1"))'), a_out)
    assert.truthy(wbd.eventually(function() return not wbd.alive(warm) end, 60))
    local a = spawn(script(lock_src, string.format([[
      io.open(%q, "w"):close()
      local r, err, code = s:run("import time\ntime.sleep(3)\ny = 2")
      if not r then print("a failed", err, code) os.exit(1) end
      print(string.format("a ended %%.3f", core.now()))
    ]], started)), a_out)
    assert.truthy(wbd.eventually(function() return io.open(started) end, 60), read(a_out))
    core.sleep(1.5) -- a's cell is running, past the 1 s ttl the key was set with
    assert.truthy(wbd.alive(a))
    local b = spawn(script(lock_src, [[
      local r, err, code = s:run("y")
      if not r then print("b failed", err, code) os.exit(1) end
      print(string.format("b saw %s started %.3f", r.results[1].text, core.now()))
    ]]), b_out)
    -- while a's cell runs, b waits in the lock's queue (without the keeper a's key
    -- would have lapsed and b would hold the lock, its execute queued in warmboxd)
    local r = assert(core.redis{ port = redis_srv.port })
    local queued_while_a_ran = wbd.eventually(function()
      local keys = r:command("KEYS", "silent:queue:*")
      return (keys[1] and r:command("ZCARD", keys[1]) == 1 and wbd.alive(a)) or not wbd.alive(a)
    end, 30) and wbd.alive(a)
    r:close()
    assert.truthy(queued_while_a_ran, "b was not waiting for the lock while a ran")
    assert.truthy(wbd.eventually(function() return not wbd.alive(a) and not wbd.alive(b) end, 60))
    local a_log, b_log = read(a_out), read(b_out)
    local a_end = tonumber(a_log:match("a ended ([%d.]+)"))
    local seen, b_end = b_log:match("b saw (%d+) started ([%d.]+)")
    assert.truthy(a_end, a_log)
    assert.truthy(seen, b_log)
    -- b ran after a's whole cell
    assert.equal("2", seen)
    assert.truthy(tonumber(b_end) > a_end)
    os.remove(a_out)
    os.remove(b_out)
    os.remove(started)
  end)

  it("with the redis lock", function()
    if not redis_srv then
      pending("redis-server is not installed")
      return
    end
    contend(string.format("{ backend = 'redis', redis = { port = %d, prefix = 'fair:' }, timeout = %d }",
      redis_srv.port, OTHER_WAIT))
  end)
end)
