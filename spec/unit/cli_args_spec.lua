-- The CLI's one argument reader (warmbox.cli.parse_args): every command's
-- options go through it, so its errors are the ones users see.
local cli = require "warmbox.cli"

describe("cli.parse_args", function()
  local function parse(args, positional)
    local got = { values = {}, switches = 0, rest = {} }
    cli.parse_args(args, "cmd", {
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
