// SDK conformance of the filesystem features warmboxd adds:
// file metadata, directory watching and signed file URLs, with the official
// `e2b` JS SDK against warmboxd (one check per behaviour the SDK's own tests
// exercise). Run by spec/integration/sdk_fs_features_spec.lua with
// E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY pointing at warmboxd.
//
// Prints one JSON object: {"results": {"<check>": {"ok": true} | {"ok": false,
// "error": "..."}}}, so each check is its own spec.
import { Sandbox, FileNotFoundError, FilesystemEventType, FileType, SandboxError } from 'e2b'
import { check, eq, expect, fail, finish } from './harness.mjs'

// Resolves with the first event `pred` accepts; rejects after `ms`.
function waitFor(ms) {
  let resolve
  const p = new Promise((res, rej) => {
    resolve = res
    setTimeout(() => rej(new Error(`no matching event in ${ms} ms`)), ms)
  })
  return { promise: p, resolve }
}

const opts = { timeoutMs: 300_000, requestTimeoutMs: 60_000 }
let sbx
try {
  sbx = await Sandbox.create('base', opts)   // secure: e2b 2.51 always secures
} catch (e) {
  fail('create', e)
}

if (sbx) {
  // ---------------------------------------------------------- metadata
  await check('metadata: write, then getInfo', async () => {
    const metadata = { author: 'mish', purpose: 'upload' }
    const info = await sbx.files.write('meta.txt', 'with metadata', { metadata })
    eq(info.metadata, metadata, 'write')
    eq((await sbx.files.getInfo('meta.txt')).metadata, metadata, 'getInfo')
  })

  await check('metadata: octet-stream upload', async () => {
    const metadata = { author: 'mish' }
    const info = await sbx.files.write('meta_octet.txt', 'x', { metadata, useOctetStream: true })
    eq(info.metadata, metadata, 'write')
    eq((await sbx.files.getInfo('meta_octet.txt')).metadata, metadata, 'getInfo')
  })

  await check('metadata: none when not given', async () => {
    const info = await sbx.files.write('meta_none.txt', 'x')
    eq(info.metadata, undefined, 'write')
    eq((await sbx.files.getInfo('meta_none.txt')).metadata, undefined, 'getInfo')
  })

  await check('metadata: writeFiles applies it to every file', async () => {
    const metadata = { source: 'suite' }
    const infos = await sbx.files.writeFiles([{ path: 'mm1.txt', data: '1' }, { path: 'mm2.txt', data: '2' }],
      { metadata })
    eq(infos.length, 2, 'files')
    for (const info of infos) {
      eq(info.metadata, metadata, info.path)
      eq((await sbx.files.getInfo(info.path)).metadata, metadata, `getInfo ${info.path}`)
    }
  })

  await check('metadata: list and rename surface it', async () => {
    await sbx.files.makeDir('meta_dir')
    await sbx.files.write('meta_dir/listed.txt', 'x', { metadata: { tag: 'listed' } })
    const entry = (await sbx.files.list('meta_dir')).find((e) => e.name === 'listed.txt')
    eq(entry && entry.metadata, { tag: 'listed' }, 'list')
    const moved = await sbx.files.rename('meta_dir/listed.txt', 'meta_dir/renamed.txt')
    eq(moved.metadata, { tag: 'listed' }, 'rename')
  })

  await check('metadata: an overwrite clears it', async () => {
    await sbx.files.write('meta_over.txt', 'first', { metadata: { author: 'mish' } })
    const info = await sbx.files.write('meta_over.txt', 'second')
    eq(info.metadata, undefined, 'write')
    eq((await sbx.files.getInfo('meta_over.txt')).metadata, undefined, 'getInfo')
  })

  await check('metadata: xattrs set in the sandbox are surfaced', async () => {
    await sbx.files.write('meta_x.txt', 'x')
    await sbx.commands.run(`python3 -c "import os; os.setxattr('/home/user/meta_x.txt', 'user.e2b.origin', b'cell')"`)
    eq((await sbx.files.getInfo('meta_x.txt')).metadata, { origin: 'cell' }, 'getInfo')
  })

  // ---------------------------------------------------------- watch
  await check('watch: a write in the directory', async () => {
    await sbx.files.makeDir('watch1')
    await sbx.files.write('watch1/f.txt', 'one')
    const got = waitFor(10_000)
    const handle = await sbx.files.watchDir('watch1', (e) => {
      if (e.type === FilesystemEventType.WRITE && e.name === 'f.txt') got.resolve()
    })
    try {
      await sbx.files.write('watch1/f.txt', 'two')
      await got.promise
    } finally {
      await handle.stop()
    }
  })

  await check('watch: recursive', async () => {
    await sbx.files.makeDir('watch2/nested')
    await sbx.files.write('watch2/nested/f.txt', 'one')
    const got = waitFor(10_000)
    const handle = await sbx.files.watchDir('watch2', (e) => {
      if (e.type === FilesystemEventType.WRITE && e.name === 'nested/f.txt') got.resolve()
    }, { recursive: true })
    try {
      await sbx.files.write('watch2/nested/f.txt', 'two')
      await got.promise
    } finally {
      await handle.stop()
    }
  })

  await check('watch: recursive after a nested folder is added', async () => {
    await sbx.files.makeDir('watch3')
    const folder = waitFor(10_000)
    const file = waitFor(10_000)
    const handle = await sbx.files.watchDir('watch3', (e) => {
      if (e.type === FilesystemEventType.CREATE && e.name === 'nested') folder.resolve()
      if (e.type === FilesystemEventType.WRITE && e.name === 'nested/f.txt') file.resolve()
    }, { recursive: true })
    try {
      await sbx.files.makeDir('watch3/nested')
      await folder.promise
      await sbx.files.write('watch3/nested/f.txt', 'x')
      await file.promise
    } finally {
      await handle.stop()
    }
  })

  await check('watch: entry info', async () => {
    await sbx.files.makeDir('watch4')
    await sbx.files.write('watch4/f.txt', 'one')
    const got = waitFor(10_000)
    const handle = await sbx.files.watchDir('watch4', (e) => {
      if (e.type === FilesystemEventType.WRITE && e.name === 'f.txt') got.resolve(e)
    }, { includeEntry: true })
    try {
      await sbx.files.write('watch4/f.txt', 'two')
      const ev = await got.promise
      expect(ev.entry, 'no entry')
      eq(ev.entry.name, 'f.txt', 'entry.name')
      eq(ev.entry.path, '/home/user/watch4/f.txt', 'entry.path')
      eq(ev.entry.type, FileType.FILE, 'entry.type')
    } finally {
      await handle.stop()
    }
  })

  await check('watch: network mounts allowed', async () => {
    await sbx.files.makeDir('watch5')
    const got = waitFor(10_000)
    const handle = await sbx.files.watchDir('watch5', (e) => {
      if (e.type === FilesystemEventType.WRITE && e.name === 'f.txt') got.resolve()
    }, { allowNetworkMounts: true })
    try {
      await sbx.files.write('watch5/f.txt', 'x')
      await got.promise
    } finally {
      await handle.stop()
    }
  })

  await check('watch: a missing directory is FileNotFoundError', async () => {
    let err
    try {
      const h = await sbx.files.watchDir('watch_missing', () => {})
      await h.stop()
    } catch (e) {
      err = e
    }
    expect(err instanceof FileNotFoundError, `got ${err && err.name}: ${err && err.message}`)
  })

  await check('watch: a file is a SandboxError', async () => {
    await sbx.files.write('watch_file.txt', 'x')
    let err
    try {
      const h = await sbx.files.watchDir('watch_file.txt', () => {})
      await h.stop()
    } catch (e) {
      err = e
    }
    expect(err instanceof SandboxError, `got ${err && err.name}: ${err && err.message}`)
  })

  // ---------------------------------------------------------- signed URLs
  await check('signing: download with a valid signature', async () => {
    await sbx.files.write('hello.txt', 'hello world')
    const res = await fetch(await sbx.downloadUrl('hello.txt', { useSignatureExpiration: 10_000 }))
    eq(res.status, 200, 'status')
    eq(await res.text(), 'hello world', 'body')
  })

  await check('signing: download as root', async () => {
    await sbx.files.write('hello_root.txt', 'hello root', { user: 'root' })
    const res = await fetch(await sbx.downloadUrl('hello_root.txt', { user: 'root', useSignatureExpiration: 10_000 }))
    eq(res.status, 200, 'status')
    eq(await res.text(), 'hello root', 'body')
  })

  await check('signing: an expired signature', async () => {
    const res = await fetch(await sbx.downloadUrl('hello.txt', { useSignatureExpiration: -10_000 }))
    eq(res.status, 401, 'status')
    eq(JSON.parse(await res.text()), { code: 401, message: 'signature is already expired' }, 'body')
  })

  await check('signing: upload with a valid signature', async () => {
    const form = new FormData()
    form.append('file', 'file content')
    const res = await fetch(await sbx.uploadUrl('up.txt', { useSignatureExpiration: 10_000 }),
      { method: 'POST', body: form })
    eq(res.status, 200, 'status')
    eq(JSON.parse(await res.text()), [{ name: 'up.txt', path: '/home/user/up.txt', type: 'file' }], 'body')
    eq(await sbx.files.read('up.txt'), 'file content', 'stored')
  })

  await check('signing: upload with an expired signature', async () => {
    const form = new FormData()
    form.append('file', 'file content')
    const res = await fetch(await sbx.uploadUrl('up2.txt', { useSignatureExpiration: -100_000 }),
      { method: 'POST', body: form })
    eq(res.status, 401, 'status')
    eq(JSON.parse(await res.text()), { code: 401, message: 'signature is already expired' }, 'body')
  })

  // ------------------------------------------------ the whole filesystem
  await check('paths: upload as root lands in /root', async () => {
    const form = new FormData()
    form.append('file', 'root content')
    const res = await fetch(await sbx.uploadUrl('hello.txt', { user: 'root', useSignatureExpiration: 10_000 }),
      { method: 'POST', body: form })
    eq(res.status, 200, 'status')
    eq(JSON.parse(await res.text()), [{ name: 'hello.txt', path: '/root/hello.txt', type: 'file' }], 'body')
    eq(await sbx.files.read('/root/hello.txt'), 'root content', 'stored')
  })

  await check('paths: outside /home/user and /tmp, seen by commands', async () => {
    // as E2B's write test: envd (root there) makes the directories, for the default user too
    const infos = await sbx.files.write([{ path: '/0/multi.txt', data: 'zero' }, { path: '/opt/app/config.json', data: '{"a":1}' }])
    eq(infos.map((i) => i.path), ['/0/multi.txt', '/opt/app/config.json'], 'paths')
    eq(await sbx.files.read('/0/multi.txt'), 'zero', 'read back')
    const r = await sbx.commands.run('cat /opt/app/config.json')
    eq(r.stdout, '{"a":1}', 'cat')
    await sbx.commands.run('mkdir -p /root/out && echo made > /root/out/f')
    eq(await sbx.files.read('/root/out/f'), 'made\n', 'read')
    const names = (await sbx.files.list('/')).map((e) => e.name)
    for (const n of ['etc', 'home', 'opt', 'root', 'tmp', 'usr']) expect(names.includes(n), `/ lists ${n}: ${names}`)
    expect(await sbx.files.exists('/usr/bin/env'), '/usr/bin/env exists')
    eq(await sbx.files.read('/etc/passwd'), (await sbx.commands.run('cat /etc/passwd')).stdout, '/etc/passwd')
  })

  await check('paths: the read-only system is refused, not written', async () => {
    let err
    try {
      await sbx.files.write('/usr/bin/warmbox-evil', 'x')
    } catch (e) {
      err = e
    }
    expect(err, 'a write to /usr is refused')
    expect(!(await sbx.files.exists('/usr/bin/warmbox-evil')), 'nothing written')
  })

  try {
    await sbx.kill()
  } catch (e) {
    fail('kill', e)
  }
}

finish()
