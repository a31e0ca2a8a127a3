-- Trust under faults, against a real warmboxd with its fault knobs: every
-- run executes at most once (counted by a line each cell appends to a file in
-- its sandbox before doing anything else, read from the host), the execute
-- stream is decoded without loss, a transient fault never destroys the
-- conversation's state, refusals are retried, timeouts say whether the cell
-- started, and outputs are capped.
-- This file: the part 'transient' of them; shared helpers in spec/helpers/session_faults.lua.
local shared = require "spec.helpers.session_faults"
local sessions = shared.sessions

describe("sessions under faults (warmboxd)", function()
  local env = sessions.new()
  local srv, wb

  lazy_setup(function()
    srv = env:start()
    wb = env:warmbox{ exec_timeout = 60, idle_timeout = 60, request_timeout = 2 }
  end)
  lazy_teardown(function() env:stop() end)
  before_each(function() srv:clear_faults() end)

  -- Executions counted in the sandbox (spec.helpers.sessions).
  local function executions(id, mark) return env:executions(id, mark) end
  local function cell(body) return env:cell(body) end
  local function warm(key, w) return env:warm(w or wb, key) end
  local function survived(s, id) return env:survived(s, id) end

  describe("a transient fault never destroys state", function()
    local cases = {
      { "GET /v2/sandboxes", { status = 500 }, "HTTP" },
      { "GET /v2/sandboxes", { status = 429, count = 9, headers = { ["Retry-After"] = "0" } }, "RATE_LIMITED" },
      { "POST /sandboxes/{id}/connect", { status = 500 }, "HTTP" },
      { "POST /sandboxes/{id}/connect", { status = 503, count = 9 }, "HTTP" },
      { "POST /sandboxes/{id}/connect", { delay_ms = 2500, count = 9 }, "TIMEOUT" },
      { "POST /sandboxes/{id}/timeout", { status = 500 }, "HTTP" },
      { "POST /sandboxes/{id}/timeout", { status = 429, count = 9, headers = { ["Retry-After"] = "0" } },
        "RATE_LIMITED" },
      -- a list of the wrong shape is no "no sandboxes" (that made a duplicate)
      { "GET /v2/sandboxes", { status = 200, body = "{}" }, "PROTOCOL" },
      { "GET /v2/sandboxes", { status = 200, body = "[1, 2]" }, "PROTOCOL" },
    }
    for i, c in ipairs(cases) do
      local route, fault, want = c[1], c[2], c[3]
      it(("%s %s fails the run with %s, kills nothing, and the next run has the state"):format(route,
        fault.status or (fault.delay_ms and "delay") or "?", want), function()
        local s, id = warm("faults:transient-" .. i)
        assert(s:forget()) -- the next run lists, connects and sets the lease
        srv:reset_stats()
        local f = { route = route, count = 1 }
        for k, v in pairs(fault) do f[k] = v end
        srv:fault(f)
        local code, mark = cell()
        local r, _, ecode = s:run(code)
        assert.is_nil(r)
        assert.equal(want, ecode)
        assert.equal(0, executions(id, mark))
        assert.equal(0, srv:count("DELETE /sandboxes/{id}"))
        assert.equal(0, srv:count("POST /sandboxes"))
        srv:clear_faults()
        survived(s, id)
      end)
    end

    it("keeps the remembered sandbox when its refresh (connect) fails transiently", function()
      -- The session's clock moves on (os.time moved, not slept) to 25 s before the lease
      -- end: less than half the 60 s idle window is left, so the run refreshes, and more
      -- than 20 s, so the extension goes alongside the execute.
      local moved = 0
      local w = env:warmbox{ exec_timeout = 60, idle_timeout = 60, request_timeout = 2,
        clock = function() return os.time() + moved end }
      local s, id = warm("faults:refresh", w)
      local lease_end = s:state().lease_end
      moved = lease_end - 25 - os.time()    -- 25 s of the lease left on the session's clock
      srv:reset_stats()
      srv:fault{ route = "POST /sandboxes/{id}/connect", count = 9, status = 503 }
      -- The remembered lease has a safe margin, so the extension goes alongside
      -- the execute: the run goes on while it fails; the lease stays
      -- what it was.
      local r = assert(s:run("x"))
      assert.equal(id, r.sandbox_id)
      assert.is_true(srv:count("POST /sandboxes/{id}/connect") >= 1)
      assert.equal(0, srv:count("GET /v2/sandboxes"))
      assert.equal(id, s:state().sandbox_id)
      assert.equal(lease_end, s:state().lease_end)
      srv:clear_faults()
      survived(s, id)
    end)
  end)

end)
