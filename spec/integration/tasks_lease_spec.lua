-- The lease follows the idle window; a running cell keeps its own sandbox
-- alive (against a real warmboxd). With exec_timeout 300 and idle_timeout
-- 10, a run's lease is 10 s, and while a cell runs its watchdog extends it
-- (one connect per extension) before it would end, in a blocking call and in
-- a task alike: a 60 s cell is never paused underneath, and the sandbox
-- pauses within the idle window after the run. When every extension fails,
-- the run is interrupted before the lease ends and says why. Time is moved,
-- never slept: warmboxd's clock is frozen and moved by the spec, the
-- session's clock with it (each line the cell prints moves both by 1 s; in
-- the 60 s cells never past the lease's end less 2 s as warmboxd has it, so
-- the 60 s pass only as the watchdog extends the lease).
-- Warmboxd's pause_during_run stays 0 (checked by env:stop).
local sessions = require "spec.helpers.sessions"
local wbd = require "spec.helpers.warmboxd"
local session = require "warmbox.session"
local decide = require "warmbox.session.decide"

describe("the lease follows the idle window; the watchdog keeps a running cell's (warmboxd)", function()
  local env = sessions.new()
  local wb, frozen_at
  local moved = 0               -- both clocks' move since the freeze (every session's clock)

  lazy_setup(function()
    env:start()
    wb = env:warmbox{ exec_timeout = 300, idle_timeout = 10 }
    local frozen = assert(env.srv:admin("POST", "/clock", { freeze = true }).json)
    frozen_at = math.floor(wbd.utc(frozen.now))
  end)
  lazy_teardown(function() env:stop() end)

  -- A session of wb whose clock is warmboxd's frozen one, moved as it is
  -- (`moved`), logging its events (`connect+`: the watchdog's, `!`: failed).
  local function watched(key, log, o)
    o = o or {}
    local s
    s = session.new(key, { client = wb.client, lock = { backend = "file", dir = env.lockdir },
      exec_timeout = 300, idle_timeout = o.idle_timeout or 10, parallel = wb.parallel, origin = wb.origin,
      clock = function() return frozen_at + moved end,
      on_event = function(name, info)
        if name ~= "connect" and name ~= "extend" and name ~= "lease_failed" then return end
        log[#log + 1] = name .. (info.alongside and "+" or "") .. (info.ok == false and "!" or "")
        if os.getenv("DEBUG_WATCH") then log[#log] = log[#log] .. "@" .. moved end
        if name == "connect" and info.ok == false and o.on_failed_connect then o.on_failed_connect() end
      end })
    return s
  end

  -- Both clocks move on by `secs`.
  local function move(secs)
    moved = moved + secs
    env.srv:advance(secs)
  end

  -- A cell printing a line every 0.5 s (real), `n` lines, then 'done'. Each
  -- line moves the clocks by 1 s: the watchdog, which reads the clock every
  -- WATCH_POLL (0.5 s), sees at most a second or two pass between its reads
  -- (its margin is 5 s), as on a machine whose clock runs at its own pace.
  local function ticking(n)
    return ("import time\nfor i in range(%d):\n    print('tick', flush=True)\n    time.sleep(0.5)\n'done'"):format(n)
  end

  -- A cell printing a line every 0.5 s until /home/user/stop exists, then `tail`.
  local function until_stop(tail)
    return "import os, time\nwhile not os.path.exists('/home/user/stop'):\n"
      .. "    print('tick', flush=True)\n    time.sleep(0.5)\nos.remove('/home/user/stop')\n" .. tail
  end
  local UNTIL_STOP = until_stop("x + 1")

  -- The on_stdout of a cell of sandbox `id` that goes on until told: each line
  -- moves both clocks by 1 s, but never to within 1 s of the lease's end as
  -- warmboxd has it (the spec's time runs faster than the watchdog's polls on a
  -- loaded machine: only an extension lets time go on), until `secs` passed;
  -- then the cell is told to stop.
  local function steady_ticker(id, secs)
    local http = require "spec.helpers.http"
    local from, stopped, stalled = moved, false, 0
    return function(text)
      for _ in text:gmatch("tick") do
        -- (no extension for 240 lines, 2 min: stopped all the same, the spec fails on `moved`)
        if moved - from >= secs or stalled >= 240 then
          if not stopped then
            stopped = true
            local f = assert(io.open(env.srv:sandbox_home(id) .. "/stop", "w"))
            f:close()
          end
          return
        end
        local res = http.api(env.srv, "GET", "/sandboxes/" .. id)
        local end_at = res.status == 200 and wbd.utc(res.json.endAt) or 0
        if frozen_at + moved + 2 < end_at then
          move(1)
          stalled = 0
        else
          stalled = stalled + 1
        end
      end
    end
  end

  local function server_end(id)
    local info = assert(wb.client:info(id))
    return info.state, wbd.utc(info.end_at)
  end

  local function server_now()
    return wbd.utc(assert(env.srv:admin("GET", "/clock").json).now)
  end

  for _, how in ipairs({ "blocking", "task" }) do
    it(how .. ": a 60 s cell under a 10 s idle window is never paused underneath; the sandbox pauses "
      .. "within the idle window after it", function()
      local log = {}
      local s = watched("watch:" .. how, log)
      local first = assert(s:run("x = 41"))         -- created with a 10 s lease
      local id = first.sandbox_id
      local _, end0 = server_end(id)
      assert.is_true(end0 - server_now() <= 10, "the lease is the idle window, not the run's timeout")
      env:reset_stats()
      local moved0 = moved
      -- 60 s of the cell on the clocks: time goes on only as the watchdog extends the lease
      local opts = { on_stdout = steady_ticker(id, 60) }
      local r
      if how == "task" then
        local t = wb:spawn(function() return s:run(UNTIL_STOP, opts) end)
        assert(wb:loop())
        local rerr
        r, rerr = t:result()
        assert(r, tostring(rerr) .. ": " .. table.concat(log, " "))
      else
        r = assert(s:run(UNTIL_STOP, opts))
      end
      assert.equal("42", r.results[1].text)            -- the same kernel, never paused
      assert.is_nil(r.lease_error)
      assert.is_true(moved - moved0 >= 60)
      local st = env:stats()
      assert.equal(0, st.counters.pause_during_run or 0)
      -- one connect per extension: about one per (10 - WATCH_MARGIN's 5) s of the cell
      local connects = st.requests["POST /sandboxes/{id}/connect"] or 0
      assert.is_true(connects >= 60 / 10 and connects <= 60 / 2, connects .. " extensions")
      -- After the run: running, its lease ends within the idle window...
      local state, end_at = server_end(id)
      assert.equal("running", state)
      local left = end_at - server_now()
      assert.is_true(left > 0 and left <= 10, left .. " s left")
      -- ...and it pauses then: nothing keeps it running once the cell is over.
      move(left + 1)
      assert.equal("paused", (server_end(id)))
    end)
  end

  it("idle_timeout takes effect whatever exec_timeout is: 10, 30 and 60 s leases on a 300 s exec_timeout",
    function()
    for _, idle in ipairs({ 10, 30, 60 }) do
      local s = watched("watch:idle" .. idle, {}, { idle_timeout = idle })
      local id = assert(s:run("1")).sandbox_id
      local _, end_at = server_end(id)
      local left = end_at - server_now()
      assert.is_true(left <= idle and left > idle - 3, idle .. ": " .. left .. " s left")
    end
  end)

  it("a failing extension is retried while the cell runs, then holds", function()
    local log = {}
    local s = watched("watch:retry", log)
    local id = assert(s:run("0")).sandbox_id
    env:fault("POST /sandboxes/{id}/connect", { status = 503, count = 2 })
    env:reset_stats()
    local r = assert(s:run(until_stop("'ok'"), { on_stdout = steady_ticker(id, 12) }))
    assert.equal("ok", r.results[1].text)
    assert.is_nil(r.lease_error)
    -- two failed and at least one that held (the transport may retry a 503 itself)
    local n = env:stats().requests["POST /sandboxes/{id}/connect"]
    assert.is_true(n >= 3, n .. " connects")

  end)

  it("every extension failing: the run is interrupted before the lease ends, its result says why", function()
    local log = {}
    -- The cell's lines move both clocks up to the watchdog's first extension
    -- (the lease end less its margin); from then on each failed connect moves
    -- them by 1 s, so the retries reach the lease's end on the clocks (their
    -- real time, the transport's own retries included, moves neither).
    local s = watched("watch:fail", log, { on_failed_connect = function() move(1) end })
    local first = assert(s:run("x = 1"))
    local watch_at = decide.watch_at(s:state().lease_end, 10)
    env:fault("POST /sandboxes/{id}/connect", { status = 503, count = 100000 })
    env:reset_stats()
    local moved0 = moved
    local r, msg, code, detail = s:run(ticking(400) .. "\n'late'", { on_stdout = function(text)
      for _ in text:gmatch("tick") do
        if frozen_at + moved < watch_at then move(1) end
      end
    end })
    env.srv:clear_faults()
    assert.is_nil(r)
    assert.matches("interrupted: its lease could not be extended", msg)
    assert.equal("HTTP", code)
    assert.is_true(detail.interrupted)
    assert.same("HTTP", detail.lease_error[2])
    assert.truthy(table.concat(log, " "):find("lease_failed", 1, true))
    assert.is_true(moved - moved0 < 20, "interrupted once the lease ran short, not at the cell's end: "
      .. (moved - moved0))
    assert.equal(0, (env:stats().counters or {}).pause_during_run or 0)
    -- Cleared: the next run works on the same sandbox (resumed if it paused since).
    local r2 = assert(s:run("x"))
    assert.equal(first.sandbox_id, r2.sandbox_id)
    assert.equal("1", r2.results[1].text)
  end)

  it("a paused sandbox is resumed with the idle window's lease, never the 5-minute auto-resume one", function()
    local log = {}
    local s = watched("watch:paused", log)
    local id = assert(s:run("x = 41")).sandbox_id
    move(11)                                       -- the lease ended: warmboxd paused it
    assert.equal("paused", (server_end(id)))
    env:reset_stats()
    local r = assert(s:run("x + 1"))
    assert.equal("42", r.results[1].text)
    assert.is_true(r.resumed)
    assert.equal(1, env:route("POST /sandboxes/{id}/connect"))
    local _, end_at = server_end(id)
    assert.is_true(end_at - server_now() <= 10, "resumed for the idle window")
    assert.is_true(decide.AUTO_RESUME_LEASE > 10)
  end)
end)

describe("one request per warm run, warmbox.new{} defaults (warmboxd)", function()
  local env = sessions.new()

  lazy_setup(function() env:start() end)
  lazy_teardown(function() env:stop() end)

  it("20 warm runs one second apart send 20 executes and at most one other request", function()
    local moved = 0
    -- warmbox.new's defaults; only the clock is the spec's (os.time moved on, not slept)
    local wb = env:warmbox{ clock = function() return os.time() + moved end }
    local s = wb:session("count:warm")
    assert(s:run("x = 0"))                        -- the first run creates the sandbox
    env:reset_stats()
    for i = 1, 20 do
      moved = moved + 1
      local r = assert(s:run("x = " .. i))
      assert.is_false(r.resumed)
    end
    local st = env:stats()
    assert.equal(20, st.requests["interp POST /execute"])
    assert.is_true(st.total_requests <= 21, st.total_requests .. " requests for 20 warm runs")
  end)
end)
