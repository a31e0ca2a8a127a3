--- warmbox.gc.drive: the loops that run a GC pass's steps.
--
-- A page goes through four steps, list -> decide -> lock its sessions and
-- re-check -> act (kill / demote), and the steps of consecutive pages overlap.
-- Three drivers:
--
-- * a dry run: list and decide every page, act on nothing;
-- * the batch loop: one `client:batch` carries the next page's list request,
--   the pending page's re-check and the kills already re-checked (at most
--   `concurrency` in flight); a client without batch does the same one
--   request at a time;
-- * on the event engine (the pass has a runner: a warmbox.e2b client used
--   outside any task): `concurrency` tasks take the queued kills one by one
--   while a lister task lists and re-checks, so no step waits for the slowest
--   request of a batch.
-- @module warmbox.gc.drive
local listing = require "warmbox.gc.listing"

local ipairs, type, tostring, pcall, error = ipairs, type, tostring, pcall, error
local max = math.max

local _M = {}

-- Rounds of `concurrency` kills a kills-only batch carries (and the backlog of
-- re-checked kills, in the same unit, above which the listing waits).
local DRAIN_ROUNDS = 4

-- A dry run: list and decide every page, count what would be done, act on
-- nothing; returns what run returns.
local function dry_pass(p)
  local lst, report = p.listing, p.report
  while not lst:done() do
    local ops, which = {}, {}
    for _, d in ipairs(lst.dirs) do
      if lst:may_list(d, #ops) then
        ops[#ops + 1] = lst:op(d, d.token)
        which[#ops] = d
      end
    end
    if #ops == 0 then break end
    local res
    if p.pipelined then
      res = p.client:batch(ops, { concurrency = #ops })
    else
      local items, a, b = lst:seq_page()
      res = { items == nil and { done = true } or { items, a, b } }
    end
    for i, d in ipairs(which) do
      local r = res[i]
      if r.done then
        d.done = true
      elseif r[1] == false then
        report.next_token = lst:token(false)
        return nil, r[2], r[3], report, r[5]
      else
        for _, e in ipairs(p:listed(d, r[1], r[2], r[3])) do
          local k = e.action == "kill" and "killed" or "demoted"
          report[k] = report[k] + 1
          p:note(e.item, e.action, e.reason)
          listing.finish(e)
        end
        p:page_done(r[2])
      end
    end
  end
  p:finish_tokens()
  return report
end

-- One step's list requests: the next page of each side (unless `can_list` is
-- false) and the re-check of each side's pending page (`rechecks`).
local function list_ops(p, can_list, rechecks)
  local lst = p.listing
  local ops, kinds, which = {}, {}, {}
  for _, d in ipairs(lst.dirs) do
    if can_list and lst:may_list(d, #ops) then
      ops[#ops + 1] = lst:op(d, d.token)
      kinds[#ops], which[#ops] = "list", d
    end
  end
  local nlists = #ops
  if rechecks then
    for _, d in ipairs(lst.dirs) do
      if d.pending then
        ops[#ops + 1] = lst:op(d, d.pending.token)
        kinds[#ops], which[#ops] = "recheck", d
      end
    end
  end
  return ops, kinds, which, nlists
end

-- The re-checks answered (a client with batch): queue the kills, do the demotes.
local function after_rechecks(p, ops, kinds, which, results)
  for i = 1, #ops do
    if kinds[i] == "recheck" then
      local d = which[i]
      local pending = d.pending
      d.pending = nil
      p:recheck_page(pending, results[i])
    end
  end
end

-- The pages listed: decide, lock, and keep each side's page for its re-check.
local function after_lists(p, nlists, which, results)
  for i = 1, nlists do
    local d, r = which[i], results[i]
    if r.done then
      d.done = true
    elseif r[1] == false then
      -- stop listing, finish what was listed; resume from this page
      p.listing:pause()
      p.list_error = p.list_error or { r[2], r[3], r[5] }
    else
      local used = r[2]
      local entries = p:lock_entries(p:listed(d, r[1], used, r[3]))
      if #entries > 0 then d.pending = { token = used, entries = entries } end
      p:page_done(used)
    end
  end
end

-- Moves up to n queued kills into a batch's ops; returns how many it moved.
local function take_kills(p, ops, kinds, n)
  local nkills = 0
  while nkills < n do
    local e = p:next_kill()
    if not e then break end
    nkills = nkills + 1
    ops[#ops + 1] = { op = "kill", id = e.item.sandbox_id, entry = e }
    kinds[#ops] = "kill"
  end
  return nkills
end

-- A batch's results from a client without batch: each list from its listing,
-- then the kills (with its kill_many when it has one).
local function seq_results(p, ops, kinds)
  local client, results = p.client, {}
  local kill_ids, kill_at = {}, {}
  for i, o in ipairs(ops) do
    if kinds[i] == "list" then
      local items, a, b, c, d = p.listing:seq_page()
      results[i] = items == nil and { done = true } or { items, a, b, c, d }
    else
      kill_ids[#kill_ids + 1] = o.id
      kill_at[#kill_at + 1] = i
    end
  end
  if #kill_ids > 0 then
    local kr = type(client.kill_many) == "function"
      and client:kill_many(kill_ids, { concurrency = p.concurrency })
    for j, i in ipairs(kill_at) do
      results[i] = kr and kr[j] or { client:kill(kill_ids[j]) }
    end
  end
  return results
end

-- The batch loop (raises what a callback or the lock backend raises).
local function batch_loop(p, backlog)
  local concurrency, pipelined, dirs = p.concurrency, p.pipelined, p.listing.dirs
  while true do
    local ops, kinds, which, nlists = list_ops(p, p:queued() <= backlog, pipelined)
    local nreq = #ops
    -- While anything is listed or re-checked, a batch carries one round of
    -- `concurrency` kills (the batch runs at concurrency + its list requests, so
    -- kills never exceed `concurrency` in flight) and the next batch follows at
    -- once: listing never waits behind a long batch of kills. Kills only:
    -- several rounds at `concurrency` (h:batch refills a freed slot at once).
    local busy_listing = nreq > 0 or p.listing:active()
    local nkills = take_kills(p, ops, kinds, busy_listing and concurrency or concurrency * DRAIN_ROUNDS)
    local pending_seq = not pipelined and dirs[1].pending
    if #ops == 0 and not pending_seq then break end
    local results
    if pipelined then
      results = p.client:batch(ops, { concurrency = (nkills > 0 and concurrency or 0) + nreq })
    else
      results = seq_results(p, ops, kinds)
    end
    -- 1. kills
    for i, o in ipairs(ops) do
      if kinds[i] == "kill" then
        local r = results[i]
        p:acted(o.entry, "kill", r[1], r[2], r[3])
      end
    end
    -- 2. the pending pages' re-checks
    if pipelined then
      after_rechecks(p, ops, kinds, which, results)
    elseif pending_seq then
      dirs[1].pending = nil
      p:recheck_by_info(pending_seq)
    end
    -- 3. the pages just listed
    after_lists(p, nlists, which, results)
  end
end

-- On the event engine: `concurrency` worker tasks take the queued kills one by
-- one, each sending the next as soon as its last one is answered, while a
-- lister task lists and re-checks (its requests apart from the kills: never
-- more than `concurrency` kills in flight). Returns ok, err.
local function on_tasks(p, backlog)
  local r, tc = p.runner, p.client
  local queued_ev, room_ev = r.sched:event(), r.sched:event()
  local over, failure = false, nil
  local function stop(err)
    failure = failure or { err }
    over = true
    queued_ev:broadcast(true)
    room_ev:broadcast(true)
  end
  local function guard(fn)
    return function()
      local fok, ferr = pcall(fn)
      if not fok then stop(ferr) end
    end
  end
  local function worker()
    while true do
      while p:queued() == 0 and not over do queued_ev:wait() end
      if failure then return end
      local e = p:next_kill()
      if not e then return end
      if p:queued() <= backlog then room_ev:broadcast(true) end
      p:acted(e, "kill", tc:kill(e.item.sandbox_id))
    end
  end
  local function lister()
    while not failure do
      while p:queued() > backlog and not failure do room_ev:wait() end
      if failure then return end
      local ops, kinds, which, nlists = list_ops(p, true, true)
      if #ops == 0 then break end
      local results = tc:batch(ops, { concurrency = #ops })
      after_rechecks(p, ops, kinds, which, results)
      if p:queued() > 0 then queued_ev:broadcast(true) end
      after_lists(p, nlists, which, results)
    end
    over = true
    queued_ev:broadcast(true)
  end
  local ok, lerr = true, nil
  local ran, rerr = pcall(function()
    r:spawn(guard(lister))
    for _ = 1, p.concurrency do r:spawn(guard(worker)) end
    ok, lerr = r:loop()
  end)
  if not ran then
    -- Raised outside the tasks (a signal: lua.c's ^C lands in the main thread):
    -- stop, but let the requests in flight finish (and their kills be counted)
    -- rather than abort kills the server may already have done.
    stop(rerr)
    pcall(r.loop, r)
  end
  r:close()
  if not ran then return false, rerr end
  if failure then return false, failure[1] end
  if not ok then return false, "gc: " .. tostring(lerr) end
  return true
end

--- Runs pass `p` (a `warmbox.gc.pass`): returns what `warmbox.gc.run` returns;
-- raises (every session unlocked first) what a callback or the lock backend raised.
function _M.run(p)
  if p.dry_run then return dry_pass(p) end
  local backlog = max(p.concurrency * DRAIN_ROUNDS, p.limit)
  local ok, err
  if p.runner then
    ok, err = on_tasks(p, backlog)
  else
    ok, err = pcall(batch_loop, p, backlog)
  end
  if not ok then
    p:release_all() -- leave no session locked
    error(err, 0)
  end
  p:finish_tokens()
  local le = p.list_error
  if le then return nil, le[1], le[2], p.report, le[3] end
  return p.report
end

return _M
