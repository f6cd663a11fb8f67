#!/usr/bin/env bash
# backup_reuse_test.sh — a backup id made again after a delete that missed a down node holds the
# new instant, never the deleted backup's pieces left on that node (piece ids n<node>-t<tablet>
# repeat). Against a `strata up` instance (clusters east and west, two nodes each), through the
# official Node.js client (nodejs/backup_reuse.js):
#   create: 16 tablets at v1, CreateBackup sb; kill -9 east-1; DeleteBackup sb (its pieces stay on
#           east-1's disk); restart; rows at v2; CreateBackup sb again; its restore reads v2 only;
#   copy:   a copy c of a1 made on west; kill -9 west-1; DeleteBackup c; restart; rows at v2, a2
#           made and copied as c again; the restore of c reads v2 only;
#   cleanup: a backup deleted while east-1 was down and not made again: the router's sweep deletes
#           its pieces on east-1 once it is back (only that making's: the two backups made again
#           above restore v2 again afterwards).
# A node that finds a leftover drops it (event=leftover_piece_removed) unless the sweep's late
# delete came first; which one wins depends on timing, the restores hold either way.
# Each making names itself (its operation) to the nodes, which drop a piece of another making
# (docs/backups.md "Pieces left behind").
# Skips (77) without node or the installed client package.
# Usage: backup_reuse_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
CACHE=${STRATA_NODEJS_CACHE:-$(cd "$(dirname "$STRATA")/.." && pwd)/nodejs-deps}
JS=$(cd "$(dirname "$0")/nodejs" && pwd)/backup_reuse.js
command -v node >/dev/null || { echo "SKIP: node not installed"; exit 77; }
if [ ! -f "$CACHE/node_modules/@google-cloud/bigtable/package.json" ]; then
  echo "SKIP: @google-cloud/bigtable is not installed in $CACHE (nodejs_client_test installs it)"
  exit 77
fi

instance_init backup_reuse
echo "== strata up --clusters 2 --nodes 2"
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 2 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT METADATA_SERVER_DETECTION=none \
  NODE_PATH="$CACHE/node_modules" timeout 400 node "$JS" "$DIR" "$STRATA" \
  >"$TMPD/js.out" 2>"$TMPD/js.err"
rc=$?
cat "$TMPD/js.out"
grep -v -e MetadataLookupWarning -e trace-warnings "$TMPD/js.err" >&2
[ $rc = 0 ] || fail "backup_reuse.js failed (exit $rc)"
echo "== leftover pieces the nodes removed"
grep -ho 'event=leftover_piece_removed backup=[^ ]* piece=[^ ]*' "$DIR"/logs/*.log 2>/dev/null |
  sort | uniq -c | head -n 40
echo "== late deletes the router's sweep sent"
grep -ho 'late delete of backup [^ ]*' "$DIR"/logs/router.log | sort | uniq -c
grep -q 'late delete of backup' "$DIR"/logs/router.log || fail "the router logged no late delete"
grep -ho 'event=making_deleted .*' "$DIR"/logs/*.log | sed 's/^/  on a node: /'
echo "PASS"
