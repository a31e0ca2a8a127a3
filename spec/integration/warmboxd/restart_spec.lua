-- warmboxd restarted on its data directory over real HTTP: paused sandboxes
-- (record and files) and snapshots come back; a graceful stop first pauses
-- the running sandboxes that pause at their timeout; memory is lost (the
-- kernels boot afresh, as after a filesystem-only pause). After a SIGKILL of
-- the server and its janitor (which would clean up at once) the next start
-- ends the frozen jail processes and removes the groups the dead server left.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local cell = require "spec.helpers.cell"

local function cg_dirs(pid)
  local found = {}
  for _, ctrl in ipairs{ "freezer", "memory", "pids", "cpu" } do
    local p = "/sys/fs/cgroup/" .. ctrl .. "/warmboxd-" .. pid
    local f = io.open(p .. "/cgroup.procs")
    if f then
      f:close()
      found[#found + 1] = p
    end
  end
  return found
end

-- Host pids of the processes in the dead server's groups.
local function cg_procs(pid)
  local h = io.popen("cat /sys/fs/cgroup/freezer/warmboxd-" .. pid .. "/*/cgroup.procs 2>/dev/null")
  local out = {}
  for l in h:read("a"):gmatch("%d+") do out[#out + 1] = tonumber(l) end
  h:close()
  return out
end

describe("warmboxd restart", function()
  local srv, api_key

  local function run(sb, code, language) return cell(srv, sb, code, language) end

  local function create(auto_pause)
    local res = http.api(srv, "POST", "/sandboxes", { templateID = "base", timeout = 600, secure = true,
      autoPause = auto_pause, metadata = { conv = "c1" } })
    assert.are.equal(201, res.status, res.body)
    return res.json
  end

  local function restart(sig)
    assert.is_true(srv:kill(sig))
    local old = srv
    srv = wbd.start{ dir = old.dir, api_key = api_key }
    return old
  end

  local function info(sb) return http.api(srv, "GET", "/sandboxes/" .. sb.sandboxID) end

  local function connect(sb)
    local res = http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/connect", { timeout = 60 })
    assert.are.equal(201, res.status, res.body)
    return res.json
  end

  lazy_setup(function()
    srv = wbd.start{}
    api_key = srv.api_key
  end)
  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  it("brings paused sandboxes back after SIGTERM, with their files and record, without memory", function()
    local paused = create(false)
    run(paused, "echo kept > /home/user/f.txt; mkdir -p /var/tmp/d; echo v > /var/tmp/d/v.txt")
    run(paused, "x = 41", "python")
    assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. paused.sandboxID .. "/pause").status)
    local running = create(true)   -- pauses at its timeout: kept too
    run(running, "echo live > /tmp/l.txt")
    local plain = create(false)    -- killed at its timeout: not kept
    local snap = http.api(srv, "POST", "/sandboxes/" .. running.sandboxID .. "/snapshots", { name = "keep" }).json

    restart("TERM")
    local i = info(paused)
    assert.are.equal(200, i.status, i.body)
    assert.are.equal("paused", i.json.state)
    assert.are.same({ conv = "c1" }, i.json.metadata)
    -- a paused sandbox's endAt is when it was paused, not its lease's end
    assert.is_true(wbd.utc(i.json.endAt) < wbd.utc(i.json.startedAt) + 300, i.body)
    assert.are.equal("paused", info(running).json.state)
    assert.are.equal(404, info(plain).status)

    local sb = connect(paused)
    assert.are.equal(paused.envdAccessToken, sb.envdAccessToken)
    assert.are.equal("kept\nv\n", (run(sb, "cat /home/user/f.txt /var/tmp/d/v.txt")))
    local _, err = run(sb, "x", "python")
    assert.are.equal("NameError", err)
    run(sb, "echo more >> /home/user/f.txt")
    assert.are.equal("live\n", (run(connect(running), "cat /tmp/l.txt")))

    local list = http.api(srv, "GET", "/snapshots?name=keep").json
    assert.are.equal(1, #list)
    local child = http.api(srv, "POST", "/sandboxes", { templateID = snap.snapshotID, timeout = 60 }).json
    assert.are.equal("live\n", (run(child, "cat /tmp/l.txt")))

    -- a resumed sandbox is paused and kept again; a killed one is gone for good
    assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/pause").status)
    assert.are.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. running.sandboxID).status)
    restart("TERM")
    assert.are.equal(404, info(running).status)
    assert.are.equal("kept\nmore\n", (run(connect(paused), "cat /home/user/f.txt")))
  end)

  it("keeps a warmbox conversation's sandbox and files across a SIGTERM restart; its kernel boots afresh", function()
    local lockdir = os.tmpname()
    os.remove(lockdir)
    local function open_wb()
      return assert(require("warmbox").new{ api_url = srv.url, sandbox_url = srv.url, api_key = api_key,
        exec_timeout = 60, lock = { backend = "file", dir = lockdir } })
    end
    local wb = open_wb()
    local r1 = assert(wb:session("restart:1"):run("x = 41\nopen('/home/user/conv.txt', 'w').write('turn 1')"))
    wb:close()
    -- the same address again, so the conversation's client finds it
    assert.is_true(srv:kill("TERM"))
    local old = srv
    srv = wbd.start{ dir = old.dir, api_key = api_key, args = { "--port", tostring(old.port) } }
    assert.are.equal(old.port, srv.port)
    wb = open_wb()
    local s = wb:session("restart:1")
    local r2 = assert(s:run("print(open('/home/user/conv.txt').read())"))
    assert.are.equal(r1.sandbox_id, r2.sandbox_id)
    assert.are.equal("turn 1\n", r2.stdout)
    local r3 = assert(s:run("print('x' in globals())"))
    assert.are.equal("False\n", r3.stdout)
    wb:close()
    os.execute("rm -rf " .. wbd.sh_quote(lockdir))
  end)

  it("after SIGKILL, ends the dead server's frozen jail processes and keeps its paused sandboxes", function()
    local sb = create(false)
    run(sb, "echo before-kill > /home/user/k.txt")
    run(sb, "y = 1", "python")
    assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/pause").status)
    -- its janitor first (warmboxd/janitor_spec.lua: it removes the groups once the server died)
    os.execute("pkill -KILL -P " .. srv.pid .. " -x wbd-janitor")
    assert.is_true(srv:kill("KILL"))
    local old = srv
    assert.is_true(#cg_procs(old.pid) > 0, "the dead server left frozen jail processes")
    srv = wbd.start{ dir = old.dir, api_key = api_key }
    assert.is_true(#cg_dirs(old.pid) == 0, "the dead server's groups are gone")
    assert.are.same({}, cg_procs(old.pid))
    local i = info(sb)
    assert.are.equal(200, i.status, i.body)
    assert.are.equal("paused", i.json.state)
    assert.are.equal("before-kill\n", (run(connect(sb), "cat /home/user/k.txt")))
  end)
end)
