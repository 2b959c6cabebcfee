#!/bin/sh
# `shoal plan`: writes the four files from a view file, they parse and follow formats.md, the same
# view in another order gives byte-identical files, a measured view prints and writes the cost
# model's predictions (hybrid with --hybrid), and bad input is a clear error.
. tests/lib.sh

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

A=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa B=bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb C=cccccccccccccccccccccccccccccccc
node() { # id host mem_gib ip_tb1 if1 peer1 ip_tb2 if2 peer2 wifi_ip
	printf '{"node_id":"%s","host":"%s","mem_avail":%s,"addresses":[' "$1" "$2" $(($3 << 30))
	printf '{"ip":"%s","ifname":"en0","kind":"wifi"},' "${10}"
	printf '{"ip":"%s","ifname":"%s","kind":"thunderbolt"},{"ip":"%s","ifname":"%s","kind":"thunderbolt"}],' \
		"$4" "$5" "$7" "$8"
	printf '"rdma":[{"name":"rdma_%s"},{"name":"rdma_%s","port_active":true}],' "$5" "$8"
	printf '"seen_on":[{"node_id":"%s","ifname":"%s"},{"node_id":"%s","ifname":"%s"}]}' "$6" "$5" "$9" "$8"
}
NA=$(node $A mac1.local 64 10.254.0.1 en3 $B 10.254.2.1 en4 $C 192.168.1.11)
NB=$(node $B mac2.local 32 10.254.0.2 en3 $A 10.254.1.2 en4 $C 192.168.1.12)
NC=$(node $C mac3.local 16 10.254.2.3 en3 $A 10.254.1.3 en4 $B 192.168.1.13)
printf '{"epoch":7,"nodes":[%s,%s,%s]}\n' "$NA" "$NB" "$NC" >"$T/view.json"
printf '{"nodes":[%s,%s,%s],"epoch":7}\n' "$NC" "$NA" "$NB" >"$T/view2.json"
cat >"$T/model.json" <<'EOF'
{"arch":"llama","n_layers":32,"n_heads":32,"n_kv_heads":8,"head_dim":128,"dim":4096,
 "ffn":14336,"n_vocab":128256,"n_ctx":8192,"wtype":"Q8_0"}
EOF

$SHOAL plan --view "$T/view.json" --model "$T/model.json" --out "$T/out" >"$T/stdout" 2>"$T/stderr"
rc=$?
check "plan exits 0" [ $rc -eq 0 ]
[ $rc -eq 0 ] || cat "$T/stderr" >&2
for f in hostfile.json mlx-hosts.json rdma-devices.json plan.json; do
	check "$f written" [ -s "$T/out/$f" ]
	check "$f parses" python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$T/out/$f"
done
check "no temp files left" sh -c "! ls '$T/out' | grep -q tmp"
check "table names every host" sh -c "grep -q mac1.local '$T/stdout' && grep -q mac3.local '$T/stdout'"
check "table says the strategy" grep -q 'strategy tensor (every pair of nodes has an RDMA link)' "$T/stdout"

# formats.md semantics, checked from the files alone
check "files follow formats.md" python3 - "$T/out" <<'EOF'
import json, sys
d = sys.argv[1]
h = json.load(open(d + "/hostfile.json"))
m = json.load(open(d + "/mlx-hosts.json"))
r = json.load(open(d + "/rdma-devices.json"))
p = json.load(open(d + "/plan.json"))
n = len(p["ranks"])
assert n == 3 and len(h) == n and len(m["hosts"]) == n and len(r) == n
assert m["backend"] == "jaccl" and m["envs"] == ["MLX_METAL_FAST_SYNCH=1"]
assert p["mlx"]["backend"] == "jaccl" and p["mlx"]["jaccl"] == "jaccl"
ids = [k["node_id"] for k in p["ranks"]]
assert ids[0] == min(ids), "rank 0 is the smallest node id"
for i, k in enumerate(p["ranks"]):
    assert len(h[i]) == 1, "nested form: one list per rank (ring.cpp load_nodes)"
    ip, port = h[i][0].split(":")
    assert ip == k["ip"] and int(port) == 32323 + i, "ring row i is rank i"
    hi = m["hosts"][i]
    assert hi["ssh"] == k["host"] and hi["ips"] == [k["ips"][0]]
    assert hi["ips"][0].startswith("192.168.1."), "JACCL: the LAN address every rank reaches"
    assert len(r[i]) == n and r[i][i] is None, "null diagonal"
    assert hi["rdma"] == r[i]
    for j in range(n):
        if j != i:
            assert r[i][j] and r[i][j].startswith("rdma_en"), "full mesh"
assert p["mlx"]["coordinator"] == m["hosts"][0]["ips"][0] + ":32323"
assert p["rdma_full_mesh"] is True
assert len(p["hash"]) == 16
# every query head and FFN column once
q = sorted(tuple(k["q_heads"]) for k in p["ranks"])
assert q[0][0] == 0 and q[-1][1] == 32 and all(q[i][1] == q[i + 1][0] for i in range(n - 1))
EOF

$SHOAL plan --view "$T/view2.json" --model "$T/model.json" --out "$T/out2" >/dev/null 2>&1
for f in hostfile.json mlx-hosts.json rdma-devices.json plan.json; do
	check "$f identical for a reordered view" cmp -s "$T/out/$f" "$T/out2/$f"
done

$SHOAL plan --view "$T/view.json" --model "$T/model.json" --mlx-list --out "$T/outl" >/dev/null 2>&1
check "--mlx-list writes the hosts list alone" python3 -c '
import json, sys
l = json.load(open(sys.argv[1] + "/mlx-hosts.json")); o = json.load(open(sys.argv[2] + "/mlx-hosts.json"))
assert l == o["hosts"]' "$T/outl" "$T/out"
check "table says the MLX backend" grep -q 'MLX backend jaccl (every rank has an RDMA device' "$T/stdout"

$SHOAL plan --view "$T/view.json" --model "$T/model.json" --strategy pipeline --out "$T/out3" \
	>"$T/stdout3" 2>&1
check "pipeline on request" grep -q 'strategy pipeline (pipeline requested)' "$T/stdout3"

# measured links and compute (docs/view.md 1.1): the cost model's predictions, printed and in
# plan.json; two cabled pairs joined by a slow link, no pair holding the model: hybrid when the
# engine runs it, and the prediction either way
python3 - "$T/mview.json" <<'EOF'
import json, sys
ids = ["%032x" % (0xa0 + i) for i in range(4)]
nodes = []
for i in range(4):
    links = []
    for j in range(i + 1, 4):
        fast = (i, j) in ((0, 2), (1, 3))
        links.append({"node_id": ids[j], "rtt_us": 30 if fast else 3000,
                      "rtt_p90_us": 30 if fast else 3500, "mbps": 9400 if fast else 300})
    nodes.append({"node_id": ids[i], "host": "h%d" % i, "mem_avail": (512 << 20) + 180000000,
                  "cores": 4, "threads": 4, "bw": 22.0, "links": links,
                  "addresses": [{"ip": "10.0.0.%d" % (i + 1), "ifname": "eth0"}]})
json.dump({"epoch": 3, "nodes": nodes}, open(sys.argv[1], "w"))
EOF
cat >"$T/m085.json" <<'EOF'
{"n_layers":16,"n_heads":32,"n_kv_heads":8,"head_dim":64,"dim":2048,"ffn":5632,
 "n_vocab":32000,"n_ctx":4096,"wtype":"Q4_0"}
EOF
$SHOAL plan --view "$T/mview.json" --model "$T/m085.json" --ctx 2048 --kv-bytes 2 --hybrid \
	--parallel 4 --out "$T/om" >"$T/stdoutm" 2>&1
check "measured view plans" [ $? -eq 0 ]
check "prints the predictions" grep -q '^predicted: decode [0-9.]* tok/s, aggregate [0-9.]* tok/s at 4 streams' "$T/stdoutm"
check "prints the stages" grep -q '^stage 1: ranks 2-3, layers' "$T/stdoutm"
check "prints the candidates" grep -q '^  best   pipeline  4 ranks' "$T/stdoutm"
check "plan.json carries the predictions" python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))
assert p["strategy"] == "hybrid" and p["predicted_decode_tok_s"] > 0, p["strategy"]
assert p["predicted_parallel"] == 4 and p["candidates"][0]["what"] == "chosen"
assert [k["stage"] for k in p["ranks"]] == [0, 0, 1, 1]
assert p["reason"].startswith("hybrid over 4 (2+2): predicted ")
' "$T/om/plan.json"
$SHOAL plan --view "$T/mview.json" --model "$T/m085.json" --ctx 2048 --kv-bytes 2 \
	--out "$T/om2" >"$T/stdoutm2" 2>&1
check "without --hybrid: no hybrid plan, its prediction shown" sh -c \
	"grep -q 'strategy pipeline (pipeline over 4: predicted' '$T/stdoutm2' && grep -q '^  best   hybrid' '$T/stdoutm2'"

# errors: usage (2) and input (1) with a one-line message
$SHOAL plan --model "$T/model.json" >/dev/null 2>&1
check "missing --view is a usage error" [ $? -eq 2 ]
$SHOAL plan --view "$T/view.json" --model "$T/model.json" --strategy sideways >/dev/null 2>&1
check "bad --strategy is a usage error" [ $? -eq 2 ]
check "--help exits 0" sh -c "$SHOAL plan --help | grep -q '^usage: shoal plan'"
echo '{"nodes": 3}' >"$T/bad.json"
$SHOAL plan --view "$T/bad.json" --model "$T/model.json" --out "$T/o4" >/dev/null 2>"$T/err4"
check "bad view exits 1" [ $? -eq 1 ]
check "bad view says why" grep -q 'must be a non-empty array' "$T/err4"
$SHOAL plan --view "$T/view.json" --model "$T/model.json" --ctx 2000000 --out "$T/o5" \
	>/dev/null 2>"$T/err5"
check "no fit exits 1" [ $? -eq 1 ]
check "no fit names the shortfall" grep -q 'model does not fit (tensor, 3 ranks): short by' "$T/err5"
check "nothing written when it does not fit" [ ! -e "$T/o5/plan.json" ]
# a .gguf model: shapes and exact tensor sizes from the file
if [ -f "$SHARED/models/stories260K.gguf" ]; then
	$SHOAL plan --view "$T/view.json" --model "$SHARED/models/stories260K.gguf" --out "$T/o6" \
		>"$T/stdout6" 2>&1
	check "plan from a .gguf exits 0" [ $? -eq 0 ]
	check "plan from a .gguf has its shapes" python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))
m = p["model"]
assert (m["n_layers"], m["n_heads"], m["n_kv_heads"], m["dim"], m["ffn"]) == (5, 8, 4, 64, 172), m
assert p["ranks"][-1]["ffn"][1] == 172 and p["ranks"][0]["fit"]["weights"] > 0
' "$T/o6/plan.json"
else
	skip "gguf plan: $SHARED/models/stories260K.gguf not found"
fi
# Qwen3.5-397B-A17B's shape as a metadata-only header (docs/view.md "Memory"; the shape from
# Qwen's config as tests/test_plan_mem.c cites it) on 4 x 128 GiB: the plan fits and each rank's
# KV cache counts the 15 full-attention layers only (one KV head each: 15 x 2 x 256 x 2 bytes x
# 262144 = 4.03 GB), the 45 DeltaNet layers a state of its 4 key heads x 3 buffers
$SHOAL mkmodel --arch qwen35moe --dim 4096 --layers 60 --heads 32 --kv-heads 2 --head-dim 256 \
	--experts 512 --experts-used 10 --expert-ffn 1024 --ffn 1024 --shared-experts 1 \
	--ssm-state 128 --ssm-k-heads 16 --ssm-v-heads 64 --ssm-conv 4 --attn-interval 4 \
	--rope-dim 64 --vocab 248320 --ctx 262144 --type q8_0 --header-only -o "$T/q397.gguf"
check "mkmodel --header-only writes a sparse 421 GB header" python3 -c '
import os, sys
st = os.stat(sys.argv[1])
assert st.st_size > 420e9 and st.st_blocks * 512 < 64 << 20, (st.st_size, st.st_blocks)
' "$T/q397.gguf"
python3 - "$T/view4.json" <<'EOF'
import json, sys
ids = ["%032x" % (0xb0 + i) for i in range(4)]
nodes = [{"node_id": ids[i], "host": "mac%d" % i, "mem_avail": 128 << 30, "cores": 24,
          "addresses": [{"ip": "10.1.0.%d" % (i + 1), "ifname": "en0", "kind": "ethernet"}],
          "seen_on": [{"node_id": ids[j], "ifname": "en0"} for j in range(4) if j != i]}
         for i in range(4)]
json.dump({"epoch": 1, "nodes": nodes}, open(sys.argv[1], "w"))
EOF
$SHOAL plan --view "$T/view4.json" --model "$T/q397.gguf" --kv-bytes 2 --out "$T/o7" \
	>"$T/stdout7" 2>&1
check "397B header plans on 4 x 128 GiB" [ $? -eq 0 ]
check "prints each rank's weights, KV cache and state" \
	grep -Eq '^3 +106\.[0-9]+ +4\.03 +0\.15 ' "$T/stdout7"
check "plan.json carries each rank's recurrent state" python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))
assert p["strategy"] == "tensor" and len(p["ranks"]) == 4
for k in p["ranks"]:
    f = k["fit"]
    assert f["kv_cache"] == 15 * 2 * 256 * 2 * 262144, f
    assert f["recurrent"] == 45 * 3 * 4 * (3 * (2 * 4 * 128 + 16 * 128) + 16 * 128 * 128), f
    assert sum(f.values()) <= k["mem_avail"]
' "$T/o7/plan.json"
rm -f "$T/q397.gguf"
done_tests
