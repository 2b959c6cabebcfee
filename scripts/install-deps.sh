#!/bin/sh
# Installs what shoal needs to build and test, and nothing when it is all present.
# Called by the Makefile before every build; quiet when nothing is missing.
# Debian/Ubuntu: apt-get (with sudo when not root). macOS: prints the Homebrew line.
set -eu

# libgnutls30: libmicrohttpd's HTTPS (--tls-cert); openssl: the test CA of tests/t_tls.sh.
# iputils-ping: the latency lab measures its links with ping (tests/lab.sh).
PKGS="gcc make pkg-config clang libavahi-client-dev libavahi-compat-libdnssd-dev libsodium-dev
libmicrohttpd-dev libjansson-dev libibverbs-dev libopenblas-dev libpcre2-dev avahi-daemon
avahi-utils dbus iproute2 iputils-ping util-linux procps curl tcpdump chromium openssl python3
libgnutls30"
# Extras wanted by optional tests (aarch64 cross build under qemu); failure to get them is not fatal.
OPTIONAL="gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user"

case "$(uname -s)" in
Darwin)
	if ! pkg-config --exists libsodium libmicrohttpd jansson libpcre2-8 2>/dev/null; then
		echo "shoal: on macOS install the dependencies with Homebrew:" >&2
		echo "  brew install pkg-config libsodium libmicrohttpd jansson pcre2" >&2
		exit 1
	fi
	exit 0
	;;
esac

if ! command -v dpkg-query >/dev/null 2>&1; then
	echo "shoal: not a Debian/Ubuntu system; install by hand: $PKGS" >&2
	exit 0
fi

missing() {
	for p in $1; do
		s=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
		case "$s" in *" installed") ;; *) printf '%s ' "$p" ;; esac
	done
}

need=$(missing "$PKGS")
# Node may come from elsewhere (nodesource's nodejs conflicts with Debian's npm): only ask apt
# for it when there is no node/npm on the PATH.
command -v node >/dev/null 2>&1 || need="$need$(missing nodejs)"
command -v npm >/dev/null 2>&1 || need="$need$(missing npm)"
want=$(missing "$OPTIONAL")
[ -z "$need$want" ] && exit 0

SUDO=
[ "$(id -u)" -ne 0 ] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
echo "shoal: installing $need$want" >&2
$SUDO apt-get update -qq >/dev/null
if [ -n "$need" ]; then
	# shellcheck disable=SC2086
	$SUDO apt-get install -y -qq --no-install-recommends $need >/dev/null
fi
if [ -n "$want" ]; then
	# shellcheck disable=SC2086
	$SUDO apt-get install -y -qq --no-install-recommends $want >/dev/null ||
		echo "shoal: optional packages not installed ($want); their tests will skip" >&2
fi
