--- warmbox.sim.fast: the simulator's fast path.
--
-- `warmbox.sim.run` drives the real `warmbox.session` code against the model
-- (the exact path, `exact = true`); that costs tens of microseconds per run
-- and a coroutine per conversation. This module plays the same session's
-- decisions directly on the model's records, in one discrete-event loop (a
-- heap of conversations by their next event, no coroutines), with the SAME
-- policy hooks (`lease`, `should_refresh`, `order`, `create_params`, `gc`,
-- `tenant`):
--
-- * a run: `lease`; with a remembered sandbox `should_refresh` decides
--   between no request and a `connect` (which resumes a paused sandbox);
--   without one (or when it is gone) the resolve: a list by tag, `order`,
--   `connect` + `set_timeout` per candidate, else `create` with
--   `create_params`; duplicates reaped; the maximum run length recycled
--   (pause + connect); then the hooks cell on a kernel that lacks it and the
--   run (non-Python: remove + make_dir of the output directory, and a listing
--   of it after), a run refused before it was accepted retried once on a
--   resolved sandbox. Each request costs a round trip plus the server's work,
--   as in the model.
-- * a prewarm: at the turn's start, under the conversation's lock,
--   what a run would do to get its sandbox (lease, connect or resolve or
--   create) and the kernel's start with the hooks cell; a run due meanwhile
--   waits for it.
-- * GC every `gc_every` seconds: every live tagged sandbox, newest first, as
--   `warmbox.gc` sees it (item, counts, totals), the policy's `gc` hook, a
--   busy session (a run or prewarm in flight) skipped, the remembered last run
--   of a running sandbox asked again, then kills and demotes.
--
-- A conversation's turn is played whole when it starts: its requests' effects
-- are booked at their own virtual times (leases from the model's timer heap,
-- the running count from a heap of changes), which is exact as long as
-- conversations touch only their own sandboxes. What it does not model (and
-- the exact path does): the concurrency cap and the rate limit (a 429 depends
-- on the other conversations' requests in flight; `warmbox.sim` uses the
-- exact path when either is set), and the time a GC pass takes (a pass acts
-- at its start: its listing, kills and demotes take no virtual time).
--
-- The parts, one file each under warmbox/sim/fast/: `requests` (the
-- requests a session sends, on the model's records), `resolve` and `session`
-- (a run), `prewarm`, `gc` (a pass), `loop` (the event loop), and `rules`
-- (every rule and constant copied from warmbox.session and warmbox.gc). They
-- share one state table, `sim` (made by `_new` below): plain functions taking
-- it first, called through locals (no method lookup on the hot path).
-- @module warmbox.sim.fast

local model_mod = require "warmbox.sim.model"
local rules = require "warmbox.sim.fast.rules"
local loop = require "warmbox.sim.fast.loop"

local tostring, pcall, error, collectgarbage = tostring, pcall, error, collectgarbage

local _M = {}

--- Whether the fast path can play a simulation with these model settings
-- (it does not model the concurrency cap or the rate limit).
function _M.supports(model_opts)
  model_opts = model_opts or {}
  return (model_opts.max_running or 0) <= 0 and (model_opts.rate_per_s or 0) <= 0
end

-- Tag value options: every conversation's tag value has the same fingerprint
-- (an HMAC of the template and env), computed once, not once per conversation.
local function tag_value_opts(template, env)
  local core = require "warmbox.core"
  local hmac, hmacs = core.hmac_sha256, {}
  return { template = template, env = env, sha256 = core.sha256, hmac = function(k, m)
    local key = k .. "\0" .. m
    local v = hmacs[key]
    if not v then v = hmac(k, m); hmacs[key] = v end
    return v
  end }
end

-- The settings and the model's constants every part reads.
local function settings(sim, S)
  local model, policy = S.model, S.policy
  local cfg = model.cfg
  sim.S, sim.model, sim.policy, sim.report, sim.events = S, model, policy, S.report, S.report.events
  sim.stats, sim.cfg, sim.live = model.stats, cfg, model.live
  sim.rtt2 = model.rtt / 2
  sim.create_s, sim.resume_s, sim.kernel_s, sim.pause_s = cfg.create_ms / 1000, cfg.resume_ms / 1000,
    cfg.kernel_ms / 1000, cfg.pause_ms / 1000
  sim.auto_resume_min, sim.max_length = cfg.auto_resume_min, model.max_length
  sim.t0, sim.exec_timeout, sim.idle_timeout, sim.template, sim.tag = S.t0, S.exec_timeout, S.idle_timeout,
    S.template, S.tag
  sim.env, sim.per_call, sim.prewarm_on, sim.tail, sim.max_age = S.env, S.per_call, S.prewarm, S.tail, S.max_age
  sim.fail, sim.note_error, sim.latencies, sim.log = S.fail, S.note_error, S.latencies, S.log
  sim.convs, sim.gen_of, sim.gc_every = S.convs, S.convs.gen_of, S.gc_every
  sim.pname = tostring(policy.name)
  sim.lease_hook, sim.refresh_hook, sim.order_hook, sim.create_hook, sim.gc_hook = policy.lease,
    policy.should_refresh, policy.order, policy.create_params, policy.gc
end

--- The fast path's state for a simulation `S` (see `simulate`): the settings,
-- the loop's counters (added to the books at the end), the marks of the turn
-- being played, the hooks' context tables, the event heap.
function _M._new(S)
  local sim = {}
  settings(sim, S)
  local model, tag = sim.model, sim.tag
  sim.deltas = { n = 0, k = {}, d = {} }
  model.deltas = sim.deltas
  sim.nlat = #sim.latencies
  sim.by_md_tag = model.by_md[tag]
  sim.by_tv = {}                         -- tag value -> conversation (GC's locks)
  sim.tv_opts = tag_value_opts(sim.template, sim.env)
  sim.nreq, sim.nruns, sim.nconnect = 0, 0, 0
  -- what happened to the turn being played
  sim.m_created, sim.m_resumed, sim.m_code_started, sim.m_sandbox = false, false, nil, nil
  sim.ctx = { env = sim.env, template = sim.template, tag = tag, exec_timeout = sim.exec_timeout,
    idle_timeout = sim.idle_timeout, margin = rules.LEASE_MARGIN, watched = true }
  sim.pause_after_run = sim.policy.pause_after_run == true
  -- GC: the built-in default hook is played without a call per listed sandbox
  sim.default_gc = sim.gc_hook == require("warmbox.policy.default").gc and not S.gc_full
  sim.tenant_of = rules.tenant_hook(sim.policy)
  sim.gctx = { max_age = sim.max_age, retention = sim.max_age, tag = tag, dry_run = false,
    counts = { kept = 0, kill = 0, demote = 0 }, totals = { seen = 0, kept = 0, kill = 0, demote = 0 } }
  sim.tv_info, sim.gc_item = {}, {}
  sim.heap, sim.seq = model_mod.new_heap(), 0
  sim.last_end = sim.t0
  sim.prewarms = { done = 0, unused = 0, failed = 0, requests = 0 }
  return sim
end

-- The Lua collector's pause while a simulation plays: the heap holds every
-- live sandbox's and conversation's record (270 MiB at 100,000
-- conversations), so a cycle starting when the heap is twice that (the
-- default, 200) traverses them again and again for little garbage; at 400 the
-- 1,000,000-run bench spends about 5 % less CPU time for 10 % more peak RSS.
_M.GC_PAUSE = 400

local function play(S) return loop.play(_M._new(S)) end

--- Play a simulation. `S` holds what `warmbox.sim.run` set up: `convs`
-- (conversations `{ key, start }` in order of arrival; `convs.gen_of(conv)`
-- makes one's turn generator, `gen:turn()`), `policy`,
-- `per_call`, `model`, `report`, `latencies` (appended to), `log` (or nil),
-- `t0`, `code`, `exec_timeout`, `idle_timeout`, `template`, `tag`, `env`,
-- `max_age`, `gc_every` (or false), `tail`, `prewarm`, `gc_full`,
-- `fail(code, msg)`, `note_error(code, msg)`. Fills the report's counts and
-- returns the time the simulation ended (its horizon).
function _M.simulate(S)
  local pause = collectgarbage("setpause", _M.GC_PAUSE)
  local ok, h = pcall(play, S)
  collectgarbage("setpause", pause)
  if not ok then error(h, 0) end
  return h
end

return _M
