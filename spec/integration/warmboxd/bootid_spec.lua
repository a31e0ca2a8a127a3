-- The sandbox's boot id over real HTTP: /proc/sys/kernel/random/boot_id is the
-- sandbox's own (not the host's), the same for every process of one boot,
-- kept by a pause with memory and new after a resume from the files only (a
-- cold boot, as E2B's VM has).
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"

local cjson = http.cjson

describe("warmboxd boot id", function()
  local srv

  local function run(sb, code, language)
    local res = http.sandbox(srv, sb, 49999, "POST", "/execute",
      { json = { code = code, language = language }, timeout = 60 })
    assert.are.equal(200, res.status, res.body)
    local out = {}
    for line in res.body:gmatch("[^\n]+") do
      local l = cjson.decode(line)
      if l.type == "stdout" then out[#out + 1] = l.text end
      if l.type == "result" and l.is_main_result then out[#out + 1] = l.text end
      assert.are_not.equal("error", l.type, res.body)
    end
    return table.concat(out)
  end

  local function boot_id(sb)
    return run(sb, "cat /proc/sys/kernel/random/boot_id", "bash")
  end

  lazy_setup(function() srv = wbd.start{} end)
  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  it("is the sandbox's own, kept with memory and new after a resume from files", function()
    local sb = http.api(srv, "POST", "/sandboxes", { templateID = "base", timeout = 600 }).json
    local id1 = boot_id(sb)
    assert.matches("^%x+%-%x+%-4%x+%-%x+%-%x+\n$", id1)
    local f = assert(io.open("/proc/sys/kernel/random/boot_id"))
    local host = f:read("a")
    f:close()
    assert.are_not.equal(host, id1)
    -- every process of the boot sees the same id
    assert.are.equal(id1, run(sb, "print(open('/proc/sys/kernel/random/boot_id').read(), end='')"))
    -- read-only, as the kernel's
    local res = http.sandbox(srv, sb, 49999, "POST", "/execute",
      { json = { code = "echo x > /proc/sys/kernel/random/boot_id", language = "bash" } })
    assert.matches('"error"', res.body)
    assert.are.equal(id1, boot_id(sb))

    local path = "/sandboxes/" .. sb.sandboxID
    assert.are.equal(204, http.api(srv, "POST", path .. "/pause", { memory = true }).status)
    assert.are.equal(201, http.api(srv, "POST", path .. "/connect", { timeout = 60 }).status)
    assert.are.equal(id1, boot_id(sb))

    assert.are.equal(204, http.api(srv, "POST", path .. "/pause", { memory = false }).status)
    assert.are.equal(201, http.api(srv, "POST", path .. "/connect", { timeout = 60 }).status)
    local id2 = boot_id(sb)
    assert.matches("^%x+%-%x+%-4%x+%-%x+%-%x+\n$", id2)
    assert.are_not.equal(id1, id2)

    -- another sandbox boots with another id
    local other = http.api(srv, "POST", "/sandboxes", { templateID = "base", timeout = 600 }).json
    local id3 = boot_id(other)
    assert.are_not.equal(id2, id3)
  end)
end)
