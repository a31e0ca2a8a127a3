-- warmbox.gc against a real warmboxd: seeded tagged sandboxes are aged via
-- the policy's max_age (and the GC clock), old ones are killed through the
-- control plane, young ones, busy sessions and sandboxes without our tag
-- are left alone. Also gc.release and a demote of a real sandbox.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local gc = require "warmbox.gc"
local lock = require "warmbox.lock"

local TAG = "warmboxSessionId"
local session = require "warmbox.session"
-- real warmbox tag values (orphan tags are kept by the default policy)
local T = setmetatable({}, { __index = function(t, k)
  local v = session.tag_value("ws:" .. k, {})
  rawset(t, k, v)
  return v
end })

describe("warmbox.gc against warmboxd", function()
  local srv, client, dir, e2b

  lazy_setup(function()
    e2b = require "warmbox.e2b"
    srv = wbd.start{ args = { "--rtt-ms", "0" } }
    client = e2b.new{ api_key = srv.api_key, api_url = srv.url, sandbox_url = srv.url }
    dir = os.tmpname()
    os.remove(dir)
  end)
  lazy_teardown(function()
    if client then client:close() end
    if srv then srv:stop() end
    if dir then os.execute("rm -rf '" .. dir .. "'") end
  end)

  local function seed(n, state, metadata)
    local r = http.api(srv, "POST", "/_warmboxd/seed", { count = n, state = state, metadata = metadata })
    assert.equal(200, r.status, r.body)
    assert.equal(n, r.json.created)
  end

  local function listed()
    local by_tag = {}
    for item, err in client:list{ state = { "running", "paused" }, limit = 100 } do
      assert(item, err)
      local tv = item.metadata and item.metadata[TAG] or "-"
      by_tag[tv] = by_tag[tv] or {}
      table.insert(by_tag[tv], item)
    end
    return by_tag
  end

  local function stats()
    return http.request{ url = srv.url .. "/_warmboxd/stats" }.json
  end

  it("kills what is older than max_age since its last activity, nothing else", function()
    -- old: paused first
    seed(3, "paused", { [TAG] = T.old })
    seed(2, "paused", { [TAG] = T["old-but-busy"] })
    seed(2, "paused", { otherTag = "old" })
    seed(2, "paused", {})
    local first = listed()
    local old_end = assert(gc.parse_time(first[T.old][1].end_at))
    os.execute("sleep 2.2")
    -- young: paused and running 2+ s later
    seed(2, "paused", { [TAG] = T.young })
    seed(1, "running", { [TAG] = T["young-running"] })
    -- GC "now" is one max_age after the old ones' pause, plus a second.
    local max_age = 3600
    local clock = function() return old_end + 1 + max_age end
    local lock_opts = { backend = "file", dir = dir }
    local holder = lock.new(lock_opts)
    assert(holder:lock(T["old-but-busy"]))

    local dry = assert(gc.run{ client = client, tag = TAG, lock = lock_opts, clock = clock, max_age = max_age,
                               dry_run = true, concurrency = 2 })
    assert.equal(5, dry.killed)
    assert.equal(12, dry.listed)
    assert.equal(8, dry.tagged)
    assert.equal(0, (stats().requests["DELETE /sandboxes/{id}"] or 0))

    local report = assert(gc.run{ client = client, tag = TAG, lock = lock_opts, clock = clock, max_age = max_age,
                                  concurrency = 2 })
    holder:unlock()
    assert.same({}, report.errors)
    assert.equal(12, report.listed)
    assert.equal(8, report.tagged)
    assert.equal(3, report.killed)
    assert.equal(2, report.busy)
    assert.equal(3, report.kept)
    assert.equal(3, stats().requests["DELETE /sandboxes/{id}"])

    local after = listed()
    assert.is_nil(after[T.old])
    assert.equal(2, #after[T["old-but-busy"]])
    assert.equal(2, #after[T.young])
    assert.equal(1, #after[T["young-running"]])
    assert.equal(4, #after["-"])
  end)

  it("release kills exactly one session's sandboxes", function()
    seed(2, "paused", { [TAG] = T["conv-1"] })
    seed(1, "running", { [TAG] = T["conv-10"] })
    local n = assert(gc.release{ client = client, tag = TAG, tag_value = T["conv-1"],
                                 lock = { backend = "file", dir = dir } })
    assert.equal(2, n)
    local after = listed()
    assert.is_nil(after[T["conv-1"]])
    assert.equal(1, #after[T["conv-10"]])
  end)

  it("demotes a real running sandbox to a filesystem-only snapshot", function()
    local sb, err = client:create{ template = "base", timeout = 120, metadata = { [TAG] = "demote-me" } }
    assert(sb, err)
    local report = assert(gc.run{ client = client, tag = TAG, lock = { backend = "file", dir = dir },
      policy = { gc = function(item) return item.sandbox_id == sb.sandbox_id and "demote" or "keep" end } })
    assert.same({}, report.errors)
    assert.equal(1, report.demoted)
    local info = assert(client:info(sb.sandbox_id))
    assert.equal("paused", info.state)
    client:kill(sb.sandbox_id)
  end)
end)
