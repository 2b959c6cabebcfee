#!/bin/sh
# t_agent_basic.sh: `shoal agent` end to end on loopback (static peers, no mDNS, no root):
# - two agents with the same token form a cluster; /health says 503 with a reason while forming
#   (a lone agent expecting 2 members), then 200 on both once the plan is served;
# - both write hostfile.json, mlx-hosts.json, rdma-devices.json and plan.json, byte-identical,
#   and the plan has 2 ranks;
# - the leader's greedy chat completion equals `shoal generate --chat` for the same request;
# - the follower answers /v1/ paths with 307 to the leader; /v1/cluster lists both with ranks;
# - kill -9 of the follower: the leader re-plans alone and serves the same answer again;
# - a node started without --model fetches the header and then its share of the leader's file
#   (a slice), is planned, answers stay equal;
# - a node whose model file differs (one byte) stays out of the plan and says why.
# The netns acceptance suite (3 nodes, failover, joins, tokens, mDNS) is tests/t_agent.sh.
. tests/lib.sh

MODEL=$SHARED/models/stories260K.gguf
if [ ! -f "$MODEL" ]; then
	skip "t_agent_basic: no $MODEL"
	done_tests
	exit
fi
command -v curl >/dev/null || { skip "t_agent_basic: no curl"; done_tests; exit; }
TMP=$(mktemp -d)
# ports from the pid, spaced so that ranks' data ports (control port + 1 + rank) never collide
BASE=$((20000 + ($$ % 120) * 100)) # below the ephemeral range (32768-)
PA=$BASE PB=$((BASE + 50)) HA=$((BASE + 10)) HB=$((BASE + 60))
PC=$((BASE + 70)) HC=$((BASE + 80)) PD=$((BASE + 90)) HD=$((BASE + 95))
PIDS=""
cleanup() {
	for p in $PIDS; do kill "$p" 2>/dev/null; done
	for p in $PIDS; do wait "$p" 2>/dev/null; done
	# keep the agents' logs of a failed run
	if [ "$T_FAIL" -gt 0 ]; then
		mkdir -p "$BUILD/t_agent_basic.logs" && cp "$TMP"/*.log "$BUILD/t_agent_basic.logs/"
		echo "agent logs: $BUILD/t_agent_basic.logs" >&2
	fi
	rm -rf "$TMP"
}
trap cleanup EXIT

start() { # name port http-port [model file, or - for none]
	n=$1 p=$2 h=$3 m=${4:-$MODEL}
	set --
	[ "$m" != - ] && set -- --model "$m"
	"$SHOAL" agent --token basic-test "$@" --state-dir "$TMP/$n" --port "$p" \
		--http-port "$h" --no-mdns --peer "127.0.0.1:$PA" --peer "127.0.0.1:$PB" \
		--peer "127.0.0.1:$PC" --expect 2 \
		--threads 1 --replan-delay 200 >"$TMP/$n.log" 2>&1 &
	PIDS="$PIDS $!"
	eval "PID_$n=$!"
}
# wait_ranks PORT N: until /v1/cluster's plan has N ranks (at most ~15 s)
wait_ranks() {
	i=0
	while [ $i -lt 150 ]; do
		curl -s "http://127.0.0.1:$1/v1/cluster" | grep -q "\"ranks\":$2," && return 0
		sleep 0.1
		i=$((i + 1))
	done
	return 1
}
# wait_health PORT CODE: until /health answers CODE (at most ~15 s)
wait_health() {
	i=0
	while [ $i -lt 150 ]; do
		c=$(curl -s -o "$TMP/h.json" -w '%{http_code}' "http://127.0.0.1:$1/health")
		[ "$c" = "$2" ] && return 0
		sleep 0.1
		i=$((i + 1))
	done
	return 1
}
chat() { # port -> prints the reply JSON
	curl -sL "http://127.0.0.1:$1/v1/chat/completions" -H 'Content-Type: application/json' \
		-d '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":40,"temperature":0}'
}
content() { python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])'; }

EXPECT=$("$SHOAL" generate --model "$MODEL" --max-tokens 40 --temperature 0 --chat "Once upon a time" 2>/dev/null)

start a "$PA" "$HA"
check "a lone agent says 503 while forming" wait_health "$HA" 503
check "503 names the state" grep -q '"state":"forming"' "$TMP/h.json"
check "503 gives a reason" grep -q '"reason":"[a-z]' "$TMP/h.json"
start b "$PB" "$HB"
check "node a serves (200)" wait_health "$HA" 200
check "node b serves (200)" wait_health "$HB" 200

for f in hostfile.json mlx-hosts.json rdma-devices.json plan.json; do
	check "$f written on a" [ -s "$TMP/a/$f" ]
	check "$f byte-identical on both" cmp -s "$TMP/a/$f" "$TMP/b/$f"
done
check "plan has 2 ranks" [ "$(grep -o '"rank":' "$TMP/a/plan.json" | wc -l)" -ge 2 ]

# which node leads: /v1/cluster's "leader" and the leader's "addr"
LEADER_HTTP=$(curl -s "http://127.0.0.1:$HA/v1/cluster" | python3 -c '
import json,sys
d=json.load(sys.stdin)
print([m["addr"].rsplit(":",1)[1] for m in d["members"] if m["id"]==d["leader"]][0])')
if [ "$LEADER_HTTP" = "$HA" ]; then FOLLOWER_HTTP=$HB FOLLOWER=b; else FOLLOWER_HTTP=$HA FOLLOWER=a; fi
check "leader found in /v1/cluster" [ -n "$LEADER_HTTP" ]
check "/v1/cluster lists 2 ranks" sh -c "curl -s http://127.0.0.1:$LEADER_HTTP/v1/cluster | grep -q '\"ranks\":2'"

GOT=$(chat "$LEADER_HTTP" | content)
check "leader's greedy completion equals shoal generate's" [ "$GOT" = "$EXPECT" ]
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$FOLLOWER_HTTP/v1/models")
check "follower redirects /v1/ with 307 (got $code)" [ "$code" = 307 ]
loc=$(curl -s -D - -o /dev/null "http://127.0.0.1:$FOLLOWER_HTTP/v1/models" | tr -d '\r' | sed -n 's/^Location: //Ip')
check "redirect points at the leader ($loc)" sh -c "echo '$loc' | grep -q ':$LEADER_HTTP/v1/models'"
GOT=$(curl -sL "http://127.0.0.1:$FOLLOWER_HTTP/v1/chat/completions" -H 'Content-Type: application/json' \
	-d '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":40,"temperature":0}' | content)
check "a request sent to the follower is answered by the leader" [ "$GOT" = "$EXPECT" ]

# the follower dies: the leader plans alone and serves again
eval "kill -9 \$PID_$FOLLOWER"
sleep 0.5
check "leader serves again after losing the follower" wait_health "$LEADER_HTTP" 200
i=0
while [ $i -lt 50 ] && ! curl -s "http://127.0.0.1:$LEADER_HTTP/v1/cluster" | grep -q '"ranks":1'; do
	sleep 0.1
	i=$((i + 1))
done
check "the new plan has 1 rank" sh -c "curl -s http://127.0.0.1:$LEADER_HTTP/v1/cluster | grep -q '\"ranks\":1'"
wait_health "$LEADER_HTTP" 200
GOT=$(chat "$LEADER_HTTP" | content)
check "same answer on the smaller cluster" [ "$GOT" = "$EXPECT" ]
check "the state machine logged its transitions" grep -q "agent: loading -> serving" "$TMP/a.log"

# a node without --model: fetches the header and its share of the leader's file, joins the plan
start c "$PC" "$HC" -
check "the node without a model joins the plan" wait_ranks "$LEADER_HTTP" 2
check "it keeps a slice of the file in its state dir" sh -c "ls $TMP/c/models/*.slice >/dev/null 2>&1"
check "and no whole copy" sh -c "! ls $TMP/c/models/*.gguf >/dev/null 2>&1"
wait_health "$LEADER_HTTP" 200
GOT=$(chat "$LEADER_HTTP" | content)
check "same answer with the fetched copy" [ "$GOT" = "$EXPECT" ]

# a node with another file of the same size: left out, with the reason on both sides
cp "$MODEL" "$TMP/other.gguf"
sz=$(wc -c <"$TMP/other.gguf")
printf 'x' | dd of="$TMP/other.gguf" bs=1 seek=$((sz - 10)) conv=notrunc 2>/dev/null
start d "$PD" "$HD" "$TMP/other.gguf"
i=0
while [ $i -lt 100 ] && ! grep -q "another model" "$TMP/d.log"; do sleep 0.1; i=$((i + 1)); done
check "the node with another file logs why it is left out" grep -q "another model" "$TMP/d.log"
# (the majority plans: d, alone with its file, never does, even with the smallest ID)
D_LEADS=$(curl -s "http://127.0.0.1:$HD/v1/cluster" | python3 -c '
import json,sys
d=json.load(sys.stdin)
print(1 if d["leader"]==d["self"] else 0)')
if [ "$D_LEADS" = 1 ]; then
	check "d leads alone and marks the others excluded" sh -c \
		"curl -s http://127.0.0.1:$HD/v1/cluster | grep -q '\"state\":\"excluded\"'"
else
	i=0
	while [ $i -lt 20 ] && ! curl -s "http://127.0.0.1:$HD/health" | grep -q 'another model'; do
		sleep 0.1
		i=$((i + 1))
	done
	check "its /health says why" sh -c "curl -s http://127.0.0.1:$HD/health | grep -q 'another model'"
	check "the plan keeps 2 ranks" wait_ranks "$LEADER_HTTP" 2
fi

done_tests
