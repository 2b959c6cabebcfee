#!/bin/sh
# Transport figures: all-reduce latency for 8 KB and bandwidth for 8 MB between 2 (and 3)
# processes on loopback, every frame sealed, plus the raw XChaCha20-Poly1305 cost.
# Prints; never fails on a slow machine. Usage: scripts/bench_transport.sh [BUILD_DIR]
BUILD=${1:-${BUILD:-build}}
bin=$BUILD/tests/test_coll
[ -x "$bin" ] || { echo "bench_transport: $bin not built (make)"; exit 0; }
SHOAL_LOG=warn "$bin" bench 2 || echo "bench_transport: 2-rank run failed"
SHOAL_LOG=warn "$bin" bench 3 | grep -v '^XChaCha' || echo "bench_transport: 3-rank run failed"
exit 0
