#!/usr/bin/env python3
"""slow_clients.py: a slow-loris attack on a shoal HTTP server, and a well-behaved client beside it.

usage: slow_clients.py PORT N SOURCES SECONDS [API_KEY]

Opens N sockets to 127.0.0.1:PORT from SOURCES loopback addresses (127.0.0.2, .3, ...), each
sending a request one byte every 5 s (the headers never end). Meanwhile, from 127.0.0.1, GET
/health every second and a short completion every 4 s (every other one streamed: SSE must keep
flowing on the event-loop threads; it counts when it ends with data: [DONE]). Then 100 more sockets from one address
(127.0.0.200) test the per-address cap. Prints one "key value" line per figure; the shell test
(tests/t_http_abuse.sh) asserts on them. Bounded: SECONDS + a few.
"""
import http.client
import json
import select
import socket
import sys
import threading
import time

port, n, sources, secs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
key = sys.argv[5] if len(sys.argv) > 5 else ""
good = {"health_ok": 0, "health_bad": 0, "comp_ok": 0, "comp_bad": 0, "stream_ok": 0,
        "stream_bad": 0, "worst_ms": 0}
stop = False


def well_behaved():
    last_comp = 0.0
    n_comp = 0
    while not stop:
        t0 = time.time()
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            good["health_ok" if r.status == 200 else "health_bad"] += 1
            c.close()
        except Exception as e:  # noqa: BLE001 - any failure counts
            good["health_bad"] += 1
            print("health error", repr(e), file=sys.stderr)
        if time.time() - last_comp >= 4:
            last_comp = time.time()
            n_comp += 1
            stream = n_comp % 2 == 0
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                body = json.dumps({"prompt": "Once upon a time", "max_tokens": 8,
                                   "stream": stream})
                hdr = {"Content-Type": "application/json"}
                if key:
                    hdr["Authorization"] = "Bearer " + key
                c.request("POST", "/v1/completions", body, hdr)
                r = c.getresponse()
                raw = r.read()
                if stream:
                    ok = r.status == 200 and raw.rstrip().endswith(b"data: [DONE]")
                    good["stream_ok" if ok else "stream_bad"] += 1
                else:
                    ok = r.status == 200 and json.loads(raw)["choices"][0]["text"] is not None
                good["comp_ok" if ok else "comp_bad"] += 1
                c.close()
            except Exception as e:  # noqa: BLE001
                good["comp_bad"] += 1
                print("completion error", repr(e), file=sys.stderr)
        good["worst_ms"] = max(good["worst_ms"], int((time.time() - t0) * 1000))
        time.sleep(max(0, 1 - (time.time() - t0)))


def open_from(src, count):
    out = []
    for _ in range(count):
        s = socket.socket()
        s.bind((src, 0))
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        out.append(s)
    return out


socks = []
per = n // sources
for i in range(sources):
    socks += open_from("127.0.0.%d" % (i + 2), per)
t = threading.Thread(target=well_behaved, daemon=True)
t.start()
opened_at = time.time()
head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: "
pos = 0
alive = {s: 0.0 for s in socks}  # socket -> time the server closed it (0 = open)
last_send = 0.0
while time.time() - opened_at < secs:
    now = time.time()
    if now - last_send >= 5:
        last_send = now
        b = head[pos:pos + 1] if pos < len(head) else b"a"
        pos += 1
        for s in socks:
            if alive[s] == 0.0:
                try:
                    s.send(b)
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    alive[s] = now
    open_ = [s for s in socks if alive[s] == 0.0]
    r, _, _ = select.select(open_, [], [], 0.5) if open_ else ([], [], [])
    for s in r:
        try:
            if s.recv(4096) == b"":
                alive[s] = time.time()
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            alive[s] = time.time()

closed = [v - opened_at for v in alive.values() if v]
print("slow_opened", len(socks))
print("slow_closed_by_server", len(closed))
print("slow_longest_s", int(max(closed)) if closed else -1)
stop = True
t.join(15)
for k, v in good.items():
    print(k, v)
for s in socks:
    s.close()

# the per-address cap: of 100 connections from one address, the server keeps at most its cap
flood = open_from("127.0.0.200", 100)
time.sleep(1.5)
kept = 0
for s in flood:
    try:
        r, _, _ = select.select([s], [], [], 0)
        if not r or s.recv(1) != b"":
            kept += 1
    except OSError:
        pass
print("one_address_kept", kept)
for s in flood:
    s.close()
