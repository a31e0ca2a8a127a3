-- The file lock leaves nothing of a conversation that is gone: wb:release and
-- a GC kill of the session's sandbox remove its lock and queue files (against
-- a real warmboxd, with the file lock in a private directory).
local sessions = require "spec.helpers.sessions"

local function ls(dir)
  local p = io.popen("ls -A '" .. dir .. "' 2>/dev/null")
  local t = {}
  for l in p:lines() do if l ~= ".break" then t[#t + 1] = l end end
  p:close()
  table.sort(t)
  return t
end

describe("lock files of a conversation that is gone", function()
  local env = sessions.new()
  lazy_setup(function() env:start() end)
  lazy_teardown(function() env:stop() end)

  it("are removed by wb:release; another conversation's stay", function()
    local wb = env:warmbox{ exec_timeout = 30, idle_timeout = 30 }
    assert(wb:session("litter:gone"):run("1"))
    assert(wb:session("litter:kept"):run("1"))
    assert.equal(4, #ls(env.lockdir)) -- a lock and a queue file each
    assert.equal(1, wb:release("litter:gone"))
    local kept = require("warmbox.lock")._file_name(wb:session("litter:kept").tag_value)
    assert.same({ kept, kept .. "q" }, ls(env.lockdir))
    assert.equal(1, wb:release("litter:kept"))
    assert.same({}, ls(env.lockdir))
    -- the key works again afterwards
    local r = assert(wb:session("litter:gone"):run("2"))
    assert.is_false(r.reused)
    assert.equal(1, wb:release("litter:gone"))
  end)

  it("are removed when GC collects the session's sandbox", function()
    local wb = env:warmbox{ exec_timeout = 30, idle_timeout = 30 }
    assert(wb:session("litter:old"):run("1"))
    assert.equal(2, #ls(env.lockdir))
    -- a GC pass that sees the sandbox as two days idle
    local later = env:warmbox{ clock = function() return os.time() + 2 * 86400 end }
    local rep = assert(later:gc{ max_age = 86400 })
    assert.equal(1, rep.killed)
    assert.same({}, ls(env.lockdir))
  end)
end)
