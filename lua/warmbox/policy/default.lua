--- The default policy: reproduces the reference behaviour (Twenty's E2B driver).
--
-- A policy is a table of plain functions; any of them can be replaced (see
-- `warmbox.policy`). Every hook gets a context table `ctx` and must not keep
-- it. The functions here use nothing but their arguments, so they run the same
-- in a session, in GC and in the simulator (virtual time).
-- @module warmbox.policy.default

local math_max = math.max

local _M = { name = "default", version = "1" }

--- Reuse order: which listed candidate to try first.
-- Default: the list order (E2B lists newest first), like the reference.
-- @tparam table candidates listed sandboxes whose tag matched exactly
-- @tparam table ctx `key`, `tag`, `tag_value`, `now`
-- @treturn table the candidates to try, in order (a subset of `candidates`)
-- syntax: order(candidates, ctx)
function _M.order(candidates, ctx) -- luacheck: ignore 212
  return candidates
end

--- Lease length in seconds: the idle window, `idle_timeout`. A running cell
-- keeps its own sandbox alive (its watchdog extends the lease, see
-- warmbox.session.execute), so the sandbox pauses about `idle_timeout` after
-- it went quiet; a session without a watchdog (no `parallel`) raises the
-- lease to the run's timeout + LEASE_MARGIN (the reference's
-- `max(exec_timeout, idle_timeout)`).
-- @tparam table ctx `exec_timeout`, `idle_timeout`
-- @treturn number seconds
-- syntax: lease(ctx)
function _M.lease(ctx)
  return ctx.idle_timeout
end

--- Whether the remembered lease must be refreshed before a run.
-- Watched (`ctx.watched`: the run's watchdog extends the lease while it goes
-- on): a refresh is skipped while the remembered lease still has half the
-- idle window (at least `margin`), so an idle sandbox pauses between
-- `idle_timeout / 2` and `idle_timeout` after its last run and a run soon
-- after another sends no request. Unwatched: only when the remembered lease
-- also provably covers this run (`now + run_timeout + margin <= lease_end`).
-- (The reference refreshes on every run.)
-- @tparam table ctx `now`, `lease_end` (nil when unknown), `lease`, `exec_timeout`,
--   `idle_timeout`, `run_timeout`, `margin`, `watched`
-- @treturn boolean
-- syntax: should_refresh(ctx)
function _M.should_refresh(ctx)
  local lease_end = ctx.lease_end
  if not lease_end then return true end
  local now, margin = ctx.now, ctx.margin or 5
  if not ctx.watched then
    local run_timeout = ctx.run_timeout or ctx.exec_timeout
    if now + run_timeout + margin > lease_end then return true end
  end
  return lease_end - now < math_max(margin, (ctx.idle_timeout or 0) / 2)
end

--- What a new sandbox is created with. The session always puts its tag in
-- `metadata` afterwards, whatever this returns.
-- @tparam table ctx `template`, `lease`, `tag`, `tag_value`, `env`
-- @treturn table `{ template, timeout, metadata, env_vars, lifecycle }`
-- syntax: create_params(ctx)
function _M.create_params(ctx)
  return {
    template = ctx.template,
    timeout = ctx.lease,
    metadata = { [ctx.tag] = ctx.tag_value },
    env_vars = ctx.env,
    lifecycle = { on_timeout = "pause", auto_resume = true },
  }
end

--- What GC does with a tagged sandbox: kill it when it has been inactive for
-- longer than `max_age` (age from last activity, never from creation alone);
-- keep sandboxes whose tag is not a warmbox tag (orphans). Compose richer
-- ones with `warmbox.policy.rules`.
-- @tparam table item the listed sandbox as GC sees it (see `warmbox.policy.rules`)
-- @tparam table ctx `now`, `max_age` (default 86400), `counts`, `totals`
-- @treturn string "keep" | "kill" | "demote", and a reason
-- syntax: gc(item, ctx)
function _M.gc(item, ctx)
  if item.orphan then return "keep" end
  local last = item.last_activity
  if not last then return "keep" end
  if ctx.now - last > (ctx.max_age or 86400) then return "kill" end
  return "keep"
end

--- The tenant of a session key (for per-tenant caps): the part before the
-- first `:` (the whole key when it has none).
-- @tparam string key the session key (or the tag value when the key was hashed)
-- @treturn string
-- syntax: tenant(key)
function _M.tenant(key)
  return key:match("^([^:]*):") or key
end

return _M
