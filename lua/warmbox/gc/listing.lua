--- warmbox.gc.listing: the pages a GC pass lists, from one end or both.
--
-- One cursor lists newest first (E2B's order); when the policy's decisions do
-- not depend on the order, two cursors list at once, newest first and oldest
-- first, and stop where they meet: each drops what the other already took.
-- A cursor (a "direction") is `{ asc, token, key, done, paused, pending,
-- open, ohead, otail, other }`: `token` its next page, `key` the listing key
-- of the last item it took (its frontier), `pending` its page listed last
-- (awaiting the re-check), `open` the pages with entries not finished yet,
-- oldest first (where a pass interrupted now resumes).
-- @module warmbox.gc.listing
local util = require "warmbox.util"
local json = require "warmbox.json"

local type, ipairs, tonumber, setmetatable = type, ipairs, tonumber, setmetatable
local fmt, tointeger = string.format, math.tointeger
local parse_time = util.parse_time

local _M = {}

-- ---------------------------------------------------------------------------
-- the listing order
-- ---------------------------------------------------------------------------

--- E2B's listing order (E2B's API, pagination): newest first by `startedAt`
-- truncated to microseconds, ties by sandbox id ascending; `order=asc` is the
-- exact reverse, and a page starts strictly after its cursor's item. A key is
-- `{ microseconds, id }`, or nil when `started_at` cannot be read.
-- syntax: key = gc.list_key(d)
function _M.list_key(d)
  local s = d.started_at
  if type(s) ~= "string" or type(d.sandbox_id) ~= "string" then return nil end
  local base, frac, tz = s:match("^(%d%d%d%d%-%d%d%-%d%d[Tt ]%d%d:%d%d:%d%d)%.?(%d*)(.*)$")
  if not base then return nil end
  local secs = tointeger(parse_time(base .. tz))
  if not secs then return nil end
  return { secs * 1000000 + tonumber((frac .. "000000"):sub(1, 6)), d.sandbox_id }
end
local list_key = _M.list_key

--- Whether key a comes before key b in the newest-first order.
-- syntax: bool = gc.before(a, b)
function _M.before(a, b)
  if a[1] ~= b[1] then return a[1] > b[1] end
  return a[2] < b[2]
end
local before = _M.before

-- Whether direction d already took the item at key k: newest first covers
-- what is at or before its frontier, oldest first what is at or after it.
local function covered(d, k)
  local f = d.key
  if f[1] == k[1] and f[2] == k[2] then return true end
  if d.asc then return before(f, k) end
  return before(k, f)
end

-- ---------------------------------------------------------------------------
-- resume tokens
-- ---------------------------------------------------------------------------

-- A two-ended pass's resume token: "wbgc1." and base64url of the JSON
-- `{ d = side, a = side }`, a side being `{ t = E2B page token | false, k =
-- frontier key "us/id" | false }` or `{ done = true, k = ... }`.
local TOKEN_PREFIX = "wbgc1."

local function encode_key(k)
  if not k then return false end
  return fmt("%d/%s", k[1], k[2])
end

local function decode_key(s)
  if s == false or s == nil then return nil end
  if type(s) ~= "string" then return nil, false end
  local us, id = s:match("^(%-?%d+)/(.+)$")
  if not us then return nil, false end
  return { tointeger(tonumber(us)), id }
end

local function encode_token(t)
  local b = util.b64_encode(json.encode(t)):gsub("[+/=]", { ["+"] = "-", ["/"] = "_", ["="] = "" })
  return TOKEN_PREFIX .. b
end

--- Whether `s` is a two-ended pass's resume token (not an E2B page token).
function _M.is_two_ended(s)
  return s:sub(1, #TOKEN_PREFIX) == TOKEN_PREFIX
end

--- The sides of a two-ended pass's resume token `{ d = side, a = side }`, a
-- side being `{ token, key }` or `{ done = true, key }`; nil when it is not one.
function _M.decode_token(s)
  local raw = util.b64_decode(s:sub(#TOKEN_PREFIX + 1))
  local t = raw and json.decode(raw)
  if type(t) ~= "table" then return nil end
  local out = {}
  for _, side in ipairs({ "d", "a" }) do
    local e = t[side]
    if type(e) ~= "table" then return nil end
    local k, bad = decode_key(e.k)
    if bad == false then return nil end
    if e.done == true then
      out[side] = { done = true, key = k }
    else
      if e.t ~= false and type(e.t) ~= "string" then return nil end
      out[side] = { token = e.t or nil, key = k }
    end
  end
  return out
end

-- ---------------------------------------------------------------------------
-- a client without batch
-- ---------------------------------------------------------------------------

--- Calls fn(item) for each listed item, page by page (`list` when the client has
-- it, else `list_all`); an error (nil/false, msg, code) is returned, not swallowed.
function _M.each_listed(client, opts, fn)
  if type(client.list) ~= "function" then
    local items, err, code = client:list_all(opts)
    if not items then return nil, err, code end
    for _, it in ipairs(items) do fn(it) end
    return true
  end
  for item, err, code in client:list(opts) do
    if not item then return nil, err, code end
    fn(item)
  end
  return true
end

-- Pages of a client without `batch`: its `list_pages`, or pages cut from its
-- `list` iterator (such a client's tokens are not resumable).
local function pages_of(client, opts)
  if type(client.list_pages) == "function" then return client:list_pages(opts) end
  local it = client:list(opts)
  local done, n = false, 0
  local ahead, aerr, acode = it()
  return function()
    if done then return nil end
    local page = {}
    while #page < opts.limit do
      if ahead == false or (ahead == nil and aerr ~= nil) then
        done = true
        return false, aerr, acode
      end
      if ahead == nil then break end
      page[#page + 1] = ahead
      ahead, aerr, acode = it()
    end
    n = n + 1
    if ahead == nil and aerr == nil then done = true end
    if #page == 0 then return nil end
    return page, false, (not done) and ("list:" .. n) or nil
  end
end

-- ---------------------------------------------------------------------------
-- the listing
-- ---------------------------------------------------------------------------

local Listing = { __name = "warmbox.gc.Listing" }
Listing.__index = Listing

local function new_dir(asc, st)
  st = st or {}
  return { asc = asc, token = st.token, key = st.key, done = st.done or false, open = {}, ohead = 1, otail = 0 }
end

--- A pass's listing: `client` (its `list_pages` or `list` when it has no
-- batch), `limit` (a page's size), `both` (two cursors), `resume_from` (a
-- two-ended token's sides), `next_token` (one cursor's first page), `pages`
-- (at most that many pages, nil: all).
function _M.new(client, o)
  local self = setmetatable({ client = client, limit = o.limit, both = o.both, pages_left = o.pages,
    states = { "running", "paused" } }, Listing)
  if o.both then
    -- (a side that finished in an earlier pass lists nothing: its key bounds the other)
    local rf = o.resume_from
    self.dirs = { new_dir(false, rf and rf.d), new_dir(true, rf and rf.a) }
    self.dirs[1].other, self.dirs[2].other = self.dirs[2], self.dirs[1]
  else
    self.dirs = { new_dir(false, { token = o.next_token }) }
  end
  return self
end

--- Whether every direction is done (nothing more to list).
function Listing:done()
  for _, d in ipairs(self.dirs) do if not d.done then return false end end
  return true
end

--- Whether a direction may still list (neither done nor paused).
function Listing:active()
  for _, d in ipairs(self.dirs) do if not d.done and not d.paused then return true end end
  return false
end

--- May direction d list another page (`pages`)? `n`: the lists of this batch so far.
function Listing:may_list(d, n)
  return not d.done and not d.paused and (not self.pages_left or n < self.pages_left)
end

--- Stops listing (what is listed is finished; the pass resumes from there).
function Listing:pause()
  for _, d in ipairs(self.dirs) do d.paused = true end
end

--- A batch's list request for direction d's page at `token`.
function Listing:op(d, token)
  return { op = "list", opts = { state = self.states, limit = self.limit, next_token = token or nil,
    order = d.asc and "asc" or nil } }
end

--- The next page of a client without batch: items, used token, next token
-- (its listing made on first use, from the first direction's token).
function Listing:seq_page()
  if not self.seq then
    self.seq = pages_of(self.client, { state = self.states, limit = self.limit, next_token = self.dirs[1].token })
  end
  return self.seq()
end

--- Where a pass starts again: the earliest open page of each direction when
-- `open`, else its next page; nil when nothing is left.
function Listing:token(open)
  local dirs = self.dirs
  if not self.both then
    local d = dirs[1]
    local pg = open and d.open[d.ohead]
    if pg then return pg.token or nil end
    if d.done then return nil end
    return d.token
  end
  local t, left = {}, false
  for _, d in ipairs(dirs) do
    local pg = open and d.open[d.ohead]
    local e
    if pg then
      e = { t = pg.token or false, k = encode_key(pg.key) }
      left = true
    elseif d.done then
      e = { done = true, k = encode_key(d.key) }
    else
      e = { t = d.token or false, k = encode_key(d.key) }
      left = true
    end
    t[d.asc and "a" or "d"] = e
  end
  if not left then return nil end
  return encode_token(t)
end

--- Direction d listed `items`, `nxt` its next page: drops what the other
-- direction already took (the two met), advances d's frontier and the page
-- budget. Returns the items left and d's frontier before this page.
function Listing:take(d, items, nxt)
  local page_key = d.key
  if self.both then
    local o, kept, crossed, last = d.other, {}, false, nil
    for _, it in ipairs(items) do
      local k = list_key(it)
      if k and o.key and covered(o, k) then
        crossed = true
      else
        kept[#kept + 1] = it
        if k then last = k end
      end
    end
    items = kept
    if last then d.key = last end
    -- Met the other side, or reached the end: everything is listed.
    if crossed or not nxt then
      for _, x in ipairs(self.dirs) do x.done = true end
    end
  elseif not nxt then
    d.done = true
  end
  d.token = nxt
  if self.pages_left then
    self.pages_left = self.pages_left - 1
    if self.pages_left <= 0 then self:pause() end
  end
  return items, page_key
end

--- Keeps the page at `token` (frontier `key`) open until its `entries` are
-- finished (`finish`): a pass interrupted meanwhile resumes from it.
function _M.open(d, token, key, entries)
  local pg = { token = token, key = key, left = #entries, dir = d }
  for _, e in ipairs(entries) do e.page = pg end
  d.otail = d.otail + 1
  d.open[d.otail] = pg
end

--- An entry of an open page is finished: its page closes with its last one.
function _M.finish(e)
  local pg = e.page
  if not pg then return end
  e.page = nil
  pg.left = pg.left - 1
  local d = pg.dir
  while d.open[d.ohead] and d.open[d.ohead].left == 0 do
    d.open[d.ohead] = nil
    d.ohead = d.ohead + 1
  end
end

return _M
