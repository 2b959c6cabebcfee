#!/bin/sh
# t_slices.sh: only the shard travels (issue 19). Three simulated hosts (network namespaces,
# tests/netns.sh; needs root): hosts 1 and 2 hold a generated model, host 3 starts without one
# (the largest node ID, so it joins as a follower). Host 3 fetches the file's header, is planned
# as one of 3 ranks, then fetches only its share's bytes into a sparse slice file: its state
# directory holds about its share, not the file. kill -9 of host 2 re-plans onto 2 ranks: host 3's
# share grows and it fetches only the difference. Answers equal `shoal generate`'s throughout.
# SLICES_NAME and SLICES_MODEL (mkmodel flags) let another test run the same on another model
# (t_moe_slices.sh: a mixture of experts, whose ranks keep whole experts).
. tests/lib.sh
NAME=${SLICES_NAME:-t_slices}
# F32 weights and an F32 cache: the ranks' partial sums then differ from one node's only in
# their order, so greedy text is compared exactly
MODEL_ARGS=${SLICES_MODEL:-"--dim 512 --layers 4 --heads 8 --kv-heads 4 --ffn 3072 --vocab 512 --type f32"}

if [ "$(id -u)" -ne 0 ]; then
	skip "$NAME: needs root for network namespaces"
	done_tests
	exit $?
fi
for tool in ip avahi-daemon dbus-daemon curl jq du; do
	if ! command -v $tool >/dev/null 2>&1; then
		skip "$NAME: $tool not installed"
		done_tests
		exit $?
	fi
done

. tests/netns.sh
SHOAL=$(cd "$(dirname "$SHOAL")" && pwd)/$(basename "$SHOAL")
TOKEN="shoal-$NAME-test-$$"
PROMPT="the little fish"
N=16

if ! ns_setup 3; then
	fail "netns setup (3 hosts)"
	done_tests
	exit 1
fi
TMP=$NS_ROOT/t
mkdir -p "$TMP"
# rows long enough that a share's rows are whole file-system blocks
GEN=$TMP/gen.gguf
# shellcheck disable=SC2086
"$SHOAL" mkmodel $MODEL_ARGS --seed 5 -o "$GEN" >/dev/null 2>&1 || fail "mkmodel"
SIZE=$(wc -c <"$GEN")

state() { echo "$(ns_dir "$1")/state"; }
start() {
	_h=$1; shift
	ns_start "$_h" agent env SHOAL_TOKEN="$TOKEN" "$SHOAL" agent --state-dir "$(state "$_h")" \
		--settle 0.5 --kv-type f32 "$@"
}
url() { echo "http://$(ns_ip "$1"):8080$2"; }
plan_ranks() { jq '.ranks | length' "$(state "$1")/plan.json" 2>/dev/null; }
health() { [ "$(ns_exec 1 curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$(url 1 /health)")" = 200 ]; }
serving_with() { health && [ "$(plan_ranks 1)" = "$1" ] && [ "$(plan_ranks 3)" = "$1" ]; }
_complete1() {
	ns_exec 1 curl -s -L --max-time 60 -H 'Content-Type: application/json' \
		-d "{\"prompt\":\"$PROMPT\",\"max_tokens\":$N,\"temperature\":0}" \
		"$(url 1 /v1/completions)" >"$TMP/got.json"
	jq -e '.choices[0].text' "$TMP/got.json" >/dev/null 2>&1
}
same_answer() {
	ns_wait 20 _complete1 || return 1
	jq -j '.choices[0].text' "$TMP/got.json" >"$TMP/got"
	cmp -s "$TMP/got" "$TMP/exp" && return 0
	echo "  got:      $(cat "$TMP/got")" >&2
	echo "  expected: $(cat "$TMP/exp")" >&2
	for _h in 1 2 3; do tail -n 8 "$(ns_dir $_h)/agent.log" | sed "s/^/  h$_h: /" >&2; done
	return 1
}
# the last "share of X MB here; fetched Y MB" line of host 3: "X Y"
share_line() {
	grep -h 'share of .* MB here; fetched' "$(ns_dir 3)/agent.log" | tail -n 1 |
		sed -E 's/.*share of ([0-9.]+) MB here; fetched ([0-9.]+) MB.*/\1 \2/'
}
shares_seen() { [ "$(grep -ch 'share of .* MB here; fetched' "$(ns_dir 3)/agent.log")" -ge "$1" ]; }

# an F32 cache: the ranks' partial sums then round as one node's (F16 may flip a near tie)
"$SHOAL" generate --model "$GEN" --prompt "$PROMPT" --max-tokens $N --temperature 0 --kv-type f32 \
	>"$TMP/exp.raw" 2>/dev/null
v=$(cat "$TMP/exp.raw"; printf x); v=${v%x}; printf '%s' "${v%?}" >"$TMP/exp"

mkdir -p "$(state 1)" "$(state 2)" "$(state 3)"
echo 11111111111111111111111111111111 >"$(state 1)/node_id"
echo 22222222222222222222222222222222 >"$(state 2)/node_id"
echo ffffffffffffffffffffffffffffffff >"$(state 3)/node_id"
# hosts 1 and 2 first, then host 3: its first plan is the 3-rank one
start 1 --model "$GEN" --expect 2
start 2 --model "$GEN" --expect 2
ns_wait 40 sh -c "[ \"\$(jq '.ranks | length' '$(state 1)/plan.json' 2>/dev/null)\" = 2 ]" ||
	fail "hosts 1 and 2 plan 2 ranks within 40 s"
start 3

if ns_wait 60 serving_with 3; then
	pass
	SLICE=$(ls "$(state 3)"/models/*.slice 2>/dev/null | head -n 1)
	check "host 3 keeps a slice file, not a copy of the model" [ -n "$SLICE" ]
	check "host 3 has no whole copy" sh -c "! ls '$(state 3)'/models/*.gguf >/dev/null 2>&1"
	ns_wait 10 shares_seen 1
	set -- $(share_line)
	share_mb=${1:-0} got_mb=${2:-0}
	# blocks in use (not the apparent size) of the slice and its sidecar of column pieces
	disk=$(du -k "$SLICE" "$SLICE.cols" 2>/dev/null | awk '{s += $1 * 1024} END {print s}')
	echo "host 3: share $share_mb MB, fetched $got_mb MB, on disk $((disk / 1000000)) MB of a $((SIZE / 1000000)) MB model" >&2
	check "host 3 fetched its share ($got_mb MB), well under the file ($SIZE bytes)" \
		awk "BEGIN { exit !($got_mb > 0 && $got_mb * 1e6 < $SIZE * 0.6) }"
	check "its state directory holds about its share (on disk $disk bytes, share $share_mb MB)" \
		awk "BEGIN { exit !($disk < $share_mb * 1e6 * 1.1 + 2e6) }"
	check "the 3-rank cluster answers as one node" same_answer

	seen=$(grep -ch 'share of .* MB here; fetched' "$(ns_dir 3)/agent.log")
	ns_kill 2 agent KILL
	if ns_wait 30 serving_with 2; then
		pass
		ns_wait 10 shares_seen $((seen + 1))
		set -- $(share_line)
		share2=${1:-0} got2=${2:-0}
		echo "after the re-plan: share $share2 MB, fetched $got2 MB" >&2
		check "the re-plan grew host 3's share ($share_mb -> $share2 MB)" \
			awk "BEGIN { exit !($share2 > $share_mb) }"
		check "and fetched only the difference ($got2 MB < $share2 - $share_mb + 1 MB)" \
			awk "BEGIN { exit !($got2 > 0 && $got2 < $share2 - $share_mb + 1) }"
		check "the 2-rank cluster answers as one node" same_answer
	else
		fail "re-plan onto 2 ranks within 30 s"
		tail -n 20 "$(ns_dir 3)/agent.log" >&2
	fi
else
	fail "3 ranks serving within 60 s"
	for h in 1 3; do tail -n 15 "$(ns_dir $h)/agent.log" >&2; done
fi
done_tests
