-- `warmbox smoke` with no API key, as a newcomer runs it: it checks the
-- user's shared local warmboxd (started when none runs, as warmbox.new{}
-- does), says so with its URL, and passes every step there. Nothing in its
-- output calls the local server "embedded" (the word of an older release).
-- Each spec has its own XDG_RUNTIME_DIR and stops any server it started.
local shared = require "spec.helpers.cli_server"
local warmbox = shared.warmbox
local state_of = shared.state_of
local private_xdg = shared.private_xdg

local STEPS = require("warmbox.smoke").STEPS
local SMOKE = "--exec-timeout 4 --idle-timeout 2 smoke"

describe("warmbox smoke on a local server", function()
  local x
  before_each(function() x = private_xdg() end)
  after_each(function() x.cleanup() end)

  -- Every step ok, in order, then "smoke ok".
  local function assert_passed(code, out, err)
    assert.equal(0, code, out .. err)
    local pos = 1
    for i, name in ipairs(STEPS) do
      local s, e = out:find(i .. ". " .. name .. "%s+%d+ ms  ok", pos)
      assert.truthy(s, "step " .. i .. " (" .. name .. ") missing or failed:\n" .. out)
      pos = e
    end
    assert.matches("\nsmoke ok\n$", out)
  end

  it("names the user's shared server, with its URL, when it runs", function()
    local code, _, err = warmbox(x.dir, "server start")
    assert.equal(0, code, err)
    local st = assert(state_of(x.dir))
    x.pid = st.pid
    local out
    code, out, err = warmbox(x.dir, SMOKE)
    assert_passed(code, out, err)
    local first = out:match("^[^\n]*")
    assert.equal("warmbox smoke: the shared local warmboxd at " .. st.url .. ", session warmbox-smoke:",
      first:match("^(.-warmbox%-smoke:)"), first)
    assert.is_nil((out .. err):lower():find("embedded", 1, true), out .. err)
  end)

  it("starts the shared server when none runs (as warmbox.new{} does) and names it", function()
    assert.is_nil(state_of(x.dir))
    local code, out, err = warmbox(x.dir, SMOKE)
    assert_passed(code, out, err)
    local st = assert(state_of(x.dir), "no shared server after the smoke")
    x.pid = st.pid
    local first = out:match("^[^\n]*")
    assert.equal("warmbox smoke: the shared local warmboxd at " .. st.url .. ", session warmbox-smoke:",
      first:match("^(.-warmbox%-smoke:)"), first)
    assert.is_nil((out .. err):lower():find("embedded", 1, true), out .. err)
  end)
end)
