#!/usr/bin/env bash
# mtls_test.sh — internal links closed to clients (docs/security.md, Internal links) on an
# instance started with `strata up --secure` (clusters east and west of one node each):
#   - a plaintext client on a node's TLS port and on the router's fails cleanly;
#   - a client without a certificate, or with one of another CA (even naming strata-router),
#     cannot reach a node at all;
#   - with certificates of the cluster CA (made here with the openssl CLI), a node serves data
#     and Node methods only to strata-router/strata-admin and Replication Apply only to
#     strata-node, with PERMISSION_DENIED naming the roles; the node's Unix socket checks the
#     same over TCP; the Unix socket serves only the node's own user (plaintext, as a router),
#     and a node refuses a socket in a directory other users may enter;
#   - internal methods through the router are refused;
#   - a row written through the router reaches the other cluster (replication over mTLS);
#   - a client insisting on a node certificate refuses the router's;
#   - strata status works on the secure instance;
#   - cbt with the exact command line `strata up --secure` printed (skipped without cbt).
# Usage: mtls_test.sh STRATA MTLS_CALL STRATA_NODE (skips, 77, without openssl)
set -u
STRATA=$1
CALL=$2
NODE_BIN=$3
. "$(dirname "$0")/lib.sh"
command -v openssl >/dev/null || { echo "openssl not installed: skipping"; exit 77; }
instance_init mtls
ok=0
expect_match() { # WHAT REGEX GOT
  if printf '%s' "$3" | grep -Eq "$2"; then echo "ok: $1"; else fail "$1: want /$2/, got '$3'"; fi
}

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 --secure >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up --secure"; }
S=$DIR/secure
for f in ca.key router.key admin.key east-0.key west-0.key; do
  expect_match "$f is owner-only" '^-rw-------' "$(ls -l "$S/$f")"
done
expect_match "secure dir is 0700" '^drwx------' "$(ls -ld "$S")"
EAST=$(grep -Eo 'east-0 +127\.0\.0\.1:[0-9]+' "$TMPD/up.out" | grep -Eo '127\.0\.0\.1:[0-9]+')
WEST=$(grep -Eo 'west-0 +127\.0\.0\.1:[0-9]+' "$TMPD/up.out" | grep -Eo '127\.0\.0\.1:[0-9]+')
ROUTER=127.0.0.1:$PORT
[ -n "$EAST" ] && [ -n "$WEST" ] || fail "node addresses not in the output of strata up"

# Certificates of the test: one of the cluster CA without a role, one of another CA that claims
# to be a router.
ossl() { openssl "$@" >/dev/null 2>&1 || fail "openssl $*"; }
ossl req -newkey rsa:2048 -nodes -subj "/O=Strata/CN=someone" -keyout "$TMPD/norole.key" \
  -out "$TMPD/norole.csr"
ossl x509 -req -in "$TMPD/norole.csr" -CA "$S/ca.pem" -CAkey "$S/ca.key" -set_serial 7 -days 2 \
  -out "$TMPD/norole.pem"
ossl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/O=Strata/OU=strata-router/CN=evil" \
  -keyout "$TMPD/evil.key" -out "$TMPD/evil.pem"

as() { # ROLE-FILES ADDR PATH [ARGS...]: a call presenting $S/<name>.pem (or $TMPD's)
  local who=$1 addr=$2 path=$3 d=$S
  shift 3
  [ -e "$S/$who.pem" ] || d=$TMPD
  "$CALL" "$addr" "$path" --ca "$S/ca.pem" --cert "$d/$who.pem" --key "$d/$who.key" "$@"
}
BT=/google.bigtable.v2.Bigtable
NODE=/strata.internal.v1.Node
REPL=/strata.internal.v1.Replication

# ---- handshakes ----
expect_match "plaintext client on a node's TLS port" '^UNAVAILABLE' "$("$CALL" "$EAST" $BT/ReadRows)"
expect_match "plaintext client on the router's TLS port" '^UNAVAILABLE' "$("$CALL" "$ROUTER" $BT/ReadRows)"
expect_match "no client certificate: no data" '^UNAVAILABLE' \
  "$("$CALL" "$EAST" $BT/ReadRows --ca "$S/ca.pem")"
expect_match "no client certificate: no Node service" '^UNAVAILABLE' \
  "$("$CALL" "$EAST" $NODE/DropTablet --ca "$S/ca.pem")"
expect_match "no client certificate: no Replication" '^UNAVAILABLE' \
  "$("$CALL" "$EAST" $REPL/SetLinks --ca "$S/ca.pem")"
expect_match "a certificate of another CA naming strata-router" '^UNAVAILABLE' \
  "$(as evil "$EAST" $BT/MutateRow)"
wait_line "$DIR/logs/east-0.log" 'TLS handshake failed.*(certificate|wrong version|http request)' >/dev/null ||
  fail "no handshake failure logged with its reason"

# ---- roles ----
expect_match "node certificate: no data calls" \
  "^PERMISSION_DENIED $BT/ReadRows is served only to strata-router or strata-admin, not to a client whose certificate names strata-node" \
  "$(as west-0 "$EAST" $BT/ReadRows)"
expect_match "node certificate: no MoveTablet" '^PERMISSION_DENIED .*MoveTablet' \
  "$(as west-0 "$EAST" $NODE/MoveTablet)"
# (DropTablet, CreateTablet and PutTable serve a node too, for a move's incoming copy only:
# secure_move_test.)
expect_match "node certificate: no SplitTablet" '^PERMISSION_DENIED .*SplitTablet' \
  "$(as west-0 "$EAST" $NODE/SplitTablet)"
expect_match "router certificate: no Replication Apply" \
  "^PERMISSION_DENIED $REPL/Apply is served only to strata-node" "$(as router "$EAST" $REPL/Apply)"
expect_match "router certificate: no SetLinks" '^PERMISSION_DENIED .*SetLinks' \
  "$(as router "$EAST" $REPL/SetLinks)"
expect_match "a certificate of the CA without a role" \
  "^PERMISSION_DENIED .*names no role" "$(as norole "$EAST" $BT/MutateRow)"
expect_match "node certificate: CopyRows passes the check" '^(INVALID_ARGUMENT|NOT_FOUND|FAILED_PRECONDITION)' \
  "$(as west-0 "$EAST" $NODE/CopyRows)"
# The Unix socket is plaintext for the node's own user, who counts as a router there (and
# holds every key anyway); its directory keeps everyone else out.
SOCK=unix:$DIR/east-0/node.sock
expect_match "the node's own user on the Unix socket: router methods" '^OK' \
  "$("$CALL" "$SOCK" $NODE/GetStatus)"
expect_match "the node's own user on the Unix socket: no Replication" \
  '^PERMISSION_DENIED .*Apply is served only to strata-node, not to a client whose certificate names strata-router' \
  "$("$CALL" "$SOCK" $REPL/Apply)"
expect_match "the socket's directory is the node user's alone" '^drwx------' "$(ls -ld "$DIR/east-0")"
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
  expect_match "another user cannot use the Unix socket" '^UNAVAILABLE' \
    "$(setpriv --reuid=65534 --regid=65534 --clear-groups "$CALL" "$SOCK" $BT/ReadRows 2>/dev/null)"
fi
open=$TMPD/open; mkdir -p "$open"; chmod 755 "$open"
out=$("$NODE_BIN" --data "$TMPD/open-data" --listen 127.0.0.1:0 --unix "$open/node.sock" \
  --tls-cert "$S/east-0.pem" --tls-key "$S/east-0.key" --tls-ca "$S/ca.pem" 2>&1); rc=$?
expect_match "a socket directory others may enter is refused (exit $rc)" 'carries no TLS .* chmod 700' "$out"

# ---- through the router ----
# (without a token: the secure router refuses every path before saying which exist)
expect_match "MoveTablet through the router" '^UNAUTHENTICATED' \
  "$("$CALL" "$ROUTER" $NODE/MoveTablet --ca "$S/ca.pem" --name localhost)"
expect_match "SetLinks through the router" '^UNAUTHENTICATED' \
  "$("$CALL" "$ROUTER" $REPL/SetLinks --ca "$S/ca.pem" --name localhost)"
expect_match "a client expecting a node refuses the router" "names role 'strata-router', not 'strata-node'" \
  "$(as admin "$ROUTER" $BT/ReadRows --role strata-node --name localhost)"

# ---- cbt with the printed command line; replication to west over mTLS ----
line=$(grep -E '^  cbt ' "$TMPD/up.out" | sed 's/^  //; s/ ls$//')
expect_match "strata up --secure prints the cbt command" "-cert-file $S/ca.pem -access-token " "$line"
if [ -n "$CBT" ]; then
  read -r -a cmd <<<"${line/#cbt/$CBT}"
  cbts() { env -u BIGTABLE_EMULATOR_HOST timeout 60 "${cmd[@]}" "$@" 2>&1; }
  cbts createtable t1 families=cf >/dev/null || fail "cbt createtable over TLS: $(cbts createtable t1 families=cf)"
  cbts set t1 r1 cf:c=over-mtls >/dev/null || fail "cbt set over TLS"
  expect_match "cbt read over TLS" 'over-mtls' "$(cbts read t1)"
  if grep -q -- '-access-token unchecked' <<<"$line"; then
    echo "this router checks no tokens: no audit log to check"
  else
    expect_match "the router audits the admin call (DIR/logs/audit.log)" 'CreateTable' \
      "$(cat "$DIR/logs/audit.log" 2>&1)"
  fi
  for i in $(seq 1 100); do
    got=$(as admin "$WEST" $BT/ReadRows --read t1 --find over-mtls)
    case $got in *found*) break ;; esac
    sleep 0.1
  done
  expect_match "replicated to west over mTLS" '^OK .*found' "$got"
else
  echo "cbt not installed: skipping the cbt and replication part"
fi

# ---- the CLI on a secure instance ----
"$STRATA" status --dir "$DIR" >"$TMPD/status.out" 2>&1 || { cat "$TMPD/status.out"; fail "strata status"; }
expect_match "strata status: nodes answer over mTLS" '2 of 2 nodes healthy, 1 of 1 routers healthy' \
  "$(cat "$TMPD/status.out")"
"$STRATA" down --dir "$DIR" >/dev/null 2>&1 || fail "strata down"
if grep -l 'Sanitizer' "$DIR"/logs/*.log; then fail "sanitizer report in a log"; fi
echo PASS
