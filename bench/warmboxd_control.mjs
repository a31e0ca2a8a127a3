// Benchmark of warmboxd's control plane: create/s, then paging through
// 100,000 paused records with limit 100 (pages/s, items/s, and the time of a
// first page vs a last page, which must not grow with the total).
//
//   node bench/warmboxd_control.mjs [--records 100000] [--creates 2000] [--concurrency 8]
//
// Uses $WARMBOXD_BIN or build/warmboxd; HTTP with keep-alive (Node's fetch),
// so the figures are the server's, not a client's process start-up.
import { readFileSync } from 'node:fs'
import { api, key, opt, start } from './warmboxd.mjs'

const RECORDS = opt('records', 100_000)
const CREATES = opt('creates', 2000)
const CONC = opt('concurrency', 8)

const now = () => Number(process.hrtime.bigint()) / 1e9
const rss = (pid) => {
  const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+) kB/)
  return m ? Number(m[1]) / 1024 : NaN
}

async function main() {
  const { child, url } = await start()
  try {
    // ---- create/s ----
    const k1 = key()
    let next = 0
    const t0 = now()
    await Promise.all(Array.from({ length: CONC }, async () => {
      while (next < CREATES) {
        next++
        const r = await api(url, k1, 'POST', '/v2/sandboxes', { templateID: 'base', timeout: 3600, metadata: { b: 'x' } })
        if (r.status !== 201) throw new Error(`create: ${r.status} ${r.text}`)
      }
    }))
    const tc = now() - t0
    console.log(`create: ${CREATES} sandboxes, concurrency ${CONC}: ${(CREATES / tc).toFixed(0)} creates/s`)
    let seq = 0
    const t1 = now()
    while (now() - t1 < 1) {
      await api(url, k1, 'POST', '/v2/sandboxes', { templateID: 'base', timeout: 3600 })
      seq++
    }
    console.log(`create: sequential: ${(seq / (now() - t1)).toFixed(0)} creates/s`)

    // ---- seed and page ----
    const k2 = key()
    const ts = now()
    const seeded = await api(url, k2, 'POST', '/_warmboxd/seed', { count: RECORDS, state: 'paused', metadata: { app: 'bench' } })
    if (seeded.status !== 200) throw new Error(`seed: ${seeded.status} ${seeded.text}`)
    console.log(`seed: ${RECORDS} paused records in ${(now() - ts).toFixed(2)} s; server RSS ${rss(child.pid).toFixed(0)} MiB`)

    async function pageThrough(query) {
      let token
      let pages = 0
      let items = 0
      let firstMs = 0
      let lastMs = 0
      let lastToken
      const t = now()
      do {
        const q = query + (token ? `&nextToken=${encodeURIComponent(token)}` : '')
        const a = now()
        const r = await api(url, k2, 'GET', `/v2/sandboxes?${q}`)
        const ms = (now() - a) * 1000
        if (r.status !== 200) throw new Error(`list: ${r.status} ${r.text}`)
        if (pages === 0) firstMs = ms
        lastMs = ms
        pages++
        items += JSON.parse(r.text).length
        lastToken = token
        token = r.headers.get('x-next-token')
      } while (token)
      return { pages, items, secs: now() - t, firstMs, lastMs, lastToken }
    }

    for (const [name, q] of [['desc', 'limit=100'], ['asc', 'limit=100&order=asc'],
      ['metadata', 'limit=100&state=paused&metadata=' + encodeURIComponent('app=bench')]]) {
      const before = rss(child.pid)
      const r = await pageThrough(q)
      if (r.items !== RECORDS) throw new Error(`${name}: listed ${r.items} of ${RECORDS}`)
      console.log(`list ${name}: ${r.pages} pages, ${r.items} items in ${r.secs.toFixed(2)} s: ` +
        `${(r.pages / r.secs).toFixed(0)} pages/s, ${(r.items / r.secs).toFixed(0)} items/s; ` +
        `RSS ${before.toFixed(0)} -> ${rss(child.pid).toFixed(0)} MiB`)
      // first page vs last page, each timed 50 times (median)
      const time = async (qq) => {
        const v = []
        for (let i = 0; i < 50; i++) {
          const a = now()
          await api(url, k2, 'GET', `/v2/sandboxes?${qq}`)
          v.push((now() - a) * 1000)
        }
        v.sort((x, y) => x - y)
        return v[25]
      }
      const first = await time(q)
      const last = await time(q + `&nextToken=${encodeURIComponent(r.lastToken)}`)
      console.log(`list ${name}: first page ${first.toFixed(2)} ms, last page ${last.toFixed(2)} ms (median of 50)`)
    }
  } finally {
    child.kill('SIGTERM')
  }
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
