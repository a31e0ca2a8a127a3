-- A SIGKILLed warmboxd's cgroups and jail processes go when it dies, not at
-- the next start: its janitor (a child forked at start-up, holding no
-- descriptor of warmboxd's: no data directory lock, no port) ends what is
-- left in the dead server's groups and removes them. Without root or
-- cgroups, the jail processes still go (bubblewrap dies with its parent).
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local cell = require "spec.helpers.cell"

local CTRLS = { "freezer", "memory", "pids", "cpu" }

local function sh(cmd)
  local h = io.popen(cmd)
  local out = h:read("a")
  h:close()
  return out
end

-- The groups of warmboxd `pid` that exist.
local function cg_dirs(pid)
  local found = {}
  for _, ctrl in ipairs(CTRLS) do
    local p = "/sys/fs/cgroup/" .. ctrl .. "/warmboxd-" .. pid
    if os.execute("test -d " .. p) then found[#found + 1] = p end
  end
  return found
end

-- Host pids of the processes in warmboxd `pid`'s groups.
local function cg_procs(pid)
  local out = {}
  for _, ctrl in ipairs(CTRLS) do
    for l in sh("cat /sys/fs/cgroup/" .. ctrl .. "/warmboxd-" .. pid .. "/*/cgroup.procs 2>/dev/null"):gmatch("%d+") do
      out[tonumber(l)] = true
    end
  end
  return out
end

-- Host pids of the `sleep` processes whose argument is `mark`.
local function marked(mark)
  local out = {}
  local found = sh("grep -l -a -F -- " .. wbd.sh_quote(mark) .. " /proc/[0-9]*/cmdline 2>/dev/null")
  for l in found:gmatch("/proc/(%d+)/") do
    local cmd = wbd.read_all("/proc/" .. l .. "/cmdline")
    if cmd == "sleep\0" .. mark .. "\0" then out[tonumber(l)] = true end
  end
  return out
end

local function janitor_of(pid)
  return tonumber(sh("pgrep -P " .. pid .. " -x wbd-janitor"):match("%d+"))
end

local function none_alive(pids)
  for p in pairs(pids) do if wbd.alive(p) then return false end end
  return true
end

describe("warmboxd's janitor", function()
  local srv

  after_each(function() if srv and not srv.stopped then srv:stop() end end)

  -- A server with a running sandbox: a python kernel and a background process. → sandbox, mark
  local function busy_server()
    srv = wbd.start{}
    local res = http.api(srv, "POST", "/sandboxes", { templateID = "base", timeout = 600 })
    assert.are.equal(201, res.status, res.body)
    local sb = res.json
    local mark = "7" .. tostring(math.random(100000, 999999)) .. ".5"
    cell(srv, sb, "x = 1", "python")
    cell(srv, sb, "nohup sleep " .. mark .. " >/dev/null 2>&1 &")
    assert(wbd.eventually(function() return next(marked(mark)) end, 30), "no sleep process")
    return sb, mark
  end

  it("holds nothing of warmboxd's: only /dev/null and a pidfd", function()
    busy_server()
    local j = assert(janitor_of(srv.pid), "no janitor")
    for fd in sh("ls /proc/" .. j .. "/fd"):gmatch("%d+") do
      local target = sh("readlink /proc/" .. j .. "/fd/" .. fd):gsub("\n$", "")
      if target ~= "" then
        assert.is_truthy(target == "/dev/null" or target:match("pidfd"),
          "the janitor holds fd " .. fd .. ": " .. target)
      end
    end
  end)

  it("after SIGKILL, removes the dead server's groups and ends its jail processes, alone", function()
    local _, mark = busy_server()
    local pid = srv.pid
    local j = assert(janitor_of(pid), "no janitor")
    local procs = cg_procs(pid)
    for p in pairs(marked(mark)) do procs[p] = true end
    assert.is_truthy(next(procs))
    assert.is_true(srv:kill("KILL"))
    -- no other warmboxd is started here: the janitor cleans up, then exits
    assert.is_true(wbd.eventually(function() return not wbd.alive(j) end, 30), "the janitor stayed")
    assert.are.same({}, cg_dirs(pid))
    assert.is_true(none_alive(procs), "jail processes stayed")
  end)

  it("after a normal stop, the groups are gone as before and the janitor exits", function()
    busy_server()
    local pid = srv.pid
    local j = assert(janitor_of(pid), "no janitor")
    assert.is_true(srv:kill("TERM"))
    assert.are.same({}, cg_dirs(pid))
    assert.is_true(wbd.eventually(function() return not wbd.alive(j) end, 30), "the janitor stayed")
  end)
end)
