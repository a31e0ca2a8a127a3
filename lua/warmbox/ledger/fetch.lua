--- warmbox.ledger.fetch: reads E2B's lifecycle events (`GET /events/sandboxes`)
-- for the ledger, page by page, oldest first, resumable and idempotent.
--
-- E2B pages events by `offset` and `limit` (at most 100) over a list that
-- grows at its new end and loses its old end to the retention (7 days), and
-- an event timed at a lease's end may land a little before events already
-- recorded. So a sync resumes one page before where the last one stopped and
-- steps further back while a page holds no event it has seen (the retention
-- moved the offsets), and every event is taken at most once, by its id.
-- @module warmbox.ledger.fetch
local json = require "warmbox.json"
local wire = require "warmbox.e2b.wire"

local type, ipairs, math_max, math_floor, string_format = type, ipairs, math.max, math.floor, string.format

local _M = {}

_M.PAGE = 100

--- One page of the team's events, oldest first (E2B's `orderAsc=true`).
-- @tparam warmbox.e2b.Client client
-- @tparam number offset
-- @tparam[opt] number limit 1..100 (100)
-- @tparam[opt] string sandbox_id one sandbox's events
-- @treturn[1] table the events as E2B sends them (camelCase tables)
-- @return[2] nil, msg, code, detail
function _M.page(client, offset, limit, sandbox_id)
  local path = "/events/sandboxes" .. (sandbox_id and "/" .. wire.uri_component(sandbox_id) or "")
    .. string_format("?orderAsc=true&offset=%d&limit=%d", math_floor(offset), math_floor(limit or _M.PAGE))
  local what = "list lifecycle events"
  local res, msg, code, sent = (client.transport or client.http):request{ method = "GET",
    url = client.api_url .. path, headers = client.api_headers, retry = client.retry_idem }
  if not res then return wire.transport_failure(what, msg, code, sent) end
  if res.status ~= 200 then return wire.http_failure(res, what) end
  return wire.decode_array(res, what, function(e) return type(json.value(e.id)) == "string" end)
end

local function any_seen(page, seen)
  for _, e in ipairs(page) do
    if seen[e.id] then return true end
  end
  return false
end

--- Reads every event not taken yet and hands each to `add(event)` once.
-- @tparam warmbox.e2b.Client client
-- @tparam table state `{ offset, seen = { [id] = true } }`, kept between syncs (updated)
-- @tparam function add
-- @tparam[opt] function page_fn `page(client, offset, limit)` (specs)
-- @treturn[1] number how many new events
-- @return[2] nil, msg, code, detail (what was read so far is kept: the next sync goes on)
function _M.sync(client, state, add, page_fn)
  page_fn = page_fn or _M.page
  state.seen = state.seen or {}
  local limit = _M.PAGE
  local start = math_max(0, (state.offset or 0) - limit)
  -- step back while the page holds nothing seen (the retention moved the offsets)
  while start > 0 do
    local page, msg, code, detail = page_fn(client, start, limit)
    if not page then return nil, msg, code, detail end
    if any_seen(page, state.seen) then break end
    start = math_max(0, start - limit)
  end
  local new = 0
  while true do
    local page, msg, code, detail = page_fn(client, start, limit)
    if not page then return nil, msg, code, detail end
    for _, e in ipairs(page) do
      if not state.seen[e.id] then
        state.seen[e.id] = true
        add(e)
        new = new + 1
      end
    end
    start = start + #page
    state.offset = start
    if #page < limit then break end
  end
  return new
end

return _M
