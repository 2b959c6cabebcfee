#!/bin/sh
# t_tls.sh: HTTPS and the API key for `shoal serve` and `shoal agent`, and the agent's file modes
# (loopback, no root):
# - a test CA and a certificate for 127.0.0.1 made here with openssl; `shoal serve --tls-cert
#   --tls-key`: the official openai npm client (tests/node/tls.mjs, NODE_EXTRA_CA_CERTS) lists
#   models, chats and streams over HTTPS; plain HTTP to the same port gets no HTTP answer; curl
#   without the CA refuses the certificate;
# - `shoal agent --tls-cert --tls-key --api-key-file`: the same client succeeds with the key from
#   the file, a wrong key gets 401, plain HTTP fails;
# - under umask 000 with a pre-made state directory of mode 0777: the agent warns, the directory
#   ends 0700, and its files (node key, plan, agent.sock) are 0600.
. tests/lib.sh
. tests/web_serve.sh

MODEL=$SHARED/models/stories260K.gguf
[ -f "$MODEL" ] || { skip "t_tls: $MODEL missing"; done_tests; exit; }
command -v openssl >/dev/null || { skip "t_tls: no openssl"; done_tests; exit; }
TMP=$(mktemp -d)
APID=
cleanup() {
	serve_stop
	[ -n "$APID" ] && kill "$APID" 2>/dev/null && wait "$APID" 2>/dev/null
	[ "$T_FAIL" -gt 0 ] && tail -n 20 "$TMP"/*.log >&2
	rm -rf "$TMP"
}
trap cleanup EXIT

# the test CA and the server's certificate (127.0.0.1 and localhost)
(
	cd "$TMP" || exit 1
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key \
		-out ca.pem -days 2 -subj /CN=shoal-test-ca &&
	openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout srv.key \
		-out srv.csr -subj /CN=127.0.0.1 &&
	printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >ext &&
	openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out srv.pem \
		-days 2 -extfile ext
) >"$TMP/openssl.log" 2>&1
check "test CA and certificate made" [ -s "$TMP/srv.pem" ]

# ---- shoal serve over HTTPS ----
"$SHOAL" serve --port 0 --model "$MODEL" --tls-cert "$TMP/srv.pem" --tls-key "$TMP/srv.key" \
	--api-key serve-key 2>"$TMP/serve.log" &
SERVE_PID=$!
PORT=
i=0
while [ -z "$PORT" ] && [ $i -lt 100 ]; do
	sleep 0.1
	PORT=$(sed -n 's|.* on https://[^ ]*:\([0-9][0-9]*\)/.*|\1|p' "$TMP/serve.log")
	i=$((i + 1))
done
check "serve says https" [ -n "$PORT" ]
check "HTTPS /health with the test CA" curl -sf --cacert "$TMP/ca.pem" "https://127.0.0.1:$PORT/health" -o /dev/null
check "curl without the CA refuses the certificate" sh -c "! curl -s https://127.0.0.1:$PORT/health -o /dev/null"
check "plain HTTP gets no HTTP answer" sh -c "! curl -s -m 5 http://127.0.0.1:$PORT/health -o /dev/null"
code=$(curl -s --cacert "$TMP/ca.pem" -o /dev/null -w '%{http_code}' "https://127.0.0.1:$PORT/v1/models")
check "HTTPS without the key: 401 (got $code)" [ "$code" = 401 ]
if node_setup; then
	out=$(NODE_EXTRA_CA_CERTS="$TMP/ca.pem" SHOAL_API_KEY=serve-key node tests/node/tls.mjs "https://127.0.0.1:$PORT" 2>&1)
	echo "$out" | sed 's/^/  serve: /' >&2
	check "openai client over HTTPS (serve)" sh -c "echo '$out' | grep -q ' 0 failed'"
else
	skip "t_tls: openai client: $NODE_WHY"
fi
serve_stop
check "serve exits 0" [ "$SERVE_RC" = 0 ]

# ---- shoal agent over HTTPS, key from a file, modes under umask 000 ----
BASE=$((20000 + ($$ % 120) * 100 + 57))
AP=$BASE AH=$((BASE + 5))
printf 'agent-key\n' >"$TMP/key.txt"
mkdir -m 777 "$TMP/state" && chmod 777 "$TMP/state"
(umask 000; exec "$SHOAL" agent --token tls-test --model "$MODEL" --state-dir "$TMP/state" \
	--port "$AP" --http-port "$AH" --no-mdns --expect 1 --threads 1 \
	--tls-cert "$TMP/srv.pem" --tls-key "$TMP/srv.key" --api-key-file "$TMP/key.txt") \
	>"$TMP/agent.log" 2>&1 &
APID=$!
i=0
until curl -sf --cacert "$TMP/ca.pem" "https://127.0.0.1:$AH/health" -o /dev/null; do
	i=$((i + 1))
	[ $i -gt 200 ] && break
	sleep 0.1
done
check "agent serves HTTPS" curl -sf --cacert "$TMP/ca.pem" "https://127.0.0.1:$AH/health" -o /dev/null
check "agent: plain HTTP gets no HTTP answer" sh -c "! curl -s -m 5 http://127.0.0.1:$AH/health -o /dev/null"
code=$(curl -s --cacert "$TMP/ca.pem" -H 'Authorization: Bearer agent-key' -o /dev/null -w '%{http_code}' "https://127.0.0.1:$AH/v1/models")
check "agent: the key from --api-key-file works (got $code)" [ "$code" = 200 ]
code=$(curl -s --cacert "$TMP/ca.pem" -o /dev/null -w '%{http_code}' "https://127.0.0.1:$AH/v1/models")
check "agent: no key, 401 (got $code)" [ "$code" = 401 ]
if node_setup; then
	out=$(NODE_EXTRA_CA_CERTS="$TMP/ca.pem" SHOAL_API_KEY=agent-key node tests/node/tls.mjs "https://127.0.0.1:$AH" 2>&1)
	echo "$out" | sed 's/^/  agent: /' >&2
	check "openai client over HTTPS (agent)" sh -c "echo '$out' | grep -q ' 0 failed'"
fi
check "the key is not on the command line" sh -c "! tr '\\0' ' ' </proc/$APID/cmdline | grep -q agent-key"
check "world-writable state directory: warned" grep -q "world-writable" "$TMP/agent.log"
mode() { stat -c %a "$1"; }
check "state directory now 700 ($(mode "$TMP/state"))" [ "$(mode "$TMP/state")" = 700 ]
n=0 bad=""
for f in "$TMP"/state/* "$TMP"/state/.[!.]*; do
	[ -e "$f" ] || continue
	n=$((n + 1))
	m=$(mode "$f")
	if [ -d "$f" ]; then [ "$m" = 700 ] || bad="$bad $f:$m"
	else [ "$m" = 600 ] || bad="$bad $f:$m"; fi
done
check "state files 0600, directories 0700 under umask 000 ($n files;$bad)" [ -z "$bad" ] && [ "$n" -ge 2 ]
check "agent.sock is 0600" [ "$(mode "$TMP/state/agent.sock")" = 600 ]
done_tests
