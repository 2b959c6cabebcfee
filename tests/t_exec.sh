#!/bin/sh
# t_exec.sh: issue 17's `shoal agent --exec` end to end on simulated hosts (network namespaces,
# tests/netns.sh; needs root). The command is tests/mlx_rank.py, a stand-in for an MLX program.
#
#   A. 3 agents run it: on every node it finds its environment matching the plan files, the ring
#      forms over the hostfile addresses as MLX's ring backend forms it, and rank 0 serves an
#      OpenAI-style stream that a client reads through the leader's API (streamed, piece by
#      piece) and through a follower (redirect); /health, /metrics, /v1/cluster and `shoal status`
#      still answer. kill -9 of a follower's agent takes its program with it (no orphan), and the
#      survivors' programs restart with the new 2-rank plan, which the client then sees.
#   B. a command that exits at once: logged with its exit status and last output line, retried
#      with a growing backoff, never in a tight loop.
. tests/lib.sh

if [ "$(id -u)" -ne 0 ]; then
	skip "t_exec: needs root for network namespaces"
	done_tests
	exit $?
fi
for tool in ip avahi-daemon dbus-daemon dbus-send curl jq python3; do
	if ! command -v $tool >/dev/null 2>&1; then
		skip "t_exec: $tool not installed"
		done_tests
		exit $?
	fi
done
STORIES=$SHARED/models/stories260K.gguf
[ -f "$STORIES" ] || { skip "t_exec: $STORIES missing"; done_tests; exit $?; }

. tests/netns.sh
SHOAL=$(cd "$(dirname "$SHOAL")" && pwd)/$(basename "$SHOAL")
STORIES=$(cd "$(dirname "$STORIES")" && pwd)/$(basename "$STORIES")
PROG=$(pwd)/tests/mlx_rank.py
TOKEN="shoal-exec-test-$$-71c3"
OTHER="shoal-exec-lonely-$$-0b9e"

if ! ns_setup 4; then
	fail "netns setup (4 hosts)"
	done_tests
	exit 1
fi

state() { echo "$(ns_dir "$1")/state"; }
node_id() { cat "$(state "$1")/node_id" 2>/dev/null; }
start() { # start I TOKEN [ARGS...]
	_h=$1 _t=$2; shift 2
	ns_start "$_h" agent env SHOAL_TOKEN="$_t" "$SHOAL" agent --state-dir "$(state "$_h")" \
		--settle 0.5 --replan-delay 200 --model "$STORIES" "$@"
}
status_json() { ns_exec "$1" "$SHOAL" status --json --state-dir "$(state "$1")" 2>/dev/null; }
leader_host() {
	_l=$(status_json "$1" | jq -r .leader 2>/dev/null)
	for _h in 1 2 3; do [ "$(node_id $_h)" = "$_l" ] && { echo $_h; return 0; }; done
	return 1
}
url() { echo "http://$(ns_ip "$1"):8080$2"; }
plan_hash() { jq -r .hash "$(state "$1")/plan.json" 2>/dev/null; }
check_file() { echo "$(state "$1")/exec-check.json"; }
# program_ok HOST WORLD: the program on HOST checked its environment and formed a ring of WORLD
# ranks for the plan HOST holds now
program_ok() {
	_f=$(check_file "$1")
	[ -s "$_f" ] && [ "$(jq -r .world "$_f")" = "$2" ] && [ "$(jq -r .ok "$_f")" = true ] &&
		[ "$(jq -r .hash "$_f")" = "$(plan_hash "$1")" ]
}
# stream HOST OUT: a streamed chat completion through HOST's API into OUT (complete with [DONE])
stream() {
	ns_exec 4 curl -s -N -L --max-time 20 -H 'Content-Type: application/json' \
		-d '{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}' \
		"$(url "$1" /v1/chat/completions)" >"$2" 2>/dev/null
	grep -q '^data: \[DONE\]' "$2"
}
stream_text() { grep '^data: {' "$1" | sed 's/^data: //' | jq -j '.choices[0].delta.content // ""'; }

# ---- B (in the background of A): a command that exits at once, alone on host 4 -------------
start 4 "$OTHER" --exec 'echo "boom on rank $MLX_RANK"; exit 7' --exec-port 0 --http-port 8081

# ---- A. three ranks ----------------------------------------------------------------------------
for h in 1 2 3; do start $h "$TOKEN" --exec "python3 $PROG" --exec-port 18500; done
all_ok() { program_ok 1 "$1" && program_ok 2 "$1" && program_ok 3 "$1"; }
if ns_wait 40 all_ok 3; then
	pass
	L=$(leader_host 1)
	F=$((L % 3 + 1))
	# rank r saw the token "0,...,r"; rank 0 saw it come back as "0,1,2"
	rings_ok() { for _h in 1 2 3; do jq -e '(.ring | split(",") | map(tonumber)) == [range(0; if .rank == 0 then 3 else .rank + 1 end)]' "$(check_file $_h)" >/dev/null || return 1; done; }
	check "A: the token went around the ring 0,1,2" rings_ok
	check "A: rank 0 of the ring is the leader" [ "$(jq -r .rank "$(check_file "$L")")" = 0 ]
	check "A: hostfile.json is MLX's nested form, 3 rows" \
		jq -e 'length == 3 and all(.[]; type == "array" and length == 1)' "$(state "$L")/hostfile.json"
	check "A: mlx-hosts.json is the object form with the ring backend" \
		jq -e '.backend == "ring" and (.hosts | length) == 3' "$(state "$L")/mlx-hosts.json"
	if ns_wait 20 stream "$L" "$NS_ROOT/s1"; then
		pass
		check "A: the stream arrives through the leader in pieces" \
			[ "$(grep -c '^data: {' "$NS_ROOT/s1")" -gt 5 ]
	else
		fail "A: a streamed completion through the leader within 20 s"
		tail -n 5 "$(ns_dir "$L")/agent.log" >&2
	fi
	stream_text "$NS_ROOT/s1" >"$NS_ROOT/s1.txt" 2>/dev/null
	check "A: the streamed text names the 3-rank ring and the plan" \
		grep -q "ring of 3: 0,1,2 (plan $(plan_hash "$L"))" "$NS_ROOT/s1.txt"
	ns_exec 4 curl -s -L --max-time 10 -H 'Content-Type: application/json' \
		-d '{"model":"m","messages":[{"role":"user","content":"hi"}]}' \
		"$(url "$F" /v1/chat/completions)" >"$NS_ROOT/f.json" 2>/dev/null
	check "A: a follower redirects to the leader, which proxies (non-streaming)" \
		jq -e '.choices[0].message.content | startswith("ring of 3")' "$NS_ROOT/f.json"
	get() { ns_exec 4 curl -sf --max-time 5 "$(url "$1" "$2")"; }
	models_ok() { get "$L" /v1/models | jq -e '.data[0].id == "mlx-test"' >/dev/null; }
	metrics_ok() { get "$L" /metrics | grep -q '^shoal_'; }
	cluster_ok() { get "$L" /v1/cluster | jq -e '.members | length == 3' >/dev/null; }
	status_ok() { status_json "$L" | jq -e '.members | length == 3' >/dev/null; }
	health_ok() { [ "$(ns_exec 4 curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$(url "$L" /health)")" = 200 ]; }
	check "A: /v1/models comes from the command" models_ok
	check "A: the leader's /health is 200 once the command answers" health_ok
	check "A: /metrics still answers on the leader" metrics_ok
	check "A: /v1/cluster still answers on the leader" cluster_ok
	check "A: shoal status still answers" status_ok

	# kill -9 of a follower's agent: its program goes with it; the survivors restart with 2 ranks
	FPID=$(jq -r .pid "$(check_file "$F")")
	H1=$(plan_hash "$L")
	ns_kill "$F" agent KILL
	gone() { ! ns_pid_alive "$FPID"; }
	check "A: kill -9 of the agent takes its program with it (no orphan)" ns_wait 5 gone
	S=$((F % 3 + 1))
	[ "$S" = "$F" ] && S=$((S % 3 + 1))
	two_ok() { program_ok "$L" 2 && program_ok "$S" 2 && [ "$(plan_hash "$L")" != "$H1" ]; }
	if ns_wait 30 two_ok; then
		pass
		ns_wait 20 stream "$L" "$NS_ROOT/s2"
		stream_text "$NS_ROOT/s2" >"$NS_ROOT/s2.txt" 2>/dev/null
		check "A: after kill -9, the client sees the new 2-rank ring" \
			grep -q "ring of 2: 0,1 (plan $(plan_hash "$L"))" "$NS_ROOT/s2.txt"
		check "A: the restart was logged" grep -q 'exec: stopping rank .*a new plan\|exec: stopping rank .*no longer in force' "$(ns_dir "$L")/agent.log"
	else
		fail "A: the survivors' programs run the 2-rank plan within 30 s"
		tail -n 8 "$(ns_dir "$L")/agent.log" >&2
	fi
else
	fail "A: the program checks its environment and forms a 3-rank ring on every node within 40 s"
	for h in 1 2 3; do tail -n 4 "$(ns_dir $h)/agent.log" >&2; done
fi

# ---- B. the verdicts ---------------------------------------------------------------------------
LOG4=$(ns_dir 4)/agent.log
# the third failure announces a 4 s wait: about 3 s after the first start (A may end sooner)
ns_wait 20 grep -q 'retrying in 4000 ms' "$LOG4"
check "B: the exit status is reported" grep -q "command ended after .* ms with exit status 7" "$LOG4"
check "B: with its last output" grep -q 'exec:   | boom on rank 0' "$LOG4"
starts=$(grep -c 'exec: started rank' "$LOG4")
up=$(($(ns_now_ms) - $(stat -c %Y "$(ns_dir 4)/agent.pid")000))
# backoff 1, 2, 4, 8... s: within T seconds at most log2(T) + 2 starts; a tight loop makes hundreds
check "B: retried with backoff, not in a tight loop ($starts starts in ${up} ms)" \
	[ "$starts" -ge 2 -a "$starts" -le $((2 + up / 4000 + 3)) ]
check "B: the retry delays grow" grep -q 'retrying in 4000 ms' "$LOG4"

for h in 1 2 3 4; do ns_kill $h agent TERM 2>/dev/null; done
progs_gone() { ! pgrep -f "$PROG" >/dev/null; }
check "the programs are gone after the agents stop" ns_wait 5 progs_gone
done_tests
