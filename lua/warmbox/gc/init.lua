--- warmbox.gc: garbage collection of tagged sandboxes, streamed page by page.
--
-- E2B keeps paused sandboxes until they are killed. `run` lists the sandboxes
-- that carry the tag (running and paused), one page at a time, asks the GC
-- policy what to do with each ("keep", "kill" or "demote" to a
-- filesystem-only snapshot) and acts. A page goes through four steps:
--
--   list -> decide -> lock its sessions and re-check -> act (kill / demote)
--
-- and the steps of consecutive pages overlap: one `client:batch` carries the
-- next page's list request, this page's re-check and the kills already
-- re-checked (at most `concurrency` kills in flight). When the policy's
-- decisions do not depend on the listing order (`rules.is_any_order`), two
-- cursors list at once, newest first and oldest first, and stop where they
-- meet (each drops what the other took). Memory is O(page + concurrency +
-- tenants), whatever the total: nothing is kept of a page once it is done,
-- except what `on_action` / `report.actions` keep.
--
--   local report, err, code, partial = require("warmbox.gc").run{
--     client = e2b_client, tag = "warmboxSessionId", policy = policy, lock = lock_opts,
--     clock = os.time, concurrency = 8, dry_run = false, max_age = 86400,
--     max_kills = nil, next_token = nil, pages = nil, limit = 100,
--     on_action = nil, on_page = nil, actions = true, order = nil, runner = nil }
--
-- The parts: `warmbox.gc.pass` (a pass as an object: what it was given, what
-- it did, what it holds), `warmbox.gc.listing` (the pages, from one end or
-- both; resume tokens), `warmbox.gc.decide` (what the policy's answer means:
-- the decision of a kill, as pure functions), `warmbox.gc.pass` also
-- locks, re-checks, kills or demotes; `warmbox.gc.release` (a conversation's
-- sandboxes killed), `warmbox.gc.drive` (the loops: dry run, batches, tasks on
-- the event engine), `warmbox.gc.checkpoints` (the checkpoint pass).
--
-- Last activity (unix seconds, the clock's unit): a paused sandbox's
-- `end_at` (the time it was paused), a running one's `started_at` (reset by
-- E2B on resume), or, once its session is locked, the later remembered last
-- run from the session's lock state (when that state remembers this
-- sandbox); the policy is then asked again with the refined item.
--
-- The listing does not say which kind of snapshot a paused sandbox has, so a
-- policy that demotes the same sandbox on every pass pays a cold boot each
-- time: demote within an age band (see `warmbox.policy.retention`).
--
-- Resumption: `next_token` starts the pass at that page; `pages` stops it after
-- that many pages. The report's `next_token` is where to continue (nil once the
-- listing is exhausted), and so is the 4th value when the listing fails mid-pass.
-- @module warmbox.gc
local lock_mod = require "warmbox.lock"
local errors = require "warmbox.errors"
local util = require "warmbox.util"
local rules = require "warmbox.policy.rules"
local decide = require "warmbox.gc.decide"
local listing = require "warmbox.gc.listing"
local release = require "warmbox.gc.release"
local pass = require "warmbox.gc.pass"
local drive = require "warmbox.gc.drive"

local type, ipairs, error = type, ipairs, error
local fmt, min = string.format, math.min
local os_time = os.time

local _M = {}

-- The names other parts use (each owned by the module named).
_M.parse_time = util.parse_time            -- RFC 3339 -> unix seconds
_M.last_activity = decide.last_activity
_M.default_tenant = decide.default_tenant
_M.list_key = listing.list_key             -- the listing order
_M.before = listing.before
_M.each_listed = listing.each_listed

--- The session key of a tag value, and whether it is a warmbox tag (exposed for the CLI).
-- syntax: key, is_warmbox = gc.describe_tag(tv)
function _M.describe_tag(tv)
  local tag_mod = require "warmbox.tag"
  local key, enc = tag_mod.parse_tag(tv)
  return key, enc ~= nil
end

-- ---------------------------------------------------------------------------
-- options
-- ---------------------------------------------------------------------------

local RUN_OPTS = { client = true, tag = true, policy = true, lock = true, clock = true, concurrency = true,
  dry_run = true, max_age = true, max_kills = true, next_token = true, pages = true, limit = true,
  on_action = true, on_page = true, actions = true, order = true, runner = true }
local RELEASE_OPTS = { client = true, tag = true, tag_value = true, key = true, lock = true, concurrency = true }

local function check_opts(opts, known, fname)
  if type(opts) ~= "table" then
    error(fmt("bad argument #1 to '%s' (table expected, got %s)", fname, type(opts)), 3)
  end
  errors.check_options(opts, known, fname, 1, 3)
  local c = opts.client
  if (type(c) ~= "table" and type(c) ~= "userdata") then
    error(fmt("bad argument #1 to '%s' (option 'client': an e2b client expected)", fname), 3)
  end
  if opts.tag ~= nil and (type(opts.tag) ~= "string" or opts.tag == "") then
    error(fmt("bad argument #1 to '%s' (option 'tag': a non-empty string expected)", fname), 3)
  end
end

local function positive_int(v, name, fname, allow_nil, level)
  if v == nil and allow_nil then return end
  if math.type(v) ~= "integer" or v < 1 then
    error(fmt("bad argument #1 to '%s' (option '%s': a positive integer expected)", fname, name), level or 4)
  end
end

-- lock: what warmbox.lock.factory takes; options are checked now, not in the
-- middle of a pass.
local function lock_factory(l, fname) return lock_mod.factory(l, nil, nil, fname) end

-- run's option checks after check_opts, in their order (errors name run's
-- caller); returns the policy, clock, concurrency and max_age, defaults applied.
local function run_settings(opts)
  local policy = opts.policy or require "warmbox.policy.default"
  if type(policy) ~= "table" or type(policy.gc) ~= "function" then
    error("bad argument #1 to 'run' (option 'policy': a table with a 'gc' function expected)", 3)
  end
  local clock = opts.clock or os_time
  if type(clock) ~= "function" then error("bad argument #1 to 'run' (option 'clock': a function expected)", 3) end
  local concurrency = opts.concurrency or 8
  -- (level 5: the frame these checks have always named, one above run's caller)
  positive_int(concurrency, "concurrency", "run", nil, 5)
  positive_int(opts.max_kills, "max_kills", "run", true, 5)
  positive_int(opts.pages, "pages", "run", true, 5)
  positive_int(opts.limit, "limit", "run", true, 5)
  local max_age = opts.max_age or 86400
  if type(max_age) ~= "number" then error("bad argument #1 to 'run' (option 'max_age': a number expected)", 3) end
  if opts.next_token ~= nil and type(opts.next_token) ~= "string" then
    error("bad argument #1 to 'run' (option 'next_token': a string expected)", 3)
  end
  for _, k in ipairs({ "on_action", "on_page" }) do
    if opts[k] ~= nil and type(opts[k]) ~= "function" then
      error(fmt("bad argument #1 to 'run' (option '%s': a function expected)", k), 3)
    end
  end
  return policy, clock, concurrency, max_age
end

-- Checks run's `order` and `next_token` (errors name run's caller); returns
-- whether the pass lists from both ends, and the two-ended token's sides.
local function listing_ends(opts, pipelined, policy)
  local order = opts.order
  if order ~= nil and order ~= "newest" and order ~= "both" then
    error("bad argument #1 to 'run' (option 'order': \"newest\" or \"both\" expected)", 3)
  end
  -- Two cursors (newest first and oldest first) when the client batches and the
  -- policy's decisions do not depend on the listing order (no caps), or when
  -- asked; a two-ended pass's resume token resumes both.
  local both, resume_from = false, nil
  local nt = opts.next_token
  if nt and listing.is_two_ended(nt) then
    resume_from = listing.decode_token(nt)
    if not resume_from then
      error("bad argument #1 to 'run' (option 'next_token': not a valid GC resume token)", 3)
    end
    if not pipelined then
      error("bad argument #1 to 'run' (option 'next_token': a two-ended pass's token needs a client with batch)", 3)
    end
    both = true
  elseif nt == nil and pipelined then
    both = order == "both" or (order == nil and rules.is_any_order(policy.gc))
  end
  return both, resume_from
end

-- ---------------------------------------------------------------------------
-- run
-- ---------------------------------------------------------------------------

--- One GC pass. See the module comment.
-- @treturn[1] table report `{ listed, tagged, orphans, kept, killed, demoted, busy, skipped,
--   failed, pages, budget_kept, errors, actions (unless `actions = false`), next_token, dry_run }`
-- @return[2] nil, message, code, partial report (the listing failed; its `next_token`
--   is the page to resume from)
function _M.run(opts)
  check_opts(opts, RUN_OPTS, "run")
  local client = opts.client
  local policy, clock, concurrency, max_age = run_settings(opts)
  local new_lock = lock_factory(opts.lock, "run")
  local both, resume_from = listing_ends(opts, type(client.batch) == "function", policy)
  return drive.run(pass.new{
    client = client, tag = opts.tag or "warmboxSessionId", policy = policy, clock = clock,
    concurrency = concurrency, max_age = max_age, max_kills = opts.max_kills, dry_run = opts.dry_run and true or false,
    new_lock = new_lock, limit = min(opts.limit or 100, 100), pages = opts.pages, next_token = opts.next_token,
    on_action = opts.on_action, on_page = opts.on_page, actions = opts.actions,
    both = both, resume_from = resume_from, caller = opts.runner,
  })
end

-- ---------------------------------------------------------------------------
-- release
-- ---------------------------------------------------------------------------

-- After release's kills: the conversation's checkpoints go too (warmbox.gc.checkpoints).
local function release_checkpoints(client, key, tv, killed)
  local deleted, derr, dcode = require("warmbox.gc.checkpoints").release(client, key, not key and tv or nil)
  if not deleted then return nil, derr, dcode end
  return killed, deleted
end

--- Kills a conversation's sandboxes (the conversation was deleted): with
-- `tag_value`, those whose tag equals it exactly; with `key`, those whose tag
-- decodes to that session key, whatever the fingerprint (env, actor,
-- template). Each session is locked first (waiting for a run in progress, up to
-- the lock's `timeout`), and its remembered state is cleared. Then the
-- conversation's checkpoints are deleted.
-- @tparam table opts client, tag ("warmboxSessionId"), tag_value | key, lock
-- @treturn[1] number how many sandboxes were killed
-- @treturn[1] number how many checkpoints were deleted
-- @return[2] nil, message, code ("BUSY" when a session stayed locked)
function _M.release(opts)
  check_opts(opts, RELEASE_OPTS, "release")
  local client, tag, tv, key = opts.client, opts.tag or "warmboxSessionId", opts.tag_value, opts.key
  if key ~= nil then
    if type(key) ~= "string" or key == "" then
      error("bad argument #1 to 'release' (option 'key': a non-empty string expected)", 2)
    end
  elseif type(tv) ~= "string" or tv == "" then
    error("bad argument #1 to 'release' (option 'tag_value': a non-empty string expected)", 2)
  end
  local new_lock = lock_factory(opts.lock, "release")
  local tag_mod = require "warmbox.tag"
  -- With a key: the tag values that decode to it (a conversation has few).
  local order = { tv }
  if key then
    order = {}
    local seen = {}
    local ok, err, code = listing.each_listed(client, { state = { "running", "paused" } }, function(item)
      local v = type(item.metadata) == "table" and item.metadata[tag]
      if type(v) == "string" and not seen[v] and tag_mod.tag_matches_key(v, key) then
        seen[v] = true
        order[#order + 1] = v
      end
    end)
    if not ok then return nil, err, code end
  end
  local killed, kerr, kcode = release.release(client, tag, order, key, new_lock, opts.concurrency or 8)
  if not killed then return nil, kerr, kcode end
  return release_checkpoints(client, key, tv, killed)
end

return _M
