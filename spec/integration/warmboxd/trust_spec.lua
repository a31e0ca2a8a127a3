-- warmboxd against local clients and sandboxes that take more than their share:
-- uploads bounded by the sandbox's own allowance
-- and streamed to disk, listings and contexts capped, one real API key for the
-- embedded and CLI servers, and no route that answers a foreign Host or a browser.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"

local RPC = { ["Connect-Protocol-Version"] = "1" }
local OCTET = { ["Content-Type"] = "application/octet-stream" }

local function sh(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  p:close()
  return out
end

local function is_root() return sh("id -u"):match("^0") ~= nil end

-- A file of `mib` MiB of zeros (gzip'd when gz), removed by the caller.
local function zeros(mib, gz)
  local path = os.tmpname()
  assert(os.execute(string.format("head -c %dM /dev/zero %s > %s", mib, gz and "| gzip -1" or "",
    wbd.sh_quote(path))))
  return path
end

local function upload(srv, sb, path, file, headers)
  local h = {}
  for k, v in pairs(OCTET) do h[k] = v end
  for k, v in pairs(headers or {}) do h[k] = v end
  return http.sandbox(srv, sb, 49983, "POST", "/files?path=" .. path,
    { curl_args = { "--data-binary", "@" .. file }, headers = h, timeout = 120 })
end

local function rpc(srv, sb, method, body)
  return http.sandbox(srv, sb, 49983, "POST", "/" .. method, { json = body, headers = RPC, timeout = 120 })
end

local function peak_rss_kb(pid)
  return tonumber(wbd.read_all("/proc/" .. pid .. "/status"):match("VmHWM:%s*(%d+)"))
end

-- A warmboxd (`wbd.start(opts)`) and a secure sandbox on it (`create`, default a
-- base one) for the enclosing describe: `t.srv`, `t.sb`.
local function server_with_sandbox(opts, create)
  local t = {}
  lazy_setup(function()
    t.srv = wbd.start(opts)
    t.sb = create and create(t.srv) or http.create(t.srv, { templateID = "base", secure = true, timeout = 600 })
  end)
  lazy_teardown(function() if t.srv then t.srv:stop() end end)
  return t
end

describe("warmboxd uploads", function()
  describe("into a sandbox of 32 MB", function()
    -- the sandbox's allowance, small: its home and /tmp are a tmpfs of min(disk, memory)
    local t = server_with_sandbox{ wrapper = "env WARMBOXD_MEMORY_MB=32 " .. (os.getenv("WARMBOXD_WRAPPER") or ""),
      args = { "--max-upload-mb", "64" } }

    local function stat(path) return rpc(t.srv, t.sb, "filesystem.Filesystem/Stat", { path = path }) end

    it("refuses one bigger than the sandbox's allowance with 507, and leaves nothing of it", function()
      if not is_root() then pending("the size-limited home tmpfs needs root") return end
      local big = zeros(48)
      local ok, err = pcall(function()
        local res = upload(t.srv, t.sb, "big.bin", big)
        assert.are.equal(507, res.status, res.body)
        assert.are.equal(507, res.json.code)
        assert.matches("space", res.json.message)
        assert.are.equal(404, stat("big.bin").status)
        -- an existing file is not truncated by a refused overwrite
        assert.are.equal(200, http.sandbox(t.srv, t.sb, 49983, "POST", "/files?path=keep.txt",
          { body = "old", headers = OCTET }).status)
        assert.are.equal(507, upload(t.srv, t.sb, "keep.txt", big).status)
        assert.are.equal("old", http.sandbox(t.srv, t.sb, 49983, "GET", "/files?path=keep.txt").body)
      end)
      os.remove(big)
      assert(ok, err)
    end)

    it("removes what a gzip upload wrote before the disk filled (nothing half-written)", function()
      if not is_root() then pending("the size-limited home tmpfs needs root") return end
      local gz = zeros(48, true)   -- small on the wire: only the writes find it too big
      local ok, err = pcall(function()
        local res = upload(t.srv, t.sb, "bomb.bin", gz, { ["Content-Encoding"] = "gzip" })
        assert.are.equal(507, res.status, res.body)
        assert.are.equal(404, stat("bomb.bin").status)
        -- the space is free again: what fits is taken
        local small = zeros(4)
        res = upload(t.srv, t.sb, "small.bin", small)
        os.remove(small)
        assert.are.equal(200, res.status, res.body)
        assert.are.equal(tostring(4 << 20), stat("small.bin").json.entry.size)
      end)
      os.remove(gz)
      assert(ok, err)
    end)
  end)

  describe("into a sandbox of the default size", function()
    local t = server_with_sandbox{}

    it("are streamed to disk, not held in warmboxd's memory", function()
      local before = peak_rss_kb(t.srv.pid)
      if not before then pending("no /proc/<pid>/status VmHWM") return end
      local file = zeros(64)
      local res = upload(t.srv, t.sb, "stream.bin", file)
      os.remove(file)
      assert.are.equal(200, res.status, res.body)
      local grew = peak_rss_kb(t.srv.pid) - before
      -- a body held whole would raise the peak by its 64 MiB (65536 kB) at least
      assert.is_true(grew < 24 * 1024, "peak RSS grew by " .. grew .. " kB")
    end)
  end)
end)

describe("warmboxd bounds what one request can make it hold", function()
  local t = server_with_sandbox({}, http.create_interp)

  it("refuses a recursive ListDir of more than 50,000 entries (resource_exhausted)", function()
    local res = rpc(t.srv, t.sb, "filesystem.Filesystem/ListDir", { path = "/usr", depth = 100 })
    assert.are.equal(429, res.status)
    assert.are.equal("resource_exhausted", res.json.code)
    assert.matches("more than 50000 entries", res.json.message)
    assert.is_true(#res.body < 4096)
    -- a listing under the cap is answered
    res = rpc(t.srv, t.sb, "filesystem.Filesystem/ListDir", { path = "/usr", depth = 1 })
    assert.are.equal(200, res.status, res.body)
    assert.is_true(#res.json.entries > 3)
  end)

  it("refuses a ListDir over the cap without holding its entries first", function()
    -- the peak from here on (clear_refs 5 resets VmHWM to the present RSS)
    local f = io.open("/proc/" .. t.srv.pid .. "/clear_refs", "w")
    if not f or not peak_rss_kb(t.srv.pid) then pending("no /proc/<pid>/clear_refs or VmHWM") return end
    f:write("5")
    f:close()
    local before = peak_rss_kb(t.srv.pid)
    local res = rpc(t.srv, t.sb, "filesystem.Filesystem/ListDir", { path = "/usr", depth = 100 })
    assert.are.equal(429, res.status, res.body)
    local grew = peak_rss_kb(t.srv.pid) - before
    -- 50,000 entries built and then dropped raise the peak by about 90 MB
    assert.is_true(grew < 24 * 1024, "peak RSS grew by " .. grew .. " kB")
  end)

  it("caps contexts per sandbox at 128 (the two default ones included), 429 beyond", function()
    local made, res = {}, nil
    for _ = 1, 130 do
      res = http.sandbox(t.srv, t.sb, 49999, "POST", "/contexts", { json = { language = "python" } })
      if res.status ~= 200 then break end
      made[#made + 1] = res.json.id
    end
    assert.are.equal(429, res.status, res.body)
    assert.matches("128 contexts", res.body)
    assert.are.equal(126, #made)
    assert.are.equal(200, http.sandbox(t.srv, t.sb, 49999, "DELETE", "/contexts/" .. made[1]).status)
    assert.are.equal(200, http.sandbox(t.srv, t.sb, 49999, "POST", "/contexts", { json = {} }).status)
  end)

  it("caps running sandboxes per team at 20 by default (429), other teams unaffected", function()
    local s = wbd.start{ default_max_running = true }
    local ok, err = pcall(function()
      for i = 1, 20 do
        local res = http.api(s, "POST", "/sandboxes", { templateID = "base", timeout = 60 })
        assert.are.equal(201, res.status, "create " .. i .. ": " .. res.body)
      end
      local res = http.api(s, "POST", "/sandboxes", { templateID = "base", timeout = 60 })
      assert.are.equal(429, res.status)
      assert.matches("%(20%)", res.json.message)
      local other = { url = s.url, api_key = wbd.new_key() }
      assert.are.equal(201, http.api(other, "POST", "/sandboxes", { templateID = "base", timeout = 60 }).status)
    end)
    s:stop()
    assert(ok, err)
  end)
end)

describe("warmboxd's --max-list-entries and --max-contexts", function()
  local t = server_with_sandbox({ args = { "--max-list-entries", "5", "--max-contexts", "3" } }, http.create_interp)

  it("set the caps of ListDir and of contexts per sandbox", function()
    local res = rpc(t.srv, t.sb, "filesystem.Filesystem/ListDir", { path = "/usr", depth = 1 })
    assert.are.equal(429, res.status, res.body)
    assert.matches("more than 5 entries", res.json.message)
    assert.are.equal(200, rpc(t.srv, t.sb, "filesystem.Filesystem/ListDir", { path = "/home" }).status)
    res = http.sandbox(t.srv, t.sb, 49999, "POST", "/contexts", { json = { language = "python" } })
    assert.are.equal(200, res.status, res.body)   -- the two default ones and this one
    res = http.sandbox(t.srv, t.sb, 49999, "POST", "/contexts", { json = { language = "python" } })
    assert.are.equal(429, res.status, res.body)
    assert.matches("3 contexts", res.body)
  end)

  it("are refused at start-up when out of range", function()
    for _, args in ipairs{ { "--max-list-entries", "0" }, { "--max-contexts", "1" } } do
      local out = sh(wbd.sh_quote(wbd.bin()) .. " " .. table.concat(args, " ") .. " 2>&1; echo rc=$?")
      assert.matches("expects an integer", out)
      assert.matches("rc=2", out)
    end
  end)
end)

describe("warmboxd's clients", function()
  describe("--api-key-file", function()
    local dir
    before_each(function()
      dir = sh("mktemp -d /tmp/wbd-key.XXXXXX"):gsub("%s+$", "")
    end)
    after_each(function() os.execute("rm -rf " .. wbd.sh_quote(dir)) end)

    local function key_file(key, mode)
      local path = dir .. "/key"
      local f = assert(io.open(path, "wb"))
      f:write(key .. "\n")
      f:close()
      assert(os.execute("chmod " .. mode .. " " .. wbd.sh_quote(path)))
      return path
    end

    it("accepts only the key in the file (401 for any other)", function()
      local key = wbd.new_key()
      local s = wbd.start{ args = { "--api-key-file", key_file(key, "600") }, api_key = key }
      local ok, err = pcall(function()
        assert.are.equal(200, http.api(s, "GET", "/sandboxes").status)
        local other = { url = s.url, api_key = wbd.new_key() }
        local res = http.api(other, "GET", "/sandboxes")
        assert.are.equal(401, res.status)
        assert.matches("Invalid API key", res.json.message)
        assert.are.equal(401, http.request{ url = s.url .. "/sandboxes" }.status)
      end)
      s:stop()
      assert(ok, err)
    end)

    it("refuses at start-up a key file others may read", function()
      local path = key_file(wbd.new_key(), "644")
      local ok, err = pcall(wbd.start, { args = { "--api-key-file", path } })
      assert.is_false(ok)
      assert.matches("readable or writable by others", err)
    end)
  end)

  describe("the embedded server", function()
    it("has one random key of its own, in a 0600 file, and refuses any other", function()
      local server = require "warmbox.server"
      local s = assert(server.start{ bin = wbd.bin() })
      local ok, err = pcall(function()
        assert.matches("^e2b_%x+$", s.api_key)
        assert.are.equal("600", sh("stat -c %a " .. wbd.sh_quote(s.dir .. "/api-key")):match("%d+"))
        assert.are.equal(200, http.api(s, "GET", "/sandboxes").status)
        assert.are.equal(401, http.api({ url = s.url, api_key = wbd.new_key() }, "GET", "/sandboxes").status)
      end)
      s:stop()
      assert(ok, err)
    end)
  end)

  describe("every route", function()
    local t = server_with_sandbox{}

    local function control(headers) return http.api(t.srv, "GET", "/sandboxes", nil, { headers = headers }).status end
    local function data(headers)
      return http.sandbox(t.srv, t.sb, 49983, "GET", "/health", { headers = headers }).status
    end

    it("refuses a browser's request (an Origin header), 403", function()
      for _, origin in ipairs({ "http://localhost:3000", "null", "https://evil.example" }) do
        assert.are.equal(403, control({ Origin = origin }), origin)
        assert.are.equal(403, data({ Origin = origin }), origin)
      end
    end)

    it("refuses a Host that DNS rebinding could give (a name not of loopback), 403", function()
      for _, host in ipairs({ "evil.example", "evil.example:" .. t.srv.port, "localhost.evil.example",
        "49983-" .. t.sb.sandboxID .. ".evil.example", "127.0.0.1.nip.io" }) do
        assert.are.equal(403, control({ Host = host }), host)
        assert.are.equal(403, data({ Host = host }), host)
      end
      local res = http.api(t.srv, "GET", "/sandboxes", nil, { headers = { Host = "evil.example" } })
      assert.matches("Host", res.json.message)
    end)

    it("answers an address, localhost and *.localhost", function()
      for _, host in ipairs({ "127.0.0.1:" .. t.srv.port, "localhost", "localhost.", "[::1]:" .. t.srv.port,
        "10.1.2.3", "api.localhost" }) do
        assert.are.equal(200, control({ Host = host }), host)
      end
      local res = http.request{ url = t.srv.url .. "/health",
        headers = { Host = "49983-" .. t.sb.sandboxID .. ".localhost:" .. t.srv.port,
          ["X-Access-Token"] = t.sb.envdAccessToken } }
      assert.are.equal(204, res.status, res.body)
    end)
  end)
end)
