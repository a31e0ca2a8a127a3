// Preload (node -r ./localhost.cjs, or NODE_OPTIONS="--require .../localhost.cjs"):
// names under .localhost are loopback (RFC 6761, section 6.3), as browsers and
// curl resolve them, but glibc's files/dns resolver (node's dns.lookup) knows
// only "localhost" itself. With this, node reaches warmboxd's PORT-ID.localhost
// data plane (E2B's SDK builds `https://PORT-ID.<E2B_DOMAIN>` for
// sandbox.getHost(port)). Only *.localhost is answered here; every other name
// goes to the system's resolver as before.
'use strict';
const dns = require('node:dns');

const LOOPBACK = '127.0.0.1';
function isLocalhostName(name) {
  return typeof name === 'string' && /\.localhost\.?$/i.test(name);
}

const lookup = dns.lookup;
dns.lookup = function (hostname, options, callback) {
  if (typeof options === 'function') {
    callback = options;
    options = {};
  }
  if (!isLocalhostName(hostname)) return lookup.call(this, hostname, options, callback);
  const o = typeof options === 'number' ? { family: options } : options || {};
  if (o.family === 6) {
    process.nextTick(callback, Object.assign(new Error(`getaddrinfo ENOTFOUND ${hostname}`),
      { code: 'ENOTFOUND', hostname }));
    return {};
  }
  if (o.all) process.nextTick(callback, null, [{ address: LOOPBACK, family: 4 }]);
  else process.nextTick(callback, null, LOOPBACK, 4);
  return {};
};

const plookup = dns.promises.lookup;
dns.promises.lookup = function (hostname, options) {
  if (!isLocalhostName(hostname)) return plookup.call(this, hostname, options);
  const o = typeof options === 'number' ? { family: options } : options || {};
  return Promise.resolve(o.all ? [{ address: LOOPBACK, family: 4 }] : { address: LOOPBACK, family: 4 });
};
