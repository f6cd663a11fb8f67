#!/usr/bin/env bash
# log_zero_tail_test.sh — the newest commit log segment keeps its size but its last acknowledged
# records read back as zeros (a lost page: the damage --accept-data-loss is about, without the
# file getting shorter). A node gets 20 acknowledged rows, is killed (-9, nothing flushed), the
# last 1 KiB of the segment's used part is zeroed, and the node is started again. Expected: it
# refuses to start, like for a segment cut short, or serves every row. Observed on main: it starts,
# logs nothing above info, and the last rows are gone.
# Usage: log_zero_tail_test.sh PATH/TO/strata-node
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../lib.sh"
NODE_BIN=$1
DATA=$(make_tmp)/data
start_node "$NODE_BIN" "$DATA" || { echo "FAIL: node did not start"; exit 1; }
port=${NODE_ADDR##*:}
python3 "$HERE/hold.py" create "$port" t >/dev/null && python3 "$HERE/hold.py" write "$port" t 20 100 >/dev/null ||
  { echo "FAIL: setup writes"; exit 1; }
kill -9 "$NODE_PID"; wait "$NODE_PID" 2>/dev/null
seg=$(ls "$DATA"/storage/log/*.log | tail -1)
python3 - "$seg" <<'PY'
import sys
b = bytearray(open(sys.argv[1], 'rb').read())
end = len(b.rstrip(b'\0'))
b[end - 1024:end] = bytes(1024)
open(sys.argv[1], 'wb').write(b)
PY
timeout 60 "$NODE_BIN" --data "$DATA" --listen 127.0.0.1:0 >"$DATA.again.log" 2>&1 &
pid=$!
PIDS+=("$pid")
for _ in $(seq 1 100); do
  grep -q "listening on" "$DATA.again.log" || ! kill -0 "$pid" 2>/dev/null && break
  sleep 0.1
done
if ! kill -0 "$pid" 2>/dev/null; then echo "PASS: the node refuses: $(tail -1 "$DATA.again.log")"; exit 0; fi
addr=$(grep -Eo 'listening on 127\.0\.0\.1:[0-9]+' "$DATA.again.log" | head -1)
python3 "$HERE/hold.py" check "${addr##*:}" t 20 100 && { echo PASS; exit 0; }
echo "FAIL: the node started and lost acknowledged rows without a word"
exit 1
