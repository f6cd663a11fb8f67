#!/usr/bin/env bash
# status_other_instance_test.sh — a router port held by a router of ANOTHER instance is not this
# instance's router: PingAndWarm names the instance it asks for, and a router answers NOT_FOUND
# for an instance that is not its own (as every call does), so `strata status` says "other
# instance" and exits 1. The router used to answer OK for any name: status called the foreign
# router "ok" and counted this instance's (stopped) router healthy.
# Usage: status_other_instance_test.sh PATH/TO/strata PATH/TO/strata-router
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
ROUTER=$2
up_single status_other
"$STRATA" status --dir "$DIR" >"$TMPD/st0.out" 2>&1 || { cat "$TMPD/st0.out"; fail "status of the running instance"; }
kill "$(cat "$DIR/run/router.pid")"
for _ in $(seq 1 100); do ! kill -0 "$(cat "$DIR/run/router.pid")" 2>/dev/null && break; sleep 0.1; done
# the same nodes, another instance name: a router of "other" on this instance's port
sed 's/^instance = .*/instance = other/' "$DIR/topology" >"$TMPD/other.topology"
"$ROUTER" --config "$TMPD/other.topology" --listen "127.0.0.1:$PORT" --no-unix \
  >"$TMPD/other.log" 2>&1 &
PIDS+=("$!")
wait_line "$TMPD/other.log" 'strata-router listening on' >/dev/null ||
  { cat "$TMPD/other.log"; fail "the other instance's router did not start"; }
"$STRATA" status --dir "$DIR" >"$TMPD/st1.out" 2>&1
rc=$?
cat "$TMPD/st1.out"
[ "$rc" = 1 ] || fail "status exited $rc with another instance's router on the port (expected 1)"
grep -E "^router +127\.0\.0\.1:$PORT .*other instance" "$TMPD/st1.out" >/dev/null ||
  fail "status does not say the port is held by another instance's router"
grep -q "0 of 1 routers healthy" "$TMPD/st1.out" || fail "status counts the foreign router healthy"
echo "PASS"
