-- The demo (what scripts/demo runs) completes every step on an embedded warmboxd.
local wbd = require "spec.helpers.warmboxd"

describe("warmbox demo", function()
  it("runs the conversation: cold start, warm run, idle pause, resume, chart, release", function()
    local root = wbd.root()
    local build = require("warmbox.core").module_path():match("^(.*)/warmbox/[^/]*$")
    local p = io.popen(string.format(
      "cd %s && WARMBOX_BUILD_DIR=%s WARMBOXD_BIN=%s lua5.4 bin/warmbox demo 2>&1; echo \"exit=$?\"",
      wbd.sh_quote(root), wbd.sh_quote(build), wbd.sh_quote(wbd.bin())))
    local out = p:read("a")
    p:close()
    assert.matches("exit=0\n$", out)
    -- what it says is what it does: the idle timeout it names is the lease the pause comes after
    assert.matches("%(exec timeout 10s, idle timeout 15s%)\n\n1%. ", out)
    assert.matches("4%. idle pause .- paused when its 15s lease %(set at the cold start%) ran out", out)
    assert.matches("1%. cold start .- x = 41%s+%(created sandbox i%w+, reused=false%)", out)
    assert.matches("2%. other session", out)
    assert.matches("3%. warm run .- %-> 42 .- reused=true", out)
    assert.matches("4%. idle pause .- paused", out)
    assert.matches("5%. resume .- %-> 42 .- resumed=true", out)
    assert.matches("6%. chart .- got chart%.png back: %d+ bytes, image/png, a real PNG", out)
    assert.matches("7%. gc %-%-dry%-run .- would kill 1 .- keep 1", out)
    assert.matches("8%. gc .- killed 1 %(i%w+%), kept 1", out)
    assert.matches("release .- 1 sandbox killed", out)
    assert.matches("done%.", out)
  end)
end)
