-- The warmbox module: options, version check, globals, release and sessions
-- (with a fake core, a fake E2B client and a fake lock).
local fakes = require "spec.helpers.fakes"
local fake_hash = fakes.hash
local VERSION = fakes.VERSION

local function fake_core(version)
  return {
    _VERSION = version or VERSION,
    sha256 = fake_hash,
    hmac_sha256 = fakes.hmac, embedded = fakes.embedded,
    now = os.clock, sleep = function() end, module_path = function() return "/nonexistent/warmbox/core.so" end,
    -- warmbox.new makes its runner (an event engine): one with nothing to do
    engine = function()
      return { timeout = function() return nil end, pending = function() return 0 end,
        pollfd = function() return -1 end, step = function() return {} end, close = function() end }
    end,
    poll = function() return false end,
  }
end

local function fresh_warmbox(core)
  for _, m in ipairs({ "warmbox", "warmbox.session", "warmbox.policy", "warmbox.policy.default" }) do
    package.loaded[m] = nil
  end
  for m in pairs(package.loaded) do
    if m:find("^warmbox%.session%.") then package.loaded[m] = nil end
  end
  package.loaded["warmbox.core"] = core or fake_core()
  return require "warmbox"
end

local function fake_lock()
  local m = { held = {}, state = {} }
  function m.new()
    local lk = {}
    function lk:lock(key)
      if m.held[key] then return nil, "timeout" end
      m.held[key], self.key = true, key
      return 0
    end
    function lk:unlock() m.held[self.key] = nil return true end
    function lk:get_state() return m.state[self.key] end
    function lk:set_state(s) m.state[self.key] = s return true end
    return lk
  end
  return m
end

local function fake_client(items) return require("spec.helpers.fake_e2b").new{ items = items } end
-- The fake core has no state files: sessions get their fingerprint secret here.
local SECRET = "spec-secret"

insulate("warmbox", function()
  it("adds no globals", function()
    local before = {}
    for k in pairs(_G) do before[k] = true end
    fresh_warmbox()
    for k in pairs(_G) do assert.is_true(before[k], "new global " .. tostring(k)) end
  end)

  it("refuses a mismatched warmbox.core", function()
    assert.has_error(function() fresh_warmbox(fake_core("9.9.9")) end,
      ("warmbox %s needs warmbox.core %s, got 9.9.9 (rebuild core.so)"):format(VERSION, VERSION))
  end)

  describe(".new()", function()
    it("raises on unknown options and wrong types", function()
      local warmbox = fresh_warmbox()
      assert.has_error(function() warmbox.new{ idle = 3 } end, "bad argument #1 to 'new' (unknown option 'idle')")
      assert.has_error(function() warmbox.new(3) end, "bad argument #1 to 'new' (table expected, got number)")
      assert.has_error(function() warmbox.new{ client = {}, idle_timeout = "3" } end,
        "bad argument #1 to 'new' (option 'idle_timeout': number expected, got string)")
      assert.has_error(function() warmbox.new{ client = {}, exec_timeout = 0 } end,
        "bad argument #1 to 'new' (option 'exec_timeout': seconds in (0, 86400] (at most max_run_length) "
          .. "expected, got 0)")
      assert.has_error(function() warmbox.new{ client = {}, lock = "nfs" } end,
        "bad argument #1 to 'new' (option 'lock': \"file\", \"redis\" or \"memory\" expected, got \"nfs\")")
      assert.has_error(function() warmbox.new{ client = {}, policy = { lease = 3 } } end)
    end)

    it("refuses non-finite and out-of-range timeouts and sizes with an argument error", function()
      local warmbox = fresh_warmbox()
      local bad = {
        { exec_timeout = math.huge }, { exec_timeout = 0 / 0 }, { exec_timeout = -1 }, { idle_timeout = math.huge },
        { idle_timeout = 0 }, { exec_timeout = 7200, max_run_length = 3600 }, { max_run_length = math.huge },
        { max_run_length = 0 }, { max_run_length = 31 * 86400 }, { max_output = 0 }, { max_output = 1.5 },
        { max_output = math.huge }, { max_files_bytes = -1 }, { max_files_bytes = 0 / 0 },
        { request_timeout = math.huge }, { request_timeout = 0 }, { request_timeout = 0 / 0 },
        { retry_after_max = -1 }, { retry_after_max = 0 / 0 }, { retry_after_max = math.huge },
      }
      for _, o in ipairs(bad) do
        local k = o.max_run_length == 3600 and "exec_timeout" or next(o)
        o.client = fake_client({})
        local ok, err = pcall(warmbox.new, o)
        assert.is_false(ok, "accepted " .. tostring(k) .. " = " .. tostring(o[k]))
        assert.matches("^bad argument #1 to 'new' %(option '" .. k .. "': ", err:gsub("^[^:]*:%d+: ", ""))
      end
      local wb = assert(warmbox.new{ client = fake_client({}), secret = SECRET, exec_timeout = 3600,
        max_run_length = 3600,
        max_output = 1024, max_files_bytes = 2048 })
      local s = wb:session("k")
      assert.equal(1024, s.max_output)
      assert.equal(2048, s.max_files_bytes)
      local wb16 = assert(warmbox.new{ client = fake_client({}), secret = SECRET })
      assert.equal(16 * 1048576, wb16:session("k").max_output)
      for _, o in ipairs({ { exec_timeout = math.huge }, { idle_timeout = 0 / 0 }, { exec_timeout = 7200 },
        { max_output = 0 }, { max_files_bytes = 2.5 }, { exec_timeout = "1" } }) do
        local k = next(o)
        local ok, err = pcall(wb.session, wb, "k", o)
        assert.is_false(ok, "session accepted " .. k)
        assert.matches("bad argument #2 to 'session' %(option '" .. k .. "': ", err)
      end
      assert.equal(10, wb:session("k", { exec_timeout = 10 }).exec_timeout)
    end)

    it("uses a given client and starts no server", function()
      local warmbox = fresh_warmbox()
      local wb = assert(warmbox.new{ client = fake_client({}) })
      assert.is_nil(wb.server)
      assert.equal("code-interpreter-v1", wb.template)
      assert.equal(300, wb.exec_timeout)
      assert.equal(30, wb.idle_timeout)          -- warmbox.IDLE_TIMEOUT, chosen by bench/cost.lua's sweep
      assert.equal(warmbox.IDLE_TIMEOUT, wb.idle_timeout)
      assert.equal("warmboxSessionId", wb.tag)
      wb:close()
      assert.has_error(function() wb:session("k") end, "attempt to use a closed warmbox.Warmbox")
    end)

    it("returns nil, msg, 'POLICY' for a policy file that does not load", function()
      local warmbox = fresh_warmbox()
      local wb, err, code = warmbox.new{ client = fake_client({}), policy = "/nonexistent/p.lua" }
      assert.is_nil(wb)
      assert.matches("cannot read policy", err)
      assert.equal("POLICY", code)
    end)

    it("returns nil, msg, 'NOT_FOUND' when the embedded warmboxd cannot be found", function()
      local warmbox = fresh_warmbox()
      package.loaded["warmbox.e2b"] = { new = function() return {} end }
      local wb, err, code = warmbox.new{ server = "private", warmboxd = "/nonexistent/warmboxd" }
      package.loaded["warmbox.e2b"] = nil
      assert.is_nil(wb)
      assert.equal("warmboxd not found at '/nonexistent/warmboxd'", err)
      assert.equal("NOT_FOUND", code)
    end)
  end)

  describe(":session()", function()
    it("raises on misuse", function()
      local warmbox = fresh_warmbox()
      local wb = warmbox.new{ client = fake_client({}) }
      assert.has_error(function() wb:session() end,
        "bad argument #1 to 'session' (non-empty string expected, got nil)")
      assert.has_error(function() wb:session("k", { user = "x" }) end,
        "bad argument #2 to 'session' (unknown option 'user')")
    end)
  end)

  describe(":release() and :sessions()", function()
    it("kill and list only the sandboxes whose tag decodes to the key, any fingerprint", function()
      local warmbox = fresh_warmbox()
      local tag_mod = require "warmbox.tag"
      local o = { hmac = fakes.hmac, sha256 = fake_hash, secret = SECRET }
      local a1 = tag_mod.tag_value("w:1", o)
      local a2 = tag_mod.tag_value("w:1", { hmac = o.hmac, sha256 = o.sha256, actor = "bob", secret = SECRET })
      local b = tag_mod.tag_value("w:10", o)
      local items = {
        { sandbox_id = "s1", metadata = { warmboxSessionId = a1 }, state = "running" },
        { sandbox_id = "s2", metadata = { warmboxSessionId = a2 }, state = "paused" },
        { sandbox_id = "s3", metadata = { warmboxSessionId = b }, state = "running" },
        { sandbox_id = "s4", metadata = { warmboxSessionId = "w:1" }, state = "running" },
        { sandbox_id = "s5", metadata = { other = a1 }, state = "running" },
      }
      local client = fake_client(items)
      local lk = fake_lock()
      lk.state[a1] = '{"v":1,"sandbox_id":"s1"}'
      local wb = warmbox.new{ client = client, lock = lk, secret = SECRET }
      local list = assert(wb:sessions())
      assert.equal(3, #list)
      assert.same({ "w:1", "w:1", "w:10" }, { list[1].key, list[2].key, list[3].key })
      assert.equal(2, assert(wb:release("w:1")))
      table.sort(client.killed)
      assert.same({ "s1", "s2" }, client.killed)
      assert.is_nil(lk.state[a1])
      assert.same({ "running", "paused" }, client.listed.state)
    end)

    it("returns BUSY while a run holds the session", function()
      local warmbox = fresh_warmbox()
      local tag_mod = require "warmbox.tag"
      local o = { hmac = fakes.hmac, sha256 = fake_hash, secret = SECRET }
      local a1 = tag_mod.tag_value("w:1", o)
      local client = fake_client({ { sandbox_id = "s1", metadata = { warmboxSessionId = a1 } } })
      local lk = fake_lock()
      lk.held[a1] = true
      local wb = warmbox.new{ client = client, lock = lk, secret = SECRET }
      local n, err, code = wb:release("w:1")
      assert.is_nil(n)
      assert.matches("busy", err)
      assert.equal("BUSY", code)
      assert.same({}, client.killed)
    end)
  end)
end)
