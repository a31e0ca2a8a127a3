// What every SDK conformance script shares: named checks whose outcomes are
// printed as one JSON line, {"results": {"<check>": {"ok": true, "ms": n} |
// {"ok": false, "error": "..."}}}, which spec/helpers/sdk.lua turns into one
// spec per check.
export const results = {}

// Runs one check; an exception is its failure.
export async function check (name, fn) {
  const t0 = Date.now()
  try {
    await fn()
    results[name] = { ok: true, ms: Date.now() - t0 }
  } catch (e) {
    results[name] = { ok: false, error: `${e && e.name}: ${e && e.message}`, ms: Date.now() - t0 }
  }
}

// Records a failure outside a check (the sandbox's create or kill).
export function fail (name, e) {
  results[name] = { ok: false, error: `${e && e.name}: ${e && e.message}` }
}

export function expect (cond, msg) {
  if (!cond) throw new Error(msg)
}

// JSON with object keys sorted: the order of keys is not a difference.
function canon (v) {
  if (Array.isArray(v)) return `[${v.map(canon).join(',')}]`
  if (v && typeof v === 'object') {
    return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canon(v[k])}`).join(',')}}`
  }
  return JSON.stringify(v)
}

export function eq (got, want, what) {
  const g = canon(got)
  const w = canon(want)
  if (g !== w) throw new Error(`${what}: expected ${w}, got ${g}`)
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

// Prints the results and exits now: a failed SDK call can leave its request
// timers pending for a minute.
export function finish () {
  process.stdout.write(JSON.stringify({ results }) + '\n', () => process.exit(0))
}
