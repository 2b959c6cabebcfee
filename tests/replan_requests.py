#!/usr/bin/env python3
"""replan_requests.py: completions in a steady stream while a rank is killed.

usage: replan_requests.py PORT SECONDS KILL_PID KILL_AT_S [stop:S]

Three clients send non-streaming completions to 127.0.0.1:PORT back to back for SECONDS; at
KILL_AT_S the process KILL_PID (a rank of the plan) gets SIGKILL, or with stop:S it is paused
(SIGSTOP) for S seconds and then continued. Prints "status N" per HTTP
status seen, "no_retry_after N" (503s without Retry-After), "ok_after_kill N" (200s that started
after the kill) and "other N" (failures that were no HTTP answer at all).
"""
import http.client
import json
import os
import signal
import sys
import threading
import time

port, secs, kill_pid, kill_at = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
pause = float(sys.argv[5].split(":")[1]) if len(sys.argv) > 5 else 0.0
t0 = time.time()
killed_at = [0.0]
counts, lock = {}, threading.Lock()


def bump(k):
    with lock:
        counts[k] = counts.get(k, 0) + 1


def client():
    while time.time() - t0 < secs:
        start = time.time()
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.request("POST", "/v1/completions",
                      json.dumps({"prompt": "Once upon a time", "max_tokens": 48}),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            bump("status %d" % r.status)
            if r.status == 503 and not r.getheader("Retry-After"):
                bump("no_retry_after")
            if r.status == 200 and killed_at[0] and start > killed_at[0]:
                bump("ok_after_kill")
            if r.status == 503:
                time.sleep(0.2)
            c.close()
        except Exception as e:  # noqa: BLE001 - no HTTP answer at all
            bump("other")
            print("error", repr(e), file=sys.stderr)
            time.sleep(0.2)


ts = [threading.Thread(target=client) for _ in range(3)]
for t in ts:
    t.start()
time.sleep(kill_at)
if pause:
    os.kill(kill_pid, signal.SIGSTOP)
    time.sleep(pause)
    os.kill(kill_pid, signal.SIGCONT)
else:
    os.kill(kill_pid, signal.SIGKILL)
killed_at[0] = time.time()
for t in ts:
    t.join()
for k in ("status 200", "status 503", "no_retry_after", "ok_after_kill", "other"):
    counts.setdefault(k, 0)
for k, v in sorted(counts.items()):
    print(k.replace(" ", "_"), v)
