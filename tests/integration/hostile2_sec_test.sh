#!/usr/bin/env bash
# hostile2_sec_test.sh — a secure instance (`strata up --secure`, one node; docs/security.md)
# under rotation and slow clients:
#   1. `strata auth rotate admin --dir DIR`: the old admin token is refused, and the tools that
#      take the admin token from DIR/secure/tokens (`strata backup --dir`) keep working. The
#      rotate used to leave the old token in that file, so every `--dir` tool was UNAUTHENTICATED
#      from the router's next reload on;
#   2. the reader's token rotated while a 5,000-row ReadRows scan of the official Node.js client
#      runs with it (hostile2_rotate.js): the scan ends with every row, a new call with the old
#      token on the same connection is UNAUTHENTICATED (skipped without node or the package);
#   2b. the writer removed while its live change stream (no end time) runs (hostile2_cs_revoke.js):
#      the stream ends UNAUTHENTICATED and gets no later change. It used to keep streaming every
#      change to the removed principal for as long as it stayed connected;
#   3. a second router on the instance with --max-connections 16 and short handshake, slow-client
#      and idle timeouts (hostile2_limits.py): stalled handshakes past every slot (each new
#      client closes the oldest stalled handshake and is served, the established connection is
#      kept), a trickled ClientHello, a header block left open, a body trickled a byte a second,
#      while an established connection keeps being served.
# Usage: hostile2_sec_test.sh PATH/TO/strata (skips, 77, without cbt, python3 or openssl)
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
command -v openssl >/dev/null || { echo "openssl not installed: skipping"; exit 77; }
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${STRATA_NODEJS_CACHE:-$(cd "$(dirname "$STRATA")/.." && pwd)/nodejs-deps}
ROUTER_BIN=$(dirname "$STRATA")/../router/strata-router
instance_init hostile2_sec
S=$DIR/secure
tok() { awk -v r="$1" '$1==r {print $2}' "$S/tokens"; }
cbts() { # cbts TOKEN ARGS...
  local t=$1
  shift
  timeout 30 "$CBT" -project p -instance i -data-endpoint "localhost:$PORT" -admin-endpoint "localhost:$PORT" \
    -cert-file "$S/ca.pem" -access-token "$t" "$@" 2>&1
}
unset BIGTABLE_EMULATOR_HOST
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 --secure >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up --secure"; }
"$STRATA" bench --dir "$DIR" --project p --instance i --table big --workload bulkwrite \
  --dist sequential --keys 20000 --requests 50 --value-size 1024 --no-lag --quiet >"$TMPD/load" 2>&1 ||
  fail "load: $(tail -3 "$TMPD/load")"

echo "== 1. strata auth rotate admin --dir"
OLD=$(tok admin)
"$STRATA" auth rotate admin --dir "$DIR" >"$TMPD/new" || fail "rotate admin"
[ "$(tok admin)" = "$(cat "$TMPD/new")" ] || fail "DIR/secure/tokens does not hold the new admin token"
[ "$(stat -c %a "$S/tokens")" = 600 ] || fail "DIR/secure/tokens is mode $(stat -c %a "$S/tokens")"
[ "$(grep -c . "$S/tokens")" = 3 ] || fail "DIR/secure/tokens lost lines: $(cut -d' ' -f1 "$S/tokens")"
refused=0
for _ in $(seq 1 100); do # the router reloads the auth file within about a second
  if cbts "$OLD" ls | grep -q Unauthenticated; then refused=1; break; fi
  sleep 0.1
done
[ $refused = 1 ] || fail "the old admin token still works: $(cbts "$OLD" ls)"
timeout 60 "$STRATA" backup --dir "$DIR" --quiet list >"$TMPD/1.out" 2>&1 || fail "strata backup --dir after the rotate: $(cat "$TMPD/1.out")"
cbts "$(tok admin)" ls | grep -qx big || fail "the new admin token: $(cbts "$(tok admin)" ls)"
echo "ok"

echo "== 2. the reader's token rotated under a running scan"
if ! command -v node >/dev/null || [ ! -f "$CACHE/node_modules/@google-cloud/bigtable/package.json" ]; then
  echo "skipped: node or @google-cloud/bigtable (installed by nodejs_client_test) missing"
else
  cat >"$TMPD/rotate.sh" <<ROT
#!/usr/bin/env bash
"$STRATA" auth rotate reader --dir "$DIR" >/dev/null || exit 1
for _ in \$(seq 1 100); do
  timeout 30 "$CBT" -project p -instance i -data-endpoint "localhost:$PORT" -admin-endpoint "localhost:$PORT" \
    -cert-file "$S/ca.pem" -access-token "$(tok reader)" ls 2>&1 | grep -q Unauthenticated && exit 0
  sleep 0.1
done
echo "the old reader token still works" >&2
exit 1
ROT
  chmod +x "$TMPD/rotate.sh"
  NODE_PATH="$CACHE/node_modules" timeout 120 node "$HERE/hostile2_rotate.js" "$PORT" "$S/ca.pem" \
    "$(tok reader)" 5000 "$TMPD/rotate.sh" >"$TMPD/2.out" 2>&1
  rc=$?
  grep -E '^(ok|FAIL)' "$TMPD/2.out"
  [ $rc = 0 ] || fail "hostile2_rotate.js (exit $rc): $(grep -v '^ok' "$TMPD/2.out" | head)"
fi

echo "== 2b. the writer removed while its live change stream runs"
if ! command -v node >/dev/null || [ ! -f "$CACHE/node_modules/@google-cloud/bigtable/package.json" ]; then
  echo "skipped: node or @google-cloud/bigtable (installed by nodejs_client_test) missing"
else
  NODE_PATH="$CACHE/node_modules" timeout 120 node "$HERE/hostile2_cs_revoke.js" "$PORT" "$S/ca.pem" \
    "$(tok writer)" "$(tok admin)" "$STRATA" auth remove writer --dir "$DIR" >"$TMPD/2b.out" 2>&1
  rc=$?
  grep -E '^(ok|FAIL)' "$TMPD/2b.out"
  [ $rc = 0 ] || fail "hostile2_cs_revoke.js (exit $rc): $(grep -v '^ok' "$TMPD/2b.out" | head)"
fi

echo "== 3. slow and greedy clients against a router's limits"
PORT2=$(free_port)
"$ROUTER_BIN" --config "$DIR/topology" --listen "127.0.0.1:$PORT2" --tls-cert "$S/router.pem" \
  --tls-key "$S/router.key" --internal-ca "$S/ca.pem" --auth-file "$S/principals" \
  --max-connections 16 --handshake-timeout-ms 2000 --slow-client-timeout-ms 2000 \
  --idle-timeout-s 60 >"$TMPD/router2.log" 2>&1 &
PIDS+=("$!")
FAIL_EXTRA_LOGS+=("$TMPD/router2.log")
wait_line "$TMPD/router2.log" 'listening' >/dev/null || fail "the second router did not start"
timeout 300 python3 "$HERE/hostile2_limits.py" "$PORT2" "$S/ca.pem" "$S/tokens" 16 || fail "limits"
echo "PASS"
