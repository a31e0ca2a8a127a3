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
function _M.order(candidates, ctx) -- luacheck: ignore 212
  return candidates
end

--- Lease length in seconds: long enough for one run and for the idle window
-- before the sandbox pauses, `max(exec_timeout, idle_timeout)` (the reference's
-- `aliveTimeoutMs`).
-- @tparam table ctx `exec_timeout`, `idle_timeout`
-- @treturn number seconds
function _M.lease(ctx)
  return math_max(ctx.exec_timeout, ctx.idle_timeout)
end

--- Whether the remembered lease must be refreshed before a run.
-- A refresh is skipped only when the remembered lease provably covers this
-- run (`now + run_timeout + margin <= lease_end`) and still leaves at least
-- half the idle window, so an idle sandbox pauses between `idle_timeout / 2`
-- and `lease` seconds after its last run (the reference refreshes on every run).
-- @tparam table ctx `now`, `lease_end` (nil when unknown), `lease`, `exec_timeout`,
--   `idle_timeout`, `run_timeout`, `margin`
-- @treturn boolean
function _M.should_refresh(ctx)
  local lease_end = ctx.lease_end
  if not lease_end then return true end
  local now = ctx.now
  local run_timeout = ctx.run_timeout or ctx.exec_timeout
  if now + run_timeout + (ctx.margin or 5) > lease_end then return true end
  return lease_end - now < (ctx.idle_timeout or 0) / 2
end

--- What a new sandbox is created with. The session always puts its tag in
-- `metadata` afterwards, whatever this returns.
-- @tparam table ctx `template`, `lease`, `tag`, `tag_value`, `env`
-- @treturn table `{ template, timeout, metadata, env_vars, lifecycle }`
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
function _M.tenant(key)
  return key:match("^([^:]*):") or key
end

return _M
