-- What spec/integration/cli/server_*_spec.lua share (their requires and helpers).
local wbd = require "spec.helpers.warmboxd"
local cjson = require "cjson"

local ROOT = wbd.root()
local q = wbd.sh_quote

local function slurp(p)
  local f = io.open(p, "rb")
  local s = f and f:read("a") or ""
  if f then f:close() end
  return s
end

local function mkdtemp()
  local p = io.popen("mktemp -d /tmp/wb-cli-spec.XXXXXX")
  local d = p:read("l")
  p:close()
  return d
end

-- Runs bin/warmbox with the spec's build in the XDG dir `xdg`; returns exit status, stdout, stderr.
local function warmbox(xdg, args, env)
  return require("spec.helpers.cli").run(args, { xdg = xdg, env = env, clean = true })
end

local function state_of(xdg)
  local s = slurp(xdg .. "/warmbox/server.json")
  return s ~= "" and cjson.decode(s) or nil
end

local function alive(pid) return require("warmbox.server").alive(math.tointeger(pid)) end

-- A private XDG dir; on teardown whatever server it holds is stopped (by the CLI, then by its pid).
local function private_xdg()
  local x = { dir = mkdtemp() }
  function x.cleanup()
    warmbox(x.dir, "server stop")
    local st = state_of(x.dir)
    if st and st.pid and alive(st.pid) then os.execute("kill -KILL " .. math.tointeger(st.pid)) end
    if x.pid and alive(x.pid) then os.execute("kill -KILL " .. math.tointeger(x.pid)) end
    os.execute("rm -rf " .. q(x.dir))
  end
  return x
end

return {
  wbd = wbd,
  cjson = cjson,
  ROOT = ROOT,
  q = q,
  slurp = slurp,
  mkdtemp = mkdtemp,
  warmbox = warmbox,
  state_of = state_of,
  alive = alive,
  private_xdg = private_xdg,
}
