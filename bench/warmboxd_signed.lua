-- Benchmark of signed /files URLs without routing headers: the
-- server finds the sandbox by testing the running secure sandboxes' tokens
-- (one SHA-256 each), so a signature that no sandbox made costs a walk of
-- all of them. Prints, for a store with N running secure records (seeded),
-- the latency of a signed download that names a real sandbox and of one
-- whose signature matches none (the worst case), over warmbox.core's HTTP
-- client on a kept-alive connection.
-- Usage (from the repository root, after scripts/setup):
--   lua5.4 bench/warmboxd_signed.lua [requests=200] [sizes=0,10000,100000] [path_bytes=5]
-- path_bytes: the length of the no-match URL's path (the part a client sizes,
-- hashed once whatever the count of sandboxes; over 4096 it is refused unhashed).
-- WARMBOX_BUILD_DIR selects the build (default build/), WARMBOXD_BIN the server.
local env = dofile(((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/env.lua")

local core = require "warmbox.core"
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local envd = require "spec.helpers.envd"
-- A signature as it goes in a URL.
local function sign(raw) return envd.urlencode(envd.sign(raw)) end

local N = tonumber(arg[1]) or 200
local SIZES = {}
for s in (arg[2] or "0,10000,100000"):gmatch("%d+") do SIZES[#SIZES + 1] = tonumber(s) end
local PATH = tonumber(arg[3]) and tonumber(arg[3]) > 5 and string.rep("p", tonumber(arg[3])) or "b.txt"

local function pct(t, p)
  table.sort(t)
  return t[math.max(1, math.ceil(#t * p))]
end

local srv = wbd.start{ bin = env.warmboxd }
local h = core.http{ timeout = 120 }
local res = http.api(srv, "POST", "/sandboxes", { templateID = "base", secure = true, timeout = 3600 })
assert(res.status == 201, res.body)
local sb = res.json
assert(http.sandbox(srv, sb, 49983, "POST", "/files?path=b.txt",
  { body = "bench", headers = { ["Content-Type"] = "application/octet-stream" } }).status == 200)
local good = srv.url .. "/files?path=b.txt&signature=" .. sign("b.txt:read::" .. sb.envdAccessToken)
local bad = srv.url .. "/files?path=" .. PATH .. "&signature=" .. sign(PATH .. ":read::ea_" .. string.rep("0", 64))

local seeded = 0
print(string.format("%-10s %-8s %10s %10s", "secure", "url", "p50 ms", "p95 ms"))
for _, size in ipairs(SIZES) do
  if size > seeded then
    local r = http.api(srv, "POST", "/_warmboxd/seed", { count = size - seeded, state = "running", timeout = 3600 })
    assert(r.status == 200, r.body)
    seeded = size
  end
  for _, which in ipairs({ { "found", good, 200 }, { "no match", bad, 401 } }) do
    local t = {}
    for i = 1, N do
      local t0 = core.now()
      local rr = assert(h:request{ method = "GET", url = which[2] })
      t[i] = (core.now() - t0) * 1000
      assert(rr.status == which[3], rr.status .. " " .. rr.body)
    end
    print(string.format("%-10d %-8s %10.3f %10.3f", size + 1, which[1], pct(t, 0.5), pct(t, 0.95)))
  end
end
srv:stop()
