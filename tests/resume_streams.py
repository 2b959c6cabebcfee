#!/usr/bin/env python3
"""resume_streams.py: N concurrent greedy streams through the API while the cluster re-plans.

usage: resume_streams.py URL N MAX_TOKENS READY_FILE [READY_TOKENS]

Opens N streaming completions (temperature 0, stream_options.include_usage) to URL (the
leader's http://host:port; a 307 from a follower is followed once) at once. READY_FILE is
written once every stream has READY_TOKENS content chunks (default 8): the caller kills or
restarts a node then. Prints one line per stream:

    stream I status=S finish=F tokens=T errors=E done=D chunks=C gap_ms=G ms=M

(F the last finish_reason seen, T the usage's completion_tokens, E the error events, D 1 when
"data: [DONE]" came, C the content chunks, G the longest pause between two chunks, M the stream's whole time), then
"ok K" with K the streams that ended normally: finish "length", T = MAX_TOKENS, no error event,
[DONE]. The SSE shapes are web/respond.c's (web_json_chunk, web_sse_add).
"""
import http.client
import json
import sys
import threading
import time
import urllib.parse

url, n, max_tokens, ready_file = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ready_tokens = int(sys.argv[5]) if len(sys.argv) > 5 else 8
lock = threading.Lock()
chunks = [0] * n
results = [None] * n
ready_written = [False]


def post(u, body):
    p = urllib.parse.urlparse(u)
    c = http.client.HTTPConnection(p.hostname, p.port, timeout=120)
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status in (301, 302, 307, 308) and r.getheader("Location"):
        r.read()
        c.close()
        loc = urllib.parse.urlparse(r.getheader("Location"))
        return post("%s://%s" % (loc.scheme, loc.netloc), body)
    return c, r


def note_chunk(i):
    with lock:
        chunks[i] += 1
        if not ready_written[0] and min(chunks) >= ready_tokens:
            ready_written[0] = True
            with open(ready_file, "w") as f:
                f.write("ready\n")


def stream(i):
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}})
    t0 = time.time()
    res = {"finish": None, "tokens": -1, "errors": 0, "done": 0, "gap_ms": 0, "status": 0}
    try:
        c, r = post(url, body)
        res["status"] = r.status
        last = time.time()
        buf = b""
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            now = time.time()
            res["gap_ms"] = max(res["gap_ms"], int((now - last) * 1000))
            last = now
            data = line[6:]
            if data == b"[DONE]":
                res["done"] = 1
                continue
            try:
                d = json.loads(data)
            except ValueError:
                continue
            if "error" in d:
                res["errors"] += 1
                continue
            for ch in d.get("choices") or []:
                if ch.get("text"):
                    note_chunk(i)
                if ch.get("finish_reason"):
                    res["finish"] = ch["finish_reason"]
            if d.get("usage"):
                res["tokens"] = d["usage"].get("completion_tokens", -1)
        c.close()
    except Exception as e:  # noqa: BLE001 - reported as a failed stream
        res["errors"] += 1
        print("stream %d: %r" % (i, e), file=sys.stderr)
    res["ms"] = int((time.time() - t0) * 1000)
    results[i] = res


ts = [threading.Thread(target=stream, args=(i,)) for i in range(n)]
for t in ts:
    t.start()
for t in ts:
    t.join()
ok = 0
for i, r in enumerate(results):
    good = (r["finish"] == "length" and r["tokens"] == max_tokens and not r["errors"] and r["done"])
    ok += good
    print("stream %d status=%d finish=%s tokens=%d errors=%d done=%d chunks=%d gap_ms=%d ms=%d" %
          (i, r["status"], r["finish"], r["tokens"], r["errors"], r["done"], chunks[i], r["gap_ms"],
           r["ms"]))
print("ok %d" % ok)
