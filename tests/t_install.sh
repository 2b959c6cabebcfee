#!/bin/sh
# t_install.sh: `make install DESTDIR=...` puts the binary, shoal(1) and the systemd unit in
# place, the installed binary runs, the man page covers every command, `systemd-analyze verify`
# accepts the unit (with PREFIX pointing at a real install so its ExecStart exists), and
# `make uninstall` removes every file install wrote.
. tests/lib.sh
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
MK="make -s SKIP_DEPS=1 BUILD=$BUILD"

$MK install DESTDIR="$TMP/dest" >"$TMP/log" 2>&1 || fail "make install: $(cat "$TMP/log")"
P=$TMP/dest/usr/local
check "binary installed, executable" [ -x "$P/bin/shoal" ]
check "man page installed" [ -f "$P/share/man/man1/shoal.1" ]
check "systemd unit installed" [ -f "$P/lib/systemd/system/shoal.service" ]
check "installed binary runs" sh -c '"$1" --version | grep -q "^shoal "' _ "$P/bin/shoal"
for c in $("$P/bin/shoal" --help 2>&1 | sed -n '/^commands:/,/^$/s/^  \([a-z][a-z-]*\)  .*/\1/p'); do
	check "man page has 'shoal $c'" grep -q "^\.SS shoal $c\$" "$P/share/man/man1/shoal.1"
done
check "man page has the agent's options" grep -q -- "--token-file" "$P/share/man/man1/shoal.1"
if command -v man >/dev/null 2>&1; then
	check "man renders shoal(1)" sh -c 'man -l "$1" 2>/dev/null | grep -q "shoal agent"' _ "$P/share/man/man1/shoal.1"
fi
U=$P/lib/systemd/system/shoal.service
check "unit runs the agent with the token file" grep -q -- "^ExecStart=/usr/local/bin/shoal agent --token-file /etc/shoal/token --state-dir /var/lib/shoal " "$U"
check "unit restarts on failure" grep -q "^Restart=on-failure" "$U"
check "unit refuses a token file that is not mode 0600" grep -q '^ExecStartPre=.*%%a.* = 600' "$U"
$MK uninstall DESTDIR="$TMP/dest" >"$TMP/log" 2>&1 || fail "make uninstall: $(cat "$TMP/log")"
check "uninstall removes every file" [ -z "$(find "$TMP/dest" -type f)" ]

if command -v systemd-analyze >/dev/null 2>&1; then
	$MK install PREFIX="$TMP/usr" >"$TMP/log" 2>&1 || fail "make install PREFIX: $(cat "$TMP/log")"
	if MANPATH=$TMP/usr/share/man systemd-analyze verify "$TMP/usr/lib/systemd/system/shoal.service" \
		>"$TMP/verify" 2>&1; then
		pass
	else
		fail "systemd-analyze verify: $(cat "$TMP/verify")"
	fi
	$MK uninstall PREFIX="$TMP/usr" >/dev/null 2>&1
	check "uninstall (PREFIX) removes every file" [ -z "$(find "$TMP/usr" -type f)" ]
else
	skip "t_install: systemd-analyze not installed (the unit is not verified)"
fi
done_tests
