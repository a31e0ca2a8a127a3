// SDK conformance of warmboxd's process RPCs: commands.connect,
// sendStdin, and the pty module (create, sendInput, resize, connect, kill),
// with the official `e2b` JS SDK against warmboxd, each check the behaviour
// one of the SDK's own tests exercises. Run by
// spec/integration/sdk_process_spec.lua with E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY pointing at warmboxd.
//
// Prints one JSON object: {"results": {"<check>": {"ok": true} | {"ok": false,
// "error": "..."}}}, so each check is its own spec.
import { Sandbox, CommandExitError } from 'e2b'
import { check, eq, expect, fail, finish, sleep } from './harness.mjs'

const enc = (s) => new Uint8Array(Buffer.from(s))
const opts = { timeoutMs: 300_000, requestTimeoutMs: 60_000 }
let sbx
try {
  sbx = await Sandbox.create('base', opts)
} catch (e) {
  fail('create', e)
}

if (sbx) {
  await check('commands: connect to a running process', async () => {
    const cmd = await sbx.commands.run('sleep 10', { background: true })
    const again = await sbx.commands.connect(cmd.pid)
    eq(again.pid, cmd.pid, 'pid')
    await cmd.kill()
  })

  await check('commands: connect streams the later output and the exit', async () => {
    const cmd = await sbx.commands.run('sleep 1; echo later; exit 3', { background: true })
    await cmd.disconnect()
    let out = ''
    const again = await sbx.commands.connect(cmd.pid, { onStdout: (d) => { out += d } })
    const err = await again.wait().then(() => null, (e) => e)
    expect(err instanceof CommandExitError, `wait: ${err}`)
    eq(err.exitCode, 3, 'exit code')
    eq(out, 'later\n', 'stdout after the reconnect')
  })

  await check('commands: connect to a missing process fails', async () => {
    const err = await sbx.commands.connect(999999).then(() => null, (e) => e)
    expect(err, 'connect resolved')
  })

  await check('commands: sendStdin reaches the process', async () => {
    const cmd = await sbx.commands.run('cat', { background: true, stdin: true })
    await sbx.commands.sendStdin(cmd.pid, 'Hello,\nWorld!')
    for (let i = 0; i < 20 && cmd.stdout !== 'Hello,\nWorld!'; i++) await sleep(100)
    eq(cmd.stdout, 'Hello,\nWorld!', 'stdout')
    await cmd.closeStdin()
    eq((await cmd.wait()).exitCode, 0, 'exit code after closeStdin')
  })

  await check('pty: create, sendInput, exit code and env', async () => {
    let output = ''
    const dec = new TextDecoder()
    const t = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { output += dec.decode(d) }, envs: { ABC: '123' } })
    await sbx.pty.sendInput(t.pid, enc('echo $ABC\nexit\n'))
    await t.wait()
    eq(t.exitCode, 0, 'exit code')
    expect(output.includes('123'), `output: ${JSON.stringify(output)}`)
  })

  await check('pty: resize', async () => {
    let output = ''
    const dec = new TextDecoder()
    const t = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { output += dec.decode(d) } })
    await sbx.pty.resize(t.pid, { cols: 100, rows: 24 })
    await sbx.pty.sendInput(t.pid, enc('tput cols\nexit\n'))
    await t.wait()
    eq(t.exitCode, 0, 'exit code')
    expect(/\b100\b/.test(output), `output: ${JSON.stringify(output)}`)
  })

  await check('pty: connect and reconnect', async () => {
    let out1 = ''
    let out2 = ''
    const dec = new TextDecoder()
    const t = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out1 += dec.decode(d) }, envs: { FOO: 'bar' } })
    await sbx.pty.sendInput(t.pid, enc('echo $FOO\n'))
    await sleep(300)
    await t.disconnect()
    const again = await sbx.pty.connect(t.pid, { onData: (d) => { out2 += dec.decode(d) } })
    await sbx.pty.sendInput(t.pid, enc('echo $FOO\nexit\n'))
    await again.wait()
    eq(again.pid, t.pid, 'pid')
    eq(again.exitCode, 0, 'exit code')
    expect(out1.includes('bar'), `first: ${JSON.stringify(out1)}`)
    expect(out2.includes('bar'), `second: ${JSON.stringify(out2)}`)
  })

  await check('pty: kill', async () => {
    const t = await sbx.pty.create({ cols: 80, rows: 24, onData: () => {} })
    eq(await sbx.pty.kill(t.pid), true, 'kill')
    eq(await sbx.pty.kill(999999), false, 'kill of a missing pty')
    // The kill is a signal: the pty leaves the list once its process is reaped
    // (as on E2B), which a slow machine (ASan) may take a while to do.
    const listed = async () => (await sbx.commands.list()).some((p) => p.pid === t.pid)
    for (let i = 0; i < 100 && (await listed()); i++) await sleep(100)
    expect(!(await listed()), 'the pty is still listed 10 s after its kill')
  })

  try {
    await sbx.kill()
  } catch (e) {
    fail('kill', e)
  }
}

finish()
