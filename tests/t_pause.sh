#!/bin/sh
# t_pause.sh: issue 14 item 1 and issue 19's stalled rank, in network namespaces (needs root).
# 3 agents serve a generated model; then, each a separate phase:
#   L. SIGSTOP of the leader for PAUSE seconds (default 3), SIGCONT: within 5 s every node agrees
#      on one leader and one plan, and a completion succeeds through every node
#   F. the same for a follower; during its pause the cluster serves again within step timeout
#      + 2 s on the two other nodes, and /health on the paused node's old leader tells the truth
# SHOAL_SOAK=1 repeats the leader case 10 times (3 s); SHOAL_PAUSES="3 10 30" picks the lengths.
. tests/lib.sh

if [ "$(id -u)" -ne 0 ]; then
	skip "t_pause: needs root for network namespaces"
	done_tests
	exit $?
fi
for tool in ip avahi-daemon dbus-daemon curl jq unshare; do
	if ! command -v $tool >/dev/null 2>&1; then
		skip "t_pause: $tool not installed"
		done_tests
		exit $?
	fi
done

. tests/netns.sh
SHOAL=$(cd "$(dirname "$SHOAL")" && pwd)/$(basename "$SHOAL")
TOKEN="shoal-pause-test-$$-77aa"
PROMPT="Once upon a time"
STEP_MS=2000
PAUSES=${SHOAL_PAUSES:-3}
RUNS=1
[ -n "$SHOAL_SOAK" ] && RUNS=10

if ! ns_setup 4; then
	fail "netns setup (4 hosts)"
	done_tests
	exit 1
fi
TMP=$NS_ROOT/t
mkdir -p "$TMP"
GEN=$TMP/gen.gguf
"$SHOAL" mkmodel --dim 128 --layers 4 --heads 4 --kv-heads 2 --ffn 384 --vocab 512 --seed 5 \
	-o "$GEN" >/dev/null 2>&1 || fail "mkmodel"

state() { echo "$(ns_dir "$1")/state"; }
node_id() { cat "$(state "$1")/node_id" 2>/dev/null; }
start() {
	ns_start "$1" agent env SHOAL_TOKEN="$TOKEN" "$SHOAL" agent --state-dir "$(state "$1")" \
		--settle 0.5 --step-timeout "$STEP_MS" --model "$GEN"
}
stop_all() {
	for _h in 1 2 3; do
		kill -CONT "$(ns_pid $_h agent)" 2>/dev/null
		ns_kill $_h agent TERM 2>/dev/null
	done
	return 0
}
status_json() { ns_exec "$1" "$SHOAL" status --json --state-dir "$(state "$1")" 2>/dev/null; }
leader_of() { status_json "$1" | jq -r .leader 2>/dev/null; }
leader_host() {
	_l=$(leader_of "$1")
	for _h in 1 2 3; do [ "$(node_id $_h)" = "$_l" ] && { echo $_h; return 0; }; done
	return 1
}
url() { echo "http://$(ns_ip "$1"):8080$2"; }
health() { [ "$(ns_exec 4 curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$(url "$1" /health)")" = 200 ]; }
# complete HOST: one completion through HOST's API (following a redirect) succeeds
complete() {
	_c=$(ns_exec 4 curl -s -L -o "$TMP/c.json" -w '%{http_code}' --max-time 20 \
		-H 'Content-Type: application/json' \
		-d "{\"prompt\":\"$PROMPT\",\"max_tokens\":8,\"temperature\":0}" "$(url "$1" /v1/completions)")
	[ "$_c" = 200 ] && jq -e '.choices[0].text' "$TMP/c.json" >/dev/null 2>&1
}
# cluster_of HOST: "LEADER PLAN RANKS" from HOST's /v1/cluster (one request)
cluster_of() {
	ns_exec 4 curl -s --max-time 2 "$(url "$1" /v1/cluster)" |
		jq -r '"\(.leader) \(.plan.hash // "-") \(.plan.ranks // 0)"' 2>/dev/null
}
# agree HOSTS...: every host names the same leader and the same plan, with that many ranks, and a
# completion through the first host succeeds
agree() {
	_c=$(cluster_of "$1")
	case "$_c" in null*|*" - "*|"") return 1 ;; esac
	[ "${_c##* }" = $# ] || return 1
	for _h in "$@"; do [ "$(cluster_of "$_h")" = "$_c" ] || return 1; done
	complete "$1"
}
# serves_all HOSTS...: a completion through every host succeeds
serves_all() { for _h in "$@"; do complete "$_h" || return 1; done; }

for h in 1 2 3; do start $h; done
if ! ns_wait 40 agree 1 2 3; then
	fail "3 agents serve within 40 s"
	tail -n 8 "$(ns_dir 1)/agent.log" >&2
	stop_all
	done_tests
	exit $?
fi
pass

# pause WHO SECONDS: SIGSTOP of the leader or a follower, SIGCONT after SECONDS; the checks above
pause() {
	_who=$1 _s=$2
	_L=$(leader_host 1)
	_V=$_L
	[ "$_who" = follower ] && _V=$((_L % 3 + 1))
	_o1=$((_V % 3 + 1)) _o2=$(((_V + 1) % 3 + 1))
	_pid=$(ns_pid "$_V" agent)
	kill -STOP "$_pid" # not ns_kill: it waits for the process to end
	_t0=$(ns_now_ms)
	if [ "$_who" = follower ] && [ "$_s" -ge 5 ]; then
		if ns_wait $((STEP_MS / 1000 + 2)) agree $_o1 $_o2; then
			pass
			echo "  $_who paused: the others serve again after $(($(ns_now_ms) - _t0)) ms" >&2
		else
			fail "$_who paused $_s s: hosts $_o1 $_o2 serve again within step timeout + 2 s"
		fi
	fi
	_left=$((_s * 1000 - ($(ns_now_ms) - _t0)))
	[ $_left -gt 0 ] && sleep "$(echo "$_left" | awk '{printf "%.3f", $1 / 1000}')"
	kill -CONT "$_pid"
	_t1=$(ns_now_ms)
	if ns_wait 5 agree 1 2 3; then
		pass
		echo "  $_who paused $_s s: all agree and serve $(($(ns_now_ms) - _t1)) ms after SIGCONT" >&2
		check "$_who paused $_s s: completions through every node succeed" serves_all 1 2 3
	else
		fail "$_who paused $_s s: within 5 s after SIGCONT all 3 agree on one leader and plan and serve"
		for _h in 1 2 3; do echo "  host $_h: $(cluster_of $_h)" >&2; done
		[ -n "$SHOAL_KEEP_LOGS" ] && for _h in 1 2 3; do cp "$(ns_dir $_h)/agent.log" "$SHOAL_KEEP_LOGS/h$_h.log"; done
		ns_wait 30 agree 1 2 3 || { fail "$_who paused $_s s: not even after 35 s"; return 1; }
	fi
}

for s in $PAUSES; do
	r=0
	while [ $r -lt $RUNS ]; do
		pause leader "$s" || break
		r=$((r + 1))
	done
done
pause follower "${SHOAL_FOLLOWER_PAUSE:-6}"
[ -n "$SHOAL_KEEP_LOGS" ] && for _h in 1 2 3; do cp "$(ns_dir $_h)/agent.log" "$SHOAL_KEEP_LOGS/h$_h.log"; done
stop_all
done_tests
