#!/bin/sh
# t_model_verify.sh: a cached model copy that rots on disk is caught (issue 14), on loopback
# (static peers, no root):
# - node a has --model, node b has none and fetches a's file into b/models/HASH.gguf;
# - b stops; one byte of its copy is flipped and the copy's mtime restored (the size-and-mtime
#   hash cache would trust it); b starts again: it re-reads every byte before serving, deletes the
#   copy, fetches it again (byte-identical to a's), rejoins the plan, answers as before;
# - with SHOAL_MODEL_VERIFY_S=2, the copy rots again while b runs: the periodic re-check finds it
#   within seconds, deletes it, fetches it again, and the cluster serves 2 ranks again.
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
chat() {
	curl -sL "http://127.0.0.1:$1/v1/chat/completions" -H 'Content-Type: application/json' \
		-d '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":24,"temperature":0}' |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])'
}
# rot FILE: flips one byte in the middle, keeps size and mtime (to the nanosecond)
rot() {
	python3 - "$1" <<'PY'
import os, sys
p = sys.argv[1]
st = os.stat(p)
with open(p, "r+b") as f:
    f.seek(st.st_size // 2)
    b = f.read(1)
    f.seek(st.st_size // 2)
    f.write(bytes([b[0] ^ 0xFF]))
os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
PY
}

start a "$PA" "$HA" --model "$MODEL"
start b "$PB" "$HB"
check "b fetches the model and the plan has 2 ranks" wait_ranks "$HA" 2
COPY=$(ls "$TMP"/b/models/*.gguf 2>/dev/null | head -n 1)
check "b's copy is in its state directory" [ -n "$COPY" ] && cmp -s "$COPY" "$MODEL"
EXPECT=$(chat "$HA")
check "the 2-rank cluster answers" [ -n "$EXPECT" ]

kill "$PID_b"
wait "$PID_b" 2>/dev/null
rot "$COPY"
check "the copy differs now, same size" sh -c "! cmp -s '$COPY' '$MODEL' && [ $(wc -c <"$MODEL") = \$(wc -c <'$COPY') ]"
: >"$TMP/b.log"
SHOAL_MODEL_VERIFY_S=2 start b "$PB" "$HB"
check "b rejoins: 2 ranks" wait_ranks "$HA" 2
check "the rotten copy was caught at start" grep -q "does not match its name" "$TMP/b.log"
check "and fetched again" grep -q "model: fetching" "$TMP/b.log"
check "the copy equals the leader's file again" cmp -s "$COPY" "$MODEL"
check "same answer after the re-fetch" [ "$(chat "$HA")" = "$EXPECT" ]

# the periodic re-check (every 2 s here) on a running node
rot "$COPY"
i=0
while [ $i -lt 100 ] && ! grep -q "changed on disk" "$TMP/b.log"; do sleep 0.1; i=$((i + 1)); done
check "the periodic re-check finds the rot" grep -q "changed on disk" "$TMP/b.log"
i=0
while [ $i -lt 150 ] && ! cmp -s "$COPY" "$MODEL"; do sleep 0.1; i=$((i + 1)); done
check "the copy is fetched again" cmp -s "$COPY" "$MODEL"
check "2 ranks again" wait_ranks "$HA" 2
check "same answer again" [ "$(chat "$HA")" = "$EXPECT" ]
done_tests
