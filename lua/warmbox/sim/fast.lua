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
-- * a prewarm (issue 16): at the turn's start, under the conversation's lock,
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
-- @module warmbox.sim.fast

local model_mod = require "warmbox.sim.model"
local tag_mod = require "warmbox.tag"
local outputs = require "warmbox.outputs"
local gc_mod = require "warmbox.gc"

local type, pairs, ipairs, tostring, pcall, next = type, pairs, ipairs, tostring, pcall, next
local string_format, math_floor, math_ceil, math_max, math_min, math_huge =
  string.format, math.floor, math.ceil, math.max, math.min, math.huge
local table_sort = table.sort
local heap_push, heap_pop = model_mod.heap_push, model_mod.heap_pop

local ops = model_mod.ops
local settle, expire, stop_running, start_running, drain_running = ops.settle, ops.expire, ops.stop_running,
  ops.start_running, ops.drain_running
local running_delta = ops.running_delta
local arm, start_paused, end_paused, remove, cap, touch, add_box = ops.arm, ops.start_paused, ops.end_paused,
  ops.remove, ops.cap, ops.touch, ops.add_box
local rfc3339 = model_mod.rfc3339
local parse_time = require("warmbox.util").parse_time

local LEASE_MARGIN = 5                -- warmbox.session.LEASE_MARGIN
local COVER_MARGIN = 2                -- warmbox.session.COVER_MARGIN
local DEMOTE_MARK = require("warmbox.state").DEMOTE_MARK

local _M = {}

--- Whether the fast path can play a simulation with these model settings
-- (it does not model the concurrency cap or the rate limit).
function _M.supports(model_opts)
  model_opts = model_opts or {}
  return (model_opts.max_running or 0) <= 0 and (model_opts.rate_per_s or 0) <= 0
end

-- Milliseconds, as E2B's RFC 3339 times carry them (and warmbox.gc parses them back).
local function ms(t) return math_floor(t * 1000 + 0.5) / 1000 end

--- Play a simulation. `S` holds what `warmbox.sim.run` set up: `convs`
-- (conversations `{ key, start }` in order of arrival; `convs.gen_of(conv)`
-- makes one's turn generator, `gen:turn()`), `policy`,
-- `per_call`, `model`, `report`, `latencies` (appended to), `log` (or nil),
-- `t0`, `code`, `exec_timeout`, `idle_timeout`, `template`, `tag`, `env`,
-- `max_age`, `gc_every` (or false), `tail`, `prewarm`, `fail(code, msg)`,
-- `note_error(code, msg)`. Fills the report's counts and returns the time
-- the simulation ended (its horizon).
local function simulate(S)
  local model, policy, report = S.model, S.policy, S.report
  local events = report.events
  local stats, cfg, live = model.stats, model.cfg, model.live
  local deltas = { n = 0, k = {}, d = {} }
  model.deltas = deltas
  local leases = model.leases
  local rtt2 = model.rtt / 2
  local create_s, resume_s, kernel_s, pause_s = cfg.create_ms / 1000, cfg.resume_ms / 1000, cfg.kernel_ms / 1000,
    cfg.pause_ms / 1000
  local auto_resume_min, max_length = cfg.auto_resume_min, model.max_length
  local t0 = S.t0
  local exec_timeout, idle_timeout, template, tag = S.exec_timeout, S.idle_timeout, S.template, S.tag
  local env, per_call, prewarm_on = S.env, S.per_call, S.prewarm
  local fail, latencies, log = S.fail, S.latencies, S.log
  local nlat = #latencies
  local by_md_tag = model.by_md[tag]
  local pname = tostring(policy.name)
  local lease_hook, refresh_hook, order_hook, create_hook = policy.lease, policy.should_refresh, policy.order,
    policy.create_params
  local by_tv = {}                       -- tag value -> conversation (GC's locks)
  -- Every conversation's tag value has the same fingerprint (an HMAC of the
  -- template and env): computed once, not once per conversation.
  local core = require "warmbox.core"
  local hmac, hmacs = core.hmac_sha256, {}
  local tv_opts = { template = template, env = env, sha256 = core.sha256, hmac = function(k, m)
    local key = k .. "\0" .. m
    local v = hmacs[key]
    if not v then v = hmac(k, m); hmacs[key] = v end
    return v
  end }
  -- Counters kept in locals while the loop runs (added to the books at the end).
  local nreq, nruns, nconnect = 0, 0, 0
  local r_runs, r_ok, r_warm_hits, r_resumes, r_cold_starts, r_turns = 0, 0, 0, 0, 0, 0

  -- ----------------------------------------------------------------
  -- The model's rules at explicit times (a is a request's arrival)
  -- ----------------------------------------------------------------

  -- The sandbox as it is at time a (its lease may have run out since the
  -- global clock: only its own conversation can see that ahead of time).
  local function at(b, a)
    if b.state == "running" and b.end_at <= a then expire(model, b) end
    return b.state
  end

  -- Resume a paused sandbox at a with a lease of `timeout`: done at the returned time.
  local function resume(b, timeout, a)
    end_paused(model, b, a)
    start_running(model, a)
    local r
    if b.memory then
      r = a + resume_s
    else
      r = a + create_s
      stats.cold_boot_resumes = stats.cold_boot_resumes + 1
    end
    b.state, b.started_at, b.running_since = "running", r, r
    b.end_at = cap(model, b, r + timeout)
    arm(model, b)
    touch(model, b)
    b.memory = true
    stats.resumes = stats.resumes + 1
    return r
  end

  -- Marks of the turn being played (what happened to it).
  local m_created, m_resumed, m_code_started, m_sandbox

  local function not_found_connect(id)
    return string_format("paused sandbox '%s' not found", id)
  end

  -- The record of sandbox `id`: `bx` when the caller has it (a session keeps
  -- its sandbox's record: no lookup in the large table of live ones), nil
  -- when it is gone.
  local function find(id, bx)
    if bx then
      if bx.state == "killed" then return nil end
      return bx
    end
    return live[id]
  end

  -- c:connect(id, { timeout }) sent at t → t_after, resumed | nil, msg, code
  local function connect(id, timeout, t, bx)
    nreq = nreq + 1
    local a = t + rtt2
    local b = find(id, bx)
    if not b then return a + rtt2, nil, not_found_connect(id), "NOT_FOUND" end
    if timeout > max_length then
      return a + rtt2, nil, string_format("timeout cannot be greater than %g hours", cfg.max_length_hours),
        "BAD_REQUEST"
    end
    local st = at(b, a)
    if st == "running" then
      local e = cap(model, b, a + timeout)
      if e > b.end_at then b.end_at = e end
      arm(model, b)
      return a + rtt2, false
    end
    if st ~= "paused" then return a + rtt2, nil, not_found_connect(id), "NOT_FOUND" end
    local r = resume(b, timeout, a)
    m_resumed = true
    return r + rtt2, true
  end

  -- c:set_timeout(id, seconds) sent at t → t_after, true | nil, msg, code
  local function set_timeout(id, seconds, t, bx)
    nreq = nreq + 1
    local a = t + rtt2
    local b = find(id, bx)
    if not b or at(b, a) ~= "running" then
      return a + rtt2, nil, string_format("sandbox '%s' not found or not running", id), "NOT_FOUND"
    end
    if a - b.started_at >= max_length then return a + rtt2, nil, "max instance length exceeded", "BAD_REQUEST" end
    b.end_at = cap(model, b, a + seconds)
    if b.timer_at and b.timer_at > b.end_at then b.timer_at = nil end
    arm(model, b)
    if b.end_at <= a then expire(model, b) end
    return a + rtt2, true
  end

  -- c:info(id) sent at t → t_after, whether the sandbox exists (running or paused)
  local function cp_info(id, t, bx)
    nreq = nreq + 1
    local a = t + rtt2
    local b = find(id, bx)
    if b then at(b, a) end
    return a + rtt2, b ~= nil and b.state ~= "killed"
  end

  -- c:kill(id) sent at t → t_after
  local function kill(id, t, bx)
    nreq = nreq + 1
    local a = t + rtt2
    local b = find(id, bx)
    if b then
      at(b, a)
      if b.state ~= "killed" then
        remove(model, b, a)
        stats.kills = stats.kills + 1
      end
    end
    return a + rtt2
  end

  -- c:pause(id) sent at t (memory kept) → t_after, true | false | nil, msg, code
  local function pause(id, t, bx)
    nreq = nreq + 1
    local a = t + rtt2
    local b = find(id, bx)
    if not b then return a + rtt2, nil, string_format("sandbox '%s' not found", id), "NOT_FOUND" end
    local st = at(b, a)
    if st == "paused" then return a + rtt2, false end
    local p = a + pause_s
    if b.end_at <= p then
      expire(model, b)                       -- its lease ran out first
      return p + rtt2, false
    end
    stop_running(model, b, p)
    start_paused(b, p)
    b.memory = true
    stats.pauses = stats.pauses + 1
    return p + rtt2, true
  end

  -- Reach a sandbox through the proxy at a: auto-resume a paused one.
  local function reach(id, a, bx)
    local b = find(id, bx)
    if b and at(b, a) == "paused" and b.auto_resume and b.memory then
      a = resume(b, math_min(math_max(b.timeout, auto_resume_min), max_length), a)
      stats.auto_resumes = stats.auto_resumes + 1
      m_resumed = true
    end
    if not b or b.state ~= "running" then return nil, a end
    return b, a
  end

  local function gone_msg(id)
    return string_format("sandbox '%s' is not reachable (the sandbox was not found)", id)
  end

  -- A data-plane call but run_code (write, remove, make_dir, list_dir) sent at t.
  local function dp(id, t, bx)
    nreq = nreq + 1
    local b, a = reach(id, t + rtt2, bx)
    if not b then return a + rtt2, nil, gone_msg(id), "SANDBOX_GONE" end
    return a + rtt2, b
  end

  -- s:run_code(cell) sent at t → t_after, b (its kernel has the hooks: b.hooked) | nil, msg, code
  local function run_code(id, prelude, duration, timeout, t, bx)
    nreq = nreq + 1
    local b, a = reach(id, t + rtt2, bx)
    if not b then return a + rtt2, nil, gone_msg(id), "SANDBOX_GONE" end
    if not b.kernel then
      a = a + kernel_s
      if b.end_at <= a then
        expire(model, b)
        if b.state == "paused" then stats.paused_during_run = stats.paused_during_run + 1 end
        return a + rtt2, nil, "the stream broke: the sandbox was "
          .. (b.state == "paused" and "paused" or "killed") .. " during the run", "STREAM_BROKEN"
      end
      b.kernel, b.hooked = true, false
    end
    m_code_started, m_sandbox = a, id
    nruns = nruns + 1
    local d = prelude and 0 or duration
    local timed_out = timeout and d > timeout
    local finish = a + (timed_out and timeout or d)
    if b.end_at < finish then
      expire(model, b)
      if b.state == "paused" then stats.paused_during_run = stats.paused_during_run + 1 end
      return b.stopped_at + rtt2, nil, "the stream broke: the sandbox was "
        .. (b.state == "paused" and "paused" or "killed") .. " during the run", "STREAM_BROKEN"
    end
    if timed_out then return finish + rtt2, nil, "execution timed out", "TIMEOUT" end
    b.executions = b.executions + 1
    if prelude then b.hooked = true end
    return finish + rtt2, b
  end

  -- ----------------------------------------------------------------
  -- The session's decisions (warmbox.session without `parallel`)
  -- ----------------------------------------------------------------

  local ctx = { env = env, template = template, tag = tag, exec_timeout = exec_timeout,
    idle_timeout = idle_timeout, margin = LEASE_MARGIN }
  -- One context table, refilled for each hook call (a hook must not keep it).
  local function fill(c, st, t, run_timeout)
    local x = ctx
    x.key, x.tag_value, x.now, x.run_timeout = c.skey, c.stv, t, run_timeout or exec_timeout
    x.lease_end, x.sandbox_id, x.lease = st.lease_end, st.sandbox_id, nil
    return x
  end

  local function hook_failed(name, err)
    return string_format("policy '%s' hook '%s' failed: %s", pname, name, tostring(err))
  end

  -- What a session remembers (warmbox.state's fields) lives in the
  -- conversation's own table (one table less to reach per turn): forgetting
  -- clears those fields only.
  local function forget(st)
    st.sandbox_id, st.lease_end, st.run_started, st.last_run, st.hooked, st.auto_resume, st.memory_lost =
      nil, nil, nil, nil, nil, nil, nil
    st.box = nil
  end

  local function remember(st, b, lease_end, run_started)
    if st.sandbox_id ~= b.id then st.hooked, st.run_started, st.auto_resume = nil, nil, nil end
    st.sandbox_id, st.box = b.id, b
    if run_started then st.run_started = run_started end
    if st.run_started then lease_end = math_min(lease_end, st.run_started + max_length) end
    st.lease_end = lease_end
  end

  local listed = ops.detail_of

  -- The listed candidates of tag value tv at a (running or paused), newest
  -- first; nil when the pool is empty.
  local function candidates(tv, a)
    local pool = by_md_tag and by_md_tag[tv]
    local cands
    if pool and next(pool) then
      cands = {}
      for b in pairs(pool) do
        at(b, a)
        if b.state == "running" or b.state == "paused" then cands[#cands + 1] = b end
      end
      table_sort(cands, function(x, y) return x.started_at > y.started_at
        or (x.started_at == y.started_at and x.n > y.n) end)
    end
    return cands
  end

  -- The candidates in `order`'s order, each tried with connect + set_timeout
  -- until one is secured. → t_after, kept id (or nil), gone | t_after, false, msg, code
  local function secure_candidate(c, st, lease, t, cands)
    local items, by_id, rec = {}, {}, {}
    for i, b in ipairs(cands) do
      local d = listed(b)
      items[i], by_id[b.id], rec[b.id] = d, d, b
    end
    local copy = {}
    for i, d in ipairs(items) do copy[i] = d end
    local ok, o = pcall(order_hook, copy, fill(c, st, t))
    if not ok then return t, false, hook_failed("order", o), "POLICY" end
    if type(o) ~= "table" then
      return t, false, string_format("policy '%s' hook 'order' returned %s (table expected)", pname, type(o)),
        "POLICY"
    end
    local seen = {}
    local gone = {}
    for _, it in ipairs(o) do
      local id = type(it) == "table" and it.sandbox_id or it
      if type(id) == "string" and by_id[id] and not seen[id] then
        seen[id] = true
        local d = by_id[id]
        local t1 = t
        local t2, resumed, cerr, ccode = connect(id, lease, t, rec[id])
        t = t2
        nconnect = nconnect + 1
        if resumed == nil then
          if ccode ~= "NOT_FOUND" then return t, false, cerr, ccode end
          gone[id] = true
        else
          local t3, ok2, terr, tcode = set_timeout(id, lease, t, rec[id])
          t = t3
          if ok2 then
            remember(st, rec[id], t1 + lease, resumed and t1 or parse_time(d.started_at))
            local lc = d.lifecycle
            st.auto_resume = type(lc) == "table" and lc.auto_resume == true and lc.on_timeout == "pause" or nil
            return t, id, gone
          end
          if tcode ~= "NOT_FOUND" then return t, false, terr, tcode end
          gone[id] = true
        end
      end
    end
    return t, nil, gone
  end

  -- A new sandbox with `create_params` at t. → t_after, id | t_after, nil, msg, code
  local function create(c, st, lease, t)
    fill(c, st, t)
    ctx.lease = lease
    local ok, p = pcall(create_hook, ctx)
    if not ok then return t, nil, hook_failed("create_params", p), "POLICY" end
    if type(p) ~= "table" then
      return t, nil, string_format("policy '%s' hook 'create_params' returned %s (table expected)", pname,
        type(p)), "POLICY"
    end
    local timeout = p.timeout
    if timeout ~= nil and not (type(timeout) == "number" and timeout > 0 and timeout < math_huge) then
      return t, nil, string_format("policy '%s' hook 'create_params' returned timeout %s (positive number "
        .. "expected)", pname, tostring(timeout)), "POLICY"
    end
    timeout = math_max(timeout or lease, lease)
    local md = {}
    for k, v in pairs(p.metadata or {}) do md[k] = v end
    md[tag] = c.stv
    local lc = p.lifecycle or { on_timeout = "pause", auto_resume = true }
    local t1 = t
    nreq = nreq + 1
    local a = t + rtt2
    if timeout > max_length then
      return a + rtt2, nil, string_format("timeout cannot be greater than %g hours", cfg.max_length_hours),
        "BAD_REQUEST"
    end
    local r = a + create_s
    running_delta(model, a, 1.5)           -- booting counts as running, not towards the peak
    running_delta(model, r, -1.5)
    local b = add_box(model, { template = p.template or template, metadata = md, lifecycle = lc }, timeout, r)
    if not by_md_tag then by_md_tag = model.by_md[tag] end
    by_tv[c.stv] = by_tv[c.stv] or c
    t = r + rtt2
    events.create = events.create + 1
    m_created = true
    remember(st, b, t1 + timeout, t1)
    st.auto_resume = type(lc) == "table" and lc.auto_resume == true and lc.on_timeout == "pause" or nil
    return t, b.id
  end

  -- The resolve (list, order, connect + set_timeout, else create, reap) at t.
  -- → t_after, id, reused | t_after, nil, msg, code
  local function resolve(c, st, lease, t)
    local tv = c.stv
    nreq = nreq + 1
    local a = t + rtt2
    local cands = candidates(tv, a)
    if not by_md_tag then by_md_tag = model.by_md[tag] end
    t = a + rtt2
    local kept, gone = nil, nil
    if cands and #cands > 0 then
      local t2, k, g, code = secure_candidate(c, st, lease, t, cands)
      t = t2
      if k == false then return t, nil, g, code end
      kept, gone = k, g
    end
    local created = false
    if not kept then
      local t2, id, err, code = create(c, st, lease, t)
      t = t2
      if not id then return t, nil, err, code end
      kept, created = id, true
    end
    if cands then
      for _, b in ipairs(cands) do
        if b.id ~= kept and not (gone and gone[b.id]) then
          t = kill(b.id, t, b)
          events.kill = events.kill + 1
        end
      end
    end
    return t, kept, not created
  end

  -- _acquire at t → t_after, id, reused | t_after, nil, msg, code
  local function acquire(c, st, t, run_timeout)
    fill(c, st, t, run_timeout)
    local ok, lease = pcall(lease_hook, ctx)
    if not ok then return t, nil, hook_failed("lease", lease), "POLICY" end
    if not (type(lease) == "number" and lease > 0 and lease < math_huge) then
      return t, nil, string_format("policy '%s' hook 'lease' returned %s (positive number expected)", pname,
        tostring(lease)), "POLICY"
    end
    lease = math_ceil(lease)
    if run_timeout + LEASE_MARGIN > lease then lease = math_ceil(run_timeout + LEASE_MARGIN) end
    ctx.lease = lease
    local id, reused
    local sid = st.sandbox_id
    if sid then
      local ok2, refresh = pcall(refresh_hook, ctx)
      if not ok2 then return t, nil, hook_failed("should_refresh", refresh), "POLICY" end
      if not refresh then
        id, reused = sid, true
      else
        local t1 = t
        local box = st.box
        local t2, resumed, cerr, ccode = connect(sid, lease, t, box)
        t = t2
        nconnect = nconnect + 1
        if resumed ~= nil then
          remember(st, box or live[sid], t1 + lease, resumed and t1 or nil)
          id, reused = sid, true
        elseif ccode ~= "NOT_FOUND" then
          return t, nil, cerr, ccode
        else
          forget(st)
        end
      end
    end
    if not id then
      local t2, kid, kreused, ecode = resolve(c, st, lease, t)
      t = t2
      if not kid then return t, nil, kreused, ecode end
      id, reused = kid, kreused
    end
    -- The maximum run length: pause (memory kept) and connect: a new run of the same kernel.
    if st.run_started and st.run_started + max_length < t + run_timeout + LEASE_MARGIN then
      local box = st.box
      local t2, pok, perr, pcode = pause(id, t, box)
      t = t2
      if pok == nil and pcode ~= "NOT_FOUND" then return t, nil, perr, pcode end
      local t1 = t
      local t3, resumed, cerr, ccode = connect(id, lease, t, box)
      t = t3
      events.recycle = (events.recycle or 0) + 1
      if resumed == nil then
        if ccode == "NOT_FOUND" then forget(st) else st.lease_end = nil end
        return t, nil, cerr, ccode
      end
      remember(st, box or live[id], t1 + lease, t1)
    end
    return t, id, reused
  end

  -- The run's own cell sent at t → t_after, b | nil, msg, code, asked: when its
  -- execute was answered 502/404, what the session's asking the sandbox gave
  -- (Session:_never_arrived: give a marked cell's id up over envd, else the
  -- control plane's info): "again", "gone" or false.
  local function send_cell(id, st, language, duration, run_timeout, t, box)
    local python = language == "python"
    local marked = (python and st.hooked == id) or (not python and outputs.cell_guarded("", language, "0") ~= nil)
    local t2, b, err, code_ = run_code(id, false, duration, run_timeout, t, box)
    if b or (code_ ~= "SANDBOX_GONE" and code_ ~= "NOT_FOUND") then return t2, b, err, code_ end
    -- a cell without a guard may have run: never sent again
    if not marked then return t2, nil, err, code_, false end
    local claimed
    if marked then t2, claimed = dp(id, t2, box) end
    if claimed then return t2, nil, err, code_, "again" end
    local exists
    t2, exists = cp_info(id, t2, box)
    return t2, nil, err, code_, not exists and "gone" or false
  end

  -- The lease covers the whole run (Session:_cover): one that no longer
  -- covers the cell after the hooks cell is extended before it.
  -- → t_after, true | t_after, nil, msg, code
  local function cover(id, st, run_timeout, t, box)
    if not st.lease_end or t + run_timeout + COVER_MARGIN <= st.lease_end then return t, true end
    local want = math.ceil(run_timeout + LEASE_MARGIN)
    local t1, ok, err, code_ = set_timeout(id, want, t, box)
    if not ok then return t1, nil, err, code_ end
    local e = t + want
    if st.run_started then e = math_min(e, st.run_started + max_length) end
    st.lease_end = math.max(st.lease_end, e)
    return t1, true
  end

  -- Before the run's cell (Session:_prepare, then _cover): the output directory
  -- (another language: emptied on a reused sandbox, made), or the hooks cell on
  -- a kernel without them, then the lease. → t_after, truthy | t_after, nil, msg, code
  local function prepare(id, st, python, reused, run_timeout, t, box)
    local b, err, code_ = true, nil, nil
    if not python then
      if reused then t, b, err, code_ = dp(id, t, box) end
      if b then t, b, err, code_ = dp(id, t, box) end
    elseif st.hooked ~= id then
      t, b, err, code_ = run_code(id, true, 0, run_timeout, t, box)
      if b and b.hooked then st.hooked = id end
    end
    if not b then return t, nil, err, code_ end
    return cover(id, st, run_timeout, t, box)
  end

  -- One run (Session:run) starting at t → t_after, ok, msg, code
  local function run(c, st, t, duration, timeout, language)
    local run_timeout = timeout or exec_timeout
    language = language or "python"
    local python = language == "python"
    for attempt = 1, 2 do
      local t2, id, reused, ecode = acquire(c, st, t, run_timeout)
      t = t2
      if not id then return t, false, reused, ecode end
      local box = st.box
      local b, err, code_, asked
      t, b, err, code_ = prepare(id, st, python, reused, run_timeout, t, box)
      if not b and (code_ == "SANDBOX_GONE" or code_ == "NOT_FOUND") then
        -- unreachable before the cell (Session:_execute): sent again while it exists
        local exists
        t, exists = cp_info(id, t, box)
        asked = exists and "again" or "gone"
      elseif b then t, b, err, code_, asked = send_cell(id, st, language, duration, run_timeout, t, box) end
      if b then
        if python and b.hooked then
          st.hooked = id
        else
          if python then st.hooked = nil end
          t = dp(id, t, box)                 -- the listing of the output directory
        end
        st.last_run = t
        st.memory_lost = nil
        return t, true
      end
      local retryable = asked
      if asked == nil then retryable = (code_ == "SANDBOX_GONE" or code_ == "NOT_FOUND") and "gone" end
      if retryable and attempt == 1 then
        events.retry = events.retry + 1
        if retryable == "gone" then
          forget(st)
        elseif code_ == "SANDBOX_GONE" or code_ == "NOT_FOUND" or code_ == "RATE_LIMITED" then
          st.lease_end = nil
        end
      else
        if asked == false then st.lease_end = nil end
        return t, false, err, code_
      end
    end
  end

  -- Prewarm (issue 16) at t under the lock: acquire, then the kernel's start
  -- with the hooks cell. → t_after, ok
  local function prewarm(c, st, t)
    local t2, id = acquire(c, st, t, exec_timeout)
    t = t2
    if not id then return t, false end
    if st.hooked ~= id then
      local t3, b = run_code(id, true, 0, exec_timeout, t, st.box)
      t = t3
      if not b then return t, false end
      if b.hooked then st.hooked = id end
    end
    return t, true
  end

  -- ----------------------------------------------------------------
  -- GC (warmbox.gc's decisions, one instant pass)
  -- ----------------------------------------------------------------

  local gc_hook = policy.gc
  -- The built-in default hook, played without a call per listed sandbox.
  local default_gc = gc_hook == require("warmbox.policy.default").gc and not S.gc_full
  local tenant_of = type(policy.tenant) == "function" and policy.tenant or gc_mod.default_tenant
  local max_age = S.max_age
  local gctx = { max_age = max_age, retention = max_age, tag = tag, dry_run = false,
    counts = { kept = 0, kill = 0, demote = 0 }, totals = { seen = 0, kept = 0, kill = 0, demote = 0 } }
  local ACTIONS = { keep = true, kill = true, demote = true }

  -- What GC derives from a tag value (its key, tenant, whether it is an
  -- orphan), once per tag value; a sandbox's metadata copy, once per sandbox.
  -- The item a hook sees is one table refilled for each sandbox (as its
  -- context): a gc hook must neither keep nor change them.
  local tv_info = {}
  local gc_item = {}
  local function item_of(b, tv)
    local info = b.gc_info or tv_info[tv]
    if not info then
      local key, enc = tag_mod.parse_tag(tv)
      info = { tv = tv, key = key, orphan = enc == nil }
      if enc then
        local ok, tn = pcall(tenant_of, key or tv)
        info.tenant = ok and type(tn) == "string" and tn or gc_mod.default_tenant(key or tv)
      end
      info.group = info.tenant or (info.orphan and "(orphans)") or "(hashed)"
      tv_info[tv] = info
    end
    local md = b.gc_md
    if not md then
      md = {}
      for k, v in pairs(b.metadata) do md[k] = v end
      b.gc_md, b.gc_info = md, info
    end
    -- The listed times (RFC 3339, milliseconds), formatted again only when they
    -- change (the cache warmbox.sim.model's listing keeps too).
    local sa, ea = b.started_at, b.end_at
    if b.fmt_started ~= sa then b.fmt_started, b.s_started = sa, rfc3339(sa) end
    if b.fmt_end ~= ea then b.fmt_end, b.s_end = ea, rfc3339(ea) end
    local s, e = ms(sa), ms(ea)
    local it = gc_item
    it.sandbox_id, it.started_at, it.end_at, it.template_id, it.metadata = b.id, b.s_started, b.s_end, b.template, md
    it.tag_value, it.key, it.orphan, it.tenant = tv, info.key, info.orphan, info.tenant
    if b.state == "paused" then
      it.state, it.last_activity, it.demoted = "paused", e, e >= s and e - s <= DEMOTE_MARK
    else
      it.state, it.last_activity, it.demoted = "running", s, false
    end
    return it, info.group
  end

  local function copy(t)
    local o = {}
    for k, v in pairs(t) do o[k] = v end
    return o
  end

  -- The default policy's kills at T (see gc_pass), appended to acts newest first.
  local function gc_default_kills(T, acts)
    local mage = max_age or 86400
    local cut = T - mage + 1
    local found = {}
    local b = model.oldest
    while b and b.started_at <= cut do
      local info = b.gc_info
      local tv = info and info.tv or b.metadata[tag]
      if info or (type(tv) == "string" and tv ~= "") then
        local it = item_of(b, tv)
        local last = it.last_activity
        if not it.orphan and last and T - last > mage then
          found[#found + 1] = { item = copy(it), action = "kill", b = b }
        end
      end
      b = b.newer
    end
    for i = #found, 1, -1 do acts[#acts + 1] = found[i] end
  end

  -- The policy's gc hook on every tagged sandbox listed from b (newest) on,
  -- counted into tenants and totals, what it does not keep appended to acts.
  -- → the number listed, the number of hook errors
  local function gc_list(b, tenants, totals, acts)
    local nlisted, errs = 0, 0
    while b do
      nlisted = nlisted + 1
      local info = b.gc_info       -- a sandbox's metadata never changes: its tag value is known
      local tv = info and info.tv or b.metadata[tag]
      if info or (type(tv) == "string" and tv ~= "") then
        -- decide(item) and count(item, action, 1), inlined; the context's
        -- counts and totals are the pass's own tables (read-only for the hook)
        local it, group = item_of(b, tv)
        local cc = tenants[group]
        if not cc then cc = { kept = 0, kill = 0, demote = 0 }; tenants[group] = cc end
        totals.seen = totals.seen + 1
        gctx.counts, gctx.totals, gctx.tag_value, gctx.tenant = cc, totals, tv, it.tenant
        local ok, action = pcall(gc_hook, it, gctx)
        if ok and action == "keep" then
          cc.kept = cc.kept + 1
          totals.kept = totals.kept + 1
        elseif ok and ACTIONS[action] then
          cc[action] = cc[action] + 1
          totals[action] = totals[action] + 1
          acts[#acts + 1] = { item = copy(it), action = action, b = b }
        else
          errs = errs + 1
          S.note_error("POLICY", ok and ("gc policy returned " .. tostring(action)) or ("gc policy failed: "
            .. tostring(action)))
        end
      end
      b = b.older
    end
    return nlisted, errs
  end

  -- GC's kill of sandbox bx at T (st: its conversation's memory, or nil).
  local function gc_kill(bx, st, T)
    remove(model, bx, T)
    stats.kills = stats.kills + 1
    nreq = nreq + 1
    -- the session forgets it (its next run resolves at once)
    if st and st.sandbox_id == bx.id then forget(st) end
  end

  -- GC's demote of sandbox bx at T (paused without its memory; st: its
  -- conversation's memory, or nil).
  local function gc_demote(bx, st, T)
    if bx.state == "paused" then
      nreq = nreq + 1
      end_paused(model, bx, T)
      bx.started_at = T
      touch(model, bx)
      stats.resumes = stats.resumes + 1
    else
      stop_running(model, bx, T)
    end
    nreq = nreq + 1
    start_paused(bx, T)
    bx.memory, bx.kernel, bx.hooked = false, false, false
    stats.pauses = stats.pauses + 1
    if st and st.sandbox_id == bx.id then
      st.hooked = nil
      st.memory_lost = bx.id
    end
  end

  local function gc_pass(T)
    local tenants, totals = {}, { seen = 0, kept = 0, kill = 0, demote = 0 }
    local function count(item, action, d)
      local tn = item.tenant or (item.orphan and "(orphans)") or "(hashed)"
      local cc = tenants[tn]
      if not cc then cc = { kept = 0, kill = 0, demote = 0 }; tenants[tn] = cc end
      local k = action == "keep" and "kept" or action
      cc[k] = cc[k] + d
      totals[k] = totals[k] + d
    end
    local errs = 0
    local function decide(item)
      local tn = item.tenant or (item.orphan and "(orphans)") or "(hashed)"
      local cc = tenants[tn]
      gctx.counts = { kept = cc and cc.kept or 0, kill = cc and cc.kill or 0, demote = cc and cc.demote or 0 }
      gctx.totals = { seen = totals.seen, kept = totals.kept, kill = totals.kill, demote = totals.demote }
      gctx.now, gctx.tag_value, gctx.tenant = T, item.tag_value, item.tenant
      local ok, action = pcall(gc_hook, item, gctx)
      if not ok or not ACTIONS[action] then
        errs = errs + 1
        S.note_error("POLICY", ok and ("gc policy returned " .. tostring(action)) or ("gc policy failed: "
          .. tostring(action)))
        return nil
      end
      return action
    end
    local acts = {}
    local b = model.newest
    local nlisted = 0
    gctx.now = T
    if default_gc then
      -- The default policy's hook (warmbox.policy.default.gc: orphans kept,
      -- kill when now - last_activity > max_age; it reads nothing else, and
      -- nothing but its kills is booked): only sandboxes whose last activity
      -- is older than the cut can be killed, and a listed last activity is
      -- never before the start (ms(started_at) for a running one, ms(end_at)
      -- >= it for a paused one), so they are all at the list's oldest end.
      -- Walk from there up to the cut (with a second of slack), then act on
      -- them newest first, the order of the full listing.
      nlisted = model.nlive
      gc_default_kills(T, acts)
      b = nil
    end
    local nl, nerrs = gc_list(b, tenants, totals, acts)
    nlisted, errs = nlisted + nl, errs + nerrs
    nreq = nreq + math_max(1, math_ceil(nlisted / 100))   -- the listing's pages
    local killed, demoted, busy = 0, 0, 0
    for _, e in ipairs(acts) do
      local item, action, bx = e.item, e.action, e.b
      local c = by_tv[item.tag_value]
      if c and c.lock_until > T then
        count(item, action, -1)
        count(item, "keep", 1)
        busy = busy + 1
      else
        nreq = nreq + 1          -- its re-check (info)
        local st = c and c.st
        local last_run = st and st.last_run
        if st and st.sandbox_id == item.sandbox_id and last_run and last_run > (item.last_activity or -math_huge) then
          item.last_activity = last_run
          count(item, action, -1)
          action = decide(item)
          if action then count(item, action, 1) else count(item, "keep", 1) end
        end
        if action == "kill" then
          gc_kill(bx, st, T)
          killed = killed + 1
        elseif action == "demote" then
          gc_demote(bx, st, T)
          demoted = demoted + 1
        end
      end
    end
    report.gc_passes = report.gc_passes + 1
    report.gc_kills = report.gc_kills + killed
    report.gc_demoted = report.gc_demoted + demoted
    report.gc_busy = report.gc_busy + busy
    report.gc_errors = report.gc_errors + errs
  end

  -- ----------------------------------------------------------------
  -- The event loop
  -- ----------------------------------------------------------------

  local heap = model_mod.new_heap()
  local heap_t, heap_v = heap.t, heap.v
  local seq = 0
  local function schedule(c, t)
    seq = seq + 1
    heap_push(heap, t, seq, c)
  end

  local last_end = t0
  local prewarms = { done = 0, unused = 0, failed = 0, requests = 0 }

  -- The conversation's next turn: schedules its first event (or ends it).
  local function next_turn(c)
    while true do
      local t, duration, timeout, language, lead, runs = c.gen:turn()
      if not t then
        c.gen = nil                           -- done: its generator goes
        return
      end
      c.n = c.n + 1
      r_turns = r_turns + 1
      local due = t0 + t
      c.due, c.duration, c.timeout, c.language, c.runs = due, duration, timeout, language, runs ~= false
      if per_call then
        c.skey = c.key .. "#" .. c.n
        c.stv = tag_mod.tag_value(c.skey, tv_opts)
        c.st = {}
      end
      if prewarm_on then
        c.phase = "prewarm"
        schedule(c, math_max(due - (lead or 0), c.free))
        return
      end
      if c.runs then
        c.phase = "run"
        schedule(c, math_max(due, c.free))
        return
      end
    end
  end

  local function play_run(c, T)
    local began = math_max(c.due, c.prev_end)
    m_created, m_resumed, m_code_started, m_sandbox = false, false, nil, nil
    r_runs = r_runs + 1
    local st = c.st
    local f, ok, err, ecode = run(c, st, T, c.duration, c.timeout, c.language)
    if log then
      log[#log + 1] = { session = c.key, due = c.due - t0, start = began - t0, finish = f - t0,
        code_started = m_code_started and m_code_started - t0, ok = ok, code = not ok and tostring(ecode) or nil,
        created = m_created, resumed = m_resumed }
    end
    if not ok then
      fail(tostring(ecode), tostring(err))
    else
      r_ok = r_ok + 1
      if m_created then
        r_cold_starts = r_cold_starts + 1
        if c.had_box then
          report.turns_lost_state = report.turns_lost_state + 1
          if not c.lost then
            c.lost = true
            report.conversations_lost_state = report.conversations_lost_state + 1
          end
        end
      elseif m_resumed then
        r_resumes = r_resumes + 1
      else
        r_warm_hits = r_warm_hits + 1
      end
      c.had_box = true
      nlat = nlat + 1
      latencies[nlat] = math_floor(((m_code_started or f) - began) * 1e6 + 0.5) / 1000
    end
    if per_call and m_sandbox then
      f = kill(m_sandbox, f)
    end
    c.free, c.prev_end, c.lock_until = f, f, f
    if f > last_end then last_end = f end
  end

  local function play_prewarm(c, T)
    m_created, m_resumed, m_code_started, m_sandbox = false, false, nil, nil
    local r0 = nreq
    local f, ok = prewarm(c, c.st, T)
    prewarms.done = prewarms.done + 1
    prewarms.requests = prewarms.requests + nreq - r0
    if not ok then prewarms.failed = prewarms.failed + 1 end
    if m_created then prewarms.created = (prewarms.created or 0) + 1 end
    if m_resumed then prewarms.resumed = (prewarms.resumed or 0) + 1 end
    if not c.runs then
      prewarms.unused = prewarms.unused + 1
      if per_call and m_sandbox then f = kill(m_sandbox, f) end
    end
    c.free, c.lock_until = f, f
    if f > last_end then last_end = f end
  end

  local convs = S.convs
  local gen_of = convs.gen_of

  -- A conversation arriving at T: its record, then its first turn.
  local function arrive(conv, T)
    local c = { key = conv.key, skey = conv.key, gen = gen_of(conv), n = 0,
      free = T, prev_end = T,
      lock_until = T, had_box = false, lost = false }
    c.st = c
    if not per_call then
      c.stv = tag_mod.tag_value(conv.key, tv_opts)
      by_tv[c.stv] = c
    end
    next_turn(c)
  end

  -- The model's clock to T: the leases that ran out and the running counts
  -- that changed up to T booked.
  local function advance(T)
    if T > model.now then
      model.backend.t = T
      local lh = leases
      if lh.n > 0 and lh.t[1] <= T then settle(model, T) end
      model.now = T
    end
    local dh = deltas
    if dh.n > 0 and dh.k[1] <= T then drain_running(model, T) end
  end

  -- The end of the simulation at horizon: the model settled there, the
  -- loop's counters added to the books. → the time it ended
  local function finish(horizon)
    local h = math_max(horizon, model.now)
    model.backend.t = h
    settle(model, h)
    model.now = h
    drain_running(model, h)
    model.deltas = nil
    stats.requests, stats.runs = stats.requests + nreq, stats.runs + nruns
    events.connect = events.connect + nconnect
    report.runs, report.ok, report.warm_hits = report.runs + r_runs, report.ok + r_ok, report.warm_hits + r_warm_hits
    report.resumes, report.cold_starts = report.resumes + r_resumes, report.cold_starts + r_cold_starts
    report.turns = report.turns + r_turns
    report.prewarms, report.prewarms_unused, report.prewarms_failed = prewarms.done, prewarms.unused, prewarms.failed
    report.prewarm_requests = prewarms.requests
    report.prewarm_creates, report.prewarm_resumes = prewarms.created or 0, prewarms.resumed or 0
    return h
  end

  local ci = 1
  local gc_every = S.gc_every
  local next_gc = gc_every and t0 + gc_every or math_huge
  local horizon = nil
  local tail = S.tail
  while true do
    local top = heap_v[1]
    local tc = top and heap_t[1] or math_huge
    local conv = convs[ci]
    local ta = conv and t0 + conv.start or math_huge
    if tc == math_huge and ta == math_huge and not horizon then
      horizon = math_max(last_end + tail, model.now)
    end
    if horizon and next_gc > horizon then break end
    local T = tc
    if ta < T then T = ta end
    if next_gc < T then T = next_gc end
    advance(T)
    if T == next_gc then
      gc_pass(T)
      next_gc = next_gc + gc_every
    elseif T == ta then
      ci = ci + 1
      convs[ci - 1] = nil                     -- what is left of it lives in c
      arrive(conv, T)
    else
      heap_pop(heap)
      if top.phase == "prewarm" then
        play_prewarm(top, T)
        if top.runs then
          top.phase = "run"
          schedule(top, math_max(top.due, top.free))
        else
          next_turn(top)
        end
      else
        play_run(top, T)
        next_turn(top)
      end
    end
  end
  return finish(horizon or math_max(last_end + tail, model.now))
end

-- The Lua collector's pause while a simulation plays: the heap holds every
-- live sandbox's and conversation's record (270 MiB at 100,000
-- conversations), so a cycle starting when the heap is twice that (the
-- default, 200) traverses them again and again for little garbage; at 400 the
-- 1,000,000-run bench spends about 5 % less CPU time for 10 % more peak RSS.
_M.GC_PAUSE = 400

function _M.simulate(S)
  local pause = collectgarbage("setpause", _M.GC_PAUSE)
  local ok, h = pcall(simulate, S)
  collectgarbage("setpause", pause)
  if not ok then error(h, 0) end
  return h
end

return _M
