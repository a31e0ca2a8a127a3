-- `warmbox gc` and `warmbox sessions` against a real warmboxd seeded with
-- tagged sandboxes of two tenants (backdated with the seed knob).
local wbd = require "spec.helpers.warmboxd"
local json = require "cjson.safe"
local tag_mod = require "warmbox.tag"

local ROOT = wbd.root()
local TAG = "warmboxSessionId"
local DAY = 86400

-- Runs bin/warmbox with the spec's build; returns exit status, stdout, stderr.
-- With `pty`, under script(1): stdout and stderr are one terminal (returned as stdout).
local function warmbox(args, pty) return require("spec.helpers.cli").run(args, { pty = pty }) end

describe("warmbox gc / sessions", function()
  local srv, lockdir
  local function g() return "--api-url " .. srv.url .. " --api-key " .. srv.api_key .. " --lock file " end
  local tv = {}

  before_each(function()
    srv = wbd.start{ args = { "--rtt-ms", "0" } }
    lockdir = os.tmpname()
    os.remove(lockdir)
    for _, k in ipairs({ "acme:c1", "acme:c2", "beta:c3" }) do tv[k] = tag_mod.tag_value(k, {}) end
    wbd.seed(srv, { count = 3, state = "paused", metadata = { [TAG] = tv["acme:c1"] },
      started_ago_s = 31 * DAY, paused_ago_s = 30 * DAY })
    wbd.seed(srv, { count = 2, state = "paused", metadata = { [TAG] = tv["acme:c2"] },
      started_ago_s = 2 * 3600, paused_ago_s = 3600, templateID = "code-interpreter-v1" })
    wbd.seed(srv, { count = 1, state = "paused", metadata = { [TAG] = tv["beta:c3"] },
      started_ago_s = 31 * DAY, paused_ago_s = 30 * DAY })
    wbd.seed(srv, { count = 1, state = "paused", metadata = { [TAG] = "not-a-warmbox-tag" },
      started_ago_s = 31 * DAY, paused_ago_s = 30 * DAY })
  end)
  after_each(function()
    srv:stop()
    os.execute("rm -rf " .. wbd.sh_quote(lockdir))
  end)

  local function kills() return wbd.stats(srv).requests["DELETE /sandboxes/{id}"] or 0 end

  it("--dry-run --json --retention 7d reports one JSON document and kills nothing", function()
    local code, out, err = warmbox(g() .. "gc --dry-run --json --retention 7d")
    assert.equal(0, code, err)
    local rep = assert(json.decode(out), out)
    assert.is_true(rep.dry_run)
    assert.equal(4, rep.killed)
    assert.equal(3, rep.kept)   -- 2 young + the orphan
    assert.equal(1, rep.orphans)
    assert.equal(4, #rep.actions)
    for _, a in ipairs(rep.actions) do
      assert.equal("kill", a.action)
      assert.is_true(a.session == "acme:c1" or a.session == "beta:c3")
      assert.is_true(a.tenant == "acme" or a.tenant == "beta")
    end
    assert.equal(0, kills())
    assert.equal("", err) -- not a terminal: no progress line
  end)

  it("--dry-run in text says what it would kill, line by line and in the summary", function()
    local code, out, err = warmbox(g() .. "gc --dry-run --retention 7d")
    assert.equal(0, code, err)
    local n = 0
    for line in out:gmatch("[^\n]+") do
      if line:match("^  would kill ") then n = n + 1 end
      assert.is_nil(line:match("^  kill "), out)
    end
    assert.equal(4, n, out)
    assert.matches("dry run: listed 7, tagged 7, kept 3, would kill 4, would demote 0,", out, 1, true)
    assert.equal(0, kills())
  end)

  it("--max-kills bounds a pass; the next pass does the rest; --concurrency is taken", function()
    local code, out, err = warmbox(g() .. "gc --retention 7d --max-kills 2 --concurrency 3")
    assert.equal(0, code, err)
    assert.matches("killed 2,", out)
    assert.equal(2, kills())
    code, out = warmbox(g() .. "gc --retention 30m")
    assert.equal(0, code)
    assert.matches("killed 4,", out) -- the 2 old left and the 2 an hour old
    code, out = warmbox(g() .. "sessions --json")
    assert.equal(0, code)
    assert.same({}, json.decode(out))
  end)

  it("sessions: a running sandbox's last activity is now, not its start", function()
    local tvr = tag_mod.tag_value("gamma:run", {})
    wbd.seed(srv, { count = 1, state = "running", metadata = { [TAG] = tvr }, started_ago_s = 2 * DAY,
      timeout = 3 * DAY })
    local code, out = warmbox(g() .. "sessions --json --state running")
    assert.equal(0, code)
    local list = assert(json.decode(out), out)
    assert.equal(1, #list)
    assert.equal("gamma:run", list[1].key)
    assert.is_true(list[1].age_s < DAY, "age " .. tostring(list[1].age_s))
  end)

  it("--policy FILE: a per-tenant cap from the rules library", function()
    local f = os.tmpname() .. ".lua"
    local fh = assert(io.open(f, "w"))
    fh:write('return { gc = rules.gc{ kill_after = "365d", tenant_cap = 1 } }\n')
    fh:close()
    local code, out, err = warmbox(g() .. "gc --json --policy " .. f)
    os.remove(f)
    assert.equal(0, code, err)
    local rep = assert(json.decode(out), out)
    -- acme keeps its newest sandbox (one of acme:c2's), beta keeps its one, the orphan stays
    assert.equal(4, rep.killed)
    assert.equal(3, rep.kept)
    for _, a in ipairs(rep.actions) do
      assert.equal("acme", a.tenant)
      assert.matches("over its cap", a.reason)
    end
  end)

  it("exits 1 when an action failed", function()
    assert.equal(204, wbd.admin(srv, "POST", "faults", { route = "DELETE /sandboxes/{id}", count = 100,
      status = 500 }).status)
    local code, _, err = warmbox(g() .. "gc --retention 7d")
    assert.equal(1, code)
    assert.matches("kill .- failed", err)
  end)

  it("prints a progress line on stderr only when it is a terminal", function()
    local code, out = warmbox(g() .. "gc --dry-run --retention 7d", true)
    assert.equal(0, code, out)
    assert.matches("\rgc: %d+ pages?, 7 listed, %d+ decided", out:gsub("\27%[K", ""))
    local _, _, err = warmbox(g() .. "gc --dry-run --retention 7d")
    assert.not_matches("gc: ", err)
  end)

  it("sessions --tenant --state --json: last activity and age per session", function()
    local code, out = warmbox(g() .. "sessions --tenant acme --state paused --json")
    assert.equal(0, code)
    local rows = assert(json.decode(out))
    assert.equal(5, #rows)
    local by = {}
    for _, r in ipairs(rows) do
      assert.equal("acme", r.tenant)
      assert.equal("paused", r.state)
      by[r.key] = r
    end
    assert.is_true(by["acme:c1"].age_s >= 30 * DAY - 60 and by["acme:c1"].age_s < 31 * DAY)
    assert.is_true(by["acme:c2"].age_s >= 3600 - 60 and by["acme:c2"].age_s < 2 * 3600)
    -- each conversation's size, as the listing gives it (cpuCount / memoryMB of its template)
    assert.same({ 2, 512 }, { by["acme:c1"].cpu_count, by["acme:c1"].memory_mb })
    assert.same({ 2, 2048 }, { by["acme:c2"].cpu_count, by["acme:c2"].memory_mb })
    code, out = warmbox(g() .. "sessions --tenant beta")
    assert.equal(0, code)
    assert.matches("beta:c3%s+beta%s+%S+%s+paused%s+2026%-%d%d%-%d%dT%S+Z%s+%d+d%d%dh\n", out)
    code = warmbox(g() .. "sessions --state sleeping")
    assert.equal(2, code)
  end)

  it("an interrupted pass (SIGINT) prints where to resume; --next-token finishes it", function()
    local srv2 = wbd.start{ args = { "--rtt-ms", "20" } }
    local ok, e = pcall(function()
      for i = 1, 10 do
        wbd.seed(srv2, { count = 300, state = "paused", metadata = { [TAG] = tag_mod.tag_value("big:c" .. i, {}) },
          started_ago_s = 31 * DAY, paused_ago_s = 30 * DAY })
      end
      local build = require("warmbox.core").module_path():match("^(.*)/warmbox/[^/]*$")
      local tmp = os.tmpname()
      local p = io.popen(string.format("cd %s && WARMBOX_BUILD_DIR=%s exec lua5.4 bin/warmbox --api-url %s "
        .. "--api-key %s gc --retention 7d >%s.out 2>%s.err </dev/null & echo $!", wbd.sh_quote(ROOT),
        wbd.sh_quote(build), srv2.url, srv2.api_key, tmp, tmp))
      local pid = tonumber(p:read("l"))
      p:close()
      assert(wbd.eventually(function()
        return (wbd.stats(srv2).requests["DELETE /sandboxes/{id}"] or 0) >= 700 -- a few pages in
      end, 30))
      os.execute("kill -INT " .. pid)
      assert(wbd.eventually(function() return not wbd.alive(pid) end, 30))
      local err = wbd.read_all(tmp .. ".err")
      local out = wbd.read_all(tmp .. ".out")
      os.remove(tmp .. ".err")
      os.remove(tmp .. ".out")
      os.remove(tmp)
      local token = err:match("resume with %-%-next%-token (%S+)")
      assert(token, "no resume token in: " .. err .. out)
      local first = wbd.stats(srv2).requests["DELETE /sandboxes/{id}"]
      assert.is_true(first < 3000, "the pass was not interrupted")
      local code, out2, err2 = warmbox("--api-url " .. srv2.url .. " --api-key " .. srv2.api_key
        .. " gc --retention 7d --concurrency 32 --next-token " .. wbd.sh_quote(token))
      assert.equal(0, code, err2)
      local killed = tonumber(out2:match("killed (%d+),"))
      -- every old sandbox is gone, none was sent twice
      assert.equal(3000, wbd.stats(srv2).requests["DELETE /sandboxes/{id}"])
      assert.equal(3000, first + killed)
      local left = 0
      for it in require("warmbox.e2b").new{ api_key = srv2.api_key, api_url = srv2.url }:list() do
        if it then left = left + 1 end
      end
      assert.equal(0, left)
    end)
    srv2:stop()
    assert(ok, e)
  end)
end)
