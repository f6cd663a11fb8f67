#!/usr/bin/env bash
# router_memory_release_test.sh — the router gives back the memory a burst of calls left free
# (docs/router.md, "Memory"). 200 full scans of 2 MB whose client never reads them make the
# router hold about 1.25 MiB each; then another client opens 20 such scans and keeps them, and
# the burst's connections close. The router's resident memory must fall back near its idle
# size within seconds, though the kept calls hold memory allocated after the burst's. It used to
# stay near the peak for good (1.4 GB after 2,000 such scans): glibc returns only the free
# memory at the top of its heap, above which the kept calls' buffers lie; the router now
# returns every free page (malloc_trim) every few seconds when much of its heap is free.
# Skips (77) without python3, and in AddressSanitizer builds.
# Usage: router_memory_release_test.sh PATH/TO/strata
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
STRATA=$1
command -v python3 >/dev/null || { echo "python3 missing: skipped"; exit 77; }
# Under AddressSanitizer malloc is the sanitizer's (its quarantine keeps freed memory on
# purpose), so glibc's malloc_trim has nothing to give back: nothing to check there.
if grep -aq __asan_init "$(dirname "$STRATA")/../router/strata-router"; then
  echo "AddressSanitizer build: the router's allocator is the sanitizer's: skipped"
  exit 77
fi
up_single router_memory_release
RPID=$(cat "$DIR/run/router.pid")
HOLD=("python3" "$HERE/hostile/hold.py")
"${HOLD[@]}" create "$PORT" big >/dev/null || fail "createtable"
"${HOLD[@]}" write "$PORT" big 400 5000 || fail "writing the rows"

echo "== 10 connections x 20 scans never read; 1 x 20 more kept; the 10 closed"
HOSTILE=$HERE/hostile python3 - "$PORT" "$RPID" <<'PY' || fail "the router kept its memory after the burst"
import os, sys, time
sys.path.insert(0, os.environ['HOSTILE'])
from hold import Conn, fld, grpc_msg, rss_mb, watch, TABLE_PREFIX

port, pid = int(sys.argv[1]), sys.argv[2]
idle = rss_mb(pid)

def scans(n_conns):
    conns = []
    for _ in range(n_conns):
        c = Conn(port)
        for _ in range(20):
            sid = c.headers('/google.bigtable.v2.Bigtable/ReadRows')
            c.data(sid, grpc_msg(fld(1, TABLE_PREFIX + 'big')))
        conns.append(c)
    return conns

burst = scans(10)
if watch(burst, [pid], 4000) != 0:
    sys.exit(1)
kept = scans(1)
watch(kept, [pid], 4000)
peak = rss_mb(pid)
for c in burst:
    c.s.close()
# the calls end at once; the release runs every 5 s. Bound: a third of the peak.
now, bound = peak, peak // 3
for _ in range(40):
    time.sleep(0.5)
    now = rss_mb(pid)
    if now <= bound:
        break
print('router resident memory: idle %d MB, with the scans %d MB, after the burst %d MB '
      '(bound %d MB, 20 scans still held)' % (idle, peak, now, bound))
if peak < 150:
    print('the scans took only %d MB: the test no longer measures a burst' % peak); sys.exit(1)
sys.exit(0 if now <= bound else 1)
PY
"${HOLD[@]}" check "$PORT" big 400 5000 || fail "the router does not serve after releasing memory"
echo "PASS"
