#!/usr/bin/env python3
"""A client that sends its whole request body before it reads the answer (as
Python's http.client, and curl below 1 MiB, do), at the pace of a slow link:
the head and 16 KiB, a pause of PAUSE_S seconds, then the rest. Prints one
JSON line {"status": HTTP status or 0, "error": why it got none}.
  send_first.py PORT PATH BODY_BYTES [PAUSE_S] [HEADER: VALUE ...]"""
import json
import socket
import sys
import time

port, path, size = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
pause = float(sys.argv[4]) if len(sys.argv) > 4 else 0.5
headers = sys.argv[5:]
body = b"x" * size
head = "POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: %d\r\n" % (path, port, size)
head += "".join(h + "\r\n" for h in headers) + "\r\n"
out = {"status": 0, "error": None}
s = socket.create_connection(("127.0.0.1", port), timeout=30)
try:
    s.sendall(head.encode() + body[:16384])
    time.sleep(pause)
    s.sendall(body[16384:])
    data = b""
    while b"\r\n" not in data:
        d = s.recv(4096)
        if not d:
            break
        data += d
    line = data.split(b"\r\n")[0].split()
    if len(line) >= 2 and line[1].isdigit():
        out["status"] = int(line[1])
    else:
        out["error"] = "no answer: %r" % data[:80]
except OSError as e:
    out["error"] = "%s: %s" % (e.__class__.__name__, e)
finally:
    s.close()
print(json.dumps(out))
