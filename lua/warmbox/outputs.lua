--- What a run leaves behind: the python output hooks (the cell that installs
-- python/output_hook.py), the output report they display, output file collection over
-- envd, input file name checks and the MIME table.
-- @module warmbox.outputs
local json = require "warmbox.json"
local util = require "warmbox.util"

local type, ipairs, tostring, tonumber =
  type, ipairs, tostring, tonumber
local string_format, table_sort = string.format, table.sort
local b64_encode, b64_decode = util.b64_encode, util.b64_decode

local _M = {}

local HOME = "/home/user"
local OUTPUT_DIR = HOME .. "/output"
_M.HOME = HOME
_M.OUTPUT_DIR = OUTPUT_DIR
--- Where the kernel records the ids of the cells it accepted (one directory
-- each), and how many of the latest it keeps (see `cell_marked`).
_M.CELLS_DIR = HOME .. "/.warmbox/cells"
_M.CELLS_KEPT = 1024
--- The highest fencing number (`lk:fence()`) of a cell the kernel accepted.
_M.FENCE_FILE = HOME .. "/.warmbox/fence"
--- The private MIME type of the output report the python hook displays.
_M.OUTPUTS_MIME = "application/vnd.warmbox.outputs+json"
--- Files up to this size come back inline in the output report; bigger ones are read over envd.
_M.INLINE_LIMIT = 524288
--- At most this many bytes of files come back inline in one report (the rest is read over envd).
_M.INLINE_TOTAL = 8388608

--- At most this many output files come back from a run, whichever language
-- ran (the walk stops at the next one: see `collect_envd`).
_M.FILES_MAX = 1000
--- How deep the walk goes below the output directory (1: its own files).
_M.FILES_DEPTH = 32

-- ------------------------------------------------------------------
-- The python output hooks (registered once per kernel)
-- ------------------------------------------------------------------

-- python/output_hook.py, compiled into warmbox.core by the build.
local HOOK_SRC = assert(require("warmbox.core").embedded("output_hook.py"),
  "warmbox.core was built without python/output_hook.py")

-- A python string literal of s (the constants below: no quote, backslash or control character).
local function py_str(s)
  assert(type(s) == "string" and not s:find("[%c'\\\128-\255]"), "not a plain python string")
  return "'" .. s .. "'"
end

--- The cell that installs the hooks, sent on its own before the user's cell when the
-- kernel may not have them yet (idempotent: guarded by an attribute on `get_ipython()`).
-- syntax: s = outputs.prelude_for(dir) (`outputs.PRELUDE` for /home/user/output; the cell is
--   `python/output_hook.py` plus one `install(...)` call line; `dir` must be a plain path: a quote, backslash,
--   control or non-ASCII byte is an error)
function _M.prelude_for(dir)
  local call = string_format("install(%s, %s, %d, %s, %d, %d, %s, %d, %d)\n", py_str(_M.CELLS_DIR),
    py_str(_M.FENCE_FILE), _M.CELLS_KEPT, py_str(dir), _M.INLINE_LIMIT, _M.INLINE_TOTAL, py_str(_M.OUTPUTS_MIME),
    _M.FILES_MAX, _M.FILES_DEPTH)
  return "exec(__import__('base64').b64decode('" .. b64_encode(HOOK_SRC .. call) .. "').decode(), {})"
end
_M.PRELUDE = _M.prelude_for(OUTPUT_DIR)

--- A python cell marked with its id and its run's fencing number (a first
-- line the hooks strip before the cell is compiled, so its line numbers stay
-- the user's). A kernel without the hooks fails on that line (NameError)
-- before anything of the cell runs.
-- syntax: code = outputs.cell_marked(code, id)
function _M.cell_marked(code, id, fence)
  if math.type(fence) == "integer" and fence >= 0 then
    return string_format("__warmbox_cell__('%s', %d)\n", id, fence) .. code
  end
  return "__warmbox_cell__('" .. id .. "')\n" .. code
end

-- The bash guard (plain bash, also in an interactive shell: no `!` history
-- events): one first line before the cell's own first line, so the cell's
-- line numbers stay the user's. It refuses a cell whose fencing number ($2) is
-- lower than the sandbox's highest, then accepts its id ($1) by an atomic
-- mkdir (a given-up id is refused), then records the number; the cell runs as
-- the body of the `if`, its status the cell's. A refusal prints "warmbox: ..."
-- on stderr, status 0 (a `set -e` of an earlier cell never ends the shell for it).
local BASH_GUARD = [[__wb_g() { local d=%s h=0; command mkdir -p "$d/cells" || return 1; ]]
  .. [[if [ -n "$2" ]; then read -r h 2>/dev/null <"$d/fence" || :; case $h in ''|*[^0-9]*) h=0;; esac; ]]
  .. [[if [ "$2" -lt "$h" ]; then printf 'warmbox: fenced: run %%s is older than run %%s of this sandbox; not run\n' ]]
  .. [["$2" "$h" >&2; return 1; fi; fi; if command mkdir "$d/cells/$1" 2>/dev/null; then :; else ]]
  .. [[printf 'warmbox: cell %%s was given up by its session; not run\n' "$1" >&2; return 1; fi; ]]
  .. [[if [ -n "$2" ] && [ "$2" -gt "$h" ]; then printf '%%s' "$2" >|"$d/fence.$$" && ]]
  .. [[command mv -f "$d/fence.$$" "$d/fence"; fi; }; if __wb_g '%s' '%s'; then unset -f __wb_g; :; ]]
local BASH_TAIL = "\nelse unset -f __wb_g; fi"

-- The JavaScript / TypeScript guard (plain JS for Node and Deno): a first
-- statement on the cell's first line, which throws (before any of the cell
-- runs) as the bash guard refuses. Returns undefined: no result of its own.
local JS_GUARD = "((id, n) => { const D = globalThis.Deno, fs = D ? null : require('fs'), d = '%s', f = d + '/fence'; "
  .. "const mk = (p, r) => (D ? D.mkdirSync(p, { recursive: r }) : fs.mkdirSync(p, { recursive: r })); "
  .. "const no = (m) => { const e = new Error('warmbox: ' + m + '; not run'); e.name = 'RuntimeError'; throw e; }; "
  .. "let h = 0n; try { h = BigInt(String(D ? D.readTextFileSync(f) : fs.readFileSync(f, 'utf8')).trim() "
  .. "|| '0'); } "
  .. "catch (e) { h = 0n; } "
  .. "if (n !== '' && BigInt(n) < h) no('fenced: run ' + n + ' is older than run ' + h + ' of this sandbox'); "
  .. "mk(d + '/cells', true); try { mk(d + '/cells/' + id, false); } "
  .. "catch (e) { no('cell ' + id + ' was given up by its session'); } "
  .. "if (n !== '' && BigInt(n) > h) { const t = f + '.' + id; "
  .. "if (D) { D.writeTextFileSync(t, n); D.renameSync(t, f); } "
  .. "else { fs.writeFileSync(t, n); fs.renameSync(t, f); } } "
  .. "})('%s', '%s'); "

local GUARDED = { bash = "bash", javascript = "js", js = "js", typescript = "js", ts = "js" }

--- A cell of another language than python guarded by its id and its run's
-- fencing number, as the python hooks guard theirs (the same records: see
-- `CELLS_DIR`, `FENCE_FILE`), in plain code its own kernel runs; nil for a
-- language without a guard (its cell is never sent twice after an unclear answer).
-- syntax: code = outputs.cell_guarded(code, language, id, n) (see "At most once")
function _M.cell_guarded(code, language, id, fence)
  local kind = GUARDED[language]
  if not kind then return nil end
  local n = math.type(fence) == "integer" and fence >= 0 and string_format("%d", fence) or ""
  local dir = HOME .. "/.warmbox"
  if kind == "bash" then return string_format(BASH_GUARD, dir, id, n) .. code .. BASH_TAIL end
  return string_format(JS_GUARD, dir, id, n) .. code
end

-- ------------------------------------------------------------------
-- File names and types
-- ------------------------------------------------------------------

local MIME = {
  png = "image/png", jpg = "image/jpeg", jpeg = "image/jpeg", gif = "image/gif", svg = "image/svg+xml",
  webp = "image/webp", pdf = "application/pdf", csv = "text/csv", txt = "text/plain", json = "application/json",
  html = "text/html", htm = "text/html", md = "text/markdown", xml = "application/xml", zip = "application/zip",
  xlsx = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
  docx = "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
  pptx = "application/vnd.openxmlformats-officedocument.presentationml.presentation",
}
-- syntax: outputs.mime_of(name)
local function mime_of(name)
  local ext = name:match("%.([%w]+)$")
  return ext and MIME[ext:lower()] or "application/octet-stream"
end
_M.mime_of = mime_of

--- Check an input file name: a plain name that lands in /home/user.
-- Names with a directory part ("a/b", "../../etc/x"), "." and ".." are refused
-- (not flattened), so nothing is written outside /home/user and no two inputs
-- silently collide.
-- @treturn[1] string the name
-- @return[2] nil, message
-- syntax: name, err = outputs.check_file_name(name)
function _M.check_file_name(name)
  if type(name) ~= "string" or name == "" then
    return nil, "input file name must be a non-empty string"
  end
  if name == "." or name == ".." or name:find("[/\\%z]") or #name > 255 then
    return nil, string_format("input file name %q is not a plain file name (no '/', '\\', NUL, '.' or '..')", name)
  end
  return name
end

-- ------------------------------------------------------------------
-- Collecting a run's output files
-- ------------------------------------------------------------------

-- syntax: report = outputs.outputs_of(result)
local function outputs_of(res)
  if type(res) ~= "table" then return nil end
  local v = type(res.extra) == "table" and res.extra[_M.OUTPUTS_MIME] or res[_M.OUTPUTS_MIME]
  if type(v) == "string" then v = json.decode(v) end
  if type(v) == "table" and type(v.files) == "table" then return v end
  return nil
end
_M.outputs_of = outputs_of

--- Checks an output file's name (from the output report or envd's listing,
-- both written by code in the sandbox): a relative path below the output
-- directory. Empty names, NUL, an absolute path and "", "." or ".." parts
-- are refused, so no name the caller may join to a directory climbs out.
-- @treturn[1] string the name
-- @return[2] nil, message
-- syntax: name, err = outputs.check_output_name(name)
function _M.check_output_name(name)
  if type(name) ~= "string" or name == "" or name:find("%z") or name:sub(1, 1) == "/" or #name > 4096 then
    return nil, string_format("output file name %q is not a relative path", tostring(name))
  end
  for part in (name .. "/"):gmatch("([^/]*)/") do
    if part == "" or part == "." or part == ".." then
      return nil, string_format("output file name %q climbs out of the output directory", name)
    end
  end
  return name
end
local check_output_name = _M.check_output_name

local function protocol_error(msg) return nil, msg, "PROTOCOL" end

-- Adds one output file within the run's byte budget `cap` (a table with
-- `left`); a file past it is dropped (listed in `cap.dropped`). `size` is
-- what the sandbox reported: `read(max)` reads at most `max` bytes (the cap
-- holds on what is read, not on what is reported), and a file read shorter
-- than its report is a PROTOCOL error, never a complete file.
local function take_file(files, cap, name, size, mime, read)
  local ok, nerr = check_output_name(name)
  if not ok then return protocol_error(nerr) end
  if size > cap.left then
    cap.dropped[#cap.dropped + 1] = { name = name, size = size }
    return true
  end
  local data, err, code = read(cap.left)
  if not data and code == "TOO_LARGE" then
    cap.dropped[#cap.dropped + 1] = { name = name, size = math.max(size, cap.left + 1) }
    return true
  end
  if not data then return nil, err, code end
  if #data > cap.left then
    cap.dropped[#cap.dropped + 1] = { name = name, size = #data }
    return true
  end
  if #data < size then
    return protocol_error(string_format("output file %q: read %d bytes of the %d reported", name, #data, size))
  end
  cap.left = cap.left - #data
  files[#files + 1] = { name = name, content = data, mime = mime }
  return true
end

-- The reported size of an output file: a whole number >= 0, or nil.
local function size_of(x)
  local n = tonumber(x)
  if n and n >= 0 and n == math.floor(n) and n < 2 ^ 53 then return n end
  return nil
end

-- Takes the files one walk found, in walk order, as the walk of every
-- language does: at most FILES_MAX of them (the next one is listed in
-- cap.dropped: the walk stopped there), each name checked and each file
-- within the run's byte budget (see take_file). `file(x)` turns an item of
-- `list` into { name, size, mime, read } | nil, msg (a PROTOCOL error).
-- → files | nil, msg, code, files so far
local function take_walk(list, cap, file)
  local files = {}
  for i, x in ipairs(list) do
    local f, ferr = file(x)
    if not f then return nil, ferr, "PROTOCOL", files end
    if i > _M.FILES_MAX then
      local ok, nerr = check_output_name(f.name)
      if not ok then return nil, nerr, "PROTOCOL", files end
      cap.dropped[#cap.dropped + 1] = { name = f.name, size = f.size }
      return files
    end
    local ok, err, code = take_file(files, cap, f.name, f.size, f.mime, f.read)
    if not ok then return nil, err, code, files end
  end
  return files
end

-- The walk's order (python/output_hook.py walks in it): each directory's
-- entries in byte order of their names, a subdirectory's files at its name's
-- place (Go's WalkDir, as envd's ListDir lists). That is the order of the
-- names with "/" read as NUL, which no name has and which sorts first.
local function walk_sorted(found)
  local keys = {}
  for _, f in ipairs(found) do keys[f] = f.name:gsub("/", "\0") end
  table_sort(found, function(a, b) return keys[a] < keys[b] end)
  return found
end

-- Files left in /home/user/output, over envd (languages without the hooks):
-- a listing FILES_DEPTH levels deep, its regular files named by their path
-- below the output directory. envd's listing is JSON: a name that is not
-- UTF-8 comes back with U+FFFD in it (or without one). Then the directory is
-- listed again by a command that prints each regular file's size and path
-- bytes (NUL-separated, base64), so such files come back under their real names.
local LIST_CMD = string_format("find %s -mindepth 1 -maxdepth %d -type f -printf '%%s %%P\\0' | base64 -w 0",
  OUTPUT_DIR, _M.FILES_DEPTH)
_M.LIST_CMD = LIST_CMD

local PREFIX = OUTPUT_DIR .. "/"

-- The regular files of an envd listing as { name, size }, or nil when the
-- listing lost a name (of the file or of a directory above it).
local function envd_files(entries)
  local found = {}
  for _, e in ipairs(entries) do
    if type(e) == "table" and e.type == "file" then -- list_dir maps FILE_TYPE_FILE to "file"
      local path = e.path
      if type(path) ~= "string" or path:sub(1, #PREFIX) ~= PREFIX or path:find("\xEF\xBF\xBD", 1, true)
        or type(e.name) ~= "string" or e.name:find("\xEF\xBF\xBD", 1, true) then
        return nil
      end
      found[#found + 1] = { name = path:sub(#PREFIX + 1), size = size_of(e.size) or 0 }
    end
  end
  return found
end

local function list_by_command(sbx)
  local res, err, code = sbx:run_command(LIST_CMD, { timeout = 60 })
  if not res then return nil, err, code end
  if res.exit_code ~= 0 then
    return nil, "list " .. OUTPUT_DIR .. ": exit status " .. tostring(res.exit_code) .. ": " .. tostring(res.stderr),
      "HTTP"
  end
  local found = {}
  for size, name in (b64_decode(res.stdout or "") or ""):gmatch("(%d+) ([^\0]+)\0") do
    found[#found + 1] = { name = name, size = tonumber(size) }
  end
  return found
end

-- syntax: files, err, code = outputs.collect_envd(sbx, cap)
local function collect_envd(sbx, cap)
  local entries, err, code = sbx:list_dir(OUTPUT_DIR, _M.FILES_DEPTH)
  if not entries then
    if code == "NOT_FOUND" then return {} end
    return nil, err, code
  end
  local found = envd_files(entries)
  if not found then
    found, err, code = list_by_command(sbx)
    if not found then return nil, err, code end
  end
  return take_walk(walk_sorted(found), cap, function(e)
    return { name = e.name, size = e.size, mime = mime_of(e.name),
      read = function(max) return sbx:read_file(PREFIX .. e.name, { max_bytes = max }) end }
  end)
end

-- One entry of the output report as take_walk takes it.
local function report_file(sbx, f)
  if type(f) ~= "table" or type(f.name) ~= "string" then
    return nil, "the output report lists an entry that is not a file"
  end
  -- The name's bytes as they are (a name that is not UTF-8 included).
  local name = f.name
  if type(f.name_b64) == "string" then name = b64_decode(f.name_b64) or name end
  local mime = type(f.mime) == "string" and f.mime or mime_of(name)
  local size = size_of(f.size)
  if not size then return nil, string_format("output file %q: no valid size in the report", name) end
  local content = type(f.b64) == "string" and b64_decode(f.b64) or nil
  if content then return { name = name, size = #content, mime = mime, read = function() return content end } end
  return { name = name, size = size, mime = mime,
    read = function(max) return sbx:read_file(PREFIX .. name, { max_bytes = max }) end }
end

-- The files of the python hook's output report (walked in the kernel, in
-- walk order: see python/output_hook.py).
-- syntax: files, err, code = outputs.files_from_report(sbx, report, cap)
local function files_from_report(sbx, report, cap)
  return take_walk(report.files, cap, function(f) return report_file(sbx, f) end)
end
_M.collect_envd = collect_envd
_M.files_from_report = files_from_report

return _M
