#!/usr/bin/env bash
# changes_nodejs_test.sh — change streams through the official Cloud Bigtable Node.js client
# (@google-cloud/bigtable, installed by nodejs_client_test.sh's `npm ci` into the build tree's
# nodejs-deps): its generated BigtableClient.generateInitialChangeStreamPartitions and
# readChangeStream (nodejs/changes_client.js) against a `strata up` instance (clusters east and
# west, one node each):
#   1. rows written through profile oneast are read from every partition, with cluster east;
#   2. the same rows read through onwest (the second cluster) carry cluster east;
#   3. east's node is killed with kill -9 and restarted; rows written after that are read by
#      resuming from the tokens the first read ended with, and the rows before are not repeated.
# Skips (77) without cbt, node, or the installed client package.
# Usage: changes_nodejs_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
CACHE=${STRATA_NODEJS_CACHE:-$(cd "$(dirname "$STRATA")/.." && pwd)/nodejs-deps}
JS=$(cd "$(dirname "$0")/nodejs" && pwd)/changes_client.js
if [ -z "$CBT" ]; then echo "SKIP: cbt not installed"; exit 77; fi
command -v node >/dev/null || { echo "SKIP: node not installed"; exit 77; }
if [ ! -f "$CACHE/node_modules/@google-cloud/bigtable/package.json" ]; then
  echo "SKIP: @google-cloud/bigtable is not installed in $CACHE (nodejs_client_test installs it)"
  exit 77
fi

instance_init changes_nodejs
export BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT
C=("$CBT" -project p -instance i)
cbtq() { timeout 60 "${C[@]}" "$@" 2>&1 | grep -v 'creds flag unset'; return "${PIPESTATUS[0]}"; }
us() { echo $(($(date +%s%N) / 1000)); }
# js ARGS... OUT: the Node.js client, bounded; stderr (without the client's credential notices)
# into OUT.err.
js() {
  local out=${*: -1}
  NODE_PATH="$CACHE/node_modules" timeout 180 node "$JS" "${@:1:$#-1}" >"$out" 2>"$out.err"
  local rc=$?
  grep -v -e MetadataLookupWarning -e trace-warnings "$out.err" >&2
  return $rc
}
rows() { python3 -c '
import json, sys
print(" ".join(sorted({json.loads(l)["row"] for l in open(sys.argv[1]) if l.strip()})))' "$1"; }

echo "== strata up --clusters 2 --nodes 1"
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 || fail "strata up failed"
cbtq createtable cs "families=cf:maxversions=5" || fail "cbt createtable"
cbtq createappprofile i oneast "east only" route-to=east >/dev/null || fail "createappprofile oneast"
cbtq createappprofile i onwest "west only" route-to=west >/dev/null || fail "createappprofile onwest"
out=$("$STRATA" changes --dir "$DIR" --table cs --enable 1d 2>&1) ||
  fail "turning change streams on (strata changes --enable 1d): $out"

echo "== 1. readChangeStream through oneast"
T0=$(us)
for i in 1 2 3; do cbtq set cs "n$i" app-profile=oneast "cf:c=v$i" || fail "set n$i"; done
T1=$(us)
js read cs oneast "$T0" "$T1" "$TMPD/tok1" "$TMPD/1.out" || fail "the Node.js client's read failed"
[ "$(rows "$TMPD/1.out")" = "n1 n2 n3" ] || fail "oneast: rows $(rows "$TMPD/1.out"), expected n1 n2 n3"
grep -q '"cluster":"east"' "$TMPD/1.out" || fail "no change names cluster east: $(cat "$TMPD/1.out")"
grep -q '"values":\["v1"\]' "$TMPD/1.out" || fail "n1's value v1 missing: $(cat "$TMPD/1.out")"
echo "ok: $(rows "$TMPD/1.out")"

echo "== 2. the second cluster (onwest) has east's changes"
cbtq waitforreplication cs >/dev/null || fail "waitforreplication"
js read cs onwest "$T0" "$(us)" "$TMPD/tok2" "$TMPD/2.out" || fail "the read through onwest failed"
[ "$(rows "$TMPD/2.out")" = "n1 n2 n3" ] || fail "onwest: rows $(rows "$TMPD/2.out")"
if grep -v '"cluster":"east"' "$TMPD/2.out" | grep -q .; then
  fail "west's stream names another source cluster: $(cat "$TMPD/2.out")"
fi
echo "ok: $(rows "$TMPD/2.out") from cluster east"

echo "== 3. kill -9 east-0, restart, resume from the tokens"
kill -9 "$(cat "$DIR/run/east-0.pid")" || fail "could not kill east-0"
"$STRATA" up --dir "$DIR" >/dev/null 2>&1 || fail "strata up did not restart east-0"
for i in 4 5; do
  ok=0
  for _ in $(seq 1 30); do cbtq set cs "n$i" app-profile=oneast "cf:c=v$i" >/dev/null && { ok=1; break; }; sleep 0.5; done
  [ $ok = 1 ] || fail "set n$i after the restart"
done
js resume cs oneast "$TMPD/tok1" "$(us)" "$TMPD/tok3" "$TMPD/3.out" ||
  fail "resuming from the tokens after the restart failed"
[ "$(rows "$TMPD/3.out")" = "n4 n5" ] ||
  fail "resumed read: rows $(rows "$TMPD/3.out"), expected n4 n5 (nothing repeated, nothing lost)"
echo "ok: $(rows "$TMPD/3.out")"
echo "PASS"
