#!/bin/sh
# The discovery suite again, with the dns_sd backend (the API macOS has, here through avahi's
# compatibility library): build/shoal-dnssd, linked by `make` from the same objects.
. tests/lib.sh
if [ -z "${SHOAL_DNSSD_BIN:-}" ] || [ ! -x "$SHOAL_DNSSD_BIN" ]; then
	skip "dns_sd discovery suite: no dns_sd binary in this build (sanitizer or non-Linux build)"
	done_tests
	exit
fi
SHOAL_BIN=$SHOAL_DNSSD_BIN exec sh tests/t_discovery.sh
