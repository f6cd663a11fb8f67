#!/usr/bin/env bash
# backup_nodejs_test.sh — Cloud Bigtable backups through the official Node.js client
# (@google-cloud/bigtable, installed by nodejs_client_test.sh's `npm ci` into the build tree's
# nodejs-deps) against a `strata up` instance (clusters east and west, two nodes each): every
# backup method of the client (nodejs/backup_client.js), then the operations after a router
# restart: ListOperations still lists the backup's operation and GetOperation answers it done.
# Between the two, nodejs/ops_list_client.js: ListOperations of one backup lists only its own
# operations, and its pages do not shift when an operation starts between them.
# Skips (77) without node or the installed client package.
# Usage: backup_nodejs_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
CACHE=${STRATA_NODEJS_CACHE:-$(cd "$(dirname "$STRATA")/.." && pwd)/nodejs-deps}
JS=$(cd "$(dirname "$0")/nodejs" && pwd)/backup_client.js
command -v node >/dev/null || { echo "SKIP: node not installed"; exit 77; }
if [ ! -f "$CACHE/node_modules/@google-cloud/bigtable/package.json" ]; then
  echo "SKIP: @google-cloud/bigtable is not installed in $CACHE (nodejs_client_test installs it)"
  exit 77
fi

instance_init backup_nodejs
export BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT
# The client must not look for a cloud metadata server (off the loopback, and seconds of waiting).
export METADATA_SERVER_DETECTION=none
echo "== strata up --clusters 2 --nodes 2"
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 2 || fail "strata up failed"

echo "== the Node.js client's backup methods"
NODE_PATH="$CACHE/node_modules" timeout 300 node "$JS" >"$TMPD/js.out" 2>"$TMPD/js.err"
rc=$?
cat "$TMPD/js.out"
grep -v -e MetadataLookupWarning -e trace-warnings "$TMPD/js.err" >&2
[ $rc = 0 ] || fail "backup_client.js failed (exit $rc)"

echo "== ListOperations: one resource's operations, pages that name where they ended"
NODE_PATH="$CACHE/node_modules" timeout 300 node "$(dirname "$JS")/ops_list_client.js" \
  >"$TMPD/ops.out" 2>"$TMPD/ops.err"
rc=$?
cat "$TMPD/ops.out"
grep -v -e MetadataLookupWarning -e trace-warnings "$TMPD/ops.err" >&2
[ $rc = 0 ] || fail "ops_list_client.js failed (exit $rc)"

echo "== the operations after a router restart"
# lro.js: ListOperations / GetOperation through the client's generated operations client, tried
# until the restarted router answers (bounded). One node process does all the tries: loading the
# client library alone takes seconds on a loaded machine, so a fresh process per try (under a
# short `timeout`) could spend every try loading and never ask. Each try's error goes to stderr.
cat >"$TMPD/lro.js" <<'JS'
const {Bigtable} = require('@google-cloud/bigtable');
const bt = new Bigtable({projectId: 'p'});
const name = 'operations/projects/p/instances/i/clusters/east/backups/b1';
async function once(ops) {
  const [list] = await ops.listOperations({name, filter: ''}, {timeout: 10000});
  if (!list.length) throw new Error('no operation listed for b1');
  const [op] = await ops.getOperation({name: list[0].name}, {timeout: 10000});
  if (!op.done || op.error) throw new Error('operation not done or failed: ' + JSON.stringify(op));
  return `listed ${list.length}: ${list[0].name} done`;
}
(async () => {
  await bt.instance('i').getTables(); // makes the client's admin API object, on the emulator host
  const ops = bt.api.BigtableTableAdminClient.operationsClient;
  for (let i = 1;; i++) {
    try {
      console.log(await once(ops));
      return;
    } catch (e) {
      console.error(`try ${i}: ${e && e.message ? e.message : e}`);
      if (i === 20) throw e;
      await new Promise(res => setTimeout(res, 500));
    }
  }
})().catch(e => { console.error(e); process.exit(1); });
JS
RPID=$(cat "$DIR/run/router.pid") || fail "no router pid in $DIR/run"
kill "$RPID"
for _ in $(seq 1 100); do kill -0 "$RPID" 2>/dev/null || break; sleep 0.1; done # gone before `strata up` looks
"$STRATA" up --dir "$DIR" >/dev/null 2>&1 || fail "strata up did not restart the router"
NODE_PATH="$CACHE/node_modules" timeout 240 node "$TMPD/lro.js" >"$TMPD/lro.out" 2>"$TMPD/lro.err"
rc=$?
cat "$TMPD/lro.out"
[ $rc = 0 ] || { grep -v -e MetadataLookupWarning -e trace-warnings "$TMPD/lro.err" >&2
  fail "the backup's operation is not listed after the restart (lro.js exit $rc)"; }
echo "PASS"
