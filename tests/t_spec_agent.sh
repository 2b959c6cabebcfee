#!/bin/sh
# t_spec_agent.sh: speculative decoding through `shoal agent` (docs/speculative.md) on 3
# simulated hosts (network namespaces, tests/netns.sh; needs root). The same 3 agents serve
# stories260K twice: with --spec off, then with --spec model and its F16 copy as --draft-model
# (every node is given the file; the node that is rank 0 drafts, the others verify). Greedy text
# through the API is the same both times and equals `shoal generate --spec off`; with drafts the
# leader's /metrics counts drafted and accepted tokens (web/metrics.c's shoal_spec_* lines), and
# without them it has none. A hybrid model (qwen35) drafted by a copy that is often wrong keeps
# its text on 3 ranks (the recurrent layers roll back everywhere). --spec, --draft-model and
# --draft-max are checked at start (t_spec.sh).
. tests/lib.sh

. tests/netns.sh
STORIES=$SHARED/models/stories260K.gguf
if ! ns_require t_spec_agent || [ ! -f "$STORIES" ]; then
	[ -f "$STORIES" ] || skip "t_spec_agent: $STORIES missing"
	done_tests
	exit $?
fi
SHOAL=$(cd "$(dirname "$SHOAL")" && pwd)/$(basename "$SHOAL")
STORIES=$(cd "$(dirname "$STORIES")" && pwd)/$(basename "$STORIES")
TOKEN="shoal-spec-agent-$$-7a31"
PROMPT="Once upon a time"
N=64

if ! ns_setup 3; then
	fail "netns setup (3 hosts)"
	done_tests
	exit 1
fi
TMP=$NS_ROOT/t
mkdir -p "$TMP"
DRAFT=$TMP/s16.gguf
"$SHOAL" mkmodel --from "$STORIES" --type f16 -o "$DRAFT" >/dev/null 2>&1 || fail "mkmodel --from"

state() { echo "$(ns_dir "$1")/state"; }
node_id() { cat "$(state "$1")/node_id" 2>/dev/null; }
start() { # start I ARGS...
	_h=$1; shift
	ns_start "$_h" agent env SHOAL_TOKEN="$TOKEN" "$SHOAL" agent --state-dir "$(state "$_h")" \
		--settle 0.5 --expect 3 --threads 1 "$@"
}
stop_all() { for _h in 1 2 3; do ns_kill $_h agent TERM 2>/dev/null; done; return 0; }
status_json() { ns_exec "$1" "$SHOAL" status --json --state-dir "$(state "$1")" 2>/dev/null; }
leader_host() {
	_l=$(status_json 1 | jq -r .leader 2>/dev/null)
	for _h in 1 2 3; do [ "$(node_id $_h)" = "$_l" ] && { echo $_h; return 0; }; done
	return 1
}
url() { echo "http://$(ns_ip "$1"):8080$2"; }
plan_ranks() { jq '.ranks | length' "$(state "$1")/plan.json" 2>/dev/null; }
serving() {
	_lh=$(leader_host) || return 1
	[ "$(ns_exec 1 curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$(url "$_lh" /health)")" = 200 ] &&
		[ "$(plan_ranks "$_lh")" = 3 ]
}
# complete HOST OUT: the greedy completion from HOST's API into OUT (a 503 while the cluster
# forms is retried for up to 20 s)
_complete1() {
	ns_exec 1 curl -s -L --max-time 60 -H 'Content-Type: application/json' \
		-d "{\"prompt\":\"$PROMPT\",\"max_tokens\":$N,\"temperature\":0}" \
		"$(url "$1" /v1/completions)" >"$2.json"
	! grep -q '"type":"unavailable"' "$2.json"
}
complete() {
	ns_wait 20 _complete1 "$1" "$2"
	jq -j '.choices[0].text' "$2.json" >"$2" 2>/dev/null
}
metric() { # metric FILE NAME: the value of counter NAME in a /metrics text (empty: absent)
	awk -v n="$2" '$1 == n { print $2 }' "$1"
}

# expected MODEL FILE: `shoal generate --spec off`'s greedy text (its trailing newline removed)
expected() {
	"$SHOAL" generate --model "$1" --prompt "$PROMPT" --max-tokens $N --temperature 0 \
		--spec off >"$2.raw" 2>"$2.err" || fail "shoal generate: $(cat "$2.err")"
	_v=$(cat "$2.raw"; printf x)
	_v=${_v%x}
	printf '%s' "${_v%?}" >"$2"
}
expected "$STORIES" "$TMP/exp"

# serve MODE ARGS...: 3 agents with ARGS until they serve a 3-rank plan; the leader's completion
# into $TMP/MODE and its /metrics into $TMP/MODE.metrics
serve() {
	_m=$1; shift
	for h in 1 2 3; do start $h "$@"; done
	if ns_wait 40 serving; then
		pass
		L=$(leader_host)
		complete "$L" "$TMP/$_m"
		ns_exec 1 curl -s --max-time 5 "$(url "$L" /metrics)" >"$TMP/$_m.metrics"
	else
		fail "$_m: 3 agents serve a 3-rank plan"
		for h in 1 2 3; do tail -5 "$(ns_dir $h)/agent.log" >&2; done
	fi
	stop_all
}

serve off --model "$STORIES" --spec off
check "--spec off: the cluster's greedy text is shoal generate's" cmp -s "$TMP/off" "$TMP/exp"
check "--spec off: no speculative figures in /metrics" \
	[ -z "$(metric "$TMP/off.metrics" shoal_spec_drafted_tokens_total)" ]

serve model --model "$STORIES" --spec model --draft-model "$DRAFT" --draft-max 6
check "--spec model: the same greedy text as --spec off" cmp -s "$TMP/model" "$TMP/off"
[ -s "$TMP/model" ] || fail "--spec model: an empty completion ($(head -c 300 "$TMP/model.json"))"
d=$(metric "$TMP/model.metrics" shoal_spec_drafted_tokens_total)
a=$(metric "$TMP/model.metrics" shoal_spec_accepted_tokens_total)
v=$(metric "$TMP/model.metrics" shoal_spec_verify_steps_total)
echo "  rank 0 drafted ${d:-?} tokens, accepted ${a:-?}, in ${v:-?} verify steps" >&2
check "--spec model: /metrics counts drafted tokens" [ "${d:-0}" -gt 0 ]
check "--spec model: and accepted ones (the F16 copy mostly agrees)" [ "${a:-0}" -gt 0 ]
check "--spec model: fewer verify steps than tokens" [ "${v:-$N}" -lt $N ]

# A hybrid model (qwen35: Gated DeltaNet layers) drafted by its own Q4_0 copy, which is often
# wrong: every rank's recurrent layers must go back to the last accepted token, which they can
# only do when rank 0's rollback depth (the draft length) reached them (tp.h: dist_set_rollback).
Q="--arch qwen35 --dim 128 --layers 4 --heads 4 --kv-heads 2 --head-dim 32 --ffn 256 --vocab 512
   --ctx 512 --type f32 --ssm-state 32 --ssm-k-heads 2 --ssm-v-heads 4 --seed 18"
# shellcheck disable=SC2086
"$SHOAL" mkmodel $Q -o "$TMP/q35.gguf" >/dev/null 2>&1 &&
	"$SHOAL" mkmodel --from "$TMP/q35.gguf" --type q4_0 -o "$TMP/q35q.gguf" >/dev/null 2>&1 ||
	fail "mkmodel qwen35"
expected "$TMP/q35.gguf" "$TMP/exp_q35"
serve q35 --model "$TMP/q35.gguf" --spec model --draft-model "$TMP/q35q.gguf"
check "qwen35 drafted by a Q4_0 copy: shoal generate's greedy text" cmp -s "$TMP/q35" "$TMP/exp_q35"
d=$(metric "$TMP/q35.metrics" shoal_spec_drafted_tokens_total)
a=$(metric "$TMP/q35.metrics" shoal_spec_accepted_tokens_total)
echo "  qwen35: rank 0 drafted ${d:-?} tokens, accepted ${a:-?}" >&2
check "qwen35: drafts were accepted and rejected" [ "${a:-0}" -gt 0 -a "${a:-0}" -lt "${d:-0}" ]

if [ "$T_FAIL" -gt 0 ]; then
	mkdir -p "$BUILD/t_spec_agent.logs"
	for h in 1 2 3; do cp "$(ns_dir $h)/agent.log" "$BUILD/t_spec_agent.logs/h$h.log"; done
	echo "agent logs: $BUILD/t_spec_agent.logs" >&2
fi
done_tests
