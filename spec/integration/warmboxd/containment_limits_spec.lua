-- What sandbox code cannot do to the host, to warmboxd or to other sandboxes
-- over real HTTP against a real warmboxd: reach the host's
-- loopback, run code without the access token, read warmboxd's descriptors,
-- own files as host root, exhaust processes, memory or disk, outlive its
-- execute timeout, or grow warmboxd's memory with output nobody reads.
-- Traffic goes only to loopback addresses or into namespaces warmboxd made.
-- This file: the part 'limits' of them; shared helpers in spec/helpers/warmboxd_containment.lua.
local shared = require "spec.helpers.warmboxd_containment"
local wbd = shared.wbd
local http = shared.http
local q = shared.q
local main_text = shared.main_text
local error_of = shared.error_of
local sh = shared.sh
local rss_kb = shared.rss_kb

describe("warmboxd containment", function()
  local srv

  local function create(extra) return http.create_interp(srv, extra) end

  local function run(box, code, o)
    o = o or {}
    local res = http.sandbox(srv, box, 49999, "POST", "/execute",
      { json = { code = code, timeout = o.timeout }, timeout = o.max_time or 120 })
    assert.are.equal(200, res.status, res.body)
    return res.body
  end

  local function py(box, code, o)
    local body = run(box, code, o)
    assert.is_nil(error_of(body), body)
    return main_text(body)
  end

  local function kill(box)
    http.api(srv, "DELETE", "/sandboxes/" .. box.sandboxID)
  end

  lazy_setup(function()
    srv = wbd.start{ wrapper = "env WARMBOXD_INTERRUPT_GRACE_MS=1500 " .. (os.getenv("WARMBOXD_WRAPPER") or "") }
  end)

  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  -- Shared by the cgroup and the rlimit cases below.
  local function fork_bomb()
    local sb, other = create(), create()
    py(other, "1")
    local out = py(sb, table.concat({
      "import os, signal, time",
      "kids, err = [], None",
      "for _ in range(2000):",
      "    try:",
      "        pid = os.fork()",
      "    except OSError as e:",
      "        err = type(e).__name__",
      "        break",
      "    if pid == 0:",
      "        time.sleep(30)",
      "        os._exit(0)",
      "    kids.append(pid)",
      "n = len(kids)",
      "for p in kids:",
      "    os.kill(p, signal.SIGKILL)",
      "for p in kids:",
      "    os.waitpid(p, 0)",
      "f'{err} {n}'",
    }, "\n"))
    local err, n = out:match("^(%S+) (%d+)$")
    assert.are.equal("BlockingIOError", err, out)
    assert.is_true(tonumber(n) < 2000)
    assert.are.equal("2", py(other, "1 + 1"))
    assert.are.equal(200, http.request{ url = srv.url .. "/health" }.status)
    kill(sb)
    kill(other)
  end

  -- A 512 MB sandbox (templates other than code-interpreter-v1 get E2B's
  -- default size) for the 1 GiB allocation to overflow.
  local function memory_hog(expect)
    local sb, other = create{ templateID = "base" }, create()
    py(other, "1")
    local before = rss_kb(srv.pid)
    local body = run(sb, "x = b'x' * (1 << 30)\nlen(x)")
    local e = error_of(body)
    assert.is_truthy(e, body)
    assert.are.equal(expect, e.name, body)
    if e.name == "OutOfMemoryError" then assert.is_truthy(e.value:find("state was lost", 1, true)) end
    assert.is_nil(main_text(body))
    assert.are.equal("2", py(other, "1 + 1"))
    assert.are.equal("2", py(sb, "1 + 1"))
    assert.is_true(rss_kb(srv.pid) - before < 64 * 1024)
    kill(sb)
    kill(other)
  end

  describe("limits", function()
    it("each sandbox has its memory, pids and cpu groups (cgroup v1) with the template's limits", function()
      -- code-interpreter-v1 as E2B builds it: 2 vCPU, 2048 MB, listed and enforced
      local sb = create()
      local info = http.api(srv, "GET", "/sandboxes/" .. sb.sandboxID).json
      assert.are.same({ 2, 2048 }, { info.cpuCount, info.memoryMB })
      py(sb, "1")
      local function read(ctrl, file)
        local v = wbd.read_all(string.format("/sys/fs/cgroup/%s/warmboxd-%d/%s/%s", ctrl, srv.pid,
          srv:runtime_name(sb.sandboxID), file))
        return v and v:gsub("%s+$", "")
      end
      if not read("memory", "memory.limit_in_bytes") then
        -- no cgroup v1 here (e.g. a cgroup v2 host): the rlimit fallback holds
        local limits = py(sb, "open('/proc/self/limits').read()")
        assert.is_truthy(limits:find("Max processes%s+256%s"), limits)
        assert.is_truthy(limits:find("Max data size%s+2147483648%s"), limits)
        kill(sb)
        return
      end
      assert.are.equal(tostring(2048 * 1024 * 1024), read("memory", "memory.limit_in_bytes"))
      assert.are.equal("256", read("pids", "pids.max"))
      assert.are.equal("200000", read("cpu", "cpu.cfs_quota_us"))
      assert.are.equal("512", read("cpu", "cpu.shares"))
      -- the kernel is in them
      local procs = read("memory", "cgroup.procs")
      assert.is_truthy(procs and procs:match("%d"))
      kill(sb)
      assert.is_nil(read("memory", "memory.limit_in_bytes"))
    end)

    it("a bounded fork bomb fails inside its sandbox; warmboxd and another sandbox keep answering", fork_bomb)

    it("a 1 GiB allocation fails inside a 512 MB sandbox (OOM kill in its memory group); warmboxd and another "
      .. "sandbox keep answering", function()
      local v1 = os.execute("test -d /sys/fs/cgroup/memory/warmboxd-" .. srv.pid) == true
      memory_hog(v1 and "OutOfMemoryError" or "MemoryError")
    end)

    it("the writable home is size-limited (1 GiB): a disk filler fails inside its sandbox", function()
      local sb = create()
      local body = run(sb, table.concat({
        "chunk = b'z' * (1 << 20)",
        "with open('/home/user/fill', 'wb') as f:",
        "    for _ in range(1600):",
        "        f.write(chunk)",
        "'filled'",
      }, "\n"))
      assert.is_truthy(error_of(body), body)
      assert.is_nil(main_text(body))
      local size = tonumber(sh("stat -c %s " .. q(srv:sandbox_home(sb.sandboxID) .. "/fill"))) or 0
      assert.is_true(size <= 1024 * 1024 * 1024)
      assert.are.equal(200, http.request{ url = srv.url .. "/health" }.status)
      kill(sb)
    end)
  end)

  describe("limits without cgroups (the rlimit fallback)", function()
    local main
    lazy_setup(function()
      main = srv
      srv = wbd.start{ wrapper = "env WARMBOXD_NO_LIMIT_CGROUPS=1 " .. (os.getenv("WARMBOXD_WRAPPER") or "") }
    end)
    lazy_teardown(function()
      srv:stop()
      srv = main
    end)

    it("RLIMIT_NPROC stops a fork bomb", fork_bomb)
    it("RLIMIT_DATA turns a 1 GiB allocation into MemoryError", function() memory_hog("MemoryError") end)
  end)

end)
