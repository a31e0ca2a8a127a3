#!/usr/bin/env python3
"""Opens N connections from 127.0.0.1 to a loopback port that each send an
unfinished request head, then asks GET /health from another loopback address
(127.0.0.2) and prints one JSON line:
  {"opened": n, "held": n, "health_status": 200, "health_ms": 12.3, "closed_after_s": s}
Bounded: every socket has a timeout, everything closes before it exits.
  slow_conns.py PORT N [WAIT_CLOSE_S [TRICKLE_S [KIND [HEALTH_FROM [SERVER_PID]]]]]
WAIT_CLOSE_S > 0: afterwards, wait up to that long for the server to close
every slow connection (the connection timeout) and report when it did;
TRICKLE_S > 0: meanwhile send each one more byte of header every TRICKLE_S
(a client that is never idle but never finishes its request head).
KIND "body" (default "head"): each sends a whole request head (a POST with
Content-Length: 60000, under the 64 KiB a caller without a key may send) and
then its body only as TRICKLE_S says; "head-now": as "head", but /health is
asked at once after the last connection opened (all of them younger than a
second), before the count of held connections settles;
HEALTH_FROM (default 127.0.0.2): the address /health is asked from
(127.0.0.1: the same one as the slow connections);
SERVER_PID: also report the server's threads and RSS (/proc/PID/status)
while the connections are held: "server_threads", "server_rss_kb"."""
import json
import resource
import socket
import sys
import time

port, n = int(sys.argv[1]), int(sys.argv[2])
wait_close = float(sys.argv[3]) if len(sys.argv) > 3 else 0
trickle = float(sys.argv[4]) if len(sys.argv) > 4 else 0
kind = sys.argv[5] if len(sys.argv) > 5 else "head"
at_once = kind.endswith("-now")
kind = kind[:-4] if at_once else kind
health_from = sys.argv[6] if len(sys.argv) > 6 else "127.0.0.2"
server_pid = sys.argv[7] if len(sys.argv) > 7 else None
START = (b"POST /sandboxes HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
         b"Content-Length: 60000\r\n\r\n{") if kind == "body" else \
    b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
want = n + 64
if soft < want:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))

socks, opened = [], 0
for _ in range(n):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(START)
        opened += 1
        socks.append(s)
    except OSError:
        s.close()


def still_open(s):
    s.settimeout(0)
    try:
        return s.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def ask_health():
    t0 = time.monotonic()
    status = 0
    h = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    h.settimeout(5)
    try:
        h.bind((health_from, 0))
        h.connect(("127.0.0.1", port))
        h.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        line = h.recv(64).split(b"\r\n")[0].split()
        status = int(line[1]) if len(line) > 1 else 0
    except OSError:
        status = 0
    finally:
        h.close()
    return status, (time.monotonic() - t0) * 1000


if at_once:
    status, health_ms = ask_health()

# The server refuses what is over its caps as it accepts: wait until the
# count of connections it keeps has settled (a slow server, e.g. under
# valgrind, takes a while to go through its backlog).
held, same, deadline = -1, 0, time.monotonic() + 30
while time.monotonic() < deadline and same < 4:   # unchanged for 2 s
    time.sleep(0.5)
    now_held = sum(1 for s in socks if still_open(s))
    same = same + 1 if now_held == held else 0
    held = now_held

server = {}
if server_pid:
    with open("/proc/%s/status" % server_pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            if k == "Threads":
                server["server_threads"] = int(v)
            elif k == "VmRSS":
                server["server_rss_kb"] = int(v.split()[0])

if not at_once:
    status, health_ms = ask_health()

closed_after = None
if wait_close > 0:
    live = [s for s in socks if still_open(s)]
    t1 = time.monotonic()
    last = time.monotonic()
    while live and time.monotonic() - t1 < wait_close:
        time.sleep(0.1)
        live = [s for s in live if still_open(s)]
        if trickle > 0 and time.monotonic() - last >= trickle:
            last = time.monotonic()
            for s in live:
                try:
                    s.settimeout(1)
                    s.sendall(b"x")
                except OSError:
                    pass
    if not live:
        closed_after = round(time.monotonic() - t1 + 0.5, 2)

for s in socks:
    s.close()
out = {"opened": opened, "held": held, "health_status": status,
       "health_ms": round(health_ms, 1), "closed_after_s": closed_after}
out.update(server)
print(json.dumps(out))
