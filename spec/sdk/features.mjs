// SDK conformance of the E2B features warmboxd adds (one check
// per behaviour the official SDKs' own tests exercise), with the official
// `@e2b/code-interpreter` / `e2b` JS SDKs against warmboxd. Run by
// spec/integration/sdk_features_spec.lua with E2B_API_URL, E2B_SANDBOX_URL
// and E2B_API_KEY pointing at warmboxd.
//
// Prints one JSON object: {"results": {"<check>": {"ok": true} | {"ok": false,
// "error": "..."}}}, so each check is its own spec.
import { Sandbox } from '@e2b/code-interpreter'
import { check, eq, expect, fail, finish } from './harness.mjs'

const opts = { timeoutMs: 300_000, requestTimeoutMs: 60_000 }
let sbx
// A sandbox without `secure`: the SDK sends no access token on its context
// calls (listCodeContexts, createCodeContext), which warmboxd requires on a
// secure sandbox's port 49999 (HACKING: differences from E2B).
try {
  const res = await fetch(`${process.env.E2B_API_URL}/sandboxes`, {
    method: 'POST',
    headers: { 'X-API-Key': process.env.E2B_API_KEY, 'Content-Type': 'application/json' },
    body: JSON.stringify({ templateID: 'code-interpreter-v1', secure: false, timeout: 300 }),
  })
  if (res.status !== 201) throw new Error(`create: ${res.status} ${await res.text()}`)
  sbx = await Sandbox.connect((await res.json()).sandboxID, opts)
} catch (e) {
  fail('create', e)
}

if (sbx) {
  // ---------------------------------------------------------- JS / TS kernel
  await check('js: default contexts list javascript', async () => {
    const langs = (await sbx.listCodeContexts()).map((c) => c.language)
    expect(langs.includes('python'), `no python context in ${langs}`)
    expect(langs.includes('javascript'), `no javascript context in ${langs}`)
  })

  await check('js: console.log to stdout', async () => {
    const ex = await sbx.runCode('console.log("Hello World!")', { language: 'js' })
    eq(ex.logs.stdout, ['Hello World!\n'], 'logs.stdout')
    eq(ex.error, undefined, 'error')
  })

  await check('js: esm imports', async () => {
    const ex = await sbx.runCode("\n  import { readFileSync } from 'fs'\n  console.log(typeof readFileSync)\n",
      { language: 'js' })
    eq(ex.logs.stdout, ['function\n'], 'logs.stdout')
  })

  await check('js: top-level await result', async () => {
    const ex = await sbx.runCode("await Promise.resolve('Hello World!')", { language: 'js' })
    eq(ex.text, 'Hello World!', 'text')
  })

  await check('js: cwd and env vars', async () => {
    eq((await sbx.runCode('process.cwd()', { language: 'javascript' })).text, '/home/user', 'cwd')
    const ex = await sbx.runCode('process.env.FOO', { language: 'javascript', envs: { FOO: 'bar' } })
    eq(ex.results[0] && ex.results[0].text, 'bar', 'env for the run')
    const after = await sbx.runCode("process.env.FOO || 'default'", { language: 'javascript' })
    eq(after.text, 'default', 'env after the run')
  })

  await check('js: state and errors', async () => {
    await sbx.runCode('const kept = 41', { language: 'js' })
    eq((await sbx.runCode('kept + 1', { language: 'js' })).text, '42', 'state')
    const ex = await sbx.runCode("throw new RangeError('nope')", { language: 'js' })
    expect(ex.error, 'no error')
    eq(ex.error.name, 'RangeError', 'name')
    eq(ex.error.value, 'nope', 'value')
    expect(ex.error.traceback.includes('RangeError: nope'), `traceback: ${ex.error.traceback}`)
  })

  await check('ts: types are stripped', async () => {
    const ex = await sbx.runCode('const message: string = "Hello World!"; console.log(message)', { language: 'ts' })
    eq(ex.logs.stdout, ['Hello World!\n'], 'logs.stdout')
    eq((await sbx.runCode('process.cwd()', { language: 'ts' })).text, '/home/user', 'cwd')
  })

  await check('js: a created context', async () => {
    const ctx = await sbx.createCodeContext({ language: 'js', cwd: '/tmp' })
    eq(ctx.language, 'javascript', 'language')
    eq((await sbx.runCode('process.cwd()', { context: ctx })).text, '/tmp', 'cwd')
  })

  // ---------------------------------------------------------- gzip
  await check('files: gzip write and read', async () => {
    const text = 'gzip through the sdk\n'.repeat(300)
    const info = await sbx.files.write('/home/user/gz.txt', text, { gzip: true })
    eq(info.path, '/home/user/gz.txt', 'path')
    eq(await sbx.files.read('/home/user/gz.txt'), text, 'plain read')
    eq(await sbx.files.read('/home/user/gz.txt', { gzip: true }), text, 'gzip read')
  })

  // ---------------------------------------------------------- symlinkTarget
  await check('files: symlinkTarget is the resolved path', async () => {
    await sbx.commands.run('mkdir -p /home/user/ln && echo hi > /home/user/ln/t.txt && ln -sf t.txt /home/user/ln/rel')
    const info = await sbx.files.getInfo('/home/user/ln/rel')
    eq(info.symlinkTarget, '/home/user/ln/t.txt', 'symlinkTarget')
  })

  // ---------------------------------------------------------- kill under a command
  await check('commands: killing the sandbox reports it killed', async () => {
    const other = await Sandbox.create('base', opts)
    const running = other.commands.run('sleep 600').then(() => null, (e) => e)
    await new Promise((r) => setTimeout(r, 500))
    await other.kill()
    const err = await running
    expect(err, 'the command ended normally')
    expect(/killed/.test(err.message) && err.name === 'TimeoutError', `${err.name}: ${err.message}`)
  })

  // ---------------------------------------------------------- sudo
  await check('commands: sudo runs in the sandbox', async () => {
    const scoped = await sbx.commands.run('echo $FOO', { envs: { FOO: 'bar' } })
    eq(scoped.stdout.trim(), 'bar', 'scoped env')
    const cmd = await sbx.commands.run('sudo echo "$FOO"')
    eq(cmd.exitCode, 0, 'exit code')
    eq(cmd.stdout.trim(), '', 'the scoped env did not leak')
  })

  try {
    await sbx.kill()
  } catch (e) {
    fail('kill', e)
  }
}

finish()
