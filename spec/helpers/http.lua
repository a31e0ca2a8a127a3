-- A small HTTP client for specs, over the curl command line tool, so that
-- warmboxd's specs do not depend on warmbox.core (which they help to test).
-- It is test scaffolding, not product code: the library speaks HTTP through
-- libcurl in csrc/core.
--
--   local http = require "spec.helpers.http"
--   local res = http.request{ method = "POST", url = srv.url .. "/sandboxes",
--     headers = { ["X-API-Key"] = key }, json = { templateID = "base" } }
--   res.status, res.headers["x-next-token"], res.body, res.json
--
-- A request to the admin API (/_warmboxd/*) of a server started by
-- spec.helpers.warmboxd carries that server's admin token (X-Warmboxd-Token)
-- unless the request sets that header itself or passes `admin_token = false`.
local cjson = require("cjson.safe").new()
local wbd = require "spec.helpers.warmboxd"

local M = { cjson = cjson }
local q = wbd.sh_quote

local function read_all(path) return wbd.read_all(path) or "" end

local function write_all(path, data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
end

function M.request(o)
  local tmp = os.tmpname()
  local hdr, out, inp = tmp .. ".h", tmp .. ".b", tmp .. ".in"
  -- env -u LD_PRELOAD: the sanitizer run preloads ASan into lua5.4 only; curl must not inherit it.
  local args = { "env", "-u", "LD_PRELOAD", "curl", "-sS", "-o", q(out), "-D", q(hdr), "-w", q("%{http_code}"),
    "-X", q(o.method or "GET"), "--max-time", tostring(o.timeout or 30) }
  local headers = {}
  local has_token = false
  for k, v in pairs(o.headers or {}) do
    headers[#headers + 1] = { k, v }
    if k:lower() == "x-warmboxd-token" then has_token = true end
  end
  if not has_token and o.admin_token ~= false then
    local tok = o.admin_token or wbd.admin_token_for(o.url)
    if tok then headers[#headers + 1] = { "X-Warmboxd-Token", tok } end
  end
  local body = o.body
  if o.json ~= nil then
    body = assert(cjson.encode(o.json))
    headers[#headers + 1] = { "Content-Type", "application/json" }
  end
  for _, h in ipairs(headers) do
    args[#args + 1] = "-H"
    args[#args + 1] = q(h[1] .. ": " .. h[2])
  end
  if body then
    write_all(inp, body)
    args[#args + 1] = "--data-binary"
    args[#args + 1] = q("@" .. inp)
  end
  for _, a in ipairs(o.curl_args or {}) do args[#args + 1] = q(a) end
  args[#args + 1] = q(o.url)
  local p = assert(io.popen(table.concat(args, " ") .. " 2>" .. q(tmp .. ".err")))
  local code = p:read("a")
  p:close()
  local res = { status = tonumber(code) or 0, headers = {}, body = read_all(out),
    error = read_all(tmp .. ".err") }
  -- Headers of the last response (curl writes every response, e.g. after 100-continue).
  for line in read_all(hdr):gmatch("[^\r\n]+") do
    if line:match("^HTTP/") then
      res.headers = {}
    else
      local k, v = line:match("^([^:]+):%s*(.*)$")
      if k then res.headers[k:lower()] = v end
    end
  end
  res.json = cjson.decode(res.body)
  for _, f in ipairs({ tmp, hdr, out, inp, tmp .. ".err" }) do os.remove(f) end
  return res
end

-- Convenience: a request to warmboxd's control plane with the server's key.
function M.api(srv, method, path, json, extra)
  local o = { method = method, url = srv.url .. path, headers = { ["X-API-Key"] = srv.api_key }, json = json }
  for k, v in pairs(extra or {}) do
    if k == "headers" then
      for hk, hv in pairs(v) do o.headers[hk] = hv end
    else
      o[k] = v
    end
  end
  return M.request(o)
end

--- Creates a sandbox (`POST path`, default /sandboxes, body default a base
-- template); raises unless warmboxd answered 201. Returns the decoded answer.
function M.create(srv, body, path)
  local res = M.api(srv, "POST", path or "/sandboxes", body or { templateID = "base" })
  if res.status ~= 201 then error("create: http " .. tostring(res.status) .. ": " .. tostring(res.body), 2) end
  return res.json
end

--- Creates a secure code-interpreter sandbox with a 600 s lease, the fields of
-- `extra` added or replacing those.
function M.create_interp(srv, extra)
  local body = { templateID = "code-interpreter-v1", secure = true, timeout = 600 }
  for k, v in pairs(extra or {}) do body[k] = v end
  return M.create(srv, body)
end

-- A request to a sandbox's data plane, routed by the E2B headers.
function M.sandbox(srv, sb, port, method, path, o)
  o = o or {}
  local headers = { ["E2b-Sandbox-Id"] = sb.sandboxID, ["E2b-Sandbox-Port"] = tostring(port) }
  if sb.envdAccessToken then headers["X-Access-Token"] = sb.envdAccessToken end
  for k, v in pairs(o.headers or {}) do headers[k] = v end
  return M.request{ method = method, url = srv.url .. path, headers = headers, json = o.json,
    body = o.body, timeout = o.timeout, curl_args = o.curl_args }
end

return M
