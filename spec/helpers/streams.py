#!/usr/bin/env python3
"""Holds N streamed calls open to a warmboxd sandbox, as one client of a
loopback address would: each a Process/Start of `sleep 120` (envd's Connect
stream, routed by the E2B headers) sent from SOURCE_ADDR. Prints its pid on
the first line, then one JSON line {"statuses": [...]} (each call's HTTP
status, 0 when the connection was refused or closed), then holds the streams
until killed or HOLD_S seconds pass.
  streams.py PORT SANDBOX_ID TOKEN N [SOURCE_ADDR [HOLD_S]]"""
import json
import os
import socket
import struct
import sys
import time

port, sbid, token, n = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
source = sys.argv[5] if len(sys.argv) > 5 else "127.0.0.1"
hold = float(sys.argv[6]) if len(sys.argv) > 6 else 60
print(os.getpid(), flush=True)

msg = json.dumps({"process": {"cmd": "sleep", "args": ["120"]}}).encode()
body = struct.pack(">BI", 0, len(msg)) + msg
head = ("POST /process.Process/Start HTTP/1.1\r\nHost: 127.0.0.1\r\nE2b-Sandbox-Id: %s\r\n"
        "E2b-Sandbox-Port: 49983\r\nX-Access-Token: %s\r\nContent-Type: application/connect+json\r\n"
        "Connect-Protocol-Version: 1\r\nContent-Length: %d\r\n\r\n" % (sbid, token, len(body))).encode()

socks, statuses = [], []
for _ in range(n):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(10)
    status = 0
    try:
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
        s.sendall(head + body)
        line = s.recv(64).split(b"\r\n")[0].split()
        status = int(line[1]) if len(line) > 1 else 0
    except OSError:
        pass
    statuses.append(status)
    socks.append(s)
print(json.dumps({"statuses": statuses}), flush=True)
deadline = time.monotonic() + hold
while time.monotonic() < deadline:
    time.sleep(0.5)
for s in socks:
    s.close()
