--- warmbox.sim.events: a recorded stretch of E2B lifecycle events (what
-- `GET /events/sandboxes` or the webhooks sent) made into a trace, so the
-- simulator replays a team's own traffic against candidate policies.
--
-- A conversation is the session key in the sandboxes' warmbox tag (every
-- fingerprint); a turn is a moment the conversation's sandbox had to be
-- made ready: its create, its resume, and each lease extension (an updated
-- event). A warm run that needed no request leaves no event and moved no
-- lease, so leaving it out changes neither the lifecycle nor the cost.
-- Sandboxes without a warmbox tag are left out. The size is the one most of
-- the executions had (pause and kill events carry it).
--
--   local turns, info = events.trace(list, { tag = "warmboxSessionId", duration = 0.5 })
-- @module warmbox.sim.events
local json = require "warmbox.json"
local tag_mod = require "warmbox.tag"
local util = require "warmbox.util"

local type, ipairs, pairs, tostring, tonumber, table_sort = type, ipairs, pairs, tostring, tonumber, table.sort

local _M = {}

local TURN = { created = true, resumed = true, updated = true }

--- Events from a file: a JSON array, or JSON lines (one event each).
-- @treturn[1] table events
-- @return[2] nil, msg, code ("NOT_FOUND", "BAD_REQUEST")
function _M.load(path)
  local text = util.read_file(path)
  if not text then return nil, "cannot read events file " .. tostring(path), "NOT_FOUND" end
  if text:match("^%s*%[") then
    local arr = json.decode(text)
    if type(arr) ~= "table" then return nil, "events file " .. path .. ": not JSON", "BAD_REQUEST" end
    return arr
  end
  local out, n = {}, 0
  for line in text:gmatch("[^\n]+") do
    n = n + 1
    if not line:match("^%s*$") and not line:match("^%s*#") then
      local e = json.decode(line)
      if type(e) ~= "table" then return nil, ("events file %s: line %d is not JSON"):format(path, n), "BAD_REQUEST" end
      out[#out + 1] = e
    end
  end
  return out
end

--- The trace of a list of events.
-- @tparam table list events (any order; duplicates by id are taken once)
-- @tparam[opt] table o `tag` ("warmboxSessionId"), `duration` (seconds each turn's code runs, 0.5)
-- @treturn[1] table turns `{ t, session, duration }` sorted by `t` (0: the first turn)
-- @treturn[1] table info `{ start (unix s of t = 0), conversations, turns, size = { cpu_count, memory_mb } }`
-- @return[2] nil, msg, "BAD_REQUEST" (no turn)
-- One event's time, kind, session key (nil without a warmbox tag) and size ("cpu/mb" or nil).
local function read_event(e, tag)
  local ts, kind = util.parse_time(json.value(e.timestamp)), json.value(e.type)
  local data = type(json.value(e.eventData)) == "table" and e.eventData or {}
  local md = type(json.value(data.sandbox_metadata)) == "table" and data.sandbox_metadata or {}
  local key, enc = tag_mod.parse_tag(json.value(md[tag]))
  local x, size = json.value(data.execution), nil
  if type(x) == "table" and type(x.vcpu_count) == "number" and type(x.memory_mb) == "number" then
    size = string.format("%d/%d", math.floor(x.vcpu_count), math.floor(x.memory_mb))
  end
  return ts, type(kind) == "string" and kind:match("([a-z]+)$") or nil, key or enc, size
end

function _M.trace(list, o)
  o = o or {}
  local tag, duration = o.tag or "warmboxSessionId", o.duration or 0.5
  local seen, raw, sizes, keys = {}, {}, {}, {}
  for _, e in ipairs(list) do
    local id = json.value(e.id)
    local ts, kind, key, size = read_event(e, tag)
    if type(id) == "string" and not seen[id] and ts and kind then
      seen[id] = true
      if size then sizes[size] = (sizes[size] or 0) + 1 end
      if key and TURN[kind] then raw[#raw + 1] = { ts = ts, session = key } end
    end
  end
  if #raw == 0 then return nil, "no turn in the events (no created, resumed or updated event of a warmbox tag)",
    "BAD_REQUEST" end
  table_sort(raw, function(a, b) return a.ts < b.ts end)
  local t0, turns = raw[1].ts, {}
  for i, r in ipairs(raw) do
    turns[i] = { t = r.ts - t0, session = r.session, duration = duration }
    keys[r.session] = true
  end
  local best, bn = nil, 0
  for k, n in pairs(sizes) do
    if n > bn or (n == bn and k < best) then best, bn = k, n end
  end
  local info = { start = t0, turns = #turns, conversations = 0 }
  for _ in pairs(keys) do info.conversations = info.conversations + 1 end
  if best then
    local c, m = best:match("^(%d+)/(%d+)$")
    info.size = { cpu_count = math.tointeger(tonumber(c)), memory_mb = math.tointeger(tonumber(m)) }
  end
  return turns, info
end

return _M
