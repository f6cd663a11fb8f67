#!/usr/bin/env bash
# status_hung_test.sh — `strata status` probes the processes of an instance at once, so several
# hung ones cost one call deadline, not one each: with three of four nodes and the router stopped
# (SIGSTOP), it names each as "not answering (process PID runs)" with `strata restart NAME`, and
# the healthy node as ok, and at one moment while it runs it holds a connection to every stopped
# process (seen with ss). It probed one process after another, each stopped one waiting out its
# GetStatus (or PingAndWarm) deadline of 2 s and, for a node, its Unix socket's too: it printed
# nothing for about 14 s here, now about 2 s (printed, not asserted: no timing assertions).
# Usage: status_hung_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
instance_init status_hung
STOPPED=""
teardown() {
  [ -n "$STOPPED" ] && kill -CONT $STOPPED 2>/dev/null
  instance_teardown
}
trap teardown EXIT

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 2 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
HUNG="east-0 east-1 west-0 router"
for name in $HUNG; do STOPPED="$STOPPED $(cat "$DIR/run/$name.pid")"; done
kill -STOP $STOPPED

command -v ss >/dev/null || { echo "ss(8) not installed: skipping"; exit 77; }
# the stopped processes' ports: east-0, east-1, west-0 (topology order), the router's
ports="$(sed -n 's/^node = [^:]*:\([0-9]*\) .*/\1/p' "$DIR/topology" | head -3 | tr '\n' ' ')$PORT"
t0=$(date +%s%N)
"$STRATA" status --dir "$DIR" >"$TMPD/st.out" 2>&1 &
sp=$!
most=0 # the most stopped processes status held a connection to at one moment
while kill -0 "$sp" 2>/dev/null; do
  n=0
  for p in $ports; do
    ss -Htnp state established "( dport = :$p )" 2>/dev/null | grep -q "pid=$sp," && n=$((n + 1))
  done
  [ "$n" -gt "$most" ] && most=$n
  sleep 0.05
done
wait "$sp"
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
[ "$rc" = 1 ] || { cat "$TMPD/st.out"; fail "status with processes stopped exited $rc"; }
for name in $HUNG; do
  pid=$(cat "$DIR/run/$name.pid")
  grep -E "^(east|west)? *(zone-[ab])? *$name .*not answering \(process $pid runs\)" "$TMPD/st.out" >/dev/null ||
    { cat "$TMPD/st.out"; fail "status does not say $name is not answering"; }
  grep -F "strata restart $name --dir $DIR" "$TMPD/st.out" >/dev/null ||
    { cat "$TMPD/st.out"; fail "status does not suggest strata restart $name"; }
done
grep -E "^west +zone-b +west-1 .* ok " "$TMPD/st.out" >/dev/null || { cat "$TMPD/st.out"; fail "west-1 is not ok"; }
[ "$most" = 4 ] ||
  { cat "$TMPD/st.out"; fail "status called the 4 stopped processes ($ports) at most $most at a time (took $ms ms)"; }
echo "ok: status named 4 stopped processes, calling all 4 at once, in $ms ms"

kill -CONT $STOPPED
STOPPED=""
"$STRATA" status --dir "$DIR" >"$TMPD/st2.out" 2>&1 || { cat "$TMPD/st2.out"; fail "status after SIGCONT"; }
echo "ok: all healthy after SIGCONT"
echo PASS
