#!/bin/sh
# t_replan_503.sh: completions sent while the cluster loses a rank get 200 or 503 with
# Retry-After, never 500 (issue 14): two agents on loopback (static peers, no root, a 400 ms step
# timeout), three clients sending completions back to back to the leader, and
# - the follower (rank 1) paused for 1 s (SIGSTOP, shorter than the 1.5 s that drops a member):
#   the step times out, the leader's session ends on that 503 (web_opts.engine_lost) and it
#   re-plans with both nodes; served 200 again after;
# - then the follower killed with SIGKILL: the leader re-plans alone and serves 200 again.
# Helper: tests/replan_requests.py.
. tests/lib.sh

MODEL=$SHARED/models/stories260K.gguf
[ -f "$MODEL" ] || { skip "t_replan_503: no $MODEL"; done_tests; exit; }
command -v python3 >/dev/null || { skip "t_replan_503: no python3"; done_tests; exit; }
TMP=$(mktemp -d)
BASE=$((20000 + ($$ % 120) * 100 + 41))
PA=$BASE PB=$((BASE + 20)) HA=$((BASE + 10)) HB=$((BASE + 30))
PIDS=""
cleanup() {
	for p in $PIDS; do kill "$p" 2>/dev/null; done
	for p in $PIDS; do wait "$p" 2>/dev/null; done
	[ "$T_FAIL" -gt 0 ] && tail -n 30 "$TMP"/*.log >&2
	[ -n "$KEEPLOG" ] && cat "$TMP"/*.log >&2
	rm -rf "$TMP"
}
trap cleanup EXIT
start() { # name port http-port
	"$SHOAL" agent --token replan-test --model "$MODEL" --state-dir "$TMP/$1" --port "$2" \
		--http-port "$3" --no-mdns --peer "127.0.0.1:$PA" --peer "127.0.0.1:$PB" --expect 2 \
		--threads 1 --replan-delay 200 --step-timeout 400 >"$TMP/$1.log" 2>&1 &
	PIDS="$PIDS $!"
	eval "PID_$1=$!"
}
wait_ranks() { # http-port n
	i=0
	while [ $i -lt 200 ]; do
		curl -s "http://127.0.0.1:$1/v1/cluster" | grep -q "\"ranks\":$2," && \
			curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
		sleep 0.1
		i=$((i + 1))
	done
	return 1
}
start a "$PA" "$HA"
start b "$PB" "$HB"
check "two ranks serve" wait_ranks "$HA" 2
LEADER_HTTP=$(curl -s "http://127.0.0.1:$HA/v1/cluster" | python3 -c '
import json,sys
d=json.load(sys.stdin)
print([m["addr"].rsplit(":",1)[1] for m in d["members"] if m["id"]==d["leader"]][0])')
if [ "$LEADER_HTTP" = "$HA" ]; then VICTIM=$PID_b; else VICTIM=$PID_a; fi

val() { sed -n "s/^$1 //p" "$TMP/out"; }
outcome() { # what
	sed 's/^/  /' "$TMP/out" >&2
	check "$1: no status other than 200 and 503" \
		sh -c "! grep '^status_' '$TMP/out' | grep -v -e '^status_200 ' -e '^status_503 '"
	check "$1: every 503 carries Retry-After" [ "$(val no_retry_after)" = 0 ]
	check "$1: every request got an HTTP answer" [ "$(val other)" = 0 ]
	check "$1: served" [ "$(val status_200)" -gt 0 ]
	check "$1: served again after" [ "$(val ok_after_kill)" -gt 0 ]
}
python3 tests/replan_requests.py "$LEADER_HTTP" 9 "$VICTIM" 1.5 stop:1 >"$TMP/out" 2>"$TMP/err"
outcome "follower paused 1 s"
check "follower paused: the leader's session ended on the broken group" \
	sh -c "grep -Eq 'the group broke|group is broken' '$TMP'/*.log"
check "follower paused: both ranks serve again" wait_ranks "$LEADER_HTTP" 2
python3 tests/replan_requests.py "$LEADER_HTTP" 10 "$VICTIM" 2 >"$TMP/out" 2>"$TMP/err"
outcome "follower killed"
done_tests
