-- Behaviour 11 against a real warmboxd: one run at a time per session across
-- processes; different keys do not wait for each other; a dead holder's lock
-- is released.
local wbd = require "spec.helpers.warmboxd"
local sessions = require "spec.helpers.sessions"
local lock = require "warmbox.lock"

local PROCS, RUNS = 4, 5

describe("sessions: serialization (warmboxd)", function()
  local env = sessions.new()
  local srv, lockdir, wb, wb_busy

  local function stats() return env:stats() end
  local function script(body, lock_src)
    lock_src = lock_src or string.format("{ backend = 'file', dir = %q, timeout = 300 }", lockdir)
    return string.format([[
      package.path = %q
      package.cpath = %q
      local warmbox = require "warmbox"
      local wb = assert(warmbox.new{ api_url = %q, sandbox_url = %q, api_key = %q,
        lock = %s, exec_timeout = 60, idle_timeout = 60 })
    ]], package.path, package.cpath, srv.url, srv.url, srv.api_key, lock_src) .. body .. "\nwb:close()\n"
  end

  -- Runs `procs` processes of `runs` runs each on one key; returns the values of
  -- n they saw and the sandbox ids they used.
  local function contend(key, procs, runs, lock_src)
    local body = string.format([[
      local s = wb:session(%q)
      for i = 1, %d do
        local r, err, code = s:run("import time\nn = globals().get('n', 0)\ntime.sleep(0.05)\nn = n + 1\nn")
        if not r then io.stderr:write(tostring(err), " ", tostring(code), "\n") os.exit(1) end
        io.write(r.sandbox_id, " ", r.results[1].text, "\n")
      end
    ]], key, runs)
    local outs, pipes = {}, {}
    for p = 1, procs do
      outs[p] = os.tmpname()
      pipes[p] = io.popen("lua5.4 -e " .. wbd.sh_quote(script(body, lock_src)) .. " >" .. outs[p] .. " 2>&1; echo $?")
    end
    local ids, counts = {}, {}
    for p = 1, procs do
      local status = pipes[p]:read("a")
      pipes[p]:close()
      local f = io.open(outs[p])
      local out = f:read("a")
      f:close()
      os.remove(outs[p])
      assert.equal("0\n", status, out)
      local lines = 0
      for id, n in out:gmatch("(%S+) (%d+)\n") do
        ids[id] = true
        counts[#counts + 1] = tonumber(n)
        lines = lines + 1
      end
      assert.equal(runs, lines, out)
    end
    table.sort(counts)
    local nids = 0
    for _ in pairs(ids) do nids = nids + 1 end
    return counts, nids
  end

  lazy_setup(function()
    srv = env:start()
    lockdir = env.lockdir
    wb = env:warmbox{ lock = { backend = "file", dir = lockdir, timeout = 5 }, exec_timeout = 60, idle_timeout = 60 }
    -- For the runs that meet a held lock: BUSY after 0.5 s of waiting.
    wb_busy = env:warmbox{ lock = { backend = "file", dir = lockdir, timeout = 0.5 }, exec_timeout = 60,
      idle_timeout = 60 }
  end)
  lazy_teardown(function() env:stop() end)

  it(PROCS .. " processes x " .. RUNS .. " runs on one key: no overlap, every run completes, one sandbox", function()
    local key = "serial:one"
    local counts, nids = contend(key, PROCS, RUNS)
    -- every run saw its own value of n: none ran concurrently in the kernel
    local want = {}
    for i = 1, PROCS * RUNS do want[i] = i end
    assert.same(want, counts)
    assert.equal(1, nids)
    local st = stats()
    assert.equal(0, st.counters.exec_overlap or 0)
    assert.equal(0, st.counters.kill_during_run or 0)
    assert.equal(0, st.counters.pause_during_run or 0)
    local tv = wb:session(key).tag_value
    local items = assert(wb.client:list_all{ metadata = { warmboxSessionId = tv } })
    assert.equal(1, #items)
  end)

  local redis_helper = require "spec.helpers.redis"
  local it_redis = redis_helper.available() and it or pending
  it_redis("serializes across hosts through Redis (" .. PROCS .. " processes sharing only Redis)", function()
    local rsrv = redis_helper.start()
    local ok, err = pcall(function()
      local lock_src = string.format("{ backend = 'redis', redis = { host = %q, port = %d }, timeout = 300 }",
        rsrv.host, rsrv.port)
      local counts, nids = contend("serial:redis", PROCS, 3, lock_src)
      local want = {}
      for i = 1, PROCS * 3 do want[i] = i end
      assert.same(want, counts)
      assert.equal(1, nids)
      assert.equal(0, stats().counters.exec_overlap or 0)
    end)
    rsrv:stop()
    assert(ok, err)
  end)

  it("lets a run on another key proceed while a key is held", function()
    local held = wb_busy:session("serial:held")
    local other = wb_busy:session("serial:other")
    local lk = lock.new{ backend = "file", dir = lockdir }
    assert(lk:lock(held.tag_value))
    local r, err, code = held:run("1")
    assert.is_nil(r)
    assert.matches("busy", err)
    assert.equal("BUSY", code)
    local r2 = assert(other:run("1 + 1"))
    assert.equal("2", r2.results[1].text)
    lk:unlock()
    assert(held:run("1"))
  end)

  it("gets the lock back when its holder dies", function()
    local s = wb_busy:session("serial:dies")
    local ready = os.tmpname()
    local holder = string.format([[
      package.path = %q
      package.cpath = %q
      local lk = require("warmbox.lock").new{ backend = "file", dir = %q }
      assert(lk:lock(%q))
      local f = io.open(%q, "w") f:write("held") f:close()
      require("warmbox.core").sleep(120)
    ]], package.path, package.cpath, lockdir, s.tag_value, ready)
    os.remove(ready)
    local p = io.popen("lua5.4 -e " .. wbd.sh_quote(holder) .. " >/dev/null 2>&1 & echo $!")
    local pid = tonumber(p:read("l"))
    p:close()
    for _ = 1, 200 do
      local f = io.open(ready)
      if f then f:close() break end
      wbd.sleep(0.05)
    end
    local r, _, code = s:run("1")
    assert.is_nil(r)
    assert.equal("BUSY", code)
    os.execute("kill -KILL " .. pid)
    for _ = 1, 100 do
      if not require("warmbox.server").alive(pid) then break end
      wbd.sleep(0.05)
    end
    os.remove(ready)
    assert(s:run("1"))
  end)
end)
