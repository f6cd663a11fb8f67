#!/usr/bin/env bash
# move_kill_source_test.sh NODE_BIN ROUTER_BIN — kill -9 of a MoveTablet's SOURCE while it copies
# the tablet, one cluster of two nodes behind a router (balancer off). The target's copy used to
# be an ordinary tablet: while the source was dead it was the only one listing the range, so the
# router mapped it and acknowledged writes on a partial copy; once the source was back, the two
# overlapped and the router kept one of them, so either those writes or the rows the copy had not
# reached became unreadable (9,758 of 20,000 rows counted), and the copy blocked later moves of
# the range to that node for good. Now the copy is `incoming` until the source activates it: the
# write made while the source is down must be refused or stay readable, all 20,000 rows must be
# counted after the restart, the target restarted must drop the leftover copy (DATA/incoming),
# and a new move of the tablet to the same node must succeed. Skips (77) without cbt or python3.
set -u
. "$(dirname "$0")/lib.sh"
NODE_BIN=$1
ROUTER_BIN=$2
[ -n "$CBT" ] || { echo "cbt missing: skipped"; exit 77; }
command -v python3 >/dev/null || { echo "python3 missing: skipped"; exit 77; }
HOSTILE=$(cd "$(dirname "$0")" && pwd)/hostile
D=$(make_tmp)
start_member "$D/a" 1 127.0.0.1:0; A=$NODE_ADDR; A_PID=$NODE_PID
start_member "$D/b" 2 127.0.0.1:0; B=$NODE_ADDR; B_PID=$NODE_PID
printf 'project = p\ninstance = i\n[cluster east]\nzone = z\nnode = %s %s/a\nnode = %s %s/b\n' \
  "$A" "$D" "$B" "$D" >"$D/topology"
start_router "$D/topology" "$D/router.log" --balance off
R=$ROUTER_ADDR
cbtr "$R" createtable t families=cf >/dev/null || { echo "FAIL: createtable"; exit 1; }
# About 60 MB in one tablet on A, so that the copy takes a while.
python3 -c '
import sys
v = "x" * 3000
with open(sys.argv[1], "w") as f:
    f.write(",q\n")
    for i in range(20000): f.write("r%06d,%s\n" % (i, v))' "$D/rows.csv"
cbtr "$R" import t "$D/rows.csv" column-family=cf batch-size=200 workers=2 >/dev/null ||
  { echo "FAIL: import"; exit 1; }
python3 - "$HOSTILE" "${A##*:}" "${B##*:}" "$A_PID" <<'EOF'
import os, signal, sys, threading, time
sys.path.insert(0, sys.argv[1])
from cslib import call, fld, tablets_on
a, b, a_pid = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
tid = [t for t in tablets_on(a, 't')][0][0]
threading.Thread(target=lambda: call(a, '/strata.internal.v1.Node/MoveTablet',
                 fld(1, tid) + fld(2, '127.0.0.1:%d' % b), limit=60), daemon=True).start()
for _ in range(500):
    if tablets_on(b, 't', incoming=True): break
    time.sleep(0.01)
time.sleep(0.2)
os.kill(a_pid, signal.SIGKILL)
print('source killed with the target listing %s' % tablets_on(b, 't', incoming=True))
EOF
wait "$A_PID" 2>/dev/null
sleep 2
if cbtr "$R" -timeout 10s set t r000500 cf:after=acked >"$D/set.out"; then
  echo "the write while the source is down was acknowledged"
  acked=1
else
  echo "the write while the source is down was refused: $(tail -n1 "$D/set.out")"
  acked=0
fi
start_member "$D/a" 1 "$A"
sleep 3
out=$(cbtr "$R" -timeout 20s lookup t r000500 columns=cf:after)
if [ "$acked" = 1 ] && ! grep -q '"acked"' <<<"$out"; then
  echo "FAIL: the acknowledged write is gone after the source restarted: $out"
  exit 1
fi
n=$(cbtr "$R" -timeout 60s count t)
[ "$n" = "20000" ] || { echo "FAIL: rows after the restart: $n"; exit 1; }
# The target restarted drops the copy DATA/incoming names.
kill "$B_PID"
wait "$B_PID" 2>/dev/null
start_member "$D/b" 2 "$B" # returns at once: the log has the first run's "listening" line
for _ in $(seq 1 200); do
  [ "$(grep -c 'listening on' "$D/b.log")" -ge 2 ] && break
  sleep 0.1
done
grep -q "the copy of a move that did not complete" "$D/b.log" ||
  { tail -n 20 "$D/b.log"; cat "$D/b/incoming"; echo "FAIL: the restarted target did not drop the leftover copy"; exit 1; }
python3 - "$HOSTILE" "${A##*:}" "${B##*:}" <<'EOF2' || { echo "FAIL: moving the tablet again"; exit 1; }
import sys
sys.path.insert(0, sys.argv[1])
from cslib import call, fld, tablets_on
a, b = int(sys.argv[2]), int(sys.argv[3])
tid = tablets_on(a, 't')[0][0]
data, st, why = call(a, '/strata.internal.v1.Node/MoveTablet', fld(1, tid) + fld(2, '127.0.0.1:%d' % b), limit=60)
print('second move: %s %s; target now lists %s' % (why, st, tablets_on(b, 't')))
sys.exit(0 if why == 'end' and len(data) > 5 and not tablets_on(a, 't') and tablets_on(b, 't') else 1)
EOF2
n=$(cbtr "$R" -timeout 60s count t)
[ "$n" = "20000" ] || { echo "FAIL: rows after the second move: $n"; exit 1; }
echo "PASS"
