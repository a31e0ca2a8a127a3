-- The guards of bash, JavaScript and TypeScript cells (outputs.cell_guarded)
-- change nothing of what a cell does: the same cells run in
-- one sandbox as they are and in another guarded give the same output, errors,
-- results, exit statuses and line numbers (warmboxd's kernels).
local wbd = require "spec.helpers.warmboxd"
local e2b = require "warmbox.e2b"
local outputs = require "warmbox.outputs"

local CELLS = {
  bash = {
    "echo one\nf() { echo \"f $LINENO\"; }\nf\ncat <<EOF\nheredoc $LINENO\nEOF\necho \"last $LINENO\"",
    "f",
    "echo a\nno_such_command_here\necho \"b $?\"",
    "(exit 3)",
    "# only a comment",
    "",
    "x=5; export Y=6\nif [ \"$x\" = 5 ]; then\n  echo \"x $x\"\nfi",
    "echo \"$x $Y\"; cat <<'Q'\n'quoted' \"too\" $x\nQ",
    "return 4",
    "set -e; false; echo not reached",
    "echo alive \"$x\"",
  },
  javascript = {
    "let z = 3\nz + 1",
    "z",
    "function g() { return 7 }\ng()",
    "throw new Error('boom')",
    "const q = 1;\nundefinedVar + q",
    "",
    "await Promise.resolve(5)",
    "'use strict'\n1",
    "import fs from 'fs'\ntypeof fs.readFileSync",
    "console.log('out'); console.error('err')",
  },
  typescript = {
    "const n: number = 2\nn * 3",
    "interface A { x: number }\nconst a: A = { x: 1 }\na.x + n",
    "const bad: string = undefinedThing",
  },
}

-- What a run gave, with the parts that differ between two sandboxes (the bash
-- kernel's cell file name, JS columns on the first line) made equal.
local function seen(out, err)
  if not out then return { failed = tostring(err) } end
  local function norm(s)
    return (tostring(s or ""):gsub("/tmp/%.wb%-cell%-[%w_]+%.sh", "CELL"):gsub("(cell:1:)%d+", "%1C"))
  end
  local results = {}
  for _, r in ipairs(out.results or {}) do results[#results + 1] = r.text end
  local e = out.error
  return {
    stdout = norm(table.concat(out.stdout)), stderr = norm(table.concat(out.stderr)), results = results,
    error = e and { name = e.name, value = norm(e.value) },
  }
end

describe("guarded bash, JavaScript and TypeScript cells behave as they are (warmboxd)", function()
  local srv, c, boxes = nil, nil, {}

  lazy_setup(function()
    srv = wbd.start{ args = { "--rtt-ms", "0" } }
    c = e2b.new{ api_key = srv.api_key, api_url = srv.url, sandbox_url = srv.url }
  end)
  lazy_teardown(function()
    for _, id in ipairs(boxes) do c:kill(id) end
    if c then c:close() end
    if srv then srv:stop() end
  end)

  local function sandbox()
    local sb = assert(c:create{ template = "base", timeout = 600 })
    boxes[#boxes + 1] = sb.sandbox_id
    return c:sandbox(sb)
  end

  for _, lang in ipairs({ "bash", "javascript", "typescript" }) do
    it(lang .. ": the same output, errors, results and line numbers", function()
      local plain, guarded = sandbox(), sandbox()
      for i, code in ipairs(CELLS[lang]) do
        local want = seen(plain:run_code(code, { language = lang }))
        local marked = assert(outputs.cell_guarded(code, lang, string.format("%x", 4096 + i), i))
        local got = seen(guarded:run_code(marked, { language = lang }))
        assert.same(want, got, lang .. " cell " .. i .. ": " .. code)
        if lang == "bash" and i == 1 then assert.equal("one\nf 2\nheredoc 4\nlast 7\n", got.stdout) end
        if lang == "bash" and i == 3 then assert.matches("CELL: line 2: no_such_command_here", got.stderr) end
        if lang == "bash" and i == 11 then assert.equal("alive \n", got.stdout) end
      end
    end)
  end

  it("a guarded cell given up, or of a lower fencing number, does not run", function()
    local s = sandbox()
    local function run(lang, code, id, n)
      return assert(s:run_code(assert(outputs.cell_guarded(code, lang, id, n)), { language = lang }))
    end
    assert.equal("ran\n", table.concat(run("bash", "echo ran", "a1", 10).stdout))
    local again = run("bash", "echo ran", "a1", 10)
    assert.equal("", table.concat(again.stdout))
    assert.matches("^warmbox: cell a1 was given up", table.concat(again.stderr))
    local low = run("javascript", "console.log('ran')", "a2", 9)
    assert.equal("", table.concat(low.stdout))
    assert.matches("^warmbox: fenced: run 9 is older than run 10", low.error.value)
    local low_bash = run("bash", "echo ran", "a3", 9)
    assert.equal("", table.concat(low_bash.stdout))
    assert.matches("^warmbox: fenced: run 9 is older than run 10", table.concat(low_bash.stderr))
    assert.equal("11", run("javascript", "console.log('ran'); 11", "a4", 11).results[1].text)
    assert.equal("ran\n", table.concat(run("bash", "echo ran", "a5", 11).stdout))
    assert.equal("11", assert(s:read_file(outputs.FENCE_FILE)))
  end)
end)
