-- The warmbox command against real warmboxd servers.
local wbd = require "spec.helpers.warmboxd"

-- A private XDG dir with no per-user server in it: the commands below run as they would
-- for someone who never ran `warmbox server start` (cli/server.lua covers that server).
local XDG = os.tmpname()
os.remove(XDG)

-- Runs bin/warmbox with the spec's build; returns exit status, stdout, stderr.
local function warmbox(args, stdin, env)
  return require("spec.helpers.cli").run(args, { stdin = stdin, env = env, xdg = XDG })
end

describe("bin/warmbox", function()
  it("prints its usage with --help", function()
    local code, out = warmbox("--help")
    assert.equal(0, code)
    assert.matches("usage: warmbox", out)
    assert.matches("run %-%-session KEY", out)
  end)

  it("refuses an unknown command with status 2", function()
    local code, _, err = warmbox("frobnicate")
    assert.equal(2, code)
    assert.matches("unknown command frobnicate", err)
  end)

  it("runs code on an embedded warmboxd, from an argument and from stdin", function()
    local code, out = warmbox("run --session cli:1 " .. wbd.sh_quote("print(6 * 7)"))
    assert.equal(0, code)
    assert.equal("42\n", out)
    local input = os.tmpname()
    local f = io.open(input, "w")
    f:write("x = 5\nx * 3\n")
    f:close()
    code, out = warmbox("run --session cli:1 -", input)
    os.remove(input)
    assert.equal(0, code)
    assert.equal("15\n", out)
  end)

  it("-q: nothing but the cell's own output, no note about the embedded server on stderr", function()
    local code, _, err = warmbox("run --session cli:q " .. wbd.sh_quote("print(6 * 7)"))
    assert.equal(0, code, err)
    assert.matches("warmbox: no local server", err, 1, true)
    local out
    code, out, err = warmbox("-q run --session cli:q "
      .. wbd.sh_quote("import sys; print(6 * 7); print('e', file=sys.stderr)"))
    assert.equal(0, code, err)
    assert.equal("42\n", out)
    assert.equal("e\n", err)
  end)

  it("exits 1 and prints the traceback when the code raises", function()
    local code, _, err = warmbox("run --session cli:err " .. wbd.sh_quote("1/0"))
    assert.equal(1, code)
    assert.matches("ZeroDivisionError", err)
  end)

  describe("against a shared warmboxd (--api-url)", function()
    local srv, lockdir, env
    lazy_setup(function()
      srv = wbd.start()
      lockdir = os.tmpname()
      os.remove(lockdir)
      env = ""
    end)
    lazy_teardown(function()
      srv:stop()
      os.execute("rm -rf '" .. lockdir .. "'")
    end)
    local function g() return "--api-url " .. srv.url .. " --api-key " .. srv.api_key .. " " end

    it("keeps a session across commands, lists it and releases it", function()
      local code = warmbox(g() .. "run --session cli:shared " .. wbd.sh_quote("y = 11"), nil, env)
      assert.equal(0, code)
      local out
      code, out = warmbox(g() .. "run --session cli:shared " .. wbd.sh_quote("y + 1"), nil, env)
      assert.equal(0, code)
      assert.equal("12\n", out)
      code, out = warmbox(g() .. "sessions", nil, env)
      assert.equal(0, code)
      assert.matches("cli:shared%s+cli%s+i%w+%s+running%s+%S+Z%s+%d+s", out)
      code, out = warmbox(g() .. "release cli:shared", nil, env)
      assert.equal(0, code)
      assert.equal("released cli:shared: 1 sandbox killed, 0 checkpoints deleted\n", out)
      code, out = warmbox(g() .. "sessions", nil, env)
      assert.equal(0, code)
      assert.equal("no sessions\n", out)
    end)

    it("saves output files with --out and uploads inputs with --file", function()
      local dir = os.tmpname()
      os.remove(dir)
      local input = os.tmpname()
      local f = io.open(input, "w")
      f:write("hello")
      f:close()
      local code = warmbox(g() .. "run --session cli:files --file in.txt=" .. input .. " --out " .. dir .. " "
        .. wbd.sh_quote("open('/home/user/output/copy.txt', 'w').write(open('in.txt').read().upper())"), nil, env)
      assert.equal(0, code)
      local fh = assert(io.open(dir .. "/copy.txt"))
      assert.equal("HELLO", fh:read("a"))
      fh:close()
      os.execute("rm -rf '" .. dir .. "'")
      os.remove(input)
    end)
  end)
end)
