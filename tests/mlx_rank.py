#!/usr/bin/env python3
# mlx_rank.py: what `shoal agent --exec` starts in tests/t_exec.sh, standing in for an MLX program
# (python3 stdlib only). On every rank it:
#  1. checks its environment against the plan files, as mlx.launch would have set it
#     (python/mlx/_distributed_utils/launch.py launch_ring: MLX_RANK, MLX_HOSTFILE; no JACCL
#     variables for the ring backend; no MLX_HOSTFILE for one rank);
#  2. forms the ring over the hostfile the way MLX's ring backend does
#     (mlx/distributed/ring/ring.cpp RingGroup): rank r listens on every address of its own row,
#     connects to every address of row (r+1) % N (retrying), ranks below their right neighbour
#     accept first, the last rank connects first; then passes a token once around the ring;
#  3. on rank 0, serves a tiny OpenAI-style API on 127.0.0.1:$SHOAL_EXEC_PORT (a chat completion,
#     streamed as Server-Sent Events or not) whose text names the ring and the plan.
# It writes what it found to $STATE/exec-check.json (STATE = the directory of $SHOAL_PLAN) and
# then runs until it is terminated. Exit status 2: the environment is wrong; 3: no ring.
import json
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def log(*a):
    print("mlx_rank:", *a, flush=True)


def fail(code, msg):
    log("FAIL", msg)
    sys.exit(code)


env = os.environ
rank = int(env.get("MLX_RANK", "-1"))
plan_path = env.get("SHOAL_PLAN", "")
state = os.path.dirname(plan_path)
plan = json.load(open(plan_path))
world = len(plan["ranks"])
hosts = json.load(open(env["SHOAL_MLX_HOSTS"]))
my_id = open(os.path.join(state, "node_id")).read().strip()

# ---- 1. the environment against the files ----
problems = []
if not (0 <= rank < world):
    problems.append("MLX_RANK %d outside 0..%d" % (rank, world - 1))
elif plan["ranks"][rank]["node_id"] != my_id:
    problems.append("MLX_RANK %d is not this node in plan.json" % rank)
if int(env.get("SHOAL_WORLD_SIZE", "0")) != world:
    problems.append("SHOAL_WORLD_SIZE differs from plan.json")
if hosts.get("backend") != plan["mlx"]["backend"]:
    problems.append("mlx-hosts.json backend differs from plan.json")
for k in ("MLX_IBV_DEVICES", "MLX_JACCL_COORDINATOR", "MLX_JACCL_RING"):
    if hosts["backend"] == "ring" and k in env:
        problems.append(k + " set for the ring backend")
rows = []
if world == 1:
    if "MLX_HOSTFILE" in env:
        problems.append("MLX_HOSTFILE set for one rank")
else:
    hf = env.get("MLX_HOSTFILE", "")
    if os.path.realpath(hf) != os.path.realpath(os.path.join(state, "hostfile.json")):
        problems.append("MLX_HOSTFILE is not the plan's hostfile.json: %r" % hf)
    else:
        rows = json.load(open(hf))
        if len(rows) != world or not all(isinstance(r, list) and r for r in rows):
            problems.append("hostfile is not one non-empty list per rank")
        elif len({len(r) for r in rows}) != 1:
            problems.append("hostfile rows differ in length")
        for r, row in enumerate(rows):
            ips = [a.split(":")[0] for a in row]
            if hosts["backend"] == "ring" and hosts["hosts"][r]["ips"] != ips:
                problems.append("mlx-hosts ips of rank %d differ from its hostfile row" % r)
if problems:
    fail(2, "; ".join(problems))


# ---- 2. the ring, as MLX's ring backend forms it ----
def parse(addr):
    ip, port = addr.split(":", 1)  # utils.cpp parse_address: split at the first ':'
    return ip, int(port)


ring = "single"
if world > 1:
    listeners = []
    for addr in rows[rank]:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(parse(addr))  # fails unless the address is this host's own
        s.listen(1)
        listeners.append(s)

    def accept_all():
        out = []
        for s in listeners:
            s.settimeout(60)
            c, _ = s.accept()
            out.append(c)
        return out

    def connect_all(row):
        out = []
        for addr in row:
            for attempt in range(300):  # ring.cpp: CONN_ATTEMPTS, waiting between them
                try:
                    out.append(socket.create_connection(parse(addr), timeout=2))
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                fail(3, "rank %d cannot connect to %s" % (rank, addr))
        return out

    right_rank = (rank + 1) % world
    try:
        if rank < right_rank:
            left = accept_all()
            right = connect_all(rows[right_rank])
        else:
            right = connect_all(rows[right_rank])
            left = accept_all()
    except OSError as e:
        fail(3, "ring: %s" % e)
    if len(left) != len(right):
        fail(3, "as many connections to the left as to the right")
    # one token around the ring: rank 0 starts it, each rank adds itself
    lf = left[0].makefile("rb")
    left[0].settimeout(60)
    try:
        if rank == 0:
            right[0].sendall(b"0\n")
            token = lf.readline().decode().strip()
        else:
            token = lf.readline().decode().strip() + ",%d" % rank
            right[0].sendall((token + "\n").encode())
    except OSError as e:
        fail(3, "ring token: %s" % e)
    ring = token
log("rank %d of %d, plan %s, ring %s" % (rank, world, plan["hash"], ring))
with open(os.path.join(state, "exec-check.json.tmp"), "w") as f:
    json.dump({"rank": rank, "world": world, "hash": plan["hash"], "ring": ring,
               "pid": os.getpid(), "ok": True}, f)
os.replace(os.path.join(state, "exec-check.json.tmp"), os.path.join(state, "exec-check.json"))

# ---- 3. rank 0 serves a tiny OpenAI-style API ----
TEXT = "ring of %d: %s (plan %s)" % (world, ring, plan["hash"])


class Api(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, code, ctype, body):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self.reply(200, "application/json",
                       json.dumps({"object": "list", "data": [{"id": "mlx-test", "object": "model"}]}).encode())
        else:
            self.reply(404, "application/json", b'{"error":{"message":"not found"}}')

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        req = json.loads(self.rfile.read(n) or b"{}")
        if self.path != "/v1/chat/completions":
            return self.reply(404, "application/json", b'{"error":{"message":"not found"}}')
        base = {"id": "chatcmpl-test", "created": int(time.time()), "model": "mlx-test"}
        if not req.get("stream"):
            body = dict(base, object="chat.completion", choices=[{
                "index": 0, "message": {"role": "assistant", "content": TEXT},
                "finish_reason": "stop"}])
            return self.reply(200, "application/json", json.dumps(body).encode())
        # Server-Sent Events, no Content-Length: the body ends when the connection closes
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunks = [{"role": "assistant"}] + [{"content": w + " "} for w in TEXT.split(" ")]
        for d in chunks + [None]:
            c = dict(base, object="chat.completion.chunk", choices=[{
                "index": 0, "delta": d or {}, "finish_reason": None if d else "stop"}])
            self.wfile.write(b"data: " + json.dumps(c).encode() + b"\n\n")
            self.wfile.flush()
            time.sleep(0.05)  # so the stream really arrives in pieces
        self.wfile.write(b"data: [DONE]\n\n")


if rank == 0 and env.get("SHOAL_EXEC_PORT"):
    srv = ThreadingHTTPServer(("127.0.0.1", int(env["SHOAL_EXEC_PORT"])), Api)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    log("serving on 127.0.0.1:%s" % env["SHOAL_EXEC_PORT"])
while True:
    time.sleep(3600)
