--- `warmbox gc`: garbage-collect tagged sandboxes under the GC policy, page
-- by page, its actions streamed (or one JSON report with --json).
local ipairs, type, tostring, pcall = ipairs, type, tostring, pcall
local string_format = string.format

local args_ = require "warmbox.cli.args"
local common = require "warmbox.cli.common"

local parse_args, duration_arg, int_arg = args_.parse_args, args_.duration_arg, args_.int_arg
local fail, FAILED = common.fail, common.FAILED

local _M = {}

-- Whether the CLI's stderr is a terminal (io_.isatty overrides, for specs).
local function stderr_tty(io_)
  if io_.isatty ~= nil then
    if type(io_.isatty) == "function" then return io_.isatty() end
    return io_.isatty
  end
  if io_.stderr ~= io.stderr then return false end
  return os.execute("[ -t 2 ]") == true
end

-- The end of `warmbox gc`'s output: the JSON report's summary (closing the
-- actions array `first` says is empty or not) or the one-line summary.
-- `failure` is the pass's own error, when it did not finish.
local function write_gc_report(out, r, as_json, failure, first)
  if as_json then
    local json = require "warmbox.json"
    local summary = {}
    if r then
      for _, k in ipairs({ "listed", "tagged", "orphans", "kept", "killed", "demoted", "busy", "skipped", "failed",
        "pages", "budget_kept", "dry_run" }) do
        summary[k] = r[k]
      end
      summary.next_token = r.resume_token or r.next_token or json.null
      summary.errors = #r.errors > 0 and r.errors or nil
      summary.checkpoints = r.checkpoints
    end
    if failure then summary.error = { message = failure.message, code = failure.code or json.null } end
    local s = json.encode(summary)
    out:write(first and "" or "\n", "],", s:sub(2), "\n")
  elseif r then
    local resume = r.resume_token or r.next_token
    local killed, demoted = "killed", "demoted"
    if r.dry_run then killed, demoted = "would kill", "would demote" end
    out:write(string_format("%slisted %d, tagged %d, kept %d, %s %d, %s %d, busy %d, skipped %d, "
      .. "errors %d%s\n", r.dry_run and "dry run: " or "", r.listed, r.tagged, r.kept, killed, r.killed, demoted,
      r.demoted, r.busy, r.skipped, r.failed, resume and (", resume with --next-token " .. resume) or ""))
    local c = r.checkpoints
    if c then
      out:write(string_format("%scheckpoints: listed %d, kept %d, %s %d, busy %d, errors %d\n",
        r.dry_run and "dry run: " or "", c.checkpoints, c.kept, r.dry_run and "would delete" or "deleted", c.deleted,
        c.busy, c.failed))
    end
  end
end

--- The command: status 0, 1 (an action failed) or 2.
function _M.execute(o, args, io_)
  local opts = { actions = false }
  local as_json, policy_file = false, nil
  local function max_age(v, a) opts.max_age = duration_arg(a, v) end
  local function dry_run() opts.dry_run = true end
  parse_args(args, "gc", {
    ["--dry-run"] = { dry_run }, ["-n"] = { dry_run },
    ["--json"] = { function() as_json = true end },
    ["--policy"] = function(v) policy_file = v end,
    ["--retention"] = max_age, ["--max-age"] = max_age,
    ["--max-kills"] = function(v, a) opts.max_kills = int_arg(a, v, 1) end,
    ["--concurrency"] = function(v, a) opts.concurrency = int_arg(a, v, 1) end,
    ["--next-token"] = function(v) opts.next_token = v end,
    ["--pages"] = function(v, a) opts.pages = int_arg(a, v, 1) end,
  })
  if policy_file then opts.policy = policy_file end
  local out, err = io_.stdout, io_.stderr
  local json = require "warmbox.json"
  local core = require "warmbox.core"
  local tty = stderr_tty(io_)
  local first = true
  if as_json then out:write('{"actions":[') end
  opts.on_checkpoint = function(a)
    if a.action == "keep" then return end
    if as_json then
      out:write(first and "\n" or ",\n", json.encode({ action = a.action, checkpoint_id = a.checkpoint_id,
        turn = a.turn, reason = a.reason or json.null, code = a.code or json.null }))
    else
      local action = opts.dry_run and a.action == "delete" and "would delete" or a.action
      out:write(string_format("  %-7s %-40s %s\n", action, tostring(a.checkpoint_id), tostring(a.reason or "")))
    end
    first = false
  end
  opts.on_action = function(a)
    if a.action == "keep" then return end
    if as_json then
      out:write(first and "\n" or ",\n", json.encode({ action = a.action, sandbox_id = a.sandbox_id,
        session = a.key or json.null, tenant = a.tenant or json.null, tag_value = a.session,
        reason = a.reason or json.null, code = a.code or json.null, failed = a.failed or json.null }))
    else
      local action = opts.dry_run and (a.action == "kill" or a.action == "demote") and "would " .. a.action
        or a.action
      out:write(string_format("  %-7s %-24s %-30s %s\n", action, tostring(a.sandbox_id),
        tostring(a.key or ("(tag) " .. tostring(a.session))), tostring(a.reason or "")))
    end
    first = false
  end
  local t0, last_draw = core.now(), 0
  local function progress(rep, final)
    local now = core.now()
    if not final and now - last_draw < 0.2 then return end
    last_draw = now
    local done = rep.killed + rep.demoted + rep.skipped + rep.busy + rep.failed
    local decided = rep.kept + done + (rep.queued or 0)
    local rate = rep.listed / math.max(now - t0, 1e-3)
    local act_rate = done / math.max(now - t0, 1e-3)
    local eta = (rep.queued or 0) > 0 and act_rate > 0 and string_format("%.0fs", rep.queued / act_rate) or "-"
    err:write(string_format("\r\27[Kgc: %d pages, %d listed, %d decided, %d done (%d killed), %.0f/s, eta %s%s",
      rep.pages, rep.listed, decided, done, rep.killed, rate, eta, final and "\n" or ""))
    err:flush()
  end
  local resume -- where an interrupted pass resumes
  opts.on_page = function(p)
    resume = p.resume_token
    if tty then
      p.report.queued = p.queued
      progress(p.report)
    end
  end
  local wb = common.new_warmbox(o, io_)
  if not wb then
    if as_json then out:write("]}\n") end
    return FAILED
  end
  local ok, rep, msg, code, partial = pcall(wb.gc, wb, opts)
  wb:close()
  if not ok then -- interrupted (^C) or a raising policy file
    if as_json then out:write("]}\n") end
    if tty then err:write("\n") end
    err:write(string_format("warmbox: %s; %s\n", tostring(rep),
      resume and ("resume with --next-token " .. resume) or "nothing to skip: run it again"))
    return FAILED
  end
  local r = rep or partial
  if tty and r then
    r.queued = 0
    progress(r, true)
  end
  write_gc_report(out, r, as_json, not rep and { message = tostring(msg), code = code } or nil, first)
  if not rep then return fail(err, msg, code) end
  if rep.failed > 0 then
    for _, e in ipairs(rep.errors) do
      err:write(string_format("warmbox: %s %s failed: %s (%s)\n", tostring(e.action), tostring(e.sandbox_id),
        tostring(e.message), tostring(e.code)))
    end
    return 1
  end
  return 0
end

return _M
