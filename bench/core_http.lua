-- Benchmark of warmbox.core's transport through warmbox.e2b, against one
-- local warmboxd, side by side in one run:
--   1. requests/s of info() over kept-alive connections vs a new connection
--      per request (a fresh client each time);
--   2. items/s listing 100,000 seeded records with limit 100 via warmbox.e2b,
--      vs the official e2b JS SDK's paginator (bench/list_sdk.mjs) as the baseline.
-- Usage (from the repository root, after scripts/setup):
--   lua5.4 bench/core_http.lua [info_requests=2000] [records=100000]
-- WARMBOX_BUILD_DIR selects the build (default build/).
local env = dofile(((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/env.lua")
local root = env.root

local core = require "warmbox.core"
local e2b = require "warmbox.e2b"
local wbd = require "spec.helpers.warmboxd"
local json = require "warmbox.json"

local N_INFO = tonumber(arg[1]) or 2000
local N_RECORDS = tonumber(arg[2]) or 100000
local LIMIT = 100

local function knob(srv, path, body, key)
  local h = core.http{}
  local headers = { ["Content-Type"] = "application/json", ["X-Warmboxd-Token"] = srv.admin_token }
  if key then headers["X-API-Key"] = key end
  local res = assert(h:request{ method = "POST", url = srv.url .. "/_warmboxd" .. path, headers = headers,
    body = assert(json.encode(body)), timeout = 600 })
  h:close()
  return res
end

local srv = wbd.start{ bin = env.warmboxd,
  args = { "--rtt-ms", "0" } }
local ok, err = pcall(function()
  knob(srv, "/config", { rtt_ms = 0 })
  local c = e2b.new{ api_key = srv.api_key, api_url = srv.url }
  local sb = assert(c:create{ timeout = 3600 })
  local id = sb.sandbox_id
  assert(c:info(id)) -- warm the connection

  -- 1a. kept-alive
  local t0 = core.now()
  for _ = 1, N_INFO do assert(c:info(id)) end
  local keep = N_INFO / (core.now() - t0)

  -- 1b. a new connection per request
  local n_fresh = math.max(1, N_INFO // 2)
  t0 = core.now()
  for _ = 1, n_fresh do
    local f = e2b.new{ api_key = srv.api_key, api_url = srv.url }
    assert(f:info(id))
    f:close()
  end
  local fresh = n_fresh / (core.now() - t0)

  -- 2. listing N_RECORDS seeded records
  local key = wbd.new_key()
  local res = knob(srv, "/seed", { count = N_RECORDS, state = "paused", templateID = "base" }, key)
  assert(res.status == 200, res.body)
  local lc = e2b.new{ api_key = key, api_url = srv.url }
  t0 = core.now()
  local items = 0
  for it, msg in lc:list{ limit = LIMIT, state = { "paused" } } do
    assert(it ~= false, msg)
    items = items + 1
  end
  local lua_s = core.now() - t0
  assert(items == N_RECORDS, ("listed %d of %d"):format(items, N_RECORDS))

  local cmd = ("cd %s && E2B_API_URL=%s E2B_API_KEY=%s E2B_DOMAIN=localhost node bench/list_sdk.mjs %d paused 2>&1")
    :format(wbd.sh_quote(root), wbd.sh_quote(srv.url), wbd.sh_quote(key), LIMIT)
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  p:close()
  local sdk = json.decode(out:match("{.*}") or "")
  c:kill(id)
  c:close()
  lc:close()

  print(("warmbox bench: core_http against warmboxd %s (rtt 0 ms)"):format(srv.url))
  print(("%-52s %12s"):format("", "value"))
  print(("%-52s %12.0f req/s"):format("info(), kept-alive connection", keep))
  print(("%-52s %12.0f req/s"):format("info(), new connection per request", fresh))
  print(("%-52s %12.2fx"):format("  kept-alive / new connection", keep / fresh))
  print(("%-52s %12.0f items/s  (%d items, %.2f s)"):format(
    ("list %d records, limit %d, warmbox.e2b"):format(N_RECORDS, LIMIT), items / lua_s, items, lua_s))
  if type(sdk) == "table" and sdk.items then
    print(("%-52s %12.0f items/s  (%d items, %.2f s)"):format(
      ("list %d records, limit %d, e2b JS SDK paginator"):format(N_RECORDS, LIMIT),
      sdk.items / sdk.seconds, sdk.items, sdk.seconds))
    print(("%-52s %12.2fx"):format("  warmbox.e2b / JS SDK", (items / lua_s) / (sdk.items / sdk.seconds)))
  else
    print("e2b JS SDK baseline failed: " .. out)
  end
end)
srv:stop()
if not ok then
  io.stderr:write("bench failed: " .. tostring(err) .. "\n")
  os.exit(1)
end
