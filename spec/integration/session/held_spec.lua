-- A run whose cell the sandbox holds: the conversation's lock was lost (its
-- holder stopped past the lock's expiry) while the older run's cell still
-- executes in another of the sandbox's kernels. The later run (its fence is
-- higher) is held up to its timeout, then refused with HELD: its cell never
-- started. The older run's result is intact, and the cells never execute at
-- once: each records its start and end times in the sandbox.
local wbd = require "spec.helpers.warmboxd"
local sessions = require "spec.helpers.sessions"


describe("sessions: a cell held while an older run's cell executes (warmboxd)", function()
  local env = sessions.new()
  local srv

  lazy_setup(function() srv = env:start() end)
  lazy_teardown(function() env:stop() end)

  local LOCK = "{ backend = 'file', dir = %q, exptime = 1, timeout = 60 }"

  -- A holder process: one run of `code`; writes "<ok|code> <lost|-> <text>" to `out`. → pid
  local function holder(key, code, language, out)
    local script = string.format([[
      package.path = %q
      package.cpath = %q
      local wb = assert(require("warmbox").new{ api_url = %q, sandbox_url = %q, api_key = %q,
        lock = ]] .. LOCK .. [[, exec_timeout = 60, idle_timeout = 60 })
      local r, _, code, detail = wb:session(%q):run(%q, { language = %q })
      local lost = r and r.lock_lost or (type(detail) == "table" and detail.lock_lost)
      local f = assert(io.open(%q, "w"))
      f:write(r and "ok" or tostring(code), " ", lost and "lost" or "-", " ", r and tostring(r.text) or "-", "\n")
      f:close()
      wb:close()
    ]], package.path, package.cpath, srv.url, srv.url, srv.api_key, env.lockdir, key, code, language, out)
    local pid = sessions.spawn_lua(script)
    finally(function() os.execute("kill -CONT " .. pid .. " 2>/dev/null") end)
    return pid
  end

  local function result_of(out)
    return sessions.result_line(out):match("^(%S+) (%S+) (%S+)")
  end

  -- The ledger: { mark = { starts, ends } } with the times each cell wrote.
  local function ledger(id)
    local t = {}
    local f = io.open(srv:sandbox_home(id) .. "/ledger", "rb")
    if f then
      for line in f:lines() do
        local what, mark, at = line:match("^(%S+) (%S+) (%S+)$")
        t[mark] = t[mark] or { starts = {}, ends = {} }
        local list = what == "start" and t[mark].starts or t[mark].ends
        list[#list + 1] = tonumber(at)
      end
      f:close()
    end
    return t
  end

  -- Cells that write "start <mark> <time>" and "end <mark> <time>" (nanoseconds
  -- of the sandbox's clock); `wait`: in between, until /home/user/release exists.
  local CELLS = {
    python = function(mark, wait)
      return "import os, time\n"
        .. "open('/home/user/ledger', 'a').write('start " .. mark .. " %d\\n' % time.time_ns())\n"
        .. (wait and "while not os.path.exists('/home/user/release'): time.sleep(0.05)\n" or "")
        .. "open('/home/user/ledger', 'a').write('end " .. mark .. " %d\\n' % time.time_ns())\n"
        .. "'" .. mark .. "-done'"
    end,
    bash = function(mark, wait)
      return "echo start " .. mark .. " $(date +%s%N) >> /home/user/ledger\n"
        .. (wait and "while [ ! -e /home/user/release ]; do sleep 0.05; done\n" or "")
        .. "echo end " .. mark .. " $(date +%s%N) >> /home/user/ledger\n"
    end,
  }

  for _, langs in ipairs({ { "python", "bash" }, { "bash", "python" } }) do
    local old, new = langs[1], langs[2]
    it(old .. " then " .. new .. ": the later run is refused HELD, never both at once", function()
      local key = "held:" .. old .. new
      local wb = env:warmbox{ exec_timeout = 60, idle_timeout = 60,
        lock = assert(load("return " .. LOCK:format(env.lockdir)))() }
      local s = wb:session(key)
      local id = assert(s:run(new == "bash" and "true" or "1", { language = new })).sandbox_id
      local out = os.tmpname()
      local pid = holder(key, CELLS[old]("A", true), old, out)
      wbd.eventually(function() return ledger(id).A ~= nil end, 60)
      os.execute("kill -STOP " .. pid)
      -- its lock expires (1 s); this run takes it and its cell is held, then refused
      local r, err, code, detail = s:run(CELLS[new]("B"), { language = new, timeout = 2 })
      assert.is_nil(r, "the later run ran while the older cell executed")
      assert.equal("HELD", code, err)
      assert.matches("older run", err)
      assert.is_false(detail.started)
      assert.is_nil(ledger(id).B, "the held cell started")
      -- the older cell ends; its run's result is intact
      local f = assert(io.open(srv:sandbox_home(id) .. "/release", "w"))
      f:close()
      os.execute("kill -CONT " .. pid)
      local a, lost, text = result_of(out)
      assert.equal("ok", a)
      assert.equal("lost", lost)
      if old == "python" then assert.equal("A-done", text) end
      -- the later cell, sent again by the caller, runs after it
      assert(s:run(CELLS[new]("B"), { language = new }))
      local l = ledger(id)
      assert.equal(1, #l.A.starts)
      assert.equal(1, #l.A.ends)
      assert.equal(1, #l.B.starts, "the held cell ran")
      assert.is_true(l.B.starts[1] >= l.A.ends[1], "the cells overlapped")
      wb:close()
    end)
  end
end)
