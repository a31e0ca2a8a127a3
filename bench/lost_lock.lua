-- A conversation's lock lost while its cell runs, and a create answered
-- after it was forwarded: against one warmboxd (and a redis-server), N rounds
-- per row (default 3):
--
--   lua5.4 bench/lost_lock.lua [ROUNDS]     (after scripts/setup)
--
-- "redis restart": a holder process (Redis lock, ttl 1 s) runs cell A; once A
-- started, Redis is restarted without persistence and a later run of the
-- conversation (this process) sends cell B. "holder cut off": the same with
-- a file lock (exptime 1 s) whose holder is stopped (SIGSTOP) past it, then
-- continued once B's run returned. A and B alternate languages (python then
-- bash, bash then python, python then python): A waits up to 3 s for B to
-- start, so a sandbox that lets B in while A runs shows it in the ledger both
-- cells write ("start X", "end X"). The "timeout 1 s" row gives B's run a
-- timeout shorter than A's wait: the sandbox holds B's cell, then refuses it
-- (HELD: B's cell never runs, 0 executions; python then python: B waits for
-- the kernel A runs in and runs after it). "create after forwarding": an
-- intermediary (spec/helpers/after_proxy.py) forwards the create, then
-- answers 503 (or 429): the client sends it again; "create sent twice": it
-- forwards the create twice and answers the second (the client saw one answer);
-- "a copy forwarded after the run": the copy is held until the run returned
-- (past the listing after it); one GC pass (warmbox:gc) runs before the count.
--
-- Prints per row: executions per cell ("0x:n 1x:m"; only 0 or 1 is right),
-- overlapping executions (a cell started while another ran: only 0), runs
-- reported refused (FENCED) whose cell ran (only 0), orphans left (tagged
-- sandboxes of the conversation besides the one it uses, after its runs:
-- only 0). Exits 1 when any is wrong.
local env = dofile(((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/env.lua")

local warmbox = require "warmbox"
local wbd = require "spec.helpers.warmboxd"
local redis_helper = require "spec.helpers.redis"
local after_proxy = require "spec.helpers.after_proxy"
local ledger_helper = require "spec.helpers.ledger"

local ROUNDS = tonumber(arg and arg[1]) or 3
local q = wbd.sh_quote

local srv = wbd.start{}
local redis = redis_helper.available() and redis_helper.start() or nil
local lockdir = os.tmpname()
os.remove(lockdir)

local function lock_src(backend)
  if backend == "redis" then
    return ("{ backend = 'redis', redis = { host = %q, port = %d }, ttl = 1, timeout = 60 }"):format(redis.host,
      redis.port)
  end
  return ("{ backend = 'file', dir = %q, exptime = 1, timeout = 60 }"):format(lockdir)
end

local function new_wb(backend, api_url)
  local lock = assert(load("return " .. lock_src(backend)))()
  return assert(warmbox.new{ api_url = api_url or srv.url, sandbox_url = srv.url, api_key = srv.api_key,
    lock = lock, exec_timeout = 60, idle_timeout = 60 })
end

-- A holder process: one run of `code`; writes "<ok|code>" to `out`. → pid
local function holder(backend, key, code, lang, out)
  local script = ([[
    package.path = %q
    package.cpath = %q
    local wb = assert(require("warmbox").new{ api_url = %q, sandbox_url = %q, api_key = %q,
      lock = %s, exec_timeout = 60, idle_timeout = 60 })
    local r, _, code = wb:session(%q):run(%q, { language = %q })
    local f = assert(io.open(%q, "w"))
    f:write(r and "ok" or tostring(code), "\n")
    f:close()
    wb:close()
  ]]):format(package.path, package.cpath, srv.url, srv.url, srv.api_key, lock_src(backend), key, code, lang, out)
  local p = io.popen("lua5.4 -e " .. q(script) .. " >/dev/null 2>&1 & echo $!")
  local pid = tonumber(p:read("l"))
  p:close()
  return pid
end

local function ledger(id) return ledger_helper.read(srv, id) end
-- A cell writing its start and end to the ledger; with `until_mark`, it waits
-- (up to 3 s) for that cell to start. → code, mark
local function cell(lang, until_mark) return ledger_helper.cell(lang, until_mark, 3) end

-- Counts over a ledger: executions per mark, overlaps (a start while another cell ran).
local function read_ledger(l, execs)
  local open, overlaps = nil, 0
  for _, line in ipairs(l) do
    local what, mark = line:match("^(%S+) (%S+)$")
    if what == "start" then
      execs[mark] = (execs[mark] or 0) + 1
      if open then overlaps = overlaps + 1 end
      open = mark
    elseif open == mark then
      open = nil
    end
  end
  return overlaps
end

local function tagged(wb, s)
  local items = assert(wb.client:list_all{ state = { "running", "paused" }, metadata = { [s.tag] = s.tag_value } })
  return #items
end

local LANGS = { { "python", "bash" }, { "bash", "python" }, { "python", "python" } }

-- One row of lost locks: `how` is "redis restart" or "holder cut off";
-- `b_timeout`: the later run's timeout (1 s: shorter than the older cell,
-- which waits 3 s for it, so the sandbox holds the later cell, then refuses it).
local function lost_row(how, b_timeout)
  local backend = how == "redis restart" and "redis" or "file"
  local wb = new_wb(backend)
  local row = { execs = {}, marks = {}, overlaps = 0, refused_ran = 0, orphans = 0, codes = {} }
  for i = 1, ROUNDS do
    local langs = LANGS[(i - 1) % #LANGS + 1]
    local key = "bench-lost:" .. how .. ":" .. i
    local s = wb:session(key)
    local id = assert(s:run(langs[1] == "bash" and "true" or "1", { language = langs[1] })).sandbox_id
    local code_b, mark_b = cell(langs[2])
    local code_a, mark_a = cell(langs[1], mark_b)
    row.marks[#row.marks + 1], row.marks[#row.marks + 2] = mark_a, mark_b
    local out = os.tmpname()
    local pid = holder(backend, key, code_a, langs[1], out)
    wbd.eventually(function()
      for _, line in ipairs(ledger(id)) do if line == "start " .. mark_a then return true end end
    end, 30)
    if backend == "redis" then redis:restart() else os.execute("kill -STOP " .. pid) end
    local b = table.pack(s:run(code_b, { language = langs[2], timeout = b_timeout }))
    if b[3] == "LOCK" then b = table.pack(s:run(code_b, { language = langs[2], timeout = b_timeout })) end
    os.execute("kill -CONT " .. pid)
    local a
    wbd.eventually(function()
      local f = io.open(out)
      a = f and f:read("l")
      if f then f:close() end
      return a
    end, 60)
    os.remove(out)
    local execs = {}
    row.overlaps = row.overlaps + read_ledger(ledger(id), execs)
    for m, n in pairs(execs) do row.execs[m] = (row.execs[m] or 0) + n end
    if a == "FENCED" and (execs[mark_a] or 0) > 0 then row.refused_ran = row.refused_ran + 1 end
    local refused = b[3] == "FENCED" or b[3] == "HELD" or b[3] == "CONFLICT"
    if not b[1] and refused and (execs[mark_b] or 0) > 0 then row.refused_ran = row.refused_ran + 1 end
    row.codes[a] = (row.codes[a] or 0) + 1
    local bc = b[1] and "ok" or tostring(b[3])
    row.codes[bc] = (row.codes[bc] or 0) + 1
    row.orphans = row.orphans + tagged(wb, s) - 1
  end
  wb:close()
  return row
end

-- One row of creates an intermediary answered `status` after forwarding
-- (`status` "twice": forwarded twice, the second answer given; "late": answered,
-- then forwarded again once the run returned: one GC pass, then counted).
local function create_row(status)
  local proxy = after_proxy.start(srv.url)
  local wb = new_wb("file", proxy.url)
  local row = { execs = {}, marks = {}, overlaps = 0, refused_ran = 0, orphans = 0, codes = {} }
  for i = 1, ROUNDS do
    local s = wb:session("bench-lost:create:" .. status .. ":" .. i)
    local late = proxy:stats().late_done
    proxy:plan{ create = { (status == "twice" or status == "late") and { mode = status, held = true }
      or { mode = "after", status = status, headers = { ["Retry-After"] = "0" } } } }
    local code, mark = cell("python")
    row.marks[#row.marks + 1] = mark
    local r, _, ecode = s:run(code)
    if status == "late" then
      proxy:release()
      wbd.eventually(function() return proxy:stats().late_done > late end, 60)
      assert(wb:gc{})
    end
    local c = r and "ok" or tostring(ecode)
    row.codes[c] = (row.codes[c] or 0) + 1
    local items = assert(wb.client:list_all{ state = { "running", "paused" }, metadata = { [s.tag] = s.tag_value } })
    for _, it in ipairs(items) do read_ledger(ledger(it.sandbox_id), row.execs) end
    row.orphans = row.orphans + #items - (r and 1 or 0)
  end
  wb:close()
  proxy:stop()
  return row
end

local rows, bad = {}, false
local function add(name, fault, row)
  local hist, twice = {}, false
  for _, m in ipairs(row.marks) do
    local n = row.execs[m] or 0
    hist[n] = (hist[n] or 0) + 1
    if n > 1 then twice = true end
  end
  local hl, cl = {}, {}
  for n, k in pairs(hist) do hl[#hl + 1] = n .. "x:" .. k end
  for c, n in pairs(row.codes) do cl[#cl + 1] = c .. " " .. n end
  table.sort(hl)
  table.sort(cl)
  rows[#rows + 1] = { name, fault, table.concat(cl, ", "), table.concat(hl, " "), row.overlaps, row.refused_ran,
    row.orphans }
  bad = bad or twice or row.overlaps > 0 or row.refused_ran > 0 or row.orphans > 0
  io.stderr:write(table.concat(rows[#rows], " | "), "\n")
end

local t0 = os.time()
if redis then add("lost lock", "redis restart mid-cell", lost_row("redis restart")) end
add("lost lock", "holder cut off past its expiry", lost_row("holder cut off"))
add("lost lock", "holder cut off, later run's timeout 1 s", lost_row("holder cut off", 1))
add("create", "503 after forwarding", create_row(503))
add("create", "429 after forwarding", create_row(429))
add("create", "sent twice by an intermediary", create_row("twice"))
add("create", "a copy forwarded after the run; a GC pass", create_row("late"))

local head = { "case", "fault", "runs by code", "executions per cell", "overlapping executions",
  "refused whose cell ran", "orphans left" }
print(("%d rounds per row (runs: the holder's and the later run's, or the create's); %ds in all"):format(ROUNDS,
  os.time() - t0))
env.print_table(head, rows)

srv:stop()
if redis then redis:stop() end
os.execute("rm -rf " .. q(lockdir))
if env and bad then
  print("FAILED: a cell ran twice, two cells overlapped, a run whose cell ran was reported refused, or an orphan "
    .. "was left")
  os.exit(1)
end
