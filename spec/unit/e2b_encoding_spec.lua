-- The metadata filter and list query of warmbox.e2b against what the official
-- e2b JS SDK (spec/sdk/node_modules, 2.51.0) actually puts on the wire: the
-- SDK is pointed at a capturing HTTP server in the same node process.
-- Skipped when node or the SDK is missing.
local e2b = require "warmbox.e2b"
local wbd = require "spec.helpers.warmboxd"

local CAPTURE = [[
import http from 'node:http'
import { pathToFileURL } from 'node:url'
const [sdkPath, metaJson] = process.argv.slice(2)
const { Sandbox } = await import(pathToFileURL(sdkPath).href)
let seen = null
const srv = http.createServer((req, res) => {
  seen = req.url
  res.setHeader('content-type', 'application/json')
  res.end('[]')
})
await new Promise(r => srv.listen(0, '127.0.0.1', r))
process.env.E2B_API_URL = 'http://127.0.0.1:' + srv.address().port
process.env.E2B_API_KEY = 'e2b_' + '0'.repeat(40)
const p = Sandbox.list({ limit: 7, query: { state: ['running', 'paused'], metadata: JSON.parse(metaJson) } })
await p.nextItems()
srv.close()
console.log(seen)
]]

local function node_available()
  local sdk = wbd.root() .. "/spec/sdk/node_modules/e2b/dist/index.mjs"
  local f = io.open(sdk, "r")
  if not f then return nil end
  f:close()
  if not os.execute("command -v node >/dev/null 2>&1") then return nil end
  return sdk
end

local function sdk_url(sdk, meta)
  local script = os.tmpname() .. ".mjs"
  local f = assert(io.open(script, "w"))
  f:write(CAPTURE)
  f:close()
  local json = require("cjson").encode(meta)
  local p = assert(io.popen(("node %s %s %s 2>&1"):format(wbd.sh_quote(script), wbd.sh_quote(sdk),
    wbd.sh_quote(json))))
  local out = p:read("a")
  p:close()
  os.remove(script)
  return (out:gsub("%s+$", ""))
end

local function query_of(url)
  local q = {}
  for k, v in (url:match("%?(.*)$") or ""):gmatch("([^&]+)=([^&]*)") do q[k] = v end
  return q
end

local function pairs_of(metadata_param)
  local set = {}
  for pair in (metadata_param .. "%26"):gmatch("(.-)%%26") do set[#set + 1] = pair end
  table.sort(set)
  return set
end

describe("warmbox.e2b list query vs the official JS SDK", function()
  local sdk = node_available()

  local cases = {
    { user = "alice smith", app = "prod" },
    { k = "a&b=c%d+e f" },
    { ["we ird&key="] = "v%al+ue é&=x" },
    { u = "héllo wörld ✓", s = "/x?y#z", t = "a-_.!~*'()" },
    { ["%25"] = "%2525", plus = "+++", eq = "===" },
  }

  for i, meta in ipairs(cases) do
    it("encodes metadata case " .. i .. " exactly as the SDK", function()
      if not sdk then
        pending("node or spec/sdk/node_modules/e2b missing")
        return
      end
      local got = query_of(sdk_url(sdk, meta))
      local ours = query_of(e2b.list_path{ state = { "running", "paused" }, limit = 7, metadata = meta })
      assert.equals(got.state, ours.state)
      assert.equals(got.limit, ours.limit)
      assert.same(pairs_of(got.metadata), pairs_of(ours.metadata))
    end)
  end
end)
