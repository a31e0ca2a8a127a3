-- The file lock's directory and files cannot be squatted by another local
-- user: a lock file holds the session's sandbox id and access token, so the
-- directory must be the user's own (0700), a lock file is never a symlink,
-- never another user's, never writable by others. Another user is played by
-- `nobody` (chown needs root, as CI runs; as a user the ownership cases are
-- shown by a directory that others may write, which any user can make).
local lock = require "warmbox.lock"
local core = require "warmbox.core"

local tmpdir = require("spec.helpers.lockdir").tmpdir

local function sh(cmd) return os.execute(cmd .. " 2>/dev/null") == true end

local read = require("spec.helpers.warmboxd").read_all

-- Takes and releases `key` in `dir`, writing a remembered sandbox; returns
-- what lock:lock answered.
local function use(dir, key)
  local lk = lock.new{ backend = "file", dir = dir, timeout = 1 }
  local ok, err, code = lk:lock(key or "conv:1")
  if ok then
    assert(lk:set_state('{"sandbox_id":"sbx-secret","access_token":"tok-secret"}'))
    lk:unlock()
  end
  return ok, err, code
end

local is_root = core.geteuid() == 0

describe("warmbox.lock's directory", function()
  local dirs = {}
  local function fresh()
    local d = tmpdir()
    dirs[#dirs + 1] = d
    return d
  end
  after_each(function()
    for _, d in ipairs(dirs) do os.execute("rm -rf '" .. d .. "'") end
    dirs = {}
  end)

  it("is one per user by default: $XDG_RUNTIME_DIR/warmbox/locks, else /tmp/warmbox-locks-<uid>", function()
    local dflt = lock.default_dir()
    local run = os.getenv("XDG_RUNTIME_DIR")
    if run and run ~= "" then
      assert.are.equal(run .. "/warmbox/locks", dflt)
    else
      assert.are.equal("/tmp/warmbox-locks-" .. core.geteuid(), dflt)
    end
    assert.are.equal(dflt, lock.new{ backend = "file" }.dir)
  end)

  it("is made owner-only when missing, and used", function()
    local d = fresh()
    assert.is_number((use(d)))
    local p = io.popen("stat -c %a '" .. d .. "'")
    assert.are.equal("700", p:read("l"))
    p:close()
  end)

  it("is refused when others may write to it, and nothing is written there", function()
    local d = fresh()
    assert(sh("mkdir -m 0777 '" .. d .. "' && chmod 0777 '" .. d .. "'"))
    local ok, err, code = use(d)
    assert.is_nil(ok)
    assert.are.equal("IO", code)
    assert.matches("writable by others", err, 1, true)
    local p = io.popen("ls -A '" .. d .. "'")
    assert.are.equal("", p:read("a"))
    p:close()
  end)

  it("is refused when it is a symbolic link", function()
    local d, target = fresh(), fresh()
    assert(sh("mkdir -m 0700 '" .. target .. "' && ln -s '" .. target .. "' '" .. d .. "'"))
    local ok, err = use(d)
    assert.is_nil(ok)
    assert.matches("symbolic link", err, 1, true)
  end)

  describe("as root, against another user's squat", function()
    if not is_root then
      it("needs root to chown to nobody (CI runs as root)", function()
        assert.is_false(is_root) -- the cases below are shown in CI
      end)
      return
    end

    it("refuses a directory another user owns", function()
      local d = fresh()
      assert(sh("mkdir -m 0700 '" .. d .. "' && chown nobody '" .. d .. "'"))
      local ok, err = use(d)
      assert.is_nil(ok)
      assert.matches("owned by another user", err, 1, true)
    end)

    it("refuses a lock file another user planted (0666), and writes no token into it", function()
      local d = fresh()
      assert(use(d))  -- the directory is ours
      local name = lock._file_name("conv:2")
      local path = d .. "/" .. name
      assert(sh("touch '" .. path .. "' && chmod 0666 '" .. path .. "' && chown nobody '" .. path .. "'"))
      local ok, err = use(d, "conv:2")
      assert.is_nil(ok)
      assert.matches("refusing lock file", err, 1, true)
      assert.are.equal("", read(path))
    end)

    it("never follows a symlink planted as the lock file", function()
      local d, victim = fresh(), fresh()
      assert(use(d))
      assert(sh("printf keep > '" .. victim .. "' && ln -s '" .. victim .. "' '" .. d .. "/" ..
        lock._file_name("conv:3") .. "'"))
      local ok, err = use(d, "conv:3")
      assert.is_nil(ok)
      assert.matches("symbolic link", err, 1, true)
      assert.are.equal("keep", read(victim))
    end)
  end)
end)

describe("warmbox.server's state directory", function()
  -- A lua5.4 that sees XDG_RUNTIME_DIR = dir and asks for the user's server.
  local function local_server(dir, prefix)
    local build = core.module_path():match("^(.*)/warmbox/[^/]*$")
    local code = "local st, err = require('warmbox.server').local_server() print(st and st.url or err)"
    local p = io.popen(string.format((prefix or "") .. "env XDG_RUNTIME_DIR='%s' "
      .. "LUA_PATH='lua/?.lua;lua/?/init.lua;;' LUA_CPATH='%s/?.so;;' lua5.4 -e \"%s\" 2>&1", dir, build, code))
    local out = p:read("a")
    p:close()
    return out
  end

  -- A state directory of that mode holding a state file; what local_server says of it.
  local function planted(mode)
    local run = tmpdir()
    assert(sh("mkdir -p -m " .. mode .. " '" .. run .. "/warmbox' && chmod " .. mode .. " '" .. run .. "/warmbox'"))
    local f = assert(io.open(run .. "/warmbox/server.json", "w"))
    f:write('{"url":"http://127.0.0.1:1","pid":1,"api_key":"e2b_planted"}')
    f:close()
    local out = local_server(run)
    os.execute("rm -rf '" .. run .. "'")
    return out
  end

  it("is not trusted when others may write to it: a planted state file is refused", function()
    local out = planted("0777")
    assert.matches("state directory: refusing directory", out, 1, true)
    assert.matches("writable by others", out, 1, true)
  end)

  it("checks the directory before it reads the state file: a fifo planted there blocks nothing", function()
    local run = tmpdir()
    assert(sh("mkdir -p -m 0777 '" .. run .. "/warmbox' && chmod 0777 '" .. run .. "/warmbox' && mkfifo '"
      .. run .. "/warmbox/server.json'"))
    local out = local_server(run, "timeout 20 ")
    os.execute("rm -rf '" .. run .. "'")
    assert.matches("state directory: refusing directory", out, 1, true)
  end)

  it("is the user's own without HOME or XDG directories, never under /tmp", function()
    local build = core.module_path():match("^(.*)/warmbox/[^/]*$")
    local p = io.popen(string.format("env -u HOME -u XDG_RUNTIME_DIR -u XDG_STATE_HOME LUA_PATH='lua/?.lua;"
      .. "lua/?/init.lua;;' LUA_CPATH='%s/?.so;;' lua5.4 -e \"print(require('warmbox.server').state_dir())\" 2>&1",
      build))
    local out = p:read("a")
    p:close()
    local home = io.popen("getent passwd $(id -u) | cut -d: -f6"):read("l")
    assert.equal(home .. "/.local/state/warmbox\n", out)
    assert.is_nil(out:find("^/tmp"))
  end)

  it("is read when it is the user's own (0700)", function()
    local out = planted("0700")
    -- pid 1 is no warmboxd: the file was read and judged stale, not refused
    assert.matches("stale state file", out, 1, true)
  end)
end)
