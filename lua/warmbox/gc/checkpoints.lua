--- warmbox.gc.checkpoints: the checkpoint pass of GC and the checkpoints of
-- `release`. E2B's snapshots never expire: a policy's `checkpoint_gc(cp, ctx)`
-- hook (`warmbox.policy.rules`: `max_checkpoints`, `checkpoint_after`,
-- `checkpoint_orphans`, `checkpoints{}`) says which go.
--
-- Streamed as the sandbox pass is: the sandboxes are listed page by page
-- (what is kept: one entry per conversation that has a sandbox), then the
-- snapshots page by page, newest first (what is kept: a count per
-- conversation), each decided and deleted before the next page. Memory is
-- O(page + conversations), whatever the number of checkpoints.
--
-- Never deleted: a checkpoint that a branch or rewind of this process is
-- creating from (`warmbox.session.checkpoint.in_use`), and one whose conversation's
-- session is locked (a rewind or branch of any process holds it: try-locked,
-- skipped as "busy").
-- @module warmbox.gc.checkpoints
local checkpoint = require "warmbox.session.checkpoint"
local lock_mod = require "warmbox.lock"

local type, ipairs, tostring, pcall, fmt = type, ipairs, tostring, pcall, string.format

local _M = {}

-- conv hash -> a tag value of that conversation's sandboxes.
local function conversations(client, tag)
  local convs = {}
  for item, err, code in client:list{ state = { "running", "paused" } } do
    if not item then return nil, err, code end
    local v = type(item.metadata) == "table" and item.metadata[tag]
    if type(v) == "string" then convs[checkpoint.conv_hash(v)] = v end
  end
  return convs
end

-- Deletes `cp` unless it is in use (here or under its session's lock).
local function delete(client, new_lock, cp, tv)
  if checkpoint.in_use(cp.id) then return "busy", "a branch or rewind is creating from it" end
  local lk
  if tv and new_lock then
    lk = new_lock()
    local got, lerr = lk:try_lock(tv)
    if not got then
      pcall(lk.close, lk)
      return "busy", "its session is locked (" .. tostring(lerr) .. ")"
    end
  end
  local ok, err, code = client:delete_snapshot(cp.id)
  if lk then
    lk:unlock()
    pcall(lk.close, lk)
  end
  if ok == nil then return "error", err, code end
  return "deleted"
end

local function new_report(dry_run)
  return { listed = 0, checkpoints = 0, kept = 0, deleted = 0, busy = 0, failed = 0, errors = {},
    dry_run = dry_run }
end

--- One checkpoint pass.
-- @tparam table opts `client`, `tag`, `policy` (its `checkpoint_gc` hook; none: nothing is
--   deleted), `clock`, `lock` (lock options or a factory: the session locks), `dry_run`,
--   `on_action(a)` (`{ checkpoint_id, name, conversation, turn, label, action = "delete" |
--   "keep" | "busy" | "error", reason, code }`)
-- @treturn[1] table report `{ listed, checkpoints, kept, deleted, busy, failed, errors, dry_run }`
-- @return[2] nil, msg, code, partial report
-- syntax: report = checkpoints.run(opts)
function _M.run(opts)
  local client, hook = opts.client, opts.policy and opts.policy.checkpoint_gc
  local report = new_report(opts.dry_run and true or false)
  if type(hook) ~= "function" or type(client.list_snapshot_pages) ~= "function" then return report end
  local new_lock = opts.lock and lock_mod.factory(opts.lock, nil, nil, "gc")
  local convs, err, code = conversations(client, opts.tag or "warmboxSessionId")
  if not convs then return nil, err, code, report end
  local now, rank = (opts.clock or os.time)(), {}
  local function note(cp, action, reason, ecode)
    if opts.on_action then
      opts.on_action{ checkpoint_id = cp.id, name = cp.name, conversation = cp.conv, turn = cp.turn,
        label = cp.label, action = action, reason = reason, code = ecode }
    end
  end
  for items, msg, lcode, _, _ in client:list_snapshot_pages() do
    if items == false then return nil, "checkpoint gc: " .. tostring(msg), lcode, report end
    for _, snap in ipairs(items) do
      report.listed = report.listed + 1
      local cp = checkpoint.parse(snap)
      if cp then
        report.checkpoints = report.checkpoints + 1
        rank[cp.conv] = (rank[cp.conv] or 0) + 1
        local tv = convs[cp.conv]
        local action, reason = hook(cp, { now = now, rank = rank[cp.conv], has_sandbox = tv ~= nil })
        if action == "delete" and not report.dry_run then
          local done, why, dcode = delete(client, new_lock, cp, tv)
          if done == "deleted" then
            report.deleted = report.deleted + 1
          elseif done == "busy" then
            report.busy = report.busy + 1
            action, reason = "busy", why
          else
            report.failed = report.failed + 1
            report.errors[#report.errors + 1] = { checkpoint_id = cp.id, message = why, code = dcode }
            action, reason = "error", why
          end
          note(cp, action, reason, dcode)
        elseif action == "delete" then
          report.deleted = report.deleted + 1 -- would delete
          note(cp, "delete", reason)
        else
          report.kept = report.kept + 1
          note(cp, "keep", reason)
        end
      end
    end
  end
  return report
end

--- Deletes the checkpoints of a key (whatever its fingerprint; `key`) or of one
-- session (`tag_value`): what `wb:release` does after killing the sandboxes.
-- @treturn[1] number how many were deleted
-- @return[2] nil, msg, code
-- syntax: n = checkpoints.release(client, key, tag_value)
function _M.release(client, key, tag_value)
  -- A client without snapshots (the simulator's model) has none to delete.
  if type(client.list_snapshots) ~= "function" then return 0 end
  local kh = key and checkpoint.key_hash(key)
  local conv = tag_value and checkpoint.conv_hash(tag_value)
  local list, err, code = checkpoint.list(client, function(cp)
    if kh then return cp.key_hash == kh end
    return cp.conv == conv
  end)
  if not list then return nil, "release: listing the checkpoints: " .. tostring(err), code end
  local n = 0
  for _, cp in ipairs(list) do
    local ok, derr, dcode = client:delete_snapshot(cp.id)
    if ok == nil then return nil, fmt("release: deleting checkpoint '%s': %s", cp.id, tostring(derr)), dcode end
    if ok then n = n + 1 end
  end
  return n
end

return _M
