#!/bin/sh
# Runs each libFuzzer target for SECONDS seconds from its seed corpus (tests/fuzz/corpus/NAME,
# copied to a scratch dir so runs do not dirty the tree). Closes with "N passed, N failed".
secs=$1; shift
P=0 F=0
for bin in "$@"; do
	name=$(basename "$bin")
	t=$secs
	# The HTTP request parser faces the network: CI gives it FUZZ_REQUEST_SECONDS (60).
	[ "$name" = fuzz_request ] && t=${FUZZ_REQUEST_SECONDS:-$secs}
	work=$(mktemp -d)
	[ -d "tests/fuzz/corpus/$name" ] && cp -r "tests/fuzz/corpus/$name/." "$work/"
	if "$bin" -max_total_time="$t" -rss_limit_mb=2048 -timeout=10 -print_final_stats=0 \
		-artifact_prefix="build-fuzz/$name-" "$work" >"build-fuzz/$name.log" 2>&1; then
		echo "ok   $name ($(grep -c '^#' "build-fuzz/$name.log") log lines, ${t}s)"
		P=$((P + 1))
	else
		echo "FAIL $name (see build-fuzz/$name.log)"; tail -n 30 "build-fuzz/$name.log"
		F=$((F + 1))
	fi
	rm -rf "$work"
done
echo "$P passed, $F failed"
[ "$F" -eq 0 ]
