#!/bin/sh
# t_dashboard_netns.sh: issue 32's acceptance on a 3-node agent cluster in network namespaces
# (tests/netns.sh; needs root). Hosts 1-3 run `shoal agent` on stories260K; host 4 runs a real
# headless Chromium and the load (tests/node/dashboard_cluster.mjs) against the leader's
# dashboard: charts with points for the last minute, 3 nodes and 3 links with RTT labels, the
# request table, and a follower killed with SIGKILL in the event log and on the charts.
# The links' RTTs are the agents' own measurements (agent/links.h, /v1/cluster's rtt_ms). The
# agents keep their compute to themselves (lib.sh's SHOAL_COMPUTE=off) so the plan is by kind:
# all 3 nodes are ranks, as the topology checks want. Screenshots are kept in
# $BUILD/test-logs/dashboard-cluster*.png.
. tests/lib.sh

if [ "$(id -u)" -ne 0 ]; then
	skip "t_dashboard_netns: needs root for network namespaces"
	done_tests
	exit $?
fi
for tool in ip avahi-daemon dbus-daemon dbus-send curl jq unshare ping; do
	command -v $tool >/dev/null 2>&1 || { skip "t_dashboard_netns: $tool not installed"; done_tests; exit $?; }
done
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
[ -x "$CHROMIUM" ] || { skip "t_dashboard_netns: $CHROMIUM not installed"; done_tests; exit $?; }
STORIES=$SHARED/models/stories260K.gguf
[ -f "$STORIES" ] || { skip "t_dashboard_netns: $STORIES missing"; done_tests; exit $?; }
. tests/web_serve.sh # node_setup
node_setup || { skip "t_dashboard_netns: $NODE_WHY"; done_tests; exit $?; }

. tests/netns.sh
SHOAL=$(cd "$(dirname "$SHOAL")" && pwd)/$(basename "$SHOAL")
STORIES=$(cd "$(dirname "$STORIES")" && pwd)/$(basename "$STORIES")
LOGS=$BUILD/test-logs
mkdir -p "$LOGS"
LOGS=$(cd "$LOGS" && pwd)
TOKEN="shoal-dash-test-$$-7c3e"

if ! ns_setup 4; then
	fail "netns setup (4 hosts)"
	done_tests
	exit 1
fi
serving3() {
	[ "$(ns_status 1 | jq '.members | length' 2>/dev/null)" = 3 ] || return 1
	_lh=$(ns_leader_host 1 3) || return 1
	[ "$(ns_exec 4 curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://$(ns_ip "$_lh"):8080/health")" = 200 ] &&
		[ "$(jq '.ranks | length' "$(ns_state "$_lh")/plan.json" 2>/dev/null)" = 3 ]
}
for h in 1 2 3; do
	ns_start $h agent env SHOAL_TOKEN="$TOKEN" "$SHOAL" agent --state-dir "$(ns_state $h)" \
		--settle 0.5 --threads 1 --model "$STORIES"
done
if ! ns_wait 60 serving3; then
	fail "the 3-node cluster did not serve within 60 s"
	for h in 1 2 3; do tail -5 "$(ns_dir $h)/agent.log" | sed "s/^/  h$h: /" >&2; done
	done_tests
	exit 1
fi
pass
L=$(ns_leader_host 1 3)
F=$((L % 3 + 1))

out=$(ns_exec 4 env CHROMIUM="$CHROMIUM" HOME="$NS_ROOT" node tests/node/dashboard_cluster.mjs \
	"http://$(ns_ip "$L"):8080/" "$LOGS" "$(ns_pid $F agent)" "$(ns_node_id $F)" 2>"$NS_ROOT/dash.err")
rc=$?
sed 's/^/  /' "$NS_ROOT/dash.err" >&2
p=$(echo "$out" | sed -n 's/^\([0-9]*\) passed.*/\1/p')
f=$(echo "$out" | sed -n 's/.* \([0-9]*\) failed.*/\1/p')
T_PASS=$((T_PASS + ${p:-0})) T_FAIL=$((T_FAIL + ${f:-0}))
[ "$rc" -ne 0 ] && [ "${f:-0}" -eq 0 ] && fail "dashboard_cluster.mjs exited $rc"
check "screenshot saved" [ -s "$LOGS/dashboard-cluster.png" ]
# the followers' step times reach the leader (AGENT_MSG_STEPS): a series per node
n=$(ns_exec 4 curl -s --max-time 5 "http://$(ns_ip "$L"):8080/v1/history" |
	jq '[.nodes[] | select([.step_ms[] | select(. != null)] | length > 0)] | length')
check "/v1/history has step times of all 3 nodes (got ${n:-none})" [ "${n:-0}" -ge 3 ]
for h in 1 2 3; do ns_kill $h agent TERM 2>/dev/null; done
done_tests
