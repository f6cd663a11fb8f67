#!/usr/bin/env bash
# read_stall_test.sh — 2,000 full scans whose client never reads its sockets again must not
# hold up the other reads of their node (docs/router.md, "Flow control").
#
# unix: the router reaches the node over its Unix socket, as `strata up` connects them. The
# router cancels the node calls of such scans (parks them), one stream reset each; a node allows
# a peer 1,000 resets and then 33 a second before it closes the connection, so the router
# rationed its parks and every other read of the node waited about (N - 860) / 25 seconds (29 s
# here). The node now lets its own user's processes on its Unix socket reset streams at will.
# Then the other calls waited for a stream slot behind the scans on the router's one connection
# to the node (9-12 s under AddressSanitizer); scans now have a connection of their own
# ("Scans have a connection of their own"), and a one-row read and a write must answer within
# 3 s.
#
# tcp: over TCP the parks stay rationed (25 a second past a burst of 800), and another client's
# scan waited for a stream of the scan connection behind every scan queued before it, first come
# first served: 28-50 s. Calls waiting for a stream now go out by client connection, the one with
# the fewest streams open first ("Calls waiting for a stream slot wait in the router"), so a
# scan of a few rows waits for the next stream that frees: the parks go out in bursts once a
# second, so up to about 1 s; it must answer within 10 s (25 s under AddressSanitizer, where the
# node's and the router's work per scan is several times slower), and a write within as much.
# Usage: read_stall_test.sh PATH/TO/strata unix|tcp
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
STRATA=$1
MODE=${2:-unix}
command -v python3 >/dev/null || { echo "python3 missing: skipped"; exit 77; }
if [ "$MODE" = tcp ]; then
  up_single read_stall_tcp --no-unix
  PROBE=scan
  BOUND_MS=10000
  if grep -aq __asan_init "$(dirname "$STRATA")/../router/strata-router"; then
    BOUND_MS=25000
  fi
else
  up_single read_stall_unix
  PROBE=row
  BOUND_MS=3000
fi
python3 "$HERE/hostile/hold.py" create "$PORT" big || fail "createtable"
python3 "$HERE/hostile/hold.py" write "$PORT" big 400 5000 || fail "writing the rows"
echo "== 100 connections x 20 scans never read ($MODE, probes: $PROBE reads and writes)"
python3 "$HERE/hostile/hold.py" stall-sockets "$PORT" big 100 20 400 "$PROBE" "$BOUND_MS" ||
  fail "reads of the node starved behind the unread scans"
echo "read_stall_test $MODE: passed"
