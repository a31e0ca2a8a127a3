-- warmbox.gc against a real warmboxd: seeded tagged sandboxes are aged via
-- the policy's max_age (and the GC clock), old ones are killed through the
-- control plane, young ones, busy sessions and sandboxes without our tag
-- are left alone. Also gc.release and a demote of a real sandbox.
-- This file: the part 'passes' of them; shared helpers in spec/helpers/gc_warmboxd.lua.
local shared = require "spec.helpers.gc_warmboxd"
local wbd = shared.wbd
local gc = shared.gc
local lock = shared.lock
local TAG = shared.TAG
local T = shared.T

describe("warmbox.gc at scale, policies and scheduling, against warmboxd", function()
  local srv, client, dir
  local rules = require "warmbox.policy.rules"
  local DAY = 86400

  before_each(function()
    srv = wbd.start{ args = { "--rtt-ms", "0" } }
    client = require("warmbox.e2b").new{ api_key = srv.api_key, api_url = srv.url, sandbox_url = srv.url }
    dir = os.tmpname()
    os.remove(dir)
  end)
  after_each(function()
    client:close()
    srv:stop()
    os.execute("rm -rf '" .. dir .. "'")
  end)

  local function seed_sessions(n_sessions, per, ago)
    for i = 1, n_sessions do
      wbd.seed(srv, { count = per, state = "paused", metadata = { [TAG] = T["s" .. i] },
        started_ago_s = ago + 3600, paused_ago_s = ago })
    end
  end
  local function count_listed()
    local n = 0
    for item, err in client:list{ state = { "running", "paused" } } do
      assert(item, err)
      n = n + 1
    end
    return n
  end

  describe("passes", function()
    it("on the event engine: at most `concurrency` kills in flight, listing alongside them", function()
      seed_sessions(6, 100, 30 * DAY) -- 600 expired
      seed_sessions(6, 100, 3600)
      assert.equal(204, wbd.admin(srv, "POST", "config", { rtt_ms = 20 }).status)
      -- count the requests in flight on the transport GC's tasks use
      local runner = require "warmbox.runner"
      local orig = runner.transport
      local flight = { kill = 0, list = 0, max_kill = 0, overlap = 0, transports = 0 }
      runner.transport = function(h)
        local tp = orig(h)
        flight.transports = flight.transports + 1
        local req, batch = tp.request, tp.batch
        local function count(kind, d)
          flight[kind] = flight[kind] + d
          if flight.kill > flight.max_kill then flight.max_kill = flight.kill end
          if flight.kill > 0 and flight.list > 0 then flight.overlap = flight.overlap + 1 end
        end
        return setmetatable({}, { __index = function(_, k)
          if k == "request" then
            return function(_, r)
              local kind = r.method == "DELETE" and "kill" or "list"
              count(kind, 1)
              local res = table.pack(req(tp, r))
              count(kind, -1)
              return table.unpack(res, 1, res.n)
            end
          elseif k == "batch" then
            return function(_, reqs, o)
              count("list", 1)
              local res = batch(tp, reqs, o)
              count("list", -1)
              return res
            end
          end
          return tp[k]
        end })
      end
      local ok, rep = pcall(gc.run, { client = client, tag = TAG, lock = { backend = "file", dir = dir },
        max_age = 7 * DAY, concurrency = 5 })
      runner.transport = orig
      assert(ok, rep)
      assert.same({}, rep.errors)
      assert.equal(600, rep.killed)
      assert.equal(1, flight.transports)
      assert.equal(5, flight.max_kill)
      assert.is_true(flight.overlap > 0, "no list request while kills were in flight")
      assert.equal(600, wbd.stats(srv).requests["DELETE /sandboxes/{id}"])
    end)

    it("on the event engine: a raising callback stops the pass, unlocks, and its resume_token finishes it", function()
      seed_sessions(8, 100, 30 * DAY) -- 800 expired
      assert.equal(204, wbd.admin(srv, "POST", "config", { rtt_ms = 5 }).status)
      local lock_opts = { backend = "file", dir = dir }
      local resume, kills = nil, 0
      local ok, err = pcall(gc.run, { client = client, tag = TAG, lock = lock_opts, max_age = 7 * DAY,
        concurrency = 8, on_page = function(p) resume = p.resume_token end,
        on_action = function(a)
          if a.action == "kill" then
            kills = kills + 1
            if kills == 250 then error("stop here") end
          end
        end })
      assert.is_false(ok)
      assert.matches("stop here", err)
      assert.matches("^wbgc1%.", resume)
      -- every session unlocked
      for i = 1, 8 do
        local lk = lock.new(lock_opts)
        assert.is_true(lk:try_lock(T["s" .. i]), "session s" .. i .. " still locked")
        lk:unlock()
        lk:close()
      end
      local first = wbd.stats(srv).requests["DELETE /sandboxes/{id}"]
      assert.is_true(first >= 250 and first < 800, "kills before the stop: " .. first)
      local rep = assert(gc.run{ client = client, tag = TAG, lock = lock_opts, max_age = 7 * DAY,
        concurrency = 8, next_token = resume })
      assert.same({}, rep.errors)
      assert.equal(0, count_listed())
      assert.equal(800, wbd.stats(srv).requests["DELETE /sandboxes/{id}"]) -- none sent twice
    end)

    it("keeps a conversation in steady use for longer than the retention (the reference sweep's flaw)", function()
      local warmbox = require "warmbox"
      local wb = assert(warmbox.new{ api_url = srv.url, api_key = srv.api_key, lock = { backend = "file", dir = dir },
        idle_timeout = 120, exec_timeout = 20 })
      local steady, idle = wb:session("acme:steady"), wb:session("acme:idle")
      local r0 = assert(steady:run("x = 0", { language = "bash" }))
      assert(idle:run("echo once", { language = "bash" }))
      local t0 = os.time()
      while os.time() - t0 < 4 do -- in steady use: a run every ~second, 4 s > the 2 s retention
        assert(steady:run("x=$((x+1))", { language = "bash" }))
        os.execute("sleep 0.5")
      end
      local info = assert(client:info(r0.sandbox_id))
      assert.equal("running", info.state) -- never paused: its started_at is its creation
      -- the reference sweep (age from startedAt) would kill it:
      assert.is_true(os.time() - gc.parse_time(info.started_at) > 2)
      local rep = assert(wb:gc{ max_age = 2 })
      assert.same({}, rep.errors)
      local by = {}
      for _, a in ipairs(rep.actions) do by[a.key] = a end
      assert.equal("kill", by["acme:idle"].action)
      assert.equal("keep", by["acme:steady"].action)
      assert.matches("used since", by["acme:steady"].reason)
      assert.equal("running", assert(client:info(r0.sandbox_id)).state)
      local r = assert(steady:run("echo $x", { language = "bash" }))
      assert.equal(r0.sandbox_id, r.sandbox_id) -- the same sandbox, its shell state intact
      assert.truthy(tonumber(r.stdout:match("%d+")) >= 3)
      wb:close()
    end)

    it("tiers: demotes once, recognizes the demoted sandbox, kills it later", function()
      -- a sandbox that ran for an hour and was paused ten minutes ago
      wbd.seed(srv, { count = 1, state = "paused", metadata = { [TAG] = T.tiered }, started_ago_s = 4200,
        paused_ago_s = 600 })
      local now = os.time()
      local pol = { gc = rules.gc{ demote_after = 300, kill_after = 1000 } }
      local lock_opts = { backend = "file", dir = dir }
      local rep = assert(gc.run{ client = client, tag = TAG, lock = lock_opts, policy = pol,
        clock = function() return now end })
      assert.same({}, rep.errors)
      assert.equal(1, rep.demoted)
      assert.equal(1, wbd.stats(srv).requests["POST /sandboxes/{id}/pause"])
      local seen
      local spy = { gc = function(item, ctx) seen = item return pol.gc(item, ctx) end }
      rep = assert(gc.run{ client = client, tag = TAG, lock = lock_opts, policy = spy,
        clock = function() return now + 600 end }) -- past demote_after again since the demote
      assert.is_true(seen.demoted)
      assert.equal(0, rep.demoted)
      assert.equal(1, rep.kept)
      rep = assert(gc.run{ client = client, tag = TAG, lock = lock_opts, policy = pol,
        clock = function() return now + 760 end }) -- 1000 - 300 after the demote (+ slack for slow runs)
      assert.equal(1, rep.killed)
    end)

    it("gc_every: runs when due, never two passes at once across processes, resumes its page", function()
      local warmbox = require "warmbox"
      seed_sessions(3, 100, 30 * DAY) -- 300: 3 pages
      local function wb_new()
        return assert(warmbox.new{ api_url = srv.url, api_key = srv.api_key, lock = { backend = "file", dir = dir } })
      end
      local a, b = wb_new(), wb_new()
      -- another process holds the GC lock: no pass here
      local ready = os.tmpname()
      local child = string.format([[
        package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
        package.cpath = %q
        local lk = require("warmbox.lock").new{ backend = "file", dir = %q }
        assert(lk:lock("warmbox-gc:%s"))
        io.open(%q, "w"):write("held"):close()
        os.execute("sleep 3")
        lk:unlock()
      ]], package.cpath, dir, TAG, ready)
      os.remove(ready)
      local p = io.popen("cd " .. wbd.sh_quote(wbd.root()) .. " && lua5.4 -e " .. wbd.sh_quote(child) .. " & ")
      assert(wbd.eventually(function() return wbd.read_all(ready) == "held" end))
      local ok, why = a:gc_every(60, { max_age = DAY })
      assert.is_false(ok)
      assert.equal("busy", why)
      p:close()
      assert(wbd.eventually(function() return a:gc_every(60, { max_age = DAY, pages = 1 }) end))
      assert.equal(200, count_listed())
      -- the pass stopped after a page: the next call (any process) continues at once
      local rep = assert(b:gc_every(60, { max_age = DAY, pages = 1 }))
      assert.equal(100, rep.killed)
      rep = assert(a:gc_every(60, { max_age = DAY }))
      assert.equal(100, rep.killed)
      assert.is_nil(rep.next_token)
      -- done: not due for another minute, whoever asks
      local left
      ok, why, left = b:gc_every(60, { max_age = DAY })
      assert.is_false(ok)
      assert.equal("not due", why)
      assert.is_true(left > 50 and left <= 60)
      assert.has_error(function() a:gc_every(0) end,
        "bad argument #1 to 'gc_every' (positive number expected, got 0)")
      a:close()
      b:close()
      os.remove(ready)
    end)

    it("gc_every: a pass that died mid-way is resumed by the next call, from its last page", function()
      local warmbox = require "warmbox"
      seed_sessions(6, 100, 30 * DAY) -- 600 old: 6 pages
      seed_sessions(3, 100, 3600)      -- 300 young, listed first (newest first)
      local wb = assert(warmbox.new{ api_url = srv.url, api_key = srv.api_key, lock = { backend = "file", dir = dir } })
      local kills = 0
      local ok, err = pcall(wb.gc_every, wb, 3600, { max_age = DAY, on_action = function(a)
        if a.action == "kill" then
          kills = kills + 1
          if kills == 350 then error("the host died") end
        end
      end })
      assert.is_false(ok)
      assert.matches("the host died", err)
      local before = 900 - count_listed()
      assert.is_true(before >= 350 and before < 600)
      -- not due by time (no pass completed), but a pass is pending: it resumes at once
      local rep = assert(wb:gc_every(3600, { max_age = DAY }))
      assert.equal(300, count_listed())
      assert.equal(600, wbd.stats(srv).requests["DELETE /sandboxes/{id}"]) -- none sent twice
      assert.equal(0, rep.kept) -- it started at the page it stopped at, not at the (young) top
      assert.equal(600 - before, rep.killed)
      local again, why = wb:gc_every(3600, { max_age = DAY })
      assert.is_false(again)
      assert.equal("not due", why)
      wb:close()
    end)
  end)
end)
