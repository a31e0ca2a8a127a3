// A local peer for spec/integration/core_tls_proxy_spec.lua, on 127.0.0.1 and
// a free port (printed first as "listening PORT"):
//   node tls_proxy_server.mjs https CERT KEY   HTTPS origin answering "secure"
//   node tls_proxy_server.mjs proxy            forward proxy that answers itself with
//                                              {"proxied": <absolute URL it was asked for>}
// It exits when its stdin closes (the spec's pipe), so it never outlives the spec.
import http from 'node:http';
import https from 'node:https';
import fs from 'node:fs';

const [mode, cert, key] = process.argv.slice(2);
let server;
if (mode === 'https') {
  server = https.createServer({ cert: fs.readFileSync(cert), key: fs.readFileSync(key) }, (req, res) => {
    res.writeHead(200, { 'content-type': 'text/plain' });
    res.end('secure');
  });
} else if (mode === 'proxy') {
  server = http.createServer((req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ proxied: req.url, host: req.headers.host }));
  });
} else {
  console.error('usage: tls_proxy_server.mjs https CERT KEY | proxy');
  process.exit(2);
}
server.listen(0, '127.0.0.1', () => console.log(`listening ${server.address().port}`));
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
