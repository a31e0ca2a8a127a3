-- A team's memory budget (--max-team-memory-mb): its sandboxes held in host
-- RAM, running or paused with memory (frozen in place), count toward it, so
-- pausing does not free room the way --max-running's count does; a pause
-- without memory keeps only the files, on disk, and gives the runtime (its
-- tmpfs, its groups) up. Over the budget a create or resume gets E2B's 429.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"

describe("warmboxd --max-team-memory-mb", function()
  local srv
  -- base sandboxes are 512 MB each: two fit
  lazy_setup(function() srv = wbd.start{ args = { "--max-team-memory-mb", "1024" } } end)
  lazy_teardown(function() if srv then srv:stop() end end)

  local function create(key)
    return http.request{ method = "POST", url = srv.url .. "/sandboxes",
      headers = { ["X-API-Key"] = key or srv.api_key }, json = { templateID = "base", secure = true, timeout = 600 } }
  end
  local function api(method, path, body) return http.api(srv, method, path, body) end
  local function mounted(id)
    local name = srv:runtime_name(id)
    return (wbd.read_all("/proc/" .. srv.pid .. "/mountinfo") or ""):find(name, 1, true) ~= nil
  end

  it("counts paused sandboxes held in memory; a pause without memory frees its share", function()
    local a, b = create().json, create().json
    assert.is_truthy(a and b)
    local res = create()
    assert.are.equal(429, res.status, res.body)
    assert.matches("maximum memory of your running and paused sandboxes (1024 MB)", res.json.message, 1, true)
    -- paused with memory, a still holds its 512 MB
    assert.are.equal(204, api("POST", "/sandboxes/" .. a.sandboxID .. "/pause", {}).status)
    assert.are.equal(429, create().status)
    -- another team has a budget of its own
    local other = create(wbd.new_key())
    assert.are.equal(201, other.status, other.body)
    -- paused without memory, b keeps its files on disk, not in RAM
    local w = http.sandbox(srv, b, 49983, "POST", "/files?path=kept.txt",
      { body = "still here", headers = { ["Content-Type"] = "application/octet-stream" } })
    assert.are.equal(200, w.status, w.body)
    local had_tmpfs = mounted(b.sandboxID)
    assert.are.equal(204, api("POST", "/sandboxes/" .. b.sandboxID .. "/pause", { memory = false }).status)
    -- as root warmboxd mounts a tmpfs per sandbox (in its own mount namespace)
    if (wbd.read_all("/proc/self/status") or ""):match("\nUid:%s+0%s") then assert.is_true(had_tmpfs) end
    if had_tmpfs then assert.is_false(mounted(b.sandboxID)) end
    res = create()
    assert.are.equal(201, res.status, res.body)
    local c = res.json
    -- b needs its 512 MB again to resume: over the budget now
    res = api("POST", "/sandboxes/" .. b.sandboxID .. "/connect", { timeout = 600 })
    assert.are.equal(429, res.status, res.body)
    assert.matches("--max-team-memory-mb", res.json.message, 1, true)
    assert.are.equal(204, api("DELETE", "/sandboxes/" .. c.sandboxID).status)
    res = api("POST", "/sandboxes/" .. b.sandboxID .. "/connect", { timeout = 600 })
    assert.are.equal(201, res.status, res.body)
    assert.are.equal("still here", http.sandbox(srv, b, 49983, "GET", "/files?path=kept.txt").body)
    -- a, paused in memory, holds its share already: it resumes at the budget
    res = api("POST", "/sandboxes/" .. a.sandboxID .. "/connect", { timeout = 600 })
    assert.are.equal(201, res.status, res.body)
    -- the budget changes at run time (0: none)
    srv:config{ max_team_memory_mb = 0 }
    assert.are.equal(201, create().status)
    srv:config{ max_team_memory_mb = 1024 }
  end)

  it("runs a sandbox paused without memory afresh on its files, its processes gone", function()
    srv:config{ max_team_memory_mb = 0 }
    local sb = http.create_interp(srv)
    local res = http.sandbox(srv, sb, 49999, "POST", "/execute",
      { json = { code = "open('/home/user/f.txt', 'w').write('files')\nx = 1" }, timeout = 120 })
    assert.are.equal(200, res.status, res.body)
    -- the sandbox's memory-backed trees (tmpfs, in warmboxd's mount table) go with the pause
    local function tmpfs()
      local n = 0
      for l in assert(wbd.read_all("/proc/" .. srv.pid .. "/mountinfo")):gmatch("[^\n]+") do
        if l:find(" - tmpfs ", 1, true) then n = n + 1 end
      end
      return n
    end
    local held = tmpfs()
    assert.are.equal(204, api("POST", "/sandboxes/" .. sb.sandboxID .. "/pause", { memory = false }).status)
    assert.is_true(tmpfs() < held, "the paused sandbox's tmpfs is still mounted")
    assert.are.equal(201, api("POST", "/sandboxes/" .. sb.sandboxID .. "/connect", { timeout = 600 }).status)
    res = http.sandbox(srv, sb, 49999, "POST", "/execute",
      { json = { code = "open('/home/user/f.txt').read() + str('x' in dir())" }, timeout = 120 })
    assert.matches("filesFalse", res.body, 1, true)
    srv:config{ max_team_memory_mb = 1024 }
  end)
end)

describe("warmboxd's default memory budget", function()
  it("is the host's memory (MemTotal), per team", function()
    local s = wbd.start{ default_max_running = true, args = { "--max-running", "0" } }
    local ok, err = pcall(function()
      local mem = tonumber((wbd.read_all("/proc/meminfo") or ""):match("MemTotal:%s*(%d+)")) // 1024
      -- running records of 2048 MB (seeded: no runtime), as many as fit in the host's memory
      local n = mem // 2048
      local res = s:admin("POST", "/seed", { count = n, state = "running", templateID = "code-interpreter-v1",
        timeout = 600 }, true)
      assert.are.equal(200, res.status, res.body)
      local function create(tmpl)
        return http.api(s, "POST", "/sandboxes", { templateID = tmpl, timeout = 600 })
      end
      -- one more of 2048 MB goes over the host's memory, one of 512 MB (what is left) does not
      res = create("code-interpreter-v1")
      assert.are.equal(429, res.status, res.body)
      assert.matches("maximum memory", res.json.message, 1, true)
      if mem - n * 2048 >= 512 then assert.are.equal(201, create("base").status) end
    end)
    s:stop()
    assert(ok, err)
  end)
end)
