#!/bin/sh
# Discovery and election across simulated hosts (network namespaces, each with its own dbus and
# avahi-daemon; tests/netns.sh); part 0 (the CLI) runs without root, the rest needs root.
# Measured figures go to stderr as "measure: ...";
# nothing asserts on timing beyond generous deadlines.
#
#   1. 3 agents agree on the leader (smallest ID), the member list and the epoch
#   2. a 4th agent with another token is never a member; the others log the failed handshake
#   3. kill -9 of the leader: the survivors agree on the next smallest; it rejoins when restarted
#   4. kill -9 of a follower: it leaves every view
#   5. avahi-daemon restart on one host: it re-publishes, re-browses, and a newcomer joins it
#   6. a copied state directory (same node ID twice) is reported on both nodes; a copy that
#      reaches a member first is refused (the holder's channel is alive) and told, and stands down
#   7. 20 runs with random start delays give exactly one leader each time
#   8. the token is in no TXT record and in no packet of the whole capture
. tests/lib.sh

# ---- 0. the CLI, without root or network namespaces ------------------------------------------
$SHOAL agent --help >/dev/null; rc=$?
check "agent --help exits 0" [ $rc -eq 0 ]
SHOAL_TOKEN= $SHOAL agent --state-dir /nonexistent 2>/dev/null; rc=$?
check "agent without a token is a usage error" [ $rc -eq 2 ]
$SHOAL agent --token x --peer nope 2>/dev/null; rc=$?
check "agent with a bad --peer is a usage error" [ $rc -eq 2 ]
$SHOAL agent --token x --settle soon 2>/dev/null; rc=$?
check "agent with a bad --settle is a usage error" [ $rc -eq 2 ]
tmp=$(mktemp -d)
$SHOAL status --state-dir "$tmp" 2>"$tmp/err"; rc=$?
check "status without an agent fails with a message" sh -c "[ $rc -eq 1 ] && grep -q 'no agent answers' '$tmp/err'"
printf 'file-token\n' >"$tmp/token"
$SHOAL agent --token-file "$tmp/token" --no-mdns --port 0 --state-dir "$tmp/s" >"$tmp/log" 2>&1 &
apid=$!
lone_leader() { $SHOAL status --json --state-dir "$tmp/s" 2>/dev/null | grep -q '"election":"leader"'; }
deadline=$(($(date +%s) + 15))
while ! lone_leader && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.1; done
check "a lone agent (static peers only) leads itself" lone_leader
check "its node ID is 32 hex digits in the state dir" grep -Eqx '[0-9a-f]{32}' "$tmp/s/node_id"
check "status prints the member table" sh -c "$SHOAL status --state-dir '$tmp/s' | grep -q 'leader (this node)'"
$SHOAL agent --token-file "$tmp/token" --no-mdns --port 0 --state-dir "$tmp/s" 2>"$tmp/err2"; rc=$?
check "a second agent on the same state dir refuses to start" sh -c "[ $rc -eq 1 ] && grep -q 'another agent' '$tmp/err2'"
kill -TERM $apid; wait $apid; rc=$?
check "the agent exits 0 on SIGTERM" [ $rc -eq 0 ]
check "and removes its status socket" [ ! -e "$tmp/s/agent.sock" ]
check "the token file's content is never logged" sh -c "! grep -q file-token '$tmp/log'"
rm -rf "$tmp"

if [ "$(id -u)" -ne 0 ]; then
	skip "t_discovery: needs root for network namespaces"
	done_tests
	exit $?
fi
for tool in ip avahi-daemon dbus-daemon dbus-send avahi-browse tcpdump unshare; do
	if ! command -v $tool >/dev/null 2>&1; then
		skip "t_discovery: $tool not installed (scripts/install-deps.sh)"
		done_tests
		exit $?
	fi
done

. tests/netns.sh

TOKEN="shoal-test-token-$$-9f3c2a"
OTHER="another-token-$$-7b1e"
SHOAL=$(cd "$(dirname "$SHOAL")" && pwd)/$(basename "$SHOAL")
measure() { echo "measure: $*" >&2; }

if ! ns_setup 4; then
	fail "netns setup (4 hosts)"
	done_tests
	exit 1
fi
# hosts 1 and 2 also share a second network: each must see the other on both interfaces
ns_net2_add 1 && ns_net2_add 2 || fail "second network for hosts 1 and 2"
PCAP=$NS_ROOT/capture.pcap
ns_capture_start "$PCAP" || fail "tcpdump on the bridge did not start"

state() { echo "$(ns_dir "$1")/state"; }
node_id() { cat "$(state "$1")/node_id" 2>/dev/null; }

# start_agent I [ARGS...]: an agent on host I with the test token and host I's state dir.
start_agent() {
	_h=$1; shift
	ns_start "$_h" agent env SHOAL_TOKEN="$TOKEN" "$SHOAL" agent --state-dir "$(state "$_h")" "$@"
}

status_json() { ns_exec "$1" "$SHOAL" status --json --state-dir "$(state "$1")" 2>/dev/null; }

# sig I: "leader|epoch|sorted member IDs" as host I sees it.
sig() {
	_j=$(status_json "$1") || return 1
	_l=$(echo "$_j" | sed -n 's/.*"leader":"\([0-9a-f]*\)".*/\1/p')
	_e=$(echo "$_j" | sed -n 's/.*"epoch":\([0-9]*\).*/\1/p')
	_m=$(echo "$_j" | sed 's/.*"members":\[//' | grep -o '"node_id":"[0-9a-f]*"' | cut -d'"' -f4 |
		sort | tr '\n' ' ')
	echo "$_l|$_e|$_m"
}

# agree HOSTS...: every host sees the same leader, epoch and members, the members are exactly
# these hosts' node IDs, and the leader is the smallest of them.
agree() {
	_want=$(for _h in "$@"; do node_id "$_h"; echo; done | grep . | sort | tr '\n' ' ')
	_first=
	for _h in "$@"; do
		_s=$(sig "$_h") || return 1
		[ -n "$_first" ] || _first=$_s
		[ "$_s" = "$_first" ] || return 1
	done
	_l=${_first%%|*}
	[ -n "$_l" ] && [ "${_first##*|}" = "$_want" ] || return 1
	[ "$_l" = "$(echo "$_want" | tr ' ' '\n' | grep . | head -n 1)" ]
}

# leaders HOSTS...: how many of these hosts say they are the leader.
leaders() {
	_c=0
	for _h in "$@"; do
		status_json "$_h" | grep -q '"election":"leader"' && _c=$((_c + 1))
	done
	echo $_c
}

host_of_id() {
	for _h in 1 2 3 4; do [ "$(node_id "$_h")" = "$1" ] && echo "$_h" && return 0; done
	return 1
}

leader_host() { host_of_id "$(sig "$1" | cut -d'|' -f1)"; }

# Sanitizer reports in agent logs (under make test-asan; agents stopped with TERM run LeakSanitizer).
SAN_REPORTS=0
scan_sanitizer() {
	for _f in "$NS_ROOT"/h*/agent.log; do
		[ -f "$_f" ] || continue
		if grep -q -E "ERROR: (Address|Leak)Sanitizer|runtime error:" "$_f"; then
			SAN_REPORTS=$((SAN_REPORTS + 1))
			grep -E -A12 "ERROR: (Address|Leak)Sanitizer|runtime error:" "$_f" | head -n 40 >&2
		fi
	done
}

dump_logs() {
	for _h in "$@"; do
		echo "--- host $_h agent log" >&2
		tail -n 25 "$(ns_dir "$_h")/agent.log" >&2
	done
}

# ---- 1. three agents agree ----------------------------------------------------------------------
# host 1 also names itself and host 2 as static peers: its own address must be skipped, and the
# second channel to host 2 (static + mDNS) must collapse into one
start_agent 1 --peer "$(ns_ip 1):7411" --peer "$(ns_ip 2):7411"
start_agent 2
start_agent 3
t_last=$(ns_now_ms)
if ns_wait 20 agree 1 2 3; then
	pass
	measure "3 agents: last start -> agreement on leader and members: $(($(ns_now_ms) - t_last)) ms (settle 1 s, includes Argon2id and mDNS)"
else
	fail "3 agents agree on leader, epoch and members"
	dump_logs 1 2 3
fi
check "exactly one of 3 says it leads" [ "$(leaders 1 2 3)" -eq 1 ]
check "a --peer naming the node itself is skipped" grep -q "is this node; skipping" "$(ns_dir 1)/agent.log"
check "and is not taken for a duplicate" sh -c "! grep -q 'duplicate node ID' '$(ns_dir 1)/agent.log'"
ns_exec 1 "$SHOAL" status --state-dir "$(state 1)" >&2
two_ifaces() {
	status_json 1 | grep -o '"addresses":\[[^]]*\]' | grep "10.78.0.2" | grep -q "10.77.0.2"
}
check "host 1 keeps both of host 2's addresses, each with its interface" ns_wait 10 two_ifaces

# ---- 2. another token is never a member ---------------------------------------------------------
ns_start 4 agent env SHOAL_TOKEN="$OTHER" "$SHOAL" agent --state-dir "$(state 4)" \
	--peer "$(ns_ip 1):7411" --peer "$(ns_ip 2):7411" --peer "$(ns_ip 3):7411"
failed_on_all() {
	for _h in 1 2 3; do
		grep -q "handshake with $(ns_ip 4).*failed" "$(ns_dir "$_h")/agent.log" || return 1
	done
}
check "the 3 members log the failed handshake with the other token" ns_wait 10 failed_on_all
check "the other-token agent logs its failed handshakes" \
	ns_wait 5 grep -q "handshake with .* failed" "$(ns_dir 4)/agent.log"
sleep 2 # let it retry a few times: it must stay out
check "the 3 still agree without the 4th" agree 1 2 3
check "the 4th sees nobody" sh -c "[ \"\$(echo '$(sig 4)' | cut -d'|' -f3 | wc -w)\" -eq 1 ]"
check "the 4th's mDNS service is ignored as another cluster" \
	grep -q "another cluster" "$(ns_dir 1)/agent.log"
ns_kill 4 agent TERM

# ---- 3. kill -9 of the leader -------------------------------------------------------------------
L=$(leader_host 1)
S=$(for h in 1 2 3; do [ "$h" = "$L" ] || echo "$h"; done | tr '\n' ' ')
t0=$(ns_now_ms)
ns_kill "$L" agent KILL
# shellcheck disable=SC2086
if ns_wait 15 agree $S; then
	pass
	measure "kill -9 of the leader -> survivors agree on the next leader: $(($(ns_now_ms) - t0)) ms"
else
	fail "survivors ($S) agree on the next leader after kill -9 of host $L"
	dump_logs $S
fi
start_agent "$L"
check "the old leader rejoins (and leads again: smallest ID)" ns_wait 15 agree 1 2 3

# ---- 4. kill -9 of a follower -------------------------------------------------------------------
L=$(leader_host 1)
F=$(for h in 3 2 1; do [ "$h" = "$L" ] || { echo "$h"; break; }; done)
S=$(for h in 1 2 3; do [ "$h" = "$F" ] || echo "$h"; done | tr '\n' ' ')
t0=$(ns_now_ms)
ns_kill "$F" agent KILL
# shellcheck disable=SC2086
if ns_wait 15 agree $S; then
	pass
	measure "kill -9 of a follower -> it left every view: $(($(ns_now_ms) - t0)) ms"
else
	fail "follower host $F leaves every view after kill -9"
	dump_logs $S
fi
start_agent "$F"
check "the follower rejoins" ns_wait 15 agree 1 2 3

# a frozen follower (SIGSTOP: its TCP connections stay open) is found by missing heartbeats
t0=$(ns_now_ms)
kill -STOP "$(ns_pid "$F" agent)"
# shellcheck disable=SC2086
if ns_wait 15 agree $S; then
	pass
	measure "SIGSTOP of a follower -> dropped by heartbeat timeout from every view: $(($(ns_now_ms) - t0)) ms"
else
	fail "a frozen follower leaves every view"
fi
kill -CONT "$(ns_pid "$F" agent)"
check "the thawed follower rejoins" ns_wait 15 agree 1 2 3

# ---- 5. avahi-daemon restart on one host --------------------------------------------------------
A=$F
published_before=$(grep -c "mdns: published" "$(ns_dir "$A")/agent.log")
ns_avahi_restart "$A" || fail "avahi-daemon of host $A restarts"
# (avahi-client reports the loss; avahi's dns_sd compatibility layer re-registers by itself)
if status_json "$A" | grep -q '"mdns":"avahi"'; then
	check "the agent notices the daemon went away" \
		ns_wait 5 grep -q "lost avahi-daemon" "$(ns_dir "$A")/agent.log"
fi
republished() { [ "$(grep -c "mdns: published" "$(ns_dir "$A")/agent.log")" -gt "$published_before" ]; }
check "the agent re-publishes on the new daemon" ns_wait 10 republished
resolvable() {
	ns_exec "$1" timeout 10 avahi-browse -rtp _shoal._tcp 2>/dev/null | grep -q "^=.*shoal-$(node_id "$A")"
}
O=$(for h in 1 2 3; do [ "$h" = "$A" ] || { echo "$h"; break; }; done)
check "another host resolves it again" ns_wait 10 resolvable "$O"
rm -rf "$(state 4)"
ns_start 4 agent env SHOAL_TOKEN="$TOKEN" "$SHOAL" agent --state-dir "$(state 4)"
check "a newcomer joins all three, the restarted host included" ns_wait 20 agree 1 2 3 4
found_newcomer() { grep -q "mdns: found shoal-$(node_id 4)" "$(ns_dir "$A")/agent.log"; }
check "the restarted host's browser finds the newcomer" ns_wait 5 found_newcomer
ns_kill 4 agent TERM
check "the newcomer leaves cleanly" ns_wait 10 agree 1 2 3

# ---- 6. a copied state directory ----------------------------------------------------------------
rm -rf "$(state 4)"
cp -r "$(state 1)" "$(state 4)"
rm -f "$(state 4)/agent.sock"
scan_sanitizer
: >"$(ns_dir 4)/agent.log"
ns_start 4 agent env SHOAL_TOKEN="$TOKEN" "$SHOAL" agent --state-dir "$(state 4)" --peer "$(ns_ip 1):7411"
check "host 1 reports the duplicate node ID" \
	ns_wait 10 grep -q "duplicate node ID $(node_id 1)" "$(ns_dir 1)/agent.log"
check "the copy reports the duplicate node ID" \
	ns_wait 10 grep -q "duplicate node ID $(node_id 1)" "$(ns_dir 4)/agent.log"
collision_renamed() { grep -q "is taken" "$(ns_dir 4)/agent.log" "$(ns_dir 1)/agent.log"; }
check "the mDNS name collision is resolved with an alternative name" ns_wait 10 collision_renamed
check "status shows the duplicate" sh -c "$(command -v ip) netns exec $(ns_name 1) $SHOAL status --json --state-dir $(state 1) | grep -q '\"duplicate_id\":true'"
check "neither silently wins: the 3 views stay 1, 2, 3 with one leader" ns_wait 5 agree 1 2 3
ns_kill 4 agent TERM
# the copy again, knowing only host 2 (no mDNS, no --peer to host 1): it dials host 2 as the ID's
# holder would after a restart, but host 1's channel to host 2 is alive, so host 2 keeps it and
# tells the copy where the ID's holder is (replacing the live channel would drop host 1 from host
# 2's view: a new epoch, and a flap for as long as both kept dialling)
# (the views agree on a settled epoch first: the newcomer's leave above may still bump it)
stable_view() { _v=$(sig 2); sleep 2; agree 1 2 3 && [ "$(sig 2)" = "$_v" ]; }
check "the 3 views are settled before the copy starts again" ns_wait 20 stable_view
view_before=$(sig 2)
rm -f "$(state 4)/agent.sock"
: >"$(ns_dir 4)/agent.log"
ns_start 4 agent env SHOAL_TOKEN="$TOKEN" "$SHOAL" agent --state-dir "$(state 4)" --no-mdns \
	--peer "$(ns_ip 2):7411"
check "the copy learns from host 2 that a live node holds its ID" \
	ns_wait 10 grep -q "has a live channel from the node at" "$(ns_dir 4)/agent.log"
check "the copy stands down" ns_wait 5 grep -q "not joining the cluster" "$(ns_dir 4)/agent.log"
views_unmoved() { for _h in 1 2 3; do [ "$(sig "$_h")" = "$view_before" ] || return 1; done; }
if views_unmoved; then
	pass
else
	fail "the 3 views never moved: same leader, epoch and members"
	echo "before: $view_before; now: $(sig 1) / $(sig 2) / $(sig 3)" >&2
	dump_logs 1 2 4
fi
ns_kill 4 agent TERM
rm -rf "$(state 4)"

# ---- 8 (part). no token in TXT records ----------------------------------------------------------
# bounded: -t waits for every resolution, and one that never completes would hang the test
txt=$(ns_exec 2 timeout 10 avahi-browse -rtp _shoal._tcp 2>/dev/null)
check "TXT records carry cid=" sh -c "echo '$txt' | grep -q 'cid='"
check "no TXT record carries the token" sh -c "! echo '$txt' | grep -qF '$TOKEN'"
for h in 1 2 3; do ns_kill "$h" agent TERM; done

# ---- 7. 20 runs with random start delays --------------------------------------------------------
runs_ok=0 total=0 total_e=0 worst=0
run=1
while [ "$run" -le 20 ]; do
	scan_sanitizer
	for h in 1 2 3; do
		rm -rf "$(state "$h")"
		: >"$(ns_dir "$h")/agent.log"
	done
	t_first=$(ns_now_ms)
	for h in 1 2 3; do
		d=$(awk -v s="$run$h$$" 'BEGIN { srand(s); printf "%.2f", rand() * 1.0 }')
		sleep "$d"
		# half the runs settle by time, half by --expect
		if [ "$run" -le 10 ]; then start_agent "$h" --settle 0.5; else start_agent "$h" --expect 3; fi
	done
	t_last=$(ns_now_ms)
	if ns_wait 15 agree 1 2 3 && [ "$(leaders 1 2 3)" -eq 1 ]; then
		runs_ok=$((runs_ok + 1))
		t=$(($(ns_now_ms) - t_last))
		if [ "$run" -le 10 ]; then total=$((total + t)); else total_e=$((total_e + t)); fi
		[ "$t" -gt "$worst" ] && worst=$t
	else
		echo "run $run: no single agreed leader" >&2
		dump_logs 1 2 3
	fi
	for h in 1 2 3; do ns_kill "$h" agent TERM; done
	run=$((run + 1))
done
check "20 runs with random start delays: one agreed leader each time ($runs_ok/20)" [ "$runs_ok" -eq 20 ]
[ "$runs_ok" -eq 20 ] && measure "random starts: last start -> agreement mean $((total / 10)) ms with --settle 0.5, $((total_e / 10)) ms with --expect 3; worst $worst ms (20 runs)"

scan_sanitizer
check "no sanitizer report in any agent's log" [ "$SAN_REPORTS" -eq 0 ]

# ---- 8. no token in any packet ------------------------------------------------------------------
ns_capture_stop
check "the capture holds the run's mDNS traffic" grep -qa "_shoal" "$PCAP"
check "the capture holds control-channel traffic" sh -c "[ \$(stat -c %s '$PCAP') -gt 20000 ]"
check "the token appears in no packet" sh -c "! grep -qaF '$TOKEN' '$PCAP'"
check "the other token appears in no packet" sh -c "! grep -qaF '$OTHER' '$PCAP'"
measure "capture: $(stat -c %s "$PCAP") bytes searched for both tokens"

done_tests
