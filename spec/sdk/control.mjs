// Conformance of warmboxd's control plane with the official E2B JS SDK (e2b
// 2.51.0). Run by spec/integration/sdk_control_spec.lua with E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY pointing at a warmboxd. Prints one line
// per check ("ok <name>" / "FAIL <name>: <why>") and exits 1 on any failure.
import { Sandbox } from 'e2b'

let failures = 0
function check(name, cond, detail) {
  if (cond) console.log(`ok ${name}`)
  else {
    failures++
    console.log(`FAIL ${name}: ${detail === undefined ? '' : JSON.stringify(detail)}`)
  }
}

async function listAll(query, limit) {
  const paginator = Sandbox.list({ query, limit })
  const items = []
  let pages = 0
  while (paginator.hasNext) {
    const page = await paginator.nextItems()
    pages++
    items.push(...page)
  }
  return { items, pages }
}

const run = `${Date.now()}-${Math.floor(Math.random() * 1e6)}`

async function main() {
  // create with metadata and the pause/auto-resume lifecycle
  const sbx = await Sandbox.create('base', {
    timeoutMs: 120_000,
    metadata: { run, role: 'main' },
    lifecycle: { onTimeout: 'pause', autoResume: true },
  })
  check('create gives an id', /^i[a-z0-9]{20}$/.test(sbx.sandboxId), sbx.sandboxId)

  // getInfo
  const info = await sbx.getInfo()
  check('getInfo state running', info.state === 'running', info.state)
  check('getInfo metadata', info.metadata.run === run && info.metadata.role === 'main', info.metadata)
  check('getInfo lifecycle', info.lifecycle && info.lifecycle.onTimeout === 'pause' && info.lifecycle.autoResume === true,
    info.lifecycle)
  check('getInfo dates', info.startedAt instanceof Date && info.endAt > info.startedAt, [info.startedAt, info.endAt])
  const lease = (info.endAt - info.startedAt) / 1000
  check('create timeout', Math.round(lease) === 120, lease)

  // setTimeout replaces the lease
  await sbx.setTimeout(600_000)
  const info2 = await sbx.getInfo()
  const left = (info2.endAt - Date.now()) / 1000
  check('setTimeout extends', left > 550 && left <= 601, left)

  // metadata values with awkward bytes, listed with a small limit
  const values = ['plain', 'with space', 'a&b', 'k=v', '100%', 'x+y', 'héllo ✓ 日本', '%2520', 'a+b c&d=e%f']
  const made = new Map()
  for (const v of values) {
    const s = await Sandbox.create('base', { timeoutMs: 120_000, metadata: { run, tag: v } })
    made.set(v, s.sandboxId)
  }
  // a near miss that a loose (prefix) match would return
  await Sandbox.create('base', { timeoutMs: 120_000, metadata: { run, tag: 'with space and more' } })

  for (const v of values) {
    const { items } = await listAll({ metadata: { run, tag: v }, state: ['running', 'paused'] }, 2)
    check(`list metadata ${JSON.stringify(v)}`, items.length === 1 && items[0].sandboxId === made.get(v),
      items.map((i) => [i.sandboxId, i.metadata.tag]))
  }

  const { items: all, pages } = await listAll({ metadata: { run }, state: ['running'] }, 3)
  const ids = new Set(all.map((i) => i.sandboxId))
  check('list pages with a small limit', all.length === values.length + 2 && ids.size === all.length && pages === 4,
    { n: all.length, pages })
  check('list items are running', all.every((i) => i.state === 'running'))

  // pause: true, then false when already paused
  const p1 = await sbx.pause()
  check('pause returns true', p1 === true, p1)
  const p2 = await sbx.pause()
  check('pause again returns false', p2 === false, p2)
  const pinfo = await Sandbox.getInfo(sbx.sandboxId)
  check('getInfo state paused', pinfo.state === 'paused', pinfo.state)

  const { items: paused } = await listAll({ metadata: { run }, state: ['paused'] }, 2)
  check('list state paused', paused.length === 1 && paused[0].sandboxId === sbx.sandboxId, paused.map((i) => i.sandboxId))
  check('paused endAt is the pause time', paused[0] && paused[0].endAt <= new Date(Date.now() + 1000),
    paused[0] && paused[0].endAt)
  const { items: running } = await listAll({ metadata: { run }, state: ['running'] }, 100)
  check('list state running excludes paused', !running.some((i) => i.sandboxId === sbx.sandboxId))

  // connect resumes a paused sandbox
  const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 300_000 })
  check('connect keeps the id', again.sandboxId === sbx.sandboxId, again.sandboxId)
  const rinfo = await again.getInfo()
  check('connect resumes', rinfo.state === 'running', rinfo.state)
  check('connect gives a new startedAt', rinfo.startedAt > info.startedAt, [rinfo.startedAt, info.startedAt])
  check('connect keeps metadata and lifecycle',
    rinfo.metadata.run === run && rinfo.lifecycle.onTimeout === 'pause' && rinfo.lifecycle.autoResume === true)

  // kill: true, then false
  const k1 = await again.kill()
  check('kill returns true', k1 === true, k1)
  const k2 = await Sandbox.kill(sbx.sandboxId)
  check('kill again returns false', k2 === false, k2)
  let notFound = false
  try {
    await Sandbox.getInfo(sbx.sandboxId)
  } catch (e) {
    notFound = e.name === 'SandboxNotFoundError' || /not found/i.test(String(e.message))
  }
  check('getInfo after kill is not found', notFound)
  let connectFails = false
  try {
    await Sandbox.connect(sbx.sandboxId)
  } catch (e) {
    connectFails = /not found/i.test(String(e.message))
  }
  check('connect after kill is not found', connectFails)

  // clean up the rest
  for (const item of all) await Sandbox.kill(item.sandboxId)
  const { items: left2 } = await listAll({ metadata: { run } }, 100)
  check('all killed', left2.length === 0, left2.length)
}

main().then(
  () => {
    console.log(failures ? `${failures} check(s) failed` : 'all checks passed')
    process.exit(failures ? 1 : 0)
  },
  (e) => {
    console.log(`FAIL exception: ${e && e.stack ? e.stack : e}`)
    process.exit(1)
  },
)
