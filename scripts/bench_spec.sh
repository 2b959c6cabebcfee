#!/bin/sh
# bench_spec.sh (a `make bench` section): speculative decoding (docs/speculative.md). Prints,
# never asserts (speed figures depend on the machine's load):
#   1. one node, stories260K, 1 thread: decode with --spec off and auto (prompt lookup), the best
#      and the median of interleaved runs: auto must not cost more than ~3 %;
#   2. the latency lab (../shared/tools/latlab.sh: 3 hosts, 250 us one way, 1 Gbit/s), shoal
#      worker ranks in tensor parallel, 1 thread each: stories260K (F32) drafted by its F16 copy
#      (shoal mkmodel --from) and by prompt lookup on a prompt that repeats a passage, against
#      --spec off, with the greedy text compared;
#   3. the same lab with 3 agents through the API: the draft model (the F16 copy, --spec auto)
#      on a story and prompt lookup on the repeated passage, each against --spec off.
# The lab's names are global: it runs only when no lat* namespace exists, under
# flock /tmp/shoal-lab.lock (and the session lock of tests/lab.sh), and is always torn down.
# BENCH_SPEC_GEN: tokens per lab run (default 200); BENCH_SPEC_GEN1: per one-node run (1000);
# BENCH_SPEC_RUNS: one-node runs per mode (9); BENCH_SPEC_PARTS: which of 1 2 3 to run.
BUILD=${BUILD:-build}
SHOAL=${SHOAL:-$BUILD/shoal}
GEN=${BENCH_SPEC_GEN:-200}
RUNS=${BENCH_SPEC_RUNS:-9}
SHARED=${SHOAL_SHARED:-../shared}
M=$SHARED/models/stories260K.gguf
if [ ! -r "$M" ]; then
	echo "skipped: no $M"
	exit 0
fi
case "$SHOAL" in /*) ;; *) SHOAL=$PWD/$SHOAL ;; esac
case "$M" in /*) ;; *) M=$PWD/$M ;; esac
T=$(mktemp -d /tmp/shoal-benchspec.XXXXXX)
D=$T/stories260K-f16.gguf
"$SHOAL" mkmodel --from "$M" --type f16 -o "$D" >/dev/null || { echo "mkmodel --from failed"; exit 0; }
ONCE="Once upon a time"
# stories260K does not follow instructions, but continues a repeated passage
REPEAT="Say it again and again: The cat is on the mat. The cat is on the mat. The cat is on the mat. The cat is on the mat. The cat"

# tok/s of generate's --stats line on stdin
tps() { sed -n 's/.*generation: [0-9]* tokens in [0-9.]* ms (\([0-9.]*\) tok\/s.*/\1/p'; }
# "A of B drafted accepted, C tokens per verify" from the spec line on stdin
specfig() {
	sed -n 's/.*verifies, \([0-9]*\) of \([0-9]*\) drafted tokens accepted ([0-9.%]*), \([0-9.]*\) tokens per verify.*/\1 of \2 drafts accepted, \3 tokens per verify/p'
}
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print 0 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "?" }'; }

# ---- 1. one node ---------------------------------------------------------------------------
# Runs at real-time priority when root (chrt -f 5), so that the other load of a shared machine
# does not preempt them: the best run of each mode is the figure least disturbed, the median
# the typical one.
ONE_RT=""
[ "$(id -u)" = 0 ] && command -v chrt >/dev/null && ONE_RT="chrt -f 5"
best() { sort -n | tail -1; }
one_node() { # label prompt
	: >"$T/off" && : >"$T/auto"
	for i in $(seq "$RUNS"); do
		for mode in off auto; do
			$ONE_RT "$SHOAL" generate --model "$M" --prompt "$2" --max-tokens "$GEN1" \
				--threads 1 --spec $mode --stats 2>"$T/err" >/dev/null
			tps <"$T/err" >>"$T/$mode"
		done
	done
	echo "  $1: best off $(best <"$T/off"), auto $(best <"$T/auto") tok/s:" \
		"auto/off $(ratio "$(best <"$T/auto")" "$(best <"$T/off")");" \
		"median off $(median <"$T/off"), auto $(median <"$T/auto"):" \
		"$(ratio "$(median <"$T/auto")" "$(median <"$T/off")") ($(specfig <"$T/err" |
			sed 's/^$/no drafts/'))"
}
GEN1=${BENCH_SPEC_GEN1:-1000}
PARTS=${BENCH_SPEC_PARTS:-1 2 3}
part() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
if part 1; then
echo "one node, stories260K F32, 1 thread, $GEN1 tokens, $RUNS interleaved runs per mode" \
	"$([ -n "$ONE_RT" ] && echo "at real-time priority ")(load $(cut -d' ' -f1 /proc/loadavg)):"
one_node "story" "$ONCE"
one_node "repeated passage" "$REPEAT"
fi

# ---- 2. the latency lab ----------------------------------------------------------------------
LAB=$SHARED/tools/latlab.sh
lab_skip() { echo "lab: skipped ($1)"; rm -rf "$T"; exit 0; }
[ "$(id -u)" = 0 ] || lab_skip "needs root"
[ -r "$LAB" ] || lab_skip "no $LAB"
for c in ip flock ping cc; do command -v $c >/dev/null 2>&1 || lab_skip "no $c"; done
exec 7>/tmp/shoal-lab.lock
flock -w 900 7 || lab_skip "/tmp/shoal-lab.lock stayed busy"
exec 8>/tmp/shoal-latlab.session.lock
flock -w 900 8 || lab_skip "the lab session lock stayed busy"
if ip netns list 2>/dev/null | grep -q '^lat'; then
	lab_skip "the latency lab is in use (lat* namespaces exist)"
fi
lab() { bash "$LAB" "$@" 7>&- 8>&-; }
trap 'lab down >/dev/null 2>&1; rm -rf "$T"' EXIT
trap 'lab down >/dev/null 2>&1; rm -rf "$T"; exit 130' INT TERM
lab up 3 250 1000 >/dev/null || lab_skip "latlab up failed"
RT=""
command -v chrt >/dev/null && RT="chrt -f 5"
rtt=$(lab run 1 ping -c 50 -i 0.02 10.79.0.2 2>/dev/null | sed -n 's/.*time=\([0-9.]*\).*/\1/p' | median)
P=10.79.0.1:7611,10.79.0.2:7612,10.79.0.3:7613

# one rank-0 run of 3 tensor ranks: prints generate's output (text + --stats) into $T/out
ranks() {
	for r in 1 2; do
		lab bg $((r + 1)) "$T/w$r.log" $RT "$SHOAL" worker --rank $r --world 3 --peers "$P" \
			--token bench --model "$M" --threads 1 --log-level warn >/dev/null
	done
	lab run 1 $RT "$SHOAL" worker --rank 0 --world 3 --peers "$P" --token bench --model "$M" \
		--threads 1 --log-level warn --max-tokens "$GEN" --stats "$@" >"$T/out" 2>&1
	sleep 0.3
}
# label prompt [spec flags...]: off and drafted runs, interleaved, 3 of each
lab_case() {
	label=$1 prompt=$2
	shift 2
	: >"$T/l_off" && : >"$T/l_on"
	same="greedy text identical in every run"
	for i in 1 2 3; do
		ranks --prompt "$prompt" --spec off
		tps <"$T/out" >>"$T/l_off"
		grep -v '^prompt:\|^speculative\|^rank\|^[0-9:.]* ' "$T/out" >"$T/text_off"
		ranks --prompt "$prompt" "$@"
		tps <"$T/out" >>"$T/l_on"
		grep -v '^prompt:\|^speculative\|^rank\|^[0-9:.]* ' "$T/out" >"$T/text_on"
		cmp -s "$T/text_off" "$T/text_on" || same="TEXT DIFFERS from --spec off"
	done
	off=$(median <"$T/l_off") on=$(median <"$T/l_on")
	echo "  $label: off $off tok/s, drafted $on tok/s: $(ratio "$on" "$off")x;" \
		"$same; $(specfig <"$T/out")"
}
if part 2; then
echo "latency lab, 3 hosts, 250 us one way / 1 Gbit/s (ping RTT median $rtt ms), shoal worker" \
	"ranks in tensor parallel, 1 thread each, stories260K F32, $GEN tokens (median of 3):"
lab_case "draft model (F16 copy), --spec auto" "$ONCE" --draft-model "$D"
lab_case "draft model (F16 copy), --spec model" "$ONCE" --spec model --draft-model "$D"
lab_case "prompt lookup, repeated passage, --spec auto" "$REPEAT" --spec auto
lab_case "prompt lookup, a story, --spec auto" "$ONCE" --spec auto
fi
part 3 || exit 0

# ---- 3. agents through the API ---------------------------------------------------------------
# 3 agents (one per lab host, 1 thread, every host holding the model and the draft), the
# leader's decode speed of single-stream completions (shoal_tokens_per_second: tokens over the
# time after the prompt), --spec off against a draft model, the texts compared.
if ! "$SHOAL" agent --help 2>&1 | grep -q -- --draft-model; then
	echo "agents: skipped (this shoal agent has no --draft-model)"
	exit 0
fi
STRAT=""
"$SHOAL" agent --help 2>&1 | grep -q -- --strategy && STRAT=yes
api() { lab run 1 curl -s -L --max-time 60 "$@"; }
leader_addr() {
	api "http://10.79.0.1:8080/v1/cluster" | tr ',{}' '\n\n\n' |
		awk '/"addr"/ { a = $0 } /"role": *"leader"/ { print a }' |
		sed 's/.*"addr": *"\([^"]*\)".*/\1/' | head -1
}
agents() { # label tag [agent flags...]: starts 3 agents, runs the completions of $APROMPT
	# (default: a story), stops them
	label=$1 res=$2
	shift 2
	pids=""
	for h in 1 2 3; do
		rm -rf "$T/st$h"
		peers=""
		for o in 1 2 3; do [ $o = $h ] || peers="$peers --peer 10.79.0.$o:7411"; done
		pids="$pids $(lab bg $h "$T/agent$h.log" $RT "$SHOAL" agent --token bench \
			--state-dir "$T/st$h" --model "$M" --threads 1 --expect 3 $peers \
			--log-level warn "$@")"
	done
	ok=""
	for i in $(seq 120); do
		[ "$(lab run 1 curl -s -o /dev/null -w '%{http_code}' --max-time 1 -L \
			http://10.79.0.1:8080/health)" = 200 ] && { ok=1; break; }
		sleep 0.5
	done
	if [ -z "$ok" ]; then
		echo "  $label: no leader served within 60 s"
	else
		la=$(leader_addr)
		plan=$(api "http://10.79.0.1:8080/v1/cluster" | tr ',' '\n' |
			sed -n 's/.*"strategy": *"\([a-z]*\)".*/\1/p; s/.*"ranks": *\([0-9]*\).*/\1 ranks/p' |
			tr '\n' ' ')
		: >"$T/a_tps"
		for i in 0 1 2 3; do
			api -H 'Content-Type: application/json' -d "{\"prompt\":\"${APROMPT:-$ONCE}\",\"max_tokens\":$GEN,\"temperature\":0}" \
				"http://10.79.0.1:8080/v1/completions" >"$T/a_out"
			[ $i = 0 ] && continue # the first warms the caches and the controller
			api "http://$la/metrics" | sed -n 's/^shoal_tokens_per_second \(.*\)/\1/p' >>"$T/a_tps"
		done
		jq -r '.choices[0].text' <"$T/a_out" >"$T/a_text_$res" 2>/dev/null
		tps_a=$(median <"$T/a_tps")
		echo "$tps_a" >"$T/a_res_$res"
		spec=$(api "http://$la/metrics" | sed -n 's/^shoal_spec_acceptance_rate{mode="\([a-z]*\)"} \(.*\)/\1, acceptance \2/p; s/^shoal_spec_tokens_per_verify \(.*\)/\1 tokens per verify/p' | tr '\n' ' ')
		echo "  $label: plan $plan(leader $la): $tps_a tok/s${spec:+; $spec}"
	fi
	for p in $pids; do kill "$p" 2>/dev/null; done
	for p in $pids; do while kill -0 "$p" 2>/dev/null; do sleep 0.1; done; done
}
echo "3 agents in the same lab (1 thread each, every host has the model and the draft)," \
	"single-stream /v1/completions of $GEN tokens (median of 3, after one warm-up):"
agents_pair() { # tag [flags]
	tag=$1
	shift
	rm -f "$T"/a_res_* "$T"/a_text_*
	agents "$tag --spec off" off --spec off "$@"
	agents "$tag --draft-model (auto)" on --draft-model "$D" "$@"
	off=$(cat "$T/a_res_off" 2>/dev/null) on=$(cat "$T/a_res_on" 2>/dev/null)
	same=$(cmp -s "$T/a_text_off" "$T/a_text_on" && echo "greedy text identical" || echo "TEXT DIFFERS")
	echo "  $tag: drafted/off $(ratio "$on" "$off")x; $same"
}
agents_pair "--strategy auto"
[ -z "$STRAT" ] || agents_pair "--strategy tensor" --strategy tensor
# prompt lookup alone (no draft model): a prompt that repeats a passage
rm -f "$T"/a_res_* "$T"/a_text_*
APROMPT=$REPEAT
agents "repeated passage, --spec off" off --spec off
agents "repeated passage, prompt lookup (--spec auto)" on --spec auto
APROMPT=
off=$(cat "$T/a_res_off" 2>/dev/null) on=$(cat "$T/a_res_on" 2>/dev/null)
same=$(cmp -s "$T/a_text_off" "$T/a_text_on" && echo "greedy text identical" || echo "TEXT DIFFERS")
echo "  prompt lookup, repeated passage: drafted/off $(ratio "$on" "$off")x; $same"
