#!/usr/bin/env bash
# tls_router_test.sh — strata-router serving TLS (--tls-cert/--tls-key/--tls-client-ca): a CA and
# server certificates for localhost/127.0.0.1 made here with the openssl CLI; the official cbt
# creates and reads a table over TLS (-cert-file: the test CA); a plaintext HTTP/2 client is
# refused; with --tls-client-ca a client without a certificate is refused and one with a
# certificate of the CA is served (a gRPC ListTables call over it); after the files are replaced and SIGHUP, new connections see
# the new certificate while a connection opened before keeps working; a reload with a bad key
# keeps the certificate; startup stops with the reason for unreadable or mismatched files.
# Usage: tls_router_test.sh PATH/TO/strata-node PATH/TO/strata-router (skips, 77, without
# openssl, python3 or cbt)
set -u
. "$(dirname "$0")/lib.sh"
NODE_BIN=$1
ROUTER_BIN=$2
PROBE="python3 $(dirname "$0")/tls_probe.py"
command -v openssl >/dev/null || { echo "openssl not installed: skipping"; exit 77; }
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi

dir=$(make_tmp)
fail=0
expect() { # WHAT WANT GOT
  if [ "$2" != "$3" ]; then echo "FAIL: $1: want '$2', got '$3'"; fail=1; else echo "ok: $1"; fi
}
expect_match() { # WHAT REGEX GOT
  if ! printf '%s' "$3" | grep -Eq "$2"; then echo "FAIL: $1: want /$2/, got '$3'"; fail=1; else echo "ok: $1"; fi
}

# ---- certificates: a CA, two server certificates (serials 1001, 1002), a client certificate ----
ossl() { openssl "$@" >/dev/null 2>&1 || { echo "FAIL: openssl $*"; exit 1; }; }
ossl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=strata-test-ca -keyout "$dir/ca.key" -out "$dir/ca.pem"
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >"$dir/san.ext"
server_cert() { # NAME SERIAL
  ossl req -newkey rsa:2048 -nodes -subj "/CN=$1" -keyout "$dir/$1.key" -out "$dir/$1.csr"
  ossl x509 -req -in "$dir/$1.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -set_serial "$2" -days 2 \
    -extfile "$dir/san.ext" -out "$dir/$1.pem"
}
server_cert srv1 1001
server_cert srv2 1002
ossl req -newkey rsa:2048 -nodes -subj /CN=strata-client -keyout "$dir/cli.key" -out "$dir/cli.csr"
ossl x509 -req -in "$dir/cli.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -set_serial 2001 -days 2 \
  -out "$dir/cli.pem"
# A self-signed client certificate: no CA of the server's signed it.
ossl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=other-client -keyout "$dir/other.key" \
  -out "$dir/other.pem"
cp "$dir/srv1.pem" "$dir/live.pem"
cp "$dir/srv1.key" "$dir/live.key"

start_member "$dir/n1" 1; A1=$NODE_ADDR
cat >"$dir/topology" <<TOPO
project = p
instance = i
[cluster east]
zone = zone-a
node = $A1 $dir/n1
TOPO

# ---- startup errors: the router stops at once and says which file and what to do ----
out=$("$ROUTER_BIN" --config "$dir/topology" --listen 127.0.0.1:0 --tls-cert "$dir/nope.pem" \
  --tls-key "$dir/live.key" 2>&1); rc=$?
expect "missing certificate: exit 1" 1 "$rc"
expect_match "missing certificate: says so" "cannot read the TLS certificate .*nope.pem: No such file" "$out"
out=$("$ROUTER_BIN" --config "$dir/topology" --listen 127.0.0.1:0 --tls-cert "$dir/srv1.pem" \
  --tls-key "$dir/cli.key" 2>&1); rc=$?
expect "mismatched key: exit 1" 1 "$rc"
expect_match "mismatched key: says so" "does not match the certificate" "$out"
out=$("$ROUTER_BIN" --config "$dir/topology" --listen 127.0.0.1:0 --tls-cert "$dir/srv1.pem" 2>&1); rc=$?
expect "cert without key: exit 2" 2 "$rc"

# ---- TLS router: cbt over TLS, plaintext refused ----
start_router "$dir/topology" "$dir/r1.log" --tls-cert "$dir/live.pem" --tls-key "$dir/live.key"
R1=$ROUTER_ADDR
P1=${R1##*:}
R1_PID=$ROUTER_PID
cbts() { # cbt over TLS to localhost:P1, trusting the test CA
  timeout 60 "$CBT" -project p -instance i -data-endpoint "localhost:$P1" \
    -admin-endpoint "localhost:$P1" -cert-file "$dir/ca.pem" -access-token test-token "$@" 2>&1
}
cbts createtable t1 families=cf1 || { echo "FAIL: cbt createtable over TLS"; fail=1; }
cbts set t1 r1 cf1:c=hello || { echo "FAIL: cbt set over TLS"; fail=1; }
expect "cbt ls over TLS" "t1" "$(cbts ls)"
expect_match "cbt read over TLS" '"hello"' "$(cbts read t1)"
expect_match "plaintext HTTP/2 refused" "^refused" "$($PROBE plain "$P1")"
expect_match "TLS client served" "^served serial=3e9$" "$($PROBE tls "$P1" "$dir/ca.pem")"

# ---- reload: an open connection keeps working, new ones get the new certificate ----
$PROBE hold "$P1" "$dir/ca.pem" "$dir/go" >"$dir/hold.out" 2>&1 &
HOLD=$!
wait_line "$dir/hold.out" 'first served serial=[0-9a-f]+' >/dev/null || fail=1
cp "$dir/srv2.pem" "$dir/live.pem"
cp "$dir/srv2.key" "$dir/live.key"
kill -HUP "$ROUTER_PID"
wait_line "$dir/r1.log" 'TLS certificate reloaded' >/dev/null || fail=1
new_serial() {
  openssl s_client -connect "127.0.0.1:$P1" -servername localhost -alpn h2 </dev/null 2>/dev/null |
    openssl x509 -noout -serial 2>/dev/null
}
expect "new connection: new certificate" "serial=03EA" "$(new_serial)"
expect_match "new connection: new subject" "CN ?= ?srv2" "$(openssl s_client -connect "127.0.0.1:$P1" \
  -servername localhost -alpn h2 </dev/null 2>/dev/null | openssl x509 -noout -subject)"
touch "$dir/go"
wait "$HOLD"
expect "old connection opened before" "first served serial=3e9" "$(head -n1 "$dir/hold.out")"
expect "old connection still served" "second served serial=3e9" "$(sed -n 2p "$dir/hold.out")"
expect_match "cbt after reload" "t1" "$(cbts ls)"

# A reload that fails (a key that does not match) keeps the certificate in use.
cp "$dir/cli.key" "$dir/live.key"
kill -HUP "$ROUTER_PID"
wait_line "$dir/r1.log" 'TLS reload failed: still serving the previous certificate.*does not match' >/dev/null || fail=1
expect "failed reload keeps the certificate" "serial=03EA" "$(new_serial)"
expect "router serves after a failed reload" "t1" "$($PROBE list "$P1" "$dir/ca.pem")"

# ---- client certificates required ----
cp "$dir/srv1.key" "$dir/live.key"; cp "$dir/srv1.pem" "$dir/live.pem"
start_router "$dir/topology" "$dir/r2.log" --tls-cert "$dir/live.pem" --tls-key "$dir/live.key" \
  --tls-client-ca "$dir/ca.pem"
P2=${ROUTER_ADDR##*:}
expect_match "mTLS: no client certificate refused" "^refused" "$($PROBE tls "$P2" "$dir/ca.pem")"
expect_match "mTLS: a certificate of another CA refused" "^refused" \
  "$($PROBE tls "$P2" "$dir/ca.pem" "$dir/other.pem" "$dir/other.key")"
expect_match "mTLS: client certificate of the CA served" "^served serial=3e9$" \
  "$($PROBE tls "$P2" "$dir/ca.pem" "$dir/cli.pem" "$dir/cli.key")"
expect "mTLS: ListTables with the client certificate" "t1" \
  "$($PROBE list "$P2" "$dir/ca.pem" "$dir/cli.pem" "$dir/cli.key")"
expect_match "mTLS: ListTables without one refused" "^refused" "$($PROBE list "$P2" "$dir/ca.pem")"

# Both routers stop cleanly (under the sanitizers: no leak of the replaced TLS contexts).
for p in "$R1_PID" "$ROUTER_PID"; do
  kill "$p"; wait "$p"; rc=$?
  expect "router $p exits cleanly" 0 "$rc"
done
if grep -l 'Sanitizer' "$dir"/r*.log; then echo "FAIL: sanitizer report in a router log"; fail=1; fi

[ $fail = 0 ] && echo "PASS" || echo "FAILED"
exit $fail
