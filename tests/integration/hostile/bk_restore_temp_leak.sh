#!/usr/bin/env bash
# bk_restore_temp_leak.sh — RestoreTable from another cluster's backup pulls its pieces onto
# this cluster's nodes under a temporary name `restore-<n>` and deletes them after the table's
# record is written (docs/backups.md, "Restore", step 4). When the router dies after that write
# and before the delete, the restarted router's sweep finishes the operation OK ("its work had
# committed": router/backup_job.c reap_owned, job_end with the Table) but never deletes the
# temporary pieces: they stay on the nodes for good, holding hard links to the restored files
# (disk never given back once the restored table compacts or is deleted), and no API names them
# (no record: DeleteBackup of restore-<n> is NOT_FOUND).
# `strata up --clusters 2 --nodes 2`, a west backup of a 50-row table; per round 8 RestoreTable
# (each pulls into east), kill -9 of the router right after the 8th is accepted, `strata up`
# restarts it; once every operation is done (and a sweep later) no `restore-*` piece directory
# may be left on any node. The window is short: up to ROUNDS rounds (default 10); reproduced in round 0 here (and once by hand), not at all in 10 rounds with one node per cluster.
# Exit 0: held; 1: reproduced. Skips (77) without node or the installed @google-cloud/bigtable.
# Usage: bk_restore_temp_leak.sh PATH/TO/strata [NODE_PATH] [ROUNDS]
set -u
. "$(dirname "$0")/../lib.sh"
STRATA=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
NP=${2:-$(cd "$(dirname "$STRATA")/.." && pwd)/nodejs-deps/node_modules}
JS=$(cd "$(dirname "$0")" && pwd)/bk_restore_temp_leak.js
command -v node >/dev/null || { echo "SKIP: node not installed"; exit 77; }
[ -f "$NP/@google-cloud/bigtable/package.json" ] || { echo "SKIP: no @google-cloud/bigtable in $NP"; exit 77; }
instance_init bk_restore_temp
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 2 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT METADATA_SERVER_DETECTION=none NODE_PATH=$NP \
  timeout 900 node "$JS" "$DIR" "$STRATA" "${3:-10}" 2>&1 | grep -v -e MetadataLookupWarning -e trace-warnings
exit "${PIPESTATUS[0]}"
