-- warmboxd's persistent snapshots over real HTTP, as E2B's API has them:
-- POST /sandboxes/{id}/snapshots (the sandbox keeps running), GET /snapshots
-- (filters, pages), DELETE /templates/{id}, and POST /sandboxes from a
-- snapshot id with new metadata. A snapshot holds the sandbox's files (its /,
-- home, /tmp), not its kernels' memory: a sandbox started from one boots afresh.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local cell = require "spec.helpers.cell"

describe("warmboxd snapshots", function()
  local srv

  local function run(sb, code, language) return cell(srv, sb, code, language) end

  local function create(body)
    body.templateID = body.templateID or "base"
    body.timeout = body.timeout or 600
    local res = http.api(srv, "POST", "/sandboxes", body)
    assert.are.equal(201, res.status, res.body)
    return res.json
  end

  local function snapshot(sb, name)
    return http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/snapshots", name and { name = name } or {})
  end

  local function info(sb) return http.api(srv, "GET", "/sandboxes/" .. sb.sandboxID).json end

  lazy_setup(function() srv = wbd.start{} end)
  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  it("keeps the files of /, home and /tmp; the sandbox keeps running with its id and lease", function()
    local sb = create{ metadata = { conv = "a" } }
    run(sb, "echo home1 > /home/user/f.txt; echo tmp1 > /tmp/t.txt; mkdir -p /var/tmp/app; "
      .. "echo opt1 > /var/tmp/app/o.txt")
    assert.are.equal("", select(1, run(sb, "x = 1", "python")))
    local before = info(sb)
    local res = snapshot(sb)
    assert.are.equal(201, res.status, res.body)
    local snap = res.json
    assert.is_string(snap.snapshotID)
    assert.are.same({}, snap.names)
    local after = info(sb)
    assert.are.equal("running", after.state)
    assert.are.equal(before.endAt, after.endAt)
    -- the parent goes on: its kernel kept x, its files change independently
    assert.are.equal("1", (run(sb, "x", "python")))
    run(sb, "echo home2 > /home/user/f.txt")

    local child = create{ templateID = snap.snapshotID, metadata = { conv = "b" } }
    assert.are_not.equal(sb.sandboxID, child.sandboxID)
    assert.are.equal("home1\ntmp1\nopt1\n", (run(child, "cat /home/user/f.txt /tmp/t.txt /var/tmp/app/o.txt")))
    assert.are.same({ conv = "b" }, info(child).metadata)
    -- the kernel's memory is not in a snapshot: the child's boots afresh
    local _, err = run(child, "x", "python")
    assert.are.equal("NameError", err)
    -- the user's files stay the user's: the child can change them
    run(child, "echo child > /home/user/f.txt; echo c2 > /var/tmp/app/o.txt")
    assert.are.equal("child\n", (run(child, "cat /home/user/f.txt")))
    assert.are.equal("home2\n", (run(sb, "cat /home/user/f.txt")))
    local second = create{ templateID = snap.snapshotID, metadata = { conv = "c" } }
    assert.are.equal("home1\nopt1\n", (run(second, "cat /home/user/f.txt /var/tmp/app/o.txt")))
  end)

  it("lists by sandbox and by name, in pages, and deletes", function()
    local sb = create{}
    local other = create{}
    local a = snapshot(sb, "chat-1").json
    local b = snapshot(sb).json
    local c = snapshot(other).json
    assert.are.equal("chat-1:default", a.snapshotID)
    assert.are.same({ "chat-1:default" }, a.names)
    local function ids(res)
      assert.are.equal(200, res.status, res.body)
      local t = {}
      for _, s in ipairs(res.json) do t[#t + 1] = s.snapshotID end
      return t
    end
    assert.are.same({ b.snapshotID, a.snapshotID },
      ids(http.api(srv, "GET", "/snapshots?sandboxID=" .. sb.sandboxID)))
    assert.are.same({ a.snapshotID }, ids(http.api(srv, "GET", "/snapshots?name=chat-1")))
    assert.are.same({ a.snapshotID }, ids(http.api(srv, "GET", "/snapshots?name=chat-1:default")))
    assert.are.same({}, ids(http.api(srv, "GET", "/snapshots?name=chat-1-does-not-exist")))
    local p1 = http.api(srv, "GET", "/snapshots?limit=2")
    assert.are.same({ c.snapshotID, b.snapshotID }, ids(p1))
    local tok = assert(p1.headers["x-next-token"])
    local p2 = http.api(srv, "GET", "/snapshots?limit=2&nextToken=" .. tok)
    local rest = ids(p2)
    assert.are.equal(a.snapshotID, rest[1])
    assert.are.equal(400, http.api(srv, "GET", "/snapshots?limit=0").status)
    assert.are.equal(400, http.api(srv, "GET", "/snapshots?nextToken=garbage").status)

    assert.are.equal(204, http.api(srv, "DELETE", "/templates/" .. a.snapshotID).status)
    assert.are.equal(404, http.api(srv, "DELETE", "/templates/" .. a.snapshotID).status)
    assert.are.same({}, ids(http.api(srv, "GET", "/snapshots?name=chat-1")))
    assert.are.equal(204, http.api(srv, "DELETE", "/templates/" .. b.snapshotID).status)
    assert.are.same({}, ids(http.api(srv, "GET", "/snapshots?sandboxID=" .. sb.sandboxID)))
  end)

  it("outlives its sandbox; a paused or unknown sandbox is 404; other teams never see it", function()
    local sb = create{}
    run(sb, "echo kept > /home/user/k.txt")
    local snap = snapshot(sb).json
    assert.are.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. sb.sandboxID).status)
    local child = create{ templateID = snap.snapshotID }
    assert.are.equal("kept\n", (run(child, "cat /home/user/k.txt")))

    assert.are.equal(404, snapshot(sb).status)
    assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. child.sandboxID .. "/pause").status)
    assert.are.equal(404, snapshot(child).status)
    local any = create{}
    assert.are.equal(400, snapshot(any, "bad/name").status)
    assert.are.equal(400, snapshot(any, "a:b:c").status)
    assert.are.equal(400, snapshot(any, "tag:").status)

    local key = srv.api_key
    srv.api_key = wbd.new_key()
    local ok, e = pcall(function()
      local res = http.api(srv, "GET", "/snapshots")
      assert.are.equal(200, res.status)
      assert.are.same({}, res.json)
      assert.are.equal(404, http.api(srv, "DELETE", "/templates/" .. snap.snapshotID).status)
      local theirs = create{ templateID = snap.snapshotID }
      assert.are.equal("", (run(theirs, "cat /home/user/k.txt 2>/dev/null; true")))
      assert.are.equal(404, http.api(srv, "POST", "/sandboxes/" .. child.sandboxID .. "/snapshots").status)
    end)
    srv.api_key = key
    assert(ok, e)
  end)
end)
