-- h:batch and the e2b client's batch (lists and kills together) against warmboxd:
-- a retry budget runs from a transfer's first attempt, not from the start of
-- the batch; a low concurrency gets through a large batch; list pages and kills
-- mix in one batch with the client's usual result shapes.
local wbd = require "spec.helpers.warmboxd"
local core = require "warmbox.core"
local e2b = require "warmbox.e2b"

describe("batches against warmboxd", function()
  local srv, h, client
  lazy_setup(function()
    srv = wbd.start{ args = { "--rtt-ms", "0" } }
    h = core.http{ timeout = 10 }
    client = e2b.new{ api_key = srv.api_key, api_url = srv.url, sandbox_url = srv.url }
  end)
  lazy_teardown(function()
    h:close()
    client:close()
    srv:stop()
  end)
  before_each(function() wbd.admin(srv, "DELETE", "faults") end)

  local function get(path, retry)
    return { method = "GET", url = srv.url .. path, headers = { ["X-API-Key"] = srv.api_key }, retry = retry }
  end

  it("h:batch: a transfer queued behind a slow one still has its retry budget", function()
    assert.equal(204, wbd.admin(srv, "POST", "faults", { route = "GET /v2/sandboxes", count = 1,
      delay_ms = 1500 }).status)
    assert.equal(204, wbd.admin(srv, "POST", "faults", { route = "GET /sandboxes/{id}", count = 1,
      status = 503 }).status)
    local out = h:batch({ get("/v2/sandboxes"), get("/sandboxes/nope", { attempts = 3, budget = 1, base = 0.01 }) },
      { concurrency = 1 })
    assert.equal(200, out[1][1].status)
    -- it started 1.5 s into the batch: with the budget counted from there, no retry was left
    assert.equal(404, out[2][1].status)
    assert.equal(2, out[2][1].attempts)
  end)

  it("h:batch at concurrency 1 gets through 300 requests, in order", function()
    local reqs = {}
    for i = 1, 300 do reqs[i] = get("/sandboxes/missing" .. i) end
    local out = h:batch(reqs, { concurrency = 1 })
    assert.equal(300, #out)
    for i = 1, 300 do
      assert.equal(404, out[i][1].status)
      assert.matches("missing" .. i .. "\\\"", out[i][1].body)
    end
  end)

  it("client:batch mixes list pages and kills, with the client's result shapes", function()
    wbd.seed(srv, { count = 250, state = "paused", metadata = { batch = "yes" } })
    local first = client:batch({ { op = "list", opts = { state = "paused", metadata = { batch = "yes" } } } })[1]
    local items, used, nxt = first[1], first[2], first[3]
    assert.equal(100, #items)
    assert.is_false(used)
    assert.is_string(nxt)
    local victim = items[1].sandbox_id
    local out = client:batch({
      { op = "list", opts = { state = "paused", metadata = { batch = "yes" }, next_token = nxt } },
      { op = "kill", id = victim },
      { op = "kill", id = "nosuchsandbox1" },
      { op = "list", opts = { state = "paused", next_token = "garbage" } },
    }, { concurrency = 4 })
    assert.equal(100, #out[1][1])
    assert.equal(nxt, out[1][2])
    assert.is_string(out[1][3])
    assert.same({ true }, out[2])
    assert.same({ false }, out[3])
    assert.is_false(out[4][1])
    assert.equal("BAD_REQUEST", out[4][3])
    assert.equal("garbage", out[4][4])
    -- the page after the cursor did not move when an earlier item was killed
    local again = client:batch({ { op = "list", opts = { state = "paused", metadata = { batch = "yes" },
      next_token = nxt } } })[1]
    assert.equal(out[1][1][1].sandbox_id, again[1][1].sandbox_id)
    assert.has_error(function() client:batch({ { op = "pause", id = "x" } }) end)
  end)
end)
