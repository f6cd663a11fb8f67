#!/usr/bin/env bash
# changes_partition_fail_test.sh — `strata changes --follow` with one partition that fails while
# the other streams and heartbeats (changes_fake_server --fail-partition CODE):
#   1. a permanent error (NOT_FOUND, FAILED_PRECONDITION, PERMISSION_DENIED, INVALID_ARGUMENT)
#      ends the command at once, exit 1, naming the partition, the error and what to do (the
#      message did not say which partition);
#   2. UNAVAILABLE is retried with a doubling backoff, each retry a line on stderr naming the
#      partition and the delay, and the command keeps following while the table is there;
#   3. once the table's streams are turned off, that UNAVAILABLE is permanent in disguise (a
#      router says it of a partition no tablet holds): the command asks about the table, hears
#      FAILED_PRECONDITION and ends, exit 1, saying so. It used to retry without end, the other
#      partition's heartbeats keeping the run from ever looking stalled.
# Usage: changes_partition_fail_test.sh PATH/TO/strata PATH/TO/changes_fake_server
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
FAKE=$2
tmp=$(make_tmp)
bad() { echo "FAIL: $*" >&2; exit 1; }
TABLE=projects/strata/instances/bench/tables/t
PART='partition ["cs00000000000050", end of table)'

# fake CODE: a fresh fake server failing the second partition with CODE; sets ADDR, streams on.
fake() {
  "$FAKE" --fail-partition "$1" >"$tmp/fake$1.log" 2>&1 &
  PIDS+=("$!")
  ADDR=$(wait_line "$tmp/fake$1.log" '127\.0\.0\.1:[0-9]+') || bad "the fake server did not start"
  "$STRATA" changes --endpoint "$ADDR" --table "$TABLE" --enable 1d >/dev/null || bad "--enable"
}

echo "== 1. permanent errors end the command"
for code in 5:NOT_FOUND 9:FAILED_PRECONDITION 7:PERMISSION_DENIED 3:INVALID_ARGUMENT; do
  fake "${code%%:*}"
  timeout 60 "$STRATA" changes --endpoint "$ADDR" --table "$TABLE" --follow --quiet \
    >"$tmp/1.out" 2>"$tmp/1.err"
  rc=$?
  [ "$rc" = 1 ] || bad "${code#*:}: exit $rc (124: still retrying after 60 s): $(tail -3 "$tmp/1.err")"
  grep -F "$PART" "$tmp/1.err" | grep -F "${code#*:}" | grep -q "permanent" ||
    bad "${code#*:}: the message does not name the partition and the error: $(cat "$tmp/1.err")"
  echo "ok: ${code#*:}: $(tail -1 "$tmp/1.err" | cut -c1-160)"
done

echo "== 2. UNAVAILABLE is retried with backoff"
fake 14
timeout 120 "$STRATA" changes --endpoint "$ADDR" --table "$TABLE" --follow >"$tmp/2.out" 2>"$tmp/2.err" &
CLI=$!
PIDS+=("$CLI")
# past the 4 failures after which the command asks about the table (it is there: go on)
for _ in $(seq 1 600); do grep -q "(failure 6 in a row)" "$tmp/2.err" && break; sleep 0.1; done
grep -q "(failure 6 in a row)" "$tmp/2.err" || bad "UNAVAILABLE: no 6th retry: $(cat "$tmp/2.err")"
kill -0 "$CLI" 2>/dev/null || bad "UNAVAILABLE: the command ended: $(tail -3 "$tmp/2.err")"
k=1
for delay in 0.1 0.2 0.4 0.8 1.6 3.2; do # the backoff doubles
  grep -F "$PART ended with UNAVAILABLE" "$tmp/2.err" |
    grep -qF "retrying from its last token in $delay s (failure $k in a row)" ||
    bad "UNAVAILABLE: no retry $k after $delay s: $(cat "$tmp/2.err")"
  k=$((k + 1))
done
echo "ok: 6 retries, each named and each delay doubled, still following"

echo "== 3. streams turned off: the disguised permanent error ends the command"
"$STRATA" changes --endpoint "$ADDR" --table "$TABLE" --disable >/dev/null || bad "--disable"
for _ in $(seq 1 600); do kill -0 "$CLI" 2>/dev/null || break; sleep 0.1; done
kill -0 "$CLI" 2>/dev/null && bad "streams off: still retrying a minute later: $(tail -3 "$tmp/2.err")"
wait "$CLI"
rc=$?
[ "$rc" = 1 ] || bad "streams off: exit $rc: $(tail -3 "$tmp/2.err")"
grep -F "$PART keeps failing" "$tmp/2.err" | grep -F "FAILED_PRECONDITION" |
  grep -q "turn change streams on" || bad "streams off: the message: $(tail -3 "$tmp/2.err")"
echo "ok: $(tail -1 "$tmp/2.err" | cut -c1-200)"
echo "PASS"
