-- `warmbox doctor`'s "sandbox limits" check: it says which
-- per-sandbox limits a warmboxd run by this user gets. CI runs as root; the
-- non-root case runs the same check as user nobody (setpriv needs root).
local util = require "warmbox.util"

local ROOT = debug.getinfo(1, "S").source:sub(2):match("^(.*)/spec/unit/[^/]*$") or "."

local function limits_as(prefix)
  local code = "package.path = " .. string.format("%q", ROOT .. "/lua/?.lua;" .. ROOT .. "/lua/?/init.lua;")
    .. " .. package.path\nlocal d = require 'warmbox.doctor'\n"
    .. "for _, c in ipairs(d.embedded{ find_bin = function() return 'x' end }) do\n"
    .. "  if c.name == 'sandbox limits' then io.write(c.status, '\\t', c.detail) end\nend\n"
  local p = assert(io.popen(prefix .. "env -u LD_PRELOAD lua5.4 -e " .. util.sh_quote(code) .. " 2>&1"))
  local out = p:read("a")
  p:close()
  return out:match("^(%a+)\t(.*)$")
end

describe("warmbox doctor: sandbox limits", function()
  local p = io.popen("id -u")
  local root = p:read("l") == "0"
  p:close()

  it("as root with cgroup v1: ok, naming the cgroups, the disk tmpfs and the uid", function()
    if not root or not os.execute("test -w /sys/fs/cgroup/memory") then
      pending("needs root and cgroup v1's memory controller")
      return
    end
    local status, detail = limits_as("")
    assert.are.equal("ok", status, detail)
    assert.matches("memory cgroup", detail, 1, true)
    assert.matches("tmpfs of diskSizeMB", detail, 1, true)
    assert.matches("/dev/shm of half memoryMB", detail, 1, true)
  end)

  it("without root: warn, saying what holds and what does not", function()
    if not root then
      pending("runs the check as nobody: needs root")
      return
    end
    local status, detail = limits_as("setpriv --reuid=65534 --regid=65534 --clear-groups ")
    assert.are.equal("warn", status, detail)
    assert.matches("^without root: per sandbox one tmpfs of diskSizeMB", detail)
    assert.matches("16 inotify instances", detail, 1, true)
    assert.matches("per process RLIMIT_DATA = memoryMB", detail, 1, true)
    assert.matches("NO limit on a sandbox's total memory (its processes together) or cpu", detail, 1, true)
    assert.matches("cgroup v2", detail, 1, true)
  end)
end)
