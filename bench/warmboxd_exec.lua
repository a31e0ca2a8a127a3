-- Benchmark of warmboxd's code interpreter, over warmbox.core's HTTP client
-- (kept-alive connections, as the library talks to it):
--   1. executions/s of a trivial python cell (`1 + 1`) on a warm sandbox;
--   2. latency of create -> first run (the kernel starts lazily on it), with
--      internet access on (slirp4netns) and off, and of the create alone;
--   3. latency of pause -> connect (resume) -> run, the run seeing its state.
-- Usage (from the repository root, after scripts/setup):
--   lua5.4 bench/warmboxd_exec.lua [runs=500] [rounds=10]
-- WARMBOX_BUILD_DIR selects the build (default build/), WARMBOXD_BIN the server.
local env = dofile(((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/env.lua")

local core = require "warmbox.core"
local wbd = require "spec.helpers.warmboxd"
local cjson = require("cjson.safe").new()

local RUNS = tonumber(arg[1]) or 500
local ROUNDS = tonumber(arg[2]) or 10

local srv = wbd.start{ bin = env.warmboxd }
local h = core.http{ timeout = 120 }

local function api(method, path, body)
  local res = assert(h:request{ method = method, url = srv.url .. path,
    headers = { ["X-API-Key"] = srv.api_key, ["Content-Type"] = "application/json" },
    body = body and assert(cjson.encode(body)) or nil })
  return res.status, cjson.decode(res.body)
end

local function execute(sb, code)
  local res = assert(h:request{ method = "POST", url = srv.url .. "/execute",
    headers = { ["E2b-Sandbox-Id"] = sb.sandboxID, ["E2b-Sandbox-Port"] = "49999",
      ["X-Access-Token"] = sb.envdAccessToken, ["Content-Type"] = "application/json" },
    body = assert(cjson.encode({ code = code })) })
  assert(res.status == 200, res.body)
  local main
  for line in res.body:gmatch("[^\n]+") do
    local l = cjson.decode(line)
    if l and l.type == "result" and l.is_main_result then main = l.text end
    if l and l.type == "error" then error("cell failed: " .. line) end
  end
  assert(res.body:find('{"type": "end_of_execution"}', 1, true), res.body)
  return main
end

local function create(internet)
  local status, sb = api("POST", "/sandboxes", { templateID = "code-interpreter-v1", secure = true, timeout = 3600,
    allow_internet_access = internet ~= false })
  assert(status == 201, status)
  return sb
end

local function stats(v)
  table.sort(v)
  local sum = 0
  for _, x in ipairs(v) do sum = sum + x end
  local function pct(p) return v[math.max(1, math.ceil(#v * p))] end
  return string.format("mean %.1f ms  p50 %.1f ms  p90 %.1f ms  max %.1f ms  (n=%d)",
    sum / #v * 1000, pct(0.5) * 1000, pct(0.9) * 1000, v[#v] * 1000, #v)
end

local ok, err = pcall(function()
  -- 1. warm executions
  local sb = create()
  assert(execute(sb, "1 + 1") == "2")
  for _ = 1, 20 do execute(sb, "1 + 1") end
  local t0 = core.now()
  for _ = 1, RUNS do execute(sb, "1 + 1") end
  local dt = core.now() - t0
  print(string.format("warm python run (`1 + 1`):      %.0f executions/s  (%.2f ms each, %d runs)",
    RUNS / dt, dt / RUNS * 1000, RUNS))

  -- 2. create -> first run (the create alone: its network namespace, slirp4netns)
  for _, internet in ipairs({ true, false }) do
    local lat, cr = {}, {}
    for i = 1, ROUNDS do
      local t = core.now()
      local box = create(internet)
      cr[#cr + 1] = core.now() - t
      assert(execute(box, "40 + " .. i) == tostring(40 + i))
      lat[#lat + 1] = core.now() - t
      api("DELETE", "/sandboxes/" .. box.sandboxID)
    end
    local tag = internet and "internet on " or "internet off"
    print("create -> first run, " .. tag .. ": " .. stats(lat))
    print("  of which the create:           " .. stats(cr))
  end

  -- 3. pause -> resume -> run (state kept)
  execute(sb, "kept = 'state'")
  local pr = {}
  for _ = 1, ROUNDS do
    local t = core.now()
    assert(api("POST", "/sandboxes/" .. sb.sandboxID .. "/pause", { memory = true }) == 204)
    assert(api("POST", "/sandboxes/" .. sb.sandboxID .. "/connect", { timeout = 3600 }) == 201)
    assert(execute(sb, "kept") == "state")
    pr[#pr + 1] = core.now() - t
  end
  print("pause -> resume -> run:          " .. stats(pr))
  api("DELETE", "/sandboxes/" .. sb.sandboxID)
end)
h:close()
srv:stop()
if not ok then
  io.stderr:write("bench failed: ", tostring(err), "\n")
  os.exit(1)
end
