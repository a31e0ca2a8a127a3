-- warmboxd's POST /sandboxes/{id}/fork over real HTTP, as E2B's: `count`
-- and `timeout`, one result per fork ({sandbox} or {error}), the parent keeps
-- running with its id and expiry, children inherit its metadata and files
-- and the default python context's user namespace (serialised with dill;
-- other kernels boot afresh), 409 on a paused parent.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local cell = require "spec.helpers.cell"

local cjson = http.cjson

describe("warmboxd fork", function()
  local srv

  local function run(sb, code, language) return cell(srv, sb, code, language) end

  local function create()
    local res = http.api(srv, "POST", "/sandboxes", { templateID = "base", timeout = 600, secure = true,
      metadata = { conv = "parent" }, autoPause = true })
    assert.are.equal(201, res.status, res.body)
    return res.json
  end

  local function fork(sb, body)
    return http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/fork", body or {})
  end

  local function info(id) return http.api(srv, "GET", "/sandboxes/" .. id).json end

  lazy_setup(function() srv = wbd.start{} end)
  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  it("starts count children with the parent's metadata and files; the parent keeps its id and expiry", function()
    local parent = create()
    run(parent, "echo before > /home/user/state.txt; echo t > /tmp/t.txt")
    local before = info(parent.sandboxID)
    local res = fork(parent, { count = 2, timeout = 120 })
    assert.are.equal(201, res.status, res.body)
    assert.are.equal(2, #res.json)
    local seen = { [parent.sandboxID] = true }
    for _, r in ipairs(res.json) do
      local child = assert(r.sandbox, cjson.encode(r))
      assert.is_nil(r.error)
      assert.is_nil(seen[child.sandboxID])
      seen[child.sandboxID] = true
      assert.is_string(child.envdAccessToken)
      assert.are.equal("0.6.4", child.envdVersion)
      local ci = info(child.sandboxID)
      assert.are.equal("running", ci.state)
      assert.are.same({ conv = "parent" }, ci.metadata)
      assert.are.equal("pause", ci.lifecycle.onTimeout)
      local lease = wbd.utc(ci.endAt) - wbd.utc(ci.startedAt)
      assert.is_true(lease > 100 and lease <= 120, tostring(lease))
      assert.are.equal("before\nt\n", run(child, "cat /home/user/state.txt /tmp/t.txt"))
      run(child, "echo " .. child.sandboxID .. " > /home/user/state.txt")
      assert.are.equal(child.sandboxID .. "\n", run(child, "cat /home/user/state.txt"))
    end
    local after = info(parent.sandboxID)
    assert.are.equal("running", after.state)
    assert.are.equal(before.endAt, after.endAt)
    assert.are.equal("before\n", run(parent, "cat /home/user/state.txt"))
  end)

  it("carries the parent's python namespace into each child, and lists what it could not carry", function()
    local parent = create()
    local _, err = run(parent, "import socket\nx = 41\ndef inc(v): return v + 1\ns = socket.socket()", "python")
    assert.is_nil(err)
    local res = fork(parent, { count = 2 })
    assert.are.equal(201, res.status, res.body)
    for _, r in ipairs(res.json) do
      local child = assert(r.sandbox, cjson.encode(r))
      assert.are.equal("42", (run(child, "inc(x)", "python")))
      assert.are.equal("{'s': 'not carried: a socket'}", (run(child, "warmbox_unrestored", "python")))
      -- each child's namespace is its own
      run(child, "x = '" .. child.sandboxID .. "'", "python")
      assert.are.equal(child.sandboxID, (run(child, "x", "python")))
    end
    assert.are.equal("41", (run(parent, "x", "python")))
  end)

  it("defaults to one fork; 404 unknown, 409 paused, 400 for a count out of 1..100", function()
    local parent = create()
    local res = fork(parent)
    assert.are.equal(201, res.status, res.body)
    assert.are.equal(1, #res.json)
    assert.is_string(res.json[1].sandbox.sandboxID)
    assert.are.equal(400, fork(parent, { count = 0 }).status)
    assert.are.equal(400, fork(parent, { count = 101 }).status)
    assert.are.equal(400, fork(parent, { count = "2" }).status)
    assert.are.equal(404, fork({ sandboxID = "inotthereatall0000000" }).status)
    assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. parent.sandboxID .. "/pause").status)
    local paused = fork(parent)
    assert.are.equal(409, paused.status, paused.body)
    assert.are.equal(409, paused.json.code)
  end)
end)
