# lab.sh: the latency lab (../shared/tools/latlab.sh, ../shared/docs/latency-lab.md) for tests and
# benches, sourced (POSIX sh). Hosts lat1..latN (10.79.0.I) joined by a userspace switch with a
# one-way delay and a rate. The lab's names are global (one lab per machine): lab_up waits for
# the session lock ($LAB_LOCK, up to LAB_LOCK_WAIT s, default 600) so that two callers using this
# file take turns; lab_down (also run on exit) releases it.
#
#   . tests/lab.sh
#   lab_ok || { echo "skip: $LAB_WHY"; exit 0; }   # root, ip netns, ping, cc, the script
#   lab_up 2 40 1000            # N hosts, one-way delay (us), rate (Mbit/s); traps EXIT to tear down
#   lab_set 250 1000            # live change
#   lab_rtt 1 2                 # median ping RTT lat1 -> lat2 in ms (200 probes)
#   lab_run 1 CMD...            # CMD in lat1 (foreground)
#   pid=$(lab_bg 2 LOG CMD...)  # CMD in lat2, output appended to LOG; prints its pid
#   lab_ip 2                    # 10.79.0.2
#   lab_kill PID...             # stops processes lab_bg started, waits for them
#   m=$(lab_model_085b)         # issue 26's 0.85B Q4_0 model in $BUILD/bench (made once)
#   lab_down
# LAT_LAB (lab dir) and the other latlab.sh variables pass through.
LAB_SH=${LAB_SH:-${SHARED:-${SHOAL_SHARED:-../shared}}/tools/latlab.sh}
LAB_LOCK=${LAB_LOCK:-/tmp/shoal-latlab.session.lock}
LAB_WHY=""
LAB_UP=0

lab_ok() {
	if [ "$(id -u)" != 0 ]; then LAB_WHY="the latency lab needs root"; return 1; fi
	if [ ! -r "$LAB_SH" ]; then LAB_WHY="no $LAB_SH"; return 1; fi
	for c in ip ping cc flock; do
		command -v $c >/dev/null 2>&1 || { LAB_WHY="no $c (ping: iputils-ping)"; return 1; }
	done
	ip netns list >/dev/null 2>&1 || { LAB_WHY="no network namespaces"; return 1; }
	return 0
}

# fd 8 holds the session lock: the lab's own processes must not inherit it (8>&-)
lab_down() {
	[ "$LAB_UP" = 1 ] || return 0
	bash "$LAB_SH" down >/dev/null 2>&1 8>&-
	LAB_UP=0
	exec 8>&-
}

lab_up() {
	exec 8>"$LAB_LOCK"
	if ! flock -w "${LAB_LOCK_WAIT:-600}" 8; then
		exec 8>&-
		LAB_WHY="the latency lab stayed busy (another user holds $LAB_LOCK)"
		return 1
	fi
	LAB_UP=1
	trap 'lab_down' EXIT
	trap 'lab_down; exit 130' INT TERM
	bash "$LAB_SH" up "$1" "${2:-250}" "${3:-1000}" >/dev/null 8>&- ||
		{ LAB_WHY="latlab up failed"; lab_down; return 1; }
}

lab_set() { bash "$LAB_SH" set "$1" "$2" "${3:-0}" >/dev/null 8>&-; }
lab_ip() { echo "10.79.0.$1"; }
lab_run() { i=$1; shift; bash "$LAB_SH" run "$i" "$@" 8>&-; }
lab_bg() { i=$1 log=$2; shift 2; bash "$LAB_SH" bg "$i" "$log" "$@" 8>&-; }

# Median RTT in ms of N (default 200) pings from host I to host J, 10 ms apart.
lab_rtt() {
	lab_run "$1" ping -c "${3:-200}" -i 0.01 "$(lab_ip "$2")" 2>/dev/null |
		sed -n 's/.*time=\([0-9.]*\).*/\1/p' | sort -n |
		awk '{ v[NR] = $1 } END { if (NR) printf "%.3f\n", v[int((NR + 1) / 2)]; else print "?" }'
}

# Waits until pid has exited (a process lab_bg started: not our child, so no wait).
lab_wait() { while kill -0 "$1" 2>/dev/null; do sleep 0.1; done; }

# Stops processes lab_bg started (TERM) and waits until they are gone.
lab_kill() {
	for p in "$@"; do kill "$p" 2>/dev/null; done
	for p in "$@"; do lab_wait "$p"; done
}

# The path of issue 26's 0.85B Q4_0 model (dim 2048, 16 layers, seed 7) in $BUILD/bench, made
# once with $SHOAL mkmodel (~35 s); empty output when that fails.
lab_model_085b() {
	_m=${BUILD:-build}/bench/llama-0.85b-q4_0-s7.gguf
	mkdir -p "${BUILD:-build}/bench"
	if [ ! -s "$_m" ]; then
		echo "(generating $_m once)" >&2
		"${SHOAL:-${BUILD:-build}/shoal}" mkmodel --arch llama --dim 2048 --layers 16 \
			--heads 32 --kv-heads 8 --ffn 5632 --vocab 32000 --type q4_0 --seed 7 \
			-o "$_m" >/dev/null || return 1
	fi
	case "$_m" in /*) echo "$_m" ;; *) echo "$PWD/$_m" ;; esac
}
