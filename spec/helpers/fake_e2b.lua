--- A fake E2B client for unit specs: sandboxes in a table, every call
-- recorded twice, as `calls` (`{ name, args... }`) and as `log` lines
-- ("kill sb1", "pause sb1 true"). The data plane runs cells through
-- `c.exec(sandbox, code, out)` and emulates warmbox's python output hooks.
--   local c = fake_e2b.new{ clock = fn, items = { detail, ... }, kill_many = true }
--   c:add(id, tag_value, state, extra_metadata)   -- listed first (newest)
--   c.fail = { list = CODE, list_at = i, create = CODE, connect = { [id] = CODE|true },
--              set_timeout = { [id] = CODE|true }, read = CODE, run = { { msg, CODE, detail }, ... } }
--   c.loose = true    -- a metadata filter matched by prefix, as a loose server might
--   snapshots: c.snaps (newest first, `{ snapshot_id, names, sandbox_id }`), c.fail.snapshot = CODE,
--   log lines "snapshot sb1 NAME", "delete_snapshot ID", "create TEMPLATE"
--   c.info_over[id] = detail | "gone"
local outputs = require "warmbox.outputs"
local util = require "warmbox.util"

local MIME, PRELUDE, CELLS_DIR = outputs.OUTPUTS_MIME, outputs.PRELUDE, outputs.CELLS_DIR

local M = {}

local DETAIL = { "sandbox_id", "metadata", "state", "started_at", "end_at", "template_id" }

function M.new(o)
  o = o or {}
  local clock = o.clock or function() return 0 end
  local c = { calls = {}, log = {}, killed = {}, sb = {}, order = {}, seq = 0, fail = {}, loose = false,
    exec = nil, info_over = {}, batches = {} }
  local function rec(name, ...) c.calls[#c.calls + 1] = { name, ... } end
  local function log(...) c.log[#c.log + 1] = table.concat({ ... }, " ") end
  --- The code of every run_code call, in order.
  function c:codes()
    local out = {}
    for _, call in ipairs(self.calls) do if call[1] == "run_code" then out[#out + 1] = call[3] end end
    return out
  end
  --- The log lines of one call name ("kill sb1", ...).
  function c:calls_of(name)
    local out = {}
    for _, l in ipairs(self.log) do
      if l:sub(1, #name + 1) == name .. " " then out[#out + 1] = l end
    end
    return out
  end
  function c:count(name)
    local n = 0
    for _, call in ipairs(self.calls) do if call[1] == name then n = n + 1 end end
    return n
  end
  function c:ids(name)
    local out = {}
    for _, call in ipairs(self.calls) do if call[1] == name then out[#out + 1] = call[2] end end
    return out
  end
  function c:add(id, tagvalue, state, extra_md)
    local md = { warmboxSessionId = tagvalue }
    for k, v in pairs(extra_md or {}) do md[k] = v end
    self.sb[id] = { sandbox_id = id, metadata = md, state = state or "running", lease_end = clock() + 10,
      output = {}, hooked = false }
    table.insert(self.order, 1, id)
  end
  --- A sandbox as E2B lists it (`{ sandbox_id, metadata, state, started_at, ... }`), listed last.
  function c:put(item)
    local s = { output = {}, hooked = false, lease_end = clock() + 10 }
    for k, v in pairs(item) do s[k] = v end
    self.sb[item.sandbox_id] = s
    self.order[#self.order + 1] = item.sandbox_id
  end
  for _, item in ipairs(o.items or {}) do c:put(item) end
  local function detail(s)
    local d = {}
    for _, k in ipairs(DETAIL) do d[k] = s[k] end
    return d
  end
  local function listed(lo)
    local out = {}
    for _, id in ipairs(c.order) do
      local s = c.sb[id]
      if s and not s.killed then
        local ok = true
        for k, v in pairs(lo.metadata or {}) do
          local have = type(s.metadata) == "table" and s.metadata[k]
          if c.loose then
            ok = ok and type(have) == "string" and have:sub(1, #v) == v
          else
            ok = ok and have == v
          end
        end
        if ok then out[#out + 1] = detail(s) end
      end
    end
    return out
  end
  function c:list_all(lo)
    rec("list", lo)
    self.listed = lo
    if self.fail.list then return nil, "list failed", self.fail.list end
    return listed(lo)
  end
  function c:list(lo)
    rec("list", lo)
    log("list", table.concat(lo.state or {}, ","), lo.metadata and next(lo.metadata) or "")
    self.listed = lo
    local items, i = listed(lo), 0
    return function()
      i = i + 1
      if self.fail.list_at == i then return false, "list sandboxes: boom", "HTTP" end
      return items[i]
    end
  end
  function c:info(id)
    rec("info", id)
    log("info", id)
    local over = self.info_over[id]
    if over == "gone" then return nil, "sandbox '" .. id .. "' not found", "NOT_FOUND" end
    if over then return over end
    local s = self.sb[id]
    if not s or s.killed then return nil, "sandbox '" .. id .. "' not found", "NOT_FOUND" end
    return detail(s)
  end
  function c:connect(id, co)
    rec("connect", id, co and co.timeout)
    log("connect", id)
    local s = self.sb[id]
    local cf = self.fail.connect and self.fail.connect[id]
    if cf then return nil, "connect failed", cf == true and "HTTP" or cf end
    if not s or s.killed then return nil, "sandbox '" .. id .. "' not found", "NOT_FOUND" end
    local resumed = s.state == "paused"
    s.state = "running"
    s.lease_end = math.max(s.lease_end, clock() + (co and co.timeout or 300))
    return { sandbox_id = id, envd_access_token = "tok-" .. id }, resumed
  end
  function c:pause(id, po)
    rec("pause", id)
    log("pause", id, tostring(po and po.memory))
    local s = self.sb[id]
    if not s or s.killed then return nil, "sandbox '" .. id .. "' not found", "NOT_FOUND" end
    if s.state == "paused" then return false end
    s.state = "paused"
    return true
  end
  function c:set_timeout(id, t)
    rec("set_timeout", id, t)
    local tf = self.fail.set_timeout and self.fail.set_timeout[id]
    if tf then return nil, "timeout failed", tf == true and "HTTP" or tf end
    self.sb[id].lease_end = clock() + t
    return true
  end
  function c:kill(id)
    rec("kill", id)
    log("kill", id)
    local s = self.sb[id]
    if not s or s.killed then return false end
    s.killed = true
    self.killed[#self.killed + 1] = id
    return true
  end
  if o.kill_many then
    function c:kill_many(ids, ko)
      self.batches[#self.batches + 1] = { n = #ids, concurrency = ko.concurrency }
      local out = {}
      for i, id in ipairs(ids) do out[i] = { self:kill(id) } end
      return out
    end
  end
  function c:create(p)
    rec("create", p)
    log("create", tostring(p.template))
    if self.fail.create then return nil, "create failed", self.fail.create end
    self.seq = self.seq + 1
    local id = "new" .. self.seq
    self:add(id, p.metadata.warmboxSessionId, "running")
    self.sb[id].metadata = p.metadata
    self.sb[id].lease_end = clock() + p.timeout
    self.sb[id].env = p.env_vars
    return { sandbox_id = id, envd_access_token = "tok-" .. id }
  end
  function c:sandbox(sb, so)
    local client = self
    local h = { id = sb.sandbox_id, token = so.access_token }
    function h.write_files(_, list)
      rec("write_files", h.id, list)
      local s = client.sb[h.id]
      s.files = s.files or {}
      for _, f in ipairs(list) do s.files[f.path] = f.data end
      return list
    end
    function h.read_file(_, path)
      rec("read_file", h.id, path)
      local name = path:match("^/home/user/output/(.+)$")
      local s = client.sb[h.id]
      if client.fail.read then return nil, "read failed", client.fail.read end
      if name and s.output[name] then return s.output[name] end
      return nil, "not found", "NOT_FOUND"
    end
    function h.list_dir(_, path)
      rec("list_dir", h.id, path)
      local out = {}
      for name in pairs(client.sb[h.id].output) do
        out[#out + 1] = { name = name:match("[^/]*$"), path = path .. "/" .. name, type = "file" }
      end
      return out
    end
    function h.remove(_, path)
      rec("remove", h.id, path)
      client.sb[h.id].output = {}
      return true
    end
    function h.make_dir(_, path)
      rec("make_dir", h.id, path)
      local s = client.sb[h.id]
      if not s or s.killed or s.state ~= "running" then return nil, "the sandbox was not found", "SANDBOX_GONE" end
      local cell = path:match("^" .. CELLS_DIR .. "/(.+)$")
      if cell then
        s.cells = s.cells or {}
        if s.cells[cell] then return false end
        s.cells[cell] = "given up"
      end
      return true
    end
    local BASH_GUARDED = "^__wb_g%(%).-; if __wb_g '(%x+)' '%d*'; then unset %-f __wb_g; :; (.*)\n"
      .. "else unset %-f __wb_g; fi$"
    local JS_GUARDED = "^%(%(id, n%) => .-}%)%('(%x+)', '%d*'%); (.*)$"
    function h.run_code(_, code, ro)
      -- The kernel's side of a marked cell (warmbox.outputs.cell_marked): the
      -- mark is stripped by the hooks; calls and codes() show the cell as the user wrote it.
      local cell, rest = code:match("^__warmbox_cell__%('(%x+)'[, %d]*%)\n(.*)$")
      local guarded = false
      if not cell then -- bash, JS, TS: the guard (warmbox.outputs.cell_guarded) on the first line
        cell, rest = code:match(BASH_GUARDED)
        if not cell then cell, rest = code:match(JS_GUARDED) end
        guarded = cell ~= nil
      end
      rec("run_code", h.id, rest or code, ro)
      local s = client.sb[h.id]
      if not s or s.killed or s.state ~= "running" then
        return nil, "the sandbox was not found", "SANDBOX_GONE", { status = 502, started = false, sent = true }
      end
      if client.fail.run then
        local f = table.remove(client.fail.run, 1)
        if f then
          if f.before_run then f.before_run(s) end
          return nil, f[1], f[2], f[3] or (f[2] == "SANDBOX_GONE" and { status = 502, started = false } or {})
        end
      end
      local python = (ro.language or "python") == "python"
      if cell and not s.hooked and not guarded then
        return { stdout = {}, stderr = {}, results = {}, error = { name = "NameError",
          value = "name '__warmbox_cell__' is not defined", traceback = "" } }
      elseif cell then
        s.cells = s.cells or {}
        if s.cells[cell] then
          return { stdout = {}, stderr = {}, results = {}, error = { name = "RuntimeError",
            value = "warmbox: cell " .. cell .. " was given up by its session; not run", traceback = "" } }
        end
        s.cells[cell] = "accepted"
        code = rest
      end
      local hook_cell = python and code == PRELUDE
      if hook_cell then
        if not s.hooked then s.output = {} end -- the hooks' own reset
        s.hooked = true
      elseif python and s.hooked then
        s.output = {} -- pre_run_cell
      end
      local out = { stdout = {}, stderr = {}, results = {} }
      if client.exec and not hook_cell then client.exec(s, code, out) end
      for _, t in ipairs(out.stdout) do if ro.on_stdout then ro.on_stdout(t) end end
      for _, r in ipairs(out.results) do if ro.on_result then ro.on_result(r) end end
      if python and s.hooked then
        local files = {}
        for name, data in pairs(s.output) do
          local e = { name = name, size = #data, mime = "image/png", name_b64 = util.b64_encode(name) }
          if #data <= 8 then e.b64 = util.b64_encode(data) end
          files[#files + 1] = e
        end
        table.sort(files, function(a, b) return a.name < b.name end)
        local marker = { is_main_result = false, extra = { [MIME] = { v = 1, files = files } } }
        out.results[#out.results + 1] = marker
        if ro.on_result then ro.on_result(marker) end
      end
      return out
    end
    return h
  end
  c.snaps = {}
  function c:snapshot(id, so)
    rec("snapshot", id, so and so.name)
    log("snapshot", id, tostring(so and so.name))
    if self.fail.snapshot then return nil, "snapshot failed", self.fail.snapshot end
    local s = self.sb[id]
    if not s or s.killed or s.state ~= "running" then return nil, "sandbox '" .. id .. "' not found", "NOT_FOUND" end
    local sid = so and so.name and (so.name .. ":default") or ("snap" .. #self.snaps + 1)
    table.insert(self.snaps, 1, { snapshot_id = sid, names = so and so.name and { sid } or {}, sandbox_id = id,
      files = util.copy(s.files or {}) })
    return { snapshot_id = sid, names = so and so.name and { sid } or {} }
  end
  function c:list_snapshot_pages()
    rec("list_snapshots")
    local done = false
    return function()
      if done then return nil end
      done = true
      local out = {}
      for i, sn in ipairs(self.snaps) do out[i] = { snapshot_id = sn.snapshot_id, names = sn.names } end
      return out, false, nil
    end
  end
  function c:list_snapshots()
    local out = {}
    for items in self:list_snapshot_pages() do
      for _, it in ipairs(items) do out[#out + 1] = it end
    end
    return out
  end
  function c:delete_snapshot(id)
    rec("delete_snapshot", id)
    log("delete_snapshot", id)
    for i, sn in ipairs(self.snaps) do
      if sn.snapshot_id == id then
        table.remove(self.snaps, i)
        return true
      end
    end
    return false
  end
  return c
end

return M
