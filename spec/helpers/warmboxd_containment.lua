-- What spec/integration/warmboxd/containment_*_spec.lua share (their requires and helpers).
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local nd = require "spec.helpers.ndjson"

local cjson = http.cjson
local q = wbd.sh_quote

local main_text, error_of = nd.main_text, nd.error_in

local function sh(cmd)
  local p = assert(io.popen(cmd .. " 2>/dev/null"))
  local s = p:read("a")
  p:close()
  return s
end

local function rss_kb(pid, field)
  local s = wbd.read_all("/proc/" .. pid .. "/status") or ""
  return tonumber(s:match((field or "VmRSS") .. ":%s*(%d+)")) or 0
end

-- A TCP listener on the host that accepts forever; returns its port and pid.
local function listener(host)
  local tmp = os.tmpname()
  local code = "import socket\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    .. "s.bind((" .. string.format("%q", host) .. ", 0))\ns.listen(64)\n"
    .. "open(" .. string.format("%q", tmp) .. ", 'w').write(str(s.getsockname()[1]))\n"
    .. "while True:\n    s.accept()[0].close()\n"
  -- env -u LD_PRELOAD: the sanitizer run preloads ASan into lua5.4 only.
  local pid = tonumber(sh("env -u LD_PRELOAD python3 -c " .. q(code) .. " >/dev/null 2>&1 & echo $!"))
  local port = wbd.eventually(function() return tonumber(wbd.read_all(tmp) or "") end, 60)
  os.remove(tmp)
  return assert(port), pid
end

-- The cell's network interfaces, from /proc/net/dev.
local IFACES = "' '.join(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]))"

return {
  wbd = wbd,
  http = http,
  nd = nd,
  cjson = cjson,
  q = q,
  main_text = main_text,
  error_of = error_of,
  sh = sh,
  rss_kb = rss_kb,
  listener = listener,
  IFACES = IFACES,
}
