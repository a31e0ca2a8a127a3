-- At most once behind an intermediary: a proxy in front of
-- warmboxd's data plane (spec/helpers/after_proxy.py) forwards the execute and
-- then answers 502/503/429/404 itself, or answers first and forwards a late
-- copy. Every cell runs exactly once (counted by a line each cell appends to a
-- file in its sandbox, read from the host): the run reports a clear error or
-- the real result, never a silent second run.
local sessions = require "spec.helpers.sessions"
local after_proxy = require "spec.helpers.after_proxy"
local wbd = require "spec.helpers.warmboxd"

describe("sessions behind an intermediary that answers after forwarding", function()
  local env = sessions.new()
  local srv, proxy, wb

  lazy_setup(function()
    srv = env:start()
    proxy = after_proxy.start(srv.url)
    wb = env:warmbox{ sandbox_url = proxy.url, exec_timeout = 60, idle_timeout = 60, request_timeout = 10 }
  end)
  lazy_teardown(function()
    env:stop()
    if proxy then proxy:stop() end
  end)

  -- Executions counted in the sandbox (spec.helpers.sessions).
  local function executions(id, mark) return env:executions(id, mark) end
  local function cell(body) return env:cell(body) end
  local function warm(key) return env:warm(wb, key) end
  local function survived(s, id) return env:survived(s, id) end

  for _, st in ipairs({ 502, 503, 429, 404 }) do
    it("runs a cell once when the answer " .. st .. " came after forwarding: a clear error", function()
      local s, id = warm("proxy:after-" .. st)
      local before = proxy:stats().executes
      proxy:plan{ { mode = "after", status = st, headers = { ["Retry-After"] = "0" } } }
      local code, mark = cell("y = 1")
      local r, err, _, detail = s:run(code)
      assert.is_nil(r, "a run answered " .. st .. " after its cell ran reported ok")
      assert.is_string(err)
      assert.is_true(detail.accepted)
      -- the cell ran: the run never says it did not start
      assert.is_true(detail.started)
      assert.equal(1, proxy:stats().executes - before)
      assert.equal(1, executions(id, mark))
      survived(s, id)
    end)

    it("sends a cell again when the answer " .. st .. " came before forwarding: ran once, ok", function()
      local s, id = warm("proxy:before-" .. st)
      proxy:plan{ { mode = "before", status = st } }
      local code, mark = cell("y = x")
      local r = assert(s:run(code))
      assert.equal(id, r.sandbox_id)
      assert.equal(1, executions(id, mark))
      survived(s, id)
    end)
  end

  it("refuses the late copy of a cell it gave up and sent again: ran once", function()
    local s, id = warm("proxy:late")
    local done = proxy:stats().late_done
    proxy:plan{ { mode = "late", status = 502, delay = 0.5 } }
    local code, mark = cell("y = x")
    local r = assert(s:run(code))
    assert.equal(id, r.sandbox_id)
    wbd.eventually(function() return proxy:stats().late_done > done end, 30)
    assert.equal(1, executions(id, mark))
    survived(s, id)
  end)

  -- bash, JavaScript and TypeScript cells carry their id in a guard of their
  -- own (outputs.cell_guarded): the same answers, the same outcomes.
  for _, lang in ipairs({ "bash", "javascript", "typescript" }) do
    it(lang .. ": runs a cell once when the answer came after forwarding: accepted, not re-sent", function()
      local s, id = warm("proxy:after-" .. lang)
      for _, st in ipairs({ 502, 404 }) do
        local before = proxy:stats().executes
        proxy:plan{ { mode = "after", status = st } }
        local code, mark = env:cell_in(lang)
        local r, err, _, detail = s:run(code, { language = lang })
        assert.is_nil(r, "a " .. lang .. " run answered " .. st .. " after its cell ran reported ok")
        assert.is_string(err)
        assert.is_true(detail.accepted)
        assert.is_true(detail.started)
        assert.equal(1, proxy:stats().executes - before)
        assert.equal(1, executions(id, mark))
      end
      survived(s, id)
    end)

    it(lang .. ": sends a cell again when the answer came before forwarding: ran once, ok", function()
      local s, id = warm("proxy:before-" .. lang)
      proxy:plan{ { mode = "before", status = 502 } }
      local code, mark = env:cell_in(lang)
      local r = assert(s:run(code, { language = lang }))
      assert.equal(id, r.sandbox_id)
      assert.equal(1, executions(id, mark))
      survived(s, id)
    end)

    it(lang .. ": refuses the late copy of a cell it gave up and sent again: ran once", function()
      local s, id = warm("proxy:late-" .. lang)
      local done = proxy:stats().late_done
      proxy:plan{ { mode = "late", status = 502, delay = 0.5 } }
      local code, mark = env:cell_in(lang)
      local r = assert(s:run(code, { language = lang }))
      assert.equal(id, r.sandbox_id)
      wbd.eventually(function() return proxy:stats().late_done > done end, 30)
      assert.equal(1, executions(id, mark))
      survived(s, id)
    end)
  end

  it("runs 21 cells answered after forwarding at most once each", function()
    local s, id = warm("proxy:many")
    local statuses = { 502, 503, 429, 404 }
    for i = 1, 21 do
      proxy:plan{ { mode = "after", status = statuses[i % 4 + 1] } }
      local code, mark = cell()
      local r = s:run(code)
      assert.is_nil(r)
      assert.equal(1, executions(id, mark))
    end
  end)
end)
