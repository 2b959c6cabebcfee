# netns.sh: simulated hosts in network namespaces, each with its own D-Bus system bus and
# avahi-daemon (the recipe of ../shared/docs/netns-avahi.md). Sourced by tests (and by the demo);
# needs root. The root namespace is never touched: hosts hang off a bridge in a namespace of its own.
#
#   . tests/netns.sh
#   ns_setup 3                 # hosts 1..3 at 10.77.0.1..3, daemons up (or returns 1)
#   ns_start 1 agent CMD...    # runs CMD in host 1, output in $(ns_dir 1)/agent.log
#   ns_wait 10 CMD...          # polls CMD every 0.1 s until it succeeds or 10 s pass
#   ns_kill 1 agent KILL       # signals what ns_start started
#   ns_teardown                # also runs on EXIT (trap set by ns_setup)
#
# Names: every namespace, interface and directory of a run carries the run-unique prefix
# st<PID>_ (PID of the shell that sourced this), so concurrent runs never collide and a crashed
# run's leftovers (a prefix whose PID is gone) are found and removed before setup.
# Invariant: teardown only touches names with this run's prefix (and dead runs' prefixes).

NS_PFX="st$$"
NS_ROOT="${TMPDIR:-/tmp}/shoal-netns.$NS_PFX"
NS_HOSTS=0

# ns_require NAME: 0 when this run can build hosts (root, and the tools netns.sh and the agent
# tests use), else 1 after skip (tests/lib.sh) says why, naming the test NAME.
ns_require() {
	if [ "$(id -u)" -ne 0 ]; then
		skip "$1: needs root for network namespaces"
		return 1
	fi
	for _t in ip avahi-daemon dbus-daemon dbus-send curl jq unshare; do
		command -v $_t >/dev/null 2>&1 || { skip "$1: $_t not installed"; return 1; }
	done
}

ns_name() { echo "${NS_PFX}h$1"; }
ns_dir() { echo "$NS_ROOT/h$1"; }
ns_ip() { echo "10.77.0.$1"; }

# ns_wait SECONDS CMD...: polls every 0.1 s; returns 0 as soon as CMD succeeds, 1 at the deadline.
ns_wait() {
	_end=$(($(date +%s%N) / 1000000 + $1 * 1000)); shift
	while :; do
		"$@" && return 0
		[ "$(($(date +%s%N) / 1000000))" -ge "$_end" ] && return 1
		sleep 0.1
	done
}

ns_now_ms() { echo $(($(date +%s%N) / 1000000)); }

# A pid counts as alive unless gone or a zombie (orphans are reaped late here).
ns_pid_alive() {
	[ -n "$1" ] && [ -r "/proc/$1/stat" ] || return 1
	_st=$(sed 's/.*) \(.\).*/\1/' "/proc/$1/stat" 2>/dev/null)
	[ -n "$_st" ] && [ "$_st" != Z ] && [ "$_st" != X ]
}

_ns_pids_dead() {
	for _p in $1; do ns_pid_alive "$_p" && return 1; done
	return 0
}

# Kills everything in namespace $1 (TERM, up to 3 s, then KILL) and deletes it.
_ns_del() {
	_pids=$(ip netns pids "$1" 2>/dev/null)
	if [ -n "$_pids" ]; then
		kill -TERM $_pids 2>/dev/null
		ns_wait 3 _ns_pids_dead "$_pids" || kill -KILL $_pids 2>/dev/null
		ns_wait 2 _ns_pids_dead "$_pids"
	fi
	ip netns del "$1" 2>/dev/null
}

# Removes the namespaces of runs whose shell is gone, and their directories.
ns_cleanup_stale() {
	for _ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^st[0-9]+(h[0-9]+|sw)$'); do
		_pid=$(echo "$_ns" | sed -E 's/^st([0-9]+).*/\1/')
		[ "$_pid" = "$$" ] && continue
		ns_pid_alive "$_pid" && continue
		_ns_del "$_ns"
		rm -rf "${TMPDIR:-/tmp}/shoal-netns.st$_pid"
	done
}

ns_teardown() {
	for _ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${NS_PFX}(h[0-9]+|sw)\$"); do
		case "$_ns" in *sw) continue ;; esac
		_ns_del "$_ns"
	done
	_ns_del "${NS_PFX}sw"
	[ -n "$NS_KEEP" ] || rm -rf "$NS_ROOT"
}

_ns_write_conf() {
	_d=$(ns_dir "$1")
	cat >"$_d/dbus.conf" <<EOF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=$_d/dbus.sock</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <deny own="*"/> <deny send_type="method_call"/> <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/> <allow receive_type="method_return"/>
    <allow receive_type="error"/> <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Peer"/>
  </policy>
  <include>/usr/share/dbus-1/system.d/avahi-dbus.conf</include>
</busconfig>
EOF
	cat >"$_d/avahi.conf" <<EOF
[server]
host-name=${NS_PFX}h$1
domain-name=local
use-ipv4=yes
use-ipv6=no
allow-interfaces=${NS_PFX}v$1,${NS_PFX}w$1
enable-dbus=yes
ratelimit-interval-usec=1000000
ratelimit-burst=1000
[wide-area]
enable-wide-area=no
[publish]
publish-addresses=yes
publish-hinfo=no
publish-workstation=no
publish-domain=yes
publish-aaaa-on-ipv4=no
[reflector]
enable-reflector=no
[rlimits]
EOF
}

# ns_exec I CMD...: runs CMD in host I with that host's system bus.
ns_exec() {
	_i=$1; shift
	DBUS_SYSTEM_BUS_ADDRESS="unix:path=$(ns_dir "$_i")/dbus.sock" ip netns exec "$(ns_name "$_i")" "$@"
}

# ns_start I NAME CMD...: starts CMD in the background in host I (a child of this shell, so it is
# reaped); stdout+stderr go to $(ns_dir I)/NAME.log, the pid to NAME.pid.
ns_start() {
	_i=$1 _n=$2; shift 2
	_d=$(ns_dir "$_i")
	# a plain command (not the ns_exec function) so $! is the program itself: ip netns exec and
	# env exec, so signals reach it and not a wrapping subshell
	DBUS_SYSTEM_BUS_ADDRESS="unix:path=$_d/dbus.sock" ip netns exec "$(ns_name "$_i")" "$@" \
		>>"$_d/$_n.log" 2>&1 &
	echo $! >"$_d/$_n.pid"
}

ns_pid() { cat "$(ns_dir "$1")/$2.pid" 2>/dev/null; }

# ns_kill I NAME [SIGNAL]: signals NAME in host I and waits (5 s) until it is gone.
ns_kill() {
	_p=$(ns_pid "$1" "$2")
	[ -n "$_p" ] || return 1
	kill -"${3:-TERM}" "$_p" 2>/dev/null
	ns_wait 5 _ns_pids_dead "$_p"
}

_ns_avahi_ready() {
	ns_exec "$1" dbus-send --system --print-reply --dest=org.freedesktop.Avahi / \
		org.freedesktop.Avahi.Server.GetState 2>/dev/null | grep -q 'int32 2'
}

# ns_avahi_start I: starts avahi-daemon in host I with a private /run and waits until RUNNING.
ns_avahi_start() {
	_d=$(ns_dir "$1")
	ns_start "$1" avahi unshare --mount --propagation private sh -c \
		'mount -t tmpfs -o mode=0755,size=1m shoalrun /run && mkdir /run/avahi-daemon &&
		 exec avahi-daemon -f "$0" --no-chroot --no-drop-root --no-rlimits' "$_d/avahi.conf"
	ns_wait 10 _ns_avahi_ready "$1"
}

# ns_avahi_restart I: stops host I's avahi-daemon (SIGTERM, as a service manager would) and
# starts a new one.
ns_avahi_restart() {
	ns_kill "$1" avahi TERM && ns_avahi_start "$1"
}

_ns_bus_ready() { [ -S "$(ns_dir "$1")/dbus.sock" ]; }

# ns_host_add I: namespace, veth into the bridge, address 10.77.0.I/24, dbus and avahi.
ns_host_add() {
	_i=$1 _ns=$(ns_name "$1")
	mkdir -p "$(ns_dir "$_i")"
	ip netns add "$_ns" || return 1
	ip -n "$_ns" link set lo up
	ip -n "$_ns" link add "${NS_PFX}v$_i" type veth peer name "${NS_PFX}p$_i" netns "${NS_PFX}sw" || return 1
	ip -n "${NS_PFX}sw" link set "${NS_PFX}p$_i" master "${NS_PFX}br" up
	ip netns exec "$_ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
	ip -n "$_ns" addr add "$(ns_ip "$_i")/24" dev "${NS_PFX}v$_i"
	ip -n "$_ns" link set "${NS_PFX}v$_i" multicast on up
	ip -n "$_ns" route add 224.0.0.0/4 dev "${NS_PFX}v$_i"
	_ns_write_conf "$_i"
	ns_start "$_i" dbus dbus-daemon --config-file="$(ns_dir "$_i")/dbus.conf" --nofork --nopidfile --nosyslog
	ns_wait 5 _ns_bus_ready "$_i" || { echo "netns: dbus of host $_i did not start" >&2; return 1; }
	ns_avahi_start "$_i" || { echo "netns: avahi of host $_i did not start" >&2; return 1; }
	NS_HOSTS=$((NS_HOSTS > _i ? NS_HOSTS : _i))
}

# ns_net2_add I: a second network for host I (10.78.0.I/24 on interface ${NS_PFX}wI, through a
# second bridge), for tests of peers seen on several interfaces. avahi picks the interface up.
ns_net2_add() {
	_i=$1 _ns=$(ns_name "$1")
	if ! ip -n "${NS_PFX}sw" link show "${NS_PFX}br2" >/dev/null 2>&1; then
		ip -n "${NS_PFX}sw" link add "${NS_PFX}br2" type bridge mcast_snooping 0 stp_state 0 forward_delay 0 || return 1
		ip -n "${NS_PFX}sw" link set "${NS_PFX}br2" up
	fi
	ip -n "$_ns" link add "${NS_PFX}w$_i" type veth peer name "${NS_PFX}q$_i" netns "${NS_PFX}sw" || return 1
	ip -n "${NS_PFX}sw" link set "${NS_PFX}q$_i" master "${NS_PFX}br2" up
	ip -n "$_ns" addr add "10.78.0.$_i/24" dev "${NS_PFX}w$_i"
	ip -n "$_ns" link set "${NS_PFX}w$_i" multicast on up
}

# ns_setup N: cleans leftovers, builds the switch and hosts 1..N, sets the EXIT trap.
ns_setup() {
	ns_cleanup_stale
	ns_teardown
	trap 'ns_teardown' EXIT
	trap 'exit 130' INT TERM
	mkdir -p "$NS_ROOT"
	ip netns add "${NS_PFX}sw" || return 1
	ip -n "${NS_PFX}sw" link set lo up
	ip -n "${NS_PFX}sw" link add "${NS_PFX}br" type bridge mcast_snooping 0 stp_state 0 forward_delay 0
	ip -n "${NS_PFX}sw" link set "${NS_PFX}br" up
	_k=1
	while [ "$_k" -le "$1" ]; do
		ns_host_add "$_k" || return 1
		_k=$((_k + 1))
	done
}

# ns_capture_start FILE / ns_capture_stop: tcpdump of every packet crossing the switch namespace
# (both bridges: "any" interface).
ns_capture_start() {
	ip netns exec "${NS_PFX}sw" tcpdump -i any -U -s 0 -w "$1" >"$NS_ROOT/tcpdump.log" 2>&1 &
	NS_TCPDUMP=$!
	ns_wait 5 grep -q 'listening on' "$NS_ROOT/tcpdump.log"
}

ns_capture_stop() {
	[ -n "$NS_TCPDUMP" ] || return 0
	kill -INT "$NS_TCPDUMP" 2>/dev/null
	ns_wait 5 _ns_pids_dead "$NS_TCPDUMP"
	wait "$NS_TCPDUMP" 2>/dev/null
	NS_TCPDUMP=
}

# ns_workers MODEL N NAME [flags...]: `shoal worker` ranks 1..N-1 on hosts 2..N and rank 0 on
# host 1, which generates $PROMPT greedily for NS_TOKENS ids (default 32; stdout in $T/NAME.out,
# stderr in $T/NAME.err); returns rank 0's exit code. Uses $SHOAL, $TOKEN, $PROMPT and $T, and
# takes the next port from $PORT.
ns_workers() {
	m=$1 n=$2 name=$3
	shift 3
	PORT=$((PORT + 1))
	P="" r=1
	while [ $r -le "$n" ]; do P="$P${P:+,}$(ns_ip $r):$PORT"; r=$((r + 1)); done
	r=1
	while [ $r -lt "$n" ]; do
		ns_start $((r + 1)) "$name" $SHOAL worker --rank $r --world "$n" --peers "$P" \
			--token "$TOKEN" --model "$m" --threads 1 --join-timeout 20000 "$@"
		r=$((r + 1))
	done
	ns_exec 1 timeout 60 $SHOAL worker --rank 0 --world "$n" --peers "$P" --token "$TOKEN" \
		--model "$m" --threads 1 --join-timeout 20000 "$@" --prompt "$PROMPT" \
		--max-tokens "${NS_TOKENS:-32}" --ids >"$T/$name.out" 2>"$T/$name.err"
}

# ns_same_ids MODEL WHAT N NAME [flags...]: one check (tests/lib.sh): ns_workers' ids equal
# `shoal generate`'s on one rank.
ns_same_ids() {
	m=$1 d=$2 n=$3 name=$4
	shift 4
	want=$($SHOAL generate --model "$m" --prompt "$PROMPT" --max-tokens "${NS_TOKENS:-32}" \
		--ids --threads 1)
	if ns_workers "$m" "$n" "$name" "$@"; then
		check "$d: same greedy ids as one rank" [ "$(cat "$T/$name.out")" = "$want" ]
	else
		fail "$d: rank 0 failed: $(tail -1 "$T/$name.err")"
	fi
}

# Agents on the hosts, each with its state directory in $(ns_dir I)/state (uses $SHOAL):
# ns_state I, ns_node_id I, ns_status I (`shoal status --json` inside host I), and
# ns_leader_host I N: the number (1..N) of the host whose agent leads as host I sees it.
ns_state() { echo "$(ns_dir "$1")/state"; }
ns_node_id() { cat "$(ns_state "$1")/node_id" 2>/dev/null; }
ns_status() { ns_exec "$1" "$SHOAL" status --json --state-dir "$(ns_state "$1")" 2>/dev/null; }
ns_leader_host() {
	_l=$(ns_status "$1" | jq -r .leader 2>/dev/null)
	_h=1
	while [ "$_h" -le "$2" ]; do
		[ "$(ns_node_id $_h)" = "$_l" ] && { echo $_h; return 0; }
		_h=$((_h + 1))
	done
	return 1
}
