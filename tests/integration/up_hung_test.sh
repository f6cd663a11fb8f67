#!/usr/bin/env bash
# up_hung_test.sh — a process of the instance that runs but does not answer (stopped with SIGSTOP,
# as a hung one) is named as such: `strata status` says "not answering (process PID runs)" and
# suggests `strata restart NAME` (it said "down", and its hint sent the operator to `strata up`),
# and `strata up` names it and exits nonzero instead of "Already running" with exit 0 (it leaves
# a running process alone, so the hung one stayed hung). `strata restart` mends it. Both for a
# node and for the router.
# Usage: up_hung_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
instance_init up_hung
STOPPED=""
teardown() {
  [ -n "$STOPPED" ] && kill -CONT $STOPPED 2>/dev/null
  instance_teardown
}
trap teardown EXIT

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 2 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }

# hung NAME: with NAME stopped, status and up say it runs without answering; then CONT.
hung() {
  local name=$1 pid rc
  pid=$(cat "$DIR/run/$name.pid")
  STOPPED=$pid
  kill -STOP "$pid"
  "$STRATA" status --dir "$DIR" >"$TMPD/st.out" 2>&1
  rc=$?
  [ "$rc" = 1 ] || { cat "$TMPD/st.out"; fail "status with $name stopped exited $rc"; }
  grep -E "^(east +zone-a +)?$name .*not answering \(process $pid runs\)" "$TMPD/st.out" >/dev/null ||
    { cat "$TMPD/st.out"; fail "status does not say $name is not answering"; }
  grep -F "strata restart $name --dir $DIR" "$TMPD/st.out" >/dev/null ||
    { cat "$TMPD/st.out"; fail "status does not suggest strata restart $name"; }
  "$STRATA" up --dir "$DIR" >"$TMPD/up2.out" 2>&1
  rc=$?
  [ "$rc" != 0 ] || { cat "$TMPD/up2.out"; fail "up with $name stopped exited 0"; }
  ! grep -q "Already running" "$TMPD/up2.out" || { cat "$TMPD/up2.out"; fail "up says Already running"; }
  grep -F "$name (pid $pid) runs but does not answer" "$TMPD/up2.out" >/dev/null &&
    grep -F "strata restart $name --dir $DIR" "$TMPD/up2.out" >/dev/null ||
    { cat "$TMPD/up2.out"; fail "up does not name $name and strata restart"; }
  echo "ok: $name stopped: status and up say it runs without answering"
}

hung east-1
# The remedy suggested: restart wakes the stopped process (SIGTERM, SIGCONT) and starts it again.
"$STRATA" restart east-1 --dir "$DIR" >"$TMPD/rs.out" 2>&1 || { cat "$TMPD/rs.out"; fail "restart east-1"; }
STOPPED=""
"$STRATA" status --dir "$DIR" >"$TMPD/st.out" 2>&1 || { cat "$TMPD/st.out"; fail "status after restart"; }
echo "ok: strata restart east-1 mended it"

hung router
kill -CONT "$STOPPED"
STOPPED=""
"$STRATA" up --dir "$DIR" >"$TMPD/up3.out" 2>&1 || { cat "$TMPD/up3.out"; fail "up after SIGCONT"; }
grep -q "Already running" "$TMPD/up3.out" || { cat "$TMPD/up3.out"; fail "up after SIGCONT"; }
echo "ok: router continued: up says Already running"
echo PASS
