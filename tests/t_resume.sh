#!/bin/sh
# t_resume.sh: issue 28's acceptance, no request lost in a re-plan, with real agents on simulated
# hosts (network namespaces, tests/netns.sh; needs root). 3 agents serve a generated model; a
# client host runs 4 concurrent greedy streams of 160 tokens (480 in B; tests/resume_streams.py)
# to the leader and
#   A. a follower is killed with -9 mid-stream: 4 of 4 streams end normally (finish "length",
#      all their tokens in the usage, [DONE], no error event), resumed on the 2-rank plan;
#   B. that node is started again while 4 new streams run: the plan grows back to 3 ranks under
#      them and 4 of 4 complete;
#   C. on the 3-rank plan, 4 identical greedy requests sent together give the text of the request
#      alone.
# --peer beside mDNS: a restarted node is dialed at once (mDNS finds it only seconds later).
# The leader's log says each stream went on ("goes on after N tokens (paused MS ms)", sched.c).
. tests/lib.sh

if [ "$(id -u)" -ne 0 ]; then
	skip "t_resume: needs root for network namespaces"
	done_tests
	exit $?
fi
for tool in ip avahi-daemon dbus-daemon dbus-send curl jq unshare python3; do
	if ! command -v $tool >/dev/null 2>&1; then
		skip "t_resume: $tool not installed"
		done_tests
		exit $?
	fi
done
. tests/netns.sh
SHOAL=$(cd "$(dirname "$SHOAL")" && pwd)/$(basename "$SHOAL")
TOKEN="shoal-resume-test-$$-77a1"
if ! ns_setup 4; then
	fail "netns setup (4 hosts)"
	done_tests
	exit 1
fi
TMP=$NS_ROOT/t
mkdir -p "$TMP"
GEN=$TMP/gen.gguf
"$SHOAL" mkmodel --dim 512 --layers 16 --heads 8 --kv-heads 4 --ffn 1536 --vocab 1024 --seed 1 \
	-o "$GEN" >/dev/null 2>&1 || fail "mkmodel"

state() { echo "$(ns_dir "$1")/state"; }
node_id() { cat "$(state "$1")/node_id" 2>/dev/null; }
start() {
	ns_start "$1" agent env SHOAL_TOKEN="$TOKEN" "$SHOAL" agent --state-dir "$(state "$1")" \
		--settle 0.5 --model "$GEN" --threads 1 --parallel 4 --peer "$(ns_ip 1):7411" \
		--peer "$(ns_ip 2):7411" --peer "$(ns_ip 3):7411"
}
status_json() { ns_exec "$1" "$SHOAL" status --json --state-dir "$(state "$1")" 2>/dev/null; }
leader_host() {
	_l=$(status_json "$1" | jq -r .leader 2>/dev/null)
	for _h in 1 2 3; do [ "$(node_id $_h)" = "$_l" ] && { echo $_h; return 0; }; done
	return 1
}
health() {
	[ "$(ns_exec 4 curl -s -o /dev/null -w '%{http_code}' --max-time 2 \
		"http://$(ns_ip "$1"):8080/health")" = 200 ]
}
plan_ranks() { jq '.ranks | length' "$(state "$1")/plan.json" 2>/dev/null; }
serving_with() { # ALIVE N
	_lh=$(leader_host "$1") || return 1
	health "$_lh" && [ "$(plan_ranks "$_lh")" = "$2" ]
}
resumed() { grep -c 'goes on after' "$(ns_dir "$1")/agent.log"; }
# streams LEADER OUT [READY_CHUNKS [TOKENS]]: 4 streams of TOKENS (default 160) in the
# background (client host 4); $TMP/ready appears once each has READY_CHUNKS chunks (default 8)
streams() {
	NTOK=${4:-160}
	rm -f "$TMP/ready"
	ns_exec 4 python3 tests/resume_streams.py "http://$(ns_ip "$1"):8080" 4 "$NTOK" \
		"$TMP/ready" "${3:-8}" >"$2" 2>"$2.err" &
	SPID=$!
}
outcome() { # WHAT OUT
	wait $SPID
	sed 's/^/  /' "$2" >&2
	check "$1: 4 of 4 streams end normally (length, $NTOK tokens, no error event)" \
		grep -qx 'ok 4' "$2"
}

for h in 1 2 3; do start $h; done
if ! ns_wait 40 serving_with 1 3; then
	fail "3 agents serve within 40 s"
	tail -n 5 "$(ns_dir 1)/agent.log" >&2
	done_tests
	exit 1
fi
L=$(leader_host 1)
F=$((L % 3 + 1))

# A. a follower killed with -9 mid-stream
before=$(resumed "$L")
streams "$L" "$TMP/a.out"
ns_wait 60 test -e "$TMP/ready" || fail "A: the streams started"
ns_kill "$F" agent KILL
outcome "A: follower killed" "$TMP/a.out"
check "A: the leader resumed them (its log)" [ "$(resumed "$L")" -ge $((before + 4)) ]
check "A: 2 ranks serve" ns_wait 30 serving_with "$L" 2

# B. the node restarted while 4 new streams run: it starts cut off from the switch (its port
# down), the streams start, and its port comes up once each has its first chunk: it joins
# within the 2 s of a --peer retry, the re-plan follows half a second later, while the streams
# run (480 tokens: with 160, about 5 s, the join came after them in some runs, and B's resume
# check was skipped)
before=$(resumed "$L")
ip -n "${NS_PFX}sw" link set "${NS_PFX}p$F" down
start "$F"
ns_wait 30 grep -q 'agent: control port' "$(ns_dir "$F")/agent.log" || fail "B: the node restarts"
streams "$L" "$TMP/b.out" 1 480
ns_wait 60 test -e "$TMP/ready" || fail "B: the streams started"
ip -n "${NS_PFX}sw" link set "${NS_PFX}p$F" up
outcome "B: node restarted" "$TMP/b.out"
check "B: 3 ranks serve again" ns_wait 30 serving_with "$L" 3
if [ "$(resumed "$L")" -ge $((before + 4)) ]; then
	pass
else
	echo "  B: the join came after the streams ended (no re-plan under them)" >&2
	skip "B: the re-plan did not meet the streams"
fi
# C. the same greedy request gives the same text under load on the 3-rank plan: alone, then 4
# copies sent together (issue 28's deterministic batches, over the real transport)
complete() { # OUT
	ns_exec 4 curl -s --max-time 120 -H 'Content-Type: application/json' \
		-d '{"prompt":"Once upon a time","max_tokens":64,"temperature":0,"ignore_eos":true}' \
		"http://$(ns_ip "$L"):8080/v1/completions" | jq -j '.choices[0].text' >"$1" 2>/dev/null
}
if ns_wait 30 serving_with "$L" 3; then
	complete "$TMP/alone"
	CP=""
	for k in 1 2 3 4; do
		complete "$TMP/c$k" &
		CP="$CP $!"
	done
	for p in $CP; do wait "$p"; done # (not a bare wait: the agents are children too)
	same=0
	for k in 1 2 3 4; do [ -s "$TMP/alone" ] && cmp -s "$TMP/alone" "$TMP/c$k" && same=$((same + 1)); done
	check "C: 4 identical concurrent greedy requests on 3 ranks equal the request alone ($same of 4)" \
		[ $same = 4 ]
else
	fail "C: 3 ranks serve"
fi
grep -h 'goes on after' "$(ns_dir "$L")/agent.log" | sed 's/^/  /' >&2
[ "$T_FAIL" -gt 0 ] && tail -n 30 "$(ns_dir "$L")/agent.log" >&2
[ -n "$KEEPLOG" ] && cat "$(ns_dir "$L")/agent.log" "$(ns_dir "$F")/agent.log" >&2
for h in 1 2 3; do ns_kill $h agent TERM 2>/dev/null; done
done_tests
