-- One output line longer than warmboxd's longest kernel line (16 MiB), or a
-- write that long with no newline: the run keeps what fits its cap
-- (max_output) and says truncated; the CLI prints it and says so.
local sessions = require "spec.helpers.sessions"
local wbd = require "spec.helpers.warmboxd"

local XDG = os.tmpname()
os.remove(XDG)

describe("sessions: an output line over 16 MiB (warmboxd)", function()
  local env = sessions.new()
  local wb

  lazy_setup(function()
    env:start()
    wb = env:warmbox{ max_output = 1048576 }
  end)
  lazy_teardown(function()
    env:stop()
    os.execute("rm -rf " .. wbd.sh_quote(XDG))
  end)

  local CELLS = {
    { "python", "import sys\nsys.stdout.write('x' * (17 << 20))" },
    { "python", "print('x' * (20 << 20))" },
    { "javascript", "process.stdout.write('x'.repeat(17 << 20))" },
    { "bash", "head -c $((17 << 20)) /dev/zero | tr '\\0' x" },
  }
  for i, c in ipairs(CELLS) do
    it(c[1] .. " (" .. i .. "): keeps what fits the cap, truncated = true", function()
      local r = assert(wb:session("bigline:" .. i):run(c[2], { language = c[1] }))
      assert.equal(1048576, #r.stdout)
      assert.equal(("x"):rep(1048576), r.stdout)
      assert.is_true(r.truncated)
    end)
  end

  it("the CLI prints what fits and says the output was truncated", function()
    local code, out, err = require("spec.helpers.cli").run("run --session bigline:cli "
      .. wbd.sh_quote("import sys\nsys.stdout.write('x' * (17 << 20))"), { xdg = XDG })
    assert.equal(0, code, err)
    assert.equal(16 * 1048576, #out)
    assert.matches("truncated", err)
  end)
end)
