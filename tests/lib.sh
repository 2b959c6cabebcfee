# lib.sh: helpers for the shell tests (tests/t_*.sh), sourced by each. Every check prints one line
# on failure; `done_tests` closes with "N passed, N failed[, N skipped]" and sets the exit code.
BUILD=${BUILD:-build}
SHOAL=${SHOAL_BIN:-$BUILD/shoal}
SHARED=${SHOAL_SHARED:-../shared}
# The agents of the tests plan by the links' kinds (every member a rank, as their checks count):
# they keep their measured compute to themselves (agent.c's SHOAL_COMPUTE=off), so the cost
# model stays out of tests of anything else. t_lab_links sets SHOAL_COMPUTE=on: the cost model
# is what it tests.
export SHOAL_COMPUTE=${SHOAL_COMPUTE:-off}
T_PASS=0 T_FAIL=0 T_SKIP=0

pass() { T_PASS=$((T_PASS + 1)); }
fail() { T_FAIL=$((T_FAIL + 1)); echo "FAIL: $*" >&2; }
skip() { T_SKIP=$((T_SKIP + 1)); echo "skip $*" >&2; }
# check "description" command...: passes when the command exits 0.
check() { d=$1; shift; if "$@"; then pass; else fail "$d"; fi; }
done_tests() {
	if [ "$T_SKIP" -ne 0 ]; then echo "$T_PASS passed, $T_FAIL failed, $T_SKIP skipped"
	else echo "$T_PASS passed, $T_FAIL failed"; fi
	[ "$T_FAIL" -eq 0 ]
}
