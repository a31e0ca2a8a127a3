-- warmbox.core's event engine against a real warmboxd over real HTTP: many
-- requests in flight at once, streaming executes read incrementally and
-- interleaved, backpressure, cancel and GC seen by the server as a
-- disconnect, retries waiting on the engine's timer, the pollable fd. The
-- admin API (stats, faults) goes through spec.helpers.http.
local core = require "warmbox.core"
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"

local cjson = http.cjson
local ROUTE = "GET /v2/sandboxes"

-- Steps until pred() holds; the limit guards against a hang (no timing is asserted).
local function drive(eng, pred, seconds)
  local deadline = core.now() + (seconds or 30)
  while not pred() do
    assert(core.now() < deadline, "the engine did not get there in time")
    eng:step(0.05)
  end
end

-- For loops that step themselves and read the news: drive() would drop the
-- news of its own steps (each transfer is announced once per change).
local function loop(pred, seconds)
  local deadline = core.now() + (seconds or 30)
  while not pred() do
    assert(core.now() < deadline, "the engine did not get there in time")
  end
end

local function finish(eng, seconds)
  drive(eng, function() return eng:pending() == 0 end, seconds)
end

describe("warmbox.Engine against warmboxd", function()
  local srv, h

  lazy_setup(function()
    srv = wbd.start{ args = { "--rtt-ms", "0" } }
    h = core.http{ timeout = 60 }
  end)

  lazy_teardown(function()
    if h then h:close() end
    if srv then srv:stop() end
  end)

  local function admin(method, path, json)
    return http.request{ method = method, url = srv.url .. "/_warmboxd" .. path, json = json }
  end

  local function count(route)
    return admin("GET", "/stats").json.requests[route] or 0
  end

  local function fault(t)
    assert.equals(204, admin("POST", "/faults", t).status)
  end

  local function list_req(extra)
    local r = { url = srv.url .. "/v2/sandboxes", headers = { ["X-API-Key"] = srv.api_key } }
    for k, v in pairs(extra or {}) do r[k] = v end
    return r
  end

  before_each(function()
    assert.equals(204, admin("DELETE", "/faults").status)
    assert.equals(204, admin("POST", "/stats/reset").status)
  end)

  describe("concurrency", function()
    it("has 50 requests in flight at once", function()
      local eng <close> = core.engine()
      fault{ route = ROUTE, count = 50, delay_ms = 3000 }
      local trs, done = {}, 0
      for i = 1, 50 do trs[i] = eng:start(h, list_req()) end
      assert.equals(50, eng:pending())
      -- every request reaches the server while none has been answered
      drive(eng, function() return count(ROUTE) == 50 end)
      for _, tr in ipairs(trs) do
        if tr:done() then done = done + 1 end
      end
      assert.equals(0, done)
      finish(eng)
      local conns = 0
      for _, tr in ipairs(trs) do
        local res = assert(tr:result())
        assert.equals(200, res.status)
        assert.equals(1, res.attempts)
        assert.same({}, cjson.decode(res.body))
        conns = conns + res.new_connections
      end
      -- one connection each: they were all open together
      assert.is_true(conns >= 49)
      assert.equals(50, count(ROUTE))
    end)

    it("serves coroutines that wait on their transfers (a scheduler's shape)", function()
      local eng <close> = core.engine()
      fault{ route = ROUTE, count = 60, delay_ms = 300 }
      local waiting = {}   -- transfer -> coroutine
      local function await(tr)
        waiting[tr] = coroutine.running()
        coroutine.yield()
        return tr:result()
      end
      local results, cos = {}, {}
      for i = 1, 20 do
        cos[i] = coroutine.create(function()
          for j = 1, 3 do
            local res = assert(await(eng:start(h, list_req())))
            results[#results + 1] = { i, j, res.status }
          end
        end)
        assert(coroutine.resume(cos[i]))
      end
      loop(function()
        for _, tr in ipairs(eng:step(eng:timeout() or 1)) do
          local co = waiting[tr]
          if co and tr:done() then
            waiting[tr] = nil
            assert(coroutine.resume(co))
          end
        end
        return eng:pending() == 0 and next(waiting) == nil
      end)
      assert.equals(60, #results)
      for i = 1, 20 do assert.equals("dead", coroutine.status(cos[i])) end
      assert.equals(60, count(ROUTE))
      for _, r in ipairs(results) do assert.equals(200, r[3]) end
    end)

    it("times out a slow answer with TIMEOUT", function()
      local eng <close> = core.engine()
      fault{ route = ROUTE, count = 1, delay_ms = 3000 }
      local tr = eng:start(h, list_req{ timeout = 0.3, retry = false })
      finish(eng)
      local res, msg, code = tr:result()
      assert.is_nil(res)
      assert.equals("TIMEOUT", code)
      assert.truthy(msg:find("timed out", 1, true), msg)
    end)

    it("shares the client's pool with h:request", function()
      local eng <close> = core.engine()
      local tr = eng:start(h, list_req())
      finish(eng)
      assert.equals(200, assert(tr:result()).status)
      local res = assert(h:request(list_req()))
      assert.equals(200, res.status)
      assert.equals(0, res.new_connections)
    end)

    it("finishes a transfer whose client was closed meanwhile", function()
      local eng <close> = core.engine()
      local h2 = core.http{}
      fault{ route = ROUTE, count = 1, delay_ms = 200 }
      local tr = eng:start(h2, list_req())
      h2:close()
      finish(eng)
      assert.equals(200, assert(tr:result()).status)
    end)
  end)

  describe("the pollable fd", function()
    it("turns readable when a response arrives", function()
      local eng <close> = core.engine()
      -- 3 s: the answer must still be on its way at the checks below, on a loaded machine too
      fault{ route = ROUTE, count = 1, delay_ms = 3000 }
      local tr = eng:start(h, list_req())
      drive(eng, function() return count(ROUTE) == 1 end)
      eng:step(0)
      -- sent and waiting: nothing to do until the answer
      assert.is_false(tr:done())
      assert.is_false(core.poll(eng:pollfd(), 0))
      assert.is_true(core.poll(eng:pollfd(), 10))
      local news = {}
      loop(function()
        for _, t in ipairs(eng:step(0.05)) do news[#news + 1] = t end
        return tr:done()
      end)
      assert.same({ tr }, news)
      assert.equals(200, assert(tr:result()).status)
    end)
  end)

  describe("retries", function()
    it("waits for Retry-After on the engine's timer", function()
      local eng <close> = core.engine()
      fault{ route = ROUTE, count = 1, status = 503, headers = { ["Retry-After"] = "2" } }
      local tr = eng:start(h, list_req())
      drive(eng, function() return count(ROUTE) == 1 end)
      -- the 503 is in: the transfer waits about 2 s, on the timer only
      drive(eng, function()
        local t = eng:timeout()
        return t and t > 1 and t <= 2
      end)
      assert.is_false(tr:done())
      assert.same({}, eng:step(0))
      assert.is_false(core.poll(eng:pollfd(), 0))
      assert.equals(1, count(ROUTE))
      assert.is_true(core.poll(eng:pollfd(), 5))
      finish(eng)
      local res = assert(tr:result())
      assert.equals(200, res.status)
      assert.equals(2, res.attempts)
      assert.equals(2, count(ROUTE))
    end)

    it("waits at most retry.retry_after_max of a longer Retry-After", function()
      local eng <close> = core.engine()
      fault{ route = ROUTE, count = 1, status = 503, headers = { ["Retry-After"] = "30" } }
      local tr = eng:start(h, list_req{ retry = { attempts = 2, retry_after_max = 0.5 } })
      drive(eng, function() return count(ROUTE) == 1 end)
      -- the 503 is in: the engine's timer comes down to the cap (0.5 s), not
      -- the header's 30 s, and the second attempt follows
      local chosen
      drive(eng, function()
        chosen = eng:timeout()
        return count(ROUTE) == 2 or (chosen and chosen <= 0.5)
      end, 5)
      assert.equals(1, count(ROUTE))
      finish(eng, 5)
      local res = assert(tr:result())
      assert.equals(200, res.status)
      assert.equals(2, res.attempts)
      assert.has_error(function() eng:start(h, list_req{ retry = { retry_after_max = -1 } }) end,
        "bad argument #2 to 'start' (option 'retry.retry_after_max': a number >= 0 expected)")
    end)

    it("retries 503s with backoff while other transfers proceed", function()
      local eng <close> = core.engine()
      fault{ route = ROUTE, count = 2, status = 503 }
      local slow = eng:start(h, list_req{ retry = { attempts = 3, base = 0.3, cap = 0.3 } })
      local order = {}
      local quick = {}
      drive(eng, function() return count(ROUTE) >= 1 end)
      for i = 1, 5 do
        quick[i] = eng:start(h, { url = srv.url .. "/sandboxes", headers = { ["X-API-Key"] = srv.api_key } })
      end
      loop(function()
        for _, t in ipairs(eng:step(0.05)) do order[#order + 1] = t end
        return eng:pending() == 0
      end)
      assert.equals(slow, order[#order])
      local res = assert(slow:result())
      assert.equals(200, res.status)
      assert.equals(3, res.attempts)
      assert.equals(3, count(ROUTE))
      for i = 1, 5 do assert.equals(200, assert(quick[i]:result()).status) end
    end)

    it("never re-sends a POST whose connection dropped", function()
      local eng <close> = core.engine()
      fault{ route = "POST /sandboxes", count = 1, drop = true }
      local tr = eng:start(h, { method = "POST", url = srv.url .. "/sandboxes", body = '{"templateID":"base"}',
        headers = { ["X-API-Key"] = srv.api_key, ["Content-Type"] = "application/json" },
        retry = { attempts = 3, base = 0.01 } })
      finish(eng)
      local res, msg, code = tr:result()
      assert.is_nil(res)
      assert.equals("TRANSPORT", code)
      assert.truthy(msg:find("attempt 1)", 1, true), msg)
      assert.equals(1, count("POST /sandboxes"))
    end)

    it("does not retry a POST on 503", function()
      local eng <close> = core.engine()
      fault{ route = "POST /sandboxes", count = 1, status = 503 }
      local tr = eng:start(h, { method = "POST", url = srv.url .. "/sandboxes", body = '{"templateID":"base"}',
        headers = { ["X-API-Key"] = srv.api_key, ["Content-Type"] = "application/json" },
        retry = { attempts = 3, base = 0.01 } })
      finish(eng)
      local res = assert(tr:result())
      assert.equals(503, res.status)
      assert.equals(1, res.attempts)
    end)
  end)

  describe("streaming executes", function()
    local box_a, box_b

    local function create_box()
      local res = http.api(srv, "POST", "/sandboxes", { templateID = "code-interpreter-v1", secure = true,
        timeout = 600 })
      assert.equals(201, res.status, res.body)
      return res.json
    end

    local function exec_req(box, code)
      return { method = "POST", url = srv.url .. "/execute", stream = "lines", body = cjson.encode({ code = code }),
        headers = { ["E2b-Sandbox-Id"] = box.sandboxID, ["E2b-Sandbox-Port"] = "49999",
          ["X-Access-Token"] = box.envdAccessToken, ["Content-Type"] = "application/json" } }
    end

    -- Runs a cell to the end with the engine; returns the decoded frames.
    local function run(box, code)
      local eng <close> = core.engine()
      local tr = eng:start(h, exec_req(box, code))
      local frames = {}
      drive(eng, function()
        eng:step(0.05)
        for _, f in ipairs((tr:frames())) do frames[#frames + 1] = assert(cjson.decode(f)) end
        return tr:done()
      end)
      local res = assert(tr:result())
      assert.equals(200, res.status)
      assert.equals(#frames, res.frames)
      return frames
    end

    local function main_result(frames)
      for _, f in ipairs(frames) do
        if f.type == "result" and f.is_main_result then return f.text end
      end
    end

    lazy_setup(function()
      box_a, box_b = create_box(), create_box()
      assert.equals("2", main_result(run(box_a, "1 + 1")))  -- kernels up
      assert.equals("2", main_result(run(box_b, "1 + 1")))
    end)

    it("reads two executes incrementally, their frames interleaved", function()
      local eng <close> = core.engine()
      local code = "import time\nfor i in range(6):\n    print('%s%d' % (WHO, i), flush=True)\n    time.sleep(0.15)"
      local ta = eng:start(h, exec_req(box_a, "WHO = 'a'\n" .. code))
      local tb = eng:start(h, exec_req(box_b, "WHO = 'b'\n" .. code))
      local seen, all = {}, { [ta] = {}, [tb] = {} }
      loop(function()
        for _, tr in ipairs(eng:step(0.05)) do
          for _, f in ipairs((tr:frames())) do
            local j = assert(cjson.decode(f))
            table.insert(all[tr], j)
            if j.type == "stdout" then seen[#seen + 1] = j.text end
          end
        end
        return eng:pending() == 0
      end)
      local pos = {}
      for i, text in ipairs(seen) do pos[text] = i end
      for i = 0, 5 do
        assert.truthy(pos["a" .. i .. "\n"], "missing a" .. i .. " in " .. cjson.encode(seen))
        assert.truthy(pos["b" .. i .. "\n"], "missing b" .. i)
      end
      -- each started before the other finished
      assert.is_true(pos["a0\n"] < pos["b5\n"])
      assert.is_true(pos["b0\n"] < pos["a5\n"])
      for tr, frames in pairs(all) do
        local res = assert(tr:result())
        assert.equals(200, res.status)
        assert.equals(#frames, res.frames)
        assert.equals("end_of_execution", frames[#frames].type)
      end
    end)

    it("reads a Connect stream (envd Process.Start) with its envelope flags", function()
      local eng <close> = core.engine()
      local body = cjson.encode({ process = { cmd = "/bin/bash", args = { "-c", "echo one; sleep 0.2; echo two" } },
        stdin = false })
      local n = #body
      local tr = eng:start(h, { method = "POST", url = srv.url .. "/process.Process/Start", stream = "connect",
        body = string.char(0, (n >> 24) & 255, (n >> 16) & 255, (n >> 8) & 255, n & 255) .. body, retry = false,
        headers = { ["E2b-Sandbox-Id"] = box_a.sandboxID, ["E2b-Sandbox-Port"] = "49983",
          ["X-Access-Token"] = box_a.envdAccessToken, ["Content-Type"] = "application/connect+json",
          ["Connect-Protocol-Version"] = "1", ["Authorization"] = "Basic dXNlcjo=" } })
      local frames, flags = {}, {}
      drive(eng, function()
        local f, fl = tr:frames()
        assert.equals(#f, #fl)
        for i = 1, #f do
          frames[#frames + 1] = assert(cjson.decode(f[i]))
          flags[#flags + 1] = fl[i]
        end
        return tr:done() and #f == 0
      end)
      local res = assert(tr:result())
      assert.equals(200, res.status)
      assert.equals(#frames, res.frames)
      local out = {}
      for i, f in ipairs(frames) do
        if i < #frames then
          assert.equals(0, flags[i])
          local so = f.event and f.event.data and f.event.data.stdout
          if so then out[#out + 1] = require("warmbox.util").b64_decode(so) end
        end
      end
      assert.equals(2, flags[#flags])         -- the end-of-stream envelope
      assert.same({}, frames[#frames])        -- no error in it
      assert.equals("one\ntwo\n", table.concat(out))
    end)

    it("pauses a stream whose frames are not read, and resumes it", function()
      local eng <close> = core.engine{ max_buffered = 8192 }
      local n = 20000
      local tr = eng:start(h, exec_req(box_a, ("for i in range(%d):\n    print('%%06d' %% i + 'x' * 40)"):format(n)))
      local t0 = core.now()
      while core.now() - t0 < 1.5 do eng:step(0.05) end
      local first = tr:frames()
      local unread = 0
      for _, f in ipairs(first) do unread = unread + #f + 5 end
      -- the whole output is ~1 MB; without backpressure it would all be here
      assert.is_true(unread > 0)
      assert.is_true(unread < 8192 + 65536, "unread bytes: " .. unread)
      assert.is_false(tr:done())
      local frames = first
      drive(eng, function()
        eng:step(0.05)
        for _, f in ipairs((tr:frames())) do frames[#frames + 1] = f end
        return tr:done()
      end, 120)
      local out = {}
      for _, f in ipairs(frames) do
        local j = assert(cjson.decode(f))
        if j.type == "stdout" then out[#out + 1] = j.text end
      end
      out = table.concat(out)
      local want = {}
      for i = 0, n - 1 do want[#want + 1] = ("%06d"):format(i) .. ("x"):rep(40) .. "\n" end
      assert.equals(table.concat(want), out)
      assert.equals(200, assert(tr:result()).status)
    end)

    -- A cell that would run for 10 minutes; returns once it has started.
    local function start_long(eng, box, mark)
      local tr = eng:start(h, exec_req(box, ("import time\nmark = %d\nprint('started', flush=True)\ntime.sleep(600)")
        :format(mark)))
      local started = false
      drive(eng, function()
        eng:step(0.05)
        for _, f in ipairs((tr:frames())) do
          if f:find("started", 1, true) then started = true end
        end
        return started
      end)
      return tr
    end

    -- The context is free again only if the server interrupted the cell,
    -- which it does when it sees the client go away.
    local function assert_interrupted(box, mark)
      local eng <close> = core.engine()
      local req = exec_req(box, "mark")
      req.timeout = 20
      local tr = eng:start(h, req)
      local frames = {}
      drive(eng, function()
        eng:step(0.05)
        for _, f in ipairs((tr:frames())) do frames[#frames + 1] = assert(cjson.decode(f)) end
        return tr:done()
      end)
      assert(tr:result())
      assert.equals(tostring(mark), main_result(frames))
    end

    it("cancels an execute: the server sees the disconnect", function()
      local eng <close> = core.engine()
      local tr = start_long(eng, box_a, 31)
      assert.is_true(tr:cancel())
      local res, msg, code = tr:result()
      assert.is_nil(res)
      assert.equals("ABORTED", code)
      assert.truthy(msg:find("transfer cancelled (POST " .. srv.url .. "/execute", 1, true), msg)
      assert_interrupted(box_a, 31)
    end)

    it("aborts the executes of an engine collected with them in flight", function()
      -- in a function of its own: no register of this one keeps them alive
      local function forget()
        local eng = core.engine()
        start_long(eng, box_a, 41)
        start_long(eng, box_b, 42)
      end
      forget()
      collectgarbage()
      collectgarbage()
      assert_interrupted(box_a, 41)
      assert_interrupted(box_b, 42)
    end)

    it("aborts a collected transfer while its engine lives on", function()
      local eng <close> = core.engine()
      local function forget()
        local tr = start_long(eng, box_b, 51)
        -- pending while held (asked here: under GC stress an unheld one goes at once)
        assert.equals(1, eng:pending())
        assert.is_false(tr:done())
      end
      forget()
      collectgarbage()
      collectgarbage()
      assert.equals(0, eng:pending())
      assert_interrupted(box_b, 51)
    end)

    it("aborts executes in flight when the engine is closed", function()
      local eng = core.engine()
      local tr = start_long(eng, box_a, 61)
      eng:close()
      assert.equals("ABORTED", select(3, tr:result()))
      assert_interrupted(box_a, 61)
    end)
  end)
end)
