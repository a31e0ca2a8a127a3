-- Behaviour 10 and the round trips of a warm run against a real warmboxd:
-- the remembered sandbox and lease, a remembered sandbox that is gone, a
-- stream that broke after it started.
local wbd = require "spec.helpers.warmboxd"
local sessions = require "spec.helpers.sessions"
local http = require "spec.helpers.http"

describe("sessions: remembering the sandbox (warmboxd)", function()
  local env = sessions.new()
  local srv, lockdir, wb
  local offset = 0

  local function stats() return env:stats() end
  local function total() return stats().total_requests end

  lazy_setup(function()
    srv = env:start()
    lockdir = env.lockdir
    wb = env:warmbox{ exec_timeout = 300, idle_timeout = 300, clock = function() return os.time() + offset end }
  end)
  -- one spec kills a sandbox under a run on purpose
  lazy_teardown(function() env:stop{ kill_during_run = true } end)

  it("runs a warm session with no files in one round trip", function()
    local s = wb:session("rt:1")
    assert(s:run("x = 1"))
    assert(s:run("x += 1")) -- the kernel now has warmbox's output hooks
    for i = 1, 3 do
      local n0 = total()
      local r = assert(s:run("x += 1\nx", { timeout = 60 }))
      assert.equal(1, total() - n0)
      assert.equal(tostring(2 + i), r.results[1].text)
    end
  end)

  it("takes two round trips (connect + run) when the lease needs refreshing, and no list", function()
    local s = wb:session("rt:2")
    assert(s:run("x = 1"))
    assert(s:run("x"))
    offset = offset + 200 -- less than half the idle window left on the remembered lease
    http.request{ method = "POST", url = srv.url .. "/_warmboxd/stats/reset" }
    local r = assert(s:run("x", { timeout = 60 }))
    local st = stats()
    assert.equal(2, st.total_requests)
    assert.equal(1, st.requests["POST /sandboxes/{id}/connect"])
    assert.is_nil(st.requests["GET /v2/sandboxes"])
    assert.equal("1", r.results[1].text)
    local n0 = total()
    assert(s:run("x", { timeout = 60 }))
    assert.equal(1, total() - n0) -- refreshed: one round trip again
  end)

  it("shares what it remembers with another process through the lock", function()
    local s = wb:session("rt:shared")
    local r1 = assert(s:run("x = 7"))
    local script = string.format([[
      package.path = %q
      package.cpath = %q
      local warmbox = require "warmbox"
      local wb = assert(warmbox.new{ api_url = %q, sandbox_url = %q, api_key = %q,
        lock = { backend = "file", dir = %q }, exec_timeout = 300, idle_timeout = 300 })
      local r = assert(wb:session("rt:shared"):run("x", { timeout = 60 }))
      io.write(r.sandbox_id, " ", r.results[1].text)
      wb:close()
    ]], package.path, package.cpath, srv.url, srv.url, srv.api_key, lockdir)
    local n0 = total()
    local p = io.popen("lua5.4 -e " .. wbd.sh_quote(script))
    local out = p:read("a")
    p:close()
    assert.equal(r1.sandbox_id .. " 7", out)
    assert.equal(1, total() - n0)
  end)

  it("notices a remembered sandbox that was killed elsewhere, resolves again and runs once more", function()
    local s = wb:session("rt:gone")
    local r1 = assert(s:run("x = 1"))
    assert.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. r1.sandbox_id).status)
    http.request{ method = "POST", url = srv.url .. "/_warmboxd/stats/reset" }
    local r2 = assert(s:run("print('ran')", { timeout = 60 }))
    local st = stats()
    assert.are_not.equal(r1.sandbox_id, r2.sandbox_id)
    assert.is_false(r2.reused)
    assert.equal("ran\n", r2.stdout)
    -- refused by the killed sandbox, then the new kernel's output hooks cell and the cell
    assert.equal(3, st.requests["interp POST /execute"])
    assert.equal(1, st.requests["POST /sandboxes"])
    assert.equal(0, st.counters.exec_overlap or 0)
  end)

  it("returns an error and does not re-run a run whose stream broke after it started", function()
    local s = wb:session("rt:broken")
    local r1 = assert(s:run("x = 1"))
    http.request{ method = "POST", url = srv.url .. "/_warmboxd/stats/reset" }
    local killed = false
    local r, err, code = s:run("import time\nprint('started', flush=True)\ntime.sleep(30)\nprint('never')", {
      timeout = 60,
      on_stdout = function(t)
        if not killed and t:find("started", 1, true) then
          killed = true
          http.api(srv, "DELETE", "/sandboxes/" .. r1.sandbox_id) -- the sandbox dies under the run
        end
      end,
    })
    assert.is_true(killed)
    assert.is_nil(r)
    assert.matches("stream", err)
    assert.equal("STREAM_BROKEN", code)
    local st = stats()
    assert.equal(1, st.requests["interp POST /execute"])
    assert.is_nil(st.requests["POST /sandboxes"])
  end)

  it("recycles a sandbox near E2B's maximum run length so a run is never paused underneath", function()
    local w = env:warmbox{ exec_timeout = 60, idle_timeout = 300 } -- the real clock: it reads started_at
    local s = w:session("rt:maxlen")
    -- A running sandbox of this session whose run began 24 h - 20 s ago (warmboxd's cap is 24 h).
    local seeded = http.api(srv, "POST", "/_warmboxd/seed", { count = 1, state = "running",
      templateID = "code-interpreter-v1", timeout = 300, started_ago_s = 24 * 3600 - 20,
      autoPause = true, autoResume = true, metadata = { warmboxSessionId = s.tag_value } })
    assert.equal(200, seeded.status)
    local id = assert(w.client:list_all{ metadata = { warmboxSessionId = s.tag_value } })[1].sandbox_id
    env:reset_stats()
    local t0 = os.time()
    local r = assert(s:run("import time\ntime.sleep(1)\n6 * 7", { timeout = 60 }))
    assert.equal(id, r.sandbox_id)
    assert.equal("42", r.results[1].text)
    local st = stats()
    assert.equal(1, env:route("POST /sandboxes/{id}/pause", st))
    assert.equal(0, st.counters.pause_during_run or 0)
    -- a new run of the same sandbox: it started just now, so the next 24 h are its own
    local info = assert(w.client:info(id))
    assert.equal("running", info.state)
    assert.is_true(sessions.utc(info.started_at) >= t0 - 1)
  end)
end)
