-- warmboxd's copies of a sandbox's files (snapshot, fork, pause) over real
-- HTTP, against a tenant that races them: envd's Filesystem/Move swapping a
-- directory the copy is walking for a symlink to a host directory never puts
-- a host file in a snapshot or a fork (the copy follows no symlink, and
-- envd's changes are refused with E2B's 409 while the files are copied); a
-- copy that cannot be made fails its call with a clear error instead of
-- answering success. bench/warmboxd_copy_race.lua runs the race 200 times.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local cell = require "spec.helpers.cell"
local race = require "spec.helpers.copy_race"

local q = wbd.sh_quote

describe("warmboxd copies", function()
  local srv

  local function create(extra)
    local body = { templateID = "base", timeout = 600, secure = true }
    for k, v in pairs(extra or {}) do body[k] = v end
    return http.create(srv, body)
  end

  local function rpc(sb, method, body)
    return http.sandbox(srv, sb, 49983, "POST", "/" .. method, { json = body })
  end

  -- A change that changes nothing: 404 (no such source), or 409 in transition.
  local function probe(sb)
    return rpc(sb, "filesystem.Filesystem/Move", { source = "/home/user/nope", destination = "/home/user/nope2" })
  end

  local function admin(body)
    local res = http.request{ method = "POST", url = srv.url .. "/_warmboxd/config", json = body }
    assert.are.equal(204, res.status, res.body)
  end

  -- Copies of the sandbox take a while: the copy_ms knob holds them 4 s, and
  -- a 200 MB file makes the copy itself last (so a server without the knob is
  -- still probed while it copies, and fails on the 409 it never answers).
  local function slow_copies(sb)
    cell(srv, sb, "echo a > /home/user/a.txt; head -c 200M /dev/zero > /home/user/slow.bin")
    local res = http.request{ method = "POST", url = srv.url .. "/_warmboxd/config", json = { copy_ms = 4000 } }
    return res.status == 204
  end

  -- A control-plane call in the background: a function waits for its answer.
  local function background(method, path, body)
    local out = os.tmpname()
    local cmd = "env -u LD_PRELOAD curl -s -o " .. q(out .. ".body") .. " -w '%{http_code}' -X " .. method
      .. " -H " .. q("X-API-Key: " .. srv.api_key) .. " -H 'Content-Type: application/json' --data "
      .. q(body or "{}") .. " " .. q(srv.url .. path) .. " > " .. q(out .. ".part") .. " && mv " .. q(out .. ".part")
      .. " " .. q(out)
    os.remove(out)
    assert(os.execute("( " .. cmd .. " ) >/dev/null 2>&1 &"))
    return function()
      local code = wbd.eventually(function() return wbd.read_all(out) end, 60)
      local res = { status = tonumber(code), body = wbd.read_all(out .. ".body") }
      os.remove(out)
      os.remove(out .. ".body")
      return res
    end
  end

  lazy_setup(function() srv = wbd.start{} end)
  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  -- attempts copies of the sandbox while the race runs; `check(res)` returns
  -- the host files found in what one made (nil when it made none)
  local function race_copies(path, body, attempts, check)
    local sb = create()
    local r = race.new(srv, sb)
    local leaks, made, swapped = {}, 0, 0
    for _ = 1, attempts do
      local res, moves = r:attempt("POST", "/sandboxes/" .. sb.sandboxID .. path, body)
      if moves[1] == "200" and moves[2] == "200" then swapped = swapped + 1 end
      local found = check(res, r)
      if found then
        made = made + 1
        for _, f in ipairs(found) do leaks[#leaks + 1] = f end
      end
    end
    r:cleanup()
    return leaks, made, swapped
  end

  it("puts no host file in a snapshot while envd swaps the directory being copied for a symlink", function()
    local leaks, made = race_copies("/snapshots", {}, 10, function(res, r)
      if res.status ~= 201 then return nil end
      local found = r:leaks(srv.dir .. "/data/.state/snapshots")
      assert.are.equal(204, http.api(srv, "DELETE", "/templates/" .. res.json.snapshotID:match("^([^:]+)")).status)
      return found
    end)
    assert.are.same({}, leaks)
    assert.are.equal(10, made)
  end)

  it("puts no host file in a fork while envd swaps the directory being copied for a symlink", function()
    local leaks, made = race_copies("/fork", { count = 1, timeout = 60 }, 6, function(res, r)
      local child = res.status == 201 and res.json[1].sandbox
      if not child then return nil end
      local found = r:leaks_in(child)   -- what the child's own code reads
      http.api(srv, "DELETE", "/sandboxes/" .. child.sandboxID)
      return found
    end)
    assert.are.same({}, leaks)
    assert.are.equal(6, made)
  end)

  it("refuses envd's changes while a snapshot copies the files, as E2B's proxy answers in transition", function()
    local sb = create()
    local knob = slow_copies(sb)
    local done = background("POST", "/sandboxes/" .. sb.sandboxID .. "/snapshots")
    local refused = wbd.eventually(function()
      local res = probe(sb)
      return res.status == 409 and res or nil
    end, 15)
    assert.is_table(refused, "no 409 while the snapshot was taken")
    assert.are.same({ sandboxId = sb.sandboxID, code = 409,
      message = 'Sandbox "' .. sb.sandboxID .. '" is being snapshotted' }, refused.json)
    -- every kind of change is refused; reads go on
    local up = http.sandbox(srv, sb, 49983, "POST", "/files?path=/home/user/up.txt",
      { body = "x", headers = { ["Content-Type"] = "application/octet-stream" } })
    local mv = rpc(sb, "filesystem.Filesystem/Move", { source = "/home/user/a.txt", destination = "/home/user/b.txt" })
    local start = http.sandbox(srv, sb, 49999, "POST", "/execute",
      { json = { code = "touch /tmp/x", language = "bash" } })
    local stat = rpc(sb, "filesystem.Filesystem/Stat", { path = "/home/user/a.txt" })
    local get = http.sandbox(srv, sb, 49983, "GET", "/files?path=/home/user/a.txt")
    if knob then admin{ copy_ms = 0 } end
    local snap = done()
    assert.are.equal(201, snap.status, snap.body)
    assert.are.equal(409, up.status, up.body)
    assert.are.equal(409, mv.status, mv.body)
    assert.are.equal(409, start.status, start.body)
    assert.are.equal(200, stat.status, stat.body)
    assert.are.equal("a\n", get.body)
    -- once it is taken, changes go through again
    assert.are.equal(200, rpc(sb, "filesystem.Filesystem/MakeDir", { path = "/home/user/after" }).status)
  end)

  it("refuses envd's changes while a pause copies the files", function()
    local sb = create()
    local knob = slow_copies(sb)
    local done = background("POST", "/sandboxes/" .. sb.sandboxID .. "/pause")
    local refused = wbd.eventually(function()
      local res = probe(sb)
      return res.status == 409 and res or nil
    end, 15)
    if knob then admin{ copy_ms = 0 } end
    assert.is_table(refused, "no 409 while the sandbox was paused")
    assert.are.equal('Sandbox "' .. sb.sandboxID .. '" is being paused', refused.json.message)
    assert.are.equal(204, done().status)
    local res = http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/connect", { timeout = 60 })
    assert.are.equal(201, res.status, res.body)
    assert.are.equal("a\n", (cell(srv, sb, "cat /home/user/a.txt")))
  end)

  it("fails a snapshot, a fork and a pause whose copy cannot be made, and the sandbox runs on", function()
    local sb = create()
    -- sparse past what the data directory's filesystem takes (ext4: 16 TiB a file)
    local fs = io.popen("stat -f -c %T " .. q(srv.dir)):read("l")
    if not (fs or ""):match("ext") then
      pending("the data directory is on " .. tostring(fs) .. ", which takes any sparse file")
      return
    end
    cell(srv, sb, "echo kept > /home/user/kept.txt; truncate -s 100T /home/user/huge")
    local function listing(sub)
      local p = io.popen("ls -A " .. q(srv.dir .. "/data/.state/" .. sub) .. " 2>/dev/null")
      local l = p:read("a")
      p:close()
      return l
    end
    local before = {}
    for _, sub in ipairs{ "snapshots", "paused", "forks" } do before[sub] = listing(sub) end
    -- the pause first: one that answered success would lose the sandbox
    local pause = http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/pause", {})
    assert.are.equal(507, pause.status, pause.body)
    assert.matches("Error pausing sandbox: cannot keep its files: home/huge", pause.json.message, 1, true)
    local snap = http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/snapshots", {})
    assert.are.equal(507, snap.status, snap.body)
    assert.matches("huge", snap.json.message, 1, true)
    local fork = http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/fork", {})
    assert.are.equal(507, fork.status, fork.body)
    assert.are.equal("running", http.api(srv, "GET", "/sandboxes/" .. sb.sandboxID).json.state)
    assert.are.equal("kept\n", (cell(srv, sb, "cat /home/user/kept.txt")))
    -- nothing of the failed copies is left on disk
    for _, sub in ipairs{ "snapshots", "paused", "forks" } do assert.are.equal(before[sub], listing(sub), sub) end
    -- once the file is gone, the pause is made and kept
    cell(srv, sb, "rm /home/user/huge")
    assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/pause", {}).status)
  end)
end)
