-- warmboxd's envd (port 49983) over real HTTP: auth, /files, the Filesystem
-- and Process Connect-RPC services, and path confinement.
-- This file: the part 'fs' of them; shared helpers in spec/helpers/warmboxd_envd.lua.
local shared = require "spec.helpers.warmboxd_envd"
local wbd = shared.wbd
local http = shared.http
local RPC = shared.RPC
local b64decode = shared.b64decode
local urlencode = shared.urlencode
local envelope = shared.envelope
local envelopes = shared.envelopes

describe("warmboxd envd", function()
  local srv, sb, open

  local function rpc(s, method, body, headers)
    local h = {}
    for k, v in pairs(RPC) do h[k] = v end
    for k, v in pairs(headers or {}) do h[k] = v end
    return http.sandbox(srv, s or sb, 49983, "POST", "/" .. method, { json = body, headers = h })
  end

  -- Process.Start: returns { status, envelopes, stdout, stderr, start, end_, trailer }.
  local function start(s, process, headers, raw_body)
    local h = { ["Content-Type"] = "application/connect+json", ["Connect-Protocol-Version"] = "1" }
    for k, v in pairs(headers or {}) do h[k] = v end
    local res = http.sandbox(srv, s or sb, 49983, "POST", "/process.Process/Start",
      { body = raw_body or envelope(0, { process = process }), headers = h })
    local r = { status = res.status, headers = res.headers, body = res.body, stdout = "", stderr = "", events = {} }
    if res.status ~= 200 then return r end
    r.envelopes = envelopes(res.body)
    for _, e in ipairs(r.envelopes) do
      if e.flag == 2 then
        r.trailer = e.msg
      else
        local ev = e.msg.event
        r.events[#r.events + 1] = ev
        if ev.start then r.start = ev.start end
        if ev["end"] then r.end_ = ev["end"] end
        if ev.data and ev.data.stdout then r.stdout = r.stdout .. b64decode(ev.data.stdout) end
        if ev.data and ev.data.stderr then r.stderr = r.stderr .. b64decode(ev.data.stderr) end
      end
    end
    return r
  end

  local function sh(cmd, s, extra)
    local p = { cmd = "/bin/bash", args = { "-l", "-c", cmd } }
    for k, v in pairs(extra or {}) do p[k] = v end
    return start(s, p)
  end

  local function upload(path, data, s)
    return http.sandbox(srv, s or sb, 49983, "POST", "/files?path=" .. urlencode(path),
      { body = data, headers = { ["Content-Type"] = "application/octet-stream" } })
  end

  local function download(path, s)
    return http.sandbox(srv, s or sb, 49983, "GET", "/files?path=" .. urlencode(path))
  end

  lazy_setup(function()
    srv = wbd.start{}
    local res = http.api(srv, "POST", "/sandboxes",
      { templateID = "base", secure = true, timeout = 600, envVars = { GREETING = "hello", SHARED = "sandbox" } })
    assert.are.equal(201, res.status, res.body)
    sb = res.json
    assert.is_string(sb.envdAccessToken)
    res = http.api(srv, "POST", "/sandboxes", { templateID = "base", timeout = 600 })
    assert.are.equal(201, res.status, res.body)
    open = res.json
    assert.is_nil(open.envdAccessToken)
  end)

  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  describe("filesystem.Filesystem", function()
    lazy_setup(function()
      upload("fs/a.txt", "12345")
      upload("fs/sub/b.txt", "b")
      upload("fs/sub/deeper/c.txt", "c")
      upload("fs/empty", "")
    end)

    it("Stat returns a protojson EntryInfo", function()
      local res = rpc(sb, "filesystem.Filesystem/Stat", { path = "fs/a.txt" })
      assert.are.equal(200, res.status, res.body)
      assert.matches("^application/json", res.headers["content-type"])
      local e = res.json.entry
      assert.are.equal("a.txt", e.name)
      assert.are.equal("FILE_TYPE_FILE", e.type)
      assert.are.equal("/home/user/fs/a.txt", e.path)
      assert.are.equal("5", e.size)
      assert.are.equal(420, e.mode)
      assert.are.equal("-rw-r--r--", e.permissions)
      assert.are.equal("user", e.owner)
      assert.are.equal("user", e.group)
      assert.matches("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d[%.%d]*Z$", e.modifiedTime)
    end)

    it("Stat omits a zero size and reports directories", function()
      local e = rpc(sb, "filesystem.Filesystem/Stat", { path = "fs/empty" }).json.entry
      assert.is_nil(e.size)
      e = rpc(sb, "filesystem.Filesystem/Stat", { path = "/home/user/fs/sub" }).json.entry
      assert.are.equal("FILE_TYPE_DIRECTORY", e.type)
      assert.are.equal("drwxr-xr-x", e.permissions)
      assert.are.equal(493, e.mode)
    end)

    it("Stat of a missing path is not_found (404)", function()
      local res = rpc(sb, "filesystem.Filesystem/Stat", { path = "fs/nope" })
      assert.are.equal(404, res.status)
      assert.are.equal("not_found", res.json.code)
      assert.is_string(res.json.message)
    end)

    it("MakeDir creates parents and returns the entry", function()
      local res = rpc(sb, "filesystem.Filesystem/MakeDir", { path = "made/a/b" })
      assert.are.equal(200, res.status, res.body)
      assert.are.equal("FILE_TYPE_DIRECTORY", res.json.entry.type)
      assert.are.equal("/home/user/made/a/b", res.json.entry.path)
    end)

    it("MakeDir of an existing directory is already_exists (409)", function()
      rpc(sb, "filesystem.Filesystem/MakeDir", { path = "made2" })
      local res = rpc(sb, "filesystem.Filesystem/MakeDir", { path = "made2" })
      assert.are.equal(409, res.status)
      assert.are.equal("already_exists", res.json.code)
    end)

    it("MakeDir over a file is invalid_argument (400)", function()
      local res = rpc(sb, "filesystem.Filesystem/MakeDir", { path = "fs/a.txt" })
      assert.are.equal(400, res.status)
      assert.are.equal("invalid_argument", res.json.code)
    end)

    it("ListDir lists one level by default and when depth is 0", function()
      for _, depth in ipairs({ 1, 0 }) do
        local res = rpc(sb, "filesystem.Filesystem/ListDir", { path = "fs", depth = depth })
        assert.are.equal(200, res.status, res.body)
        local names = {}
        for _, e in ipairs(res.json.entries) do names[#names + 1] = e.path end
        assert.are.same({ "/home/user/fs/a.txt", "/home/user/fs/empty", "/home/user/fs/sub" }, names)
      end
    end)

    it("ListDir walks deeper with depth", function()
      local res = rpc(sb, "filesystem.Filesystem/ListDir", { path = "/home/user/fs", depth = 2 })
      local names = {}
      for _, e in ipairs(res.json.entries) do names[#names + 1] = e.path end
      assert.are.same({ "/home/user/fs/a.txt", "/home/user/fs/empty", "/home/user/fs/sub",
        "/home/user/fs/sub/b.txt", "/home/user/fs/sub/deeper" }, names)
    end)

    it("ListDir of an empty directory is {}", function()
      rpc(sb, "filesystem.Filesystem/MakeDir", { path = "emptydir" })
      local res = rpc(sb, "filesystem.Filesystem/ListDir", { path = "emptydir", depth = 1 })
      assert.are.equal(200, res.status)
      assert.are.equal("{}", res.body)
    end)

    it("ListDir errors: missing is not_found, a file is invalid_argument", function()
      local res = rpc(sb, "filesystem.Filesystem/ListDir", { path = "nodir", depth = 1 })
      assert.are.equal(404, res.status)
      assert.are.equal("not_found", res.json.code)
      res = rpc(sb, "filesystem.Filesystem/ListDir", { path = "fs/a.txt", depth = 1 })
      assert.are.equal(400, res.status)
      assert.are.equal("invalid_argument", res.json.code)
    end)

    it("Remove is recursive and a missing path is fine", function()
      upload("rm/x/y/z.txt", "z")
      local res = rpc(sb, "filesystem.Filesystem/Remove", { path = "rm" })
      assert.are.equal(200, res.status, res.body)
      assert.are.equal("{}", res.body)
      assert.are.equal(404, rpc(sb, "filesystem.Filesystem/Stat", { path = "rm" }).status)
      res = rpc(sb, "filesystem.Filesystem/Remove", { path = "rm" })
      assert.are.equal(200, res.status)
      assert.are.equal("{}", res.body)
    end)

    it("Move renames, creating the destination's parents", function()
      upload("mv/src.txt", "moving")
      local res = rpc(sb, "filesystem.Filesystem/Move", { source = "mv/src.txt", destination = "mv/new/dst.txt" })
      assert.are.equal(200, res.status, res.body)
      assert.are.equal("/home/user/mv/new/dst.txt", res.json.entry.path)
      assert.are.equal("moving", download("mv/new/dst.txt").body)
      assert.are.equal(404, download("mv/src.txt").status)
      res = rpc(sb, "filesystem.Filesystem/Move", { source = "mv/src.txt", destination = "mv/x.txt" })
      assert.are.equal(404, res.status)
      assert.are.equal("not_found", res.json.code)
    end)

    it("answers unimplemented (501) for an RPC it does not serve", function()
      local res = rpc(sb, "filesystem.Filesystem/Chown", { path = "fs" })
      assert.are.equal(501, res.status)
      assert.are.equal("unimplemented", res.json.code)
    end)

    it("refuses an unknown user in Authorization with unauthenticated (401)", function()
      local res = rpc(sb, "filesystem.Filesystem/Stat", { path = "fs" },
        { Authorization = "Basic " .. "bWFsbG9yeTo=" })   -- "mallory:"
      assert.are.equal(401, res.status)
      assert.are.equal("unauthenticated", res.json.code)
      res = rpc(sb, "filesystem.Filesystem/Stat", { path = "fs" }, { Authorization = "Basic dXNlcjo=" })  -- "user:"
      assert.are.equal(200, res.status)
    end)
  end)

  describe("the jail's filesystem", function()
    -- What a process in the sandbox prints for `cat path` (nil when it fails).
    local function jail_cat(path, s)
      local r = sh("cat " .. path, s)
      if r.end_ and r.end_.exitCode then return nil end
      return r.stdout
    end
    local function host_file(path)
      local f = io.open(path, "r")
      if not f then return nil end
      local d = f:read("a")
      f:close()
      return d
    end

    it("serves every path as the sandbox's processes see it, never the host's", function()
      local mine = jail_cat("/etc/passwd")
      assert.matches("user:x:1000:1000", mine)
      assert.are_not.equal(host_file("/etc/passwd"), mine)   -- the jail's generated one
      for _, p in ipairs({ "/etc/passwd", "../../etc/passwd", "/home/user/../../etc/passwd", "/tmp/../etc/passwd" }) do
        local res = download(p)
        assert.are.equal(200, res.status, p)
        assert.are.equal(mine, res.body, p)
      end
      -- a host tree the jail binds read-only, through its /bin -> usr/bin link too
      assert.are.equal(host_file("/usr/bin/env"), download("/usr/bin/env").body)
      assert.are.equal(host_file("/usr/bin/env"), download("/bin/env").body)
      assert.are.equal(jail_cat("/etc/hosts"), download("/etc/hosts").body)
      local res = rpc(sb, "filesystem.Filesystem/ListDir", { path = "/", depth = 1 })
      assert.are.equal(200, res.status, res.body)
      local names = {}
      for _, e in ipairs(res.json.entries) do names[e.name] = e end
      for _, n in ipairs({ "etc", "home", "tmp", "usr", "root", "proc", "dev" }) do assert.is_table(names[n], n) end
      -- /tmp as the jail has it (the sandbox's own, sticky), not the mount point under it
      assert.are.equal("dtrwxrwxrwx", names.tmp.permissions)
      -- two levels: into the mounted trees, never into /proc or /dev
      assert.are.equal(200, upload("/tmp/level2.txt", "x").status)
      res = rpc(sb, "filesystem.Filesystem/ListDir", { path = "/", depth = 2 })
      local paths = {}
      for _, e in ipairs(res.json.entries) do paths[e.path] = true end
      for _, want in ipairs({ "/home/user", "/usr/bin", "/tmp/level2.txt", "/etc/passwd" }) do
        assert.is_true(paths[want], want)
      end
      for path in pairs(paths) do
        assert.not_matches("^/proc/.", path)
        assert.not_matches("^/dev/.", path)
      end
    end)

    it("does not serve the per-process /proc, /dev and /sys", function()
      for _, p in ipairs({ "/proc/self/environ", "/proc/1/root/etc/shadow", "/dev/null", "/sys/kernel" }) do
        local res = download(p)
        assert.are.equal(400, res.status, p)
        res = rpc(sb, "filesystem.Filesystem/Stat", { path = p })
        assert.are.equal(403, res.status, p)
        assert.are.equal("permission_denied", res.json.code, p)
      end
    end)

    it("writes outside /home/user and /tmp to the sandbox's own root, seen by its processes", function()
      assert.are.equal(200, upload("/opt/app/x.txt", "in opt").status)
      assert.are.equal("in opt", jail_cat("/opt/app/x.txt"))
      assert.is_nil(host_file("/opt/app/x.txt"))
      assert.are.equal(200, upload("/etc/warmbox-evil", "mine").status)
      assert.are.equal("mine", jail_cat("/etc/warmbox-evil"))
      assert.is_nil(host_file("/etc/warmbox-evil"))
      -- and the other way round: a process's file outside home and /tmp
      local r = sh("mkdir -p /root/made && echo by-process > /root/made/f && echo run > /run/marker")
      assert.is_nil(r.end_.exitCode, r.stderr)
      assert.are.equal("by-process\n", download("/root/made/f").body)
      assert.are.equal("run\n", download("/run/marker").body)
      local res = rpc(sb, "filesystem.Filesystem/MakeDir", { path = "/srv/data" })
      assert.are.equal(200, res.status, res.body)
      assert.is_nil(sh("test -d /srv/data").end_.exitCode)
      res = rpc(sb, "filesystem.Filesystem/Move", { source = "/opt/app/x.txt", destination = "/srv/data/x.txt" })
      assert.are.equal(200, res.status, res.body)
      assert.are.equal("in opt", jail_cat("/srv/data/x.txt"))
      assert.are.equal(200, rpc(sb, "filesystem.Filesystem/Remove", { path = "/srv/data" }).status)
      assert.is_nil(jail_cat("/srv/data/x.txt"))
    end)

    it("keeps its root's skeleton out of the sandbox user's reach (warmboxd as root)", function()
      local id = io.popen("id -u"):read("l")
      if id ~= "0" then return end   -- without root the jail's user is warmboxd's own uid
      for _, cmd in ipairs({ "touch /x", "rmdir /usr", "mv /etc /etc2", "ln -s / /l", "rm /bin",
                             "echo x > /etc/passwd", "echo x > /usr/x" }) do
        local r = sh(cmd)
        assert.is_number(r.end_.exitCode, cmd)
      end
      local link = io.popen("readlink /bin"):read("l")   -- the host's (merged /usr), or nil
      if link then assert.are.equal(link .. "\n", sh("readlink /bin").stdout) end
      -- the parts that are the user's own
      local r = sh("touch /root/a /run/a /var/tmp/a /tmp/a /home/user/a")
      assert.is_nil(r.end_.exitCode, r.stderr)
    end)

    it("keeps another sandbox's root apart", function()
      assert.are.equal(200, upload("/opt/only-here", "a").status)
      assert.are.equal(404, download("/opt/only-here", open).status)
      assert.is_nil(jail_cat("/opt/only-here", open))
    end)

    it("keeps the root across a pause, with memory and without", function()
      local s = http.api(srv, "POST", "/sandboxes", { templateID = "base", timeout = 600 }).json
      assert.are.equal(200, upload("/opt/kept", "kept", s).status)
      local path = "/sandboxes/" .. s.sandboxID
      for _, memory in ipairs({ true, false }) do
        assert.are.equal(204, http.api(srv, "POST", path .. "/pause", { memory = memory }).status)
        assert.are.equal(201, http.api(srv, "POST", path .. "/connect", { timeout = 60 }).status)
        assert.are.equal("kept", jail_cat("/opt/kept", s), tostring(memory))
        assert.are.equal("kept", download("/opt/kept", s).body)
      end
      http.api(srv, "DELETE", path)
    end)

    it("refuses every change to the host trees the jail has read-only", function()
      local env = host_file("/usr/bin/env")
      assert.are_not.equal(200, upload("/usr/bin/env", "pwned").status)
      assert.are_not.equal(200, upload("/usr/warmbox-evil", "x").status)
      assert.are_not.equal(200, upload("/etc/passwd", "pwned").status)
      assert.are_not.equal(200, upload("/etc/hosts", "pwned").status)
      for _, m in ipairs({ { "MakeDir", { path = "/usr/lib/warmbox-evil" } },
                           { "Remove", { path = "/usr/bin/env" } },
                           { "Remove", { path = "/etc/hosts" } },
                           { "Move", { source = "/usr/bin/env", destination = "/tmp/env" } },
                           { "Move", { source = "/tmp/x", destination = "/usr/bin/x" } } }) do
        local res = rpc(sb, "filesystem.Filesystem/" .. m[1], m[2])
        assert.are.equal(403, res.status, m[1] .. " " .. res.body)
        assert.are.equal("permission_denied", res.json.code)
      end
      assert.are.equal(env, host_file("/usr/bin/env"))
      assert.is_nil(host_file("/usr/warmbox-evil"))
      assert.is_nil(io.open("/usr/lib/warmbox-evil", "r"))
      assert.matches("user:x:1000", jail_cat("/etc/passwd"))
    end)

    it("answers relative paths of user root from /root, and starts its processes there", function()
      local res = http.sandbox(srv, sb, 49983, "POST", "/files?username=root&path=hello.txt",
        { body = "as root", headers = { ["Content-Type"] = "application/octet-stream" } })
      assert.are.equal(200, res.status, res.body)
      assert.are.equal("/root/hello.txt", res.json[1].path)
      assert.are.equal("as root", jail_cat("/root/hello.txt"))
      res = http.sandbox(srv, sb, 49983, "GET", "/files?username=root&path=hello.txt")
      assert.are.equal("as root", res.body)
      local r = start(sb, { cmd = "/bin/bash", args = { "-c", "pwd; echo $HOME" } },
        { Authorization = "Basic " .. "cm9vdDo=" })   -- "root:"
      assert.are.equal("/root\n/root\n", r.stdout)
      assert.are.equal("/home/user\n", sh("pwd").stdout)
    end)

    it("refuses to remove the sandbox's home itself", function()
      local res = rpc(sb, "filesystem.Filesystem/Remove", { path = "/home/user" })
      assert.are.equal(403, res.status)
      assert.are.equal(200, rpc(sb, "filesystem.Filesystem/Stat", { path = "fs/a.txt" }).status)
    end)

    describe("with symlinks planted by the sandbox's own code", function()
      lazy_setup(function()
        local r = sh("cd /home/user && mkdir -p links/in && echo inside > links/in/f.txt && " ..
          "ln -s /etc/passwd links/abs && ln -s ../../../../../../../../etc/passwd links/rel && " ..
          "ln -s /etc links/etcdir && ln -s ../../../../../../../../etc links/reldir && " ..
          "ln -s in/f.txt links/ok && ln -s /home/user/links/in/f.txt links/absin && ln -s /tmp links/tmpdir && " ..
          "ln -s /home/user/../../etc links/sneaky && ln -s /tmp/../etc/passwd links/sneaky2")
        assert.are.equal(200, r.status)
        assert.is_nil(r.end_.exitCode, r.stderr)
      end)

      it("serves what they point at in the jail, never a host file", function()
        local mine = jail_cat("/etc/passwd")
        for _, p in ipairs({ "links/abs", "links/rel", "links/etcdir/passwd", "links/reldir/passwd",
          "links/sneaky/passwd", "links/sneaky2" }) do
          local res = download(p)
          assert.are.equal(200, res.status, p)
          assert.are.equal(mine, res.body, p)
          assert.are.equal(mine, jail_cat("/home/user/" .. p), p)
        end
        local res = rpc(sb, "filesystem.Filesystem/ListDir", { path = "links/etcdir", depth = 1 })
        assert.are.equal(200, res.status)
        assert.not_matches("shadow", res.body)   -- the host's /etc is not the jail's
        -- a bound file is listed as the file, not as the mount point under it,
        -- through the link as directly
        for _, dir in ipairs({ "links/etcdir", "/etc" }) do
          res = rpc(sb, "filesystem.Filesystem/ListDir", { path = dir, depth = 1 })
          local seen
          for _, e in ipairs(res.json.entries) do
            if e.name == "passwd" then
              seen = e
              assert.are.equal(tostring(#mine), e.size, dir)
            end
          end
          assert.are.equal(dir == "/etc" and "/etc/passwd" or "/home/user/links/etcdir/passwd", seen.path)
        end
      end)

      it("writes through them where the jail would: the sandbox's own root", function()
        for _, p in ipairs({ "links/etcdir/warmbox-evil", "links/reldir/warmbox-evil2" }) do
          assert.are.equal(200, upload(p, "x").status, p)
          assert.are.equal("x", jail_cat("/home/user/" .. p), p)
        end
        assert.is_nil(host_file("/etc/warmbox-evil"))
        assert.is_nil(host_file("/etc/warmbox-evil2"))
      end)

      it("does not overwrite a read-only file through a planted link", function()
        local before, mine = host_file("/etc/passwd"), jail_cat("/etc/passwd")
        assert.are_not.equal(200, upload("links/abs", "pwned").status)
        assert.are.equal(before, host_file("/etc/passwd"))
        assert.are.equal(mine, jail_cat("/etc/passwd"))
        local r = sh("ln -s /usr/lib links/usrlib && ln -s ../../../usr/bin links/relusr")
        assert.is_nil(r.end_.exitCode, r.stderr)
        for _, p in ipairs({ "links/usrlib/warmbox-evil", "links/relusr/warmbox-evil" }) do
          assert.are_not.equal(200, upload(p, "x").status, p)
          local res = rpc(sb, "filesystem.Filesystem/MakeDir", { path = p })
          assert.are.equal(403, res.status, p)
        end
        assert.is_nil(host_file("/usr/lib/warmbox-evil"))
        assert.is_nil(host_file("/usr/bin/warmbox-evil"))
      end)

      it("lists and stats the links themselves", function()
        local e = rpc(sb, "filesystem.Filesystem/Stat", { path = "links/abs" }).json.entry
        assert.are.equal("FILE_TYPE_SYMLINK", e.type)
        assert.are.equal("/etc/passwd", e.symlinkTarget)
        -- the resolved absolute path, as envd sends, not the link's text
        local function target(p) return rpc(sb, "filesystem.Filesystem/Stat", { path = p }).json.entry.symlinkTarget end
        assert.are.equal("/etc/passwd", target("links/rel"))
        assert.are.equal("/home/user/links/in/f.txt", target("links/ok"))
        assert.are.equal("/etc", target("links/sneaky"))
        local res = rpc(sb, "filesystem.Filesystem/ListDir", { path = "links", depth = 3 })
        for _, entry in ipairs(res.json.entries) do
          assert.not_matches("passwd$", entry.path:gsub("^/home/user/links/", ""))
        end
      end)

      it("follows a link that stays inside the sandbox, relative or absolute", function()
        assert.are.equal("inside\n", download("links/ok").body)
        assert.are.equal("inside\n", download("links/absin").body)
        local res = upload("links/tmpdir/via-link.txt", "via")
        assert.are.equal(200, res.status, res.body)
        assert.are.equal("via", download("/tmp/via-link.txt").body)
        res = rpc(sb, "filesystem.Filesystem/ListDir", { path = "links/tmpdir", depth = 1 })
        assert.are.equal(200, res.status, res.body)
      end)

      it("moves and removes the link, never its target", function()
        local res = rpc(sb, "filesystem.Filesystem/Move", { source = "links/rel", destination = "links/rel2" })
        assert.are.equal(200, res.status, res.body)
        assert.are.equal("FILE_TYPE_SYMLINK", res.json.entry.type)
        res = rpc(sb, "filesystem.Filesystem/Remove", { path = "links/rel2" })
        assert.are.equal(200, res.status)
        res = rpc(sb, "filesystem.Filesystem/Remove", { path = "links/etcdir" })
        assert.are.equal(200, res.status)
        assert.is_not_nil(io.open("/etc/passwd", "r"))
        assert.is_not_nil(io.open("/etc/hostname", "r") or io.open("/etc/os-release", "r"))
      end)
    end)
  end)

end)
