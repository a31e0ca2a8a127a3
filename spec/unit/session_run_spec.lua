-- Session logic against a fake E2B client, a fake lock and a virtual clock:
-- the reference's seven resolve cases, remembered state, retries, outputs.
local session = require "warmbox.session"

local fakes = require "spec.helpers.fakes"
local fake_e2b = require "spec.helpers.fake_e2b"
local fake_hash = fakes.hash
local fake_hmac = fakes.hmac

-- A fake lock module: one table of holders and states (like the memory backend).
local function new_lock_module()
  local m = { held = {}, state = {}, log = {} }
  function m.new()
    local lk = {}
    function lk:lock(key)
      if m.held[key] then return nil, m.busy_err or "timeout" end
      m.held[key] = self
      self.key = key
      m.log[#m.log + 1] = "lock " .. key
      return 0
    end
    function lk:unlock()
      m.held[self.key] = nil
      m.log[#m.log + 1] = "unlock " .. self.key
      return true
    end
    function lk:get_state() return m.state[self.key] end
    function lk:set_state(s) m.state[self.key] = s return true end
    return lk
  end
  return m
end

local function setup(o)
  o = o or {}
  local t = { now = 1000000 }
  local clock = function() return t.now end
  local client = fake_e2b.new{ clock = clock }
  local locks = new_lock_module()
  local function mk(key, extra)
    local opts = { client = client, lock = locks, clock = clock, hmac = fake_hmac, sha256 = fake_hash,
      exec_timeout = o.exec_timeout or 600, idle_timeout = o.idle_timeout or 300, policy = o.policy,
      template = "code-interpreter-v1" }
    for k, v in pairs(extra or {}) do opts[k] = v end
    return session.new(key, opts)
  end
  return { t = t, client = client, locks = locks, new = mk }
end

describe("warmbox.session", function()
  describe(":run() resolving the sandbox (the reference's cases)", function()
    it("reuses an existing sandbox and extends its lease to cover the run and LEASE_MARGIN", function()
      local e = setup()
      local s = e.new("workspace-1:thread-1")
      e.client:add("sb1", s.tag_value, "running")
      local r = assert(s:run("x = 1"))
      assert.same({ "sb1" }, e.client:ids("connect"))
      -- the policy says the idle window, 300, but a session without a watchdog (no
      -- `parallel`) covers the run's whole 600 s timeout: that + LEASE_MARGIN (5) = 605
      assert.equal(605, e.client.calls[2][3])
      assert.same({ "sb1" }, e.client:ids("set_timeout"))
      assert.equal(0, e.client:count("create"))
      assert.equal(0, e.client:count("kill"))
      assert.equal(e.t.now + 605, e.client.sb.sb1.lease_end)
      assert.is_true(r.reused)
      assert.equal("sb1", r.sandbox_id)
      local list = e.client.calls[1]
      assert.same({ "running", "paused" }, list[2].state)
      assert.same({ warmboxSessionId = s.tag_value }, list[2].metadata)
    end)

    it("says once (event lease_floor) when idle_timeout is shorter than the run's timeout and cannot apply",
      function()
      local e = setup{ exec_timeout = 10, idle_timeout = 3 }
      local events = {}
      local s = e.new("w:floor", { on_event = function(name, info)
        if name == "lease_floor" then events[#events + 1] = info end
      end })
      assert(s:run("1"))
      -- the policy asks max(10, 3) = 10; the lease is the run's 10 s + 5: idle_timeout 3 never applies
      assert.equal(15, e.client.calls[2][2].timeout) -- the create's
      assert.same({ { idle_timeout = 3, run_timeout = 10, lease = 15, margin = 5 } }, events)
      assert(s:run("2", { timeout = 30 }))
      assert.equal(1, #events) -- once per session object
      -- warmbox.new's defaults (300 and 300): the lease is 305 s, not worth a warning
      local quiet = setup{ exec_timeout = 300, idle_timeout = 300 }
      local none = true
      local s2 = quiet.new("w:nofloor", { on_event = function(name)
        if name == "lease_floor" then none = false end
      end })
      assert(s2:run("1"))
      assert.is_true(none)
    end)

    it("creates a tagged, auto-pausing, auto-resuming sandbox when none exists", function()
      local e = setup()
      local s = e.new("workspace-1:thread-1")
      local r = assert(s:run("x = 1"))
      assert.equal(1, e.client:count("create"))
      local p = e.client.calls[2][2]
      assert.same({ warmboxSessionId = s.tag_value, warmboxCreate = p.metadata.warmboxCreate }, p.metadata)
      assert.matches("^%x+$", p.metadata.warmboxCreate) -- the create's own id (see warmbox.tag.CREATE_TAG)
      assert.same({ on_timeout = "pause", auto_resume = true }, p.lifecycle)
      assert.equal(605, p.timeout) -- the run's 600 s timeout + LEASE_MARGIN (5)
      assert.equal("code-interpreter-v1", p.template)
      assert.is_false(r.reused)
      assert.is_false(r.resumed)
    end)

    it("keeps one of several duplicates and kills the others only after it is secured", function()
      local e = setup()
      local s = e.new("w:t")
      e.client:add("a", s.tag_value)
      e.client:add("b", s.tag_value)
      e.client:add("c", s.tag_value) -- listed first (newest)
      assert(s:run("1"))
      assert.same({ "c" }, e.client:ids("connect"))
      assert.same({ "b", "a" }, e.client:ids("kill"))
      local names = {}
      for _, call in ipairs(e.client.calls) do names[#names + 1] = call[1] end
      -- the hooks' cell, then the user's
      assert.same({ "list", "connect", "set_timeout", "kill", "kill", "run_code", "run_code" }, names)
    end)

    for _, code in ipairs({ "HTTP", "RATE_LIMITED", "TIMEOUT", "TRANSPORT" }) do
      it("fails the run with the code of a transient connect fault (" .. code .. ") and touches nothing", function()
        local e = setup()
        local s = e.new("w:t")
        e.client:add("warm", s.tag_value)
        e.client.fail.connect = { warm = code }
        local r, err, ecode = s:run("1")
        assert.is_nil(r)
        assert.equal("connect failed", err)
        assert.equal(code, ecode)
        assert.equal(0, e.client:count("create"))
        assert.equal(0, e.client:count("kill"))
        assert.equal(0, e.client:count("run_code"))
        -- the next run tries again and gets the same sandbox
        e.client.fail.connect = nil
        assert.equal("warm", assert(s:run("2")).sandbox_id)
      end)
    end

    it("passes over a candidate that is gone (404), keeps the live one and creates nothing", function()
      local e = setup()
      local s = e.new("w:t")
      e.client:add("live", s.tag_value)
      e.client:add("dead", s.tag_value)
      e.client.fail.connect = { dead = "NOT_FOUND" }
      e.client.info_over.dead = "gone" -- info confirms it
      local r = assert(s:run("1"))
      assert.equal("live", r.sandbox_id)
      assert.same({ "dead", "live" }, e.client:ids("connect"))
      assert.same({}, e.client:ids("kill"))
      assert.equal(0, e.client:count("create"))
    end)

    it("creates a fresh sandbox when the only candidate is gone", function()
      local e = setup()
      local s = e.new("w:t")
      e.client:add("dead", s.tag_value)
      e.client.fail.connect = { dead = "NOT_FOUND" }
      e.client.info_over.dead = "gone"
      local r = assert(s:run("1"))
      assert.equal(1, e.client:count("create"))
      assert.equal("new1", r.sandbox_id)
    end)

    it("a 404 on connect that info does not confirm never gives the candidate up: connected once more", function()
      local e = setup()
      local s = e.new("w:t")
      e.client:add("kept", s.tag_value)
      e.client.fail.connect = { kept = "NOT_FOUND" }
      -- 404 twice, info says it exists: the run fails, nothing is created or killed
      local r, _, code = s:run("1")
      assert.is_nil(r)
      assert.equal("NOT_FOUND", code)
      assert.same({ "kept", "kept" }, e.client:ids("connect"))
      assert.equal(0, e.client:count("create"))
      assert.same({}, e.client:ids("kill"))
      -- the 404 was an intermediary's: the next run keeps the sandbox
      e.client.fail.connect = nil
      assert.equal("kept", assert(s:run("2")).sandbox_id)
    end)

    it("never reaps the candidate a transient fault hid: the run fails before any kill", function()
      local e = setup()
      local s = e.new("w:t")
      e.client:add("other", s.tag_value)
      e.client:add("stateful", s.tag_value) -- listed first
      e.client.fail.connect = { stateful = "HTTP" }
      local r, _, code = s:run("1")
      assert.is_nil(r)
      assert.equal("HTTP", code)
      assert.same({ "stateful" }, e.client:ids("connect"))
      assert.equal(0, e.client:count("kill"))
    end)

    it("never connects to, kills or reuses another key's sandbox, even when the server matches loosely", function()
      local e = setup()
      local mine = e.new("workspace-1:thread-1")
      local other = e.new("workspace-1:thread-10")
      e.client:add("theirs", other.tag_value)
      e.client.loose = true
      -- the loose server returns "theirs" for a prefix of its tag; make ours a prefix of theirs
      e.client.sb.theirs.metadata.warmboxSessionId = mine.tag_value .. "0"
      assert.equal(1, #e.client:list_all{ metadata = { warmboxSessionId = mine.tag_value } })
      local r = assert(mine:run("1"))
      assert.equal(0, e.client:count("connect"))
      assert.equal(0, e.client:count("kill"))
      assert.equal(1, e.client:count("create"))
      assert.are_not.equal("theirs", r.sandbox_id)
    end)

    it("never runs in a sandbox whose lease cannot be set, and leaves it alone", function()
      local e = setup()
      local s = e.new("w:t")
      e.client:add("stuck", s.tag_value)
      e.client.fail.set_timeout = { stuck = true }
      local r, err, code = s:run("1")
      assert.is_nil(r)
      assert.equal("timeout failed", err)
      assert.equal("HTTP", code)
      assert.equal(0, e.client:count("kill"))
      assert.equal(0, e.client:count("create"))
      assert.equal(0, e.client:count("run_code"))
      e.client.fail.set_timeout = nil
      assert.equal("stuck", assert(s:run("2")).sandbox_id)
    end)

    it("returns the list error with its code", function()
      local e = setup()
      e.client.fail.list = "RATE_LIMITED"
      local r, err, code = e.new("w:t"):run("1")
      assert.is_nil(r)
      assert.equal("list failed", err)
      assert.equal("RATE_LIMITED", code)
    end)
  end)

  describe(":run() remembering the sandbox", function()
    it("runs a warm session in one call when the remembered lease covers the run", function()
      local e = setup({ exec_timeout = 300, idle_timeout = 300 })
      local s = e.new("w:t")
      assert(s:run("1"))
      e.client.calls = {}
      e.t.now = e.t.now + 10
      local r = assert(s:run("2", { timeout = 60 }))
      assert.same({ "run_code" }, (function()
        local n = {}
        for _, c in ipairs(e.client.calls) do n[#n + 1] = c[1] end
        return n
      end)())
      assert.is_true(r.reused)
    end)

    it("refreshes with one connect (no list) when the lease may not cover the run", function()
      local e = setup({ exec_timeout = 300, idle_timeout = 300 })
      local s = e.new("w:t")
      assert(s:run("1"))
      e.client.calls = {}
      e.t.now = e.t.now + 10
      assert(s:run("2")) -- timeout 300: 10 + 300 + margin > lease end
      assert.equal(0, e.client:count("list"))
      assert.equal(1, e.client:count("connect"))
      assert.equal(1, e.client:count("run_code"))
    end)

    it("resumes a paused remembered sandbox with connect and says so", function()
      local e = setup()
      local s = e.new("w:t")
      local r1 = assert(s:run("1"))
      e.t.now = e.t.now + 3600
      e.client.sb[r1.sandbox_id].state = "paused"
      local r = assert(s:run("2"))
      assert.is_true(r.resumed)
      assert.is_true(r.reused)
      assert.equal(r1.sandbox_id, r.sandbox_id)
    end)

    it("shares the memory between session objects through the lock state", function()
      local e = setup({ exec_timeout = 300, idle_timeout = 300 })
      assert(e.new("w:t"):run("1"))
      e.client.calls = {}
      assert(e.new("w:t"):run("2", { timeout = 30 }))
      assert.equal(1, #e.client.calls)
      local st = require("warmbox.state").decode(e.locks.state[e.new("w:t").tag_value])
      assert.equal("new1", st.sandbox_id)
      assert.equal("tok-new1", st.access_token)
      assert.equal(e.t.now, st.last_run)
    end)

    it("forgets a remembered sandbox that is gone, resolves again and runs once more", function()
      local e = setup({ exec_timeout = 300, idle_timeout = 300 })
      local s = e.new("w:t")
      local r1 = assert(s:run("1"))
      e.client.sb[r1.sandbox_id].killed = true
      e.client.calls = {}
      local r = assert(s:run("2", { timeout = 30 }))
      assert.are_not.equal(r1.sandbox_id, r.sandbox_id)
      -- the refused one, then the new kernel's hooks cell and the cell
      assert.equal(3, e.client:count("run_code"))
      assert.equal(1, e.client:count("create"))
    end)

    it("keeps the remembered sandbox on a transient connect fault: fails the run, no list, no kill", function()
      local e = setup({ exec_timeout = 300, idle_timeout = 300 })
      local s = e.new("w:t")
      local r1 = assert(s:run("1"))
      e.t.now = e.t.now + 3600
      e.client.calls = {}
      e.client.fail.connect = { [r1.sandbox_id] = "RATE_LIMITED" }
      local r, _, code = s:run("2")
      assert.is_nil(r)
      assert.equal("RATE_LIMITED", code)
      assert.equal(0, e.client:count("list"))
      assert.equal(0, e.client:count("kill"))
      assert.equal(r1.sandbox_id, s:state().sandbox_id)
      e.client.fail.connect = nil
      assert.equal(r1.sandbox_id, assert(s:run("3")).sandbox_id)
    end)

    it("resolves again when the remembered sandbox is gone (404 on connect)", function()
      local e = setup({ exec_timeout = 300, idle_timeout = 300 })
      local s = e.new("w:t")
      local r1 = assert(s:run("1"))
      e.t.now = e.t.now + 3600
      e.client.sb[r1.sandbox_id].killed = true
      e.client.calls = {}
      local r = assert(s:run("2"))
      assert.are_not.equal(r1.sandbox_id, r.sandbox_id)
      -- the resolve's, and after the run the one that finds what else its create made
      assert.equal(2, e.client:count("list"))
    end)

    it("retries a run whose connection failed before anything was sent, never one that may have been sent", function()
      local e = setup({ exec_timeout = 300, idle_timeout = 300 })
      local s = e.new("w:t")
      assert(s:run("1"))
      e.client.calls = {}
      e.client.fail.run = { { "refused", "TRANSPORT", { sent = false, started = false } } }
      assert(s:run("2", { timeout = 30 }))
      -- the refused cell, then the cell again in the same sandbox (its kernel keeps the hooks)
      assert.same({ "2", "2" }, e.client:codes())
      e.client.calls = {}
      e.client.fail.run = { { "empty reply", "TRANSPORT", { sent = true, started = false } } }
      local r, _, code = s:run("3", { timeout = 30 })
      assert.is_nil(r)
      assert.equal("TRANSPORT", code)
      assert.equal(1, e.client:count("run_code"))
    end)

    it("never re-runs a cell whose output read failed: reports files_error in the result", function()
      local e = setup()
      local s = e.new("w:t")
      local runs = 0
      e.client.exec = function(sb) runs = runs + 1 sb.output["big.bin"] = string.rep("x", 100) end
      e.client.fail.read = "SANDBOX_GONE"
      local r = assert(s:run("chart"))
      assert.equal(1, runs)
      assert.same({ "read failed", "SANDBOX_GONE" }, r.files_error)
      assert.same({}, r.files)
      e.client.fail.read = "NOT_FOUND"
      r = assert(s:run("chart"))
      assert.equal(2, runs)
      assert.same({ "read failed", "NOT_FOUND" }, r.files_error)
    end)

    it("keeps output files within max_files_bytes and says what it dropped", function()
      local e = setup()
      local s = e.new("w:t", { max_files_bytes = 150 })
      e.client.exec = function(sb)
        sb.output["a.bin"] = string.rep("a", 100)
        sb.output["b.bin"] = string.rep("b", 100)
        sb.output["c.png"] = "PNG"
      end
      local r = assert(s:run("x"))
      assert.same({ { name = "a.bin", content = string.rep("a", 100), mime = "image/png" },
        { name = "c.png", content = "PNG", mime = "image/png" } }, r.files)
      assert.is_true(r.truncated)
      assert.same({ { name = "b.bin", size = 100 } }, r.dropped_files)
    end)

    it("reports a failed unlock with the run's result, and keeps the lock alive on every stream event", function()
      local e = setup()
      local s = e.new("w:t")
      local keepalives = 0
      local orig = e.locks.new
      e.locks.new = function()
        local lk = orig()
        function lk.keepalive() keepalives = keepalives + 1 return nil, "redis down", "TRANSPORT" end
        local unlock = lk.unlock
        function lk.unlock(self) unlock(self) return nil, "redis down", "TRANSPORT" end
        return lk
      end
      e.client.exec = function(_, _, out) out.stdout[1] = "a" end
      local seen_lines = 0
      local orig_sandbox = e.client.sandbox
      e.client.sandbox = function(c, sb, o)
        local h = orig_sandbox(c, sb, o)
        local run_code = h.run_code
        h.run_code = function(hh, code, ro)
          for _ = 1, 3 do if ro.on_line then ro.on_line("keepalive") seen_lines = seen_lines + 1 end end
          return run_code(hh, code, ro)
        end
        return h
      end
      local r = assert(s:run("1"))
      assert.equal(6, seen_lines) -- 3 in the hooks' cell, 3 in the user's
      assert.equal(6, keepalives)
      assert.same({ "redis down", "TRANSPORT" }, r.lock_error)
      assert.same({ "redis down", "TRANSPORT" }, r.unlock_error)
      local _, _, code, detail = s:run(1 and "x", { files = { ["a/b"] = "x" } })
      assert.equal("BAD_REQUEST", code)
      assert.is_nil(detail)
      e.client.fail.run = { { "boom", "HTTP" } }
      local r2, _, code2, detail2 = s:run("2")
      assert.is_nil(r2)
      assert.equal("HTTP", code2)
      assert.same({ "redis down", "TRANSPORT" }, detail2.unlock_error)
    end)

    it("unlocks and closes its lock when the run raises, and forget/state take the same lock", function()
      local e = setup()
      local s = e.new("w:t")
      local closed = 0
      local orig = e.locks.new
      e.locks.new = function()
        local lk = orig()
        function lk.close() closed = closed + 1 end
        return lk
      end
      e.client.exec = function(_, _, out) out.stdout[1] = "a" end
      assert.has_error(function() s:run("1", { on_stdout = function() error("callback failed") end }) end)
      assert.equal(1, closed)
      assert.same({ "lock " .. s.tag_value, "unlock " .. s.tag_value }, { e.locks.log[#e.locks.log - 1],
        e.locks.log[#e.locks.log] })
      assert(s:run("2"))
      assert.equal(2, closed)
      assert.is_true(s:forget())
      assert.same({}, assert(s:state()))
      assert.equal(4, closed)
      e.locks.held[s.tag_value] = {}
      assert.same({ nil, "session 'w:t' is busy (another run holds it)", "BUSY" }, { s:forget() })
      e.locks.busy_err = "connection refused"
      assert.same({ nil, "cannot lock session 'w:t': connection refused", "LOCK" }, { s:state() })
      assert.equal(6, closed)
    end)

    it("retries only once", function()
      local e = setup({ exec_timeout = 300, idle_timeout = 300 })
      local s = e.new("w:t")
      assert(s:run("1"))
      e.client.fail.run = { { "gone", "SANDBOX_GONE" }, { "gone again", "SANDBOX_GONE" } }
      local r, err, code = s:run("2", { timeout = 30 })
      assert.is_nil(r)
      assert.equal("gone again", err)
      assert.equal("SANDBOX_GONE", code)
    end)

    -- a cell answered 502 with no stream byte while its
    -- sandbox went away may have run there.
    it("never sends a cell of a language without a guard again after an unclear answer", function()
      local e = setup({ exec_timeout = 300, idle_timeout = 300 })
      local s = e.new("w:t")
      assert(s:run("1"))
      e.client.calls = {}
      e.client.fail.run = { { "gone", "SANDBOX_GONE", nil, before_run = function(sb) sb.killed = true end } }
      local r, err, code, detail = s:run("x <- 1", { language = "r", timeout = 30 })
      assert.is_nil(r)
      assert.equal("gone", err)
      assert.equal("SANDBOX_GONE", code)
      assert.is_nil(detail.accepted)
      assert.equal(1, e.client:count("run_code"))
    end)

    it("gives a guarded bash cell up in its sandbox before it sends it again", function()
      local e = setup({ exec_timeout = 300, idle_timeout = 300 })
      local s = e.new("w:t")
      local first = assert(s:run("1"))
      e.client.calls = {}
      e.client.fail.run = { { "bad gateway", "SANDBOX_GONE" } }
      local r = assert(s:run("echo hi", { language = "bash", timeout = 30 }))
      assert.equal(first.sandbox_id, r.sandbox_id)
      assert.equal(2, e.client:count("run_code"))
      assert.same({ "echo hi", "echo hi" }, e.client:codes())
      local gave_up = 0
      for _, c in ipairs(e.client.calls) do
        if c[1] == "make_dir" and c[3]:find("/.warmbox/cells/", 1, true) then gave_up = gave_up + 1 end
      end
      assert.equal(1, gave_up)
    end)

    it("never re-runs a run whose stream broke after it started", function()
      local e = setup({ exec_timeout = 300, idle_timeout = 300 })
      local s = e.new("w:t")
      assert(s:run("1"))
      e.client.calls = {}
      e.client.fail.run = { { "stream broke", "STREAM_BROKEN" } }
      local r, err, code = s:run("2", { timeout = 30 })
      assert.is_nil(r)
      assert.equal("stream broke", err)
      assert.equal("STREAM_BROKEN", code)
      assert.equal(1, e.client:count("run_code"))
    end)

    it("returns BUSY when the session's lock cannot be taken", function()
      local e = setup()
      local s = e.new("w:t")
      e.locks.held[s.tag_value] = true
      local r, err, code = s:run("1")
      assert.is_nil(r)
      assert.equal("session 'w:t' is busy (another run holds it)", err)
      assert.equal("BUSY", code)
      assert.equal(0, #e.client.calls)
    end)

    it("holds the lock around resolve, run and collect, and releases it after", function()
      local e = setup()
      local s = e.new("w:t")
      local held_during
      e.client.exec = function() held_during = e.locks.held[s.tag_value] ~= nil end
      assert(s:run("1"))
      assert.is_true(held_during)
      assert.is_nil(e.locks.held[s.tag_value])
    end)

    it("releases the lock when a callback raises, and re-raises", function()
      local e = setup()
      local s = e.new("w:t")
      e.client.exec = function(_, _, out) out.stdout[1] = "hi\n" end
      assert.has_error(function()
        s:run("1", { on_stdout = function() error("boom", 0) end })
      end)
      assert.is_nil(e.locks.held[s.tag_value])
    end)
  end)

  describe(":run() inputs and outputs", function()
    it("returns stdout, results and the files the run produced (inline and read over envd)", function()
      local e = setup()
      local s = e.new("w:t")
      e.client.exec = function(sb, code, out)
        out.stdout[1] = "a\n"
        out.stdout[2] = "b\n"
        out.results[1] = { text = "42", is_main_result = true, extra = {} }
        if code == "chart" then
          sb.output["small.png"] = "PNG"
          sb.output["big.bin"] = string.rep("x", 100)
        end
      end
      local seen = {}
      local r = assert(s:run("chart", { on_result = function(res) seen[#seen + 1] = res end }))
      assert.equal("a\nb\n", r.stdout)
      assert.equal("", r.stderr)
      assert.equal(1, #r.results)
      assert.equal("42", r.results[1].text)
      assert.equal(1, #seen) -- the private report is not passed on
      assert.same({ { name = "big.bin", content = string.rep("x", 100), mime = "image/png" },
        { name = "small.png", content = "PNG", mime = "image/png" } }, r.files)
      assert.same({ "new1" }, e.client:ids("read_file"))
    end)

    it("gives r.text: the main result's text (as E2B's SDKs' execution.text), nil without one", function()
      local e = setup()
      local s = e.new("w:text")
      e.client.exec = function(_, code, out)
        out.results[1] = { text = "<Figure>", png = "iVBO", is_main_result = false, extra = {} }
        if code == "x + 1" then out.results[2] = { text = "42", is_main_result = true, extra = {} } end
      end
      local r = assert(s:run("x + 1"))
      assert.equal("42", r.text)
      r = assert(s:run("plt.show()"))
      assert.equal(1, #r.results)
      assert.is_nil(r.text) -- a display result is not the cell's value
    end)

    it("sends the hooks in a cell of their own until the kernel reports it has them", function()
      local e = setup()
      local s = e.new("w:t")
      assert(s:run("1"))
      assert(s:run("2"))
      local codes = {}
      for _, c in ipairs(e.client.calls) do if c[1] == "run_code" then codes[#codes + 1] = c[3] end end
      assert.same({ require("warmbox.outputs").PRELUDE, "1", "2" }, codes)
    end)

    it("returns only the files this run produced on a reused sandbox", function()
      local e = setup()
      local s = e.new("w:t")
      e.client.exec = function(sb, code) if code == "write" then sb.output["old.png"] = "OLD" end end
      local r1 = assert(s:run("write"))
      assert.equal(1, #r1.files)
      local r2 = assert(s:run("nothing"))
      assert.same({}, r2.files)
    end)

    it("empties the output directory over envd for other languages", function()
      local e = setup()
      local s = e.new("w:t")
      assert(s:run("1"))
      e.client.sb.new1.output["stale.txt"] = "old"
      e.client.calls = {}
      local r = assert(s:run("echo hi", { language = "bash" }))
      assert.same({ "new1" }, e.client:ids("remove"))
      assert.same({ "new1" }, e.client:ids("make_dir"))
      assert.same({}, r.files)
    end)

    it("writes input files to /home/user", function()
      local e = setup()
      local s = e.new("w:t")
      assert(s:run("1", { files = { ["data.csv"] = "a,b\n1,2\n" } }))
      assert.same("a,b\n1,2\n", e.client.sb.new1.files["/home/user/data.csv"])
    end)

    it("refuses input names that could escape /home/user, before doing anything", function()
      local e = setup()
      local s = e.new("w:t")
      for _, name in ipairs({ "../../etc/x", "a/b", "..", ".", "", "x\0y", "..\\x" }) do
        local r, err, code = s:run("1", { files = { [name] = "x" } })
        assert.is_nil(r)
        assert.matches("input file name", err)
        assert.equal("BAD_REQUEST", code)
      end
      assert.equal(0, #e.client.calls)
    end)

    it("raises on misuse", function()
      local e = setup()
      local s = e.new("w:t")
      assert.has_error(function() s:run(42) end, "bad argument #1 to 'run' (string expected, got number)")
      assert.has_error(function() s:run("1", { nope = 1 }) end, "bad argument #2 to 'run' (unknown option 'nope')")
      assert.has_error(function() s:run("1", { timeout = -1 }) end,
        "bad argument #2 to 'run' (option 'timeout': positive number of seconds up to max_run_length expected, got -1)")
      assert.has_error(function() s:run("1", { timeout = math.huge }) end)
      assert.has_error(function() s:run("1", { timeout = 0 / 0 }) end)
      assert.has_error(function() s:run("1", { files = "x" }) end,
        "bad argument #2 to 'run' (option 'files': table expected, got string)")
    end)
  end)

  describe("policy hooks", function()
    it("tries candidates in the policy's order", function()
      local e = setup({ policy = { order = function(c)
        table.sort(c, function(a, b) return a.sandbox_id < b.sandbox_id end)
        return c
      end } })
      local s = e.new("w:t")
      e.client:add("a", s.tag_value)
      e.client:add("b", s.tag_value)
      local r = assert(s:run("1"))
      assert.equal("a", r.sandbox_id)
      assert.same({ "b" }, e.client:ids("kill"))
    end)

    it("cannot make the session try a sandbox that failed the exact re-check", function()
      local e = setup({ policy = { order = function() return { { sandbox_id = "theirs" } } end } })
      local s = e.new("w:t")
      e.client:add("mine", s.tag_value)
      e.client:add("theirs", "someone else")
      assert(s:run("1"))
      assert.equal(0, e.client:count("connect"))
      assert.is_nil(e.client.sb.theirs.killed)
    end)

    it("uses the policy's lease and create parameters, always keeping the tag", function()
      local e = setup({ policy = {
        lease = function() return 42 end,
        create_params = function(ctx)
          return { template = "base", timeout = ctx.lease, metadata = { owner = "x", warmboxSessionId = "forged" } }
        end,
      } })
      local s = e.new("w:t")
      assert(s:run("1", { timeout = 10 }))
      local p = e.client.calls[2][2]
      assert.equal("base", p.template)
      assert.equal(42, p.timeout)
      assert.same({ owner = "x", warmboxSessionId = s.tag_value, warmboxCreate = p.metadata.warmboxCreate },
        p.metadata)
    end)

    it("raises a policy's lease to the run's timeout + LEASE_MARGIN, never lowers it", function()
      -- The lease is set a round trip before the cell starts and the server ends the
      -- cell at its timeout: a lease of just the timeout would pause the sandbox first.
      for _, case in ipairs({
        { 10, 42 },   -- 10 + 5 <= 42: the policy's lease as it is
        { 37, 42 },   -- 37 + 5 = 42: exactly covered, kept
        { 40, 45 },   -- 40 + 5 > 42: raised to 45
        { 42, 47 },   -- the timeout equal to the lease: 47, not 42
        { 37.5, 43 }, -- ceil(37.5 + 5): leases are whole seconds
      }) do
        local e = setup({ policy = { lease = function() return 42 end } })
        local s = e.new("w:t")
        assert(s:run("1", { timeout = case[1] }))
        assert.equal(case[2], e.client.calls[2][2].timeout, "timeout " .. case[1])
        assert.equal(e.t.now + case[2], s:state().lease_end, "timeout " .. case[1])
      end
    end)

    it("pause_after_run: pauses after every run; the next run resumes it with a connect first", function()
      local e = setup{ policy = { pause_after_run = true }, idle_timeout = 30 }
      local events = {}
      -- watched (a `parallel` that runs the main part alone): the lease is the idle window
      local s = e.new("w:pause", { parallel = function(main) return nil, main() end,
        on_event = function(name, info)
          if name == "pause_after_run" then events[#events + 1] = info.ok end
        end })
      local r1 = assert(s:run("x = 1"))
      assert.equal("paused", e.client.sb[r1.sandbox_id].state)
      assert.same({ true }, events)
      e.t.now = e.t.now + 1                  -- a second later: it is paused all the same
      e.client.calls = {}
      local r2 = assert(s:run("x"))
      assert.equal(r1.sandbox_id, r2.sandbox_id)
      assert.is_true(r2.resumed)
      local names = {}
      for _, call in ipairs(e.client.calls) do names[#names + 1] = call[1] end
      assert.same({ "connect", "run_code", "pause" }, names)
      assert.equal(30, e.client.calls[1][3])  -- resumed for the idle window's lease
    end)

    it("recycles a sandbox whose run would cross E2B's maximum run length: pause, then connect", function()
      local e = setup()
      local s = e.new("w:t", { max_run_length = 3600 })
      local r1 = assert(s:run("1"))
      e.t.now = e.t.now + 3600 - 30 -- 30 s of this run left; the next may take up to 60
      e.client.calls = {}
      local r2 = assert(s:run("2", { timeout = 60 }))
      assert.equal(r1.sandbox_id, r2.sandbox_id)
      local names = {}
      for _, call in ipairs(e.client.calls) do names[#names + 1] = call[1] end
      -- the refresh first (the capped lease cannot cover the run), then the recycle, then the run
      assert.same({ "connect", "pause", "connect", "run_code" }, names)
      local st = s:state()
      assert.equal(e.t.now, st.run_started) -- a new run: the cap moved to now + 3600
      assert.equal(e.t.now + 300, st.lease_end)    -- the idle window (the run's 60 s + margin is shorter)
      -- right after, nothing more is needed
      e.client.calls = {}
      assert(s:run("3", { timeout = 60 }))
      assert.equal(0, e.client:count("pause"))
    end)

    it("does not recycle while the run fits before the maximum run length", function()
      local e = setup()
      local s = e.new("w:t", { max_run_length = 3600 })
      assert(s:run("1"))
      e.t.now = e.t.now + 3600 - 120
      e.client.calls = {}
      assert(s:run("2", { timeout = 60 }))
      assert.equal(0, e.client:count("pause"))
    end)

    it("caps the remembered lease at the run's start + the maximum run length", function()
      local e = setup()
      local s = e.new("w:t", { max_run_length = 400, exec_timeout = 300, idle_timeout = 300 })
      local t0 = e.t.now
      assert(s:run("1", { timeout = 10 }))
      e.t.now = t0 + 200
      assert(s:run("2", { timeout = 10 })) -- refreshed: now + 300 would pass the cap at t0 + 400
      assert.equal(t0 + 400, s:state().lease_end)
    end)

    it("skips the refresh when should_refresh says so", function()
      local e = setup({ policy = { should_refresh = function() return false end } })
      local s = e.new("w:t")
      assert(s:run("1"))
      e.t.now = e.t.now + 10000 -- far past the lease, within E2B's maximum run length
      e.client.calls = {}
      assert(s:run("2"))
      assert.equal(0, e.client:count("connect"))
    end)

    for _, hook in ipairs({ "order", "lease", "should_refresh", "create_params" }) do
      it("returns nil, msg, 'POLICY' when the '" .. hook .. "' hook raises", function()
        local e = setup({ policy = { [hook] = function() error("oops") end } })
        local s = e.new("w:t")
        if hook == "order" then e.client:add("a", s.tag_value) end
        if hook == "should_refresh" then
          s.policy = require("warmbox.policy").default
          assert(s:run("1"))
          s.policy = require("warmbox.policy").merge{ should_refresh = function() error("oops") end }
        end
        local r, err, code = s:run("1")
        assert.is_nil(r)
        assert.matches("hook '" .. hook .. "' failed: .*oops", err)
        assert.equal("POLICY", code)
        assert.is_nil(e.locks.held[s.tag_value])
      end)
    end

    it("returns POLICY for a lease that is not a positive number", function()
      local e = setup({ policy = { lease = function() return "long" end } })
      local r, err, code = e.new("w:t"):run("1")
      assert.is_nil(r)
      assert.equal("policy 'custom' hook 'lease' returned long (positive number expected)", err)
      assert.equal("POLICY", code)
    end)
  end)

  describe("isolation", function()
    it("gets a different sandbox when an env secret or the actor changes", function()
      local e = setup()
      local a = assert(e.new("w:t", { env = { TOKEN = "one" }, actor = "alice" }):run("1"))
      local b = assert(e.new("w:t", { env = { TOKEN = "two" }, actor = "alice" }):run("1"))
      local c = assert(e.new("w:t", { env = { TOKEN = "one" }, actor = "bob" }):run("1"))
      local d = assert(e.new("w:t", { env = { TOKEN = "one" }, actor = "alice" }):run("1"))
      assert.are_not.equal(a.sandbox_id, b.sandbox_id)
      assert.are_not.equal(a.sandbox_id, c.sandbox_id)
      assert.equal(a.sandbox_id, d.sandbox_id)
      assert.same({ TOKEN = "one" }, e.client.sb[a.sandbox_id].env)
      for _, sb in pairs(e.client.sb) do
        assert.is_nil(sb.metadata.warmboxSessionId:find("one", 1, true))
      end
    end)
  end)
end)
