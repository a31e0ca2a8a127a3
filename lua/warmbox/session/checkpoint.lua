--- Checkpoints of a conversation: `s:checkpoint`, `s:checkpoints`,
-- `s:branch`, `s:rewind` and the policy hook `checkpoint(info)`, over E2B's
-- persistent snapshots (`POST /sandboxes/{id}/snapshots`, `GET /snapshots`,
-- `DELETE /templates/{id}`, create with `templateID` = a snapshot id).
--
-- A checkpoint is found through E2B alone, by its name (no local registry, so
-- every process and host sees the same list):
--   `wbcp-<conv>-<key>-<turn>-<ms>-<nonce>[_<label>]`
-- `conv` is 16 hex of SHA-256(tag value) (the session: key and fingerprint),
-- `key` 12 hex of SHA-256(key) (what `wb:release(key)` deletes, whatever the
-- fingerprint), `turn` the session's count of runs when it was taken, `ms` its
-- unix time in milliseconds. E2B's snapshot list has no other field to carry
-- them (`{snapshotID, names}`) and filters by exact name only, so a listing
-- reads the team's snapshots and keeps the conversation's names.
--
-- E2B's `POST /sandboxes/{id}/fork` is not used: a fork inherits its parent's
-- metadata (E2B has no call to change it), so it would carry the
-- conversation's tag. A branch or rewind creates from a snapshot with new
-- metadata instead.
-- @module warmbox.session.checkpoint
local errors = require "warmbox.errors"
local util = require "warmbox.util"
local memo = require "warmbox.session.memo"
local resolve = require "warmbox.session.resolve"
local prewarm = require "warmbox.session.prewarm"
local decide = require "warmbox.session.decide"

local type, ipairs, pairs, tostring, tonumber, math_floor, string_format, setmetatable =
  type, ipairs, pairs, tostring, tonumber, math.floor, string.format, setmetatable

local _M = {}

_M.PREFIX = "wbcp-"
--- How long (s) an automatic checkpoint started outside tasks drives the engine at most
-- before the run returns: until its snapshot request has left (as `session.PREWARM_KICK`).
_M.KICK = 0.25
local LABEL_MAX = 40

local function sha(s) return require("warmbox.core").sha256(s) end

--- The name part shared by a session's checkpoints (`wbcp-<conv>-<key>-`).
-- syntax: prefix = checkpoint.conv_prefix(tag_value, key)
function _M.conv_prefix(tag_value, key)
  return _M.PREFIX .. sha(tag_value):sub(1, 16) .. "-" .. sha(key):sub(1, 12) .. "-"
end

--- The 16 hex of a tag value as checkpoint names carry it (GC's orphan rule).
-- syntax: h = checkpoint.conv_hash(tag_value)
function _M.conv_hash(tag_value) return sha(tag_value):sub(1, 16) end
--- The 12 hex of a key as checkpoint names carry it (release).
-- syntax: h = checkpoint.key_hash(key)
function _M.key_hash(key) return sha(key):sub(1, 12) end

local function label_ok(label)
  return #label <= LABEL_MAX and label:match("^[a-z0-9][a-z0-9%-]*$") ~= nil
end

local function nonce() return util.unique_id() end

--- A snapshot's bare name: its first name (or its id) without a `team/` prefix and `:tag`.
local function bare_name(snap)
  local n = (snap.names and snap.names[1]) or snap.snapshot_id
  if type(n) ~= "string" then return nil end
  n = n:gsub("^.*/", "")
  return (n:gsub(":[^:]*$", ""))
end

--- Parses a listed snapshot `{ snapshot_id, names }` into a checkpoint, or nil
-- when it is none of warmbox's: `{ id, name, conv, key_hash, turn, created_at, label }`.
-- syntax: cp = checkpoint.parse(snapshot)
function _M.parse(snap)
  local n = bare_name(snap)
  if not n then return nil end
  local conv, kh, turn, ms, rest = n:match("^wbcp%-(%x+)%-(%x+)%-(%d+)%-(%d+)%-%x+(.*)$")
  if not conv or #conv ~= 16 or #kh ~= 12 then return nil end
  local label
  if rest ~= "" then
    label = rest:match("^_(.+)$")
    if not label then return nil end
  end
  return { id = snap.snapshot_id, name = n, conv = conv, key_hash = kh, turn = tonumber(turn),
    created_at = tonumber(ms) / 1000, label = label }
end

local function oldest_first(a, b)
  if a.created_at ~= b.created_at then return a.created_at < b.created_at end
  if a.turn ~= b.turn then return a.turn < b.turn end
  return a.id < b.id
end

--- Every warmbox checkpoint of the team that `keep(cp)` keeps, oldest first.
-- @return[1] table
-- @return[2] nil, msg, code, detail
-- syntax: list = checkpoint.list(client, keep)
function _M.list(client, keep)
  local snaps, err, code, detail = client:list_snapshots()
  if not snaps then return nil, err, code, detail end
  local out = {}
  for _, s in ipairs(snaps) do
    local cp = _M.parse(s)
    if cp and (not keep or keep(cp)) then out[#out + 1] = cp end
  end
  table.sort(out, oldest_first)
  return out
end

-- The checkpoints of one session (exact conv and key parts).
local function session_list(self)
  local conv, kh = _M.conv_hash(self.tag_value), _M.key_hash(self.key)
  return _M.list(self.client, function(cp) return cp.conv == conv and cp.key_hash == kh end)
end

local function own_state(s, lk) return memo.load_own(lk, s) end

-- Snapshots the remembered sandbox; a 404 (paused: E2B snapshots running
-- sandboxes only; nothing was taken) connects it and asks once more.
local function take(self, st, name)
  local id = st.sandbox_id
  local snap, err, code, detail = self.client:snapshot(id, { name = name })
  if not snap and code == "NOT_FOUND" then
    local sb, cerr, ccode, cdetail = self.client:connect(id, { timeout = self.idle_timeout })
    if not sb then return nil, cerr, ccode, cdetail end
    memo.leased(st, self.clock() + self.idle_timeout)
    snap, err, code, detail = self.client:snapshot(id, { name = name })
  end
  return snap, err, code, detail
end

--- Deletes the unnamed snapshots of sandbox `id` (E2B's listing filtered by
-- it): a checkpoint's request sent twice (an intermediary's copy, a retry
-- after a lost answer) makes two snapshots, and the later takes the name from
-- the earlier, which no listing by name finds again. warmbox never takes an
-- unnamed snapshot of a session's sandbox. → how many were deleted
-- syntax: n = checkpoint.drop_strays(client, sandbox_id)
function _M.drop_strays(client, id)
  if type(client.list_snapshots) ~= "function" then return 0 end
  local snaps = client:list_snapshots{ sandbox_id = id }
  local n = 0
  for _, sn in ipairs(snaps or {}) do
    if type(sn) == "table" and type(sn.snapshot_id) == "string" and type(sn.names) == "table" and #sn.names == 0
      and client:delete_snapshot(sn.snapshot_id) then
      n = n + 1
    end
  end
  return n
end

-- Under the session's lock: the checkpoint of the conversation as the last run left it.
local function checkpoint_locked(self, lk, label, want_turn)
  local st = own_state(self, lk)
  if not st.sandbox_id then
    return nil, string_format("checkpoint of session '%s': it has no sandbox (run first)", self.key), "NOT_FOUND"
  end
  local turn = math_floor(tonumber(st.turns) or 0)
  if want_turn and turn ~= want_turn then
    return nil, string_format("checkpoint of session '%s': turn %d was followed by turn %d", self.key,
      want_turn, turn), "STALE"
  end
  local ms = math_floor(self.wall() * 1000)
  local name = _M.conv_prefix(self.tag_value, self.key) .. string_format("%d-%d-%s", turn, ms, nonce())
    .. (label and "_" .. label or "")
  local snap, err, code, detail = take(self, st, name)
  memo.save(lk, st)
  if not snap then
    return nil, string_format("checkpoint of session '%s': %s", self.key, tostring(err)), code, detail
  end
  local cp = { id = snap.snapshot_id, name = name, turn = turn, label = label, created_at = ms / 1000,
    sandbox_id = st.sandbox_id }
  local strays = _M.drop_strays(self.client, st.sandbox_id)
  if strays > 0 then self:_event("checkpoint_strays", { sandbox_id = st.sandbox_id, deleted = strays }) end
  self:_event("checkpoint", { id = cp.id, turn = turn, label = label, sandbox_id = cp.sandbox_id })
  return cp
end

local function check_label(label, fname)
  if label ~= nil and not label_ok(label) then
    errors.bad_option(1, fname, "label", "1.." .. LABEL_MAX .. " of a-z, 0-9 and '-' expected, got '"
      .. tostring(label) .. "'", 4)
  end
end

local function check_cp(cp, n, fname)
  if type(cp) ~= "table" or type(cp.id) ~= "string" or type(cp.turn) ~= "number" then
    error(string_format("bad argument #%d to '%s' (checkpoint expected, got %s)", n, fname, type(cp)), 4)
  end
end

--- `s:checkpoint{ label }` (see docs/checkpoints.md).
function _M.checkpoint(self, opts)
  opts = errors.check_options(opts, { label = "string" }, "checkpoint", 1, 3)
  check_label(opts.label, "checkpoint")
  _M.settle(self)
  local cp, err, code, detail = self:_with_lock(function(lk) return checkpoint_locked(self, lk, opts.label) end)
  return cp, err, code, detail
end

--- `s:checkpoints()`: this conversation's checkpoints, oldest first.
function _M.checkpoints(self)
  local list, err, code, detail = session_list(self)
  if not list then return nil, err, code, detail end
  return list
end

-- A branch's new sandbox carries its source's fencing number (the snapshot
-- has the file), which the branch's own lock may be below: a new conversation
-- starts from none. A failure is an event (its first runs may be refused).
local function clear_fence(target, sb)
  local sbx = target.client:sandbox(sb, { access_token = sb.envd_access_token })
  local ok, err, code = sbx:remove(require("warmbox.outputs").FENCE_FILE)
  if ok == nil and code ~= "NOT_FOUND" then
    target:_event("fence_kept", { sandbox_id = sb.sandbox_id, code = code, error = tostring(err) })
  end
end

-- Under `target`'s lock: its sandbox is replaced by one created from `cp`
-- (secured first); the one it had is killed after. `fresh`: a branch (the
-- source's tag value, the new sandbox's lineage), which refuses a session
-- that has a sandbox already.
local function restore_locked(target, lk, cp, fresh)
  local st = own_state(target, lk)
  if fresh and st.sandbox_id then
    return nil, string_format("branch to session '%s': it has a sandbox already", target.key), "CONFLICT"
  end
  local old = st.sandbox_id
  local lease, lerr, lcode = resolve.lease(target, target:_ctx(st))
  if not lease then return nil, lerr, lcode end
  if target.parallel then
    -- the idle window's lease (from MIN_LEASE up): the next run's watchdog keeps a long cell's
    lease = math.max(lease, decide.MIN_LEASE)
  else
    lease = math.max(lease, math.ceil(target.exec_timeout + decide.LEASE_MARGIN))
  end
  local saved = util.copy(st)
  -- (the session's own create path: the policy's create_params, the tag, the create's id recorded first)
  local sb, err, code, detail = resolve.create(target, st, lease, cp.id, fresh or nil)
  if not sb then
    -- As it was: the remembered sandbox stays (a create whose answer never came is recorded, see session).
    memo.creates_from(saved, st)
    memo.save(lk, saved)
    return nil, string_format("%s session '%s' from checkpoint '%s': %s", fresh and "branch to" or "rewind of",
      target.key, cp.id, tostring(err)), code, detail
  end
  if fresh then clear_fence(target, sb) end
  memo.restored(st, cp.turn, target.wall())
  memo.save(lk, st)
  local killed, kill_error
  if old and old ~= sb.sandbox_id then
    local ok, kerr, kcode = target.client:kill(old)
    target:_event("kill", { sandbox_id = old, reason = "rewind", ok = ok ~= nil })
    if ok ~= nil then
      killed = old
    else
      -- Still tagged with the conversation: the next run kills it.
      kill_error = { tostring(kerr), kcode }
      memo.replaced(st, old)
      memo.save(lk, st)
    end
  end
  return { sandbox_id = sb.sandbox_id, killed = killed, kill_error = kill_error }
end

-- Checkpoints that a branch or rewind is creating from now, in this process
-- (GC's checkpoint pass leaves them: `in_use`).
local using = {}
-- syntax: bool = checkpoint.in_use(id)
function _M.in_use(id) return (using[id] or 0) > 0 end

local function restore(target, cp, fresh)
  using[cp.id] = (using[cp.id] or 0) + 1
  local ok, r, err, code, detail = pcall(target._with_lock, target, function(lk)
    return restore_locked(target, lk, cp, fresh)
  end)
  using[cp.id] = using[cp.id] - 1
  if using[cp.id] == 0 then using[cp.id] = nil end
  if not ok then error(r, 0) end
  return r, err, code, detail
end

--- `s:branch(cp, new_key, opts)`: a session for `new_key` starting from `cp`,
-- made with `new_session(key, opts)` (warmbox.session's `new`: this module
-- never requires warmbox.session, which requires it).
function _M.branch(self, cp, new_key, opts, new_session)
  check_cp(cp, 1, "branch")
  if type(new_key) ~= "string" or new_key == "" then
    error("bad argument #2 to 'branch' (non-empty string expected, got " .. type(new_key) .. ")", 3)
  end
  local o = util.copy(self.new_opts)
  for k, v in pairs(errors.check_options(opts, { env = "map", actor = "string" }, "branch", 3, 3)) do o[k] = v end
  o.lock, o.policy = self.new_lock, self.policy
  local s2 = new_session(new_key, o)
  if s2.tag_value == self.tag_value then
    return nil, string_format("branch to session '%s': that is this conversation (rewind it instead)", new_key),
      "BAD_REQUEST"
  end
  _M.settle(self)
  -- The source's lock too: GC's checkpoint pass leaves the checkpoints of a locked session.
  local r, err, code, detail = self:_with_lock(function() return restore(s2, cp, self.tag_value) end)
  if not r then return nil, err, code, detail end
  return s2
end

--- `s:rewind(cp)`: the conversation itself goes back to `cp`.
function _M.rewind(self, cp)
  check_cp(cp, 1, "rewind")
  _M.settle(self)
  local r, err, code, detail = restore(self, cp, false)
  if not r then return nil, err, code, detail end
  return true, r
end

-- ------------------------------------------------------------------
-- The policy hook `checkpoint(info) -> true | false | label`
-- ------------------------------------------------------------------

-- The automatic checkpoint each session object has in flight: session -> { task, runner }.
local pending = setmetatable({}, { __mode = "k" })

--- After a successful run (the lock released, the result not yet returned):
-- asks the policy's `checkpoint` hook and, when it says so, takes the
-- checkpoint off the run's path: on the session's runner, in a task that
-- takes the lock for the turn that just ran (a later turn first: skipped).
-- syntax: checkpoint.after_run(s, r, turn)
function _M.after_run(self, r, turn)
  local hook = self.policy.checkpoint
  if not hook or not turn then return end
  local ok, want = pcall(hook, { key = self.key, turn = turn, sandbox_id = r.sandbox_id, result = r })
  if not ok then
    self:_event("checkpoint", { ok = false, turn = turn, message = tostring(want), code = "POLICY" })
    return
  end
  if not want then return end
  local label = type(want) == "string" and want or nil
  if label and not label_ok(label) then
    self:_event("checkpoint", { ok = false, turn = turn, message = "bad label from the policy", code = "POLICY" })
    return
  end
  local rn = prewarm.runner(self)
  local t = rn:spawn(function()
    local cp, err, code = self:_with_lock(function(lk) return checkpoint_locked(self, lk, label, turn) end)
    if not cp then self:_event("checkpoint", { ok = false, turn = turn, message = tostring(err), code = code }) end
    return cp, err, code
  end)
  pending[self] = { task = t, runner = rn }
  -- Outside tasks: started now (its requests leave), finished at the next call (see settle).
  if not rn:current() and rn.kick then rn:kick(_M.KICK) end
end

--- Waits for the automatic checkpoint this session object started, if any
-- (a run, checkpoint, branch or rewind of it first lets it finish): inside a
-- task of its runner (`rn:current()`) it joins it; outside tasks it drives
-- that runner until it ends (unless the runner is mid-round).
-- @return the task's result (the checkpoint, or nil, msg, code) or nil when none
-- syntax: cp = checkpoint.settle(s) (what `syntax: cp = s:await_checkpoint()` calls)
function _M.settle(self)
  local p = pending[self]
  if not p then return nil end
  pending[self] = nil
  local t, rn = p.task, p.runner
  local cur = rn:current()
  if cur and cur ~= t then
    rn:join(t)
  end
  if not cur and not rn.stepping and not require("warmbox.task").current() then
    while not t:done() do
      if not rn:step() then break end
    end
  end
  if t:done() then return t:result() end
  return nil
end

return _M
