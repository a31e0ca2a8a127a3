-- A python cell that forks children and never waits for them (a fork bomb
-- stopped by the sandbox's process limit) leaves no zombies behind: the
-- kernel reaps them once the cell is over, so the next cells (bash's, which
-- start processes) run; children of subprocess keep their own return codes.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local cell = require "spec.helpers.cell"

describe("warmboxd: a python cell's children nobody waits for", function()
  local srv, sb

  lazy_setup(function()
    srv = wbd.start{}
    sb = http.create_interp(srv)
  end)
  lazy_teardown(function() srv:stop() end)

  it("are reaped after the cell: the next bash cell runs", function()
    local out, err = cell(srv, sb, "import os\nn = 0\ntry:\n  while n < 1000:\n    if os.fork() == 0:\n"
      .. "      os._exit(0)\n    n += 1\nexcept OSError:\n  pass\nn", "python")
    assert.is_nil(err)
    assert.is_true(tonumber(out) > 50, out)
    out, err = cell(srv, sb, "echo ok; true")
    assert.is_nil(err)
    assert.equal("ok\n", out)
  end)

  it("never takes a subprocess's return code", function()
    local _, err = cell(srv, sb, "import subprocess, time\np = subprocess.Popen(['sh', '-c', 'exit 7'])\n"
      .. "time.sleep(0.5)", "python")
    assert.is_nil(err)
    local out = cell(srv, sb, "p.wait()", "python")
    assert.equal("7", out)
  end)
end)
