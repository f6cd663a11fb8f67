#!/usr/bin/env bash
# status_secure_missing_test.sh — `strata status` on a secure instance (`strata up --secure`) whose
# DIR/secure/ca.pem, admin certificate or tokens file is missing: the processes run, status cannot
# authenticate to them, and it says so ("cannot authenticate (process PID runs)", what is missing
# and what to do) instead of calling running nodes "down" (ca.pem: it spoke plaintext to TLS
# ports) or the router "UNAUTHENTICATED" (tokens) or "no gRPC" (admin.pem). The footer names the
# admin file that is missing (admin.key used to be called admin.pem). An admin token the router
# refuses (edited or rotated elsewhere) is said with the command that mends it (there was no hint
# at all). The advice for a lost or refused token is followed and status is healthy again.
# Usage: status_secure_missing_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
instance_init status_secure_missing
up_secure_single

# unchecked NAME: status's line for NAME says it runs and cannot be authenticated to, not "down".
unchecked() {
  local pid
  pid=$(cat "$DIR/run/$1.pid")
  grep -E "^(east +zone-a +)?$1 .*cannot authenticate \(process $pid runs\)" "$TMPD/st.out" >/dev/null ||
    { cat "$TMPD/st.out"; fail "$2: status does not say $1 runs but cannot be authenticated to"; }
}
status_fails() {
  "$STRATA" status --dir "$DIR" >"$TMPD/st.out" 2>&1
  local rc=$?
  [ "$rc" = 1 ] || { cat "$TMPD/st.out"; fail "$1: status exited $rc"; }
  ! grep -E '^east +zone-a +east-0 .* down ' "$TMPD/st.out" >/dev/null ||
    { cat "$TMPD/st.out"; fail "$1: status calls the running east-0 down"; }
}

echo "== ca.pem missing"
mv "$S/ca.pem" "$TMPD/ca.pem"
status_fails "ca.pem"
unchecked east-0 "ca.pem"
unchecked router "ca.pem"
grep -F "$S/ca.pem, its CA, is missing" "$TMPD/st.out" >/dev/null &&
  grep -F "strata up --secure --dir $DIR" "$TMPD/st.out" >/dev/null ||
  { cat "$TMPD/st.out"; fail "ca.pem: status does not say what is missing and what to do"; }
mv "$TMPD/ca.pem" "$S/ca.pem"
echo "ok: ca.pem missing: $(grep -c 'cannot authenticate (process' "$TMPD/st.out") processes cannot be authenticated to, none down"

echo "== admin.pem missing"
mv "$S/admin.pem" "$TMPD/admin.pem"
status_fails "admin.pem"
unchecked east-0 "admin.pem"
grep -E '^router .* ok$' "$TMPD/st.out" >/dev/null || { cat "$TMPD/st.out"; fail "admin.pem: router not ok"; }
grep -F "$S/admin.pem (the admin certificate status presents to the nodes) is missing" "$TMPD/st.out" >/dev/null &&
  grep -F "  admin.pem: put it back" "$TMPD/st.out" >/dev/null || { cat "$TMPD/st.out"; fail "admin.pem: not named"; }
mv "$TMPD/admin.pem" "$S/admin.pem"
echo "ok: admin.pem missing: the nodes cannot be authenticated to, the router is ok"

echo "== admin.key missing"
mv "$S/admin.key" "$TMPD/admin.key"
status_fails "admin.key"
unchecked east-0 "admin.key"
grep -F "$S/admin.key (the admin certificate status presents to the nodes) is missing" "$TMPD/st.out" >/dev/null &&
  grep -F "  admin.key: put it back" "$TMPD/st.out" >/dev/null && ! grep -F "admin.pem" "$TMPD/st.out" >/dev/null ||
  { cat "$TMPD/st.out"; fail "admin.key: the footer does not name admin.key (alone)"; }
mv "$TMPD/admin.key" "$S/admin.key"
echo "ok: admin.key missing: named"

echo "== wrong admin token"
cp "$S/tokens" "$TMPD/tokens.good"
sed -i 's/^admin .*/admin st1_0000/' "$S/tokens"
status_fails "wrong token"
grep -F "The router refuses the admin token in $S/tokens (UNAUTHENTICATED)" "$TMPD/st.out" >/dev/null &&
  grep -F "strata auth rotate admin --dir $DIR" "$TMPD/st.out" >/dev/null ||
  { cat "$TMPD/st.out"; fail "wrong token: no hint"; }
# the advice, as printed
"$STRATA" auth rotate admin --dir "$DIR" >/dev/null || fail "strata auth rotate admin"
for _ in $(seq 1 50); do "$STRATA" status --dir "$DIR" >"$TMPD/st.out" 2>&1 && break; sleep 0.2; done
"$STRATA" status --dir "$DIR" >"$TMPD/st.out" 2>&1 || { cat "$TMPD/st.out"; fail "status after strata auth rotate admin"; }
echo "ok: wrong admin token: said, and the advice mends it"

echo "== tokens missing"
mv "$S/tokens" "$TMPD/tokens"
status_fails "tokens"
unchecked router "tokens"
grep -E '^east +zone-a +east-0 .* ok ' "$TMPD/st.out" >/dev/null || { cat "$TMPD/st.out"; fail "tokens: east-0 not ok"; }
grep -F "strata auth rotate admin --dir $DIR" "$TMPD/st.out" >/dev/null ||
  { cat "$TMPD/st.out"; fail "tokens: no advice"; }
# the advice, as printed: a new admin token in DIR/secure/tokens
(umask 077; echo "admin $("$STRATA" auth rotate admin --dir "$DIR")" >"$S/tokens")
for _ in $(seq 1 50); do "$STRATA" status --dir "$DIR" >"$TMPD/st.out" 2>&1 && break; sleep 0.2; done
"$STRATA" status --dir "$DIR" >"$TMPD/st.out" 2>&1 || { cat "$TMPD/st.out"; fail "status after a new admin token"; }
echo "ok: tokens missing: the router cannot be authenticated to; the advice mends it"
echo PASS
