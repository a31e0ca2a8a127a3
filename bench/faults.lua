-- Runs under faults: for each route a run touches and each fault, N cells
-- (default 20) against one warmboxd with its fault knobs, counting how many
-- times each cell really executed (the cell appends a mark to a file in its
-- sandbox before anything else; the bench reads the files from the host).
--
--   lua5.4 bench/faults.lua [CELLS] [ROUTE]     (after scripts/setup)
--
-- ROUTE "intermediary": only the rows of a proxy in front of the data plane
-- (spec/helpers/after_proxy.py) that answers 502/503/429/404 after forwarding
-- the execute, before forwarding it, or at once with a late copy forwarded
-- 0.5 s later; "stale holder": only the rows of a run whose lock expired
-- under it (its execute held 1.5 s by warmboxd, the lock's exptime 0.5 s)
-- while a second run of the conversation took the lock over, with the
-- overlaps (warmboxd's count of two executes of one sandbox at once, plus
-- stale cells that ran after the later run's): only 0 is right. Both kinds
-- of rows run python and bash cells (bash: the guard of outputs.cell_guarded).
--
-- Prints one row per route x fault: ok, errors by code (and, for ok runs whose
-- output files could not be read, "files_error CODE"), how many cells
-- executed 0 and 1 times (anything else is a broken at-most-once promise and
-- makes the script exit 1, as does an ok cell that did not execute exactly
-- once), and whether the sandbox and its kernel state survived (same sandbox,
-- its counter equal to the number of executions; "-" for create, where every
-- cell is a new conversation).
--
-- The fault hits the route's next request only (count 1), so idempotent calls
-- that are retried recover; "delay" holds the request past the client's
-- timeout (request_timeout 2 s; for the execute, the run's timeout + grace).
local env = dofile(((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/env.lua")

local warmbox = require "warmbox"
local sandbox_mod = require "warmbox.e2b.sandbox"
local wbd = require "spec.helpers.warmboxd"

local CELLS = tonumber(arg and arg[1]) or 20
local ONLY = arg and arg[2]
local REQUEST_TIMEOUT = 2
local RUN_TIMEOUT = 2
sandbox_mod.EXEC_GRACE = 1 -- the execute's client-side deadline: its own timeout + 1 s

local ROUTES = {
  { "list", "GET /v2/sandboxes" },
  { "connect", "POST /sandboxes/{id}/connect" },
  { "lease", "POST /sandboxes/{id}/timeout" },
  { "create", "POST /sandboxes" },
  { "execute", "interp POST /execute" },
  { "output read", "envd GET /files" },
}
local FAULTS = {
  { "500", { status = 500 } },
  { "502", { status = 502 } },
  { "503", { status = 503 } },
  { "429+RA", { status = 429, headers = { ["Retry-After"] = "1" } } },
  { "drop", { drop = true } },
  { "delay", { delay_ms = (REQUEST_TIMEOUT + 0.5) * 1000 } },
}

local srv = wbd.start{}
local lockdir = os.tmpname()
os.remove(lockdir)
local wb = assert(warmbox.new{ api_url = srv.url, sandbox_url = srv.url, api_key = srv.api_key,
  lock = { backend = "file", dir = lockdir }, exec_timeout = 60, idle_timeout = 60,
  request_timeout = REQUEST_TIMEOUT })

-- mark -> how many times it was written, over every sandbox's runs.log.
local function executions()
  local counts = {}
  local p = io.popen("cat " .. wbd.sh_quote(srv:ns_path(srv.dir .. "/data")) .. "/*/home/runs.log 2>/dev/null")
  for line in p:lines() do counts[line] = (counts[line] or 0) + 1 end
  p:close()
  return counts
end

local BIG = "open('/home/user/output/big.bin', 'wb').write(b'z' * 600000)\n"
local seq = 0
-- A cell of `lang` (python by default) that appends its mark, then counts
-- itself in the kernel's `n`. → code, mark
local function cell(big, lang)
  seq = seq + 1
  local mark = "cell-" .. seq
  if lang == "bash" then return "echo " .. mark .. " >> /home/user/runs.log\nn=$(( ${n:-0} + 1 ))\n", mark end
  return "open('/home/user/runs.log', 'a').write('" .. mark .. "\\n')\nn = globals().get('n', 0) + 1\n"
    .. (big and BIG or ""), mark
end

-- The kernel's counter `n` of `lang` set to 0 → the sandbox id; read → sandbox id, n.
local function counter_zero(s, lang)
  return assert(s:run(lang == "bash" and "n=0" or "n = 0", { language = lang })).sandbox_id
end
local function counter(s, lang)
  local r = s:run(lang == "bash" and 'echo "$n"' or "n", { language = lang })
  if not r then return nil end
  local text = lang == "bash" and r.stdout or (r.results[1] and r.results[1].text)
  return r.sandbox_id, tonumber(text)
end

local function row(route, rname, fault, fname)
  local is_create = rname == "create"
  local s, id
  if not is_create then
    s = wb:session("bench-faults:" .. rname .. ":" .. fname)
    id = assert(s:run("n = 0")).sandbox_id
    assert(s:run("n")) -- the kernel has the output hooks
  end
  local ok, codes, marks, oks = 0, {}, {}, {}
  for i = 1, CELLS do
    local sess = s
    if is_create then sess = wb:session("bench-faults:create:" .. fname .. ":" .. i) end
    if rname == "list" or rname == "connect" or rname == "lease" then assert(sess:forget()) end
    local code, mark = cell(rname == "output read")
    marks[i] = mark
    local f = { route = route, count = 1 }
    for k, v in pairs(fault) do f[k] = v end
    if f.delay_ms and rname == "execute" then f.delay_ms = (RUN_TIMEOUT + sandbox_mod.EXEC_GRACE + 0.5) * 1000 end
    srv:fault(f)
    local r, _, ecode = sess:run(code, { timeout = RUN_TIMEOUT })
    srv:clear_faults()
    if r then
      ok = ok + 1
      oks[i] = true
      if r.files_error then
        local k = "files_error " .. tostring(r.files_error[2])
        codes[k] = (codes[k] or 0) + 1
      end
    else
      codes[ecode] = (codes[ecode] or 0) + 1
    end
  end
  local counts = executions()
  local hist, bad, total = {}, false, 0
  for i, mark in ipairs(marks) do
    local n = counts[mark] or 0
    hist[n] = (hist[n] or 0) + 1
    total = total + n
    if n > 1 or (oks[i] and n ~= 1) then bad = true end
  end
  local survived = "-"
  if not is_create then
    local r = s:run("n")
    local n = r and r.results[1] and tonumber(r.results[1].text)
    survived = (r and r.sandbox_id == id and n == total) and "yes" or
      ("NO (" .. (r and (r.sandbox_id == id and "n=" .. tostring(n) .. " want " .. total or "new sandbox")
        or "run failed") .. ")")
    if survived ~= "yes" then bad = true end
  end
  local cl = {}
  for c, n in pairs(codes) do cl[#cl + 1] = c .. " " .. n end
  table.sort(cl)
  local hl = {}
  for n, k in pairs(hist) do hl[#hl + 1] = n .. "x:" .. k end
  table.sort(hl)
  return { rname, fname, ok, table.concat(cl, ", "), table.concat(hl, " "), survived }, bad
end

local rows, any_bad = {}, false
local t0 = os.time()
if ONLY == "intermediary" or ONLY == "stale holder" then ROUTES = {} end
for _, r in ipairs(ROUTES) do
  if not ONLY or ONLY == r[1] then
    for _, f in ipairs(FAULTS) do
      local line, bad = row(r[2], r[1], f[2], f[1])
      rows[#rows + 1] = line
      any_bad = any_bad or bad
      io.stderr:write(table.concat(line, " | "), "\n")
    end
  end
end

-- executions per cell: "0x:n 1x:m" (and whether any ran twice).
local function histogram(counts, marks)
  local hist, twice = {}, false
  for _, mark in ipairs(marks) do
    local n = counts[mark] or 0
    hist[n] = (hist[n] or 0) + 1
    if n > 1 then twice = true end
  end
  local hl = {}
  for n, k in pairs(hist) do hl[#hl + 1] = n .. "x:" .. k end
  table.sort(hl)
  return table.concat(hl, " "), twice
end

local function code_list(codes)
  local cl = {}
  for c, n in pairs(codes) do cl[#cl + 1] = c .. " " .. n end
  table.sort(cl)
  return table.concat(cl, ", ")
end

-- One row of the intermediary: CELLS cells of `lang`, the execute answered `st` as `mode` says.
local function proxy_row(pwb, proxy, lang, mode, st)
  local s = pwb:session("bench-faults:proxy:" .. lang .. ":" .. mode .. ":" .. st)
  local id = counter_zero(s, lang)
  local ok, codes, marks, oks = 0, {}, {}, {}
  for i = 1, CELLS do
    local code, mark = cell(false, lang)
    marks[i] = mark
    local done = proxy:stats().late_done
    proxy:plan{ { mode = mode, status = st, delay = 0.5 } }
    local r, _, ecode = s:run(code, { timeout = RUN_TIMEOUT, language = lang })
    if r then ok, oks[i] = ok + 1, true else codes[ecode] = (codes[ecode] or 0) + 1 end
    if mode == "late" then
      while proxy:stats().late_done <= done do wbd.sleep(0.05) end
    end
  end
  local counts = executions()
  local hist, twice = histogram(counts, marks)
  local total, bad = 0, twice
  for i, mark in ipairs(marks) do
    total = total + (counts[mark] or 0)
    if oks[i] and (counts[mark] or 0) ~= 1 then bad = true end
  end
  local rid, n = counter(s, lang)
  local survived = (rid == id and n == total) and "yes" or "NO"
  local line = { "execute via intermediary (" .. lang .. ")", st .. " " .. mode
    .. (mode == "late" and " (copy 0.5 s later)" or " forwarding"), ok, code_list(codes), hist, survived }
  rows[#rows + 1] = line
  any_bad = any_bad or bad or survived ~= "yes"
  io.stderr:write(table.concat(line, " | "), "\n")
end

-- Rows of the intermediary: a proxy that answers the execute itself.
local function proxy_rows()
  local proxy = require("spec.helpers.after_proxy").start(srv.url)
  local pwb = assert(warmbox.new{ api_url = srv.url, sandbox_url = proxy.url, api_key = srv.api_key,
    lock = { backend = "file", dir = lockdir }, exec_timeout = 60, idle_timeout = 60,
    request_timeout = REQUEST_TIMEOUT })
  for _, lang in ipairs({ "python", "bash" }) do
    for _, mode in ipairs({ "after", "before", "late" }) do
      for _, st in ipairs({ 502, 503, 429, 404 }) do proxy_row(pwb, proxy, lang, mode, st) end
    end
  end
  pwb:close()
  proxy:stop()
end

-- Rows of a stale holder: its lock (exptime 0.5 s) expires while its execute
-- is held 1.5 s; a second run takes the lock over and runs first.
local function stale_rows()
  local n_iter = math.min(CELLS, 10)
  for _, case in ipairs({ { "memory", "python" }, { "file", "python" }, { "memory", "bash" }, { "file", "bash" } }) do
    local backend, lang = case[1], case[2]
    local lock = { backend = backend, exptime = 0.5, dir = backend == "file" and lockdir or nil }
    local swb = assert(warmbox.new{ api_url = srv.url, sandbox_url = srv.url, api_key = srv.api_key,
      lock = lock, exec_timeout = 60, idle_timeout = 60, request_timeout = REQUEST_TIMEOUT })
    local key = "bench-faults:stale:" .. backend .. ":" .. lang
    counter_zero(swb:session(key), lang)
    local ro = { timeout = RUN_TIMEOUT, language = lang }
    local ok, codes, marks = 0, {}, {}
    local overlaps = 0
    local before = (srv:stats().counters or {}).exec_overlap or 0
    for i = 1, n_iter do
      local code_a, mark_a = cell(false, lang)
      local code_b, mark_b = cell(false, lang)
      marks[#marks + 1], marks[#marks + 2] = mark_a, mark_b
      srv:fault{ route = "interp POST /execute", count = 1, delay_ms = 1500 }
      local a, b
      swb:spawn(function() a = table.pack(swb:session(key):run(code_a, ro)) end)
      swb:spawn(function() b = table.pack(swb:session(key):run(code_b, ro)) end)
      assert(swb:loop())
      for _, res in ipairs({ a, b }) do
        if res[1] then ok = ok + 1 else codes[res[3]] = (codes[res[3]] or 0) + 1 end
      end
      local counts = executions()
      if (counts[mark_a] or 0) > 0 and (counts[mark_b] or 0) > 0 then overlaps = overlaps + 1 end
      if i == n_iter then
        local hist, twice = histogram(counts, marks)
        overlaps = overlaps + ((srv:stats().counters or {}).exec_overlap or 0) - before
        local line = { "stale holder (" .. backend .. " lock, " .. lang .. ")", "lock expired under a held execute",
          ok .. "/" .. 2 * n_iter, code_list(codes), hist .. ", overlaps " .. ("%d"):format(overlaps), "-" }
        rows[#rows + 1] = line
        any_bad = any_bad or twice or overlaps > 0
        io.stderr:write(table.concat(line, " | "), "\n")
      end
    end
    swb:close()
  end
end

if not ONLY or ONLY == "intermediary" then proxy_rows() end
if not ONLY or ONLY == "stale holder" then stale_rows() end

local head = { "route", "fault", "ok", "errors by code", "executions per cell", "state survived" }
print(("%d cells per row; request_timeout %gs, run timeout %gs; %ds in all"):format(CELLS, REQUEST_TIMEOUT,
  RUN_TIMEOUT, os.time() - t0))
env.print_table(head, rows)

wb:close()
srv:stop()
os.execute("rm -rf " .. wbd.sh_quote(lockdir))
if any_bad then
  print("FAILED: a cell executed more than once, an ok cell not exactly once, state was lost, or runs overlapped")
  os.exit(1)
end
