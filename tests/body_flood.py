#!/usr/bin/env python3
"""body_flood.py: memory floods and error shapes against a shoal HTTP server on 127.0.0.1.

usage: body_flood.py PORT PID

1. 100 concurrent 1 MiB bodies {"x":[{},{},...]} (Content-Length), then 100 concurrent ones just
   under the body limit, then 100 concurrent chunked 1 MiB ones, while PID's RSS is sampled every
   20 ms: prints the idle baseline, the peak and the RSS 3 s after, in MB.
2. A chunked body sent 64 KiB at a time: how many bytes had gone out when the 413 came back.
3. Raw requests that must fail, one line each: "err STATUS CONTENT-TYPE NAME".
Prints one "key value" line per figure (tests/t_http_abuse.sh asserts on them). Bounded in time.
"""
import socket
import sys
import threading
import time

port, pid = int(sys.argv[1]), int(sys.argv[2])
LIMIT = 512 * 1024


def rss_mb():
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def body_of(size):
    head, tail = b'{"x":[', b"{}]}"
    n = (size - len(head) - len(tail)) // 3
    return head + b"{}," * n + tail


def exchange(data, timeout=20.0, src="127.0.0.1"):
    """Sends data, returns (status, content-type, body) of the reply ('' when none)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(src, 0))
    try:
        try:
            s.sendall(data)
        except OSError:
            pass  # the server may answer and close before taking it all
        buf = b""
        while True:
            try:
                chunk = s.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
            if b"\r\n\r\n" in buf:
                head, _, rest = buf.partition(b"\r\n\r\n")
                cl = [h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")]
                if cl and len(rest) >= int(cl[0].split(b":")[1]):
                    break
    finally:
        s.close()
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = lines[0].split(b" ")[1].decode() if len(lines[0].split(b" ")) > 1 else "none"
    ctype = "none"
    for h in lines[1:]:
        if h.lower().startswith(b"content-type:"):
            ctype = h.split(b":", 1)[1].strip().decode()
    return status, ctype, rest


def post(body, chunked=False, src="127.0.0.1"):
    h = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    if chunked:
        parts = [body[i:i + 65536] for i in range(0, len(body), 65536)]
        data = h + b"Transfer-Encoding: chunked\r\n\r\n"
        data += b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    else:
        data = h + b"Content-Length: %d\r\n\r\n" % len(body) + body
    return exchange(data, src=src)


# ---- 1: the memory flood ----------------------------------------------------------------------
base = rss_mb()
peak = base
sampling = True


def sampler():
    global peak
    while sampling:
        peak = max(peak, rss_mb())
        time.sleep(0.02)


st = threading.Thread(target=sampler, daemon=True)
st.start()
statuses = {}
for name, size, chunked in (("big", 1 << 20, False), ("under", LIMIT - 4096, False),
                            ("chunked", 1 << 20, True)):
    body = body_of(size)
    res = []

    def one(i):
        try:  # from 4 addresses: 100 from one would pass the server's per-address cap (64)
            res.append(post(body, chunked, "127.0.0.%d" % (10 + i % 4))[0])
        except OSError as e:
            res.append("oserror:" + e.__class__.__name__)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(100)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    statuses[name] = sorted(set(res))
time.sleep(3)
sampling = False
st.join()
after = rss_mb()
print("rss_base_mb %.0f" % base)
print("rss_peak_mb %.0f" % peak)
print("rss_after_mb %.0f" % after)
for k, v in statuses.items():
    print("flood_%s %s" % (k, ",".join(v)))

# ---- 2: a chunked body over the limit is refused early -----------------------------------------
s = socket.create_connection(("127.0.0.1", port), timeout=10)
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          b"Transfer-Encoding: chunked\r\n\r\n")
piece = b"x" * 65536
sent, reply = 0, b""
while sent < (8 << 20):
    try:
        s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
    except OSError:
        break
    sent += len(piece)
    s.settimeout(0.05)
    try:
        reply = s.recv(4096)
    except socket.timeout:
        continue
    except OSError:
        break
    break
s.settimeout(2)
try:
    while b"}}" not in reply:
        more = s.recv(4096)
        if not more:
            break
        reply += more
except OSError:
    pass
s.close()
print("chunked_sent_kib_at_reply %d" % (sent // 1024))
print("chunked_reply %s" % (reply.split(b"\r\n")[0].decode(errors="replace") or "none"))
print("chunked_reply_json %d" % (b"application/json" in reply and b'"error"' in reply))

# ---- 3: every error, and what its body is -----------------------------------------------------
cases = [
    ("not_found", b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("method", b"DELETE /health HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("bad_json", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{nope"),
    ("too_large", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 9999999\r\n\r\n"),
    ("too_deep", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n"
     + b"[" * 100 + b"]" * 100),
    ("bad_request_line", b"GARBAGE\r\n\r\n"),
    ("http_version", b"GET /health HTTP/3.7\r\nHost: x\r\n\r\n"),
    ("no_host", b"GET /health HTTP/1.1\r\n\r\n"),
    ("uri_too_long", b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("header_too_large", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 70000 +
     b"\r\n\r\n"),
]
for name, raw in cases:
    try:
        status, ctype, rest = exchange(raw, 10)
    except OSError as e:
        status, ctype, rest = "oserror", e.__class__.__name__, b""
    is_json = ctype.startswith("application/json") and rest.lstrip().startswith(b"{")
    print("err %s %s %s %d" % (name, status, ctype.split(";")[0], is_json))
