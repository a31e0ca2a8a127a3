// warmboxd's JavaScript / TypeScript kernel: one persistent Node.js realm per
// code-interpreter context.
//
// Started by interp.c inside the sandbox's jail as
//   /bin/sh -c 'exec /usr/bin/node -e "$0" "$1" 3<&0 4>&1 </dev/null >&2' <this file> javascript|typescript
// so fd 3 carries requests from warmboxd and fd 4 carries events back, with
// the same protocol as kernel.py:
//   {"op": "exec", "code": "...", "env": {"K": "V"}}   run a cell
//   {"op": "interrupt"}                                  interrupt the running cell
// answered by the /execute NDJSON lines, then {"type": "__wb_done__"}.
// fds 0-2 are /dev/null: console output is sent as events by the kernel itself.
//
// A cell is rewritten with the TypeScript compiler's parser (Debian's
// node-typescript) so that it can run as the body of an async function (top-
// level await) while its declarations stay in the realm for later cells:
// top-level let/const/var become assignments to globals, classes become class
// expressions assigned to globals, functions are copied to globals, ES imports
// become require() calls, and a last expression statement is returned: its
// value is the cell's main result. TypeScript is first transpiled to JS.
(() => {
  'use strict';
  const fs = require('fs');
  const util = require('util');
  const vm = require('vm');
  const { Worker } = require('worker_threads');

  const CTL = 3;
  const EVT = 4;
  const LANG = process.argv[1] === 'typescript' ? 'typescript' : 'javascript';

  let ts = null;
  for (const p of ['typescript', '/usr/share/nodejs/typescript', '/usr/lib/nodejs/typescript']) {
    try {
      ts = require(p);
      break;
    } catch (e) { /* next */ }
  }

  function emit(obj) {
    // Spaced as Python's json.dumps: interp.c recognises '{"type": "error"'
    // and the done line by their exact text.
    const text = Object.entries(obj).map(([k, v]) => `${JSON.stringify(k)}: ${JSON.stringify(v)}`).join(', ');
    const buf = Buffer.from(`{${text}}\n`, 'utf8');
    let off = 0;
    while (off < buf.length) {
      try {
        off += fs.writeSync(EVT, buf, off, buf.length - off);
      } catch (e) {
        if (e.code === 'EAGAIN' || e.code === 'EINTR') continue;
        process.exit(0);   // warmboxd went away
      }
    }
  }

  const now = () => new Date().toISOString();

  // ------------------------------------------------------------ output
  let active = false;   // a cell is running: output is forwarded
  let errorSent = false;

  // A long write goes out as several lines of at most TEXT_CHUNK UTF-16 units
  // (never splitting a surrogate pair), well under warmboxd's longest line.
  const TEXT_CHUNK = 262144;
  function out(name, chunk) {
    if (!active) return;
    const text = typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8');
    for (let i = 0; i < text.length;) {
      let j = Math.min(i + TEXT_CHUNK, text.length);
      const c = text.charCodeAt(j - 1);
      if (j < text.length && c >= 0xd800 && c <= 0xdbff) j--;
      emit({ type: name, text: text.slice(i, j), timestamp: now() });
      i = j;
    }
  }

  const sink = (name) => ({
    write(chunk, enc, cb) {
      out(name, chunk);
      if (typeof enc === 'function') enc();
      else if (typeof cb === 'function') cb();
      return true;
    },
  });
  process.stdout.write = sink('stdout').write;
  process.stderr.write = sink('stderr').write;
  globalThis.console = new console.Console({ stdout: process.stdout, stderr: process.stderr });

  // Bytes of JSON a result or an error line may take: well under warmboxd's
  // longest kernel line kept (16 MiB) and the client's frame limit. A larger
  // one keeps its text cut to fit and says "truncated": true.
  const RESULT_MAX = 8 << 20;
  const jsonLen = (v) => Buffer.byteLength(JSON.stringify(v), 'utf8');
  function cutText(text, room) {
    let n = text.length;
    let size = jsonLen(text);
    while (size > room && n > 0) {
      // escapes make some characters longer: shrink in proportion, a little more
      n = Math.min(n - 1, Math.floor(n * room / size * 0.99));
      const c = n > 0 ? text.charCodeAt(n - 1) : 0;
      if (c >= 0xd800 && c <= 0xdbff) n--;
      size = jsonLen(text.slice(0, n));
    }
    return text.slice(0, n);
  }
  function fit(obj) {
    if (jsonLen(obj) <= RESULT_MAX) return obj;
    let room = RESULT_MAX - 256;
    const out = {};
    for (const [k, v] of Object.entries(obj)) {
      if (typeof v === 'string' && k !== 'type' && k !== 'name') {
        out[k] = cutText(v, Math.max(0, room - k.length - 4));
        room -= jsonLen(out[k]) + k.length + 4;
      } else {
        out[k] = v;
      }
    }
    out.truncated = true;
    return out;
  }

  function errorLine(name, value, traceback) {
    if (errorSent) return;
    errorSent = true;
    emit(fit({ type: 'error', name, value, traceback }));
  }

  // The stack down to the cell's own frames (not the kernel's).
  function cellStack(stack) {
    const lines = stack.split('\n');
    const i = lines.findIndex((l) => /\(node:vm:|\[eval\]|sigintHandlersWrap/.test(l));
    return (i < 0 ? lines : lines.slice(0, i)).join('\n');
  }

  function sendError(e) {
    if (e instanceof Error || (e && typeof e === 'object' && 'message' in e)) {
      errorLine(String(e.name || 'Error'), String(e.message), cellStack(String(e.stack || '')));
    } else {
      errorLine('Error', util.inspect(e), '');
    }
  }

  // ------------------------------------------------------------ rewriting
  class CellSyntaxError extends Error {}

  function lineCol(sf, pos) {
    const lc = sf.getLineAndCharacterOfPosition(pos);
    return `${lc.line + 1}:${lc.character + 1}`;
  }

  function importText(sf, node) {
    const mod = node.moduleSpecifier.getText(sf);
    const req = `require(${mod})`;
    const cl = node.importClause;
    if (!cl) return `${req};`;
    if (cl.isTypeOnly) return '';
    const parts = [];
    const tmp = `__wb_mod_${node.pos}`;
    parts.push(`globalThis.${tmp} = ${req};`);
    if (cl.name) parts.push(`${cl.name.text} = (${tmp} && ${tmp}.__esModule ? ${tmp}.default : ${tmp});`);
    const nb = cl.namedBindings;
    if (nb && ts.isNamespaceImport(nb)) parts.push(`${nb.name.text} = ${tmp};`);
    if (nb && ts.isNamedImports(nb)) {
      for (const el of nb.elements) {
        if (el.isTypeOnly) continue;
        const from = (el.propertyName || el.name).text;
        parts.push(`${el.name.text} = ${tmp}[${JSON.stringify(from)}];`);
      }
    }
    parts.push(`delete globalThis.${tmp};`);
    return parts.join(' ');
  }

  function rewrite(code) {
    if (!ts) throw new Error('the typescript package is not installed (Debian: node-typescript)');
    let src = code;
    if (LANG === 'typescript') {
      const r = ts.transpileModule(code, {
        compilerOptions: {
          target: ts.ScriptTarget.ES2022,
          module: ts.ModuleKind.ESNext,
          isolatedModules: true,
          preserveValueImports: true,
          sourceMap: false,
        },
        reportDiagnostics: true,
      });
      const d = (r.diagnostics || []).find((x) => x.category === ts.DiagnosticCategory.Error);
      if (d) {
        const where = d.file && d.start !== undefined ? ` (${lineCol(d.file, d.start)})` : '';
        throw new CellSyntaxError(ts.flattenDiagnosticMessageText(d.messageText, '\n') + where);
      }
      src = r.outputText;
    }
    const sf = ts.createSourceFile('cell.js', src, ts.ScriptTarget.ES2022, true, ts.ScriptKind.JS);
    const diags = sf.parseDiagnostics || [];
    if (diags.length) {
      const d = diags[0];
      throw new CellSyntaxError(`${ts.flattenDiagnosticMessageText(d.messageText, '\n')} (${lineCol(sf, d.start)})`);
    }
    const head = [];
    const body = [];
    let pos = 0;
    const stmts = sf.statements;
    const K = ts.SyntaxKind;
    for (let i = 0; i < stmts.length; i++) {
      const st = stmts[i];
      const start = st.getStart(sf);
      body.push(src.slice(pos, start));
      pos = st.end;
      const text = src.slice(start, st.end);
      const mods = ts.canHaveModifiers && ts.canHaveModifiers(st) ? (ts.getModifiers(st) || []) : (st.modifiers || []);
      const isDeclare = mods.some((m) => m.kind === K.DeclareKeyword);
      if (isDeclare) continue;
      if (ts.isImportDeclaration(st)) {
        body.push(importText(sf, st));
      } else if (ts.isVariableStatement(st)) {
        const isVar = !(st.declarationList.flags & (ts.NodeFlags.Let | ts.NodeFlags.Const));
        const parts = [];
        for (const d of st.declarationList.declarations) {
          const name = d.name.getText(sf);
          if (d.initializer) parts.push(`(${name} = ${d.initializer.getText(sf)});`);
          else if (ts.isIdentifier(d.name)) parts.push(isVar ? `globalThis.${name} = globalThis.${name};` : `(${name} = undefined);`);
        }
        body.push(parts.join(' '));
      } else if (ts.isClassDeclaration(st) && st.name) {
        const t = mods.length ? src.slice(mods[mods.length - 1].end, st.end).trimStart() : text;
        body.push(`${st.name.text} = ${t};`);
      } else if (ts.isFunctionDeclaration(st) && st.name) {
        const t = mods.some((m) => m.kind === K.ExportKeyword) ? src.slice(mods[mods.length - 1].end, st.end) : text;
        head.push(`globalThis.${st.name.text} = ${st.name.text};`);
        body.push(t);
      } else if (i === stmts.length - 1 && ts.isExpressionStatement(st)) {
        body.push(`return (${st.expression.getText(sf)});`);
      } else if (ts.isExpressionStatement(st) && ts.isStringLiteral(st.expression) && st.expression.text === 'use strict') {
        body.push('');
      } else {
        body.push(text);
      }
    }
    body.push(src.slice(pos));
    // One line for the wrapper's head: line numbers of the cell stay right.
    return `(async () => { ${head.join(' ')}\n${body.join('')}\n})()`;
  }

  // ------------------------------------------------------------ running
  let count = 1;
  let interruptCell = null;   // rejects the running cell's await

  function withEnv(env) {
    const saved = new Map();
    for (const [k, v] of Object.entries(env || {})) {
      if (!k || k.includes('=') || k.includes('\0')) continue;
      saved.set(k, Object.prototype.hasOwnProperty.call(process.env, k) ? process.env[k] : undefined);
      process.env[k] = String(v);
    }
    return saved;
  }

  function restoreEnv(saved) {
    for (const [k, v] of saved) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }

  function resultText(v) {
    if (typeof v === 'string') return v;
    return util.inspect(v, { depth: 4, colors: false });
  }

  class Interrupted extends Error {
    constructor() {
      super('the cell was interrupted');
      this.name = 'KeyboardInterrupt';
    }
  }

  async function runCell(req) {
    active = true;
    errorSent = false;
    emit({ type: 'number_of_executions', execution_count: count++ });
    const saved = withEnv(req.env);
    try {
      let wrapped;
      try {
        wrapped = rewrite(String(req.code || ''));
      } catch (e) {
        if (e instanceof CellSyntaxError) errorLine('SyntaxError', e.message, `SyntaxError: ${e.message}`);
        else sendError(e);
        return;
      }
      const interrupted = new Promise((_, reject) => { interruptCell = () => reject(new Interrupted()); });
      interrupted.catch(() => {});
      try {
        const script = new vm.Script(wrapped, { filename: 'cell', lineOffset: -1 });
        const value = await Promise.race([script.runInThisContext({ breakOnSigint: true }), interrupted]);
        if (value !== undefined) emit(fit({ type: 'result', text: resultText(value), is_main_result: true, extra: {} }));
      } catch (e) {
        if (e && e.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') errorLine('KeyboardInterrupt', '', '');
        else sendError(e);
      }
    } finally {
      interruptCell = null;
      restoreEnv(saved);
      active = false;
      emit({ type: '__wb_done__' });
    }
  }

  process.on('SIGINT', () => {
    if (interruptCell) interruptCell();
  });
  // An error thrown by a cell's timer after the cell: the kernel lives on.
  process.on('uncaughtException', (e) => {
    if (active) sendError(e);
  });
  process.on('unhandledRejection', (e) => {
    if (active) sendError(e);
  });

  // The control pipe is read on a worker thread with blocking reads, so that
  // an interrupt arrives while the cell keeps the main thread busy.
  const reader = new Worker(`
    const fs = require('fs');
    const { parentPort } = require('worker_threads');
    const buf = Buffer.alloc(65536);
    let pending = '';
    for (;;) {
      let n;
      try {
        n = fs.readSync(${CTL}, buf, 0, buf.length, null);
      } catch (e) {
        if (e.code === 'EAGAIN' || e.code === 'EINTR') {
          Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 10);
          continue;
        }
        n = 0;
      }
      if (n === 0) { parentPort.postMessage(null); break; }
      pending += buf.toString('utf8', 0, n);
      let i;
      while ((i = pending.indexOf('\\n')) >= 0) {
        const line = pending.slice(0, i);
        pending = pending.slice(i + 1);
        let req;
        try { req = JSON.parse(line); } catch (e) { continue; }
        if (req && req.op === 'interrupt') process.kill(process.pid, 'SIGINT');
        else if (req) parentPort.postMessage(req);
      }
    }
  `, { eval: true, stdout: false, stderr: false });

  const queue = [];
  let busy = false;
  async function pump() {
    if (busy) return;
    busy = true;
    while (queue.length) {
      const req = queue.shift();
      await runCell(req);
    }
    busy = false;
  }
  reader.on('message', (req) => {
    if (req === null) process.exit(0);   // warmboxd closed our control pipe
    queue.push(req);
    pump();
  });
  reader.on('error', () => process.exit(1));
})();
