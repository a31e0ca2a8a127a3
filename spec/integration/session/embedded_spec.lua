-- warmbox.new{} with no E2B key starts an embedded warmboxd and stops it on close.
local wbd = require "spec.helpers.warmboxd"

describe("warmbox.new{} with the embedded warmboxd", function()
  local warmbox = require "warmbox"

  local alive = require("warmbox.server").alive

  it("starts warmboxd on a loopback port, runs code, and stops it on close", function()
    local wb = assert(warmbox.new{ server = "private", warmboxd = wbd.bin(), lock = "memory" })
    assert.matches("^http://127%.0%.0%.1:%d+$", wb.server.url)
    local pid = wb.server.pid
    assert.is_true(alive(pid))
    local s = wb:session("embedded:1")
    assert(s:run("x = 20"))
    local r = assert(s:run("x * 2"))
    assert.equal("40", r.results[1].text)
    assert.is_true(r.reused)
    local dir = wb.server.dir
    wb:close()
    assert.is_false(alive(pid))
    assert.is_nil(io.open(dir .. "/warmboxd.log"))
    assert.is_true(wb:close()) -- idempotent
  end)

  it("stops it when the object goes out of a <close> scope", function()
    local pid
    do
      local wb <close> = assert(warmbox.new{ server = "private", warmboxd = wbd.bin(), lock = "memory" })
      pid = wb.server.pid
      assert.is_true(alive(pid))
    end
    assert.is_false(alive(pid))
  end)

  it("stops it when the object is collected", function()
    local pid
    do
      local wb = assert(warmbox.new{ server = "private", warmboxd = wbd.bin(), lock = "memory" })
      pid = wb.server.pid
    end
    collectgarbage()
    collectgarbage()
    assert.is_false(alive(pid))
  end)

  it("finds warmboxd through $WARMBOXD_BIN or next to warmbox.core", function()
    local server = require "warmbox.server"
    local path = assert(server.find_bin())
    assert.is_truthy(io.open(path))
  end)
end)
