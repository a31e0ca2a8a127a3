"""An intermediary on loopback in front of warmboxd's data plane: it forwards
every request as it is, except the executes it was told to answer itself.

  python3 after_proxy.py UPSTREAM_URL      (prints "listening PORT"; stops when stdin closes)

POST /_proxy/plan {"execute": [{"mode": "after"|"before", "status": 502, "headers": {}}, ...]}
queues what the next executes get: "after" forwards the execute, waits for its
whole answer (the cell ran), then answers `status` instead; "before" answers
`status` without forwarding; "late" answers `status` at once and forwards the
execute `delay` seconds later (a copy that arrives after the client gave up).
An execute with nothing queued is forwarded.
{"create": [...]} likewise queues what the next creates (POST /sandboxes, when the
proxy is also the API's address) get: "after" (forwarded, then `status` answered),
"twice" (forwarded twice, one after the other, the second answer given), "late" (forwarded and
answered, then forwarded again `delay` seconds later, or with "held": true once
POST /_proxy/release comes: a copy that arrives after the conversation's run;
"late_done" counts it once it ended). {"kill": [...]}: the
same for the next kills (DELETE /sandboxes/{id}); {"connect": [...]}: for the next
connects (POST /sandboxes/{id}/connect); {"snapshot": [...]}: for the next snapshots.
GET /_proxy/stats -> {"executes": executes forwarded, "answered": executes answered
by the plan, "late_done": late copies whose forward has ended, "creates": creates forwarded}.
"""
import http.client
import json
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

UP = urllib.parse.urlsplit(sys.argv[1])
PLAN = []
CREATE_PLAN = []
KILL_PLAN = []
CONNECT_PLAN = []
SNAPSHOT_PLAN = []
HELD = []   # late copies waiting for /_proxy/release: (handler, body, request line)
STATS = {"executes": 0, "answered": 0, "late_done": 0, "creates": 0}
LOCK = threading.Lock()
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "proxy-connection"}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_a):
        pass

    def reply(self, status, body=b"", headers=None):
        self.send_response(status)
        for k, v in (headers or {}).items():
            if k.lower() not in HOP:
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def forward(self, body, req=None):
        method, path, headers = req or self.request_line()
        conn = http.client.HTTPConnection(UP.hostname, UP.port, timeout=600)
        conn.request(method, path, body=body, headers=headers)
        res = conn.getresponse()
        data = res.read()
        conn.close()
        return res.status, data, dict(res.getheaders())

    def request_line(self):
        return self.command, self.path, {k: v for k, v in self.headers.items() if k.lower() not in HOP}

    def control(self, body):
        if self.command == "POST" and self.path == "/_proxy/plan":
            with LOCK:
                plan = json.loads(body or b"{}")
                PLAN.extend(plan.get("execute", []))
                CREATE_PLAN.extend(plan.get("create", []))
                KILL_PLAN.extend(plan.get("kill", []))
                CONNECT_PLAN.extend(plan.get("connect", []))
                SNAPSHOT_PLAN.extend(plan.get("snapshot", []))
            return self.reply(204)
        if self.command == "POST" and self.path == "/_proxy/release":
            with LOCK:
                held = HELD[:]
                del HELD[:]
            for h, b, req in held:
                threading.Thread(target=h.late, args=(b, req, False), daemon=True).start()
            return self.reply(204)
        with LOCK:
            out = json.dumps(STATS).encode()
        return self.reply(200, out, {"Content-Type": "application/json"})

    def handle_any(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else None
        if self.path.startswith("/_proxy/"):
            return self.control(body)
        step = None
        if self.command == "POST" and self.path.split("?")[0] == "/sandboxes":
            return self.create(body, CREATE_PLAN)
        if self.command == "DELETE" and self.path.startswith("/sandboxes/"):
            return self.create(body, KILL_PLAN)
        if self.command == "POST" and self.path.startswith("/sandboxes/") and self.path.endswith("/connect"):
            return self.create(body, CONNECT_PLAN)
        if self.command == "POST" and self.path.startswith("/sandboxes/") and self.path.endswith("/snapshots"):
            return self.create(body, SNAPSHOT_PLAN)
        if self.command == "POST" and self.path.split("?")[0] == "/execute":
            with LOCK:
                step = PLAN.pop(0) if PLAN else None
                if step is None or step.get("mode") == "after":
                    STATS["executes"] += 1
                if step is not None:
                    STATS["answered"] += 1
        if step is not None and step.get("mode") == "before":
            return self.reply(int(step["status"]), b'{"message":"intermediary"}', step.get("headers"))
        if step is not None and step.get("mode") == "late":
            self.reply(int(step["status"]), b'{"message":"intermediary"}', step.get("headers"))
            threading.Timer(float(step.get("delay", 1)), self.late, (body, self.request_line())).start()
            return None
        status, data, headers = self.forward(body)
        if step is not None:
            return self.reply(int(step["status"]), b'{"message":"intermediary"}', step.get("headers"))
        return self.reply(status, data, headers)

    def create(self, body, plan):
        with LOCK:
            step = plan.pop(0) if plan else None
            if plan is CREATE_PLAN:
                STATS["creates"] += 2 if step is not None and step.get("mode") in ("twice", "late") else 1
        if step is not None and step.get("mode") == "twice":
            req = self.request_line()
            self.forward(body, req)
            status, data, headers = self.forward(body, req)
            return self.reply(status, data, headers)
        status, data, headers = self.forward(body)
        if step is not None and step.get("mode") == "late":
            if step.get("held"):
                with LOCK:
                    HELD.append((self, body, self.request_line()))
            else:
                threading.Timer(float(step.get("delay", 1)), self.late, (body, self.request_line(), False)).start()
            return self.reply(status, data, headers)
        if step is not None:
            return self.reply(int(step["status"]), b'{"code":%d,"message":"intermediary"}' % int(step["status"]),
                              step.get("headers"))
        return self.reply(status, data, headers)

    def late(self, body, req, execute=True):
        if execute:
            with LOCK:
                STATS["executes"] += 1
        try:
            self.forward(body, req)
        finally:
            with LOCK:
                STATS["late_done"] += 1

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = handle_any


def main():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    print("listening %d" % srv.server_address[1], flush=True)
    sys.stdin.read()
    srv.shutdown()


if __name__ == "__main__":
    main()
