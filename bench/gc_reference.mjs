// Baseline for bench/gc.lua: the reference implementation's GC sweep written
// with the official e2b JS SDK. Drains the paginator (every running and paused
// sandbox), keeps the ones whose tag is set and whose last activity (endAt, else
// startedAt) is older than the retention, then kills them all at once with
// Promise.all ("all") or one after another ("seq"). Prints one JSON line:
// {"mode", "listed", "matched", "killed", "failed", "list_s", "kill_s", "seconds", "max_rss_kb"}.
//   E2B_API_URL=http://127.0.0.1:PORT E2B_API_KEY=e2b_... node bench/gc_reference.mjs all|seq [retention_s] [tag]
import { dirname, resolve } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..')
// e2b 2.51.0 lives in spec/sdk/node_modules (npm ci in scripts/setup).
const { Sandbox } = await import(pathToFileURL(resolve(root, 'spec/sdk/node_modules/e2b/dist/index.mjs')).href)

const mode = process.argv[2] || 'all'
const retention = Number(process.argv[3] || 7 * 86400) * 1000
const tag = process.argv[4] || 'warmboxSessionId'
const t0 = performance.now()
const paginator = Sandbox.list({ limit: 100, query: { state: ['running', 'paused'] } })
const all = []
while (paginator.hasNext) {
  for (const s of await paginator.nextItems()) all.push(s)
}
const t1 = performance.now()
const now = Date.now()
const matches = all.filter((s) => {
  if (!s.metadata || !s.metadata[tag]) return false
  const last = new Date(s.endAt || s.startedAt).getTime()
  return now - last > retention
})
let killed = 0
let failed = 0
if (mode === 'seq') {
  for (const s of matches) {
    try {
      if (await Sandbox.kill(s.sandboxId)) killed++
    } catch {
      failed++
    }
  }
} else {
  const res = await Promise.allSettled(matches.map((s) => Sandbox.kill(s.sandboxId)))
  for (const r of res) {
    if (r.status === 'fulfilled' && r.value) killed++
    else failed++
  }
}
const t2 = performance.now()
console.log(JSON.stringify({
  mode, listed: all.length, matched: matches.length, killed, failed,
  list_s: (t1 - t0) / 1000, kill_s: (t2 - t1) / 1000, seconds: (t2 - t0) / 1000,
  max_rss_kb: process.resourceUsage().maxRSS,
}))
