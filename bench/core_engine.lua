-- Benchmark of warmbox.core's event engine against one local warmboxd that
-- adds a round-trip time to every request (--rtt-ms, default 20): N requests
-- (GET /v2/sandboxes) all started at once on one engine and driven through
-- its pollable fd, vs the same N one after another with the blocking
-- h:request, vs h:batch with its default bound (8); then K streaming
-- executes of a 0.5 s cell on K sandboxes, all at once on the engine (frames
-- read as they arrive) vs one after another. Prints wall time and requests/s.
-- Usage (from the repository root, after scripts/setup):
--   lua5.4 bench/core_engine.lua [requests=200] [rtt_ms=20] [executes=8]
-- WARMBOX_BUILD_DIR selects the build (default build/).
local env = dofile(((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/env.lua")

local core = require "warmbox.core"
local wbd = require "spec.helpers.warmboxd"

local N = tonumber(arg[1]) or 200
local RTT = tonumber(arg[2]) or 20
local K = tonumber(arg[3]) or 8
local cjson = require("cjson.safe").new()

local srv = wbd.start{ bin = env.warmboxd,
  args = { "--rtt-ms", tostring(RTT) } }
local ok, err = pcall(function()
  local req = { url = srv.url .. "/v2/sandboxes", headers = { ["X-API-Key"] = srv.api_key } }
  local rows = {}
  local function row(name, n, secs)
    rows[#rows + 1] = ("%-40s %6d req %9.3f s %10.1f req/s"):format(name, n, secs, n / secs)
  end

  -- 1. the engine: everything in flight at once, one fd watched
  local h = core.http{ timeout = 120 }
  local eng = core.engine()
  local t0 = core.now()
  local trs = {}
  for i = 1, N do trs[i] = eng:start(h, req) end
  local fd = eng:pollfd()
  while eng:pending() > 0 do
    local t = eng:timeout()
    core.poll(fd, t and math.min(t, 1) or 1)
    eng:step(0)
  end
  local secs = core.now() - t0
  for i = 1, N do assert(assert(trs[i]:result()).status == 200) end
  row("engine, all at once", N, secs)
  eng:close()
  h:close()

  -- 2. sequential h:request on a warm connection
  h = core.http{ timeout = 120 }
  assert(h:request(req))
  local n_seq = math.min(N, 100)
  t0 = core.now()
  for _ = 1, n_seq do assert(assert(h:request(req)).status == 200) end
  row("h:request, one after another", n_seq, core.now() - t0)

  -- 3. h:batch, its default bound
  local reqs = {}
  for i = 1, N do reqs[i] = req end
  t0 = core.now()
  local out = h:batch(reqs)
  secs = core.now() - t0
  for i = 1, N do assert(out[i][1] and out[i][1].status == 200) end
  row("h:batch, concurrency 8", N, secs)
  h:close()

  -- 4. streaming executes of a 0.5 s cell, one per sandbox
  h = core.http{ timeout = 120 }
  local boxes = {}
  local function exec_req(box)
    return { method = "POST", url = srv.url .. "/execute", stream = "lines",
      body = cjson.encode({ code = "import time\nprint('a', flush=True)\ntime.sleep(0.5)\nprint('b')" }),
      headers = { ["E2b-Sandbox-Id"] = box.sandboxID, ["E2b-Sandbox-Port"] = "49999",
        ["X-Access-Token"] = box.envdAccessToken, ["Content-Type"] = "application/json" } }
  end
  local function run_all(list)
    local e = core.engine()
    local ts, frames = {}, 0
    for i, box in ipairs(list) do ts[i] = e:start(h, exec_req(box)) end
    while e:pending() > 0 do
      for _, tr in ipairs(e:step(e:timeout() or 1)) do frames = frames + #tr:frames() end
    end
    for _, tr in ipairs(ts) do assert(assert(tr:result()).status == 200) end
    e:close()
    return frames
  end
  for i = 1, K do
    local res = assert(h:request{ method = "POST", url = srv.url .. "/sandboxes",
      headers = { ["X-API-Key"] = srv.api_key, ["Content-Type"] = "application/json" },
      body = cjson.encode({ templateID = "code-interpreter-v1", secure = true, timeout = 600 }) })
    assert(res.status == 201, res.body)
    boxes[i] = cjson.decode(res.body)
  end
  run_all(boxes)  -- kernels up
  t0 = core.now()
  local frames = run_all(boxes)
  secs = core.now() - t0
  assert(frames >= 4 * K)
  row(("engine, %d executes of 0.5 s at once"):format(K), K, secs)
  t0 = core.now()
  for i = 1, K do run_all({ boxes[i] }) end
  row(("engine, %d executes one after another"):format(K), K, core.now() - t0)
  h:close()

  print(("warmboxd --rtt-ms %d, GET /v2/sandboxes; POST /execute (a 0.5 s python cell)"):format(RTT))
  for _, r in ipairs(rows) do print(r) end
end)
srv:stop()
if not ok then error(err, 0) end
