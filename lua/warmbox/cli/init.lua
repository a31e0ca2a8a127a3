--- The `warmbox` command.
--
--   warmbox [options] run --session KEY [--language L] [--timeout S] [--file NAME=PATH]...
--                         [--env K=V]... [--actor A] [--out DIR] [--json] [--start] [CODE | -]
--   warmbox [options] prewarm --session KEY [--env K=V]... [--actor A] [--within S] [--start]
--   warmbox [options] server start [--max-running N] [--idle-exit S] | stop | status
--   warmbox [options] doctor [--embedded | --e2b]
--   warmbox [options] release KEY
--   warmbox [options] checkpoints --session KEY [--env K=V]... [--actor A] [--json] [--delete ID]
--   warmbox [options] sessions [--tenant T] [--state running|paused] [--json]
--   warmbox [options] gc [--dry-run] [--json] [--policy FILE] [--retention 7d] [--max-kills N]
--                        [--concurrency N] [--next-token T] [--pages N]
--   warmbox [options] simulate [--trace FILE | --events FILE | --sessions N --turns A-B --gap S --seed N]
--                              [--idle-timeout S,S,S] [--policy FILE | --policies all]
--                              [--chart out.svg] [--csv rows.csv]
--   warmbox [options] costs [--json] [--chart FILE] [--since T] [--until T]
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
--
-- This file is main: the global options, the usage, the dispatch. One module
-- per command, as Kong's kong/cmd/: warmbox.cli.<command> (cli/run.lua, ...)
-- has `execute(o, args, io_) -> status`, with `o` the global options
-- (warmbox.new's), `args` the command's arguments and `io_` its context
-- (`stdout`, `stderr`, `stdin`, `quiet`: -q). A misuse it raises is printed
-- with status 2. Shared: cli/args.lua (the argument reader), cli/common.lua
-- (failures, notes, the warmbox object and its server). `io_` also has, for
-- specs, `is_tty(fd)` and `isatty`. To add a command: write the module, add its
-- name to COMMAND_LIST and its block to USAGE (`COMMAND --help` is cut from
-- that block).
-- syntax: status = cmd.execute(o, args, io_)
-- @module warmbox.cli

local tostring, tonumber, ipairs, pcall, setmetatable = tostring, tonumber, ipairs, pcall, setmetatable
local string_format, table_concat = string.format, table.concat

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
      --max-running N              start: sandboxes running at once (default $WARMBOX_SERVER_MAX_RUNNING,
                                   else 100; 0: no limit); changes a running server's at once
      --idle-exit S                start: end after S s with no running sandbox (default
                                   $WARMBOX_SERVER_IDLE_EXIT, else 3600; 0: never)
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
      --events FILE                a recorded stretch of E2B's lifecycle events (JSON array or lines) as the trace
      --sessions N --turns A-B     a generated workload (also --gap S, --duration S|A-B, --think S,
                                   --span S, --seed N, --arrival uniform|poisson, --abandon P, --lead S:
                                   a turn's start to its run, --no-run P: turns without a run); a value
                                   may be a distribution: lognormal:MEDIAN:SIGMA, pareto:ALPHA:MIN, exp:MEAN
      --prewarm on|off|jit|off,on  prewarm each turn's sandbox at its start or 2 s before its run
      --exact                      drive the real warmbox.session code (slower; the cap and --rate need it)
      --idle-timeout S[,S...]      one row per value (also --exec-timeout, --max-age, --gc-every)
      --policies all|P,P...        one row per built-in policy (reference, pause-per-turn, ...)
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
  costs                          what each conversation, tenant and day cost (E2B's lifecycle events, its rates)
      --since T, --until T         a window (unix seconds or RFC 3339)
      --json                       one JSON object {conversation, tenant, day: {rows, totals}}
      --chart FILE                 draw cost per day by tenant and sandboxes over time (PNG or SVG)
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

local GLOBAL = {
  ["--api-url"] = "api_url", ["--api-key"] = "api_key", ["--sandbox-url"] = "sandbox_url", ["--template"] = "template",
  ["--exec-timeout"] = "exec_timeout", ["--idle-timeout"] = "idle_timeout", ["--tag"] = "tag",
  ["--lock"] = "lock", ["--policy"] = "policy", ["--warmboxd"] = "warmboxd",
}
local NUMERIC = { exec_timeout = true, idle_timeout = true }

-- The commands, in the order the usage lists them: each is the module warmbox.cli.<name>.
local COMMAND_LIST = { "run", "prewarm", "server", "doctor", "release", "checkpoints", "sessions", "gc", "simulate",
  "demo", "smoke", "costs" }
local COMMANDS = {}
for _, c in ipairs(COMMAND_LIST) do COMMANDS[c] = "warmbox.cli." .. c end

-- `warmbox --version`: warmbox's version and where its C part was loaded from.
local function version_line()
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
  local quiet = false
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
      quiet = true
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
  local module = COMMANDS[cmd]
  if not cmd then
    io_.stderr:write(USAGE)
    return 2
  elseif not module then
    io_.stderr:write("warmbox: unknown command " .. cmd .. " (commands: " .. table_concat(COMMAND_LIST, ", ")
      .. "; warmbox --help)\n")
    return 2
  end
  for _, a in ipairs(rest) do
    if a == "-h" or a == "--help" then
      io_.stdout:write(usage_of(cmd))
      return 0
    end
  end
  -- The command's context: the caller's streams (and their stand-ins) with -q.
  local ctx = setmetatable({ quiet = quiet }, { __index = io_ })
  local ok, code = pcall(function() return require(module).execute(o, rest, ctx) end)
  if not ok then
    io_.stderr:write("warmbox: ", tostring(code), "\n")
    return 2
  end
  return code
end

return _M
