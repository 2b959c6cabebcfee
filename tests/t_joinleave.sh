#!/bin/sh
# t_joinleave.sh: issue 28's "200 sequential requests across 5 join/leave cycles: 0 failures",
# with real agents on simulated hosts (network namespaces, tests/netns.sh; needs root). 3 agents
# serve a generated model; a client host sends 200 greedy requests one after another to the
# leader while a follower leaves (SIGTERM) and joins again (started anew) five times. Every
# request must end with 200: a request that arrives during a re-plan waits for the next plan
# (web_replan_hold), one in flight goes on on it (sched.c's resume).
. tests/lib.sh
. tests/netns.sh
if ! ns_require t_joinleave; then
	done_tests
	exit $?
fi
SHOAL=$(cd "$(dirname "$SHOAL")" && pwd)/$(basename "$SHOAL")
TOKEN="shoal-joinleave-test-$$-5c2e"
if ! ns_setup 4; then
	fail "netns setup (4 hosts)"
	done_tests
	exit 1
fi
TMP=$NS_ROOT/t
mkdir -p "$TMP"
GEN=$TMP/gen.gguf
"$SHOAL" mkmodel --dim 256 --layers 4 --heads 8 --kv-heads 4 --ffn 768 --vocab 512 --seed 3 \
	-o "$GEN" >/dev/null 2>&1 || fail "mkmodel"

state() { echo "$(ns_dir "$1")/state"; }
node_id() { cat "$(state "$1")/node_id" 2>/dev/null; }
start() {
	ns_start "$1" agent env SHOAL_TOKEN="$TOKEN" "$SHOAL" agent --state-dir "$(state "$1")" \
		--settle 0.5 --model "$GEN" --threads 1 --peer "$(ns_ip 1):7411" \
		--peer "$(ns_ip 2):7411" --peer "$(ns_ip 3):7411"
}
leader_host() {
	_l=$(ns_exec "$1" "$SHOAL" status --json --state-dir "$(state "$1")" 2>/dev/null |
		jq -r .leader 2>/dev/null)
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

for h in 1 2 3; do start $h; done
if ! ns_wait 40 serving_with 1 3; then
	fail "3 agents serve within 40 s"
	tail -n 5 "$(ns_dir 1)/agent.log" >&2
	done_tests
	exit 1
fi
L=$(leader_host 1)
F=$((L % 3 + 1))

# the client: 200 requests in a row, a pause between them so they span the five cycles (about a
# minute); each line of its output is one request's HTTP status
URL="http://$(ns_ip "$L"):8080/v1/completions"
ns_exec 4 sh -c '
	i=0
	while [ $i -lt 200 ]; do
		i=$((i + 1))
		curl -s -o /dev/null -w "%{http_code}\n" --max-time 120 \
			-H "Content-Type: application/json" \
			-d "{\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"temperature\":0}" "$1"
		sleep 0.3
	done' sh "$URL" >"$TMP/codes" 2>&1 &
CPID=$!

# five cycles: the follower leaves, the plan shrinks to 2 ranks, it joins again, back to 3
cycles=0
for c in 1 2 3 4 5; do
	ns_kill "$F" agent TERM
	ns_wait 30 serving_with "$L" 2 || echo "  cycle $c: no 2-rank plan within 30 s" >&2
	start "$F"
	if ns_wait 40 serving_with "$L" 3; then
		cycles=$((cycles + 1))
	else
		echo "  cycle $c: no 3-rank plan within 40 s" >&2
	fi
done
wait $CPID
n=$(grep -c . "$TMP/codes")
ok=$(grep -cx 200 "$TMP/codes")
echo "  $cycles join/leave cycles; $ok of $n requests answered 200" >&2
grep -vx 200 "$TMP/codes" | sort | uniq -c | sed 's/^/  other: /' >&2
check "5 leave/join cycles ran during the requests" [ "$cycles" = 5 ]
all_ok() { [ "$n" = 200 ] && [ "$ok" = 200 ]; }
check "200 sequential requests across them: 0 failures ($ok of $n)" all_ok
[ "$T_FAIL" -gt 0 ] && tail -n 30 "$(ns_dir "$L")/agent.log" >&2
for h in 1 2 3; do ns_kill $h agent TERM 2>/dev/null; done
done_tests
