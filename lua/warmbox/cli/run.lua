--- `warmbox run`: run code in a session's sandbox, its output streamed (or
-- one JSON document with --json), its output files saved with --out.
local tostring, ipairs, pairs, type, next = tostring, ipairs, pairs, type, next
local string_format = string.format

local args_ = require "warmbox.cli.args"
local common = require "warmbox.cli.common"
local read_file = require("warmbox.util").read_file
local sh_quote = require("warmbox.util").sh_quote

local parse_args, env_arg, number_arg = args_.parse_args, args_.env_arg, args_.number_arg
local fail, note, FAILED = common.fail, common.note, common.FAILED

local _M = {}

-- Escape sequences (IPython colours its tracebacks): kept only for a terminal without NO_COLOR.
local strip_ansi = require("warmbox.util").strip_ansi
_M.strip_ansi = strip_ansi

-- The code interpreter joins IPython's traceback parts without separators; IPython
-- prints them one a line: the rule, the header, the frames (each ends in a newline).
local function traceback_lines(tb)
  tb = tb:gsub("^([\27%[%d;m]*%-%-%-%-%-%-%-%-%-%-+[\27%[%d;m]*)([^\n])", "%1\n%2", 1)
  tb = tb:gsub("(%(most recent call last%)[\27%[%d;m]*)([^\n])", "%1\n%2", 1)
  return tb
end
_M.traceback_lines = traceback_lines

local function colour_ok(io_, fd)
  local nc = os.getenv("NO_COLOR")
  if nc and nc ~= "" then return false end
  return common.is_tty(io_, fd)
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

-- Saves a run's output files into `outdir` (when given) and returns one entry
-- per file for the JSON report; `say` (the command's io_, or nil) is told about each.
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
  local tb = (not plain and e.traceback_ansi) or e.traceback
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
  if r.truncated then err:write("warmbox: the output was truncated (past the run's output cap)\n") end
end

--- The command: status 0, 1 (the cell raised) or 2.
function _M.execute(o, args, io_)
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
  if not common.ensure_local_server(o, io_, start) then return FAILED end
  local wb = common.new_warmbox(o, io_)
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
  local saved = save_files(r.files, outdir, not as_json and io_ or nil)
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

return _M
