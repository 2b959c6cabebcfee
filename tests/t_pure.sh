#!/bin/sh
# t_pure.sh: the cluster core and the election core are pure at link time (issue 31): every
# symbol agent/core.o and discovery/election.o leave undefined is defined in common/'s objects,
# in one of the two, or in the C library (libc, libm); the core's reader (agent/core_view.o)
# needs no more than those and core.o. Reads `nm`, as the build made the objects.
. tests/lib.sh

OBJ=$BUILD/obj
CORE=$OBJ/agent/core.o
ELEC=$OBJ/discovery/election.o
VIEW=$OBJ/agent/core_view.o
if ! command -v nm >/dev/null 2>&1; then
	skip "t_pure: nm not installed"
	done_tests
	exit $?
fi
for o in "$CORE" "$ELEC" "$VIEW"; do
	[ -f "$o" ] || { fail "t_pure: $o missing (build first)"; done_tests; exit 1; }
done
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# what the pure objects and common/ define
nm --defined-only "$CORE" "$ELEC" $OBJ/common/*.o 2>/dev/null | awk 'NF == 3 { print $3 }' |
	sort -u >"$T/ours"
# what the C library exports (the shared objects the compiler links by default)
: >"$T/libc"
for lib in libc.so.6 libm.so.6; do
	p=$(${CC:-cc} -print-file-name=$lib 2>/dev/null)
	[ -f "$p" ] || p=$(ldconfig -p 2>/dev/null | awk -v l=$lib '$1 == l { print $NF; exit }')
	[ -n "$p" ] && [ -f "$p" ] && nm -D --defined-only "$p" | awk '{ print $NF }' | sed 's/@.*//' >>"$T/libc"
done
sort -u "$T/libc" -o "$T/libc"
check "t_pure: the C library's symbols were found" [ -s "$T/libc" ]
for o in "$CORE" "$ELEC" "$VIEW"; do
	bad=""
	for sym in $(nm -u "$o" | awk '{ print $NF }' | sed 's/@.*//'); do
		case "$sym" in __asan_* | __ubsan_* | __sanitizer_* | __tsan_*) continue ;; esac
		grep -qx "$sym" "$T/ours" && continue
		[ "$o" = "$VIEW" ] && nm --defined-only "$CORE" | awk '{ print $3 }' | grep -qx "$sym" &&
			continue
		grep -qx "$sym" "$T/libc" && continue
		bad="$bad $sym"
	done
	check "t_pure: $(basename "$o") needs only libc, common/ and the other core (not:$bad)" [ -z "$bad" ]
done
# and the core writes no log line of its own: its lines go through core_config_t.log
for o in "$CORE" "$VIEW"; do
	check "t_pure: $(basename "$o") does not call log_write" sh -c "! nm -u '$o' | grep -qw log_write"
	check "t_pure: $(basename "$o") does not read log_threshold" \
		sh -c "! nm -u '$o' | grep -qw log_threshold"
done
done_tests
