--- `warmbox demo`: a short conversation on an embedded warmboxd, with
-- timings: a cold start, a second session that is then abandoned, a warm
-- run, the idle pause, the resume, a chart file, GC, the release.
local tostring, ipairs, pcall = tostring, ipairs, pcall
local string_format, table_concat = string.format, table.concat

local common = require "warmbox.cli.common"

local fail, FAILED = common.fail, common.FAILED

local _M = {}

local function lease_margin() return require("warmbox.session").LEASE_MARGIN end
-- The lease the demo's cold start sets (the default policy): the idle
-- timeout, from MIN_LEASE up (a running cell's watchdog keeps it longer).
local function demo_lease(o)
  return math.max(math.ceil(o.idle_timeout), require("warmbox.session.decide").MIN_LEASE)
end

-- The demo's header line when --idle-timeout is below the shortest lease.
local function demo_floor_note(o)
  if o.idle_timeout >= demo_lease(o) then return "" end
  return string_format("(idle timeout %gs is shorter than the shortest lease, %ds: the sandbox pauses %ds after "
    .. "its last run)\n", o.idle_timeout, demo_lease(o), demo_lease(o))
end

-- A run's failure as a step's answer.
local function failed(msg, code)
  return false, "FAILED: " .. tostring(msg) .. " (" .. tostring(code) .. ")"
end

local function code_line(r)
  local text = r.results[1] and r.results[1].text or r.stdout:gsub("\n$", "")
  return string_format("-> %s  (sandbox %s, reused=%s, resumed=%s)", text, r.sandbox_id, tostring(r.reused),
    tostring(r.resumed))
end

-- The steps, in order. Each is `{ title, fn(d) -> ok, line, extra }` with
-- `gate` (the demo stops after it when it failed), `quiet` (its requests
-- are the demo's own polling: not counted), `always` (run even after a
-- failure), `when(d)` (run only when it says so). `d` is the demo's state:
-- o, wb, s (the session), key, now, sandbox_id, abandoned.
local STEPS = {
  { "cold start", gate = true, function(d)
    local r, msg, code = d.s:run("x = 41\nprint('hello from', __import__('os').getcwd())")
    if not r then return failed(msg, code) end
    d.sandbox_id = r.sandbox_id
    return true, string_format("x = 41  (created sandbox %s, reused=%s)", r.sandbox_id, tostring(r.reused))
  end },
  { "other session", function(d)
    -- a conversation that goes quiet at once (a 7 s idle timeout): GC reclaims it below
    local quick = require("warmbox").new{ client = d.wb.client, exec_timeout = 2, idle_timeout = 7, lock = d.o.lock }
    local r, msg, code = quick:session("demo-workspace:abandoned"):run("echo bye", { language = "bash" })
    if not r then return failed(msg, code) end
    d.abandoned = r.sandbox_id
    return true, string_format("a second conversation (sandbox %s) that is then abandoned", r.sandbox_id)
  end },
  { "warm run", gate = true, function(d)
    local r, msg, code = d.s:run("x + 1", { timeout = 1 })
    if not r then return failed(msg, code) end
    return true, "x + 1 " .. code_line(r)
  end },
  { "idle pause", gate = true, quiet = true, function(d)
    local o, now = d.o, d.now
    local deadline = now() + o.exec_timeout + o.idle_timeout + 30
    while now() < deadline do
      local info = d.wb.client:info(d.sandbox_id)
      if info and info.state == "paused" then
        return true, string_format("nobody ran anything; sandbox %s paused when its %gs lease (set at the "
          .. "cold start) ran out (polled with info)", d.sandbox_id, demo_lease(o))
      end
      require("warmbox.core").sleep(0.25)
    end
    return false, "the sandbox did not pause"
  end },
  { "resume", gate = true, function(d)
    local r, msg, code = d.s:run("x + 1", { timeout = 30 })
    if not r then return failed(msg, code) end
    return true, "x + 1 " .. code_line(r) .. " -- the kernel kept x"
  end },
  { "chart", gate = true, function(d)
    local r, msg, code = d.s:run(table_concat({
      "import matplotlib", "matplotlib.use('Agg')", "import matplotlib.pyplot as plt",
      "plt.figure(figsize=(4, 3))", "plt.plot([1, 2, 3, 4], [x, x + 1, x - 3, x + 5])",
      "plt.title('x over time')", "plt.savefig('/home/user/output/chart.png')", "print('saved')" }, "\n"),
      { timeout = 120 })
    if not r then return failed(msg, code) end
    if r.error then return false, "FAILED: " .. tostring(r.error.name) .. ": " .. tostring(r.error.value) end
    local f = r.files[1]
    if not f then return false, "no file came back" end
    local png = f.content:sub(1, 8) == "\137PNG\r\n\26\n"
    return true, string_format("got %s back: %d bytes, %s%s", f.name, #f.content, f.mime,
      png and ", a real PNG" or "")
  end },
  { "gc --dry-run", when = function(d) return d.abandoned and pcall(require, "warmbox.gc") end, function(d)
    local rep, msg, code = d.wb:gc{ dry_run = true, max_age = d.max_age }
    if not rep then return failed(msg, code) end
    return true, string_format("max age %ds: listed %d, would kill %d (the abandoned one), keep %d (the live one)",
      d.max_age, rep.listed or 0, rep.killed or 0, rep.kept or 0)
  end },
  { "gc", when = function(d) return d.abandoned and pcall(require, "warmbox.gc") end, function(d)
    local rep, msg, code = d.wb:gc{ max_age = d.max_age }
    if not rep then return failed(msg, code) end
    local killed = {}
    for _, a in ipairs(rep.actions or {}) do
      if a.action == "kill" then killed[#killed + 1] = tostring(a.sandbox_id) end
    end
    return true, string_format("killed %d (%s), kept %d", rep.killed or 0, table_concat(killed, ", "),
      rep.kept or 0)
  end },
  { "release", always = true, function(d)
    local n, msg, code = d.wb:release(d.key)
    if not n then return failed(msg, code) end
    return true, string_format("the conversation was deleted: %d sandbox%s killed", n, n == 1 and "" or "es")
  end },
}

-- The demo's warmbox object, on its own warmboxd even when E2B_API_KEY is
-- set (unless --api-url is given) --> wb | nil, exit status.
local function demo_warmbox(o, io_)
  local srv
  if not o.api_url then
    local err, code
    srv, err, code = require("warmbox.server").start{ bin = o.warmboxd }
    if not srv then return nil, fail(io_.stderr, err, code) end
    o.api_url, o.api_key, o.sandbox_url, o.warmboxd = srv.url, srv.api_key, srv.url, nil
  end
  local wb = common.new_warmbox(o, io_)
  if not wb then
    if srv then srv:stop() end
    return nil, FAILED
  end
  wb.server = wb.server or srv -- stopped by wb:close()
  return wb
end

-- The requests warmboxd has served so far (its stats), or nil (not on a warmboxd).
local function request_counter(wb)
  local http = wb.server and require("warmbox.core").http{ timeout = 10 }
  return function()
    if not http then return nil end
    local res = http:request{ method = "GET", url = wb.server.url .. "/_warmboxd/stats",
      headers = { ["X-Warmboxd-Token"] = wb.server.admin_token } }
    local t = res and res.status == 200 and require("warmbox.json").decode(res.body)
    return t and t.total_requests
  end, http
end

local function demo(o, io_)
  local out = io_.stdout
  local now = require("warmbox.core").now
  -- A 15 s idle window (the 10 s timeout + 5, as ever: the demo's pause comes
  -- 15 s after the cold start; any window from MIN_LEASE up takes effect).
  o.exec_timeout = o.exec_timeout or 10
  o.idle_timeout = o.idle_timeout or o.exec_timeout + lease_margin()
  o.lock = o.lock or "memory"
  local wb, status = demo_warmbox(o, io_)
  if not wb then return status end
  local requests, http = request_counter(wb)
  out:write(string_format("warmbox demo: one conversation on %s (exec timeout %gs, idle timeout %gs)\n%s\n",
    wb.server and ("an embedded warmboxd at " .. wb.server.url) or "E2B", o.exec_timeout, o.idle_timeout,
    demo_floor_note(o)))
  local key = "demo-workspace:thread-1"
  local d = { o = o, wb = wb, s = wb:session(key), key = key, now = now, max_age = 6 }
  local ok, shown = true, 0
  for _, step in ipairs(STEPS) do
    if step.always or (ok and (not step.when or step.when(d))) then
      shown = shown + 1
      local n0 = requests()
      local t0 = now()
      local done, line, extra = step[2](d)
      local ms = (now() - t0) * 1000
      local n1 = requests()
      local reqs = n0 and n1 and not step.quiet and string_format("%2d req", n1 - n0) or "      "
      out:write(string_format("%d. %-16s %8.0f ms  %s  %s\n", shown, step[1], ms, reqs, tostring(line)))
      if extra then out:write("   ", extra, "\n") end
      if step.gate then ok = done end
    end
  end
  if http then http:close() end
  wb:close()
  out:write(ok and "\ndone.\n" or "\nthe demo stopped at a failed step.\n")
  return ok and 0 or 1
end

--- The command: status 0, 1 (a step failed) or 2.
function _M.execute(o, args, io_)
  if args[1] then error("demo takes no arguments", 0) end
  return demo(o, io_)
end

return _M
