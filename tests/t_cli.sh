#!/bin/sh
# The shoal binary's dispatcher: help, version, unknown commands.
. tests/lib.sh

out=$($SHOAL --help); rc=$?
check "--help exits 0" [ $rc -eq 0 ]
for c in agent status serve generate worker plan info tokenize mkmodel bench; do
	check "--help lists $c" sh -c "echo \"\$1\" | grep -q \"^  $c \"" _ "$out"
done
check "--version prints the version" sh -c "$SHOAL --version | grep -Eq '^shoal [0-9]+\.[0-9]+'"
$SHOAL nope >/dev/null 2>/tmp/shoal-cli.$$; rc=$?
check "unknown command exits 2" [ $rc -eq 2 ]
check "unknown command prints usage to stderr" grep -q '^usage: shoal' /tmp/shoal-cli.$$
$SHOAL >/dev/null 2>&1; rc=$?
check "no command exits 2" [ $rc -eq 2 ]
rm -f /tmp/shoal-cli.$$
# number flags are strict everywhere (cli_parse_int, cli_parse_u64, cli_parse_num): "foo", "12x",
# "+80", " 1", "1e3" for an integer, an empty share are errors, never 0
for args in "bench --model x --threads foo" "bench --model x --gen 12x" \
	"agent --token t --expect foo" "serve --model x --port foo" "mkmodel --dim foo -o /dev/null" \
	"plan --view x --model y --ctx 1k" "agent --token t --port +80" "agent --token t --port 80x" \
	"agent --token t --exec-port 0x10" "agent --token t --replan-delay 5s" \
	"agent --token t --settle nan" "generate --model x --prompt p --seed 12x" \
	"generate --model x --prompt p --seed -1" "generate --model x --prompt p --max-tokens 2.5" \
	"mkmodel --seed 1e3 -o /dev/null" "worker --rank 0 --world 2 --shares 1::2" \
	"worker --rank 0 --world 2 --shares 1:2:" "worker --rank x --world 2"; do
	# shellcheck disable=SC2086
	$SHOAL $args >/dev/null 2>&1; rc=$?
	check "shoal $args: refused with exit 2 (got $rc)" [ $rc -eq 2 ]
done
# shoal bench: one key=value line; --bound adds the bandwidth streamed between the decode steps
M=$SHARED/models/stories260K.gguf
line=$($SHOAL bench --model "$M" --threads 1 --prompt 4 --gen 8 --bound 2>&1); rc=$?
check "bench --bound exits 0 (got $rc: $line)" [ $rc -eq 0 ]
field() { echo "$line" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
for k in decode_tok_s bytes_per_token bound_gb_s bound_best_gb_s; do
	check "bench --bound prints $k > 0 ($(field $k))" awk -v v="$(field $k)" 'BEGIN { exit !(v > 0) }'
done
check "bench --bound: the best pass is at least the mean ($(field bound_best_gb_s) >= $(field bound_gb_s))" \
	awk -v b="$(field bound_best_gb_s)" -v m="$(field bound_gb_s)" 'BEGIN { exit !(b >= m) }'
check "bench --bound: of_bound = decode_gb_s / bound_gb_s" awk -v o="$(field of_bound)" \
	-v d="$(field decode_gb_s)" -v b="$(field bound_gb_s)" \
	'BEGIN { exit !(o > 0 && (o - d / b) ^ 2 < (0.06 * o) ^ 2 + 0.0025) }'
check "bench --bound: peak RSS is the engine's, not its 256 MiB buffer ($(field peak_rss_mb) MB)" \
	awk -v r="$(field peak_rss_mb)" 'BEGIN { exit !(r > 0 && r < 200) }'
line=$($SHOAL bench --model "$M" --threads 1 --prompt 4 --gen 8 2>&1)
check "bench without --bound prints no bound" sh -c "! echo \"\$1\" | grep -q bound_gb_s" _ "$line"
done_tests
