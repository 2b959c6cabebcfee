#!/bin/sh
# The Makefile's platform branches, checked by dry runs: Linux (avahi, OpenBLAS, ibverbs), Linux
# with the dns_sd backend (avahi's compat library), and macOS forced with UNAME_S=Darwin
# (Bonjour from libSystem, Accelerate for BLAS, Homebrew's pkg-config libraries).
. tests/lib.sh
dry() { make -s -n -B SKIP_DEPS=1 BUILD=build-dry "$@" build-dry/shoal 2>&1; }

linux=$(dry)
check "linux links avahi-client" sh -c 'echo "$1" | grep -q -- -lavahi-client' _ "$linux"
check "linux links OpenBLAS" sh -c 'echo "$1" | grep -q -- -lopenblas' _ "$linux"
check "linux links ibverbs" sh -c 'echo "$1" | grep -q -- -libverbs' _ "$linux"
check "linux warns and treats warnings as errors" sh -c 'echo "$1" | grep -q -- "-Wall -Wextra -Werror"' _ "$linux"

dnssd=$(dry DISC_BACKEND=dnssd)
check "dnssd backend links the compat library" sh -c 'echo "$1" | grep -q -- -ldns_sd' _ "$dnssd"
check "dnssd backend defines SHOAL_DISC_dnssd" sh -c 'echo "$1" | grep -q -- -DSHOAL_DISC_dnssd' _ "$dnssd"

mac=$(dry UNAME_S=Darwin)
check "darwin uses Accelerate" sh -c 'echo "$1" | grep -q -- "-framework Accelerate"' _ "$mac"
check "darwin defines SHOAL_ACCELERATE" sh -c 'echo "$1" | grep -q -- -DSHOAL_ACCELERATE' _ "$mac"
check "darwin uses the dns_sd backend" sh -c 'echo "$1" | grep -q -- -DSHOAL_DISC_dnssd' _ "$mac"
check "darwin does not link avahi" sh -c '! echo "$1" | grep -q -- -lavahi' _ "$mac"
check "darwin does not link OpenBLAS" sh -c '! echo "$1" | grep -q -- -lopenblas' _ "$mac"
check "darwin links libsodium, libmicrohttpd, jansson, pcre2" \
	sh -c 'echo "$1" | grep -- -lsodium | grep -- -lmicrohttpd | grep -- -ljansson | grep -q -- -lpcre2-8' _ "$mac"
rm -rf build-dry
done_tests
