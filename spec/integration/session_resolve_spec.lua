-- Behaviours 1-7 against a real warmboxd: reuse, create, duplicates, connect
-- failure, dead first candidate, cross-tenant isolation, lease refresh failure.
local wbd = require "spec.helpers.warmboxd"
local sessions = require "spec.helpers.sessions"
local http = require "spec.helpers.http"

local TEMPLATE = "code-interpreter-v1"

local utc = sessions.utc
-- exec_timeout 600, idle_timeout 300: the lease a run asks for is the idle window
-- (300 s), not the run's 600 s timeout + margin: the run's watchdog keeps a longer cell's.
local LEASE = 300

describe("sessions: finding the sandbox (warmboxd)", function()
  local env = sessions.new()
  local srv, lockdir, wb

  local function new_wb(o) return env:warmbox(o) end
  local function stats() return env:stats() end
  local function reset_stats() env:reset_stats() end
  local function fault(route, o) env:fault(route, o) end
  local function tagged(tv, n)
    local ids = {}
    for i = 1, n or 1 do
      local res = http.api(srv, "POST", "/sandboxes", { templateID = TEMPLATE, timeout = 30, secure = true,
        metadata = { warmboxSessionId = tv }, autoPause = true, autoResume = { enabled = true } })
      assert.equal(201, res.status)
      ids[i] = res.json.sandboxID
      if i < (n or 1) then wbd.sleep(0.01) end -- distinct start times: a stable list order
    end
    return ids
  end
  local function listed(tv)
    local items = assert(wb.client:list_all{ state = { "running", "paused" }, metadata = { warmboxSessionId = tv } })
    local ids = {}
    for _, it in ipairs(items) do ids[#ids + 1] = it.sandbox_id end
    table.sort(ids)
    return ids
  end
  local function route(st, name) return env:route(name, st) end

  lazy_setup(function()
    srv = env:start()
    lockdir = env.lockdir
  end)
  lazy_teardown(function() env:stop() end)
  before_each(function()
    wb = new_wb{ exec_timeout = 600, idle_timeout = 300 }
    http.request{ method = "DELETE", url = srv.url .. "/_warmboxd/faults" }
    env:config{ loose_metadata = false }
  end)
  after_each(function()
    -- ours never run two executions at once, nor kill or pause during a run
    local c = stats().counters
    assert.equal(0, c.exec_overlap or 0)
    assert.equal(0, c.kill_during_run or 0)
    assert.equal(0, c.pause_during_run or 0)
    for _, it in ipairs(wb.client:list_all{} or {}) do wb.client:kill(it.sandbox_id) end
    wb:close()
  end)

  it("1. reuses the existing sandbox and sets its lease to the idle window", function()
    local s = wb:session("workspace-1:thread-1")
    local id = tagged(s.tag_value)[1]
    reset_stats()
    local before = os.time()
    local r = assert(s:run("x = 1", { language = "bash" }))
    local st = stats()
    assert.equal(id, r.sandbox_id)
    assert.is_true(r.reused)
    assert.equal(0, route(st, "POST /sandboxes"))
    assert.equal(0, route(st, "DELETE /sandboxes/{id}"))
    assert.same({ id }, listed(s.tag_value))
    local info = assert(wb.client:info(id))
    assert.equal("running", info.state)
    local end_at = utc(info.end_at)
    assert.is_true(end_at >= before + LEASE - 2 and end_at <= os.time() + LEASE + 2, "lease end " .. info.end_at)
  end)

  it("2. creates a tagged sandbox with onTimeout=pause, autoResume and the lease", function()
    local s = wb:session("workspace-1:thread-2")
    reset_stats()
    local before = os.time()
    local r = assert(s:run("echo hi", { language = "bash" }))
    assert.is_false(r.reused)
    assert.equal(1, route(stats(), "POST /sandboxes"))
    local info = assert(wb.client:info(r.sandbox_id))
    assert.same({ on_timeout = "pause", auto_resume = true }, info.lifecycle)
    assert.matches("^%x+$", info.metadata.warmboxCreate) -- the create's own id (see warmbox.tag.CREATE_TAG)
    assert.same({ warmboxSessionId = s.tag_value, warmboxCreate = info.metadata.warmboxCreate }, info.metadata)
    local end_at = utc(info.end_at)
    assert.is_true(end_at >= before + LEASE - 2 and end_at <= os.time() + LEASE + 2, "lease end " .. info.end_at)
    assert.equal("hi\n", r.stdout)
  end)

  it("3. keeps one of several duplicates and kills the others", function()
    local s = wb:session("workspace-1:thread-3")
    local ids = tagged(s.tag_value, 3)
    reset_stats()
    local r = assert(s:run("true", { language = "bash" }))
    local st = stats()
    assert.equal(ids[3], r.sandbox_id) -- the newest, first in E2B's list order
    assert.equal(0, route(st, "POST /sandboxes"))
    assert.equal(2, route(st, "DELETE /sandboxes/{id}"))
    assert.same({ ids[3] }, listed(s.tag_value))
  end)

  it("4. fails the run on a transient connect fault, touches nothing, and reuses the sandbox next time", function()
    local s = wb:session("workspace-1:thread-4")
    local old = tagged(s.tag_value)[1]
    fault("POST /sandboxes/{id}/connect")
    reset_stats()
    local r, _, code = s:run("true", { language = "bash" })
    assert.is_nil(r)
    assert.equal("HTTP", code)
    local st = stats()
    assert.equal(0, route(st, "POST /sandboxes"))
    assert.equal(0, route(st, "DELETE /sandboxes/{id}"))
    assert.equal(0, route(st, "interp POST /execute"))
    r = assert(s:run("true", { language = "bash" }))
    assert.equal(old, r.sandbox_id)
    assert.is_true(r.reused)
    assert.same({ old }, listed(s.tag_value))
  end)

  it("5. passes over a first candidate that answers 404, keeps the second, creates nothing", function()
    local s = wb:session("workspace-1:thread-5")
    local ids = tagged(s.tag_value, 2) -- ids[2] is listed first
    fault("POST /sandboxes/{id}/connect", { status = 404 })
    reset_stats()
    local r = assert(s:run("true", { language = "bash" }))
    local st = stats()
    assert.equal(ids[1], r.sandbox_id)
    assert.equal(0, route(st, "POST /sandboxes"))
    -- the one that answered 404 is gone as far as the session knows: nothing to kill
    assert.equal(0, route(st, "DELETE /sandboxes/{id}"))
  end)

  describe("6. cross-tenant", function()
    it("never connects to, kills or reuses a sandbox tagged for another key, even with loose matching", function()
      local theirs = wb:session("workspace-1:thread-60")
      local mine = wb:session("workspace-1:thread-6")
      assert.equal(1, theirs.tag_value:find(mine.tag_value, 1, true)) -- ours is a prefix of theirs
      local their_id = tagged(theirs.tag_value)[1]
      assert.equal(204, http.request{ method = "POST", url = srv.url .. "/_warmboxd/config",
        json = { loose_metadata = true } }.status)
      -- the server now hands their sandbox out for our tag
      local path = require("warmbox.e2b").list_path{ metadata = { warmboxSessionId = mine.tag_value } }
      local loose = http.api(srv, "GET", path)
      assert.equal(200, loose.status)
      assert.equal(1, #loose.json)
      assert.equal(their_id, loose.json[1].sandboxID)
      local before = assert(wb.client:info(their_id))
      reset_stats()
      local r = assert(mine:run("true", { language = "bash" }))
      local st = stats()
      assert.are_not.equal(their_id, r.sandbox_id)
      assert.equal(0, route(st, "POST /sandboxes/{id}/connect"))
      assert.equal(0, route(st, "POST /sandboxes/{id}/timeout"))
      assert.equal(0, route(st, "DELETE /sandboxes/{id}"))
      assert.equal(1, route(st, "POST /sandboxes"))
      local after = assert(wb.client:info(their_id))
      assert.equal("running", after.state)
      assert.equal(before.end_at, after.end_at)
    end)

    it("keeps keys apart that differ by a suffix, & = % +, case or Unicode normalization", function()
      local keys = { "w:t", "w:t1", "w:t&x=1", "w:t%26x%3D1", "w:t+x", "w:t x", "W:T", "caf\xc3\xa9",
        "cafe\xcc\x81", "w:t/x" }
      local ids, seen = {}, {}
      for i, k in ipairs(keys) do
        local r = assert(wb:session(k):run("echo " .. i, { language = "bash" }))
        assert.equal(i .. "\n", r.stdout)
        assert.is_nil(seen[r.sandbox_id], "two keys share sandbox " .. r.sandbox_id)
        seen[r.sandbox_id] = true
        ids[i] = r.sandbox_id
      end
      -- a fresh object (no remembered state) finds each key's own sandbox again
      local wb2 = new_wb{ exec_timeout = 600, idle_timeout = 300, lock = { backend = "file", dir = lockdir .. "2" } }
      for i, k in ipairs(keys) do
        local r = assert(wb2:session(k):run("echo again", { language = "bash" }))
        assert.equal(ids[i], r.sandbox_id)
        assert.is_true(r.reused)
      end
      wb2:close()
      os.execute("rm -rf '" .. lockdir .. "2'")
    end)
  end)

  it("7. never runs in a sandbox whose lease cannot be set, and leaves it (and its kernel) alone", function()
    local s = wb:session("workspace-1:thread-7")
    local old = tagged(s.tag_value)[1]
    fault("POST /sandboxes/{id}/timeout")
    reset_stats()
    local r, _, code = s:run("true", { language = "bash" })
    assert.is_nil(r)
    assert.equal("HTTP", code)
    local st = stats()
    assert.equal(0, route(st, "POST /sandboxes"))
    assert.equal(0, route(st, "DELETE /sandboxes/{id}"))
    assert.equal(0, route(st, "interp POST /execute"))
    assert.equal("running", assert(wb.client:info(old)).state)
    r = assert(s:run("true", { language = "bash" }))
    assert.equal(old, r.sandbox_id)
  end)
end)
