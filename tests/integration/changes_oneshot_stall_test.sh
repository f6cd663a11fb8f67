#!/usr/bin/env bash
# changes_oneshot_stall_test.sh — a one-shot `strata changes` (no --follow) whose partition keeps
# failing with the router's own UNAVAILABLE (a node that holds it is down; changes_fake_server
# --fail-partition 14 fails the second partition, the first catches up and finishes), with the
# stall bound shortened to 8 s (STRATA_CHANGES_STALL_S; 60 s otherwise):
#   1. the run ends, exit 1, within seconds of the bound, saying the streams made no progress,
#      that the router cannot reach a node, and what to do. It used to run without end: the
#      partition list it asks for about a failing partition, which the router serves from its
#      tablet map with the cluster down, counted as an answer and restarted the clock;
#   2. --follow beside it keeps retrying.
# Usage: changes_oneshot_stall_test.sh PATH/TO/strata PATH/TO/changes_fake_server
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
FAKE=$2
tmp=$(make_tmp)
bad() { echo "FAIL: $*" >&2; exit 1; }
TABLE=projects/strata/instances/bench/tables/t

"$FAKE" --fail-partition 14 >"$tmp/fake.log" 2>&1 &
PIDS+=("$!")
ADDR=$(wait_line "$tmp/fake.log" '127\.0\.0\.1:[0-9]+') || bad "the fake server did not start"
"$STRATA" changes --endpoint "$ADDR" --table "$TABLE" --enable 1d >/dev/null || bad "--enable"
export STRATA_CHANGES_STALL_S=8 # over the 5 s between retries, which once restarted the clock

"$STRATA" changes --endpoint "$ADDR" --table "$TABLE" --follow >"$tmp/f.out" 2>"$tmp/f.err" &
FPID=$!
PIDS+=("$FPID")

echo "== 1. one-shot: a partition that keeps failing ends the run after the bound"
t0=$(date +%s)
timeout 40 "$STRATA" changes --endpoint "$ADDR" --table "$TABLE" --from -5s >"$tmp/1.out" 2>"$tmp/1.err"
rc=$?
dt=$(($(date +%s) - t0))
[ "$rc" = 1 ] && [ "$dt" -lt 30 ] ||
  bad "one-shot: exit $rc after $dt s (1 within 30 s wanted; 124: still retrying): $(tail -3 "$tmp/1.err")"
grep -q "no progress (a change, a heartbeat or a finished partition) from the router at $ADDR for [0-9]* s: the router answers, but cannot reach a node that holds a partition; last error: partition \[\"cs00000000000050\", end of table) ended with UNAVAILABLE" "$tmp/1.err" &&
  grep -q "start what is down with .strata up" "$tmp/1.err" && grep -q "run this command again" "$tmp/1.err" ||
  bad "one-shot: the message does not say what happened and what to do: $(tail -3 "$tmp/1.err")"
echo "ok: exit 1 after $dt s: $(grep "no progress" "$tmp/1.err" | cut -c1-200)"

echo "== 2. --follow keeps retrying"
kill -0 "$FPID" 2>/dev/null || bad "--follow ended: $(tail -3 "$tmp/f.err")"
grep -q "ended with UNAVAILABLE" "$tmp/f.err" || bad "--follow did not retry: $(tail -3 "$tmp/f.err")"
kill -TERM "$FPID"
wait "$FPID"
rc=$?
[ "$rc" = 0 ] || bad "--follow ended with $rc on SIGTERM: $(tail -3 "$tmp/f.err")"
echo "PASS"
