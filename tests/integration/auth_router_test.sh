#!/usr/bin/env bash
# auth_router_test.sh — strata-router with --auth-file and --audit-log, over TLS (a CA and a
# certificate for localhost made here with the openssl CLI). Principals made with `strata auth`:
# admin, writer, reader (instance roles) and t1reader (reader of table t1 only). The official cbt
# (-data-endpoint/-admin-endpoint, -cert-file CA, -access-token) checks for each role allowed
# and denied calls with their exact codes, a wrong token (Unauthenticated), a
# per-table grant, token rotation without restart (the old token stops working, the new one
# works; SIGHUP; a broken file keeps the previous one), and the audit log's lines, also on a
# router with an audit log and no auth file. auth_call probes paths the router does not serve
# (anonymous: UNAUTHENTICATED, like every path; with a token: UNIMPLEMENTED; both audited),
# sends an anonymous 8 MiB body to a router whose message limit is 4 MiB (refused UNAUTHENTICATED
# at the headers, where a body read would be too large: nothing buffered, no memory refusal in
# the metrics), and shows a principal whose
# line is deleted by hand refused after SIGHUP on a connection opened before. `strata bench
# --workload changes --tls --token` runs its change-stream consumer over TLS with the token.
# Usage: auth_router_test.sh strata-node strata-router strata auth_call (skips, 77, without
# openssl, python3 or cbt)
set -u
. "$(dirname "$0")/lib.sh"
NODE_BIN=$1
ROUTER_BIN=$2
STRATA=$3
AUTH_CALL=$4
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

ossl() { openssl "$@" >/dev/null 2>&1 || { echo "FAIL: openssl $*"; exit 1; }; }
ossl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=strata-test-ca -keyout "$dir/ca.key" -out "$dir/ca.pem"
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >"$dir/san.ext"
ossl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout "$dir/srv.key" -out "$dir/srv.csr"
ossl x509 -req -in "$dir/srv.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -set_serial 1001 -days 2 \
  -extfile "$dir/san.ext" -out "$dir/srv.pem"

# ---- principals ----
AF=$dir/principals
tok() { "$STRATA" auth add-principal "$1" --file "$AF" || { echo "FAIL: add-principal $1"; exit 1; }; }
T_ADMIN=$(tok admin); T_WRITER=$(tok writer); T_READER=$(tok reader); T_T1=$(tok t1reader)
"$STRATA" auth grant admin admin --file "$AF" &&
  "$STRATA" auth grant writer writer --file "$AF" &&
  "$STRATA" auth grant reader reader --file "$AF" &&
  "$STRATA" auth grant t1reader reader --table t1 --file "$AF" || { echo "FAIL: grant"; exit 1; }
expect "auth file is owner-only" "600" "$(stat -c %a "$AF")"
expect "no token in the auth file" "0" "$(grep -c -e "$T_ADMIN" -e "$T_READER" "$AF")"
expect_match "strata auth list" "t1reader reader on table t1" "$("$STRATA" auth list --file "$AF")"

start_member "$dir/n1" 1; A1=$NODE_ADDR
cat >"$dir/topology" <<TOPO
project = p
instance = i
[cluster east]
zone = zone-a
node = $A1 $dir/n1
TOPO

# A malformed auth file stops the router at startup with the line.
printf 'strata-auth 1\nprincipal x sha256:zz\n' >"$dir/bad"
out=$("$ROUTER_BIN" --config "$dir/topology" --listen 127.0.0.1:0 --auth-file "$dir/bad" 2>&1); rc=$?
expect "bad auth file: exit 1" 1 "$rc"
expect_match "bad auth file: says which line" "bad: line 2: the token hash must be sha256" "$out"

start_router "$dir/topology" "$dir/r.log" --tls-cert "$dir/srv.pem" --tls-key "$dir/srv.key" \
  --auth-file "$AF" --audit-log "$dir/audit.log" --max-message-bytes 4m \
  --metrics 127.0.0.1:0
P=${ROUTER_ADDR##*:}
MURL=$(grep -Eo 'metrics=http://[^ ]+' "$dir/r.log" | head -n1 | sed 's/^metrics=//')
call() { # PATH ARGS...: auth_call over TLS (prints "CODE message")
  local path=$1
  shift
  timeout 120 "$AUTH_CALL" "127.0.0.1:$P" "$path" --ca "$dir/ca.pem" --name localhost "$@" 2>&1
}
metric() { # NAME: its value in the router's metrics
  python3 -c 'import sys,urllib.request
for l in urllib.request.urlopen(sys.argv[1]).read().decode().splitlines():
    if l.startswith(sys.argv[2] + " "): print(l.split()[1])' "$MURL" "$1"
}
as() { # TOKEN|- cbt ARGS...: cbt over TLS with that token (- : none)
  local t=$1
  shift
  local targs=()
  [ "$t" != - ] && targs=(-access-token "$t")
  timeout 60 "$CBT" -project p -instance i -data-endpoint "localhost:$P" -admin-endpoint "localhost:$P" \
    -cert-file "$dir/ca.pem" "${targs[@]}" "$@" 2>&1
}
code_of() { grep -Eo 'code = [A-Za-z]+' | head -n1; }

# ---- admin ----
as "$T_ADMIN" createtable t1 families=cf1 >/dev/null || { echo "FAIL: admin createtable"; fail=1; }
as "$T_ADMIN" createtable t2 families=cf1 >/dev/null || { echo "FAIL: admin createtable t2"; fail=1; }
expect "admin: ls" "t1 t2" "$(as "$T_ADMIN" ls | sort | tr '\n' ' ' | sed 's/ $//')"
# ---- writer ----
as "$T_WRITER" set t1 r1 cf1:c=hello >/dev/null || { echo "FAIL: writer set"; fail=1; }
expect_match "writer: read" '"hello"' "$(as "$T_WRITER" read t1)"
out=$(as "$T_WRITER" createtable t3)
expect "writer: createtable denied" "code = PermissionDenied" "$(printf '%s' "$out" | code_of)"
expect_match "writer: denial names the permission" "permission bigtable.tables.create denied" "$out"
# ---- reader ----
expect_match "reader: read" '"hello"' "$(as "$T_READER" read t1)"
out=$(as "$T_READER" set t1 r2 cf1:c=no)
expect "reader: set denied" "code = PermissionDenied" "$(printf '%s' "$out" | code_of)"
expect_match "reader: denial names the permission" "permission bigtable.tables.mutateRows denied" "$out"
expect "reader: createfamily denied" "code = PermissionDenied" "$(as "$T_READER" createfamily t1 cf2 | code_of)"
# ---- a grant on one table ----
expect_match "t1reader: read t1" '"hello"' "$(as "$T_T1" read t1)"
expect "t1reader: read t2 denied" "code = PermissionDenied" "$(as "$T_T1" read t2 | code_of)"
expect "t1reader: ls denied (instance-wide)" "code = PermissionDenied" "$(as "$T_T1" ls | code_of)"
# ---- a wrong token (no token at all: the Node test; cbt always sends one over TLS) ----
expect "wrong token: Unauthenticated" "code = Unauthenticated" "$(as st1_0123456789abcdef ls | code_of)"

# ---- paths the router does not serve: no token, no answer about which exist ----
for path in /strata.internal.v1.Node/ListTablets /google.bigtable.v2.Bigtable/Nope \
  /google.bigtable.v2.Bigtable/ReadRows; do
  expect_match "anonymous $path: Unauthenticated" '^UNAUTHENTICATED ' "$(call "$path")"
done
expect_match "bad token, unknown path: Unauthenticated" '^UNAUTHENTICATED ' \
  "$(call /google.bigtable.v2.Bigtable/Nope --token st1_00)"
expect_match "reader, unknown path: Unimplemented" '^UNIMPLEMENTED unknown method' \
  "$(call /google.bigtable.v2.Bigtable/Nope --token "$T_READER")"
expect_match "admin, internal path: Unimplemented" '^UNIMPLEMENTED unknown method' \
  "$(call /strata.internal.v1.Node/ListTablets --token "$T_ADMIN")"
expect_match "audit: anonymous probe of an internal path" \
  '"principal":"",.*"method":"/strata\.internal\.v1\.Node/ListTablets",.*"outcome":"denied","code":"UNAUTHENTICATED"' \
  "$(cat "$dir/audit.log")"
expect_match "audit: reader's unknown path" \
  '"principal":"reader",.*"method":"/google\.bigtable\.v2\.Bigtable/Nope",.*"outcome":"denied","code":"UNIMPLEMENTED"' \
  "$(cat "$dir/audit.log")"
expect_match "audit: admin's internal path" \
  '"principal":"admin",.*"method":"/strata\.internal\.v1\.Node/ListTablets",.*"outcome":"denied","code":"UNIMPLEMENTED"' \
  "$(cat "$dir/audit.log")"

# ---- an anonymous body is refused at the headers, never read (messages here: at most 4 MiB) ----
# A body read at all would end RESOURCE_EXHAUSTED (too large) as the writer's does; the anonymous
# one ends UNAUTHENTICATED: the refusal came before the router looked at a byte of it.
expect_match "anonymous 8 MiB body: Unauthenticated" '^UNAUTHENTICATED ' \
  "$(call /google.bigtable.v2.Bigtable/MutateRow --body 8388608)"
expect_match "writer's 8 MiB body: read, too large" '^RESOURCE_EXHAUSTED ' \
  "$(call /google.bigtable.v2.Bigtable/MutateRow --body 8388608 --token "$T_WRITER")"
expect "anonymous body: no memory refusal" 0 "$(metric strata_rpc_server_calls_refused_memory_total)"
expect "anonymous body: nothing left buffered" 0 "$(metric strata_rpc_buffered_request_bytes)"
expect_match "after it: writer still served" '"hello"' "$(as "$T_WRITER" read t1)"

# ---- a principal's line deleted by hand, SIGHUP: refused on a connection opened before ----
T_TEMP=$(tok temp)
"$STRATA" auth grant temp reader --file "$AF" || { echo "FAIL: grant temp"; fail=1; }
kill -HUP "$ROUTER_PID"
ok=0
for _ in $(seq 1 100); do
  case $(call /google.bigtable.admin.v2.BigtableTableAdmin/ListTables --token "$T_TEMP" \
    --field1 projects/p/instances/i) in OK*) ok=1; break ;; esac
  sleep 0.1
done
expect "temp: token works" 1 "$ok"
call /google.bigtable.admin.v2.BigtableTableAdmin/ListTables --token "$T_TEMP" \
  --field1 projects/p/instances/i --again-when "$dir/go" >"$dir/again.out" &
CALLER=$!
for _ in $(seq 1 600); do [ -s "$dir/again.out" ] && break; sleep 0.1; done
expect "open connection: first call" "OK " "$(head -n1 "$dir/again.out")"
sed -i '/^principal temp /d' "$AF" # the grant line stays: it grants nothing now
kill -HUP "$ROUTER_PID"
wait_line "$dir/r.log" 'grant lines name principals the file does not list' >/dev/null || fail=1
touch "$dir/go"
wait "$CALLER"
expect_match "open connection: deleted principal refused" '^UNAUTHENTICATED .*not valid' \
  "$(sed -n 2p "$dir/again.out")"

# ---- several tokens on one connection: each call's header is checked for itself (the router
# remembers a connection's last header and principal; another header must not inherit them) ----
call /google.bigtable.admin.v2.BigtableTableAdmin/ListTables --token "$T_T1" \
  --field1 projects/p/instances/i --more "$T_ADMIN,$T_T1,st1_00bad,-,$T_ADMIN" >"$dir/more.out"
expect "one connection, five tokens" \
  "PERMISSION_DENIED OK PERMISSION_DENIED UNAUTHENTICATED UNAUTHENTICATED OK" \
  "$(cut -d' ' -f1 "$dir/more.out" | tr '\n' ' ' | sed 's/ $//')"
expect_match "one connection: t1reader's denial names t1reader" 'to principal t1reader' \
  "$(sed -n 3p "$dir/more.out")"

# ---- rotation without restart: on a connection opened before, the old token fails next ----
call /google.bigtable.admin.v2.BigtableTableAdmin/ListTables --token "$T_READER" \
  --field1 projects/p/instances/i --again-when "$dir/go2" >"$dir/again2.out" &
CALLER=$!
for _ in $(seq 1 600); do [ -s "$dir/again2.out" ] && break; sleep 0.1; done
expect "open connection, reader: first call" "OK " "$(head -n1 "$dir/again2.out")"
NEW=$("$STRATA" auth rotate reader --file "$AF") || { echo "FAIL: rotate"; fail=1; }
ok=0
for _ in $(seq 1 100); do # the router checks the file every second
  if [ "$(as "$T_READER" ls | code_of)" = "code = Unauthenticated" ]; then ok=1; break; fi
  sleep 0.1
done
expect "rotation: old token refused" 1 "$ok"
touch "$dir/go2"
wait "$CALLER"
expect_match "rotation: old token refused on the open connection" '^UNAUTHENTICATED .*not valid' \
  "$(sed -n 2p "$dir/again2.out")"
expect_match "rotation: new token works" '"hello"' "$(as "$NEW" read t1)"
wait_line "$dir/r.log" 'auth file loaded.*principals=4' >/dev/null || fail=1
# SIGHUP reloads too (a revoke), and a broken file keeps the previous principals.
"$STRATA" auth revoke writer --file "$AF"
kill -HUP "$ROUTER_PID"
ok=0
for _ in $(seq 1 100); do
  if [ "$(as "$T_WRITER" ls | code_of)" = "code = PermissionDenied" ]; then ok=1; break; fi
  sleep 0.1
done
expect "revoke + SIGHUP: writer has no role" 1 "$ok"
cp "$AF" "$dir/good"
printf 'garbage\n' >>"$AF"
wait_line "$dir/r.log" 'auth file reload failed' >/dev/null || fail=1
expect_match "broken file: previous principals stay" '"hello"' "$(as "$NEW" read t1)"
cp "$dir/good" "$AF"

# ---- strata bench --workload changes over TLS with a token: the consumer too ----
as "$T_ADMIN" createappprofile i cs1 cs route-to=east >/dev/null ||
  { echo "FAIL: createappprofile"; fail=1; }
timeout 120 "$STRATA" bench --target "localhost:$P" --tls "$dir/ca.pem" --token "$T_ADMIN" \
  --project p --instance i --cs-profile cs1 --workload changes --cs-backlog 50 --requests 50 --conns 1 --streams 2 --quiet \
  >"$dir/bench.out" 2>&1
kv=$(grep '^strata-bench ' "$dir/bench.out")
for want in changes.target.cs.lost=0 changes.target.cs.backlog_received=50 \
  changes.target.calls=50; do
  expect_match "bench changes over TLS with a token: $want" " $want " "$kv"
done
[ -n "$kv" ] || cat "$dir/bench.out"

# ---- audit log ----
A=$dir/audit.log
expect "audit log is owner-only" "600" "$(stat -c %a "$A")"
expect_match "audit: admin CreateTable allowed" \
  '"principal":"admin","peer":"127\.0\.0\.1:[0-9]+","method":"/google\.bigtable\.admin\.v2\.BigtableTableAdmin/CreateTable","resource":"projects/p/instances/i","permission":"bigtable\.tables\.create","outcome":"allowed","code":"OK"' \
  "$(cat "$A")"
expect_match "audit: reader MutateRow denied" \
  '"principal":"reader",.*"method":"/google\.bigtable\.v2\.Bigtable/MutateRow","resource":"projects/p/instances/i/tables/t1","permission":"bigtable\.tables\.mutateRows","outcome":"denied","code":"PERMISSION_DENIED"' \
  "$(cat "$A")"
expect_match "audit: wrong token" '"principal":"",.*"outcome":"denied","code":"UNAUTHENTICATED"' "$(cat "$A")"
expect_match "audit: time is RFC 3339" '^\{"time":"20[0-9]{2}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z"' "$(head -n1 "$A")"
expect "audit: reads are not logged" "0" "$(grep -c '"principal":"writer".*ReadRows' "$A")"
if command -v python3 >/dev/null; then
  expect "audit: every line is JSON" "ok" "$(python3 -c 'import json,sys
[json.loads(l) for l in open(sys.argv[1])]
print("ok")' "$A" 2>&1)"
fi

kill "$ROUTER_PID"; wait "$ROUTER_PID"; rc=$?
expect "router exits cleanly" 0 "$rc"

# ---- an audit log without --auth-file: open to everyone, admin calls still written down ----
start_router "$dir/topology" "$dir/r2.log" --audit-log "$dir/audit2.log"
cbtr "$ROUTER_ADDR" createtable t9 families=cf1 >/dev/null || { echo "FAIL: open createtable"; fail=1; }
cbtr "$ROUTER_ADDR" read t1 >/dev/null || { echo "FAIL: open read"; fail=1; }
expect_match "open router: CreateTable audited" \
  '"principal":"",.*"method":"/google\.bigtable\.admin\.v2\.BigtableTableAdmin/CreateTable",.*"outcome":"allowed","code":"OK"' \
  "$(cat "$dir/audit2.log")"
expect "open router: reads not audited" "0" "$(grep -c ReadRows "$dir/audit2.log")"
kill "$ROUTER_PID"; wait "$ROUTER_PID"; rc=$?
expect "open router exits cleanly" 0 "$rc"
if grep -l 'Sanitizer' "$dir"/r*.log; then echo "FAIL: sanitizer report in the router log"; fail=1; fi

[ $fail = 0 ] && echo "PASS" || echo "FAILED"
exit $fail
