// Benchmark of warmboxd's envd processes with the official e2b JS SDK:
//   1. commands.run('true'): Start -> end latency;
//   2. commands.connect to a running process: attach -> start event;
//   3. pty.create -> first output (the shell's prompt), and -> `exit` done;
//   4. stdout throughput of one process through its Start stream (MB/s),
//      with warmboxd's peak RSS before and after.
//
//   node bench/warmboxd_process.mjs [--runs 30] [--mb 50]
//
// Uses $WARMBOXD_BIN or build/warmboxd, a scratch --data-dir, and the SDK
// pinned in spec/sdk/node_modules (scripts/setup installs it).
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { key, opt, start } from './warmboxd.mjs'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const { Sandbox } = await import(join(root, 'spec/sdk/node_modules/e2b/dist/index.mjs'))
const RUNS = opt('runs', 30)
const MB = opt('mb', 50)
const dir = mkdtempSync(join(tmpdir(), 'wbd-bench-'))

function stats(name, ms) {
  const s = [...ms].sort((a, b) => a - b)
  const q = (p) => s[Math.min(s.length - 1, Math.floor(p * s.length))]
  const mean = s.reduce((a, b) => a + b, 0) / s.length
  console.log(`${name}: mean ${mean.toFixed(1)} ms  p50 ${q(0.5).toFixed(1)} ms  p90 ${q(0.9).toFixed(1)} ms  (n=${s.length})`)
}

function hwmKb(pid) {
  const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmHWM:\s*(\d+)/)
  return m ? Number(m[1]) : 0
}

const { child, url } = await start(['--data-dir', join(dir, 'data')])
process.env.E2B_API_URL = url
process.env.E2B_SANDBOX_URL = url
process.env.E2B_DOMAIN = 'localhost'
process.env.E2B_API_KEY = key()
try {
  const sbx = await Sandbox.create('base', { timeoutMs: 600_000 })
  await sbx.commands.run('true')   // the sandbox's namespaces exist from here
  const now = () => performance.now()

  const run = []
  for (let i = 0; i < RUNS; i++) {
    const t = now()
    await sbx.commands.run('true')
    run.push(now() - t)
  }
  stats("commands.run('true')", run)

  const attach = []
  for (let i = 0; i < RUNS; i++) {
    const bg = await sbx.commands.run('sleep 30', { background: true })
    const t = now()
    await sbx.commands.connect(bg.pid)
    attach.push(now() - t)
    await bg.kill()
  }
  stats('commands.connect (attach)', attach)

  const first = []
  const done = []
  for (let i = 0; i < RUNS; i++) {
    const t = now()
    let seen
    const got = new Promise((r) => { seen = r })
    const term = await sbx.pty.create({ cols: 80, rows: 24, onData: () => seen() })
    await got
    first.push(now() - t)
    await sbx.pty.sendInput(term.pid, new TextEncoder().encode('exit\n'))
    await term.wait()
    done.push(now() - t)
  }
  stats('pty.create -> first output', first)
  stats('pty.create -> exit done', done)

  const before = hwmKb(child.pid)
  let bytes = 0
  const t = now()
  await sbx.commands.run(`head -c ${MB * 1000000} /dev/zero`, { onStdout: (d) => { bytes += d.length } })
  const secs = (now() - t) / 1000
  console.log(`stdout through a Start stream: ${(bytes / 1e6 / secs).toFixed(1)} MB/s (${(bytes / 1e6).toFixed(0)} MB in ${secs.toFixed(2)} s); warmboxd peak RSS ${(before / 1024).toFixed(1)} -> ${(hwmKb(child.pid) / 1024).toFixed(1)} MB`)
  await sbx.kill()
} finally {
  child.kill('SIGTERM')
  await new Promise((r) => child.on('exit', r))
  rmSync(dir, { recursive: true, force: true })
}
