#!/usr/bin/env bash
# router_limit_test.sh — a rows_limit read that a router had to retry must still end OK. Through
# the official Node.js client (nodejs/router_limit.js): `strata up --clusters 1 --nodes 2` with
# 64 KiB tablets; two more routers start before the table fills, so their tablet maps still show
# its one first tablet once the first router's balancer has moved split tablets to the other
# node. A forward scan (through the second router) and a reversed one (through the third) with
# rows_limit N-1 meet "strata-not-owner" on the old node, refresh, retry and reach the limit:
# each must return exactly N-1 rows in order and no error. (The router used to end such a read
# with the not-owner answer of the try it had got past: a FAILED_PRECONDITION the client does
# not retry, after every row had been sent.) Before that, once the nodes stopped splitting,
# SampleRowKeys through a fourth router started before the table filled must name the same keys
# as through the first (it used to ask only the nodes of its stale map, leaving out every tablet
# moved since). Skips (77) without cbt, node or the client package.
# Usage: router_limit_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
CACHE=${STRATA_NODEJS_CACHE:-$(cd "$(dirname "$STRATA")/.." && pwd)/nodejs-deps}
JS=$(cd "$(dirname "$0")/nodejs" && pwd)/router_limit.js
if [ -z "$CBT" ]; then echo "SKIP: cbt not installed"; exit 77; fi
command -v node >/dev/null || { echo "SKIP: node not installed"; exit 77; }
if [ ! -f "$CACHE/node_modules/@google-cloud/bigtable/package.json" ]; then
  echo "SKIP: @google-cloud/bigtable is not installed in $CACHE (nodejs_client_test installs it)"
  exit 77
fi
instance_init router_limit
N=600
js() { # js HOST:PORT ARGS...: the client script, bounded, without its credential notices
  local at=$1
  shift
  BIGTABLE_EMULATOR_HOST=$at NODE_PATH="$CACHE/node_modules" timeout 120 node "$JS" "$@" 2>&1 |
    grep -v -e MetadataLookupWarning -e trace-warnings
  return "${PIPESTATUS[0]}"
}
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 2 --split-bytes 65536 >/dev/null ||
  fail "strata up failed"
BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT timeout 60 "$CBT" -project p -instance i createtable t \
  families=cf >/dev/null 2>&1 || fail "createtable t"
RCMD=$(grep -o 'strata up starts router: .*' "$DIR/logs/router.log" | tail -1 | sed 's/^strata up starts router: //')
P2=$(free_port)
P3=$(free_port)
P4=$(free_port)
for p in "$P2" "$P3" "$P4"; do
  # shellcheck disable=SC2086 # the logged command line is split into its words on purpose
  ${RCMD% --listen *} --listen "127.0.0.1:$p" --balance off >"$TMPD/router-$p.log" 2>&1 &
  PIDS+=("$!")
  wait_line "$TMPD/router-$p.log" 'listening' >/dev/null || fail "router on $p did not start"
done

echo "== $N rows of 1000 bytes through the first router; its balancer moves split tablets"
js "127.0.0.1:$PORT" write t "$N" || fail "writing $N rows failed"
moved=0
for _ in $(seq 1 100); do
  grep -q 'module=balance cluster=' "$DIR/logs/router.log" && { moved=1; break; }
  sleep 0.2
done
[ $moved = 1 ] || fail "the balancer moved no tablet (tablets: $(grep -c 'module=split' "$DIR"/logs/*.log))"
grep -m1 'module=balance cluster=' "$DIR/logs/router.log"

echo "== SampleRowKeys through a router whose map is stale, once the nodes stopped splitting"
splits() { cat "$DIR"/logs/east-*.log | grep -c 'module=split table='; }
last=$(splits)
for _ in $(seq 1 20); do
  sleep 5
  now=$(splits)
  [ "$now" = "$last" ] && break
  last=$now
done
# The fourth router's answer is compared with the first's taken just before and just after it;
# when those two differ, a split came between: take all three again.
same=0
for _ in 1 2 3 4 5; do
  a=$(js "127.0.0.1:$PORT" samples t) || fail "SampleRowKeys through the first router: $a"
  b=$(js "127.0.0.1:$P4" samples t) || fail "SampleRowKeys through the fourth router: $b"
  c=$(js "127.0.0.1:$PORT" samples t) || fail "SampleRowKeys through the first router: $c"
  [ "$a" = "$c" ] || { sleep 2; continue; }
  echo "first router:  $a"
  echo "fourth router: $b"
  [ "$a" = "$b" ] || fail "SampleRowKeys through the fourth router leaves out tablets"
  same=1
  break
done
[ $same = 1 ] || fail "the tablets kept splitting: no stable SampleRowKeys answer to compare"

echo "== rows_limit $((N - 1)) through the routers whose maps are stale"
js "127.0.0.1:$P2" scan t "$N" $((N - 1)) forward || fail "the forward limited scan failed"
js "127.0.0.1:$P3" scan t "$N" $((N - 1)) reversed || fail "the reversed limited scan failed"
echo PASS
