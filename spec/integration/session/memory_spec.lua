-- A sandbox paused without its memory (GC demoted it to a filesystem-only
-- snapshot) against a real warmboxd: by default the session resumes it and
-- goes on with its files and a fresh kernel; with `require_memory` it is
-- definitively unusable for the session, which gets a new sandbox and kills
-- the old one once the new one is secured.
local wbd = require "spec.helpers.warmboxd"

describe("a session whose sandbox lost its memory", function()
  local srv, dir

  lazy_setup(function()
    srv = wbd.start{ args = { "--rtt-ms", "0" } }
    dir = os.tmpname()
    os.remove(dir)
  end)
  lazy_teardown(function()
    if srv then srv:stop() end
    if dir then os.execute("rm -rf " .. wbd.sh_quote(dir)) end
  end)

  local function new_wb(o)
    local warmbox = require "warmbox"
    local opts = { api_key = srv.api_key, api_url = srv.url, sandbox_url = srv.url,
      lock = { backend = "file", dir = dir } }
    for k, v in pairs(o or {}) do opts[k] = v end
    return assert(warmbox.new(opts))
  end

  -- Runs `x = 41` and leaves a file, then GC demotes the session's sandbox.
  local function demoted_session(wb, key, sopts)
    local s = wb:session(key, sopts)
    local r1 = assert(s:run("x = 41\nopen('/home/user/kept.txt', 'w').write('files stay')"))
    local id = r1.sandbox_id
    local rep = assert(wb:gc{ policy = { gc = function(item)
      return item.sandbox_id == id and "demote" or "keep"
    end } })
    assert.equal(1, rep.demoted)
    local info = assert(wb.client:info(id))
    assert.equal("paused", info.state)
    return s, id
  end

  it("by default resumes it: the same sandbox, its files, a fresh kernel", function()
    local wb = new_wb()
    local s, id = demoted_session(wb, "mem:default")
    local r = assert(s:run("open('/home/user/kept.txt').read()"))
    assert.equal(id, r.sandbox_id)
    assert.equal("files stay", r.results[1].text)
    r = assert(s:run("x"))
    assert.equal("NameError", r.error and r.error.name)
    wb:close()
  end)

  it("with require_memory replaces it and kills it once the new one is secured", function()
    local wb = new_wb{ require_memory = true }
    local events = {}
    local s, id = demoted_session(wb, "mem:required")
    s.on_event = function(name, info) events[#events + 1] = name .. " " .. tostring(info.sandbox_id) end
    local r = assert(s:run("'fresh'"))
    assert.are_not.equal(id, r.sandbox_id)
    assert.is_false(r.reused)
    local _, _, code = wb.client:info(id)
    assert.equal("NOT_FOUND", code)
    -- the new sandbox was created before the old one was killed
    local created, killed
    for i, e in ipairs(events) do
      if e:match("^create ") then created = created or i end
      if e == "kill " .. id then killed = i end
    end
    assert.truthy(created and killed and created < killed, table.concat(events, ", "))
    -- and the new one is the session's from now on, kept warm
    local r2 = assert(s:run("'again'"))
    assert.equal(r.sandbox_id, r2.sandbox_id)
    wb:close()
  end)

  it("with require_memory keeps a sandbox that lost nothing", function()
    local wb = new_wb{ require_memory = true }
    local s = wb:session("mem:kept")
    local r1 = assert(s:run("y = 1"))
    assert(wb.client:pause(r1.sandbox_id))
    local r2 = assert(s:run("y + 1"))
    assert.equal(r1.sandbox_id, r2.sandbox_id)
    assert.equal("2", r2.results[1].text)
    wb:close()
  end)

  it("refuses a require_memory that is not a boolean", function()
    local wb = new_wb()
    assert.has_error(function() wb:session("mem:bad", { require_memory = "yes" }) end)
    wb:close()
  end)
end)
