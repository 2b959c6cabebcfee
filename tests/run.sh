#!/bin/sh
# Runs every test program (build/tests/test_*) and test script (tests/t_*.sh), each of which closes
# with "N passed, N failed[, N skipped]", and sums them into one closing line. A program that
# crashes or exits non-zero without a failure count counts as one failure.
# Usage: tests/run.sh [BUILD_DIR] [FILTER]
BUILD=${1:-build}
FILTER=${2:-}
P=0 F=0 S=0
LOG=$BUILD/test-logs
mkdir -p "$LOG"
for t in "$BUILD"/tests/test_* tests/t_*.sh; do
	[ -e "$t" ] || continue
	name=$(basename "$t")
	case "$name" in *.o|*.d) continue ;; esac
	[ -n "$FILTER" ] && case "$name" in *$FILTER*) ;; *) continue ;; esac
	start=$(date +%s)
	case "$t" in
	*.sh) BUILD=$BUILD sh "$t" >"$LOG/$name.out" 2>"$LOG/$name.err" ;;
	*) "$t" >"$LOG/$name.out" 2>"$LOG/$name.err" ;;
	esac
	rc=$?
	line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$LOG/$name.out" | tail -n 1)
	p=$(echo "$line" | sed -n 's/^\([0-9]*\) passed.*/\1/p')
	f=$(echo "$line" | sed -n 's/.* \([0-9]*\) failed.*/\1/p')
	s=$(echo "$line" | sed -n 's/.* \([0-9]*\) skipped.*/\1/p')
	p=${p:-0} f=${f:-0} s=${s:-0}
	if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
	P=$((P + p)) F=$((F + f)) S=$((S + s))
	secs=$(($(date +%s) - start))
	if [ "$f" -ne 0 ]; then
		echo "FAIL $name ($p passed, $f failed, ${secs}s, exit $rc)"
		sed 's/^/    /' "$LOG/$name.err" | tail -n 40
	else
		echo "ok   $name ($p passed, $s skipped, ${secs}s)"
		grep -h '^skip ' "$LOG/$name.err" | sed 's/^/    /'
	fi
done
if [ "$S" -ne 0 ]; then
	echo "$P passed, $F failed, $S skipped"
else
	echo "$P passed, $F failed"
fi
[ "$F" -eq 0 ]
