#!/bin/sh
# t_model_verify.sh: a cached model copy that rots on disk is caught (issue 14), on loopback
# (static peers, no root):
# - node a has --model, node b has none and keeps a slice of a's file (b/models/HASH.slice: the
#   header and its share's bytes, each batch with its BLAKE2b hash in HASH.slice.idx);
# - b stops; one byte of its slice is flipped and the mtime restored (the size-and-mtime hash
#   cache would trust it); b starts again: it re-hashes its batches before serving, drops the
#   rotten one, fetches it again (the bytes equal a's), rejoins the plan, answers as before;
# - with SHOAL_MODEL_VERIFY_S=2, the slice rots again while b runs: the periodic re-check finds it
#   within seconds, ends b's session, the next one fetches the bytes again, 2 ranks serve again.
. tests/lib.sh

MODEL=$SHARED/models/stories260K.gguf
[ -f "$MODEL" ] || { skip "t_model_verify: no $MODEL"; done_tests; exit; }
command -v python3 >/dev/null || { skip "t_model_verify: no python3"; done_tests; exit; }
TMP=$(mktemp -d)
BASE=$((20000 + ($$ % 120) * 100 + 63))
PA=$BASE PB=$((BASE + 20)) HA=$((BASE + 10)) HB=$((BASE + 30))
PIDS=""
cleanup() {
	for p in $PIDS; do kill "$p" 2>/dev/null; done
	for p in $PIDS; do wait "$p" 2>/dev/null; done
	[ "$T_FAIL" -gt 0 ] && tail -n 25 "$TMP"/*.log >&2; [ -n "$KEEPLOG" ] && cat "$TMP/b.log" >&2
	rm -rf "$TMP"
}
trap cleanup EXIT
start() { # name port http-port [--model M]
	n=$1 p=$2 h=$3
	shift 3
	"$SHOAL" agent --token verify-test "$@" --state-dir "$TMP/$n" --port "$p" \
		--http-port "$h" --no-mdns --peer "127.0.0.1:$PA" --peer "127.0.0.1:$PB" --expect 2 \
		--threads 1 --replan-delay 200 >>"$TMP/$n.log" 2>&1 &
	PIDS="$PIDS $!"
	eval "PID_$n=$!"
}
wait_ranks() { # http-port n
	i=0
	while [ $i -lt 300 ]; do
		curl -s "http://127.0.0.1:$1/v1/cluster" | grep -q "\"ranks\":$2," &&
			curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
		sleep 0.1
		i=$((i + 1))
	done
	return 1
}
chat1() {
	curl -sL "http://127.0.0.1:$1/v1/chat/completions" -H 'Content-Type: application/json' \
		-d '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":24,"temperature":0}' |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])' 2>/dev/null
}
# chat PORT: the greedy answer; a 503 while the cluster re-forms (a re-check ends a session) is
# retried for up to 20 s, as a client would
chat() {
	_i=0
	while [ $_i -lt 100 ]; do
		_a=$(chat1 "$1") && [ -n "$_a" ] && { printf '%s\n' "$_a"; return 0; }
		sleep 0.2
		_i=$((_i + 1))
	done
	return 1
}
# rot FILE OFF: flips the byte at OFF, keeps size and mtime (to the nanosecond)
rot() {
	python3 - "$1" "$2" <<'PY'
import os, sys
p, off = sys.argv[1], int(sys.argv[2])
st = os.stat(p)
with open(p, "r+b") as f:
    f.seek(off)
    b = f.read(1)
    f.seek(off)
    f.write(bytes([b[0] ^ 0xFF]))
os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
PY
}
# the middle of the first range the slice holds (the header: every share holds it)
held_off() { awk 'NR == 2 { split($3, r, ":"); print int(r[1] + r[2] / 2); exit }' "$1.idx"; }
# same_held FILE: every range the slice's index names holds the model's bytes
same_held() {
	python3 - "$1" "$MODEL" <<'PY'
import sys
p, m = sys.argv[1], sys.argv[2]
a, b = open(p, "rb"), open(m, "rb")
lines = open(p + ".idx").read().split("\n")[1:]
ok = bool(lines and lines[0])
for line in lines:
    for r in line.split()[2:]:
        if "@" in r:
            continue
        off, n = map(int, r.split(":"))
        a.seek(off); b.seek(off)
        ok = ok and a.read(n) == b.read(n)
sys.exit(0 if ok else 1)
PY
}

start a "$PA" "$HA" --model "$MODEL"
start b "$PB" "$HB"
check "b fetches the model and the plan has 2 ranks" wait_ranks "$HA" 2
COPY=$(ls "$TMP"/b/models/*.slice 2>/dev/null | head -n 1)
check "b's slice is in its state directory" [ -n "$COPY" ] && same_held "$COPY"
EXPECT=$(chat "$HA")
check "the 2-rank cluster answers" [ -n "$EXPECT" ]

kill "$PID_b"
wait "$PID_b" 2>/dev/null
OFF=$(held_off "$COPY")
rot "$COPY" "$OFF"
check "the slice differs now" sh -c "! cmp -s -n $((OFF + 1)) '$COPY' '$MODEL'"
: >"$TMP/b.log"
SHOAL_MODEL_VERIFY_S=2 start b "$PB" "$HB"
check "b rejoins: 2 ranks" wait_ranks "$HA" 2
check "the rotten slice was caught at start" grep -q "changed on disk" "$TMP/b.log"
check "and fetched again" grep -q "model: fetching" "$TMP/b.log"
check "the slice equals the leader's file again" same_held "$COPY"
check "same answer after the re-fetch" [ "$(chat "$HA")" = "$EXPECT" ]

# the periodic re-check (every 2 s here) on a running node
: >"$TMP/b.log"
rot "$COPY" "$(held_off "$COPY")"
i=0
while [ $i -lt 100 ] && ! grep -q "changed on disk" "$TMP/b.log"; do sleep 0.1; i=$((i + 1)); done
check "the periodic re-check finds the rot" grep -q "changed on disk" "$TMP/b.log"
i=0
while [ $i -lt 150 ] && ! same_held "$COPY"; do sleep 0.1; i=$((i + 1)); done
check "the slice is fetched again" same_held "$COPY"
check "2 ranks again" wait_ranks "$HA" 2
check "same answer again" [ "$(chat "$HA")" = "$EXPECT" ]
done_tests
