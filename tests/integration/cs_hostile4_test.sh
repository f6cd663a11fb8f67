#!/usr/bin/env bash
# cs_hostile4_test.sh — change stream records at the limits, on `strata up --clusters 2
# --nodes 1` (cs_hostile4.py, one instance for the modes given, default limits bigrow manyrefs):
#   limits:   a MutateRow of 100,000 mutations, with and without a DeleteFromRow, is accepted on
#             a table with change streams on and recorded whole;
#   bigrow:   one of 257 cells holding 139 MB too, and a row of 306 mutations keeps in its record
#             the values it overwrites or deletes itself; both read back live, on the second
#             cluster and from storage;
#   manyrefs: a catch-up read of a row holding 65,536 values by reference delivers them;
#   order:    writes of a row, large and small alternating, come out of the second cluster's
#             stream in the order written;
#   starts:   a start_time in the future or before retention is refused for a partition spanning
#             tablets too (not answered with a CloseStream at that time); one before the history
#             names the time streams were turned on (router and `strata changes --from`), and a
#             start just after it is read; a retention_period that is not a valid Duration is
#             refused as such by CreateTable and UpdateTable;
#   budget:   open streams keep their requests out of the buffered-request budget: two of
#             128 MiB are refused and other calls go on; 1000 KiB ones open up to 32 MiB in all;
#   maxmsg:   a router with --max-message-bytes 100000 relays a burst of small records whole and
#             ends a larger record FAILED_PRECONDITION naming the flag;
#   mirror:   a copy made by applying the stream of 400 random writes of every kind reads as the
#             table does (live, on the second cluster, from storage).
# Skips (77) without python3.
# Usage: cs_hostile4_test.sh PATH/TO/strata [MODE...]
set -u
STRATA=$1
shift
MODES=${*:-limits bigrow manyrefs}
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init cshostile4
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 --metrics >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
for mode in $MODES; do
  echo "== $mode"
  timeout 240 python3 "$(dirname "$0")/cs_hostile4.py" "$mode" "$PORT" "$DIR" "$STRATA" ||
    fail "cs_hostile4.py $mode failed (see its FAIL lines above)"
done
# The second cluster's node counts the peer's Apply calls it refused after waiting for an
# earlier batch (docs/metrics.md); the order mode's writes must have needed none of them.
page=$(python3 -c 'import sys,urllib.request; print(urllib.request.urlopen("http://"+sys.argv[1]+"/metrics",timeout=10).read().decode())' \
  "$(cat "$DIR/run/west-0.metrics")") || fail "GET /metrics of west-0"
refused=$(awk '$1 == "strata_replication_apply_refused_total" { print $2 }' <<<"$page")
echo "west-0 strata_replication_apply_refused_total=${refused:-missing}"
[ -n "$refused" ] || fail "west-0 does not report strata_replication_apply_refused_total"
case " $MODES " in *" order "*) [ "$refused" = 0 ] || fail "west-0 refused $refused Apply calls in order mode" ;; esac
echo "PASS"
