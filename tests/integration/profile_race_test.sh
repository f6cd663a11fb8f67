#!/usr/bin/env bash
# profile_race_test.sh — changes of one app profile sent at the same moment through one router
# (two clusters of one strata-node each), by profile_race. Each change used to read the router's
# copy of the profile and then write its result to every cluster, so calls overlapping in that
# window all started from the same copy: concurrent CreateAppProfile calls of one id could all
# succeed, UpdateAppProfile calls carrying the same etag could all pass the etag check, an update
# of the description and one of the routing could undo each other, and an update overlapping a
# DeleteAppProfile could write the profile back after the delete answered OK. Now the changes of
# one profile run one at a time (docs/router.md, "Changes of one app profile run one at a time").
# Through two routers at once, a create of one id or updates carrying one etag: exactly one
# succeeds (compare-and-set on the first cluster's record).
# Usage: profile_race_test.sh PATH/TO/strata-node PATH/TO/strata-router PATH/TO/profile_race
set -u
. "$(dirname "$0")/lib.sh"
NODE_BIN=$1
ROUTER_BIN=$2
RACE=$3

dir=$(make_tmp)
two_clusters "$dir"
start_router "$dir/topology" "$dir/r1.log"; R1=$ROUTER_ADDR
start_router "$dir/topology" "$dir/r2.log"; R2=$ROUTER_ADDR
"$RACE" "$R1" "$R2"
rc=$?
if grep -l 'Sanitizer' "$dir"/*.log; then echo "FAIL: sanitizer report"; rc=1; fi
[ $rc = 0 ] && echo "PASS" || { echo "FAILED"; tail -n 20 "$dir/r1.log"; }
exit $rc
