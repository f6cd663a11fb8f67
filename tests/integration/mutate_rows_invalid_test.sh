#!/usr/bin/env bash
# mutate_rows_invalid_test.sh — MutateRows entries that no table accepts (an empty row key, no
# mutation, a SetCell timestamp that is not whole milliseconds or is negative) are answered
# INVALID_ARGUMENT by the router itself, also while the node owning their rows is down (as is
# such a MutateRow: wire_test); a valid
# entry of that node gets UNAVAILABLE, which clients retry. Such entries used to reach only the
# node's checks, so with the node down they got UNAVAILABLE too and clients retried a request
# that can never succeed until their deadline (docs/router.md, Data API).
# Usage: mutate_rows_invalid_test.sh PATH/TO/strata
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
STRATA=$1
command -v python3 >/dev/null || { echo "python3 missing: skipped"; exit 77; }
up_single mutate_rows_invalid
mr() {
  HOSTILE=$HERE/hostile python3 - "$PORT" "$1" <<'PY'
import os, sys
sys.path.insert(0, os.environ['HOSTILE'])
from cslib import BT, call, create_cs, fields, msgs, set_cell, tname
from h2raw import fld
port, what = int(sys.argv[1]), sys.argv[2]
if what == 'create':
    sys.exit(0 if create_cs(port, 'm', retention=0)[2] == 'end' else 1)
entries = [fld(1, 'ok') + fld(2, set_cell('cf', 'q', 'v', 1000)),
           fld(2, set_cell('cf', 'q', 'v', 1000)),
           fld(1, 'nomuts'),
           fld(1, 'micros') + fld(2, set_cell('cf', 'q', 'v', 1234)),
           fld(1, 'neg') + fld(2, set_cell('cf', 'q', 'v', -5000))]
body = fld(1, tname('m')) + b''.join(fld(2, e) for e in entries)
data, status, why = call(port, BT + 'MutateRows', body, limit=30)
codes = {}
for m in msgs(data):
    for num, _, ent in fields(m):
        if num != 1:
            continue
        idx, code = 0, 0
        for n2, _, v in fields(ent):
            if n2 == 1:
                idx = v
            elif n2 == 2:
                code = dict((a, b) for a, _, b in fields(v)).get(1, 0)
        codes[idx] = code
print('%s: call %s, entry codes %s' % (what, status, [codes.get(i) for i in range(5)]))
want_ok = 0 if what == 'up' else 14
sys.exit(0 if [codes.get(i) for i in range(5)] == [want_ok, 3, 3, 3, 3] else 1)
PY
}
mr create || fail "creating table m"
mr up || fail "entries with the node up"
kill -9 "$(cat "$DIR/run/east-0.pid")"
sleep 1
mr down || fail "invalid entries were not INVALID_ARGUMENT with their node down"
echo "mutate_rows_invalid_test: passed"
