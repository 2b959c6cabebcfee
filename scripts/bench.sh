#!/bin/sh
# bench.sh: runs every scripts/bench_*.sh section in name order (each engineer adds a section
# without touching this driver). Prints figures; never fails because a machine is slow.
# Usage: scripts/bench.sh [BUILD_DIR]
BUILD=${1:-build}
export BUILD
SHOAL=${SHOAL_BIN:-$BUILD/shoal}
export SHOAL
echo "shoal bench on $(uname -m), $(getconf _NPROCESSORS_ONLN 2>/dev/null || echo '?') cores," \
	"$(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
for s in scripts/bench_*.sh; do
	[ -e "$s" ] || continue
	echo
	echo "== $(basename "$s" .sh | sed 's/^bench_//')"
	sh "$s" || echo "(section $(basename "$s") failed: exit $?)"
done
