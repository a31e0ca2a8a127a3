// The reference flow (Twenty's E2B driver, twentyhq/twenty#21664) written with
// the official SDKs, one call per warm run:
//   list (all pages) -> exact re-check -> connect -> setTimeout -> reset output
//   (exists, remove, makeDir) -> runCode -> list output (+ read each file)
// Run by bench/session.lua against warmboxd (E2B_API_URL, E2B_SANDBOX_URL,
// E2B_API_KEY and WARMBOXD_ADMIN_TOKEN set). Prints one JSON line: {"runs", "p50_ms", "p95_ms", "requests_per_run", ...}.
import { createRequire } from 'node:module'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

const here = path.dirname(fileURLToPath(import.meta.url))
const require = createRequire(path.join(here, '..', 'spec', 'sdk', 'package.json'))
const { Sandbox } = require('@e2b/code-interpreter')

const RUNS = Number(process.env.BENCH_RUNS || 30)
const TAG = 'twentySessionId'
const SESSION = 'bench-workspace:thread-ref'
const TIMEOUT_MS = 300_000
const IDLE_MS = 300_000
const alive = Math.max(TIMEOUT_MS, IDLE_MS)
const OUT = '/home/user/output'
const apiUrl = process.env.E2B_API_URL

async function stats () {
  const r = await fetch(`${apiUrl}/_warmboxd/stats`, { headers: { 'X-Warmboxd-Token': process.env.WARMBOXD_ADMIN_TOKEN } })
  return r.json()
}

async function getOrCreate () {
  const paginator = Sandbox.list({ query: { state: ['running', 'paused'], metadata: { [TAG]: SESSION } } })
  const items = []
  while (paginator.hasNext) items.push(...(await paginator.nextItems()))
  const candidates = items.filter((i) => i.metadata && i.metadata[TAG] === SESSION)
  for (const c of candidates) {
    let sb
    try {
      sb = await Sandbox.connect(c.sandboxId)
    } catch { continue }
    try {
      await sb.setTimeout(alive)
    } catch {
      try { await sb.kill() } catch {}
      continue
    }
    await Promise.all(candidates.filter((o) => o.sandboxId !== c.sandboxId)
      .map((o) => Sandbox.kill(o.sandboxId).catch(() => {})))
    return { sandbox: sb, isReused: true }
  }
  const sandbox = await Sandbox.create({ timeoutMs: alive, lifecycle: { onTimeout: 'pause', autoResume: true },
    metadata: { [TAG]: SESSION } })
  return { sandbox, isReused: false }
}

async function execute (code) {
  const { sandbox, isReused } = await getOrCreate()
  if (isReused) {
    try {
      if (await sandbox.files.exists(OUT)) await sandbox.files.remove(OUT)
      await sandbox.files.makeDir(OUT)
    } catch (e) { console.error('warning: output reset failed', e.message) }
  }
  const stdout = []
  const execution = await sandbox.runCode(code, { onStdout: (m) => stdout.push(m.line ?? String(m)) })
  const files = []
  try {
    for (const e of await sandbox.files.list(OUT)) {
      if (e.type === 'file') files.push(await sandbox.files.read(e.path, { format: 'bytes' }))
    }
  } catch {}
  return { execution, files, stdout }
}

function pct (sorted, p) {
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]
}

await execute('x = 1') // cold start
await execute('x += 1') // warm-up
const s0 = await stats()
const times = []
for (let i = 0; i < RUNS; i++) {
  const t0 = performance.now()
  const { execution } = await execute('x += 1\nx')
  times.push(performance.now() - t0)
  if (execution.error) throw new Error(execution.error.value)
}
const s1 = await stats()
times.sort((a, b) => a - b)
const { sandbox } = await getOrCreate()
await sandbox.kill()
console.log(JSON.stringify({
  runs: RUNS,
  p50_ms: pct(times, 50),
  p95_ms: pct(times, 95),
  requests_per_run: (s1.total_requests - s0.total_requests) / RUNS,
  requests: s1.requests && s0.requests ? Object.fromEntries(Object.entries(s1.requests)
    .map(([k, v]) => [k, (v - (s0.requests[k] || 0)) / RUNS]).filter(([, v]) => v > 0)) : undefined,
}))
