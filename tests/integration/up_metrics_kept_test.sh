#!/usr/bin/env bash
# up_metrics_kept_test.sh — an instance started with `strata up --metrics` keeps its metrics
# endpoints on a later plain `strata up` (after `strata down`), on the same ports while they are
# free, as it keeps --secure, --split-bytes and its router's port: the plain start used to remove
# every DIR/run/<name>.metrics and start the processes without --metrics, so scrapers found
# nothing. `strata up --no-metrics` turns them off; --metrics with --no-metrics is bad usage.
# One cluster of one node. Skips (77) without python3.
# Usage: up_metrics_kept_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
command -v python3 >/dev/null || { echo "python3 missing: skipped"; exit 77; }
instance_init up_metrics_kept
# scrape NAME: GET /metrics of NAME at the address DIR/run/NAME.metrics records answers.
scrape() {
  python3 -c 'import sys, urllib.request
body = urllib.request.urlopen("http://%s/metrics" % sys.argv[1], timeout=10).read()
assert body, "empty"' "$(cat "$DIR/run/$1.metrics")" || fail "$2: GET /metrics of $1"
}

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 --metrics >"$TMPD/up1.out" 2>&1 ||
  { cat "$TMPD/up1.out"; fail "strata up --metrics"; }
node_addr=$(cat "$DIR/run/east-0.metrics")
router_addr=$(cat "$DIR/run/router.metrics")
scrape east-0 "--metrics"
scrape router "--metrics"

echo "== down, then a plain up"
"$STRATA" down --dir "$DIR" >/dev/null 2>&1 || fail "strata down"
"$STRATA" up --dir "$DIR" >"$TMPD/up2.out" 2>&1 || { cat "$TMPD/up2.out"; fail "strata up again"; }
for n in east-0 router; do
  [ -s "$DIR/run/$n.metrics" ] || { cat "$TMPD/up2.out"; fail "a plain up dropped $n's metrics"; }
  tr '\0' ' ' <"/proc/$(cat "$DIR/run/$n.pid")/cmdline" | grep -q -- "--metrics $(cat "$DIR/run/$n.metrics")" ||
    fail "$n runs without --metrics after a plain up"
  scrape "$n" "plain up"
done
[ "$(cat "$DIR/run/east-0.metrics")" = "$node_addr" ] && [ "$(cat "$DIR/run/router.metrics")" = "$router_addr" ] ||
  fail "the metrics ports moved: $node_addr -> $(cat "$DIR/run/east-0.metrics"), $router_addr -> $(cat "$DIR/run/router.metrics")"
grep -q "metrics http://$node_addr/metrics" "$TMPD/up2.out" || { cat "$TMPD/up2.out"; fail "up does not show the metrics"; }
echo "ok: metrics kept on $node_addr and $router_addr"

echo "== --metrics --no-metrics"
"$STRATA" up --dir "$DIR" --metrics --no-metrics >"$TMPD/up3.out" 2>&1
rc=$?
[ "$rc" = 2 ] || { cat "$TMPD/up3.out"; fail "--metrics --no-metrics exited $rc, not 2"; }

echo "== down, then up --no-metrics"
"$STRATA" down --dir "$DIR" >/dev/null 2>&1 || fail "strata down"
"$STRATA" up --dir "$DIR" --no-metrics >"$TMPD/up4.out" 2>&1 || { cat "$TMPD/up4.out"; fail "strata up --no-metrics"; }
for n in east-0 router; do
  [ ! -e "$DIR/run/$n.metrics" ] || fail "--no-metrics left $DIR/run/$n.metrics"
  ! tr '\0' ' ' <"/proc/$(cat "$DIR/run/$n.pid")/cmdline" | grep -q -- "--metrics" ||
    fail "$n runs with --metrics after --no-metrics"
done
"$STRATA" down --dir "$DIR" >/dev/null 2>&1 || fail "strata down"
"$STRATA" up --dir "$DIR" >"$TMPD/up5.out" 2>&1 || { cat "$TMPD/up5.out"; fail "strata up after --no-metrics"; }
[ ! -e "$DIR/run/east-0.metrics" ] || fail "a plain up after --no-metrics turned metrics on"
echo "ok: --no-metrics turns them off, and later plain starts keep them off"
echo PASS
