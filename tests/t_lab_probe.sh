#!/bin/sh
# t_lab_probe.sh: link probes (transport.h) in the latency lab, against what ping and a TCP
# stream measure on the same link: the RTT median within reason of ping's, the burst's throughput
# within reason of a 3 s TCP stream's, and both following the lab when its delay and rate change
# (RTT up by most of the added 2 x 210 us; throughput down at 100 Mbit/s). Bounds are loose (a
# busy machine slows everything, never the other way round). Needs root; skips otherwise.
. tests/lib.sh
. tests/lab.sh
PROBE=$BUILD/tests/test_probe
if ! lab_ok; then
	skip "$LAB_WHY"
	done_tests
	exit $?
fi
[ -x "$PROBE" ] || { fail "no $PROBE (make)"; done_tests; exit 1; }
case "$PROBE" in /*) ;; *) PROBE=$PWD/$PROBE ;; esac
T=$(mktemp -d /tmp/shoal-labprobe.XXXXXX)
if ! lab_up 2 40 1000; then
	skip "$LAB_WHY"
	rm -rf "$T"
	done_tests
	exit $?
fi
trap 'lab_down; rm -rf "$T"' EXIT

# one probe run lat1 -> lat2; sets RTT (median, us), MIN (smallest RTT: load only adds to it),
# TPUT (Mbit/s)
probe() {
	pid=$(lab_bg 2 "$T/serve" "$PROBE" serve 7811)
	sleep 0.3
	out=$(lab_run 1 "$PROBE" probe "$(lab_ip 2)" 7811 8192 2>"$T/err")
	lab_wait "$pid"
	echo "  probe ($1): $out" >&2
	RTT=$(echo "$out" | awk '{ print $2 }')
	MIN=$(echo "$out" | awk '{ print $6 }')
	TPUT=$(echo "$out" | awk '{ print $14 }')
	[ -n "$RTT" ] && [ -n "$TPUT" ]
}
ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 >= b + 0) }'; }

check "probe runs at 40 us / 1 Gbit" probe "40 us"
rtt40=$RTT min40=$MIN tput40=$TPUT
ping40=$(lab_rtt 1 2)
stream=$(bash "$LAB_SH" tput 1 2 3 8>&- | sed -n 's/.* = \([0-9.]*\) Mbit\/s.*/\1/p')
echo "  ping RTT median ${ping40} ms; TCP stream ${stream} Mbit/s" >&2
# within reason: the probe's RTT is what a sealed message sees (it may beat ping, whose own
# wake-up counts); between a fifth and 5x ping's (+2 ms on a busy day)
check "RTT within reason of ping" ge "$rtt40" "$(awk -v p="$ping40" 'BEGIN { print p * 200 }')"
check "RTT not far above ping" ge "$(awk -v p="$ping40" 'BEGIN { print p * 5000 + 2000 }')" "$rtt40"
check "throughput within reason of a TCP stream" ge "$tput40" \
	"$(awk -v s="$stream" 'BEGIN { print s / 8 }')"
check "throughput not above the link" ge 1500 "$tput40"

lab_set 250 1000
check "probe runs at 250 us" probe "250 us"
check "RTT follows +420 us of delay" ge "$MIN" "$(awk -v r="$min40" 'BEGIN { print r + 250 }')"

lab_set 40 100
check "probe runs at 100 Mbit/s" probe "100 Mbit/s"
check "throughput follows the rate" ge 200 "$TPUT"
check "throughput still measured" ge "$TPUT" 5
rm -rf "$T"
done_tests
