#!/usr/bin/env bash
# restart_stopped_test.sh — commands that need a running instance, against one `strata down`
# stopped, say so at once with `strata up --dir DIR`: `strata restart router` started a router
# that waited 15 s for the nodes' metadata and died, and `strata changes --dir DIR` retried
# "Connection refused" for 60 s. Each must end within 10 s (the old waits were 15 s and 60 s).
# One cluster of one node.
# Usage: restart_stopped_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
up_single restart_stopped
"$STRATA" down --dir "$DIR" >/dev/null 2>&1 || fail "strata down"

echo "== strata restart router, the instance stopped"
timeout 10 "$STRATA" restart router --dir "$DIR" >"$TMPD/rs.out" 2>&1
rc=$?
[ "$rc" = 1 ] || { cat "$TMPD/rs.out"; fail "strata restart router exited $rc, not 1"; }
grep -F "the nodes of the instance in $DIR are stopped" "$TMPD/rs.out" >/dev/null &&
  grep -F "\`strata up --dir $DIR\`" "$TMPD/rs.out" >/dev/null ||
  { cat "$TMPD/rs.out"; fail "strata restart router does not say the nodes are stopped"; }
[ ! -e "$DIR/run/router.pid" ] || fail "strata restart router started a router"
echo "ok: restart router said the nodes are stopped"

echo "== strata changes, the instance stopped"
timeout 10 "$STRATA" changes --table t --from -1m --dir "$DIR" >"$TMPD/ch.out" 2>&1
rc=$?
[ "$rc" = 1 ] || { cat "$TMPD/ch.out"; fail "strata changes exited $rc, not 1"; }
grep -F "the instance in $DIR is not running" "$TMPD/ch.out" >/dev/null &&
  grep -F "\`strata up --dir $DIR\`" "$TMPD/ch.out" >/dev/null ||
  { cat "$TMPD/ch.out"; fail "strata changes does not say the instance is stopped"; }
echo "ok: changes said the instance is stopped"

echo "== both work again after strata up"
"$STRATA" up --dir "$DIR" >"$TMPD/up2.out" 2>&1 || { cat "$TMPD/up2.out"; fail "strata up"; }
"$STRATA" restart router --dir "$DIR" >"$TMPD/rs2.out" 2>&1 || { cat "$TMPD/rs2.out"; fail "strata restart router, running"; }
echo PASS
