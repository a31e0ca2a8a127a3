-- envd's directory watchers over real HTTP: the WatchDir server stream
-- (start, filesystem events with fsnotify's types and names relative to the
-- watched directory, keepalives, recursive watches that follow new
-- directories, entry info, the Connect deadline, a sandbox killed under it)
-- and the polled CreateWatcher / GetWatcherEvents / RemoveWatcher (per
-- sandbox, bounded, freed by a pause); a missing directory is "not found"
-- and a symlink out of the sandbox is never watched.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local envd = require "spec.helpers.envd"
local cjson = http.cjson

local q = wbd.sh_quote
local RPC = envd.RPC
local envelopes = envd.envelopes
local function envelope(t) return envd.envelope(0, t) end

local function read_file(path) return wbd.read_all(path) or "" end

describe("warmboxd envd directory watchers", function()
  local srv, sb

  local function rpc(method, body, s)
    return http.sandbox(srv, s or sb, 49983, "POST", "/filesystem.Filesystem/" .. method,
      { json = body, headers = RPC })
  end

  local function upload(path, data)
    local res = http.sandbox(srv, sb, 49983, "POST", "/files?path=" .. path,
      { body = data, headers = { ["Content-Type"] = "application/octet-stream" } })
    assert.are.equal(200, res.status, res.body)
  end

  local function run(cmd, s)
    local json = assert(cjson.encode({ process = { cmd = "/bin/bash", args = { "-c", cmd } } }))
    local res = http.sandbox(srv, s or sb, 49983, "POST", "/process.Process/Start", {
      body = string.pack(">I1I4", 0, #json) .. json, headers = { ["Content-Type"] = "application/connect+json" } })
    assert.are.equal(200, res.status, res.body)
    assert.matches('"exited":true', res.body)
  end

  -- A WatchDir stream read by a background curl; w:wait() returns
  -- { events = {FilesystemEvent...}, starts, keepalives, trailer, ended }.
  local function watch(req, opts)
    opts = opts or {}
    local s = opts.sandbox or sb
    local out = os.tmpname()
    local args = { "env -u LD_PRELOAD curl -sS -N --max-time", tostring(opts.max_time or 20), "-o", q(out),
      "-X POST -H", q("E2b-Sandbox-Id: " .. s.sandboxID), "-H", q("E2b-Sandbox-Port: 49983"),
      "-H", q("Content-Type: application/connect+json"),
      "-H", q("Connect-Timeout-Ms: " .. tostring(opts.timeout_ms or 4000)) }
    if s.envdAccessToken then args[#args + 1] = "-H " .. q("X-Access-Token: " .. s.envdAccessToken) end
    if opts.keepalive then args[#args + 1] = "-H " .. q("Keepalive-Ping-Interval: " .. opts.keepalive) end
    local body = os.tmpname()
    local f = assert(io.open(body, "wb"))
    f:write(envelope(req))
    f:close()
    args[#args + 1] = "--data-binary " .. q("@" .. body)
    args[#args + 1] = q(srv.url .. "/filesystem.Filesystem/WatchDir")
    local done = out .. ".rc"
    os.execute("( " .. table.concat(args, " ") .. " 2>/dev/null; echo $? > " .. q(done) .. " ) &")
    -- the start event is in once the watch is in place
    wbd.eventually(function() return #read_file(out) >= 5 or read_file(done) ~= "" end, 10)
    local w = {}
    function w.wait()
      wbd.eventually(function() return read_file(done) ~= "" end, 30)
      local r = { events = {}, starts = 0, keepalives = 0, rc = tonumber(read_file(done)) }
      for _, e in ipairs(envelopes(read_file(out))) do
        if e.flag == 2 then
          r.trailer = e.msg
        elseif e.msg.start then
          r.starts = r.starts + 1
        elseif e.msg.keepalive then
          r.keepalives = r.keepalives + 1
        elseif e.msg.filesystem then
          r.events[#r.events + 1] = e.msg.filesystem
        end
      end
      os.remove(out)
      os.remove(done)
      os.remove(body)
      return r
    end
    return w
  end

  local function has(events, name, typ)
    for _, e in ipairs(events) do
      if e.name == name and e.type == typ then return e end
    end
    return nil
  end

  local function names(events)
    local t = {}
    for _, e in ipairs(events) do t[#t + 1] = e.type .. " " .. e.name end
    return table.concat(t, ", ")
  end

  lazy_setup(function()
    srv = wbd.start{}
    sb = http.create(srv, { templateID = "base", secure = true, timeout = 600 })
  end)

  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  describe("WatchDir", function()
    it("streams start, then create/write/chmod/rename/remove with names relative to the directory", function()
      assert.are.equal(200, rpc("MakeDir", { path = "w1/nested" }).status)
      upload("/home/user/w1/old.txt", "x")
      local w = watch({ path = "w1" }, { timeout_ms = 3000 })
      upload("/home/user/w1/a.txt", "hello")
      run("chmod 600 /home/user/w1/a.txt && echo more >> /home/user/w1/nested/deep.txt")
      assert.are.equal(200, rpc("Move", { source = "w1/old.txt", destination = "w1/new.txt" }).status)
      assert.are.equal(200, rpc("Remove", { path = "w1/a.txt" }).status)
      local r = w.wait()
      assert.are.equal(1, r.starts)
      local ev = r.events
      assert.is_truthy(has(ev, "a.txt", "EVENT_TYPE_CREATE"), names(ev))
      assert.is_truthy(has(ev, "a.txt", "EVENT_TYPE_WRITE"), names(ev))
      assert.is_truthy(has(ev, "a.txt", "EVENT_TYPE_CHMOD"), names(ev))
      assert.is_truthy(has(ev, "old.txt", "EVENT_TYPE_RENAME"), names(ev))
      assert.is_truthy(has(ev, "new.txt", "EVENT_TYPE_CREATE"), names(ev))
      assert.is_truthy(has(ev, "a.txt", "EVENT_TYPE_REMOVE"), names(ev))
      -- not recursive: nothing from nested/
      for _, e in ipairs(ev) do assert.not_matches("deep", e.name) end
      for _, e in ipairs(ev) do assert.is_nil(e.entry) end
      -- the Connect deadline ends it with envd's error
      assert.are.equal("deadline_exceeded", r.trailer.error.code)
    end)

    it("watches recursively, following directories created after it started", function()
      assert.are.equal(200, rpc("MakeDir", { path = "w2/a/b" }).status)
      local w = watch({ path = "/home/user/w2", recursive = true }, { timeout_ms = 3000 })
      upload("/home/user/w2/a/b/f.txt", "deep")
      assert.are.equal(200, rpc("MakeDir", { path = "w2/later" }).status)
      wbd.sleep(0.3)
      upload("/home/user/w2/later/g.txt", "new dir")
      local r = w.wait()
      assert.is_truthy(has(r.events, "a/b/f.txt", "EVENT_TYPE_WRITE"), names(r.events))
      assert.is_truthy(has(r.events, "later", "EVENT_TYPE_CREATE"), names(r.events))
      assert.is_truthy(has(r.events, "later/g.txt", "EVENT_TYPE_WRITE"), names(r.events))
    end)

    it("adds entry info to events whose path still exists", function()
      assert.are.equal(200, rpc("MakeDir", { path = "w3" }).status)
      local w = watch({ path = "w3", includeEntry = true }, { timeout_ms = 2500 })
      upload("/home/user/w3/e.txt", "entry")
      assert.are.equal(200, rpc("Remove", { path = "w3/e.txt" }).status)
      local r = w.wait()
      local write = has(r.events, "e.txt", "EVENT_TYPE_WRITE")
      assert.is_truthy(write, names(r.events))
      -- removed by now: a best-effort entry may be absent, but when present it is right
      if write.entry then
        assert.are.equal("/home/user/w3/e.txt", write.entry.path)
        assert.are.equal("FILE_TYPE_FILE", write.entry.type)
      end
      assert.is_nil(has(r.events, "e.txt", "EVENT_TYPE_REMOVE").entry)
      local w2 = watch({ path = "w3", includeEntry = true }, { timeout_ms = 2000 })
      upload("/home/user/w3/kept.txt", "kept")
      r = w2.wait()
      local e = has(r.events, "kept.txt", "EVENT_TYPE_WRITE")
      assert.are.equal("/home/user/w3/kept.txt", e.entry.path)
      assert.are.equal("kept.txt", e.entry.name)
      assert.are.equal("FILE_TYPE_FILE", e.entry.type)
    end)

    it("sends keepalives at the client's interval", function()
      assert.are.equal(200, rpc("MakeDir", { path = "w4" }).status)
      local r = watch({ path = "w4" }, { timeout_ms = 2600, keepalive = "1" }).wait()
      assert.is_true(r.keepalives >= 2, "keepalives: " .. r.keepalives)
      assert.are.equal("deadline_exceeded", r.trailer.error.code)
    end)

    it("answers not_found for a missing directory and invalid_argument for a file", function()
      upload("/home/user/w5.txt", "file")
      for path, code in pairs({ nowhere = "not_found", ["w5.txt"] = "invalid_argument",
                                ["/proc"] = "permission_denied" }) do
        local res = http.sandbox(srv, sb, 49983, "POST", "/filesystem.Filesystem/WatchDir",
          { body = envelope({ path = path }), headers = { ["Content-Type"] = "application/connect+json" } })
        assert.are.equal(200, res.status)
        local e = envelopes(res.body)
        assert.are.equal(1, #e, path)
        assert.are.equal(2, e[1].flag)
        assert.are.equal(code, e[1].msg.error.code, path)
      end
    end)

    it("never watches what a symlink to a path it does not serve points to", function()
      run("ln -sfn /proc/self /home/user/proc_link && ln -sfn /home/user/w1 /home/user/inside_link")
      local res = rpc("CreateWatcher", { path = "proc_link" })
      assert.are.equal(403, res.status, res.body)
      assert.are.equal("permission_denied", res.json.code)
      res = rpc("CreateWatcher", { path = "inside_link" })   -- a link inside the sandbox is followed
      assert.are.equal(200, res.status, res.body)
      assert.are.equal(200, rpc("RemoveWatcher", { watcherId = res.json.watcherId }).status)
    end)

    it("drops the stream when the sandbox is killed under it", function()
      local res = http.api(srv, "POST", "/sandboxes", { templateID = "base", secure = true, timeout = 600 })
      local victim = res.json
      assert.are.equal(200, rpc("MakeDir", { path = "d" }, victim).status)
      -- the deadline comes well before curl gives up: a stream left running
      -- would end with its deadline_exceeded trailer, a dropped one has none
      local w = watch({ path = "d" }, { sandbox = victim, timeout_ms = 8000, max_time = 60 })
      assert.are.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. victim.sandboxID).status)
      local r = w.wait()
      assert.are.equal(1, r.starts)
      assert.is_nil(r.trailer)
      assert.are_not.equal(0, r.rc)   -- curl saw the response cut, not a clean end
      assert.is_true(wbd.alive(srv.pid))
    end)
  end)

  describe("CreateWatcher / GetWatcherEvents / RemoveWatcher", function()
    it("queues events until they are fetched, then forgets the watcher when removed", function()
      assert.are.equal(200, rpc("MakeDir", { path = "p1/sub" }).status)
      local res = rpc("CreateWatcher", { path = "p1", recursive = true })
      assert.are.equal(200, res.status, res.body)
      local id = res.json.watcherId
      assert.matches("^w[a-z0-9]+$", id)
      upload("/home/user/p1/x.txt", "x")
      upload("/home/user/p1/sub/y.txt", "y")
      -- inotify's events reach the queue from warmboxd's watcher thread: fetched
      -- until both are in (a loaded machine may deliver them a fetch later)
      local events = {}
      local ok = wbd.eventually(function()
        res = rpc("GetWatcherEvents", { watcherId = id })
        assert.are.equal(200, res.status, res.body)
        for _, e in ipairs(res.json.events or {}) do events[#events + 1] = e end
        return has(events, "x.txt", "EVENT_TYPE_CREATE") and has(events, "sub/y.txt", "EVENT_TYPE_WRITE")
      end, 10)
      assert.is_truthy(ok, names(events))
      -- drained: a fetch takes what it returns off the queue, so once nothing
      -- more happens a fetch is empty
      assert.is_truthy(wbd.eventually(function()
        res = rpc("GetWatcherEvents", { watcherId = id })
        return res.status == 200 and next(res.json) == nil
      end, 10), res.body)
      -- another sandbox cannot see it
      local other = http.api(srv, "POST", "/sandboxes", { templateID = "base", timeout = 600 }).json
      res = rpc("GetWatcherEvents", { watcherId = id }, other)
      assert.are.equal(404, res.status)
      assert.are.equal("not_found", res.json.code)
      assert.are.equal(200, rpc("RemoveWatcher", { watcherId = id }).status)
      res = rpc("GetWatcherEvents", { watcherId = id })
      assert.are.equal(404, res.status)
      assert.are.same({ code = "not_found", message = "watcher with id " .. id .. " not found" }, res.json)
      assert.are.equal(404, rpc("RemoveWatcher", { watcherId = id }).status)
    end)

    it("answers not_found for a missing directory", function()
      local res = rpc("CreateWatcher", { path = "nowhere" })
      assert.are.equal(404, res.status)
      assert.are.equal("not_found", res.json.code)
    end)

    it("allows a bounded number of watchers per sandbox", function()
      local res = http.api(srv, "POST", "/sandboxes", { templateID = "base", timeout = 600 })
      local s = res.json
      local ids = {}
      for i = 1, 32 do
        res = rpc("CreateWatcher", { path = "/tmp" }, s)
        assert.are.equal(200, res.status, "watcher " .. i .. ": " .. res.body)
        ids[i] = res.json.watcherId
      end
      res = rpc("CreateWatcher", { path = "/tmp" }, s)
      assert.are.equal(429, res.status)
      assert.are.equal("resource_exhausted", res.json.code)
      -- other sandboxes are not affected
      res = rpc("CreateWatcher", { path = "/tmp" })
      assert.are.equal(200, res.status)
      assert.are.equal(200, rpc("RemoveWatcher", { watcherId = res.json.watcherId }).status)
      assert.are.equal(200, rpc("RemoveWatcher", { watcherId = ids[1] }, s).status)
      assert.are.equal(200, rpc("CreateWatcher", { path = "/tmp" }, s).status)
    end)

    it("refuses a recursive watch over too many directories", function()
      run("mkdir -p /home/user/many && cd /home/user/many && mkdir $(seq 1 4100)")
      local res = rpc("CreateWatcher", { path = "many", recursive = true })
      assert.are.equal(429, res.status, res.body)
      assert.are.equal("resource_exhausted", res.json.code)
      res = rpc("CreateWatcher", { path = "many" })   -- not recursive: one directory
      assert.are.equal(200, res.status, res.body)
      assert.are.equal(200, rpc("RemoveWatcher", { watcherId = res.json.watcherId }).status)
    end)

    it("frees a sandbox's watchers when it is paused", function()
      local s = http.api(srv, "POST", "/sandboxes", { templateID = "base", timeout = 600 }).json
      local res = rpc("CreateWatcher", { path = "/tmp" }, s)
      assert.are.equal(200, res.status, res.body)
      local id = res.json.watcherId
      assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. s.sandboxID .. "/pause").status)
      assert.are.equal(201, http.api(srv, "POST", "/sandboxes/" .. s.sandboxID .. "/connect", { timeout = 600 }).status)
      res = rpc("GetWatcherEvents", { watcherId = id }, s)
      assert.are.equal(404, res.status, res.body)
    end)
  end)
end)
