-- s:prewarm against a real warmboxd that takes 1 s to resume a
-- sandbox and 0.5 s to create one (`--resume-ms 1000 --create-ms 500`): the
-- work a run would do on the user's critical path (resume, create, kernel
-- start) is done before the run comes, under the session's lock, and the run
-- that follows is one round trip. Every assertion is on the requests warmboxd
-- saw (its /_warmboxd/stats) and on the session's events, never on timing.
local sessions = require "spec.helpers.sessions"
local wbd = require "spec.helpers.warmboxd"
local session = require "warmbox.session"
local core = require "warmbox.core"

describe("s:prewarm (warmboxd --resume-ms 1000 --create-ms 500)", function()
  local env = sessions.new()
  local wb

  lazy_setup(function()
    env:start{ args = { "--resume-ms", "1000", "--create-ms", "500" } }
    wb = env:warmbox{}
  end)
  lazy_teardown(function() env:stop() end)

  -- A session of wb (its client, lock dir, runner and counters) that logs
  -- its events: "prewarm:resumed", "connect+" (alongside), "connect!" (failed)...
  -- every run's own events, left out of the logs below
  local RUN_EVENTS = { lock_wait = true, lease = true, reuse = true, resume = true, run_start = true,
    outputs = true, run_end = true }
  local function logged(key, log, o)
    o = o or {}
    return session.new(key, { client = wb.client, lock = { backend = "file", dir = env.lockdir },
      exec_timeout = o.exec_timeout or 300, idle_timeout = o.idle_timeout or 300,
      parallel = wb.parallel, origin = wb.origin, clock = o.clock, counters = wb.counters,
      runner = wb.runner,
      on_event = function(name, info)
        if RUN_EVENTS[name] then return end
        local e = name .. (info.action and (":" .. info.action) or "") .. (info.alongside and "+" or "")
          .. (info.ok == false and "!" or "") .. (name == "connect" and info.resumed and "(resumed)" or "")
        log[#log + 1] = e
        if o.infos then o.infos[#o.infos + 1] = { name = name, info = info } end
      end })
  end

  -- A paused sandbox whose lease ended (autoResume set at creation), as E2B
  -- leaves it between turns: paused by hand while the session's clock jumps
  -- past the lease end. Also returns advance(s), which moves that clock on.
  local function paused_session(key, log, o)
    local now = os.time()
    o = o or {}
    o.clock = function() return now end
    local s = logged(key, log, o)
    local first = assert(s:run("x = 41"))
    assert(wb.client:pause(first.sandbox_id))
    now = now + 300 + 60
    for i = #log, 1, -1 do log[i] = nil end
    return s, first.sandbox_id, function(secs) now = now + secs end
  end

  -- Waits until warmboxd has the sandbox running again (the prewarm's resume
  -- done there), asking through a client of its own: nothing calls wb.
  local function until_running(id)
    local c = require("warmbox.e2b").new{ api_url = env.srv.url, sandbox_url = env.srv.url,
      api_key = env.srv.api_key }
    local ok = wbd.eventually(function()
      local info = c:info(id)
      return info and info.state == "running"
    end, 30)
    c:close()
    assert.truthy(ok, "sandbox " .. id .. " did not resume")
  end

  local function after(log, mark)
    local out, seen = {}, false
    for _, e in ipairs(log) do
      if seen then out[#out + 1] = e end
      if e == mark then seen = true end
    end
    return out
  end

  it("a paused session prewarmed from blocking code: the connect leaves at once, the run after the resume "
    .. "is one round trip and resumes nothing", function()
    local log = {}
    local s, id, advance = paused_session("pw:paused-blocking", log)
    env:reset_stats()
    local waits = wb:stats().prewarm_waits
    local p = s:prewarm()
    assert.is_false(p:done())              -- returned at once: the resume takes 1 s
    until_running(id)                      -- the model thinks; nothing calls wb
    -- The session's clock too: 2 s on, the prewarm's lease (the 300 s idle
    -- window) still has half of it left, so the run needs no other request.
    advance(2)
    -- The resume was asked for during s:prewarm itself.
    assert.equal(1, env:route("POST /sandboxes/{id}/connect"))
    local r = assert(s:run("x + 1"))       -- finishes the prewarm first, then runs
    assert.equal("42", r.results[1].text)
    assert.equal(id, r.sandbox_id)
    assert.is_false(r.resumed)
    local info = assert(p:result())
    assert.equal("resumed", info.action)
    assert.equal(waits + 1, wb:stats().prewarm_waits)
    -- The run's own path: the execute alone (one round trip, one request).
    assert.same({}, after(log, "prewarm:resumed"))
    local st = env:stats()
    assert.equal(1, st.requests["POST /sandboxes/{id}/connect"])
    assert.equal(1, st.requests["interp POST /execute"])
    assert.equal(0, st.requests["GET /v2/sandboxes"] or 0)
    assert.equal(0, st.requests["POST /sandboxes"] or 0)
  end)

  it("a paused session prewarmed in a task: the run after the resume is one round trip, no resume", function()
    local log = {}
    local s, id, advance = paused_session("pw:paused-task", log)
    env:reset_stats()
    local on_path
    local t = wb:spawn(function()
      local p = s:prewarm()
      for _ = 1, 600 do                    -- the model thinks: the prewarm ends meanwhile
        if p:done() then break end
        wb.runner.sched:sleep(0.05)
      end
      advance(2)                           -- as in the blocking case
      assert.is_true(p:done())
      assert.equal("resumed", (p:result()).action)
      on_path = env:stats()                -- what the prewarm cost, off the run's path
      return s:run("x + 1")
    end)
    assert(wb:loop())
    local r = assert(t:result())
    assert.equal("42", r.results[1].text)
    assert.equal(id, r.sandbox_id)
    assert.is_false(r.resumed)
    assert.equal(1, on_path.requests["POST /sandboxes/{id}/connect"])
    assert.equal(0, on_path.requests["interp POST /execute"] or 0)
    local st = env:stats()
    assert.equal(1, st.requests["interp POST /execute"])
    assert.equal(0, st.requests["POST /sandboxes/{id}/connect"] - on_path.requests["POST /sandboxes/{id}/connect"])
    assert.same({}, after(log, "prewarm:resumed"))
  end)

  it("without a prewarm the same run is resumed on its path (the second the prewarm hides)", function()
    local log = {}
    local s, id = paused_session("pw:paused-none", log)
    local r = assert(s:run("x + 1"))
    assert.equal(id, r.sandbox_id)
    assert.is_true(r.resumed)              -- the execute itself resumed it (1 s on warmboxd)
  end)

  it("a new conversation prewarmed: sandbox and kernel are ready, no create on the run's path", function()
    local log = {}
    local moved = 0
    local s = logged("pw:new", log, { clock = function() return os.time() + moved end })
    env:reset_stats()
    local p = s:prewarm()
    assert(wb:loop())
    local info = assert(p:result())
    assert.equal("created", info.action)
    local st = env:stats()
    assert.equal(1, st.requests["POST /sandboxes"])
    -- the kernel was started and given its output hook by a cell of its own
    assert.equal(1, st.requests["interp POST /execute"])
    -- The run comes in a later second (the session's clock, os.time moved on), as
    -- a turn does: the prewarm's lease (the 300 s idle window) still has half of
    -- it left, so the run sends its execute alone.
    moved = s:state().lease_end - 300 + 1 - os.time()
    env:reset_stats()
    local r = assert(s:run("6 * 7"))
    assert.equal("42", r.results[1].text)
    assert.equal(info.sandbox_id, r.sandbox_id)
    assert.is_true(r.reused)
    st = env:stats()
    assert.equal(0, st.requests["POST /sandboxes"] or 0)
    assert.equal(0, st.requests["GET /v2/sandboxes"] or 0)
    assert.equal(1, st.requests["interp POST /execute"])   -- the user's cell alone
    assert.same({ "create", "prewarm:created" }, log)
  end)

  it("a warm session: no request at all", function()
    local log = {}
    -- exec_timeout 60, idle_timeout 300: the lease (300 s) covers `within` (60 s).
    local moved = 0
    local s = logged("pw:warm", log, { exec_timeout = 60, clock = function() return os.time() + moved end })
    assert(s:run("1"))
    env:reset_stats()
    local before = wb:stats()
    local p = s:prewarm()
    assert.is_true(p:done())               -- nothing to wait for: done inside the call
    assert.equal("warm", (p:result()).action)
    assert.equal(0, env:total())
    assert.equal(before.prewarm_warm + 1, wb:stats().prewarm_warm)
    -- Less than half the lease left (151 s on): the lease is extended now (one connect).
    moved = 151
    local p2 = s:prewarm{ within = 600 }
    assert(wb:loop())
    assert.equal("extended", (p2:result()).action)
    assert.equal(1, env:total())
    assert.equal(1, env:route("POST /sandboxes/{id}/connect"))
  end)

  it("a failed prewarm is silent for the host, seen by on_event and counted; the run does the work", function()
    local log, infos = {}, {}
    local s, id = paused_session("pw:fail", log, { infos = infos })
    env:fault("POST /sandboxes/{id}/connect", { status = 500, count = 1 })
    local failed = wb:stats().prewarm_failed
    local p = s:prewarm()
    assert(wb:loop())
    local ok, msg, code = p:result()
    assert.is_nil(ok)
    assert.equal("HTTP", code)
    assert.truthy(msg)
    assert.equal(failed + 1, wb:stats().prewarm_failed)
    assert.equal(failed + 1, s:stats().prewarm_failed)
    local ev = infos[#infos]
    assert.equal("prewarm", ev.name)
    assert.is_false(ev.info.ok)
    assert.equal("HTTP", ev.info.code)
    -- The run goes as without a prewarm: the execute resumes the sandbox.
    local r = assert(s:run("x + 1"))
    assert.equal("42", r.results[1].text)
    assert.equal(id, r.sandbox_id)
    assert.is_true(r.resumed)
  end)

  it("a prewarm while a run holds the session does nothing (busy); a second prewarm joins the first", function()
    local log = {}
    local s = logged("pw:busy", log)
    assert(s:run("0"))
    local p
    local run = wb:spawn(function() return s:run("import time\ntime.sleep(1)\n'slept'") end)
    wb:spawn(function()
      wb.runner.sched:sleep(0.5)           -- the run holds the lock
      env:reset_stats()
      p = s:prewarm()
      assert.equal(p, s:prewarm())         -- in flight: the same task
    end)
    assert(wb:loop())
    assert.equal("slept", (assert(run:result())).results[1].text)
    assert.equal("busy", (p:result()).action)
    assert.equal(0, env:route("POST /sandboxes/{id}/connect"))
  end)

  it("misuse raises bad argument", function()
    local s = logged("pw:misuse", {})
    assert.has_error(function() s:prewarm{ within = -1 } end,
      "bad argument #1 to 'prewarm' (option 'within': positive number of seconds up to max_run_length "
      .. "expected, got -1)")
    assert.has_error(function() s:prewarm{ soon = true } end)
    assert.has_error(function() s:prewarm(5) end)
    assert.has_error(function() session.Session.prewarm({}) end)
  end)

  it("a prewarm racing a run from another process: one sandbox, no overlap, the run waits for it", function()
    local key = "pw:race"
    local go, out = os.tmpname(), os.tmpname()
    os.remove(go)
    -- The other process: as soon as `go` exists, run on the same session.
    local src = string.format([[
      package.path = %q
      package.cpath = %q
      local core = require "warmbox.core"
      local wb = assert(require("warmbox").new{ api_url = %q, sandbox_url = %q, api_key = %q,
        lock = { backend = "file", dir = %q } })
      while not io.open(%q) do core.sleep(0.005) end
      local t0 = core.now()
      local r, err, code = wb:session(%q):run("'other'")
      if not r then print("failed", err, code) os.exit(1) end
      print(string.format("ran %%s reused=%%s start=%%.6f end=%%.6f", r.sandbox_id, tostring(r.reused),
        t0, core.now()))
      wb:close()
    ]], package.path, package.cpath, env.srv.url, env.srv.url, env.srv.api_key, env.lockdir, go, key)
    local ph = assert(io.popen("lua5.4 -e " .. wbd.sh_quote(src) .. " >" .. out .. " 2>&1 & echo $!"))
    local pid = tonumber(ph:read("l"))
    ph:close()
    env:reset_stats()
    local done_at
    local s = session.new(key, { client = wb.client, lock = { backend = "file", dir = env.lockdir },
      parallel = wb.parallel, origin = wb.origin, runner = wb.runner,
      on_event = function(name) if name == "prewarm" then done_at = core.now() end end })
    local p = s:prewarm()
    -- Let the prewarm get as far as its create (warmboxd takes 0.5 s to answer
    -- it), then let the other process in.
    local deadline = core.now() + 30
    while env:route("POST /sandboxes") == 0 and not p:done() and core.now() < deadline do wb:step(0.01) end
    assert.is_false(p:done())
    io.open(go, "w"):close()
    assert(wb:loop())
    local info = assert(p:result())
    assert.equal("created", info.action)
    assert.truthy(wbd.eventually(function() return not wbd.alive(pid) end, 60))
    local f = io.open(out)
    local text = f:read("a")
    f:close()
    os.remove(out)
    os.remove(go)
    local id, reused, started, ended = text:match("ran (%S+) reused=(%S+) start=([%d.]+) end=([%d.]+)")
    assert.truthy(id, text)
    -- One sandbox: the run used the one the prewarm created, and created none.
    assert.equal(info.sandbox_id, id)
    assert.equal("true", reused)
    assert.equal(1, env:route("POST /sandboxes"))
    -- The run began while the prewarm was in flight and ended after it had
    -- released the session (done_at: its event, right after the unlock): it waited.
    assert.is_true(tonumber(started) < done_at)
    assert.is_true(tonumber(ended) > done_at)
    -- no overlap: env:stop() asserts exec_overlap = 0 for the whole file
  end)
end)

describe("warmbox prewarm (CLI)", function()
  local env = sessions.new()
  local XDG = os.tmpname()
  os.remove(XDG)

  lazy_setup(function() env:start{ args = { "--resume-ms", "1000", "--create-ms", "500" } } end)
  lazy_teardown(function()
    env:stop()
    os.execute("rm -rf " .. wbd.sh_quote(XDG))
  end)

  local function warmbox(args)
    local tmp = os.tmpname()
    local build = core.module_path():match("^(.*)/warmbox/[^/]*$")
    local cmd = string.format("cd %s && XDG_RUNTIME_DIR=%s WARMBOX_BUILD_DIR=%s lua5.4 bin/warmbox --api-url %s "
      .. "--api-key %s --lock file %s </dev/null >%s.out 2>%s.err", wbd.sh_quote(wbd.root()), wbd.sh_quote(XDG),
      wbd.sh_quote(build), env.srv.url, env.srv.api_key, args, tmp, tmp)
    local ok, _, code = os.execute(cmd)
    local function slurp(p)
      local f = io.open(p)
      local s = f and f:read("a") or ""
      if f then f:close() end
      os.remove(p)
      return s
    end
    local o, e = slurp(tmp .. ".out"), slurp(tmp .. ".err")
    os.remove(tmp)
    return ok and 0 or code, o, e
  end

  it("creates and starts the session's sandbox; the next run creates nothing and is warm", function()
    local key = "cli-pw:" .. tostring(os.time()) .. tostring(math.random(1e6))
    env:reset_stats()
    local code, out, err = warmbox("prewarm --session " .. wbd.sh_quote(key))
    assert.equal(0, code, err)
    local id = out:match("^prewarmed " .. key:gsub("%p", "%%%0") .. ": created sandbox (%S+)")
    assert.truthy(id, out)
    assert.equal(1, env:route("POST /sandboxes"))
    -- a second prewarm finds it warm: no request
    env:reset_stats()
    code, out = warmbox("prewarm --session " .. wbd.sh_quote(key) .. " --within 60")
    assert.equal(0, code)
    assert.matches(": warm sandbox " .. id, out, 1, true)
    assert.equal(0, env:total())
    code, out = warmbox("run --json --session " .. wbd.sh_quote(key) .. " " .. wbd.sh_quote("6 * 7"))
    assert.equal(0, code)
    local doc = require("warmbox.json").decode(out)
    assert.equal(id, doc.sandbox_id)
    assert.is_true(doc.reused)
    assert.equal(0, env:route("POST /sandboxes"))
  end)

  it("fails with status 2 (warmbox failed) and the error when the prewarm fails, 2 without --session", function()
    env:fault("GET /v2/sandboxes", { status = 500, count = 1 })
    local code, _, err = warmbox("prewarm --session cli-pw:fails")
    assert.equal(2, code)
    assert.matches("prewarm failed", err)
    assert.matches("HTTP", err)
    code = warmbox("prewarm")
    assert.equal(2, code)
  end)
end)
