#!/usr/bin/env bash
# iam_limits_nodejs_test.sh — policies and metadata records are bounded (docs/security.md, IAM
# policies; docs/router.md, The metadata table): a SetIamPolicy of 150,000 bindings without
# members (3.75 MB) is stored without them, 1,501 members and a policy past 64 KiB are
# INVALID_ARGUMENT and leave the stored policy alone, an app profile record past 1 MiB is refused;
# normal table and instance policies still work through the official Node.js client
# (nodejs/iam_limits_client.js). Every router re-reads every record each second, so before these
# bounds one call could make that reload megabytes larger for good.
# Usage: iam_limits_nodejs_test.sh strata-node strata-router strata (skips, 77, without node or
# the client package, which nodejs_client_test installs)
set -u
. "$(dirname "$0")/lib.sh"
NODE_BIN=$1
ROUTER_BIN=$2
STRATA=$3
CACHE=${STRATA_NODEJS_CACHE:-$(cd "$(dirname "$STRATA")/.." && pwd)/nodejs-deps}
JS=$(cd "$(dirname "$0")/nodejs" && pwd)/iam_limits_client.js
command -v node >/dev/null || { echo "SKIP: node not installed"; exit 77; }
if [ ! -f "$CACHE/node_modules/@google-cloud/bigtable/package.json" ]; then
  echo "SKIP: @google-cloud/bigtable is not installed in $CACHE (nodejs_client_test installs it)"
  exit 77
fi

dir=$(make_tmp)
start_member "$dir/n1" 1
cat >"$dir/topology" <<TOPO
project = p
instance = i
[cluster east]
zone = zone-a
node = $NODE_ADDR $dir/n1
TOPO
start_router "$dir/topology" "$dir/r.log"
BIGTABLE_EMULATOR_HOST=$ROUTER_ADDR NODE_PATH="$CACHE/node_modules" timeout 120 node "$JS"
rc=$?
kill -0 "$ROUTER_PID" 2>/dev/null || { echo "FAIL: the router exited"; rc=1; }
if grep -l 'Sanitizer' "$dir"/r.log "$dir"/n1.log; then echo "FAIL: sanitizer report"; rc=1; fi
[ $rc = 0 ] && echo "PASS" || echo "FAILED"
exit $rc
