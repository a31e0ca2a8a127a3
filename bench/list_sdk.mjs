// Baseline for bench/core_http.lua: lists every sandbox of a team with the
// official e2b JS SDK's paginator (Sandbox.list(...).nextItems()), against
// E2B_API_URL/E2B_API_KEY, and prints one JSON line: {"items", "pages", "seconds"}.
//   E2B_API_URL=http://127.0.0.1:PORT E2B_API_KEY=e2b_... node bench/list_sdk.mjs [limit] [state]
import { dirname, resolve } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..')
// e2b 2.51.0 lives in spec/sdk/node_modules (npm ci in scripts/setup).
const { Sandbox } = await import(pathToFileURL(resolve(root, 'spec/sdk/node_modules/e2b/dist/index.mjs')).href)

const limit = Number(process.argv[2] || 100)
const state = process.argv[3] || 'paused'
const t0 = process.hrtime.bigint()
const paginator = Sandbox.list({ limit, query: { state: [state] } })
let items = 0
let pages = 0
while (paginator.hasNext) {
  const page = await paginator.nextItems()
  items += page.length
  pages += 1
}
const seconds = Number(process.hrtime.bigint() - t0) / 1e9
console.log(JSON.stringify({ items, pages, seconds }))
