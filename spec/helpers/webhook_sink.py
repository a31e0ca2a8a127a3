#!/usr/bin/env python3
"""A webhook receiver for specs, on a loopback port.

    webhook_sink.py LOG SECRET FAIL_FIRST

Prints "listening PORT", then appends one JSON line per POST to LOG:
{"headers": {lower-case name: value}, "body": raw body, "valid": whether
e2b-signature is E2B's signature of the body (SHA-256 of secret + body,
URL-safe base64 without padding, as E2B's documentation verifies it),
"status": what it answered}. The first FAIL_FIRST requests get a 500.
"""
import base64
import hashlib
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG, SECRET, FAIL_FIRST = sys.argv[1], sys.argv[2], int(sys.argv[3])
seen = {"n": 0}


def expected(body):
    digest = hashlib.sha256((SECRET + body).encode("utf-8")).digest()
    return base64.b64encode(digest).decode().replace("+", "-").replace("/", "_").rstrip("=")


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(n).decode("utf-8")
        seen["n"] += 1
        status = 500 if seen["n"] <= FAIL_FIRST else 200
        rec = {"headers": {k.lower(): v for k, v in self.headers.items()}, "body": body,
               "valid": self.headers.get("e2b-signature") == expected(body), "status": status}
        with open(LOG, "a") as f:
            f.write(json.dumps(rec) + "\n")
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print("listening", srv.server_address[1], flush=True)
srv.serve_forever()
