#!/usr/bin/env bash
# sweep_nodejs_test.sh — differential sweep of the data API's edges (nodejs/sweep_client.js):
# the same calls through the official Node.js client to a `strata up` instance (one cluster, one
# node, through the router) and to the official emulator, answers compared case by case; where
# the emulator differs from Cloud Bigtable Strata must give Cloud Bigtable's answer
# (docs/bigtable.md, "Where Strata and the emulator differ"). The client is installed by
# nodejs_client_test.sh into the build tree's nodejs-deps. Skips (77) without the emulator,
# cbt, node or the installed client package.
# Usage: sweep_nodejs_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
CACHE=${STRATA_NODEJS_CACHE:-$(cd "$(dirname "$STRATA")/.." && pwd)/nodejs-deps}
JS=$(cd "$(dirname "$0")/nodejs" && pwd)/sweep_client.js
if [ ! -x "$EMULATOR" ]; then echo "SKIP: the emulator is not installed ($EMULATOR)"; exit 77; fi
if [ -z "$CBT" ]; then echo "SKIP: cbt not installed"; exit 77; fi
command -v node >/dev/null || { echo "SKIP: node not installed"; exit 77; }
if [ ! -f "$CACHE/node_modules/@google-cloud/bigtable/package.json" ]; then
  echo "SKIP: @google-cloud/bigtable is not installed in $CACHE (nodejs_client_test installs it)"
  exit 77
fi

up_single sweep_nodejs
start_emulator || fail "the emulator did not start"
NODE_PATH="$CACHE/node_modules" timeout 120 node "$JS" "127.0.0.1:$PORT" "$EMU_ADDR" \
  2> >(grep -v -e MetadataLookupWarning -e trace-warnings >&2)
rc=$?
[ $rc -eq 0 ] || fail "sweep_client.js exited $rc"
echo "sweep_nodejs_test: passed"
