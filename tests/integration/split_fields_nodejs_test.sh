#!/usr/bin/env bash
# split_fields_nodejs_test.sh — a request whose singular message field (a oneof member such as
# Mutation.set_cell, CreateTableRequest.table, a filter's Condition.predicate_filter) comes in two
# pieces is refused with INVALID_ARGUMENT naming the field, by the router and by a node alike, and
# nothing is stored (nodejs/split_fields_client.js: raw protobuf bytes through grpc-js). Protobuf
# merges such pieces; protobuf-c kept only a oneof member's last piece, so a split SetCell was
# acknowledged and stored without its qualifier and value. On a `strata up` instance (clusters
# east and west, one node each). Skips (77) without node or the installed client package.
# Usage: split_fields_nodejs_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
CACHE=${STRATA_NODEJS_CACHE:-$(cd "$(dirname "$STRATA")/.." && pwd)/nodejs-deps}
JS=$(cd "$(dirname "$0")/nodejs" && pwd)/split_fields_client.js
command -v node >/dev/null || { echo "SKIP: node not installed"; exit 77; }
if [ ! -f "$CACHE/node_modules/@grpc/grpc-js/package.json" ]; then
  echo "SKIP: @grpc/grpc-js is not installed in $CACHE (nodejs_client_test installs it)"
  exit 77
fi

instance_init split_fields_nodejs
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
EAST=$(awk '$0 == "[cluster east]" {f=1; next} /^\[/{f=0} f && /^node =/{print $3; exit}' "$DIR/topology")
[ -n "$EAST" ] || fail "no node address in $DIR/topology"
NODE_PATH="$CACHE/node_modules" timeout 120 node "$JS" "127.0.0.1:$PORT" "$EAST"
rc=$?
[ $rc -eq 0 ] || fail "split_fields_client.js exited $rc"
echo "split_fields_nodejs_test: passed"
