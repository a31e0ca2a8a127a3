-- warmboxd's copies of a sandbox's files over real HTTP: what they keep
-- (links, fifos, sockets, hard links, holes, extended attributes, set-id
-- bits, modes, owners, times) in a snapshot and in a pause kept across a
-- SIGKILL restart; the size a sandbox made from a snapshot gets (its
-- source's); the team's limits on snapshots and stored bytes and the data
-- directory's free-space reserve, answered as E2B answers its limits; the
-- bounds on uploads (the sandbox's free disk space, checked before the body,
-- and the spool of all uploads); and lease-end pauses run in parallel and
-- fairly between teams.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local cell = require "spec.helpers.cell"

-- A summary of the special files made by MAKE, one line each (inode numbers
-- compared, not shown).
local MAKE = table.concat({
  "cd /home/user && mkdir -p keep && cd keep",
  "echo data > plain && chmod 640 plain && touch -d '2001-02-03 04:05:06' plain",
  "ln -s plain link && ln -s /nowhere dangling && mkfifo -m 620 fifo",
  "ln plain hard",
  "truncate -s 1G sparse && echo tail >> sparse",
  "cp /bin/true suid && chmod 4755 suid && chmod 2750 . ",
  "python3 -c \"import os, socket; s = socket.socket(socket.AF_UNIX); s.bind('sock'); "
    .. "os.setxattr('plain', 'user.k', b'v1'); os.setxattr('.', 'user.dir', b'd1')\"",
}, "; ")

local SUMMARY = "cd /home/user/keep && python3 -c \"" .. table.concat({
  "import os, stat",
  "out = []",
  "for n in sorted(os.listdir('.')) + ['.']:",
  "  st = os.lstat(n)",
  "  t = stat.S_IFMT(st.st_mode)",
  "  link = stat.S_ISLNK(st.st_mode)",
  "  x = [] if link else sorted((k, os.getxattr(n, k)) for k in os.listxattr(n))",
  "  out.append('%s %o %o %d %d %s %s %s' % (n, t, stat.S_IMODE(st.st_mode), st.st_uid, st.st_nlink, "
    .. "st.st_size if not stat.S_ISDIR(st.st_mode) else '-', int(st.st_mtime) if n == 'plain' else '-', x))",
  "  if link: out.append('-> ' + os.readlink(n))",
  "out.append('hard-same %s' % (os.lstat('plain').st_ino == os.lstat('hard').st_ino))",
  "out.append('sparse-small %s' % (os.lstat('sparse').st_blocks < 1024))",
  "print(chr(10).join(out))",
}, "\n") .. "\""

describe("warmboxd copies", function()
  local srv

  local function create(extra, key)
    local body = { templateID = "base", timeout = 600, secure = true }
    for k, v in pairs(extra or {}) do body[k] = v end
    local res = http.api(srv, "POST", "/sandboxes", body, key and { headers = { ["X-API-Key"] = key } })
    assert.are.equal(201, res.status, res.body)
    return res.json
  end

  local function run(sb, code)
    local out, err = cell(srv, sb, code)
    assert.is_nil(err, out)
    return out
  end

  lazy_setup(function() srv = wbd.start{ args = { "--max-snapshots", "3", "--max-state-mb", "64" } } end)
  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  it("keeps links, fifos, sockets, hard links, holes, xattrs, set-id bits, modes, owners and times", function()
    local sb = create()
    run(sb, MAKE)
    local want = run(sb, SUMMARY)
    assert.matches("hard-same True", want, 1, true)
    assert.matches("sparse-small True", want, 1, true)
    assert.matches("user.k", want, 1, true)
    local snap = http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/snapshots", {})
    assert.are.equal(201, snap.status, snap.body)
    local child = create{ templateID = snap.json.snapshotID }
    assert.are.equal(want, run(child, SUMMARY))
    -- a pause kept on disk, back after warmboxd is killed
    assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/pause", { memory = false }).status)
    assert.is_true(srv:kill("KILL"))
    local key = srv.api_key
    srv = wbd.start{ dir = srv.dir, api_key = key, args = { "--max-snapshots", "3", "--max-state-mb", "64" } }
    assert.are.equal(201, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/connect", { timeout = 60 }).status)
    assert.are.equal(want, run(sb, SUMMARY))
    http.api(srv, "DELETE", "/templates/" .. snap.json.snapshotID:match("^([^:]+)"))
  end)

  it("gives a sandbox made from a snapshot, and its forks, the source's size", function()
    local sb = create{ templateID = "code-interpreter-v1" }
    local src = http.api(srv, "GET", "/sandboxes/" .. sb.sandboxID).json
    assert.are.equal(2048, src.memoryMB)
    local snap = http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/snapshots", {})
    assert.are.equal(201, snap.status, snap.body)
    local child = create{ templateID = snap.json.snapshotID }
    local info = http.api(srv, "GET", "/sandboxes/" .. child.sandboxID).json
    assert.are.equal(2048, info.memoryMB)
    assert.are.equal(src.cpuCount, info.cpuCount)
    -- the jail's disk is as large as the source's
    local df = "df -m /home/user | tail -1 | awk '{print $2}'"
    assert.are.equal(run(sb, df), run(child, df))
    local fork = http.api(srv, "POST", "/sandboxes/" .. child.sandboxID .. "/fork", {})
    assert.are.equal(201, fork.status, fork.body)
    assert.are.equal(2048, http.api(srv, "GET", "/sandboxes/" .. fork.json[1].sandbox.sandboxID).json.memoryMB)
    http.api(srv, "DELETE", "/templates/" .. snap.json.snapshotID:match("^([^:]+)"))
  end)

  it("limits a team's snapshots and stored bytes with E2B's 429; another team is not held back", function()
    local sb = create()
    local ids = {}
    for i = 1, 3 do
      local res = http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/snapshots", {})
      assert.are.equal(201, res.status, res.body)
      ids[i] = res.json.snapshotID:match("^([^:]+)")
    end
    local over = http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/snapshots", {})
    assert.are.equal(429, over.status, over.body)
    assert.are.same({ code = 429, message = "you have reached the maximum number of snapshots (3) of your team: "
      .. "delete one (DELETE /templates/{id}) first" }, over.json)
    local other = wbd.new_key()
    local osb = create({}, other)
    local res = http.api(srv, "POST", "/sandboxes/" .. osb.sandboxID .. "/snapshots", {},
      { headers = { ["X-API-Key"] = other } })
    assert.are.equal(201, res.status, res.body)
    assert.are.equal(204, http.api(srv, "DELETE", "/templates/" .. ids[1]).status)
    res = http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/snapshots", {})
    assert.are.equal(201, res.status, res.body)
    for i = 2, 3 do http.api(srv, "DELETE", "/templates/" .. ids[i]) end
    http.api(srv, "DELETE", "/templates/" .. res.json.snapshotID:match("^([^:]+)"))

    -- bytes: 80 MB is over the team's 64; the pause fails and the sandbox runs on
    run(sb, "head -c 80M /dev/zero > /home/user/big")
    local snap = http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/snapshots", {})
    assert.are.equal(429, snap.status, snap.body)
    assert.matches("over the team's storage limit of 64 MB", snap.json.message, 1, true)
    local pause = http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/pause", {})
    assert.are.equal(429, pause.status, pause.body)
    assert.are.equal("running", http.api(srv, "GET", "/sandboxes/" .. sb.sandboxID).json.state)
    run(sb, "rm /home/user/big")
    assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/pause", {}).status)
  end)

  it("keeps --min-free-mb free in the data directory: a copy that would not is refused with 507", function()
    local tight = wbd.start{ args = { "--min-free-mb", "1073741823" } }
    local res = http.api(tight, "POST", "/sandboxes", { templateID = "base", timeout = 60 })
    assert.are.equal(201, res.status, res.body)
    local snap = http.api(tight, "POST", "/sandboxes/" .. res.json.sandboxID .. "/snapshots", {})
    local fork = http.api(tight, "POST", "/sandboxes/" .. res.json.sandboxID .. "/fork", {})
    tight:stop()
    assert.are.equal(507, snap.status, snap.body)
    assert.matches("^not enough disk space: %d+ MB free in the data directory, 1073741823 MB are kept free$",
      snap.json.message)
    assert.are.equal(507, fork.status, fork.body)
  end)

  it("refuses an upload the sandbox's disk cannot take before its body, and bounds the spool of all uploads", function()
    local up = wbd.start{ args = { "--max-upload-mb", "4096", "--max-spool-mb", "1" } }
    local res = http.api(up, "POST", "/sandboxes", { templateID = "base", timeout = 60, secure = true })
    assert.are.equal(201, res.status, res.body)
    local sb = res.json
    local function upload(body, headers)
      local h = { ["Content-Type"] = "application/octet-stream" }
      for k, v in pairs(headers or {}) do h[k] = v end
      return http.sandbox(up, sb, 49983, "POST", "/files?path=/home/user/up.bin", { body = body, headers = h,
        timeout = 20 })
    end
    -- the spool holds 1 MB of uploads at once: a 2 MB body is dropped
    local two = upload(string.rep("x", 2 << 20))
    assert.are.equal(507, two.status, two.body)
    assert.matches("the server holds 1 MB of uploads at once", two.json.message, 1, true)
    assert.are.equal(200, upload("small").status)
    -- a Content-Length past the sandbox's free disk space: 507 before any body
    local free = tonumber((cell(up, sb, "df -B1 --output=avail /home/user | tail -1")))
    local early
    if free and free < (3 << 30) then
      early = upload("x", { ["Content-Length"] = tostring(free + (1 << 20)) })
    end
    up:stop()
    if not early then
      pending("the sandbox's disk is not a tmpfs of its own here")
      return
    end
    assert.are.equal(507, early.status, early.body)
    assert.matches("^not enough disk space in the sandbox: the upload has %d+ bytes, %d+ are free$", early.json.message)
  end)

  it("pauses expiring sandboxes in parallel, one team's many not holding back another team's", function()
    local fair = wbd.start{ args = { "--pause-workers", "2" } }
    local a, b = fair.api_key, wbd.new_key()
    local function make(key)
      local res = http.api(fair, "POST", "/sandboxes", { templateID = "base", timeout = 600, autoPause = true },
        { headers = { ["X-API-Key"] = key } })
      assert.are.equal(201, res.status, res.body)
      return res.json.sandboxID
    end
    local function expire_soon(id, key)
      local res = http.api(fair, "POST", "/sandboxes/" .. id .. "/timeout", { timeout = 2 },
        { headers = { ["X-API-Key"] = key } })
      assert.are.equal(204, res.status, res.body)
    end
    local function state(id, key)
      return http.api(fair, "GET", "/sandboxes/" .. id, nil, { headers = { ["X-API-Key"] = key } }).json.state
    end
    -- each pause's copy takes 5 s
    assert.are.equal(204, http.request{ method = "POST", url = fair.url .. "/_warmboxd/config",
      json = { copy_ms = 5000 } }.status)
    local many = {}
    for i = 1, 5 do many[i] = make(a) end
    local one = make(b)
    -- all six expire together (however long the creates took), team b's last
    for _, id in ipairs(many) do expire_soon(id, a) end
    expire_soon(one, b)
    local function info(id, key)
      return http.api(fair, "GET", "/sandboxes/" .. id, nil, { headers = { ["X-API-Key"] = key } }).json
    end
    assert.is_true(wbd.eventually(function()
      if state(one, b) ~= "paused" then return false end
      for _, id in ipairs(many) do
        if state(id, a) ~= "paused" then return false end
      end
      return true
    end, 90))
    -- a paused sandbox's endAt is when it was paused: the order the pauses ended in
    local b_at, before = wbd.utc(info(one, b).endAt), 0
    for _, id in ipairs(many) do
      if wbd.utc(info(id, a).endAt) < b_at then before = before + 1 end
    end
    fair:stop()
    -- one at a time, team b's would have waited for all five of team a's
    assert.is_true(before <= 3, "team a's pauses that ended before team b's: " .. before)
  end)
end)
