-- One result larger than warmboxd's longest kernel line (16 MiB): a python
-- cell whose last expression is a 20 MB string, display data that large, an
-- error whose message is. The run keeps what fits (the kernel's line, then
-- the output cap) and says truncated; the cell is not broken: the next runs
-- of the conversation go on in the same kernel.
local sessions = require "spec.helpers.sessions"

describe("sessions: a result over 16 MiB (warmboxd)", function()
  local env = sessions.new()
  local wb

  lazy_setup(function()
    env:start()
    wb = env:warmbox{ exec_timeout = 120, idle_timeout = 120, max_output = 32 * 1048576 }
  end)
  lazy_teardown(function() env:stop() end)

  -- The text of the run's results, by form (the first result with it).
  local function form(r, key)
    for _, x in ipairs(r.results) do if type(x[key]) == "string" then return x[key] end end
  end

  it("a last expression of 20 MB: its text cut to fit, truncated = true", function()
    local s = wb:session("bigresult:text")
    local r = assert(s:run("x = 41\n'y' * (20 << 20)"))
    local text = assert(form(r, "text"), "the result vanished")
    assert.is_true(#text >= 1048576)
    assert.equal(("y"):rep(#text), text)
    assert.is_true(r.truncated)
    local r2 = assert(s:run("x + 1"))
    assert.equal(r.sandbox_id, r2.sandbox_id)
    assert.equal("42", form(r2, "text"))
    assert.is_false(r2.truncated)
  end)

  it("javascript: a last expression of 20 MB, cut to fit, truncated = true", function()
    local s = wb:session("bigresult:js")
    local r = assert(s:run("const y = 41;\n'j'.repeat(20 << 20)", { language = "javascript" }))
    local text = assert(form(r, "text"), "the result vanished")
    assert.is_true(#text >= 1048576)
    assert.equal(("j"):rep(#text), text)
    assert.is_true(r.truncated)
    local r2 = assert(s:run("y + 1", { language = "javascript" }))
    assert.equal("42", form(r2, "text"))
  end)

  it("display data of 21 MB: its html cut to fit, truncated = true", function()
    local s = wb:session("bigresult:display")
    local r = assert(s:run("from IPython.display import display, HTML\n"
      .. "display(HTML('<b>' * (7 << 20)))\nprint('after')"))
    local html = assert(form(r, "html"), "the display data vanished")
    assert.is_true(#html >= 1048576)
    assert.equal(("<b>"):rep(#html // 3), html:sub(1, #html // 3 * 3))
    assert.is_true(r.truncated)
    assert.equal("after\n", r.stdout)
  end)

  it("an error whose message is 20 MB: the error is reported, cut", function()
    local s = wb:session("bigresult:error")
    local r = assert(s:run("raise ValueError('e' * (20 << 20))"))
    assert.is_table(r.error, "the error vanished")
    assert.equal("ValueError", r.error.name)
    assert.matches("^eeee", r.error.value)
    local r2 = assert(s:run("1 + 1"))
    assert.equal("2", form(r2, "text"))
  end)

  it("a smaller output cap keeps what fits of the result's text", function()
    local small = env:warmbox{ exec_timeout = 120, idle_timeout = 120, max_output = 1048576 }
    local r = assert(small:session("bigresult:cap"):run("'z' * (20 << 20)"))
    local text = assert(form(r, "text"), "the result vanished")
    assert.equal(("z"):rep(#text), text)
    assert.is_true(#text > 0 and #text <= 1048576)
    assert.is_true(r.truncated)
  end)
end)
