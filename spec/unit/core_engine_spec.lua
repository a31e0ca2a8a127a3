-- warmbox.core's event engine without a server: its lifecycle, option and
-- argument checking, the pollable fd and its timer, cancel/close/GC of
-- transfers that cannot connect (127.0.0.1:1 refuses at once), and the pure
-- retry rules shared with h:request. Behaviour against real servers:
-- spec/integration/core/engine_spec.lua.
local core = require "warmbox.core"

local REFUSED = "http://127.0.0.1:1/"

-- Steps until every transfer is done; a guard against a hang, not a timing.
local function finish(eng, seconds)
  local deadline = core.now() + (seconds or 20)
  while eng:pending() > 0 do
    assert(core.now() < deadline, "the engine did not finish in time")
    eng:step(0.05)
  end
end

describe("warmbox.Engine", function()
  describe("lifecycle", function()
    it("is created open and closes idempotently", function()
      local eng = core.engine()
      assert.truthy(tostring(eng):match("^warmbox%.Engine: 0?x?%x+$"))
      eng:close()
      eng:close()
      assert.equals("warmbox.Engine (closed)", tostring(eng))
    end)

    it("refuses methods after close", function()
      local eng = core.engine()
      eng:close()
      for _, m in ipairs({ "step", "timeout", "pollfd", "events", "pending" }) do
        assert.has_error(function() eng[m](eng) end, "attempt to use a closed warmbox.Engine")
      end
      local h = core.http{}
      assert.has_error(function() eng:start(h, { url = REFUSED }) end, "attempt to use a closed warmbox.Engine")
      h:close()
    end)

    it("closes on scope exit (__close)", function()
      local outer
      do
        local eng <close> = core.engine()
        outer = eng
      end
      assert.equals("warmbox.Engine (closed)", tostring(outer))
    end)

    it("closes its fd: the pollfd is no longer valid", function()
      local eng = core.engine()
      local fd = eng:pollfd()
      assert.is_false(core.poll(fd, 0))
      eng:close()
      -- the number may be reused by anything opened since; none was
      assert.has_error(function() core.poll(fd, 0) end)
    end)
  end)

  describe("options and arguments", function()
    it("checks the engine options", function()
      assert.has_error(function() core.engine{ nope = 1 } end,
        "bad argument #1 to 'engine' (unknown option 'nope')")
      assert.has_error(function() core.engine{ max_buffered = "x" } end,
        "bad argument #1 to 'engine' (option 'max_buffered': number expected, got string)")
      assert.has_error(function() core.engine{ max_buffered = 0 } end,
        "bad argument #1 to 'engine' (option 'max_buffered': a number >= 1 expected)")
      assert.has_error(function() core.engine(5) end)
      core.engine{ max_buffered = 10 }:close()
    end)

    it("checks start's arguments like h:request", function()
      local eng <close> = core.engine()
      local h <close> = core.http{}
      assert.has_error(function() eng:start({}, { url = REFUSED }) end)
      assert.has_error(function() eng:start(h) end)
      assert.has_error(function() eng:start(h, {}) end, "bad argument #2 to 'start' (option 'url' is required)")
      assert.has_error(function() eng:start(h, { url = REFUSED, bogus = 1 }) end,
        "bad argument #2 to 'start' (unknown option 'bogus')")
      assert.has_error(function() eng:start(h, { url = REFUSED, stream = "xml" }) end,
        'bad argument #2 to \'start\' (option \'stream\': "lines" or "connect" expected)')
      assert.has_error(function() eng:start(h, { url = REFUSED, stream = "lines", on_chunk = print }) end,
        "bad argument #2 to 'start' (option 'on_chunk' is not used by the engine (read tr:frames()))")
      assert.has_error(function() eng:start(h, { url = REFUSED, on_chunk = print }) end,
        "bad argument #2 to 'start' (option 'on_chunk' needs 'stream')")
      h:close()
      assert.has_error(function() eng:start(h, { url = REFUSED }) end, "attempt to use a closed warmbox.Http")
      assert.equals(0, eng:pending())
    end)
  end)

  describe("the pollable fd", function()
    it("is idle with nothing to do", function()
      local eng <close> = core.engine()
      assert.equals("r", eng:events())
      assert.is_nil(eng:timeout())
      assert.equals(0, eng:pending())
      assert.is_false(core.poll(eng:pollfd(), 0))
      assert.same({}, eng:step(0))
    end)

    it("turns readable when a transfer starts, and step serves it", function()
      local eng <close> = core.engine()
      local h <close> = core.http{}
      local tr = eng:start(h, { url = REFUSED, retry = false })
      assert.equals(1, eng:pending())
      assert.equals(0, eng:timeout())
      assert.is_true(core.poll(eng:pollfd(), 0))
      assert.is_false(tr:done())
      assert.has_error(function() tr:result() end, "the transfer is not done (check tr:done())")
      local news = {}
      while #news == 0 do news = eng:step(1) end
      assert.equals(tr, news[1])
      assert.is_true(tr:done())
      local res, msg, code = tr:result()
      assert.is_nil(res)
      assert.equals("TRANSPORT", code)
      assert.truthy(msg:find("(GET http://127.0.0.1:1/, attempt 1)", 1, true), msg)
      -- the same outcome every time it is asked
      local res2, msg2, code2 = tr:result()
      assert.is_nil(res2)
      assert.equals(msg, msg2)
      assert.equals(code, code2)
      assert.equals(0, eng:pending())
      assert.is_nil(eng:timeout())
      assert.same({}, (tr:frames()))
      assert.truthy(tostring(tr):match("^warmbox%.Transfer: .* %(done%)$"))
    end)

    it("retries a refused connection on its timer, never sleeping", function()
      local eng <close> = core.engine()
      local h <close> = core.http{}
      local tr = eng:start(h, { url = REFUSED, retry = { attempts = 3, base = 0.4, cap = 0.4 } })
      -- the first attempt fails at once; then the transfer waits on the
      -- timer (jitter puts it in [0.2, 0.4] s), and step(0) returns at once
      local waited
      for _ = 1, 100 do
        eng:step(0.01)
        local t = eng:timeout()
        if t and t > 0.05 and tostring(tr):find("(waiting)", 1, true) then
          waited = t
          break
        end
      end
      assert.truthy(waited, "the transfer never waited for a retry")
      assert.truthy(waited <= 0.4)
      assert.is_false(tr:done())
      assert.same({}, eng:step(0))
      assert.is_false(core.poll(eng:pollfd(), 0))
      assert.is_true(core.poll(eng:pollfd(), 2))   -- the timer fires
      finish(eng)
      local res, msg, code = tr:result()
      assert.is_nil(res)
      assert.equals("TRANSPORT", code)
      assert.truthy(msg:find("attempt 3)", 1, true), msg)
    end)

    it("scrubs secret header values from messages", function()
      local eng <close> = core.engine()
      local h <close> = core.http{}
      local tr = eng:start(h, { url = REFUSED .. "k-SECRET", headers = { ["X-API-Key"] = "k-SECRET" }, retry = false })
      finish(eng)
      local _, msg = tr:result()
      assert.falsy(msg:find("SECRET", 1, true), msg)
      assert.truthy(msg:find("***", 1, true), msg)
    end)
  end)

  describe("ending transfers", function()
    it("cancels a transfer: once, with ABORTED, and as news", function()
      local eng <close> = core.engine()
      local h <close> = core.http{}
      local tr = eng:start(h, { url = REFUSED, retry = { attempts = 5, base = 5, cap = 5 } })
      eng:step(0.2)
      assert.is_true(tr:cancel())
      assert.is_false(tr:cancel())
      assert.is_true(tr:done())
      assert.equals(0, eng:pending())
      assert.same({ tr }, eng:step(0))
      local res, msg, code = tr:result()
      assert.is_nil(res)
      assert.equals("ABORTED", code)
      assert.truthy(msg:find("transfer cancelled", 1, true), msg)
    end)

    it("aborts every transfer when the engine closes", function()
      local eng = core.engine()
      local h <close> = core.http{}
      local a = eng:start(h, { url = REFUSED, retry = { attempts = 5, base = 5, cap = 5 } })
      local b = eng:start(h, { url = REFUSED, retry = false })
      eng:close()
      for _, tr in ipairs({ a, b }) do
        assert.is_true(tr:done())
        local res, msg, code = tr:result()
        assert.is_nil(res)
        assert.equals("ABORTED", code)
        assert.truthy(msg:find("engine closed", 1, true), msg)
        assert.is_false(tr:cancel())
      end
    end)

    it("aborts a transfer nobody holds when it is collected", function()
      local eng <close> = core.engine()
      local h <close> = core.http{}
      local function forget()
        local tr = eng:start(h, { url = REFUSED, retry = { attempts = 5, base = 5, cap = 5 } })
        -- pending while held (asked here: under GC stress an unheld one goes at once)
        assert.equals(1, eng:pending())
        assert.is_false(tr:done())
      end
      forget()
      collectgarbage()
      collectgarbage()
      assert.equals(0, eng:pending())
      assert.same({}, eng:step(0))
    end)

    it("survives its own collection with transfers in flight", function()
      local h <close> = core.http{}
      -- in a function of its own: no register of this one keeps them alive
      local collected = setmetatable({}, { __mode = "k" })
      local function forget()
        local eng = core.engine()
        collected[eng] = true
        for _ = 1, 5 do eng:start(h, { url = REFUSED, retry = { attempts = 5, base = 5, cap = 5 } }) end
        eng:step(0)
      end
      forget()
      collectgarbage()
      collectgarbage()
      assert.is_nil(next(collected))
      -- the client is still usable with its pool
      local eng <close> = core.engine()
      local tr = eng:start(h, { url = REFUSED, retry = false })
      finish(eng)
      assert.equals("TRANSPORT", select(3, tr:result()))
    end)

    it("keeps a closed client's pool until its transfers end", function()
      local eng <close> = core.engine()
      local h = core.http{}
      local tr = eng:start(h, { url = REFUSED, retry = { attempts = 2, base = 0.01, cap = 0.01 } })
      h:close()
      finish(eng)
      local _, msg = tr:result()
      assert.truthy(msg:find("attempt 2)", 1, true), msg)
    end)
  end)
end)

describe("core.poll", function()
  it("checks its arguments", function()
    assert.has_error(function() core.poll() end, "bad argument #1 to 'poll' (number expected, got no value)")
    assert.has_error(function() core.poll(-1, 0) end, "bad argument #1 to 'poll' (not a file descriptor)")
  end)
end)

describe("the retry rules (core._retry_decide)", function()
  local d = core._retry_decide
  local function facts(t)
    local f = { attempts = 1, max_attempts = 3, base = 0.1, cap = 2, budget = 30, jitter = 0 }
    for k, v in pairs(t) do f[k] = v end
    return f
  end

  it("retries an idempotent request on a listed status with capped, jittered backoff", function()
    assert.equals(0.05, d(facts{ idempotent = true, completed = true, status = 503 }))
    local top = d(facts{ idempotent = true, completed = true, status = 503, jitter = 0.999999 })
    assert.is_true(top > 0.0999 and top < 0.1)
    assert.equals(0.2, d(facts{ idempotent = true, completed = true, status = 502, attempts = 3, max_attempts = 5 }))
    assert.equals(1, d(facts{ idempotent = true, completed = true, status = 504, attempts = 9, max_attempts = 10 }))
  end)

  it("does not retry unlisted statuses, nor past the attempts", function()
    assert.equals(-1, d(facts{ idempotent = true, completed = true, status = 500 }))
    assert.equals(0.05, d(facts{ idempotent = true, completed = true, status = 500, statuses = { 500 } }))
    assert.equals(-1, d(facts{ idempotent = true, completed = true, status = 503, statuses = { 500 } }))
    assert.equals(-1, d(facts{ idempotent = true, completed = true, status = 503, attempts = 3 }))
  end)

  it("never re-sends a completed non-idempotent request", function()
    assert.equals(-1, d(facts{ completed = true, status = 503 }))
    assert.equals(-1, d(facts{ completed = true, status = 429, retry_after = 0 }))
  end)

  it("re-sends a non-idempotent request only when nothing was sent", function()
    assert.equals(-1, d(facts{ connection_error = true }))
    assert.equals(0.05, d(facts{ connection_error = true, before_send = true }))
    assert.equals(0.05, d(facts{ before_send = true }))
    assert.equals(0.05, d(facts{ idempotent = true, connection_error = true }))
    assert.equals(-1, d(facts{ idempotent = true }))  -- e.g. a timeout after sending
  end)

  it("honours Retry-After on 429 and 503 only", function()
    assert.equals(7, d(facts{ idempotent = true, completed = true, status = 429, retry_after = 7 }))
    assert.equals(0, d(facts{ idempotent = true, completed = true, status = 503, retry_after = 0 }))
    assert.equals(0.05, d(facts{ idempotent = true, completed = true, status = 502, retry_after = 7 }))
  end)

  it("caps the Retry-After it honours at retry_after_max", function()
    local function ra(status, header, max)
      return d(facts{ idempotent = true, completed = true, status = status, retry_after = header,
        retry_after_max = max })
    end
    assert.equals(0.5, ra(429, 7, 0.5))
    assert.equals(0, ra(503, 100, 0))      -- within the budget now: retried at once
    assert.equals(3, ra(429, 3, 5))
    -- no Retry-After: the backoff, whatever the cap
    assert.equals(0.05, d(facts{ idempotent = true, completed = true, status = 503, retry_after_max = 0 }))
  end)

  it("stops at the budget", function()
    assert.equals(-1, d(facts{ idempotent = true, completed = true, status = 429, retry_after = 100 }))
    assert.equals(-1, d(facts{ idempotent = true, completed = true, status = 503, elapsed = 29.99 }))
  end)

  it("never retries after stream output or a local failure", function()
    assert.equals(-1, d(facts{ idempotent = true, connection_error = true, delivered = 1 }))
    assert.equals(-1, d(facts{ idempotent = true, connection_error = true, local_failure = true }))
  end)
end)
