// SDK conformance of warmboxd's Python kernel start-up: what the
// official @e2b/code-interpreter SDK's own tests expect of a DataFrame
// (`result.data`) and of images (png results from matplotlib and PIL), with
// the SDK against warmboxd. Run by spec/integration/sdk_interp_data_spec.lua
// with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY pointing at warmboxd.
//
// Prints one JSON object: {"results": {"<check>": {"ok": true} | {"ok": false,
// "error": "..."}}}, so each check is its own spec.
import { Sandbox } from '@e2b/code-interpreter'
import { check, eq, expect, fail, finish } from './harness.mjs'

const opts = { timeoutMs: 300_000, requestTimeoutMs: 60_000 }
let sbx
try {
  sbx = await Sandbox.create('code-interpreter-v1', opts)
} catch (e) {
  fail('create', e)
}

if (sbx) {
  await check('data: a DataFrame result has data', async () => {
    const ex = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2, 3]})')
    eq(ex.error, undefined, 'error')
    const r = ex.results[0]
    expect(r, 'no result')
    eq(r.data, { a: [1, 2, 3] }, 'data')
    expect(r.formats().includes('data'), `formats: ${r.formats()}`)
  })

  await check('images: a shown matplotlib figure is a png', async () => {
    const ex = await sbx.runCode(
      'import matplotlib.pyplot as plt\nimport numpy as np\nx = np.linspace(0, 20, 100)\nplt.plot(x, np.sin(x))\nplt.show()')
    const r = ex.results[0]
    expect(r && r.png, 'no png')
    expect(r.text, 'no text')
    eq(r.extra, {}, 'extra')
  })

  const pil = 'import numpy\nfrom PIL import Image\n' +
    "image = Image.fromarray((numpy.random.rand(16, 16, 3) * 255).astype('uint8')).convert('RGBA')\n"
  await check('images: a PIL image shown is a png', async () => {
    const ex = await sbx.runCode(pil + 'image.show()\nprint("done")')
    expect(ex.results[0] && ex.results[0].png, 'no png')
    eq(ex.logs.stdout, ['done\n'], 'stdout')
  })

  await check('images: a PIL image saved is a png', async () => {
    const ex = await sbx.runCode(pil + 'image.save("test.png")')
    expect(ex.results[0] && ex.results[0].png, 'no png')
    expect(await sbx.files.exists('/home/user/test.png'), 'the file was not written')
  })

  await check('images: a PIL image as the last expression is a png', async () => {
    const ex = await sbx.runCode(pil + 'image')
    expect(ex.results[0] && ex.results[0].png, 'no png')
  })

  try {
    await sbx.kill()
  } catch (e) {
    fail('kill', e)
  }
}

finish()
