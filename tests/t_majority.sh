#!/bin/sh
# t_majority.sh: issue 19's majority model, in network namespaces (needs root). Host 1 has the
# smallest node ID but another model; hosts 2 and 3 hold the same model. The election's leader is
# host 1, but the plan is the majority's: 2 ranks, rank 0 the smaller of hosts 2 and 3, whose
# greedy answer equals `shoal generate` on the majority's model (asked through host 1, which
# redirects); host 1 stays out with a clear reason in `shoal status` on both sides.
. tests/lib.sh

if [ "$(id -u)" -ne 0 ]; then
	skip "t_majority: needs root for network namespaces"
	done_tests
	exit $?
fi
for tool in ip avahi-daemon dbus-daemon curl jq unshare; do
	if ! command -v $tool >/dev/null 2>&1; then
		skip "t_majority: $tool not installed"
		done_tests
		exit $?
	fi
done

. tests/netns.sh
SHOAL=$(cd "$(dirname "$SHOAL")" && pwd)/$(basename "$SHOAL")
TOKEN="shoal-majority-test-$$-31f0"
PROMPT="Once upon a time"
N=12

if ! ns_setup 4; then
	fail "netns setup (4 hosts)"
	done_tests
	exit 1
fi
TMP=$NS_ROOT/t
mkdir -p "$TMP"
GEN=$TMP/gen.gguf OTHER=$TMP/other.gguf
"$SHOAL" mkmodel --dim 128 --layers 4 --heads 4 --kv-heads 2 --ffn 384 --vocab 512 --seed 5 \
	-o "$GEN" >/dev/null 2>&1 || fail "mkmodel"
"$SHOAL" mkmodel --dim 128 --layers 4 --heads 4 --kv-heads 2 --ffn 384 --vocab 512 --seed 6 \
	-o "$OTHER" >/dev/null 2>&1 || fail "mkmodel (other)"

state() { echo "$(ns_dir "$1")/state"; }
node_id() { cat "$(state "$1")/node_id" 2>/dev/null; }
start() {
	ns_start "$1" agent env SHOAL_TOKEN="$TOKEN" "$SHOAL" agent --state-dir "$(state "$1")" \
		--settle 0.5 --model "$2"
}
status_json() { ns_exec "$1" "$SHOAL" status --json --state-dir "$(state "$1")" 2>/dev/null; }
url() { echo "http://$(ns_ip "$1"):8080$2"; }
ranks() { ns_exec 4 curl -s --max-time 2 "$(url "$1" /v1/cluster)" | jq -r '.plan.ranks // 0' 2>/dev/null; }
health() { [ "$(ns_exec 4 curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$(url "$1" /health)")" = 200 ]; }

mkdir -p "$(state 1)" && echo 00000000000000000000000000000001 >"$(state 1)/node_id"
mkdir -p "$(state 2)" && echo 00000000000000000000000000000002 >"$(state 2)/node_id"
mkdir -p "$(state 3)" && echo 00000000000000000000000000000003 >"$(state 3)/node_id"
"$SHOAL" generate --model "$GEN" --prompt "$PROMPT" --max-tokens $N --temperature 0 \
	>"$TMP/exp.raw" 2>/dev/null || fail "shoal generate"
_v=$(cat "$TMP/exp.raw"; printf x)
_v=${_v%x}
printf '%s' "${_v%?}" >"$TMP/exp"

start 1 "$OTHER"
start 2 "$GEN"
start 3 "$GEN"
serving() { health 2 && [ "$(ranks 2)" = 2 ]; }
if ns_wait 40 serving; then
	pass
	check "the election's leader is host 1 (smallest ID)" \
		[ "$(status_json 2 | jq -r .leader)" = "$(node_id 1)" ]
	check "the planner is host 2 (the majority model's smallest ID)" \
		[ "$(status_json 1 | jq -r .planner)" = "$(node_id 2)" ]
	ns_exec 1 "$SHOAL" status --state-dir "$(state 1)" >"$TMP/st1" 2>&1
	check "host 1's shoal status says why it is left out" grep -q 'another model' "$TMP/st1"
	ns_exec 2 "$SHOAL" status --state-dir "$(state 2)" >"$TMP/st2" 2>&1
	check "the planner's shoal status shows host 1 left out" grep -q 'left out: .*another model' "$TMP/st2"
	_ex=$(status_json 2 | jq -r ".members[] | select(.node_id == \"$(node_id 1)\") | .excluded")
	check "the planner's status names host 1's other model" sh -c "echo '$_ex' | grep -q 'another model'"
	ns_exec 4 curl -s -L --max-time 30 -H 'Content-Type: application/json' \
		-d "{\"prompt\":\"$PROMPT\",\"max_tokens\":$N,\"temperature\":0}" \
		"$(url 1 /v1/completions)" >"$TMP/got.json"
	jq -j '.choices[0].text' "$TMP/got.json" >"$TMP/got" 2>/dev/null
	check "through host 1, the majority's model answers (equals shoal generate)" cmp -s "$TMP/got" "$TMP/exp"
else
	fail "hosts 2 and 3 serve the majority model within 40 s"
	for h in 1 2 3; do tail -n 6 "$(ns_dir $h)/agent.log" >&2; done
fi
for h in 1 2 3; do ns_kill $h agent TERM 2>/dev/null; done
done_tests
