// Does one team's big listing, or the lease timer, stall another team?
// Seeds N running records for team A (long leases), then measures team B's
// GET /sandboxes/{id} latency (p50 / p99 / max, ms) while:
//   idle      nothing else runs (only the lease timer, every 100 ms)
//   v2-scan   A pages GET /v2/sandboxes with a metadata filter nothing matches
//             (a full scan of A's records for one page), in a loop
//   v1-scan   A lists GET /sandboxes (unpaginated) with a filter nothing matches
//   v1-all    A lists GET /sandboxes with no filter (every running record)
//
//   node bench/warmboxd_stall.mjs [--records 1000000] [--seconds 3] [--v1-all-records 200000]
//
// Uses $WARMBOXD_BIN or build/warmboxd. Prints one line per case and the
// time of A's listing calls.
import { api, key, opt, start } from './warmboxd.mjs'

const RECORDS = opt('records', 1_000_000)
const SECONDS = opt('seconds', 3)
const V1_ALL = opt('v1-all-records', 200_000)

const now = () => Number(process.hrtime.bigint()) / 1e6

function pct (v, p) {
  const s = [...v].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(p / 100 * s.length) - 1))]
}

// Team B's latency while `load` (an async function looping until stop()) runs.
async function measure (url, kb, id, label, load) {
  let stop = false
  const calls = []
  const loader = load ? (async () => {
    while (!stop) {
      const t = now()
      await load()
      calls.push(now() - t)
    }
  })() : null
  await new Promise((resolve) => setTimeout(resolve, 100))
  const lat = []
  const end = now() + SECONDS * 1000
  while (now() < end) {
    const t = now()
    const r = await api(url, kb, 'GET', `/sandboxes/${id}`)
    if (r.status !== 200) throw new Error(`info: ${r.status} ${r.text}`)
    lat.push(now() - t)
  }
  stop = true
  if (loader) await loader
  const a = calls.length ? `; A's call ${pct(calls, 50).toFixed(0)} ms (${calls.length} calls)` : ''
  console.log(`${label.padEnd(8)} team B: p50 ${pct(lat, 50).toFixed(2)} ms, p99 ${pct(lat, 99).toFixed(2)} ms, ` +
    `max ${Math.max(...lat).toFixed(1)} ms (${lat.length} calls)${a}`)
}

async function main () {
  const { child, url } = await start()
  try {
    const ka = key()
    const kb = key()
    const t0 = now()
    const seeded = await api(url, ka, 'POST', '/_warmboxd/seed',
      { count: RECORDS, state: 'running', timeout: 86400, metadata: { app: 'bench' } })
    if (seeded.status !== 200) throw new Error(`seed: ${seeded.status} ${seeded.text}`)
    console.log(`seed: ${RECORDS} running records for team A in ${((now() - t0) / 1000).toFixed(1)} s`)
    const b = await api(url, kb, 'POST', '/sandboxes', { templateID: 'base', timeout: 3600 })
    if (b.status !== 201) throw new Error(`create: ${b.status} ${b.text}`)
    const id = JSON.parse(b.text).sandboxID
    const none = encodeURIComponent('app=none')

    await measure(url, kb, id, 'idle', null)
    await measure(url, kb, id, 'v2-scan', () => api(url, ka, 'GET', `/v2/sandboxes?metadata=${none}&limit=100`))
    await measure(url, kb, id, 'v1-scan', () => api(url, ka, 'GET', `/sandboxes?metadata=${none}`))
  } finally {
    child.kill('SIGTERM')
  }
  // The unfiltered v1 list builds one reply of every record: a smaller team.
  const { child: c2, url: u2 } = await start()
  try {
    const ka = key()
    const kb = key()
    const seeded = await api(u2, ka, 'POST', '/_warmboxd/seed', { count: V1_ALL, state: 'running', timeout: 86400 })
    if (seeded.status !== 200) throw new Error(`seed: ${seeded.status} ${seeded.text}`)
    const b = await api(u2, kb, 'POST', '/sandboxes', { templateID: 'base', timeout: 3600 })
    const id = JSON.parse(b.text).sandboxID
    console.log(`v1-all: team A has ${V1_ALL} running records`)
    await measure(u2, kb, id, 'v1-all', () => api(u2, ka, 'GET', '/sandboxes'))
  } finally {
    c2.kill('SIGTERM')
  }
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
