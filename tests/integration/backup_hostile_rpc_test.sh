#!/usr/bin/env bash
# backup_hostile_rpc_test.sh — hostile backup admin requests through the official Node.js client
# (nodejs/bk_hostile.js: forged page tokens, huge order_by and filters, bad ids, names and
# expire times, unknown tables/clusters/instances, four CreateBackups of one id at once) against
# `strata up --clusters 2`; then, with a second strata-router on the same instance, a backup
# deleted through it while the first router restores it into the other cluster: the restore ends
# either done with every row in both clusters or with an error and no table, and no temporary
# piece stays on the nodes. Skips (77) without node, cbt or the installed client package.
# Usage: backup_hostile_rpc_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
CACHE=${STRATA_NODEJS_CACHE:-$(cd "$(dirname "$STRATA")/.." && pwd)/nodejs-deps}
JS=$(cd "$(dirname "$0")/nodejs" && pwd)/bk_hostile.js
command -v node >/dev/null || { echo "SKIP: node not installed"; exit 77; }
if [ -z "$CBT" ]; then echo "SKIP: cbt not installed"; exit 77; fi
if [ ! -f "$CACHE/node_modules/@google-cloud/bigtable/package.json" ]; then
  echo "SKIP: @google-cloud/bigtable is not installed in $CACHE (nodejs_client_test installs it)"
  exit 77
fi
instance_init backup_hostile_rpc
export BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT
cbtq() { # cbtq HOST:PORT ARGS...
  local at=$1
  shift
  BIGTABLE_EMULATOR_HOST=$at timeout 60 "$CBT" -project p -instance i "$@" 2>&1 | grep -v 'creds flag unset'
  return "${PIPESTATUS[0]}"
}
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >/dev/null || fail "strata up failed"
cbtq "127.0.0.1:$PORT" createtable ft families=cf >/dev/null || fail "createtable ft"
for r in a b c d e f g h; do cbtq "127.0.0.1:$PORT" set ft "$r" "cf:v=$r" >/dev/null || fail "set $r"; done

echo "== hostile requests (nodejs/bk_hostile.js)"
NODE_PATH="$CACHE/node_modules" timeout 300 node "$JS" >"$TMPD/js.out" 2>"$TMPD/js.err"
rc=$?
cat "$TMPD/js.out"
[ $rc = 0 ] || fail "bk_hostile.js failed (exit $rc): $(grep -v -e MetadataLookupWarning -e trace-warnings "$TMPD/js.err")"

echo "== a backup deleted through a second router while the first restores it"
"$STRATA" bench --dir "$DIR" --project p --instance i --table big --workload bulkwrite \
  --dist sequential --keys 256 --requests 3 --value-size 65536 --no-lag --quiet >"$TMPD/load" 2>&1 ||
  fail "load: $(tail -3 "$TMPD/load")"
ROWS=$(cbtq "127.0.0.1:$PORT" count big | tail -1)
RCMD=$(grep -o 'strata up starts router: .*' "$DIR/logs/router.log" | tail -1 | sed 's/^strata up starts router: //')
PORT2=$(free_port)
# shellcheck disable=SC2086 # the logged command line is split into its words on purpose
${RCMD% --listen *} --listen "127.0.0.1:$PORT2" >"$TMPD/router2.log" 2>&1 &
PIDS+=("$!")
wait_line "$TMPD/router2.log" 'listening' >/dev/null || fail "the second router did not start"
NODES=$(sed -n 's/^node = \([^ ]*\) .*/\1/p' "$DIR/topology")
for i in 1 2 3; do
  timeout 120 "$STRATA" backup --dir "$DIR" --quiet create big --id "del$i" --wait >/dev/null || fail "create del$i"
  for _ in $(seq 1 100); do # the second router sees it at its next metadata reload
    timeout 30 "$STRATA" backup --endpoint "127.0.0.1:$PORT2" --cluster east --quiet describe "del$i" >/dev/null 2>&1 && break
    sleep 0.1
  done
  timeout 120 "$STRATA" backup --dir "$DIR" --quiet restore "del$i" --to "rt$i" --wait >"$TMPD/r$i" 2>&1 &
  RP=$!
  sleep "0.0$((i * 3))"
  timeout 30 "$STRATA" backup --endpoint "127.0.0.1:$PORT2" --cluster east --quiet delete "del$i" >/dev/null 2>&1
  if wait $RP; then
    for n in $NODES; do
      got=$(cbtq "$n" count "rt$i" | tail -1)
      [ "$got" = "$ROWS" ] || fail "rt$i restored but node $n reads $got rows of $ROWS"
    done
    echo "ok: rt$i restored whole in both clusters"
  else
    for n in $NODES; do
      cbtq "$n" count "rt$i" >/dev/null 2>&1 && fail "rt$i failed ($(cat "$TMPD/r$i")) but node $n reads it"
    done
    echo "ok: rt$i failed cleanly: $(head -c 300 "$TMPD/r$i")"
  fi
done
left=$(find "$DIR"/*-0/backups -mindepth 3 -maxdepth 3 -name 'restore-*' ! -empty)
[ -z "$left" ] || fail "temporary pieces left: $left"
echo PASS
