// What the node benchmarks share: starting a warmboxd ($WARMBOXD_BIN or
// build/warmboxd) on a free loopback port with an admin token, a fresh team
// key, their command-line options, and a request with both.
import { spawn } from 'node:child_process'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { randomBytes } from 'node:crypto'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
export const bin = process.env.WARMBOXD_BIN || join(root, 'build', 'warmboxd')
export const ADMIN = randomBytes(24).toString('hex') // the admin API's token (--admin-token)

// `--name N` from the command line as a number, or `dflt`.
export function opt (name, dflt) {
  const args = process.argv.slice(2)
  const i = args.indexOf(`--${name}`)
  return i >= 0 ? Number(args[i + 1]) : dflt
}

// Starts warmboxd with `extra` flags; resolves to { child, url } once it listens.
export function start (extra = []) {
  return new Promise((resolve, reject) => {
    const child = spawn(bin, ['--port', '0', '--admin-token', ADMIN, ...extra], { stdio: ['ignore', 'pipe', 'inherit'] })
    let buf = ''
    child.stdout.on('data', (d) => {
      buf += d
      const m = buf.match(/warmboxd listening on (http:\/\/[\d.]+:\d+)/)
      if (m) resolve({ child, url: m[1] })
    })
    child.on('exit', (code) => reject(new Error(`warmboxd exited with ${code}`)))
  })
}

export const key = () => 'e2b_' + randomBytes(20).toString('hex')

// A request as team `k` (admin token included); resolves to { status, headers, text }.
export async function api (url, k, method, path, body) {
  const res = await fetch(url + path, {
    method,
    headers: { 'X-API-Key': k, 'Content-Type': 'application/json', 'X-Warmboxd-Token': ADMIN },
    body: body === undefined ? undefined : JSON.stringify(body)
  })
  const text = await res.text()
  return { status: res.status, headers: res.headers, text }
}
