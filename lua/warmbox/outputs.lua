--- What a run leaves behind: the python output hooks (their source and the
-- prelude line), the output report they display, output file collection over
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

-- ------------------------------------------------------------------
-- The python output hooks (registered once per kernel)
-- ------------------------------------------------------------------

local HOOK_SRC = [[
def _cells(ip, os):
    # At most once behind an intermediary: a cell the session sends starts with
    # a line naming its id (and its run's fencing number). Accepting it makes
    # the directory <cells>/<id>; a session that got no answer makes that
    # directory first to give the cell up, so a late copy is refused here,
    # before any of it runs. Fencing: a cell whose number is lower than the
    # highest this sandbox accepted (in <fence>) is refused too.
    import re
    cells = '%s'
    fence = '%s'
    pat = re.compile(r"^__warmbox_cell__\('([0-9a-f]{1,64})'(?:, ([0-9]{1,19}))?\)\s*$")
    seen = []
    def highest():
        try:
            with open(fence) as f:
                return int(f.read().strip() or 0)
        except (OSError, ValueError):
            return 0
    def accept(lines):
        m = pat.match(lines[0]) if lines else None
        if m is None:
            return lines
        n, high = m.group(2) and int(m.group(2)), highest()
        if n is not None and n < high:
            raise RuntimeError('warmbox: fenced: run ' + str(n) + ' is older than run ' + str(high)
                               + ' of this sandbox; not run') from None
        os.makedirs(cells, exist_ok=True)
        try:
            os.mkdir(os.path.join(cells, m.group(1)))
        except FileExistsError:
            raise RuntimeError('warmbox: cell ' + m.group(1) + ' was given up by its session; not run') from None
        if n is not None and n > high:
            with open(fence + '.tmp', 'w') as f:
                f.write(str(n))
            os.replace(fence + '.tmp', fence)
        seen.append(m.group(1))
        while len(seen) > %d:
            try:
                os.rmdir(os.path.join(cells, seen.pop(0)))
            except OSError:
                pass
        return lines[1:]
    ip.input_transformers_cleanup.insert(0, accept)
    ip._warmbox_cells = True
def _wb():
    import os, base64, mimetypes, shutil
    ip = __import__('IPython').get_ipython()
    if ip is None:
        return
    # this cell is warmbox's: the user's next cell keeps the number it would have had
    ip.execution_count -= 1
    if not getattr(ip, '_warmbox_cells', False):
        _cells(ip, os)
    if getattr(ip, '_warmbox_hooks', False):
        return
    out = '%s'
    limit = %d
    budget = [%d]
    def reset(*_a, **_k):
        try:
            if os.path.islink(out) or os.path.isfile(out):
                os.unlink(out)
            else:
                shutil.rmtree(out, ignore_errors=True)
            os.makedirs(out, exist_ok=True)
        except Exception:
            pass
    def report(*_a, **_k):
        files = []
        budget[0] = %d
        try:
            for root, dirs, names in os.walk(out):
                dirs.sort()
                for n in sorted(names):
                    p = os.path.join(root, n)
                    if os.path.islink(p) or not os.path.isfile(p):
                        continue
                    size = os.path.getsize(p)
                    rel = os.path.relpath(p, out)
                    e = {'name': rel, 'size': size,
                         'name_b64': base64.b64encode(os.fsencode(rel)).decode('ascii'),
                         'mime': mimetypes.guess_type(n)[0] or 'application/octet-stream'}
                    if size <= limit and size <= budget[0]:
                        with open(p, 'rb') as f:
                            data = f.read(limit + 1)
                        if len(data) <= limit and len(data) <= budget[0]:
                            budget[0] -= len(data)
                            e['b64'] = base64.b64encode(data).decode('ascii')
                    files.append(e)
        except Exception:
            pass
        from IPython.display import display
        display({'%s': {'v': 1, 'files': files}}, raw=True)
    ip.events.register('pre_run_cell', reset)
    ip.events.register('post_run_cell', report)
    ip._warmbox_hooks = True
    reset()
try:
    _wb()
except Exception:
    pass
]]

--- The cell that installs the hooks, sent on its own before the user's cell when the
-- kernel may not have them yet (idempotent: guarded by an attribute on `get_ipython()`).
function _M.prelude_for(dir)
  return "exec(__import__('base64').b64decode('"
    .. b64_encode(string_format(HOOK_SRC, _M.CELLS_DIR, _M.FENCE_FILE, _M.CELLS_KEPT, dir, _M.INLINE_LIMIT,
      _M.INLINE_TOTAL, _M.INLINE_TOTAL, _M.OUTPUTS_MIME))
    .. "').decode(), {})"
end
_M.PRELUDE = _M.prelude_for(OUTPUT_DIR)

--- A python cell marked with its id and its run's fencing number (a first
-- line the hooks strip before the cell is compiled, so its line numbers stay
-- the user's). A kernel without the hooks fails on that line (NameError)
-- before anything of the cell runs.
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

local function outputs_of(res)
  if type(res) ~= "table" then return nil end
  local v = type(res.extra) == "table" and res.extra[_M.OUTPUTS_MIME] or res[_M.OUTPUTS_MIME]
  if type(v) == "string" then v = json.decode(v) end
  if type(v) == "table" and type(v.files) == "table" then return v end
  return nil
end
_M.outputs_of = outputs_of

local function is_dir_entry(e)
  return e.type == "dir" or e.type == "directory" or e.type == "FILE_TYPE_DIRECTORY"
end

--- Checks an output file's name (from the output report or envd's listing,
-- both written by code in the sandbox): a relative path below the output
-- directory. Empty names, NUL, an absolute path and "", "." or ".." parts
-- are refused, so no name the caller may join to a directory climbs out.
-- @treturn[1] string the name
-- @return[2] nil, message
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

-- Files left in /home/user/output, over envd (languages without the hooks).
-- envd's listing is JSON: a name that is not UTF-8 comes back without a name
-- (warmboxd) or with U+FFFD in it (E2B's envd). Then the directory is listed
-- again by a command that prints each regular file's size and name bytes
-- (NUL-separated, base64), so such files come back under their real names.
local LIST_CMD = "find " .. OUTPUT_DIR .. " -mindepth 1 -maxdepth 1 -type f -printf '%s %f\\0' | base64 -w 0"
_M.LIST_CMD = LIST_CMD

local function listing_lost_names(entries)
  for _, e in ipairs(entries) do
    if type(e) == "table" and (type(e.name) ~= "string" or e.name:find("\xEF\xBF\xBD", 1, true)) then return true end
  end
  return false
end

local function list_by_command(sbx)
  local res, err, code = sbx:run_command(LIST_CMD, { timeout = 60 })
  if not res then return nil, err, code end
  if res.exit_code ~= 0 then
    return nil, "list " .. OUTPUT_DIR .. ": exit status " .. tostring(res.exit_code) .. ": " .. tostring(res.stderr),
      "HTTP"
  end
  local entries = {}
  for size, name in (b64_decode(res.stdout or "") or ""):gmatch("(%d+) ([^\0]+)\0") do
    entries[#entries + 1] = { name = name, size = tonumber(size), type = "file" }
  end
  return entries
end

local function collect_envd(sbx, cap)
  local entries, err, code = sbx:list_dir(OUTPUT_DIR, 1)
  if not entries then
    if code == "NOT_FOUND" then return {} end
    return nil, err, code
  end
  if listing_lost_names(entries) then
    entries, err, code = list_by_command(sbx)
    if not entries then return nil, err, code end
  end
  local files = {}
  table_sort(entries, function(a, b) return tostring(a.name) < tostring(b.name) end)
  for _, e in ipairs(entries) do
    if type(e) == "table" and type(e.name) == "string" and not is_dir_entry(e) and e.type ~= "symlink"
      and e.type ~= "FILE_TYPE_SYMLINK" then
      local ok, rerr, rcode = take_file(files, cap, e.name, size_of(e.size) or 0, mime_of(e.name),
        function(max) return sbx:read_file(OUTPUT_DIR .. "/" .. e.name, { max_bytes = max }) end)
      if not ok then return nil, rerr, rcode, files end
    end
  end
  return files
end

local function files_from_report(sbx, report, cap)
  local files = {}
  for _, f in ipairs(report.files) do
    if type(f) ~= "table" or type(f.name) ~= "string" then
      return nil, "the output report lists an entry that is not a file", "PROTOCOL", files
    else
      -- The name's bytes as they are (a name that is not UTF-8 included).
      local name = f.name
      if type(f.name_b64) == "string" then name = b64_decode(f.name_b64) or name end
      local mime = type(f.mime) == "string" and f.mime or mime_of(name)
      local content = type(f.b64) == "string" and b64_decode(f.b64) or nil
      local ok, err, code
      local size = size_of(f.size)
      if not size then
        ok, err, code = protocol_error(string_format("output file %q: no valid size in the report", name))
      elseif content then
        ok, err, code = take_file(files, cap, name, #content, mime, function() return content end)
      else
        ok, err, code = take_file(files, cap, name, size, mime,
          function(max) return sbx:read_file(OUTPUT_DIR .. "/" .. name, { max_bytes = max }) end)
      end
      if not ok then return nil, err, code, files end
    end
  end
  return files
end
_M.collect_envd = collect_envd
_M.files_from_report = files_from_report

return _M
