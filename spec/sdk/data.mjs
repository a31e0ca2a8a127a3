// SDK conformance of warmboxd's data plane: the official `e2b` and
// `@e2b/code-interpreter` JS SDKs against warmboxd, on a sandbox created with
// `secure: true` (the SDK's default). Run by spec/integration/sdk_data_spec.lua
// with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY pointing at warmboxd.
//
// Prints one JSON object: {"results": {"<check>": {"ok": true} | {"ok": false,
// "error": "..."} | {"ok": true, "skipped": "why"}}}, so each check is its own
// spec and one failure does not hide the others.
import { Sandbox } from '@e2b/code-interpreter'
import { CommandExitError, FileType } from 'e2b'
import { check, eq, expect, fail, finish } from './harness.mjs'

let failedHard = false

const opts = { timeoutMs: 300_000, requestTimeoutMs: 60_000 }
let sbx

// Sandbox.create: e2b 2.51 no longer sends `secure` (POST /v2/sandboxes), so
// the server must make it secure by default, as E2B does.
await check('create', async () => {
  const created = await Sandbox.create('base', opts)
  try {
    expect(created.sandboxId, 'no sandbox id')
    expect(typeof created.envdAccessToken === 'string' && created.envdAccessToken.length > 0,
      'Sandbox.create gave a sandbox without an envd access token (not secure by default)')
    eq((await created.commands.run('echo ok')).stdout, 'ok\n', 'a command on it')
  } finally {
    await created.kill()
  }
})

// Every other check runs on a sandbox created with `secure: true`, attached
// through the SDK's Sandbox.connect.
await check('connect secure', async () => {
  const res = await fetch(`${process.env.E2B_API_URL}/sandboxes`, {
    method: 'POST',
    headers: { 'X-API-Key': process.env.E2B_API_KEY, 'Content-Type': 'application/json' },
    body: JSON.stringify({ templateID: 'base', secure: true, timeout: 300 }),
  })
  eq(res.status, 201, 'create status')
  const created = await res.json()
  expect(created.envdAccessToken, 'no envdAccessToken for secure: true')
  sbx = await Sandbox.connect(created.sandboxID, opts)
  eq(sbx.envdAccessToken, created.envdAccessToken, 'the SDK has the access token')
})
if (!sbx) failedHard = true

if (!failedHard) {
  await check('files.write', async () => {
    const info = await sbx.files.write('/home/user/sdk/hello.txt', 'hello from the sdk\n')
    eq(info.path, '/home/user/sdk/hello.txt', 'path')
    eq(info.name, 'hello.txt', 'name')
    eq(info.type, FileType.FILE, 'type')
    const many = await sbx.files.write([
      { path: 'sdk/a.txt', data: 'a' },
      { path: '/home/user/sdk/nested/b.txt', data: new Blob(['b']) },
    ])
    eq(many.map((e) => e.path), ['/home/user/sdk/a.txt', '/home/user/sdk/nested/b.txt'], 'paths of a multi-file write')
  })

  await check('files.read', async () => {
    eq(await sbx.files.read('/home/user/sdk/hello.txt'), 'hello from the sdk\n', 'text')
    eq(await sbx.files.read('sdk/a.txt'), 'a', 'relative path')
    const bytes = await sbx.files.read('sdk/nested/b.txt', { format: 'bytes' })
    eq(Array.from(bytes), [98], 'bytes')
    let err
    try {
      await sbx.files.read('sdk/missing.txt')
    } catch (e) {
      err = e
    }
    expect(err && err.name === 'FileNotFoundError', `missing file: expected FileNotFoundError, got ${err && err.name}`)
  })

  await check('files.list', async () => {
    const entries = await sbx.files.list('/home/user/sdk')
    eq(entries.map((e) => [e.name, e.type]).sort(),
      [['a.txt', 'file'], ['hello.txt', 'file'], ['nested', 'dir']], 'entries')
    const hello = entries.find((e) => e.name === 'hello.txt')
    eq(hello.size, 19, 'size')
    expect(hello.modifiedTime instanceof Date && !isNaN(hello.modifiedTime), 'modifiedTime is not a date')
    eq(hello.permissions, '-rw-r--r--', 'permissions')
    const deep = await sbx.files.list('/home/user/sdk', { depth: 2 })
    expect(deep.some((e) => e.path === '/home/user/sdk/nested/b.txt'), 'depth 2 does not reach nested/b.txt')
  })

  await check('files.exists', async () => {
    eq(await sbx.files.exists('/home/user/sdk/hello.txt'), true, 'existing file')
    eq(await sbx.files.exists('/home/user/sdk/nope.txt'), false, 'missing file')
  })

  await check('files.makeDir', async () => {
    eq(await sbx.files.makeDir('/home/user/sdk/made/deep'), true, 'new directory')
    eq(await sbx.files.makeDir('/home/user/sdk/made/deep'), false, 'existing directory')
    eq((await sbx.files.getInfo('/home/user/sdk/made/deep')).type, FileType.DIR, 'type')
  })

  await check('files.remove', async () => {
    await sbx.files.remove('/home/user/sdk/made')
    eq(await sbx.files.exists('/home/user/sdk/made'), false, 'removed')
    await sbx.files.remove('/home/user/sdk/made')   // missing: fine
  })

  await check('files.rename', async () => {
    const info = await sbx.files.rename('/home/user/sdk/a.txt', '/home/user/sdk/renamed.txt')
    eq(info.path, '/home/user/sdk/renamed.txt', 'path')
    eq(await sbx.files.read('/home/user/sdk/renamed.txt'), 'a', 'content')
  })

  await check('commands.run stdout', async () => {
    const r = await sbx.commands.run('echo "$GREETING from $(pwd)"; echo oops >&2', { envs: { GREETING: 'hi' } })
    eq(r.stdout, 'hi from /home/user\n', 'stdout')
    eq(r.stderr, 'oops\n', 'stderr')
    eq(r.exitCode, 0, 'exit code')
  })

  await check('commands.run cwd', async () => {
    const r = await sbx.commands.run('pwd', { cwd: '/home/user/sdk' })
    eq(r.stdout, '/home/user/sdk\n', 'stdout')
  })

  await check('commands.run failing', async () => {
    let err
    try {
      await sbx.commands.run('echo partial; exit 7')
    } catch (e) {
      err = e
    }
    expect(err instanceof CommandExitError, `expected CommandExitError, got ${err && err.name}: ${err && err.message}`)
    eq(err.exitCode, 7, 'exit code')
    eq(err.stdout, 'partial\n', 'stdout')
  })

  await check('commands.run timeout', async () => {
    let err
    try {
      await sbx.commands.run('sleep 30', { timeoutMs: 1000 })
    } catch (e) {
      err = e
    }
    expect(err && err.name === 'TimeoutError', `expected TimeoutError, got ${err && err.name}: ${err && err.message}`)
  })

  await check('commands.list and kill', async () => {
    const h = await sbx.commands.run('sleep 60', { background: true })
    const procs = await sbx.commands.list()
    expect(procs.some((p) => p.pid === h.pid), `pid ${h.pid} not listed`)
    eq(await sbx.commands.kill(h.pid), true, 'kill')
    eq(await sbx.commands.kill(999999), false, 'kill of an unknown pid')
  })

  await check('urls signed', async () => {
    const url = await sbx.downloadUrl('/home/user/sdk/hello.txt')
    const res = await fetch(url, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983' } })
    eq(res.status, 200, 'status')
    eq(await res.text(), 'hello from the sdk\n', 'body')
  })

  // ---- the code interpreter ----

  await check('runCode stdout', async () => {
    const chunks = []
    const ex = await sbx.runCode('print("hello"); print("world")', { onStdout: (m) => chunks.push(m.line) })
    eq(ex.logs.stdout.join(''), 'hello\nworld\n', 'logs.stdout')
    eq(chunks.join(''), 'hello\nworld\n', 'onStdout')
    eq(ex.error, undefined, 'error')
  })

  await check('runCode main result', async () => {
    const ex = await sbx.runCode('x = 40\nx + 2')
    eq(ex.text, '42', 'text')
    const main = ex.results.find((r) => r.isMainResult)
    expect(main, 'no main result')
  })

  await check('runCode error', async () => {
    const ex = await sbx.runCode('def f():\n    raise ValueError("boom")\nf()')
    expect(ex.error, 'no error')
    eq(ex.error.name, 'ValueError', 'name')
    eq(ex.error.value, 'boom', 'value')
    expect(ex.error.traceback.includes('ValueError'), 'traceback does not mention ValueError')
  })

  await check('runCode state survives pause and connect', async () => {
    await sbx.runCode('survivor = 41')
    await sbx.pause()
    const again = await Sandbox.connect(sbx.sandboxId, opts)
    const ex = await again.runCode('survivor + 1')
    eq(ex.text, '42', 'text')
    eq(await again.files.read('/home/user/sdk/hello.txt'), 'hello from the sdk\n', 'file after resume')
    sbx = again
  })

  await check('runCode png', async () => {
    const probe = await sbx.runCode('import importlib.util; importlib.util.find_spec("matplotlib") is not None')
    if (probe.text !== 'True') return { skipped: 'matplotlib is not installed' }
    const ex = await sbx.runCode(
      'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()')
    const png = ex.results.find((r) => r.png)
    expect(png, 'no PNG result')
    expect(Buffer.from(png.png, 'base64').subarray(1, 4).toString() === 'PNG', 'not a PNG')
  })

  try {
    await sbx.kill()
  } catch (e) {
    fail('kill', e)
  }
}

finish()
