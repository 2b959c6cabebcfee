# web_serve.sh: starts and stops `shoal serve` for the API tests (sourced after tests/lib.sh).
# serve_start ARGS...: runs `$SHOAL serve --port 0 ARGS` in the background, waits until it prints
# its URL; sets SERVE_PID, PORT, URL, SERVE_LOG. Returns non-zero on failure.
# serve_stop: SIGTERM to that process only, then waits for it; its exit status is in SERVE_RC.
SERVE_PID=
SERVE_N=0
serve_start() {
	# a fresh log per start: the child truncates its log only after the fork, so reusing one
	# file could show the previous server's port
	SERVE_N=$((SERVE_N + 1))
	SERVE_LOG=${TMP:-/tmp}/serve.$$.$SERVE_N.log
	rm -f "$SERVE_LOG"
	"$SHOAL" serve --port 0 "$@" 2>"$SERVE_LOG" &
	SERVE_PID=$!
	PORT=
	n=0
	while [ $n -lt 600 ]; do
		PORT=$(sed -n 's|.* on http://[^ ]*:\([0-9][0-9]*\)/.*|\1|p' "$SERVE_LOG" 2>/dev/null)
		[ -n "$PORT" ] && break
		kill -0 "$SERVE_PID" 2>/dev/null || { SERVE_PID=; return 1; }
		sleep 0.1
		n=$((n + 1))
	done
	[ -n "$PORT" ] || return 1
	URL=http://127.0.0.1:$PORT
	return 0
}
serve_stop() {
	if [ -n "$SERVE_PID" ]; then
		kill "$SERVE_PID" 2>/dev/null
		wait "$SERVE_PID" 2>/dev/null
		SERVE_RC=$?
		SERVE_PID=
	fi
}

# node_setup: makes sure node and the npm packages of tests/node are there (npm install when
# node_modules is missing; the npm registry is the only network these tests use). Returns 1 with
# NODE_WHY set when they cannot be had.
node_setup() {
	command -v node >/dev/null 2>&1 || { NODE_WHY="node not installed"; return 1; }
	if [ ! -d tests/node/node_modules/openai ] || [ ! -d tests/node/node_modules/playwright-core ] ||
	   [ ! -d tests/node/node_modules/ajv ] || [ ! -d tests/node/node_modules/openai7 ] ||
	   [ ! -d tests/node/node_modules/@anthropic-ai/sdk ] || [ ! -d tests/node/node_modules/ollama ]; then
		command -v npm >/dev/null 2>&1 || { NODE_WHY="npm not installed"; return 1; }
		(cd tests/node && npm ci --no-audit --no-fund --loglevel=error >/dev/null 2>&1 ||
			npm install --no-audit --no-fund --loglevel=error >/dev/null 2>&1) ||
			{ NODE_WHY="npm install failed (no access to the npm registry?)"; return 1; }
	fi
	return 0
}

# serve_or_skip NAME ARGS...: serve_start, or a skip (no engine in this build) / failure line.
# Returns non-zero when the test should end.
serve_or_skip() {
	name=$1; shift
	serve_start "$@" && return 0
	if grep -q "no inference engine" "$SERVE_LOG"; then
		skip "$name: this build has no inference engine yet"
	else
		fail "$name: shoal serve did not start: $(cat "$SERVE_LOG")"
	fi
	return 1
}
