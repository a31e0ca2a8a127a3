-- The CLI's one argument reader (warmbox.cli.args.parse_args): every command's
-- options go through it, so its errors are the ones users see.
local cli = require "warmbox.cli"
local cli_args = require "warmbox.cli.args"

describe("cli.args.parse_args", function()
  local function parse(args, positional)
    local got = { values = {}, switches = 0, rest = {} }
    cli_args.parse_args(args, "cmd", {
      ["--name"] = function(v, flag) got.values[#got.values + 1] = flag .. "=" .. v end,
      ["--yes"] = { function() got.switches = got.switches + 1 end },
    }, positional and function(a) got.rest[#got.rest + 1] = a end or nil)
    return got
  end

  it("gives each option its value and flag, in order, and counts switches", function()
    local got = parse{ "--name", "a", "--yes", "--name", "--yes" }
    assert.same({ "--name=a", "--name=--yes" }, got.values)
    assert.equal(1, got.switches)
  end)

  it("refuses an option without its value, naming it", function()
    assert.has_error(function() parse{ "--yes", "--name" } end, "option --name needs a value")
  end)

  it("refuses unknown options and, without a positional reader, any other argument", function()
    assert.has_error(function() parse{ "--nope" } end, "unknown argument --nope to cmd")
    assert.has_error(function() parse{ "word" } end, "unknown argument word to cmd")
  end)

  it("hands other arguments to the positional reader, '-' and single-dash ones included", function()
    local got = parse({ "x", "--yes", "-", "-1" }, true)
    assert.same({ "x", "-", "-1" }, got.rest)
    assert.has_error(function() parse({ "--nope" }, true) end, "unknown argument --nope to cmd")
  end)
end)

describe("cli commands' arguments", function()
  local function cli_main(args)
    local out = {}
    local sink = { flush = function() end }
    function sink.write(_, ...) for _, v in ipairs{ ... } do out[#out + 1] = v end end
    return cli.main(args, { stdout = sink, stderr = sink, stdin = { read = function() return "" end } }),
      table.concat(out)
  end

  it("report misuse with status 2 before touching any backend", function()
    for _, case in ipairs{
      { { "run", "--timeout", "soon", "-s", "k", "1" }, "option --timeout needs a number, got 'soon'" },
      { { "run", "-s", "k", "1", "2" }, "more than one CODE argument" },
      { { "run", "--env", "novalue", "-s", "k", "1" }, "--env needs K=V" },
      { { "sessions", "--state", "gone" }, "--state must be running or paused" },
      { { "gc", "--concurrency", "0" }, "--concurrency needs an integer >= 1, got '0'" },
      { { "gc", "--retention" }, "option --retention needs a value" },
      { { "gc", "--bogus" }, "unknown argument --bogus to gc" },
      { { "demo", "extra" }, "demo takes no arguments" },
    } do
      local status, out = cli_main(case[1])
      assert.equal(2, status, out)
      assert.matches(case[2], out, 1, true)
    end
  end)
end)

describe("the command line's edges", function()
  -- main with sinks: returns status, stdout, stderr
  local function cli_main(args)
    local bufs = { out = {}, err = {} }
    local function sink(t)
      return { flush = function() end, write = function(_, ...) for _, v in ipairs{ ... } do t[#t + 1] = v end end }
    end
    local status = cli.main(args, { stdout = sink(bufs.out), stderr = sink(bufs.err),
      stdin = { read = function() return "" end } })
    return status, table.concat(bufs.out), table.concat(bufs.err)
  end
  local COMMANDS = { "run", "prewarm", "server", "doctor", "release", "sessions", "gc", "simulate", "demo", "smoke" }

  it("--version prints the version, the Lua and where warmbox.core came from", function()
    local status, out = cli_main{ "--version" }
    assert.equal(0, status)
    assert.equal(string.format("warmbox %s (Lua 5.4, warmbox.core %s)\n", require("warmbox")._VERSION,
      require("warmbox.core").module_path()), out)
  end)

  it("COMMAND --help prints that command's usage and options only, for every command", function()
    local _, full = cli_main{ "--help" }
    for _, cmd in ipairs(COMMANDS) do
      local status, out = cli_main{ cmd, "--help" }
      assert.equal(0, status, cmd)
      assert.equal("usage: warmbox [options] " .. cmd, out:match("^[^\n]*"):sub(1, #cmd + 25), out)
      assert.truthy(#out < #full / 3, cmd .. ": " .. out)
      for _, other in ipairs(COMMANDS) do
        if other ~= cmd then assert.is_nil(out:find("\n  " .. other .. " ", 1, true), cmd .. " shows " .. other) end
      end
    end
    assert.matches("%-%-language L", select(2, cli_main{ "run", "-h" }))
    assert.matches("%-%-dry%-run", select(2, cli_main{ "gc", "--help" }))
  end)

  it("answers an unknown command or option in one line, with status 2", function()
    local status, out, err = cli_main{ "frobnicate" }
    assert.equal(2, status)
    assert.equal("", out)
    assert.matches("^warmbox: unknown command frobnicate %(commands: run, prewarm, .-; warmbox %-%-help%)\n$", err)
    status, out, err = cli_main{ "--frob", "run" }
    assert.equal("", out)
    assert.equal(2, status)
    assert.equal("warmbox: unknown option --frob (warmbox --help lists the options)\n", err)
  end)

  it("exits 2 when warmbox fails (the backend does not answer), not 1 as for a cell that raised", function()
    local status, _, err = cli_main{ "--api-url", "http://127.0.0.1:1", "--api-key", "e2b_x", "--lock", "memory",
      "run", "-s", "k", "1" }
    assert.equal(2, status, err)
    assert.matches("(TRANSPORT)", err, 1, true)
  end)

  it("-q drops warmbox's notes from stderr, not its errors", function()
    local csv = os.tmpname()
    local args = { "simulate", "--sessions", "2", "--turns", "1-2", "--csv", csv }
    local status, _, err = cli_main(args)
    assert.equal(0, status, err)
    assert.equal("warmbox: rows written to " .. csv .. "\n", err)
    table.insert(args, 1, "-q")
    status, _, err = cli_main(args)
    assert.equal(0, status, err)
    assert.equal("", err)
    status, _, err = cli_main{ "-q", "simulate", "--csv", "/nonexistent-dir/x.csv", "--sessions", "1" }
    assert.equal(2, status)
    assert.matches("cannot write /nonexistent%-dir/x%.csv", err)
    -- -q holds for one main call only
    status, _, err = cli_main{ "simulate", "--sessions", "1", "--csv", csv }
    assert.equal(0, status)
    assert.matches("rows written", err)
    os.remove(csv)
  end)
end)
