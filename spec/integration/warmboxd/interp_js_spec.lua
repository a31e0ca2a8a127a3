-- warmboxd's JavaScript / TypeScript kernel (embed/kernel.js on node) over real
-- HTTP: the default javascript context, console output, the last expression
-- as the main result, state kept across cells (redeclared let/const too), ES
-- imports, top-level await, errors with name/value/traceback, env_vars per
-- run, the context's cwd, TypeScript by type stripping, and interrupts.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local nd = require "spec.helpers.ndjson"
local lines_of, of_type, texts, main_result = nd.lines, nd.of_type, nd.texts, nd.main_result

describe("warmboxd javascript/typescript kernel", function()
  local srv, sb

  local function ctx_api(method, path, json)
    return http.sandbox(srv, sb, 49999, method, path, { json = json })
  end

  local function run(body)
    local res = http.sandbox(srv, sb, 49999, "POST", "/execute", { json = body, timeout = 60 })
    assert.are.equal(200, res.status, res.body)
    local lines, raw = lines_of(res.body)
    assert.are.equal('{"type": "end_of_execution"}', raw[#raw], res.body)
    assert.are.equal("number_of_executions", lines[1].type, res.body)
    return lines, table.concat(raw, "\n")
  end

  local function js(code, extra)
    local body = { code = code, language = "javascript" }
    for k, v in pairs(extra or {}) do body[k] = v end
    return run(body)
  end

  lazy_setup(function()
    srv = wbd.start{}
    sb = http.create(srv, { templateID = "code-interpreter-v1", timeout = 600 })
  end)

  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  it("lists a default javascript context beside python", function()
    local res = ctx_api("GET", "/contexts")
    assert.are.equal(200, res.status)
    local langs = {}
    for _, c in ipairs(res.json) do langs[c.language] = c.cwd end
    assert.are.equal("/home/user", langs.python)
    assert.are.equal("/home/user", langs.javascript)
  end)

  it("sends console.log to stdout and console.error to stderr", function()
    local lines, raw = js('console.log("Hello World!"); console.error("oops", 1)')
    assert.are.same({ "Hello World!\n" }, texts(lines, "stdout"), raw)
    assert.are.same({ "oops 1\n" }, texts(lines, "stderr"), raw)
    assert.is_nil(main_result(lines), raw)
  end)

  it("gives the last expression as the main result, strings without quotes", function()
    assert.are.equal("/home/user", main_result(js("process.cwd()")).text)
    assert.are.equal("{ a: 1, b: [ 1, 2 ] }", main_result(js("({ a: 1, b: [1, 2] })")).text)
    assert.are.equal("42", main_result(js("const v = 40\nv + 2")).text)
  end)

  it("keeps declarations across cells, and lets a cell redeclare them", function()
    js("let n = 1; const k = 2; function add(a) { return a + n }\nclass Box { get() { return 5 } }")
    assert.are.equal("8", main_result(js("add(k) + new Box().get()")).text)
    local lines, raw = js("let n = 10; n")
    assert.are.equal(0, #of_type(lines, "error"), raw)
    assert.are.equal("10", main_result(lines).text)
    assert.are.equal("12", main_result(js("add(k)")).text)
  end)

  it("turns ES imports into require and supports top-level await", function()
    local lines, raw = js("\n  import { readFileSync } from 'fs'\n  import * as path from 'path'\n" ..
      "  console.log(typeof readFileSync, path.basename('/a/b.txt'))\n")
    assert.are.same({ "function b.txt\n" }, texts(lines, "stdout"), raw)
    assert.are.equal("Hello World!", main_result(js("await Promise.resolve('Hello World!')")).text)
    assert.are.equal("3", main_result(js("const t = await new Promise((r) => setTimeout(() => r(3), 50))\nt")).text)
  end)

  it("reports errors with name, value and traceback", function()
    local lines, raw = js("console.log('before')\nfunction boom() { throw new TypeError('bad thing') }\nboom()")
    local errs = of_type(lines, "error")
    assert.are.equal(1, #errs, raw)
    assert.are.equal("TypeError", errs[1].name)
    assert.are.equal("bad thing", errs[1].value)
    assert.is_truthy(errs[1].traceback:find("TypeError: bad thing", 1, true), errs[1].traceback)
    assert.is_truthy(errs[1].traceback:find("boom", 1, true), errs[1].traceback)
    assert.is_falsy(errs[1].traceback:find("node:vm", 1, true), errs[1].traceback)
    assert.are.same({ "before\n" }, texts(lines, "stdout"))

    errs = of_type(js("let = = 3"), "error")
    assert.are.equal("SyntaxError", errs[1].name)
    errs = of_type(js("await Promise.reject(new RangeError('late'))"), "error")
    assert.are.equal("RangeError", errs[1].name)
    assert.are.equal("late", errs[1].value)
    -- the kernel is still there, with its state
    assert.are.equal("10", main_result(js("n")).text)
  end)

  it("sets env_vars for one run only", function()
    assert.are.equal("bar", main_result(js("process.env.FOO", { env_vars = { FOO = "bar" } })).text)
    assert.are.equal("default", main_result(js("process.env.FOO || 'default'")).text)
  end)

  it("runs TypeScript by stripping its types, in its own default context", function()
    local lines, raw = run{ code = 'const message: string = "Hello World!"; console.log(message)', language = "ts" }
    assert.are.same({ "Hello World!\n" }, texts(lines, "stdout"), raw)
    lines, raw = run{ language = "typescript", code = "interface P { a: number }\nenum E { X, Y }\n" ..
      "function id<T>(v: T): T { return v }\nconst p: P = { a: 3 }\nid(p.a) + E.Y" }
    assert.are.equal("4", main_result(lines).text, raw)
    assert.are.equal("/home/user", main_result(run{ code = "process.cwd()", language = "ts" }).text)
    -- a separate realm from the javascript context
    assert.are.equal("undefined", main_result(run{ code = "typeof add", language = "ts" }).text)
    local errs = of_type(run{ code = "const x: = 1", language = "ts" }, "error")
    assert.are.equal("SyntaxError", errs[1].name)
  end)

  it("creates a javascript context with its own cwd and state", function()
    local res = ctx_api("POST", "/contexts", { language = "js", cwd = "/tmp" })
    assert.are.equal(200, res.status, res.body)
    assert.are.equal("javascript", res.json.language)
    local id = res.json.id
    assert.are.equal("/tmp", main_result(run{ code = "var mine = 1; process.cwd()", context_id = id }).text)
    assert.are.equal("undefined", main_result(js("typeof mine")).text)
    assert.are.equal(200, ctx_api("POST", "/contexts/" .. id .. "/restart").status)
    assert.are.equal("undefined", main_result(run{ code = "typeof mine", context_id = id }).text)
  end)

  it("interrupts a busy loop and a pending await on timeout, keeping the kernel", function()
    js("globalThis.kept = 'yes'")
    local errs = of_type(js("while (true) {}", { timeout = 1 }), "error")
    assert.are.equal(1, #errs)
    assert.are.equal("KeyboardInterrupt", errs[1].name)
    errs = of_type(js("await new Promise(() => {})", { timeout = 1 }), "error")
    assert.are.equal(1, #errs)
    assert.are.equal("KeyboardInterrupt", errs[1].name)
    assert.are.equal("yes", main_result(js("kept")).text)
  end)

  it("runs the kernel inside the jail (the sandbox's view, not the host's)", function()
    local lines, raw = js("require('fs').existsSync(" .. string.format("%q", srv.dir .. "/warmboxd.log") .. ")")
    assert.are.equal("false", main_result(lines).text, raw)
  end)
end)
