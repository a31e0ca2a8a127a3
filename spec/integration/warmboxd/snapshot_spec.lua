-- warmboxd's persistent snapshots over real HTTP, as E2B's API has them:
-- POST /sandboxes/{id}/snapshots (the sandbox keeps running), GET /snapshots
-- (filters, pages), DELETE /templates/{id}, and POST /sandboxes from a
-- snapshot id with new metadata. A snapshot holds the sandbox's files (its /,
-- home, /tmp) and the default python context's user namespace (serialised
-- with dill; what could not be is listed in `warmbox_unrestored`); other
-- kernels (bash, JavaScript) boot afresh: files only.
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
    -- the python namespace is carried over (dill), as it was when taken
    assert.are.equal("1", (run(child, "x", "python")))
    -- the user's files stay the user's: the child can change them
    run(child, "echo child > /home/user/f.txt; echo c2 > /var/tmp/app/o.txt")
    assert.are.equal("child\n", (run(child, "cat /home/user/f.txt")))
    assert.are.equal("home2\n", (run(sb, "cat /home/user/f.txt")))
    local second = create{ templateID = snap.snapshotID, metadata = { conv = "c" } }
    assert.are.equal("home1\nopt1\n", (run(second, "cat /home/user/f.txt /var/tmp/app/o.txt")))
  end)

  it("carries the python namespace (values, functions, instances, DataFrames) and reports what it cannot", function()
    local sb = create{}
    local _, err = run(sb, table.concat({
      "import threading, pandas as pd",
      "x = 41",
      "def inc(v): return v + 1",
      "class Box:",
      "    def __init__(self, v): self.v = v",
      "    def get(self): return self.v",
      "box = Box('boxed')",
      "df = pd.DataFrame({'a': [1, 2, 3]})",
      "fh = open('/tmp/held.txt', 'w')",
      "worker = threading.Thread(target=lambda: None)",
      "big = bytes(10 << 20)",
    }, "\n"), "python")
    assert.is_nil(err)
    run(sb, "export BASHVAR=set")
    assert.are.equal("[set]\n", (run(sb, "echo \"[$BASHVAR]\"")))
    local snap = snapshot(sb).json
    local child = create{ templateID = snap.snapshotID }
    local used = "print(inc(x), box.get(), int(df['a'].sum()), pd.__name__, end='')"
    assert.are.equal("42 boxed 6 pandas", (run(child, used, "python")))
    assert.are.equal("[('big', 'not carried: the dump would exceed 12 MiB'), ('fh', 'not carried: an open file'), "
      .. "('worker', 'not carried: a thread')]",
      (run(child, "print(sorted(warmbox_unrestored.items()), end='')", "python")))
    local _, gone = run(child, "fh", "python")
    assert.are.equal("NameError", gone)
    -- bash kernels carry files only: the shell variable is gone
    assert.are.equal("[]\n", (run(child, "echo \"[$BASHVAR]\"")))
    -- a namespace not loaded yet is memory: a resume from the files only drops it
    local later = create{ templateID = snap.snapshotID }
    local path = "/sandboxes/" .. later.sandboxID
    assert.are.equal(204, http.api(srv, "POST", path .. "/pause", {}).status)
    assert.are.equal(201, http.api(srv, "POST", "/v2" .. path .. "/connect", { timeout = 60, memory = false }).status)
    local _, lost = run(later, "x", "python")
    assert.are.equal("NameError", lost)
    -- a sandbox whose python context never ran carries an empty namespace
    local fresh = create{}
    local child2 = create{ templateID = snapshot(fresh).json.snapshotID }
    local _, err2 = run(child2, "warmbox_unrestored", "python")
    assert.are.equal("NameError", err2)
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

  it("answers 409 to a snapshot asked for while one of the same sandbox is being taken", function()
    local sb = create{}
    -- 400 MB in home: copying it takes long enough for three requests sent together to overlap
    run(sb, "head -c 400000000 /dev/zero > /home/user/big.bin")
    local url = srv.url .. "/sandboxes/" .. sb.sandboxID .. "/snapshots"
    local outs, cmds = {}, {}
    for i = 1, 3 do
      outs[i] = os.tmpname()
      cmds[i] = "env -u LD_PRELOAD curl -s -o /dev/null -w '%{http_code}' -X POST -H "
        .. wbd.sh_quote("X-API-Key: " .. srv.api_key) .. " -H 'Content-Type: application/json' -d '{}' "
        .. wbd.sh_quote(url) .. " > " .. wbd.sh_quote(outs[i]) .. " &"
    end
    assert(os.execute(table.concat(cmds, " ") .. " wait"))
    local got = {}
    for i = 1, 3 do
      local code = wbd.read_all(outs[i])
      os.remove(outs[i])
      got[code] = (got[code] or 0) + 1
    end
    assert.are.equal(1, got["201"], "one snapshot taken: " .. require("cjson").encode(got))
    assert.are.equal(2, got["409"], "the others refused while it was taken: " .. require("cjson").encode(got))
    -- and the sandbox is fine afterwards: running, its file there
    assert.are.equal("running", info(sb).state)
    assert.are.equal("400000000\n", (run(sb, "stat -c %s /home/user/big.bin")))
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
      -- another team's snapshot id starts nothing (404), never a plain sandbox
      local theirs = http.api(srv, "POST", "/sandboxes", { templateID = snap.snapshotID, timeout = 60 })
      assert.are.equal(404, theirs.status, theirs.body)
      assert.are.equal(404, http.api(srv, "POST", "/sandboxes/" .. child.sandboxID .. "/snapshots").status)
    end)
    srv.api_key = key
    assert(ok, e)
    -- a deleted one likewise
    assert.are.equal(204, http.api(srv, "DELETE", "/templates/" .. snap.snapshotID).status)
    local gone = http.api(srv, "POST", "/sandboxes", { templateID = snap.snapshotID, timeout = 60 })
    assert.are.equal(404, gone.status, gone.body)
  end)

  it("expires after --snapshot-max-age, its files and its place in the quota given back; never by default", function()
    local aged = wbd.start{ args = { "--snapshot-max-age", "3600", "--max-snapshots", "2" } }
    local plain = wbd.start{}
    local ok, err = pcall(function()
      local function take(s, sb) return http.api(s, "POST", "/sandboxes/" .. sb.sandboxID .. "/snapshots", {}) end
      local function ids(s)
        local out = {}
        for _, e in ipairs(http.api(s, "GET", "/snapshots").json) do out[#out + 1] = e.snapshotID end
        table.sort(out)
        return out
      end
      local function on_disk(s, snap)
        local f = io.open(s.dir .. "/data/.state/snapshots/" .. snap.snapshotID:match("^([^:]+)") .. "/snapshot.json")
        if f then f:close() end
        return f ~= nil
      end
      local sb = http.create(aged, { templateID = "base", timeout = 86400 })
      local a = take(aged, sb).json
      aged:advance(1800)
      local b = take(aged, sb).json
      assert.are.equal(429, take(aged, sb).status)   -- --max-snapshots 2
      aged:advance(1801)   -- a is 3601 s old, b 1801 s
      assert.are.same({ b.snapshotID }, ids(aged))
      local from_a = http.api(aged, "POST", "/sandboxes", { templateID = a.snapshotID, timeout = 60 })
      assert.are.equal(404, from_a.status, from_a.body)
      assert.is_false(on_disk(aged, a))
      assert.is_true(on_disk(aged, b))
      assert.are.equal(201, take(aged, sb).status)   -- a's place in the quota is free again
      -- by default (E2B's), a snapshot is kept however old
      local psb = http.create(plain, { templateID = "base", timeout = 600 })
      local kept = take(plain, psb).json
      plain:advance(10 * 365 * 86400)
      assert.are.same({ kept.snapshotID }, ids(plain))
      assert.is_true(on_disk(plain, kept))
    end)
    aged:stop()
    plain:stop()
    assert(ok, err)
  end)
end)
