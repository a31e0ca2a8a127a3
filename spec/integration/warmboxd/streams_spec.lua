-- Streams (Process Start/Connect, WatchDir, /execute) are served for as
-- long as their caller likes and never shut to make room, so they are
-- bounded: --max-streams per team, and never the slots of an address (or of
-- all) kept for new requests, so one tenant's streams cannot lock out every
-- local client (all share 127.0.0.1). A body that makes progress (an upload)
-- is not shut to make room either, and a flood of new connections leaves
-- /health answered. Loopback only.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local cjson = http.cjson
local q = wbd.sh_quote

-- Holds n Process/Start streams of sandbox sb open from `source`; returns
-- { statuses, close = fn }.
local function hold_streams(srv, sb, n, source)
  local p = assert(io.popen(string.format("timeout 120 python3 %s %d %s %s %d %s 90",
    q(wbd.root() .. "/spec/helpers/streams.py"), srv.port, sb.sandboxID, sb.envdAccessToken, n,
    source or "127.0.0.1")))
  local pid = assert(tonumber(p:read("l")), "streams.py did not start")
  local line = p:read("l")
  local r = { statuses = assert(cjson.decode(line), line).statuses }
  function r.close()
    os.execute("kill " .. pid .. " 2>/dev/null")
    p:close()
  end
  function r.count(status)
    local c = 0
    for _, s in ipairs(r.statuses) do c = c + (s == status and 1 or 0) end
    return c
  end
  return r
end

local function slow_conns(port, n, kind, health_from)
  local p = assert(io.popen(string.format("timeout 60 python3 %s %d %d 0 0 %s %s",
    q(wbd.root() .. "/spec/helpers/slow_conns.py"), port, n, kind, health_from)))
  local out = p:read("a")
  p:close()
  return assert(cjson.decode(out), "slow_conns.py printed: " .. out)
end

local function create(srv, key)
  local res = http.request{ method = "POST", url = srv.url .. "/sandboxes", headers = { ["X-API-Key"] = key },
    json = { templateID = "base", secure = true, timeout = 600 } }
  assert.are.equal(201, res.status, res.body)
  return res.json
end

describe("warmboxd streams", function()
  it("--max-streams caps one team's concurrent streams (429, resource_exhausted); other teams stream on", function()
    local srv = wbd.start{ args = { "--max-streams", "3" } }
    local held = {}
    local ok, err = pcall(function()
      local a, b = create(srv, srv.api_key), create(srv, wbd.new_key())
      held[1] = hold_streams(srv, a, 5)
      assert.are.same({ 200, 200, 200, 429, 429 }, held[1].statuses)
      held[2] = hold_streams(srv, b, 2)
      assert.are.same({ 200, 200 }, held[2].statuses)
      -- the refusal as envd's Connect error
      local res = http.sandbox(srv, a, 49983, "POST", "/process.Process/Connect",
        { json = { process = { pid = 1 } }, headers = { ["Connect-Protocol-Version"] = "1" } })
      assert.are.equal(429, res.status, res.body)
      assert.are.equal("resource_exhausted", res.json.code)
      assert.matches("--max-streams", res.json.message, 1, true)
      assert.are.equal(200, http.request{ url = srv.url .. "/health" }.status)
      assert.is_true(srv:stats().counters.refused_stream >= 3)
      -- a stream that ended gives its slot back
      held[1].close()
      held[1] = wbd.eventually(function()
        local h = hold_streams(srv, a, 1)
        if h.statuses[1] == 200 then return h end
        h.close()
      end)
      assert.is_truthy(held[1])
    end)
    for _, h in pairs(held) do h.close() end
    srv:stop()
    assert(ok, err)
  end)

  it("never take the slots of an address kept for new requests: /health and the admin API answer", function()
    local srv = wbd.start{ args = { "--max-streams", "0", "--max-conns-per-ip", "16" } }
    local held
    local ok, err = pcall(function()
      local sb = create(srv, srv.api_key)
      held = hold_streams(srv, sb, 16)
      assert.are.equal(12, held.count(200), cjson.encode(held.statuses))
      assert.are.equal(4, held.count(429), cjson.encode(held.statuses))
      -- from the same address as the streams
      assert.are.equal(200, http.request{ url = srv.url .. "/health" }.status)
      assert.are.equal(200, srv:admin("GET", "/stats").status)
      local r = slow_conns(srv.port, 40, "head-now", "127.0.0.1")
      assert.are.equal(200, r.health_status, cjson.encode(r))
    end)
    if held then held.close() end
    srv:stop()
    assert(ok, err)
  end)

  it("leave /health answered through 1,100 connections opened at once from its own address", function()
    local srv = wbd.start{}
    local ok, r = pcall(slow_conns, srv.port, 1100, "head-now", "127.0.0.1")
    srv:stop()
    assert(ok, r)
    assert.are.equal(1100, r.opened)
    assert.are.equal(200, r.health_status, cjson.encode(r))
  end)

  it("never shut an upload that is making progress to make room for new connections", function()
    local srv = wbd.start{ args = { "--max-conns-per-ip", "8" } }
    local file, out = os.tmpname(), os.tmpname()
    local ok, err = pcall(function()
      local sb = create(srv, wbd.new_key())
      assert(os.execute("head -c 12M /dev/urandom > " .. q(file)))
      -- about 6 s at 2 MB/s, from 127.0.0.1 as the flood below
      os.execute(string.format("(curl -sS -o /dev/null -w '%%{http_code}' --limit-rate 2M -X POST -H %s -H %s -H %s "
        .. "-H %s --data-binary @%s %s > %s 2>&1; echo >> %s) &", q("E2b-Sandbox-Id: " .. sb.sandboxID),
        q("E2b-Sandbox-Port: 49983"), q("X-Access-Token: " .. sb.envdAccessToken),
        q("Content-Type: application/octet-stream"), q(file), q(srv.url .. "/files?path=big.bin"), q(out), q(out)))
      wbd.sleep(1.5)
      -- 30 slow bodies from the same address: over --max-conns-per-ip, each makes
      -- room by shutting the oldest waiting connection, never the upload
      slow_conns(srv.port, 30, "body", "127.0.0.1")
      local status = wbd.eventually(function()
        local s = wbd.read_all(out)
        return s and s:match("^(%d+)\n")
      end, 60)
      assert.are.equal("200", status, wbd.read_all(out))
      local st = http.sandbox(srv, sb, 49983, "POST", "/filesystem.Filesystem/Stat",
        { json = { path = "/home/user/big.bin" }, headers = { ["Connect-Protocol-Version"] = "1" } })
      assert.are.equal(200, st.status, st.body)
      assert.are.equal(12 << 20, tonumber(st.json.entry.size))
    end)
    os.remove(file)
    os.remove(out)
    srv:stop()
    assert(ok, err)
  end)
end)
