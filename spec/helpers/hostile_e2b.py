#!/usr/bin/env python3
"""A hostile E2B API server on 127.0.0.1 for the client's specs: it prints its
port, then answers
  GET /v2/sandboxes, GET /snapshots   [] with an x-next-token for ever
  GET /sandboxes/iendless             200, a chunked body that never ends
  GET /sandboxes/ilength              200, Content-Length: 40 MiB (it sends a little)
  POST /execute                       500, a chunked body that never ends
  GET /_pages                         {"pages": n}: the listing pages asked so far
It exits after 60 s without a request, or on GET /_quit."""
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

state = {"pages": 0, "last": time.monotonic()}
lock = threading.Lock()
CHUNK = b"x" * 65536


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def small(self, status, body, headers=None):
        data = body.encode()
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def endless(self, status):
        self.send_response(status)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for _ in range(1 << 20):   # 64 GiB at most: the client gives up long before
                self.wfile.write(b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK))
        except OSError:
            pass
        self.close_connection = True

    def do_GET(self):
        with lock:
            state["last"] = time.monotonic()
        path = self.path.split("?")[0]
        if path in ("/v2/sandboxes", "/snapshots"):
            with lock:
                state["pages"] += 1
                n = state["pages"]
            self.small(200, "[]", {"X-Next-Token": "p%d" % n})
        elif path == "/_pages":
            self.small(200, json.dumps({"pages": state["pages"]}))
        elif path == "/sandboxes/iendless":
            self.endless(200)
        elif path == "/sandboxes/ilength":
            self.send_response(200)
            self.send_header("Content-Length", str(40 << 20))
            self.end_headers()
            try:
                self.wfile.write(b"{")
                time.sleep(2)
            except OSError:
                pass
            self.close_connection = True
        elif path == "/_quit":
            self.small(200, "{}")
            threading.Thread(target=self.server.shutdown).start()
        else:
            self.small(404, '{"code":404,"message":"no route"}')

    def do_POST(self):
        with lock:
            state["last"] = time.monotonic()
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if self.path.split("?")[0] == "/execute":
            self.endless(500)
        else:
            self.small(404, '{"code":404,"message":"no route"}')


class Server(ThreadingHTTPServer):
    daemon_threads = True


srv = Server(("127.0.0.1", 0), Handler)
print(srv.server_address[1], flush=True)


def idle():
    while True:
        time.sleep(1)
        if time.monotonic() - state["last"] > 60:
            srv.shutdown()
            return


threading.Thread(target=idle, daemon=True).start()
srv.serve_forever()
sys.exit(0)
