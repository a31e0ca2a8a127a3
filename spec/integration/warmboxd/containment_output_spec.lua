-- What sandbox code cannot do to the host, to warmboxd or to other sandboxes
-- over real HTTP against a real warmboxd: reach the host's
-- loopback, run code without the access token, read warmboxd's descriptors,
-- own files as host root, exhaust processes, memory or disk, outlive its
-- execute timeout, or grow warmboxd's memory with output nobody reads.
-- Traffic goes only to loopback addresses or into namespaces warmboxd made.
-- This file: the part 'output' of them; shared helpers in spec/helpers/warmboxd_containment.lua.
local shared = require "spec.helpers.warmboxd_containment"
local wbd = shared.wbd
local http = shared.http
local nd = shared.nd
local cjson = shared.cjson
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

  describe("timeouts", function()
    it("a cell that catches KeyboardInterrupt is ended by a kernel restart; the error says state was lost", function()
      local sb = create()
      py(sb, "kept = 'before'")
      local t0 = os.time()
      local body = run(sb, "import time\nwhile True:\n    try:\n        time.sleep(30)\n    except KeyboardInterrupt:\n"
        .. "        pass", { timeout = 1, max_time = 60 })
      local e = error_of(body)
      assert.is_truthy(e, body)
      assert.are.equal("TimeoutError", e.name)
      assert.is_truthy(e.value:find("state was lost", 1, true), e.value)
      assert.is_true(os.time() - t0 < 20)
      assert.are.equal("False", py(sb, "str('kept' in globals())"))
      kill(sb)
    end)

    it("a run whose client left while it waited for the context never starts", function()
      local sb = create()
      py(sb, "1")
      local bg = os.tmpname()
      -- the first run holds the context for 3 s
      os.execute(string.format("curl -sS -N --max-time 60 -X POST -H %s -H %s -H %s --data-binary %s %s >%s 2>&1 &",
        q("E2b-Sandbox-Id: " .. sb.sandboxID), q("E2b-Sandbox-Port: 49999"),
        q("X-Access-Token: " .. sb.envdAccessToken),
        q(cjson.encode({ code = "import time\ntime.sleep(3)\n'first'" })), q(srv.url .. "/execute"), q(bg)))
      wbd.sleep(0.5)
      -- the second gives up after 1 s, while it still waits
      local res = http.sandbox(srv, sb, 49999, "POST", "/execute",
        { json = { code = "open('/home/user/ran', 'w').write('x')" }, timeout = 1 })
      assert.are_not.equal(200, res.status)
      assert.is_truthy(wbd.eventually(function() return (wbd.read_all(bg) or ""):find("first", 1, true) end, 20))
      os.remove(bg)
      assert.are.equal("False", py(sb, "import os\nstr(os.path.exists('/home/user/ran'))"))
      kill(sb)
    end)
  end)

  describe("output", function()
    it("a 200 MB kernel line without a newline is dropped past 16 MiB, in linear time", function()
      local sb = create()
      py(sb, "1")
      local before = rss_kb(srv.pid, "VmHWM")
      -- fd 4 is the kernel's event pipe (kernel.py: CTL, EVT, DIAG = dup(0), dup(1), dup(2))
      local body = run(sb, table.concat({
        "import os",
        "chunk = b'z' * (1 << 20)",
        "for _ in range(200):",
        "    os.write(4, chunk)",
        "os.write(4, b'\\n')",
        "print('after')",
      }, "\n"), { max_time = 60 })
      local out = ""
      for _, l in ipairs((nd.lines(body, true))) do
        if l.type == "stdout" then out = out .. l.text end
      end
      assert.are.equal("after\n", out)
      -- ~16 MiB of buffer (ASan's quarantine of the grown buffers adds ~40 MB);
      -- a reader keeping the whole line grows by its 200 MB and more
      local grew = rss_kb(srv.pid, "VmHWM") - before
      assert.is_true(grew < 96 * 1024, string.format("peak RSS grew by %d kB", grew))
      kill(sb)
    end)

    it("a cell printing forever to a slow reader keeps warmboxd's memory bounded", function()
      local sb = create()
      py(sb, "1")
      local before = srv:heap_kb() -- the live heap, not RSS (see Server:heap_kb)
      local out = os.tmpname()
      local pid = tonumber(sh(string.format("curl -sS -N --limit-rate 20k --max-time 60 -X POST -H %s -H %s -H %s "
        .. "--data-binary %s %s >%s 2>&1 & echo $!", q("E2b-Sandbox-Id: " .. sb.sandboxID),
        q("E2b-Sandbox-Port: 49999"),
        q("X-Access-Token: " .. sb.envdAccessToken),
        q(cjson.encode({ code = "while True:\n    print('y' * 4000)" })), q(srv.url .. "/execute"), q(out))))
      local peak = before
      for _ = 1, 30 do
        wbd.sleep(0.2)
        local r = srv:heap_kb()
        if r > peak then peak = r end
      end
      os.execute("kill " .. pid)
      assert.is_truthy((wbd.read_all(out) or ""):find("yyyy", 1, true))
      os.remove(out)
      assert.is_true(peak - before < 48 * 1024, string.format("the heap grew by %d kB", peak - before))
      -- the context is usable again once the interrupted cell ended
      assert.are.equal("2", py(sb, "1 + 1"))
      kill(sb)
    end)
  end)
end)
