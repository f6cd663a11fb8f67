#!/usr/bin/env bash
# api_edges_nodejs_test.sh — edges of the data, table admin and instance admin APIs where Strata
# answered unlike Cloud Bigtable's documented behaviour (nodejs/api_edges_client.js): Data Boost
# profiles read-only, SetIamPolicy's update_mask, Table views in GetTable and ListTables,
# authorized and materialized view names, ListAppProfiles page tokens, GC max_age Durations,
# non-aggregate value types, Table fields not implemented (automated_backup_policy, row_key_schema)
# refused at CreateTable. Through the official Node.js client against a `strata up` instance
# (clusters east and west, one node each). The client is installed by nodejs_client_test.sh into
# the build tree's nodejs-deps. Skips (77) without node or the installed client package.
# Usage: api_edges_nodejs_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
CACHE=${STRATA_NODEJS_CACHE:-$(cd "$(dirname "$STRATA")/.." && pwd)/nodejs-deps}
JS=$(cd "$(dirname "$0")/nodejs" && pwd)/api_edges_client.js
command -v node >/dev/null || { echo "SKIP: node not installed"; exit 77; }
if [ ! -f "$CACHE/node_modules/@google-cloud/bigtable/package.json" ]; then
  echo "SKIP: @google-cloud/bigtable is not installed in $CACHE (nodejs_client_test installs it)"
  exit 77
fi

instance_init api_edges_nodejs
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT NODE_PATH="$CACHE/node_modules" timeout 300 node "$JS" \
  2> >(grep -v -e MetadataLookupWarning -e trace-warnings >&2)
rc=$?
[ $rc -eq 0 ] || fail "api_edges_client.js exited $rc"
echo "api_edges_nodejs_test: passed"
