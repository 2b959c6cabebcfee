#!/bin/sh
# bench_tp_lab.sh: tensor parallel over a link with real latency (the latency lab, tests/lab.sh):
# 2 hosts at 40 us one way / 1 Gbit (0.08-0.19 ms ping RTT on an idle machine, by machine: set
# BENCH_TP_LAB_DELAY, one way in us, for the issue's 0.19 ms where the lab is faster), the 0.85B Q4_0 model
# of issue 26, 2 ranks x 1 thread. Prints: the link (ping, and the link probe's RTT, 8 KB RTT,
# gap and throughput), decode tok/s, communication per step and its share on each rank, the cost
# of one all-reduce inside the decode (mean wait per sync: with both ranks in step each sync
# costs the step about one transfer, and the rank that arrived first waits it), the transport
# alone (2048-float all-reduces between 300 us of busy work: f32, the 8-bit wire, and that
# streamed in 2 chunks), f32 and the 8-bit wire. Printed,
# never asserted. Skips (one line) when not root.
# The ranks run SCHED_FIFO below the lab's switch (LAB_RT=0: normal scheduling): on a busy
# shared machine a rank that sleeps in poll() otherwise waits for a time slice, which would be
# measured as network latency. SHOAL_BASE=path/to/older/shoal also runs that binary, for a
# before/after in the same run (both wires, each followed by this binary again).
# BENCH_TP_LAB_GEN: tokens (default 64).
BUILD=${BUILD:-build}
SHOAL=${SHOAL:-$BUILD/shoal}
GEN=${BENCH_TP_LAB_GEN:-64}
DELAY=${BENCH_TP_LAB_DELAY:-40}
. tests/lab.sh
if ! lab_ok; then
	echo "skip: $LAB_WHY"
	exit 0
fi
m=$(lab_model_085b) && [ -n "$m" ] || { echo "skip: mkmodel failed"; exit 0; }
case "$SHOAL" in /*) ;; *) SHOAL=$PWD/$SHOAL ;; esac
RT=""
[ "${LAB_RT:-1}" = 1 ] && command -v chrt >/dev/null && RT="chrt -f 5"
T=$(mktemp -d /tmp/shoal-tplab.XXXXXX)
trap 'lab_down; rm -rf "$T"' EXIT
lab_up 2 "$DELAY" 1000 || { echo "skip: $LAB_WHY"; exit 0; }
trap 'lab_down; rm -rf "$T"' EXIT
P=$(lab_ip 1):7611,$(lab_ip 2):7612

echo "link: $DELAY us one way, 1 Gbit/s; ping RTT median $(lab_rtt 1 2) ms" \
	"(RT ranks: $([ -n "$RT" ] && echo yes || echo no))"
probe=$BUILD/tests/test_probe
if [ -x "$probe" ]; then
	lab_bg 2 "$T/ps" $RT "$PWD/$probe" serve 7613 >/dev/null
	sleep 0.3
	lab_run 1 $RT "$PWD/$probe" probe "$(lab_ip 2)" 7613 8192 2>&1 | awk '{
		printf "link probe: RTT median %s us, p90 %s; 8 KB each way %s us; gap %s us; " \
			"%s Mbit/s\n", $2, $4, $10, $12, $14 }'
fi

# one decode run: prints "label tok/s | rank 0 comm | rank 1 comm | per-sync waits"
# TCP segments host 1 has sent so far (its namespace's /proc/net/snmp: Tcp OutSegs)
out_segs() { lab_run "$1" awk '/^Tcp:/ && ++n == 2 { print $12 }' /proc/net/snmp; }

decode() {
	label=$1 bin=$2
	shift 2
	rm -f "$T"/trace.* "$T/r1"
	s0=$(out_segs 1) t0=$(out_segs 2)
	export SHOAL_TP_TRACE="$T/trace"
	pid=$(lab_bg 2 "$T/r1" $RT "$bin" worker --rank 1 --world 2 --peers "$P" --token bench \
		--model "$m" --threads 1 --stats --log-level warn "$@")
	lab_run 1 $RT "$bin" worker --rank 0 --world 2 --peers "$P" --token bench --model "$m" \
		--threads 1 --prompt "Once" --max-tokens "$GEN" --ignore-eos --spec off --stats --log-level warn "$@" \
		>/dev/null 2>"$T/r0"
	unset SHOAL_TP_TRACE
	lab_wait "$pid"
	tps=$(sed -n 's/.*generation: \([0-9]*\) tokens in [0-9.]* ms (\([0-9.]*\) tok\/s).*/\2 tok\/s (\1 tokens)/p' "$T/r0")
	[ -n "$tps" ] || { echo "$label: run failed: $(tail -1 "$T/r0")"; return; }
	echo "$label: decode $tps"
	# every segment crosses the lab's userspace switch, which forwards it on the ranks' cores
	s1=$(out_segs 1) t1=$(out_segs 2)
	[ -n "$s0" ] && [ -n "$s1" ] && [ -n "$t0" ] && [ -n "$t1" ] &&
		awk -v d=$((s1 - s0)) -v e=$((t1 - t0)) -v g="$GEN" 'BEGIN {
		printf "  TCP segments sent: rank 0 %d, %.1f per decoded token; rank 1 %d, %.1f\n",
			d, d / g, e, e / g }'
	for r in 0 1; do
		sed -n "s/^rank $r\/2: [0-9]* steps, [0-9]* tokens; communication \([0-9.]*\) ms per step (\([0-9.]*\)% of \([0-9.]*\) ms).*/  rank $r: communication \1 ms per step, \2% of a \3 ms step/p" "$T/r$r"
	done
	# decode syncs only (the first pass is the prompt's): each rank's mean wait per sync, and
	# what the network adds to a step: the wall time (rank 0's compute and waits) less, per
	# segment between two syncs, the slower rank's compute. The rest of the waits is skew:
	# a rank computing longer (on this 2-core machine mostly the ranks and the lab's switch
	# taking turns on the cores), which a faster network would not remove.
	[ -s "$T/trace.0" ] && [ -s "$T/trace.1" ] &&
		paste "$T/trace.0" "$T/trace.1" | tail -n +33 | awk -v tps="${tps%% *}" '
		{ a += $1; b += $3; m[++n] = $1 < $3 ? $1 : $3; wall += $1 + $2; cmax += $2 > $4 ? $2 : $4
		  c0 += $2; c1 += $4 }
		END { if (!n) exit
			printf "  decode steps only (the rank lines above include the prompt'"'"'s " \
			"pass): rank 0 in syncs %.1f%% of its time, rank 1 %.1f%%\n",
			100 * a / (a + c0), 100 * b / (b + c1)
			printf "  per all-reduce (%d syncs): mean wait %.0f us (rank 0) / %.0f us " \
			"(rank 1); the later rank'"'"'s own cost %.0f us\n", n, a / n, b / n, med(m, n)
			steps = wall / 1000 / (1000 / tps)
			printf "  the network'"'"'s share of a decode step (wall less each segment'"'"'s " \
			"slower compute): %.3f of %.3f ms, %.1f%%\n", (wall - cmax) / 1000 / steps,
			wall / 1000 / steps, 100 * (wall - cmax) / wall }
		function med(v, k,   i, j, t) { for (i = 2; i <= k; i++) for (j = i; j > 1 && v[j-1] > v[j]; j--) { t = v[j]; v[j] = v[j-1]; v[j-1] = t } return v[int((k + 1) / 2)] }'
}

decode "tensor 2x1, f32 wire" "$SHOAL"
decode "tensor 2x1, 8-bit wire" "$SHOAL" --q8-wire
if [ -n "${BENCH_TP_LAB_STREAM:-}" ]; then
	export SHOAL_TP_STREAM=$BENCH_TP_LAB_STREAM
	decode "tensor 2x1, 8-bit wire, streamed in $SHOAL_TP_STREAM" "$SHOAL" --q8-wire
	unset SHOAL_TP_STREAM
fi
if [ -n "${SHOAL_BASE:-}" ]; then
	decode "before ($SHOAL_BASE), f32 wire" "$SHOAL_BASE"
	decode "tensor 2x1, f32 wire (again)" "$SHOAL"
	decode "before ($SHOAL_BASE), 8-bit wire" "$SHOAL_BASE" --q8-wire
	decode "tensor 2x1, 8-bit wire (again)" "$SHOAL" --q8-wire
fi

coll=$BUILD/tests/test_coll
if [ -x "$coll" ]; then
	for w in "0 0" "1 0" "1 2"; do # f32, q8, q8 streamed in 2 chunks
		pid=$(lab_bg 2 "$T/c1" $RT "$PWD/$coll" peer 1 2 "$(lab_ip 1):7621,$(lab_ip 2):7622" \
			2048 1000 300 $w)
		lab_run 1 $RT "$PWD/$coll" peer 0 2 "$(lab_ip 1):7621,$(lab_ip 2):7622" 2048 1000 \
			300 $w 2>/dev/null | sed 's/^rank 0\/2 /transport alone: /'
		lab_wait "$pid"
	done
fi
echo "  target (issue 26): communication <= 25% of a decode step at 0.19 ms RTT"
