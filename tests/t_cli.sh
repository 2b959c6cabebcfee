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
# integer flags are strict everywhere (cli_parse_int): "foo" and "12x" are errors, never 0
for args in "bench --model x --threads foo" "bench --model x --gen 12x" \
	"agent --token t --expect foo" "serve --model x --port foo" "mkmodel --dim foo -o /dev/null" \
	"plan --view x --model y --ctx 1k"; do
	# shellcheck disable=SC2086
	$SHOAL $args >/dev/null 2>&1; rc=$?
	check "shoal $args: refused with exit 2 (got $rc)" [ $rc -eq 2 ]
done
done_tests
