#!/usr/bin/env bash
# up_metrics_partial_test.sh — `strata up --no-metrics` / `--metrics` on a running instance: the
# processes it starts (a partly running instance) follow the flag (--no-metrics used to start
# them with the recorded metrics all the same), their ready lines show the metrics URL as the
# full start's do, and the running processes, which keep what they were started with, are said
# to take the flag at their next start (`strata down` then `strata up --no-metrics`): a fully
# running instance used to answer "Already running" and nothing about the flag.
# One cluster of one node. Skips (77) without python3.
# Usage: up_metrics_partial_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
command -v python3 >/dev/null || { echo "python3 missing: skipped"; exit 77; }
instance_init up_metrics_partial
# cmdline NAME: the command line of running process NAME.
cmdline() { tr '\0' ' ' <"/proc/$(cat "$DIR/run/$1.pid")/cmdline"; }
# up OUT ARGS...: strata up --dir DIR ARGS..., output in TMPD/OUT; fails unless it exits 0.
up() {
  local out=$TMPD/$1 rc
  shift
  "$STRATA" up --dir "$DIR" "$@" >"$out" 2>&1
  rc=$?
  [ "$rc" = 0 ] || { cat "$out"; fail "strata up $* exited $rc"; }
}

up up1.out --port "$PORT" --clusters 1 --nodes 1 --metrics

echo "== partly running, up --no-metrics"
kill -9 "$(cat "$DIR/run/east-0.pid")"
up up2.out --no-metrics
[ ! -e "$DIR/run/east-0.metrics" ] || { cat "$TMPD/up2.out"; fail "--no-metrics kept east-0's metrics record"; }
! cmdline east-0 | grep -q -- --metrics || fail "--no-metrics started east-0 with metrics: $(cmdline east-0)"
grep -q "1 running process(es) keep running with metrics; --no-metrics takes effect at the next start" "$TMPD/up2.out" ||
  { cat "$TMPD/up2.out"; fail "partial up --no-metrics does not say the router keeps its metrics"; }
[ -s "$DIR/run/router.metrics" ] || fail "the running router's metrics record was dropped"
echo "ok: east-0 started without metrics, the router said to keep them"

echo "== fully running, up --no-metrics"
up up3.out --no-metrics
grep -q "Already running" "$TMPD/up3.out" || { cat "$TMPD/up3.out"; fail "not 'Already running'"; }
grep -q -- "--no-metrics takes effect at the next start of each process: \`strata down --dir $DIR\` then \`strata up --dir $DIR --no-metrics\`" "$TMPD/up3.out" ||
  { cat "$TMPD/up3.out"; fail "up --no-metrics on a running instance says nothing about the flag"; }

echo "== fully running, up --metrics"
up up4.out --metrics
grep -q -- "1 running process(es) keep running without metrics; --metrics takes effect at the next start" "$TMPD/up4.out" ||
  { cat "$TMPD/up4.out"; fail "up --metrics on a running instance says nothing about east-0"; }

echo "== partly running, up --metrics"
kill -9 "$(cat "$DIR/run/east-0.pid")"
up up5.out --metrics
addr=$(cat "$DIR/run/east-0.metrics" 2>/dev/null)
[ -n "$addr" ] || { cat "$TMPD/up5.out"; fail "--metrics recorded no metrics port for east-0"; }
cmdline east-0 | grep -q -- "--metrics $addr" || fail "east-0 runs without --metrics $addr"
grep -q "east-0 .*ready (pid .*)  metrics http://$addr/metrics" "$TMPD/up5.out" ||
  { cat "$TMPD/up5.out"; fail "the partial start line lacks the metrics URL"; }
! grep -q "takes effect" "$TMPD/up5.out" || { cat "$TMPD/up5.out"; fail "a note although every process follows --metrics"; }
echo "ok: east-0 started with metrics on $addr, shown"
echo PASS
