--- The `warmbox` command.
--
--   warmbox [options] run --session KEY [--language L] [--timeout S] [--file NAME=PATH]...
--                         [--env K=V]... [--actor A] [--out DIR] [--json] [--start] [CODE | -]
--   warmbox [options] prewarm --session KEY [--env K=V]... [--actor A] [--within S] [--start]
--   warmbox [options] server start|stop|status
--   warmbox [options] doctor [--embedded | --e2b]
--   warmbox [options] release KEY
--   warmbox [options] checkpoints --session KEY [--env K=V]... [--actor A] [--json] [--delete ID]
--   warmbox [options] sessions [--tenant T] [--state running|paused] [--json]
--   warmbox [options] gc [--dry-run] [--json] [--policy FILE] [--retention 7d] [--max-kills N]
--                        [--concurrency N] [--next-token T] [--pages N]
--   warmbox [options] simulate [--trace FILE | --sessions N --turns A-B --gap S --seed N]
--                              [--idle-timeout S,S,S] [--policy FILE | --policies all]
--                              [--chart out.svg] [--csv rows.csv]
--   warmbox demo
--   warmbox [options] smoke
--   warmbox --version
--
-- Options: --api-url URL, --api-key KEY (default $E2B_API_KEY), --template T,
-- --exec-timeout S, --idle-timeout S, --tag NAME, --lock file|redis|memory,
-- --policy PATH, --warmboxd PATH. Without an API key and without --api-url, the
-- per-user server of `warmbox server start` is used when it runs (said on stderr);
-- else an embedded warmboxd is started for the command (its sandboxes end with it).
-- `-q` drops warmbox's own notes from stderr (errors stay). Exit status: 0 ok,
-- 1 the command ran and its result is negative (run: the cell raised; gc: an
-- action failed; doctor: a check failed), 2 warmbox failed (bad command line,
-- backend, transport), 3 `server status`: not running.
-- @module warmbox.cli

local tostring, tonumber, ipairs, pairs, type, pcall, next = tostring, tonumber, ipairs, pairs, type, pcall, next
local string_format, table_concat = string.format, table.concat

local util = require "warmbox.util"
local read_file, sh_quote = util.read_file, util.sh_quote

local _M = {}

local USAGE = [[
usage: warmbox [options] <command> [args]

commands:
  run --session KEY [CODE | -]   run code in the session's sandbox (code from stdin with - or no CODE)
      --language L                 python (default), bash, javascript, ...
      --timeout S                  run timeout in seconds
      --file NAME=PATH             upload PATH as /home/user/NAME (repeatable)
      --env K=V                    env var baked into the sandbox (repeatable; part of the session fingerprint)
      --actor A                    who acts (part of the session fingerprint)
      --out DIR                    save the files the run left in /home/user/output to DIR
      --json                       print one JSON object (stdout, stderr, error, results, files, timings)
      --start                      start the local server first when none runs (asked on a terminal)
  prewarm --session KEY          get the session's sandbox ready for a run that is coming (resume it,
                                 or create it and start its kernel); nothing when it is warm
      --within S                   the run comes within S seconds (default --exec-timeout)
      --env K=V, --actor A         as for run (the session's fingerprint)
      --start                      as for run
  server start|stop|status       a warmboxd in the background for this user: without an E2B key
                                 every command uses it, and sessions keep their kernels between commands
  doctor [--embedded | --e2b]    check what the embedded server and E2B need, with what to install or set
  release KEY                    kill every sandbox of the session KEY, delete its checkpoints
  checkpoints --session KEY      list the session's checkpoints (E2B snapshots), oldest first
      --env K=V, --actor A         as for run (the session's fingerprint)
      --json                       one JSON array
      --delete ID                  delete one of them
  sessions                       list sessions, their sandboxes, last activity and age
      --tenant T                   only this tenant's (the key before the first ':', or the policy's tenant hook)
      --state S                    only running or paused ones
      --json                       one JSON array
  gc                             garbage-collect tagged sandboxes under the GC policy, page by page
      --dry-run                    decide and report, act on nothing
      --json                       one JSON report on stdout: {"actions": [...], "killed": n, ...}
      --policy FILE                the GC policy for this pass (a Lua file; see README)
      --retention D                kill after D of inactivity (units s, m, h, d: 7d; default 1d)
      --max-kills N                at most N kills this pass
      --concurrency N              sandboxes acted on at once (default 8)
      --next-token T, --pages N    resume a pass at a page / stop after N pages
                                   (a progress line goes to stderr when it is a terminal;
                                   the exit status is 1 when any action failed)
  simulate                       replay a trace or a generated workload against a virtual-time model of E2B
      --trace FILE                 JSON lines {"t": s, "session": "key", "duration": s}, or CSV (FILE.csv)
      --sessions N --turns A-B     a generated workload (also --gap S, --duration S|A-B, --think S,
                                   --span S, --seed N, --arrival uniform|poisson, --abandon P, --lead S:
                                   a turn's start to its run, --no-run P: turns without a run); a value
                                   may be a distribution: lognormal:MEDIAN:SIGMA, pareto:ALPHA:MIN, exp:MEAN
      --prewarm on|off|off,on      prewarm each turn's sandbox at its start (off,on: one row each)
      --exact                      drive the real warmbox.session code (slower; the cap and --rate need it)
      --idle-timeout S[,S...]      one row per value (also --exec-timeout, --max-age, --gc-every)
      --policies all|P,P...        one row per built-in policy: reference, no-reuse, keep-alive, default
      --tail S                     seconds simulated after the last run (default lease + max-age + gc-every)
      --rtt-ms, --create-ms, --kernel-ms, --resume-ms, --max-length-hours N   the model
      --max-running N, --rate N    E2B's concurrency cap (429) and requests/s limit (0: none)
      --retry-after S              the Retry-After of the cap's 429 (default 1; 0: none, the client backs off)
      --paused-price USD           storage price per paused sandbox-hour (default 0: E2B bills none)
      --snapshot-ms MS, --snapshot-gb N, --snapshot-price USD   checkpoints (a policy's checkpoint hook):
                                   time to take one (2000), GiB of disk stored beside the RAM (10), $ per
                                   GiB-month (default 0: E2B publishes no snapshot price); exact path
      --chart FILE                 write a chart (cost vs p95 added latency; --chart-x/--chart-y METRIC):
                                   gnuplot when installed, else the built-in SVG
      --csv FILE                   write the rows as CSV
  demo                           a short conversation on an embedded warmboxd, with timings
  smoke                          a short self-cleaning live check of the selected backend (E2B or warmboxd)

options:
  --api-url URL      E2B API URL (default $E2B_API_URL); with --api-key
  --sandbox-url URL  data-plane URL (default $E2B_SANDBOX_URL; a loopback --api-url is a warmboxd: the same URL)
  --api-key KEY      E2B API key (default $E2B_API_KEY); none: the local server (warmbox server start)
                     when it runs, else an embedded warmboxd for this command
  --template T       sandbox template (default code-interpreter-v1)
  --exec-timeout S   seconds a run may take (default 300)
  --idle-timeout S   seconds of quiet before a sandbox pauses (default 300)
  --tag NAME         metadata key of the session tag (default warmboxSessionId)
  --lock BACKEND     file (default), redis or memory
  --policy PATH      a policy file (Lua)
  --warmboxd PATH    the warmboxd binary for the embedded server
  -q, --quiet        no notes from warmbox on stderr (which server, saved files); errors stay
  -h, --help         this help; COMMAND --help: that command's
  --version          print the version

exit status: 0 ok; 1 the command ran and its result is negative (run: the cell raised,
gc: an action failed, doctor: a check failed); 2 warmbox failed (bad command line,
backend or transport error); 3 server status: not running
]]

-- `COMMAND --help`: the command's block of USAGE (its line and the lines
-- indented under it), read from USAGE so that the two never disagree.
local function usage_of(cmd)
  local block, inside = {}, false
  for line in USAGE:gmatch("([^\n]*)\n") do
    local name = line:match("^  (%l+)")
    if name or line == "" or line == "options:" then inside = name == cmd end
    -- the command's own description wraps at column 34 (its options deeper)
    if inside then block[#block + 1] = line:gsub("^" .. (" "):rep(33) .. "(%S)", "  %1") end
  end
  if #block == 0 then return nil end
  block[1] = "usage: warmbox [options] " .. block[1]:gsub("^%s+", ""):gsub("%s%s+.*$", "")
    .. "\n " .. block[1]:gsub("^%s+%S+.-%s%s+", " ", 1)
  return table_concat(block, "\n") .. "\n\n(options before the command: warmbox --help)\n"
end
_M.usage_of = usage_of

-- Whether warmbox's own notes on stderr are dropped (-q); set by main.
local quiet_notes = false
local version_line -- main's --version (below)

-- A note on stderr (which server, saved files): not an error, dropped by -q.
local function note(err, s)
  if not quiet_notes then err:write(s) end
end

local GLOBAL = {
  ["--api-url"] = "api_url", ["--api-key"] = "api_key", ["--sandbox-url"] = "sandbox_url", ["--template"] = "template",
  ["--exec-timeout"] = "exec_timeout", ["--idle-timeout"] = "idle_timeout", ["--tag"] = "tag",
  ["--lock"] = "lock", ["--policy"] = "policy", ["--warmboxd"] = "warmboxd",
}
local NUMERIC = { exec_timeout = true, idle_timeout = true }

-- Without an E2B key and without --api-url, a running per-user server (`warmbox
-- server start`) is used; the command says so on stderr. Returns whether it was.
local function use_local_server(o, err)
  if o.api_url or o.client then return false end
  local key = o.api_key or os.getenv("E2B_API_KEY")
  if key and key ~= "" then return false end
  local st = require("warmbox.server").local_server()
  if not st then return false end
  o.api_url, o.api_key, o.sandbox_url = st.url, st.api_key, st.url
  note(err, string_format("warmbox: using the local server at %s (pid %d; `warmbox server stop` ends it)\n",
    st.url, st.pid))
  return true
end

local function new_warmbox(o, err)
  -- No local server running (and none asked for): this command's own, which ends with it.
  if not use_local_server(o, err) and o.server == nil then o.server = "private" end
  local warmbox = require "warmbox"
  local ok, wb, msg, code = pcall(warmbox.new, o)
  if not ok then
    err:write("warmbox: ", tostring(wb), "\n")
    return nil
  end
  if not wb then
    err:write(string_format("warmbox: %s (%s)\n", tostring(msg), tostring(code)))
    return nil
  end
  return wb
end

-- warmbox failed (not the code it ran): exit status 2.
local FAILED = 2

local function fail(err, msg, code)
  err:write(string_format("warmbox: %s%s\n", tostring(msg), code and (" (" .. tostring(code) .. ")") or ""))
  return FAILED
end

-- Reads a command's arguments against `flags`: flag -> function(value, flag)
-- for an option with a value, or `{ function(flag) }` for a switch. Other
-- arguments go to `positional(arg)` (anything not starting with "--"), or are
-- refused. Misuse raises a message without position (the CLI prints it).
local function parse_args(args, cmd, flags, positional)
  local i = 1
  while i <= #args do
    local a = args[i]
    local f = flags[a]
    if type(f) == "table" then
      f[1](a)
    elseif f then
      i = i + 1
      if args[i] == nil then error("option " .. a .. " needs a value", 0) end
      f(args[i], a)
    elseif positional and a:sub(1, 2) ~= "--" then
      positional(a)
    else
      error("unknown argument " .. a .. " to " .. cmd, 0)
    end
    i = i + 1
  end
end
_M.parse_args = parse_args

-- `--env K=V`: adds K to the table `env` (created when nil) and returns it.
local function env_arg(env, v)
  local k, val = v:match("^([^=]+)=(.*)$")
  if not k then error("--env needs K=V", 0) end
  env = env or {}
  env[k] = val
  return env
end

-- A number (an integer when `integer`) for option `flag`, or an error naming it.
local function number_arg(flag, v, integer)
  local n = tonumber(v)
  if not n or (integer and math.type(n) ~= "integer") then
    error(string_format("option %s needs %s, got '%s'", flag, integer and "an integer" or "a number", v), 0)
  end
  return n
end

-- ------------------------------------------------------------------
-- run
-- ------------------------------------------------------------------

-- Escape sequences (IPython colours its tracebacks): kept only for a terminal without NO_COLOR.
local function strip_ansi(s)
  return (s:gsub("\27%[[%d;?]*[ -/]*[@-~]", ""):gsub("\27%][^\7\27]*\7", ""))
end
_M.strip_ansi = strip_ansi

-- The code interpreter joins IPython's traceback parts without separators; IPython
-- prints them one a line: the rule, the header, the frames (each ends in a newline).
local function traceback_lines(tb)
  tb = tb:gsub("^([\27%[%d;m]*%-%-%-%-%-%-%-%-%-%-+[\27%[%d;m]*)([^\n])", "%1\n%2", 1)
  tb = tb:gsub("(%(most recent call last%)[\27%[%d;m]*)([^\n])", "%1\n%2", 1)
  return tb
end
_M.traceback_lines = traceback_lines

local function is_tty(io_, fd)
  if io_.is_tty then return io_.is_tty(fd) end
  return os.execute("test -t " .. fd) == true
end

local function colour_ok(io_, fd)
  local nc = os.getenv("NO_COLOR")
  if nc and nc ~= "" then return false end
  return is_tty(io_, fd)
end

-- Results as JSON: every text format, binary ones (png, jpeg, pdf) only named in `formats`.
local BINARY = { png = true, jpeg = true, pdf = true }
local function json_result(res)
  local t, formats = {}, {}
  for k, v in pairs(res) do
    if type(k) == "string" then
      if BINARY[k] then
        formats[#formats + 1] = k
      else
        t[k] = v
        if k ~= "is_main_result" and k ~= "extra" then formats[#formats + 1] = k end
      end
    end
  end
  table.sort(formats)
  t.formats = formats
  return t
end

-- No local server: start one (--start), offer to on a terminal, else run on an embedded one.
local function ensure_local_server(o, io_, start)
  if o.api_url then return true end
  local key = o.api_key or os.getenv("E2B_API_KEY")
  if key and key ~= "" then return true end
  local server = require "warmbox.server"
  if server.local_server() then return true end
  local err = io_.stderr
  if not start and is_tty(io_, 0) and is_tty(io_, 2) then
    err:write("warmbox: no local server is running; start one, so that the session keeps its kernel "
      .. "between commands? [Y/n] ")
    err:flush()
    local answer = io_.stdin:read("l")
    start = answer ~= nil and (answer == "" or answer:match("^%s*[yY]") ~= nil)
  end
  if not start then
    note(err, "warmbox: no local server (`warmbox server start`, or run --start): this command's sandbox "
      .. "ends with it\n")
    return true
  end
  local st, msg, code = server.start_local{ bin = o.warmboxd }
  if not st then
    fail(err, "cannot start the local server: " .. tostring(msg), code)
    return false
  end
  note(err, string_format("warmbox: started the local server at %s (pid %d)\n", st.url, st.pid))
  return true
end

-- Saves a run's output files into `outdir` (when given) and returns one entry
-- per file for the JSON report; `say` (a stream, or nil) is told about each.
local function save_files(files, outdir, say)
  local saved = {}
  for _, f in ipairs(files) do
    local entry = { name = f.name, bytes = #f.content, mime = f.mime }
    if outdir then
      os.execute("mkdir -p " .. sh_quote(outdir))
      local name = f.name:gsub("/", "_")
      local fh = assert(io.open(outdir .. "/" .. name, "wb"))
      fh:write(f.content)
      fh:close()
      entry.saved = outdir .. "/" .. name
      if say then note(say, string_format("warmbox: saved %s/%s (%d bytes)\n", outdir, name, #f.content)) end
    elseif say then
      note(say, string_format("warmbox: output file %s (%d bytes, %s)\n", f.name, #f.content, f.mime))
    end
    saved[#saved + 1] = entry
  end
  return saved
end

-- The traceback to show for a run's error, one frame a line (`plain`: no colours).
local function traceback_of(e, plain)
  local tb = e.traceback
  if type(tb) ~= "string" or tb == "" then tb = tostring(e.name) .. ": " .. tostring(e.value) end
  if plain then tb = strip_ansi(tb) end
  return traceback_lines(tb)
end

-- Writes `run --json`'s document of a run r that returned (`tb`: its error's
-- traceback; t0, t1, t2: start, session ready, run done).
local function write_run_json(out, r, tb, saved, t0, t1, t2)
  local e = r.error
  local json = require "warmbox.json"
  local results = {}
  for _, res in ipairs(r.results) do results[#results + 1] = json_result(res) end
  local doc = {
    ok = true, stdout = r.stdout, stderr = r.stderr,
    error = e and { name = e.name, value = type(e.value) == "string" and strip_ansi(e.value) or e.value,
      traceback = tb } or json.null,
    results = json.array(results), files = json.array(saved),
    reused = r.reused, resumed = r.resumed, sandbox_id = r.sandbox_id, execution_count = r.execution_count,
    truncated = r.truncated,
    timings = { total_ms = math.floor((t2 - t0) * 1000 + 0.5), setup_ms = math.floor((t1 - t0) * 1000 + 0.5),
      run_ms = math.floor((t2 - t1) * 1000 + 0.5) },
  }
  out:write(assert(json.encode(doc)), "\n")
end

-- Writes `run`'s text output of a run r that returned: its results' text on out, the
-- traceback `tb` of its error on err.
local function write_run_text(out, err, r, tb)
  for _, res in ipairs(r.results) do
    if res.text then out:write(res.text, "\n") end
  end
  if tb then err:write(tb, tb:sub(-1) == "\n" and "" or "\n") end
end

local function cmd_run(o, args, io_)
  local out, err = io_.stdout, io_.stderr
  local key, language, timeout, outdir, actor, code, as_json, start
  local files, env = {}, nil
  local function set_code(a)
    if code then error("more than one CODE argument", 0) end
    code = a == "-" and io_.stdin:read("a") or a
  end
  local function session(v) key = v end
  parse_args(args, "run", {
    ["--session"] = session, ["-s"] = session,
    ["--language"] = function(v) language = v end,
    ["--timeout"] = function(v, a) timeout = number_arg(a, v) end,
    ["--out"] = function(v) outdir = v end,
    ["--actor"] = function(v) actor = v end,
    ["--json"] = { function() as_json = true end },
    ["--start"] = { function() start = true end },
    ["--env"] = function(v) env = env_arg(env, v) end,
    ["--file"] = function(v)
      local name, path = v:match("^([^=]+)=(.+)$")
      if not name then error("--file needs NAME=PATH", 0) end
      local data, rerr = read_file(path)
      if not data then error("cannot read " .. path .. ": " .. tostring(rerr), 0) end
      files[name] = data
    end,
  }, set_code)
  if not key then error("run needs --session KEY", 0) end
  if not code then code = io_.stdin:read("a") end
  local now = require("warmbox.core").now
  local t0 = now()
  if not ensure_local_server(o, io_, start) then return FAILED end
  local wb = new_warmbox(o, err)
  if not wb then return FAILED end
  local t1 = now()
  local s = wb:session(key, { env = env, actor = actor })
  local r, msg, ecode = s:run(code, {
    files = next(files) and files or nil, language = language, timeout = timeout,
    on_stdout = not as_json and function(t) out:write(t) out:flush() end or nil,
    on_stderr = not as_json and function(t) err:write(t) err:flush() end or nil,
  })
  local t2 = now()
  if not r then
    wb:close()
    if as_json then
      out:write(require("warmbox.json").encode({ ok = false, message = tostring(msg), code = ecode }), "\n")
    end
    return fail(err, msg, ecode)
  end
  local saved = save_files(r.files, outdir, not as_json and err or nil)
  local e = r.error
  local tb = e and traceback_of(e, as_json or not colour_ok(io_, 2))
  if as_json then
    write_run_json(out, r, tb, saved, t0, t1, t2)
  else
    write_run_text(out, err, r, tb)
  end
  wb:close()
  return e and 1 or 0
end

-- Issue 16: the session's sandbox made ready now (the command waits for it).
local function cmd_prewarm(o, args, io_)
  local key, within, actor, start, env
  local function session(v) key = v end
  parse_args(args, "prewarm", {
    ["--session"] = session, ["-s"] = session,
    ["--within"] = function(v, a) within = number_arg(a, v) end,
    ["--actor"] = function(v) actor = v end,
    ["--start"] = { function() start = true end },
    ["--env"] = function(v) env = env_arg(env, v) end,
  })
  if not key then error("prewarm needs --session KEY", 0) end
  local now = require("warmbox.core").now
  if not ensure_local_server(o, io_, start) then return FAILED end
  local wb = new_warmbox(o, io_.stderr)
  if not wb then return FAILED end
  local t0 = now()
  local ok, t = pcall(function() return wb:session(key, { env = env, actor = actor }):prewarm{ within = within } end)
  if not ok then
    wb:close()
    error(t, 0)
  end
  wb:loop()
  local info, msg, code = t:result()
  wb:close()
  if not info then return fail(io_.stderr, "prewarm failed: " .. tostring(msg), code) end
  local ms = math.floor((now() - t0) * 1000 + 0.5)
  if info.action == "busy" then
    io_.stdout:write(string_format("prewarmed %s: busy (a run holds the session) (%d ms)\n", key, ms))
  else
    io_.stdout:write(string_format("prewarmed %s: %s sandbox %s (%d ms)\n", key, info.action,
      tostring(info.sandbox_id), ms))
  end
  return 0
end

-- ------------------------------------------------------------------
-- release, checkpoints, sessions, gc
-- ------------------------------------------------------------------

local function cmd_release(o, args, io_)
  if #args ~= 1 then error("release needs exactly one KEY", 0) end
  local wb = new_warmbox(o, io_.stderr)
  if not wb then return FAILED end
  local n, msg, code = wb:release(args[1])
  wb:close()
  if not n then return fail(io_.stderr, msg, code) end
  local c = tonumber(msg) or 0 -- the checkpoints deleted
  io_.stdout:write(string_format("released %s: %d sandbox%s killed, %d checkpoint%s deleted\n", args[1], n,
    n == 1 and "" or "es", c, c == 1 and "" or "s"))
  return 0
end

-- Whether the CLI's stderr is a terminal (io_.isatty overrides, for specs).
local function stderr_tty(io_)
  if io_.isatty ~= nil then
    if type(io_.isatty) == "function" then return io_.isatty() end
    return io_.isatty
  end
  if io_.stderr ~= io.stderr then return false end
  return os.execute("[ -t 2 ]") == true
end

local function duration_arg(flag, v)
  local rules = require "warmbox.policy.rules"
  local s, err = rules.duration(v or "")
  if not s then error(flag .. ": " .. tostring(err), 0) end
  return s
end

local function int_arg(flag, v, min)
  local n = tonumber(v)
  if not n or math.type(n) ~= "integer" or n < (min or 1) then
    error(string_format("%s needs an integer >= %d, got '%s'", flag, min or 1, tostring(v)), 0)
  end
  return n
end

local function human_age(s)
  if not s then return "-" end
  s = math.max(0, math.floor(s))
  if s >= 86400 then return string_format("%dd%02dh", s // 86400, s % 86400 // 3600) end
  if s >= 3600 then return string_format("%dh%02dm", s // 3600, s % 3600 // 60) end
  if s >= 60 then return string_format("%dm%02ds", s // 60, s % 60) end
  return string_format("%ds", s)
end

local function utc(t) return t and os.date("!%Y-%m-%dT%H:%M:%SZ", math.floor(t)) end

-- `warmbox sessions --json`: one array, one object per session.
local function write_sessions_json(out, rows)
  local json = require "warmbox.json"
  local null = json.null
  local doc = {}
  for k, s in ipairs(rows) do
    doc[k] = { key = s.key or null, tenant = s.tenant, tag_value = s.tag_value, sandbox_id = s.sandbox_id,
      state = s.state, started_at = s.started_at or null, end_at = s.end_at or null,
      last_activity = utc(s.last_activity) or null, age_s = s.age and math.floor(s.age) or null,
      cpu_count = s.cpu_count or null, memory_mb = s.memory_mb or null }
  end
  out:write(#doc == 0 and "[]" or json.encode(doc), "\n")
end

-- `warmbox sessions`: a table, one line per session.
local function write_sessions_table(out, rows)
  if #rows == 0 then
    out:write("no sessions\n")
    return
  end
  local line = "%-36s %-16s %-24s %-8s %-20s %s\n"
  out:write(string_format(line, "SESSION", "TENANT", "SANDBOX", "STATE", "LAST ACTIVITY", "AGE"))
  for _, s in ipairs(rows) do
    out:write(string_format(line, s.key or ("(hashed) " .. s.tag_value), tostring(s.tenant), tostring(s.sandbox_id),
      tostring(s.state), utc(s.last_activity) or "-", human_age(s.age)))
  end
end

-- `warmbox checkpoints`: a session's checkpoints (list, or --delete ID).
local function cmd_checkpoints(o, args, io_)
  local key, actor, env, as_json, delete
  local function session(v) key = v end
  parse_args(args, "checkpoints", {
    ["--session"] = session, ["-s"] = session,
    ["--actor"] = function(v) actor = v end,
    ["--env"] = function(v) env = env_arg(env, v) end,
    ["--json"] = { function() as_json = true end },
    ["--delete"] = function(v) delete = v end,
  })
  if not key then error("checkpoints needs --session KEY", 0) end
  local wb = new_warmbox(o, io_.stderr)
  if not wb then return FAILED end
  local list, msg, code = wb:session(key, { env = env, actor = actor }):checkpoints()
  local found
  for _, cp in ipairs(list or {}) do
    if cp.id == delete then found = cp end
  end
  local ok, dmsg, dcode = true, nil, nil
  if delete and found then ok, dmsg, dcode = wb.client:delete_snapshot(found.id) end
  wb:close()
  if not list then return fail(io_.stderr, msg, code) end
  if delete then
    if not found then return fail(io_.stderr, "no checkpoint '" .. delete .. "' in session '" .. key .. "'",
      "NOT_FOUND") end
    if ok == nil then return fail(io_.stderr, dmsg, dcode) end
    io_.stdout:write("deleted ", delete, "\n")
    return 0
  end
  if as_json then
    local json = require "warmbox.json"
    local doc = {}
    for i, cp in ipairs(list) do
      doc[i] = { id = cp.id, turn = cp.turn, label = cp.label or json.null, created_at = utc(cp.created_at) }
    end
    io_.stdout:write(#doc == 0 and "[]" or json.encode(doc), "\n")
  else
    for _, cp in ipairs(list) do
      io_.stdout:write(string_format("%-20s turn %-4d %-16s %s\n", utc(cp.created_at), cp.turn,
        cp.label or "-", cp.id))
    end
    if #list == 0 then io_.stdout:write("no checkpoints\n") end
  end
  return 0
end

local function cmd_sessions(o, args, io_)
  local tenant, state, as_json
  parse_args(args, "sessions", {
    ["--tenant"] = function(v) tenant = v end,
    ["--state"] = function(v)
      if v ~= "running" and v ~= "paused" then error("--state must be running or paused", 0) end
      state = v
    end,
    ["--json"] = { function() as_json = true end },
  })
  local wb = new_warmbox(o, io_.stderr)
  if not wb then return FAILED end
  local list, msg, code = wb:sessions()
  local gc = require "warmbox.gc"
  local now = wb.clock()
  local tenant_of = type(wb.policy.tenant) == "function" and wb.policy.tenant or gc.default_tenant
  wb:close()
  if not list then return fail(io_.stderr, msg, code) end
  local rows = {}
  for _, s in ipairs(list) do
    local ok, t = pcall(tenant_of, s.key or s.tag_value)
    s.tenant = ok and type(t) == "string" and t or gc.default_tenant(s.key or s.tag_value)
    s.last_activity = gc.last_activity(s)
    s.age = s.last_activity and now - s.last_activity or nil
    if (not tenant or s.tenant == tenant) and (not state or s.state == state) then rows[#rows + 1] = s end
  end
  if as_json then
    write_sessions_json(io_.stdout, rows)
  else
    write_sessions_table(io_.stdout, rows)
  end
  return 0
end

-- The end of `warmbox gc`'s output: the JSON report's summary (closing the
-- actions array `first` says is empty or not) or the one-line summary.
-- `failure` is the pass's own error, when it did not finish.
local function write_gc_report(out, r, as_json, failure, first)
  if as_json then
    local json = require "warmbox.json"
    local summary = {}
    if r then
      for _, k in ipairs({ "listed", "tagged", "orphans", "kept", "killed", "demoted", "busy", "skipped", "failed",
        "pages", "budget_kept", "dry_run" }) do
        summary[k] = r[k]
      end
      summary.next_token = r.resume_token or r.next_token or json.null
      summary.errors = #r.errors > 0 and r.errors or nil
      summary.checkpoints = r.checkpoints
    end
    if failure then summary.error = { message = failure.message, code = failure.code or json.null } end
    local s = json.encode(summary)
    out:write(first and "" or "\n", "],", s:sub(2), "\n")
  elseif r then
    local resume = r.resume_token or r.next_token
    local killed, demoted = "killed", "demoted"
    if r.dry_run then killed, demoted = "would kill", "would demote" end
    out:write(string_format("%slisted %d, tagged %d, kept %d, %s %d, %s %d, busy %d, skipped %d, "
      .. "errors %d%s\n", r.dry_run and "dry run: " or "", r.listed, r.tagged, r.kept, killed, r.killed, demoted,
      r.demoted, r.busy, r.skipped, r.failed, resume and (", resume with --next-token " .. resume) or ""))
    local c = r.checkpoints
    if c then
      out:write(string_format("%scheckpoints: listed %d, kept %d, %s %d, busy %d, errors %d\n",
        r.dry_run and "dry run: " or "", c.checkpoints, c.kept, r.dry_run and "would delete" or "deleted", c.deleted,
        c.busy, c.failed))
    end
  end
end

local function cmd_gc(o, args, io_)
  local opts = { actions = false }
  local as_json, policy_file = false, nil
  local function max_age(v, a) opts.max_age = duration_arg(a, v) end
  local function dry_run() opts.dry_run = true end
  parse_args(args, "gc", {
    ["--dry-run"] = { dry_run }, ["-n"] = { dry_run },
    ["--json"] = { function() as_json = true end },
    ["--policy"] = function(v) policy_file = v end,
    ["--retention"] = max_age, ["--max-age"] = max_age,
    ["--max-kills"] = function(v, a) opts.max_kills = int_arg(a, v, 1) end,
    ["--concurrency"] = function(v, a) opts.concurrency = int_arg(a, v, 1) end,
    ["--next-token"] = function(v) opts.next_token = v end,
    ["--pages"] = function(v, a) opts.pages = int_arg(a, v, 1) end,
  })
  if policy_file then opts.policy = policy_file end
  local out, err = io_.stdout, io_.stderr
  local json = require "warmbox.json"
  local core = require "warmbox.core"
  local tty = stderr_tty(io_)
  local first = true
  if as_json then out:write('{"actions":[') end
  opts.on_checkpoint = function(a)
    if a.action == "keep" then return end
    if as_json then
      out:write(first and "\n" or ",\n", json.encode({ action = a.action, checkpoint_id = a.checkpoint_id,
        turn = a.turn, reason = a.reason or json.null, code = a.code or json.null }))
    else
      local action = opts.dry_run and a.action == "delete" and "would delete" or a.action
      out:write(string_format("  %-7s %-40s %s\n", action, tostring(a.checkpoint_id), tostring(a.reason or "")))
    end
    first = false
  end
  opts.on_action = function(a)
    if a.action == "keep" then return end
    if as_json then
      out:write(first and "\n" or ",\n", json.encode({ action = a.action, sandbox_id = a.sandbox_id,
        session = a.key or json.null, tenant = a.tenant or json.null, tag_value = a.session,
        reason = a.reason or json.null, code = a.code or json.null, failed = a.failed or json.null }))
    else
      local action = opts.dry_run and (a.action == "kill" or a.action == "demote") and "would " .. a.action
        or a.action
      out:write(string_format("  %-7s %-24s %-30s %s\n", action, tostring(a.sandbox_id),
        tostring(a.key or ("(tag) " .. tostring(a.session))), tostring(a.reason or "")))
    end
    first = false
  end
  local t0, last_draw = core.now(), 0
  local function progress(rep, final)
    local now = core.now()
    if not final and now - last_draw < 0.2 then return end
    last_draw = now
    local done = rep.killed + rep.demoted + rep.skipped + rep.busy + rep.failed
    local decided = rep.kept + done + (rep.queued or 0)
    local rate = rep.listed / math.max(now - t0, 1e-3)
    local act_rate = done / math.max(now - t0, 1e-3)
    local eta = (rep.queued or 0) > 0 and act_rate > 0 and string_format("%.0fs", rep.queued / act_rate) or "-"
    err:write(string_format("\r\27[Kgc: %d pages, %d listed, %d decided, %d done (%d killed), %.0f/s, eta %s%s",
      rep.pages, rep.listed, decided, done, rep.killed, rate, eta, final and "\n" or ""))
    err:flush()
  end
  local resume -- where an interrupted pass resumes
  opts.on_page = function(p)
    resume = p.resume_token
    if tty then
      p.report.queued = p.queued
      progress(p.report)
    end
  end
  local wb = new_warmbox(o, err)
  if not wb then
    if as_json then out:write("]}\n") end
    return FAILED
  end
  local ok, rep, msg, code, partial = pcall(wb.gc, wb, opts)
  wb:close()
  if not ok then -- interrupted (^C) or a raising policy file
    if as_json then out:write("]}\n") end
    if tty then err:write("\n") end
    err:write(string_format("warmbox: %s; %s\n", tostring(rep),
      resume and ("resume with --next-token " .. resume) or "nothing to skip: run it again"))
    return FAILED
  end
  local r = rep or partial
  if tty and r then
    r.queued = 0
    progress(r, true)
  end
  write_gc_report(out, r, as_json, not rep and { message = tostring(msg), code = code } or nil, first)
  if not rep then return fail(err, msg, code) end
  if rep.failed > 0 then
    for _, e in ipairs(rep.errors) do
      err:write(string_format("warmbox: %s %s failed: %s (%s)\n", tostring(e.action), tostring(e.sandbox_id),
        tostring(e.message), tostring(e.code)))
    end
    return 1
  end
  return 0
end

-- ------------------------------------------------------------------
-- server, doctor
-- ------------------------------------------------------------------

-- How the per-user server ends (its state's idle_exit: warmboxd --idle-exit).
local function server_ending(st)
  local idle = math.tointeger(st.idle_exit)
  return string_format("it ends %s`warmbox server stop`; paused sandboxes are kept for its next start "
    .. "(files, not memory)\n", idle and string_format("once no sandbox has run for %d s, or on ", idle) or "on ")
end

local function cmd_server(o, args, io_)
  local server = require "warmbox.server"
  local sub = args[1]
  if #args ~= 1 or not (sub == "start" or sub == "stop" or sub == "status") then
    error("usage: warmbox server start|stop|status", 0)
  end
  local out = io_.stdout
  if sub == "start" then
    local st, already, code = server.start_local{ bin = o.warmboxd }
    if not st then return fail(io_.stderr, "cannot start the local server: " .. tostring(already), code) end
    out:write(string_format("%s at %s (pid %d; state in %s)\n", already and "already running" or "started",
      st.url, st.pid, server.state_path()), server_ending(st))
    return 0
  elseif sub == "stop" then
    local st = server.stop_local()
    if st then
      out:write(string_format("stopped the local server at %s (pid %d)\n", st.url, st.pid))
    else
      out:write("no local server was running\n")
    end
    return 0
  end
  local st, why = server.local_server()
  if not st then
    out:write("not running (" .. tostring(why) .. ")\n")
    return 3
  end
  out:write(string_format("running at %s (pid %d; state in %s)\n", st.url, st.pid, server.state_path()),
    server_ending(st))
  local ok, wb = pcall(require("warmbox").new, { api_url = st.url, api_key = st.api_key, sandbox_url = st.url,
    lock = "memory" })
  if ok and wb then
    local list = wb:sessions()
    if list then out:write(string_format("%d session%s\n", #list, #list == 1 and "" or "s")) end
    wb:close()
  end
  return 0
end

local function cmd_doctor(o, args, io_)
  local which
  for _, a in ipairs(args) do
    if a == "--embedded" then which = "embedded"
    elseif a == "--e2b" then which = "e2b"
    else error("unknown argument " .. a .. " to doctor", 0) end
  end
  local doctor = require "warmbox.doctor"
  local out = io_.stdout
  local failed = 0
  local key = o.api_key or os.getenv("E2B_API_KEY")
  if key == "" then key = nil end
  -- By default: the backend the other commands would use, and the other one for information.
  local e2b_selected = key ~= nil
  if which ~= "e2b" then
    local n = doctor.print(out, "embedded server (warmboxd on this machine):", doctor.embedded{ warmboxd = o.warmboxd,
      find_bin = require("warmbox.server").find_bin, local_server = require("warmbox.server").local_server })
    if which == "embedded" or not e2b_selected then failed = failed + n end
  end
  if which ~= "embedded" then
    if which ~= "e2b" then out:write("\n") end
    local n = doctor.print(out, "E2B:", doctor.e2b{ api_key = o.api_key, api_url = o.api_url, template = o.template })
    if which == "e2b" or e2b_selected then failed = failed + n end
  end
  out:write(string_format("\n%s\n", failed == 0 and "ready: " .. (e2b_selected and "E2B" or "the embedded server")
    or string_format("%d check%s failed for %s", failed, failed == 1 and "" or "s",
      which or (e2b_selected and "E2B" or "the embedded server"))))
  return failed == 0 and 0 or 1
end

-- ------------------------------------------------------------------
-- simulate
-- ------------------------------------------------------------------

local SIM_LISTS = { ["--idle-timeout"] = "idle_timeout", ["--exec-timeout"] = "exec_timeout",
  ["--max-age"] = "max_age", ["--gc-every"] = "gc_every" }
local SIM_MODEL = { ["--rtt-ms"] = "rtt_ms", ["--create-ms"] = "create_ms", ["--kernel-ms"] = "kernel_ms",
  ["--resume-ms"] = "resume_ms", ["--max-length-hours"] = "max_length_hours", ["--max-running"] = "max_running",
  ["--rate"] = "rate_per_s", ["--retry-after"] = "retry_after", ["--snapshot-ms"] = "snapshot_ms",
  ["--snapshot-gb"] = "snapshot_gb" }
local SIM_WORKLOAD = { ["--sessions"] = "sessions", ["--turns"] = "turns", ["--gap"] = "gap",
  ["--duration"] = "duration", ["--think"] = "think", ["--span"] = "span", ["--seed"] = "seed",
  ["--abandon"] = "abandon", ["--lead"] = "lead", ["--no-run"] = "no_run" }
local SIM_DISTS = { lognormal = { "median", "sigma" }, pareto = { "alpha", "min" }, exp = { "mean" } }
local SIM_INTEGER = { sessions = true, turns = true, seed = true }
local SIM_RANGE = { turns = true, duration = true, gap = true }

-- `--x a,b,...` read by `each`: one value sets `opts[k]`; several make the sweep
-- (only one option may list several values).
local function set_or_sweep(st, k, values)
  if #values == 1 then
    st.opts[k] = values[1]
    return
  end
  if st.sweep and st.sweep.param ~= k then error("only one option may list several values", 0) end
  st.sweep = { param = k, values = values }
end

-- A workload value of option `flag` for key `k`: a number, a range A-B (for
-- SIM_RANGE keys) or a distribution NAME:P1[:P2].
local function workload_value(flag, k, v)
  local lo, hi = v:match("^([^-]+)%-([^-]+)$")
  local dname, dargs = v:match("^(%a+):(.*)$")
  if dname then
    local names = SIM_DISTS[dname]
    if not names then error("option " .. flag .. ": unknown distribution '" .. dname .. "'", 0) end
    local d, n = { dist = dname }, 0
    for item in (dargs .. ":"):gmatch("([^:]*):") do
      n = n + 1
      if not names[n] then error("option " .. flag .. ": too many parameters for " .. dname, 0) end
      d[names[n]] = number_arg(flag, item)
    end
    if n < #names then error("option " .. flag .. ": " .. dname .. " needs " .. table.concat(names, ":"), 0) end
    return d
  elseif lo and SIM_RANGE[k] then
    return { number_arg(flag, lo, SIM_INTEGER[k]), number_arg(flag, hi, SIM_INTEGER[k]) }
  end
  return number_arg(flag, v, SIM_INTEGER[k])
end

-- `--policies all|P,P...`: the built-in policies to compare, in order.
local function policies_arg(sim, v)
  if v == "all" then return { table.unpack(sim.POLICY_ORDER) } end
  local policies = {}
  for item in (v .. ","):gmatch("([^,]*),") do
    if not sim.POLICIES[item] then
      error("unknown policy '" .. item .. "' to --policies (known: " .. table.concat(sim.POLICY_ORDER, ", ")
        .. ", all)", 0)
    end
    policies[#policies + 1] = item
  end
  return policies
end

-- simulate's arguments: `{ opts, workload, model, sweep, policies, chart, chart_x, chart_y, csv }`.
local function simulate_args(o, args, sim)
  local st = { opts = { exec_timeout = o.exec_timeout, idle_timeout = o.idle_timeout, policy = o.policy,
    template = o.template, tag = o.tag } }
  local opts = st.opts
  local function workload() st.workload = st.workload or {} return st.workload end
  local flags = {
    ["--trace"] = function(v) opts.trace = v end,
    ["--policy"] = function(v) opts.policy = v end,
    ["--chart"] = function(v) st.chart = v end,
    ["--chart-x"] = function(v) st.chart_x = v end,
    ["--chart-y"] = function(v) st.chart_y = v end,
    ["--tail"] = function(v, a) opts.tail = number_arg(a, v) end,
    ["--csv"] = function(v) st.csv = v end,
    ["--policies"] = function(v) st.policies = policies_arg(sim, v) end,
    ["--exact"] = { function() opts.exact = true end },
    ["--prewarm"] = function(v)
      local map, values = { on = true, off = false }, {}
      for item in (v .. ","):gmatch("([^,]*),") do
        if map[item] == nil then error("option --prewarm needs on, off or off,on, got '" .. v .. "'", 0) end
        values[#values + 1] = map[item]
      end
      set_or_sweep(st, "prewarm", values)
    end,
    ["--paused-price"] = function(v, a)
      opts.prices = opts.prices or {}
      opts.prices.paused_second = number_arg(a, v) / 3600
    end,
    ["--snapshot-price"] = function(v, a)
      opts.prices = opts.prices or {}
      opts.prices.snapshot_gib_month = number_arg(a, v)
    end,
    ["--arrival"] = function(v) workload().arrival = v end,
  }
  for flag, k in pairs(SIM_LISTS) do
    flags[flag] = function(v, a)
      local values = {}
      for item in (v .. ","):gmatch("([^,]*),") do values[#values + 1] = number_arg(a, item) end
      set_or_sweep(st, k, values)
    end
  end
  for flag, k in pairs(SIM_MODEL) do
    flags[flag] = function(v, a)
      st.model = st.model or {}
      st.model[k] = number_arg(a, v)
    end
  end
  for flag, k in pairs(SIM_WORKLOAD) do
    flags[flag] = function(v, a) workload()[k] = workload_value(a, k, v) end
  end
  parse_args(args, "simulate", flags)
  return st
end

local function cmd_simulate(o, args, io_)
  local sim = require "warmbox.sim"
  local st = simulate_args(o, args, sim)
  local opts, workload, model, sweep, policies = st.opts, st.workload, st.model, st.sweep, st.policies
  local chart, chart_x, chart_y, csv = st.chart, st.chart_x, st.chart_y, st.csv
  if opts.trace and workload then error("give --trace or a generated workload (--sessions ...), not both", 0) end
  if not opts.trace then
    workload = workload or {}
    workload.sessions = workload.sessions or 20
    opts.workload = workload
  end
  opts.model = model
  local rows, msg, code
  if policies then
    if sweep then error("give --policies or a list of values, not both", 0) end
    if opts.policy then error("give --policies or --policy, not both", 0) end
    rows, msg, code = sim.compare(opts, policies)
  elseif sweep then
    rows, msg, code = sim.sweep(opts, sweep)
  else
    local r
    r, msg, code = sim.run(opts)
    rows = r and { r }
  end
  if not rows then return fail(io_.stderr, msg, code) end
  local r1 = rows[1]
  local function shown(k)
    if sweep and sweep.param == k then return "(swept)" end
    return string_format("%gs", r1[k])
  end
  io_.stdout:write(string_format("%s: %d conversations, %d turns, exec timeout %s, idle timeout %s, max age %s, "
    .. "GC every %s, policy %s, %s path\n", opts.trace or "generated workload", r1.conversations, r1.turns,
    shown("exec_timeout"), shown("idle_timeout"), shown("max_age"), shown("gc_every"),
    policies and "(compared)" or r1.policy, r1.path))
  io_.stdout:write(sim.format(rows))
  if csv then
    local f, ferr = io.open(csv, "wb")
    if not f then return fail(io_.stderr, "cannot write " .. csv .. ": " .. tostring(ferr), "IO") end
    f:write(sim.csv(rows))
    f:close()
    note(io_.stderr, string_format("warmbox: rows written to %s\n", csv))
  end
  if chart then
    local how, perr, pcode = sim.plot(rows, chart, { x = chart_x, y = chart_y })
    if not how then return fail(io_.stderr, perr, pcode) end
    note(io_.stderr, string_format("warmbox: chart written to %s%s\n", chart,
      how == "gnuplot" and " (gnuplot)" or ""))
  end
  return 0
end

-- ------------------------------------------------------------------
-- demo
-- ------------------------------------------------------------------

-- The lease the demo's cold start sets (the default policy): the idle timeout,
-- at least the run's timeout + LEASE_MARGIN.
local function demo_lease(o)
  return math.max(o.idle_timeout, math.ceil(o.exec_timeout + require("warmbox.session").LEASE_MARGIN))
end

-- The demo's header line when --idle-timeout cannot take effect (event lease_floor).
local function demo_floor_note(o)
  local margin = require("warmbox.session").LEASE_MARGIN
  if o.idle_timeout >= o.exec_timeout then return "" end
  return string_format("(idle timeout %gs is shorter than a run's %gs timeout: a run's lease covers the timeout + %ds, "
    .. "so the sandbox pauses %gs after a run starts)\n", o.idle_timeout, o.exec_timeout, margin, demo_lease(o))
end

local function demo(o, io_)
  local out = io_.stdout
  local core = require "warmbox.core"
  local now = core.now
  -- The idle timeout takes effect only when no shorter than a run's timeout (a
  -- run's lease covers its timeout + LEASE_MARGIN): 15 s, the 10 s timeout + 5.
  o.exec_timeout = o.exec_timeout or 10
  o.idle_timeout = o.idle_timeout or o.exec_timeout + require("warmbox.session").LEASE_MARGIN
  o.lock = o.lock or "memory"
  -- The demo runs on its own warmboxd even when E2B_API_KEY is set (unless --api-url is given).
  local srv
  if not o.api_url then
    local server = require "warmbox.server"
    local err, code
    srv, err, code = server.start{ bin = o.warmboxd }
    if not srv then return fail(io_.stderr, err, code) end
    o.api_url, o.api_key, o.sandbox_url, o.warmboxd = srv.url, srv.api_key, srv.url, nil
  end
  local wb = new_warmbox(o, io_.stderr)
  if not wb then
    if srv then srv:stop() end
    return FAILED
  end
  wb.server = wb.server or srv -- stopped by wb:close()
  local http = wb.server and core.http{ timeout = 10 }
  local function requests()
    if not http then return nil end
    local res = http:request{ method = "GET", url = wb.server.url .. "/_warmboxd/stats",
      headers = { ["X-Warmboxd-Token"] = wb.server.admin_token } }
    local t = res and res.status == 200 and require("warmbox.json").decode(res.body)
    return t and t.total_requests
  end
  out:write(string_format("warmbox demo: one conversation on %s (exec timeout %gs, idle timeout %gs)\n%s\n",
    wb.server and ("an embedded warmboxd at " .. wb.server.url) or "E2B", o.exec_timeout, o.idle_timeout,
    demo_floor_note(o)))
  local key = "demo-workspace:thread-1"
  local s = wb:session(key)
  local step = 0
  local function show(title, fn, quiet)
    step = step + 1
    local n0 = requests()
    local t0 = now()
    local ok, line, extra = fn()
    local ms = (now() - t0) * 1000
    local n1 = requests()
    local reqs = n0 and n1 and not quiet and string_format("%2d req", n1 - n0) or "      "
    out:write(string_format("%d. %-16s %8.0f ms  %s  %s\n", step, title, ms, reqs, tostring(line)))
    if extra then out:write("   ", extra, "\n") end
    return ok
  end
  local function code_line(r)
    local text = r.results[1] and r.results[1].text or r.stdout:gsub("\n$", "")
    return string_format("-> %s  (sandbox %s, reused=%s, resumed=%s)", text, r.sandbox_id, tostring(r.reused),
      tostring(r.resumed))
  end
  local sandbox_id
  local ok = show("cold start", function()
    local r, msg, code = s:run("x = 41\nprint('hello from', __import__('os').getcwd())")
    if not r then return false, "FAILED: " .. tostring(msg) .. " (" .. tostring(code) .. ")" end
    sandbox_id = r.sandbox_id
    return true, string_format("x = 41  (created sandbox %s, reused=%s)", r.sandbox_id, tostring(r.reused))
  end)
  local abandoned
  if ok then
    show("other session", function()
      -- a conversation that goes quiet at once (a 7 s idle timeout: its 2 s timeout + LEASE_MARGIN):
      -- GC reclaims it below
      local quick = require("warmbox").new{ client = wb.client, exec_timeout = 2, idle_timeout = 7, lock = o.lock }
      local r, msg, code = quick:session("demo-workspace:abandoned"):run("echo bye", { language = "bash" })
      if not r then return false, "FAILED: " .. tostring(msg) .. " (" .. tostring(code) .. ")" end
      abandoned = r.sandbox_id
      return true, string_format("a second conversation (sandbox %s) that is then abandoned", r.sandbox_id)
    end)
  end
  if ok then
    ok = show("warm run", function()
      local r, msg, code = s:run("x + 1", { timeout = 1 })
      if not r then return false, "FAILED: " .. tostring(msg) .. " (" .. tostring(code) .. ")" end
      return true, "x + 1 " .. code_line(r)
    end)
  end
  if ok then
    ok = show("idle pause", function()
      local deadline = now() + o.exec_timeout + o.idle_timeout + 30
      while now() < deadline do
        local info = wb.client:info(sandbox_id)
        if info and info.state == "paused" then
          return true, string_format("nobody ran anything; sandbox %s paused when its %gs lease (set at the "
            .. "cold start) ran out (polled with info)", sandbox_id, demo_lease(o))
        end
        core.sleep(0.25)
      end
      return false, "the sandbox did not pause"
    end, true) -- its requests are the demo's own polling
  end
  if ok then
    ok = show("resume", function()
      local r, msg, code = s:run("x + 1", { timeout = 30 })
      if not r then return false, "FAILED: " .. tostring(msg) .. " (" .. tostring(code) .. ")" end
      return true, "x + 1 " .. code_line(r) .. " -- the kernel kept x"
    end)
  end
  if ok then
    ok = show("chart", function()
      local r, msg, code = s:run(table_concat({
        "import matplotlib", "matplotlib.use('Agg')", "import matplotlib.pyplot as plt",
        "plt.figure(figsize=(4, 3))", "plt.plot([1, 2, 3, 4], [x, x + 1, x - 3, x + 5])",
        "plt.title('x over time')", "plt.savefig('/home/user/output/chart.png')", "print('saved')" }, "\n"),
        { timeout = 120 })
      if not r then return false, "FAILED: " .. tostring(msg) .. " (" .. tostring(code) .. ")" end
      if r.error then return false, "FAILED: " .. tostring(r.error.name) .. ": " .. tostring(r.error.value) end
      local f = r.files[1]
      if not f then return false, "no file came back" end
      local png = f.content:sub(1, 8) == "\137PNG\r\n\26\n"
      return true, string_format("got %s back: %d bytes, %s%s", f.name, #f.content, f.mime,
        png and ", a real PNG" or "")
    end)
  end
  local have_gc = pcall(require, "warmbox.gc")
  if ok and have_gc and abandoned then
    local max_age = 6
    show("gc --dry-run", function()
      local rep, msg, code = wb:gc{ dry_run = true, max_age = max_age }
      if not rep then return false, "FAILED: " .. tostring(msg) .. " (" .. tostring(code) .. ")" end
      return true, string_format("max age %ds: listed %d, would kill %d (the abandoned one), keep %d (the live one)",
        max_age, rep.listed or 0, rep.killed or 0, rep.kept or 0)
    end)
    show("gc", function()
      local rep, msg, code = wb:gc{ max_age = max_age }
      if not rep then return false, "FAILED: " .. tostring(msg) .. " (" .. tostring(code) .. ")" end
      local killed = {}
      for _, a in ipairs(rep.actions or {}) do
        if a.action == "kill" then killed[#killed + 1] = tostring(a.sandbox_id) end
      end
      return true, string_format("killed %d (%s), kept %d", rep.killed or 0, table_concat(killed, ", "),
        rep.kept or 0)
    end)
  end
  show("release", function()
    local n, msg, code = wb:release(key)
    if not n then return false, "FAILED: " .. tostring(msg) .. " (" .. tostring(code) .. ")" end
    return true, string_format("the conversation was deleted: %d sandbox%s killed", n, n == 1 and "" or "es")
  end)
  if http then http:close() end
  wb:close()
  out:write(ok and "\ndone.\n" or "\nthe demo stopped at a failed step.\n")
  return ok and 0 or 1
end

local function cmd_smoke(o, args, io_)
  if args[1] then error("smoke takes no arguments", 0) end
  return require("warmbox.smoke").run(o, io_)
end

local function cmd_demo(o, args, io_)
  if args[1] then error("demo takes no arguments", 0) end
  return demo(o, io_)
end

-- ------------------------------------------------------------------
-- main
-- ------------------------------------------------------------------

local COMMANDS = "run, prewarm, server, doctor, release, checkpoints, sessions, gc, simulate, demo, smoke"

-- `warmbox --version`: warmbox's version and where its C part was loaded from.
version_line = function()
  local core = require "warmbox.core"
  return string_format("warmbox %s (%s, warmbox.core %s)\n", require("warmbox")._VERSION, _VERSION,
    core.module_path())
end

--- Run the command line.
-- @tparam table argv the arguments (`arg`)
-- @tparam[opt] table io_ `stdout`, `stderr`, `stdin`
-- @treturn integer exit status
function _M.main(argv, io_)
  io_ = io_ or { stdout = io.stdout, stderr = io.stderr, stdin = io.stdin }
  quiet_notes = false
  local o = {}
  local i = 1
  local args = {}
  for j = 1, #argv do args[j] = argv[j] end
  local cmd
  while i <= #args do
    local a = args[i]
    if a == "-h" or a == "--help" then
      io_.stdout:write(USAGE)
      return 0
    elseif a == "--version" then
      io_.stdout:write(version_line())
      return 0
    elseif a == "-q" or a == "--quiet" then
      quiet_notes = true
      i = i + 1
    elseif GLOBAL[a] then
      local v = args[i + 1]
      if v == nil then
        io_.stderr:write("warmbox: option " .. a .. " needs a value\n")
        return 2
      end
      local k = GLOBAL[a]
      if NUMERIC[k] then
        v = tonumber(v)
        if not v then
          io_.stderr:write("warmbox: option " .. a .. " needs a number\n")
          return 2
        end
      end
      o[k] = v
      i = i + 2
    elseif a:sub(1, 1) == "-" then
      io_.stderr:write("warmbox: unknown option " .. a .. " (warmbox --help lists the options)\n")
      return 2
    else
      cmd = a
      i = i + 1
      break
    end
  end
  local rest = {}
  for j = i, #args do rest[#rest + 1] = args[j] end
  local handlers = { run = cmd_run, prewarm = cmd_prewarm, release = cmd_release, sessions = cmd_sessions, gc = cmd_gc,
    checkpoints = cmd_checkpoints,
    simulate = cmd_simulate, server = cmd_server, doctor = cmd_doctor, smoke = cmd_smoke, demo = cmd_demo }
  local h = handlers[cmd]
  if not cmd then
    io_.stderr:write(USAGE)
    return 2
  elseif not h then
    io_.stderr:write("warmbox: unknown command " .. cmd .. " (commands: " .. COMMANDS .. "; warmbox --help)\n")
    return 2
  end
  for _, a in ipairs(rest) do
    if a == "-h" or a == "--help" then
      io_.stdout:write(usage_of(cmd))
      return 0
    end
  end
  local ok, code = pcall(h, o, rest, io_)
  if not ok then
    io_.stderr:write("warmbox: ", tostring(code), "\n")
    return 2
  end
  return code
end

return _M
