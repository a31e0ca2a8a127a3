--- warmbox.gc.pass: one GC pass as an object.
--
-- A `Pass` holds what the pass was given (its settings and collaborators,
-- all set when it is made: the client it acts with, the runner its tasks use,
-- the lock factory), what it has done (the report, the counts the policy
-- sees) and what it holds (its listing, the session locks, the queue of
-- re-checked kills). Its methods here decide the pages listed (with
-- `warmbox.gc.decide`); those that lock, re-check and act are
-- `warmbox.gc.act`'s; `warmbox.gc.drive` runs the steps.
-- @module warmbox.gc.pass
local decide = require "warmbox.gc.decide"
local listing = require "warmbox.gc.listing"
local act = require "warmbox.gc.act"

local type, pairs, ipairs, tostring, setmetatable, error =
  type, pairs, ipairs, tostring, setmetatable, error

local _M = {}

local Pass = { __name = "warmbox.gc.Pass" }
Pass.__index = Pass
for name, fn in pairs(act.methods) do
  if Pass[name] then error("warmbox.gc.pass: two methods named " .. name) end
  Pass[name] = fn
end

-- GC's own tasks on the event engine (`warmbox.runner`), for a warmbox.e2b
-- client used outside any task: the runner and a client like `client` whose
-- requests go on that runner's engine inside its tasks. nil otherwise
-- (another client, one with a transport of its own, or already inside a
-- task: then the batch loop).
local function on_engine(client)
  -- a warmbox.e2b client says so by `with_transport` (as warmbox.new checks)
  if type(client.with_transport) ~= "function" or client.transport ~= nil or client.http == nil then return nil end
  local runner = require "warmbox.runner"
  if runner.running() then return nil end
  local r = runner.new()
  if not r then return nil end
  return r, client:with_transport(runner.transport(client.http))
end

--- A pass, from `warmbox.gc.run`'s checked options `s` (defaults applied):
-- `client`, `tag`, `policy`, `clock`, `concurrency`, `max_age`, `max_kills`,
-- `dry_run`, `new_lock`, `limit`, `pages`, `next_token`, `on_action`,
-- `on_page`, `actions`, and the listing's ends (`both`, `resume_from`).
function _M.new(s)
  local client, policy = s.client, s.policy
  local self = setmetatable({
    client = client, tag = s.tag, policy = policy, clock = s.clock, concurrency = s.concurrency,
    max_age = s.max_age, max_kills = s.max_kills, dry_run = s.dry_run, new_lock = s.new_lock, limit = s.limit,
    on_action = s.on_action, on_page = s.on_page,
    tenant_of = type(policy.tenant) == "function" and policy.tenant or decide.default_tenant,
    pipelined = type(client.batch) == "function",
    listing = listing.new(client, { limit = s.limit, both = s.both, resume_from = s.resume_from,
      next_token = s.next_token, pages = s.pages }),
    report = { listed = 0, tagged = 0, orphans = 0, kept = 0, killed = 0, demoted = 0, busy = 0, skipped = 0,
      failed = 0, pages = 0, budget_kept = 0, errors = {}, actions = s.actions ~= false and {} or nil,
      dry_run = s.dry_run },
    -- decisions so far (what the policy sees as counts): per tenant and in total
    tenants = {}, totals = { seen = 0, kept = 0, kill = 0, demote = 0 },
    -- session locks held: tag value -> { lk, refs, state, forget, rewrite }
    held = {},
    -- re-checked kills, FIFO
    queue = {}, qhead = 1, qtail = 0,
  }, Pass)
  if not s.dry_run then
    -- the pass's requests on its own tasks when it can (the runner is the drive's to close)
    local r, tc = on_engine(client)
    if r then self.runner, self.client = r, tc end
  end
  return self
end

--- An action the pass reports (`report.actions`, `on_action`).
function Pass:note(item, action, reason)
  local a = { sandbox_id = item.sandbox_id, session = item.tag_value, key = item.key, tenant = item.tenant,
              action = action, reason = reason }
  local report = self.report
  if report.actions then report.actions[#report.actions + 1] = a end
  if self.on_action then self.on_action(a) end
end

--- An action that failed (`report.errors`, `on_action` with action "error").
function Pass:fail(item, action, msg, code)
  local report = self.report
  report.failed = report.failed + 1
  local e = { sandbox_id = item.sandbox_id, session = item.tag_value, action = action, message = msg, code = code }
  report.errors[#report.errors + 1] = e
  if self.on_action then
    self.on_action({ sandbox_id = item.sandbox_id, session = item.tag_value, key = item.key, tenant = item.tenant,
                     action = "error", reason = tostring(msg), code = code, failed = action })
  end
end

function Pass:count(item, action, d)
  decide.count(self.tenants, self.totals, item, action, d)
end

--- An action decided but not done: the sandbox counts as kept when it still
-- exists (busy, changed, failed), so caps later in the pass see it.
function Pass:undo(item, action, exists)
  decide.count(self.tenants, self.totals, item, action, -1)
  if exists then decide.count(self.tenants, self.totals, item, "keep", 1) end
end

--- The policy's action for `item` and its reason, or nil and a message.
function Pass:decide(item)
  local ctx = decide.context(self, self.clock(), item, self.tenants, self.totals)
  local action, reason = decide.ask(self.policy.gc, item, ctx)
  if not action then return nil, reason end
  local budget_kept
  action, reason, budget_kept = decide.budget(action, reason, self.max_kills, self.totals.kill)
  if budget_kept then self.report.budget_kept = self.report.budget_kept + 1 end
  return action, reason
end

--- A listed page: decides each tagged item; returns the entries to act on,
-- `{ item, action, reason }`.
function Pass:take_page(items)
  local report, totals = self.report, self.totals
  report.pages = report.pages + 1
  local entries = {}
  for _, d in ipairs(items) do
    report.listed = report.listed + 1
    local item = decide.item(d, self.tag, self.tenant_of)
    if item then
      report.tagged = report.tagged + 1
      if item.orphan then report.orphans = report.orphans + 1 end
      totals.seen = totals.seen + 1
      local action, reason = self:decide(item)
      if not action then
        self:fail(item, "policy", reason, "POLICY")
      else
        self:count(item, action, 1)
        if action == "keep" then
          report.kept = report.kept + 1
          if reason then self:note(item, "keep", reason) end
        else
          entries[#entries + 1] = { item = item, action = action, reason = reason }
        end
      end
    end
  end
  return entries
end

--- A page of direction d listed (`used` its token, `nxt` the next): what the
-- other direction took is dropped, the rest decided. Returns the entries to
-- act on; their page stays open (resume tokens) until they are finished.
function Pass:listed(d, items, used, nxt)
  local kept, page_key = self.listing:take(d, items, nxt)
  local taken = self:take_page(kept)
  if #taken > 0 then listing.open(d, used, page_key, taken) end
  return taken
end

--- How many re-checked kills wait.
function Pass:queued()
  return self.qtail - self.qhead + 1
end

--- The page at `token` is decided: the report's tokens, `on_page`.
function Pass:page_done(token)
  local report = self.report
  local nxt = self.listing:token(false)
  report.next_token = nxt
  report.resume_token = self.listing:token(true)
  if self.on_page then
    self.on_page({ token = token, next_token = nxt, resume_token = report.resume_token, report = report,
                   queued = self:queued() })
  end
end

--- The pass is over: where the next one continues (nil: the listing is done).
function Pass:finish_tokens()
  local report = self.report
  report.next_token = self.listing:token(false)
  report.resume_token = report.next_token
end

--- An entry is finished (acted on, or not: its page may close) and its
-- session's lock released.
function Pass:done_with(e)
  self:release_ref(e.item.tag_value)
  listing.finish(e)
end

return _M
