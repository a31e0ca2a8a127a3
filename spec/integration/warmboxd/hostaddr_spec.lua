-- A jail never reaches an address of its host, not only the host's loopback:
-- slirp4netns connects from the host, so a host service bound to
-- 0.0.0.0 would answer a jail through the host's own LAN address. And the
-- admin API answers loopback clients only, whatever the token.
--
-- The "host" here is a network namespace this spec makes (a veth pair on
-- 10.213.N.0/30, N random): warmboxd runs inside it on 10.213.N.1 and a
-- listener there binds 0.0.0.0. No traffic leaves the namespaces made here.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"

local cjson = http.cjson
local q = wbd.sh_quote

local function sh(cmd)
  local p = assert(io.popen(cmd .. " 2>&1"))
  local s = p:read("a")
  local ok = p:close()
  return s, ok
end

local function must(cmd)
  local out, ok = sh(cmd)
  assert(ok, cmd .. ": " .. out)
  return out
end

describe("warmboxd in a host with a LAN address", function()
  local ns, hostif, addr, peer, srv, listener_pid, port

  lazy_setup(function()
    local tag = string.format("%06x", math.random(0, 0xffffff))
    ns, hostif = "wbhost" .. tag, "wbh" .. tag
    local n = math.random(0, 255)
    addr, peer = "10.213." .. n .. ".1", "10.213." .. n .. ".2"
    must("ip netns add " .. ns)
    must("ip -n " .. ns .. " link set lo up")
    must("ip link add " .. hostif .. " type veth peer name lan0 netns " .. ns)
    must("ip addr add " .. peer .. "/30 dev " .. hostif)
    must("ip link set " .. hostif .. " up")
    must("ip -n " .. ns .. " addr add " .. addr .. "/30 dev lan0")
    must("ip -n " .. ns .. " link set lan0 up")

    srv = wbd.start{ wrapper = "ip netns exec " .. ns, args = { "--host", addr } }

    -- A service of the "host" on all its addresses, as a database or a dev
    -- server often is.
    local portfile = os.tmpname()
    local code = "import socket\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
      .. "s.bind(('0.0.0.0', 0))\ns.listen(64)\n"
      .. "open(" .. string.format("%q", portfile) .. ", 'w').write(str(s.getsockname()[1]))\n"
      .. "while True:\n    s.accept()[0].close()\n"
    -- env -u LD_PRELOAD: the sanitizer run preloads ASan into lua5.4 only.
    listener_pid = tonumber((sh("ip netns exec " .. ns .. " env -u LD_PRELOAD python3 -c " .. q(code)
      .. " >/dev/null 2>&1 & echo $!")))
    port = wbd.eventually(function() return tonumber(wbd.read_all(portfile) or "") end, 60)
    os.remove(portfile)
    assert(port, "the listener did not start")
  end)

  lazy_teardown(function()
    if srv then srv:stop() end
    if listener_pid then os.execute("kill -KILL " .. listener_pid .. " 2>/dev/null") end
    if ns then os.execute("ip netns del " .. ns .. " 2>/dev/null") end
    if hostif then os.execute("ip link del " .. hostif .. " 2>/dev/null") end
  end)

  local function create(internet)
    return http.create_interp(srv, { timeout = 300, allow_internet_access = internet })
  end

  -- Connects from a cell to each target; "connected" or the error's name.
  local function try(sb, targets)
    local list = {}
    for _, t in ipairs(targets) do list[#list + 1] = string.format("(%q, %d)", t[1], t[2]) end
    local code = "import socket\nr = []\nfor h, p in [" .. table.concat(list, ", ") .. "]:\n"
      .. "    try:\n        socket.create_connection((h, p), timeout=3).close()\n        r.append('connected')\n"
      .. "    except OSError as e:\n        r.append(type(e).__name__)\n' '.join(r)"
    local res = http.sandbox(srv, sb, 49999, "POST", "/execute", { json = { code = code }, timeout = 60 })
    assert.are.equal(200, res.status, res.body)
    for line in res.body:gmatch("[^\n]+") do
      local ev = cjson.decode(line)
      if ev.type == "error" then error("cell raised: " .. tostring(ev.value)) end
      if ev.type == "result" and ev.is_main_result then return ev.text end
    end
    error("no result: " .. res.body)
  end

  it("the host's service answers the host (the control for the cases below)", function()
    local out = must("ip netns exec " .. ns .. " python3 -c "
      .. q("import socket\nsocket.create_connection(('" .. addr .. "', " .. port .. "), timeout=3).close()\n"
        .. "print('connected')"))
    assert.are.equal("connected", (out:gsub("%s+$", "")))
  end)

  it("a jail with internet access reaches neither the host's service nor warmboxd by the host's address", function()
    local sb = create(true)
    local r = try(sb, { { addr, port }, { addr, srv.port } })
    assert.are_not.equal("connected", r:match("^(%S+)"), r)
    assert.are_not.equal("connected", r:match("(%S+)$"), r)
    -- the cell is told at once that there is no route, rather than timing out
    assert.are.equal("OSError OSError", r)
  end)

  it("a jail without internet access reaches nothing of the host either", function()
    local sb = create(false)
    local r = try(sb, { { addr, port } })
    assert.are_not.equal("connected", r)
  end)

  it("the admin API refuses a client that is not on loopback, even with its token", function()
    local res = http.request{ method = "GET", url = srv.url .. "/_warmboxd/stats" }
    assert.are.equal(403, res.status, res.body)
  end)
end)
