-- `warmbox checkpoints` (list, --json, --delete), `warmbox gc` with a
-- checkpoint policy and `warmbox release` against a real warmboxd.
local wbd = require "spec.helpers.warmboxd"
local json = require "cjson.safe"
local http = require "spec.helpers.http"

local function warmbox(args) return require("spec.helpers.cli").run(args) end

describe("warmbox checkpoints / gc / release (checkpoints)", function()
  local srv, lockdir, wb
  local function g() return "--api-url " .. srv.url .. " --api-key " .. srv.api_key .. " --lock file " end

  lazy_setup(function()
    srv = wbd.start{}
    lockdir = os.tmpname()
    os.remove(lockdir)
    wb = assert(require("warmbox").new{ api_url = srv.url, sandbox_url = srv.url, api_key = srv.api_key,
      lock = { backend = "file", dir = lockdir }, exec_timeout = 60 })
  end)
  lazy_teardown(function()
    if wb then wb:close() end
    if srv then srv:stop() end
    os.execute("rm -rf " .. wbd.sh_quote(lockdir))
  end)

  it("lists a session's checkpoints, deletes one, GC deletes an orphan's, release deletes the rest", function()
    local s = wb:session("cli:cp")
    assert(s:run("x = 1"))
    local a = assert(s:checkpoint{ label = "first" })
    assert(s:run("x = 2"))
    local b = assert(s:checkpoint())
    local code, out, err = warmbox(g() .. "checkpoints --session cli:cp --json")
    assert.equal(0, code, err)
    local doc = assert(json.decode(out))
    assert.same({ a.id, b.id }, { doc[1].id, doc[2].id })
    assert.same({ 1, 2 }, { doc[1].turn, doc[2].turn })
    assert.equal("first", doc[1].label)
    code, out = warmbox(g() .. "checkpoints --session cli:cp")
    assert.equal(0, code)
    assert.matches("turn 1%s+first%s+" .. a.id:gsub("%p", "%%%0"), out)

    code, out, err = warmbox(g() .. "checkpoints --session cli:cp --delete " .. a.id)
    assert.equal(0, code, err)
    assert.equal("deleted " .. a.id .. "\n", out)
    code, out, err = warmbox(g() .. "checkpoints --session cli:cp --delete " .. a.id)
    assert.equal(2, code)
    assert.matches("no checkpoint", err)
    assert.equal("", out)
    assert.same({ b.id }, { assert(s:checkpoints())[1].id })

    -- an orphan: its conversation's sandbox is gone
    local o = wb:session("cli:orphan")
    assert(o:run("1"))
    local ocp = assert(o:checkpoint())
    assert.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. o:state().sandbox_id).status)
    local f = os.tmpname()
    local fh = assert(io.open(f, "w"))
    fh:write("return { checkpoint_gc = rules.checkpoints{ orphans = 'delete' } }\n")
    fh:close()
    code, out, err = warmbox(g() .. "gc --dry-run --json --policy " .. f)
    assert.equal(0, code, err)
    doc = assert(json.decode(out), out)
    assert.equal(1, #doc.actions)
    assert.equal(ocp.id, doc.actions[1].checkpoint_id)
    assert.equal("delete", doc.actions[1].action)
    assert.equal(1, doc.checkpoints.deleted)
    assert.is_true(doc.checkpoints.dry_run)
    assert.equal(1, #assert(o:checkpoints()))
    code, out, err = warmbox(g() .. "gc --policy " .. f)
    os.remove(f)
    assert.equal(0, code, err)
    assert.matches("delete%s+" .. ocp.id:gsub("%p", "%%%0"), out)
    assert.matches("\ncheckpoints: listed 2, kept 1, deleted 1, busy 0, errors 0\n", out)
    assert.same({}, assert(o:checkpoints()))

    code, out, err = warmbox(g() .. "release cli:cp")
    assert.equal(0, code, err)
    assert.equal("released cli:cp: 1 sandbox killed, 1 checkpoint deleted\n", out)
    assert.same({}, assert(s:checkpoints()))
  end)
end)
