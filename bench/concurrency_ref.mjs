// The reference flow of bench/reference_flow.mjs (official SDKs: list ->
// re-check -> connect -> setTimeout -> reset output -> runCode -> list
// output), one async flow per conversation, all under Promise.all, for
// bench/concurrency.lua. Env: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY,
// BENCH_CONV, BENCH_RUNS. Prints one JSON line {start, end, times, rss_kb}
// (start/end in seconds of performance.now(); rss_kb: peak RSS).
import { createRequire } from 'node:module'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

const here = path.dirname(fileURLToPath(import.meta.url))
const require = createRequire(path.join(here, '..', 'spec', 'sdk', 'package.json'))
const { Sandbox } = require('@e2b/code-interpreter')

const CONV = Number(process.env.BENCH_CONV || 32)
const RUNS = Number(process.env.BENCH_RUNS || 5)
const TAG = 'twentySessionId'
const ALIVE_MS = 300_000
const OUT = '/home/user/output'
const CELL = "import time\ntime.sleep(0.5)\nn = globals().get('n', 0) + 1\nn"

async function getOrCreate (session) {
  const paginator = Sandbox.list({ query: { state: ['running', 'paused'], metadata: { [TAG]: session } } })
  const items = []
  while (paginator.hasNext) items.push(...(await paginator.nextItems()))
  for (const c of items.filter((i) => i.metadata && i.metadata[TAG] === session)) {
    let sb
    try { sb = await Sandbox.connect(c.sandboxId) } catch { continue }
    await sb.setTimeout(ALIVE_MS)
    return { sandbox: sb, isReused: true }
  }
  const sandbox = await Sandbox.create({ timeoutMs: ALIVE_MS, lifecycle: { onTimeout: 'pause', autoResume: true },
    metadata: { [TAG]: session } })
  return { sandbox, isReused: false }
}

async function execute (session, code) {
  const { sandbox, isReused } = await getOrCreate(session)
  if (isReused) {
    if (await sandbox.files.exists(OUT)) await sandbox.files.remove(OUT)
    await sandbox.files.makeDir(OUT)
  }
  const execution = await sandbox.runCode(code)
  if (execution.error) throw new Error(execution.error.value)
  try { await sandbox.files.list(OUT) } catch {}
  return sandbox
}

const sessions = Array.from({ length: CONV }, (_, i) => `bench-conc:js:${i + 1}`)
await Promise.all(sessions.map((s) => execute(s, 'n = 0')))
const times = []
let start = Infinity
let end = 0
await Promise.all(sessions.map(async (s) => {
  for (let i = 0; i < RUNS; i++) {
    const t0 = performance.now()
    await execute(s, CELL)
    const t1 = performance.now()
    times.push(t1 - t0)
    start = Math.min(start, t0)
    end = Math.max(end, t1)
  }
}))
await Promise.all(sessions.map(async (s) => { (await getOrCreate(s)).sandbox.kill() }))
console.log(JSON.stringify({ start: start / 1000, end: end / 1000, times, rss_kb: Math.round(process.resourceUsage().maxRSS) }))
