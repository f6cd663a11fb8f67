#!/usr/bin/env bash
# log_flushed_damage_test.sh — a flipped byte in a commit log record whose rows were flushed
# into SSTables long ago (below every tablet's flushed point, and no peer cluster holds the log)
# must not keep the node from starting: it logs event=log_damage_skipped and serves every
# acknowledged row. A flipped byte in a record that is not flushed yet (replay needs it) is still
# refused, with or without --accept-data-loss. A node with a 1 MiB memtable gets 700 rows of
# 3500 bytes (a few flushes), is killed (-9), and each damage is made on a copy of its data.
# Usage: log_flushed_damage_test.sh PATH/TO/strata-node
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
NODE_BIN=$1
DIR=$(make_tmp) # fail() prints the logs under it
HOLD=$HERE/hostile/hold.py
command -v python3 >/dev/null && [ -f "$HOLD" ] || { echo "SKIP: python3 or hold.py absent"; exit 77; }
ROWS=700
BYTES=3500

# run_node DATA LOG [flags]: starts the node in the background (NODE_PID, NODE_ADDR).
run_node() {
  local data=$1 log=$2
  shift 2
  "$NODE_BIN" --data "$data" --listen 127.0.0.1:0 --memtable-mb 1 "$@" >"$log" 2>&1 &
  NODE_PID=$!
  PIDS+=("$NODE_PID")
  FAIL_EXTRA_LOGS=("$log")
  NODE_ADDR=$(wait_line "$log" '127\.0\.0\.1:[0-9]+')
}

# flip DATA FRACTION: flips one byte FRACTION of the way into the used part of the log segment.
flip() {
  python3 - "$(ls "$1"/storage/log/*.log | head -1)" "$2" <<'PY'
import sys
path, frac = sys.argv[1], float(sys.argv[2])
b = bytearray(open(path, 'rb').read())
end = len(b.rstrip(b'\0'))
off = 4096 + int((end - 4096) * frac)
b[off] ^= 1
open(path, 'r+b').write(b)
print('flipped byte %d of %d used' % (off, end))
PY
}

SRC=$DIR/src
run_node "$SRC" "$SRC.log" || fail "node did not start"
port=${NODE_ADDR##*:}
python3 "$HOLD" create "$port" t >/dev/null && python3 "$HOLD" write "$port" t $ROWS $BYTES >/dev/null ||
  fail "setup writes"
kill -9 "$NODE_PID"
wait "$NODE_PID" 2>/dev/null
[ "$(ls "$SRC"/storage/log/*.log | wc -l)" = 1 ] || fail "expected the log in one segment"
[ "$(ls "$SRC"/storage/sst/*.sst 2>/dev/null | wc -l)" -ge 1 ] || fail "nothing was flushed"

# A record early in the log: flushed long ago.
cp -a "$SRC" "$DIR/early"
flip "$DIR/early" 0.05 || fail "flip"
run_node "$DIR/early" "$DIR/early.log" || fail "the node refused damage in flushed records: $(tail -1 "$DIR/early.log")"
grep -q "event=log_damage_skipped" "$DIR/early.log" || fail "the skipped damage was not logged"
python3 "$HOLD" check "${NODE_ADDR##*:}" t $ROWS $BYTES || fail "rows missing after the skip"
stop_node
# Later starts decide the same way.
run_node "$DIR/early" "$DIR/early2.log" || fail "the second start refused"
python3 "$HOLD" check "${NODE_ADDR##*:}" t $ROWS $BYTES || fail "rows missing after a restart"
stop_node
echo "ok: damage in flushed records skipped"

# A record near the end: not flushed yet, replay needs it.
for flag in "" --accept-data-loss; do
  rm -rf "$DIR/late"
  cp -a "$SRC" "$DIR/late"
  flip "$DIR/late" 0.98 || fail "flip"
  # The refusal is an exit; a node that starts is stopped by timeout (and fails the check).
  timeout 20 "$NODE_BIN" --data "$DIR/late" --listen 127.0.0.1:0 --memtable-mb 1 $flag \
    >"$DIR/late.log" 2>&1
  rc=$?
  [ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "the node started over damaged needed records ($flag, rc $rc)"
  grep -q "acknowledged records are damaged" "$DIR/late.log" ||
    fail "unexpected refusal: $(tail -1 "$DIR/late.log")"
done
echo "ok: damage in unflushed records refused: $(tail -1 "$DIR/late.log" | cut -c1-200)"
echo PASS
