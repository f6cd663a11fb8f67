#!/usr/bin/env bash
# failover_routers_test.sh — the CLI's router commands on an instance with two routers (`listen`
# twice in [router], so `strata up` starts router and router-1) when the first one is down:
#   1. `strata failover` goes through router-1 (it only ever asked the first router, so a
#      failover was impossible exactly when its zone was lost), and `--endpoint HOST:PORT`
#      names the router to use;
#   2. `strata backup list` also finds router-1;
#   3. with both routers down, failover names both and says to start them with `strata up`.
# Skips (77) without cbt.
# Usage: failover_routers_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "SKIP: cbt not installed"; exit 77; fi
instance_init failover_routers
R0=127.0.0.1:$PORT
R1=127.0.0.1:$(free_port)
cat >"$TMPD/topo" <<EOF
project = p
instance = i
[cluster east]
zone = zone-a
node = 127.0.0.1:$(free_port) $TMPD/e0
[cluster west]
zone = zone-b
node = 127.0.0.1:$(free_port) $TMPD/w0
[router]
listen = $R0
listen = $R1
EOF
"$STRATA" up --dir "$DIR" --config "$TMPD/topo" >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
cbtr "$R0" createappprofile i pe d route-to=east >/dev/null || fail "create pe"
route() { cbtr "$R1" getappprofile i pe | grep -Eo 'cluster_id:"[a-z-]+"' | cut -d'"' -f2; }
# router-1 follows the metadata change at its next reload (about a second)
for _ in $(seq 1 100); do [ "$(route)" = east ] && break; sleep 0.2; done
[ "$(route)" = east ] || fail "router-1 never saw profile pe"

echo "== 1. failover with the first router down"
kill -9 "$(cat "$DIR/run/router.pid")" || fail "no router pid"
"$STRATA" failover pe west --dir "$DIR" >"$TMPD/f1.out" 2>&1 ||
  { cat "$TMPD/f1.out"; fail "failover with router down and router-1 up"; }
[ "$(route)" = west ] || fail "pe routes to '$(route)' after the failover, not west"
"$STRATA" failover pe east --dir "$DIR" --endpoint "$R1" >"$TMPD/f2.out" 2>&1 ||
  { cat "$TMPD/f2.out"; fail "failover --endpoint $R1"; }
[ "$(route)" = east ] || fail "pe routes to '$(route)' after failover --endpoint, not east"
out=$("$STRATA" failover pe west --dir "$DIR" --endpoint "$R0" 2>&1) &&
  fail "failover through the killed router succeeded: $out"
echo "$out" | grep -q "strata up --dir $DIR" || fail "no advice to start the router: $out"
echo "ok: failover went through router-1; --endpoint chooses the router"

echo "== 2. backup list with the first router down"
"$STRATA" backup list --dir "$DIR" >"$TMPD/b.out" 2>&1 || { cat "$TMPD/b.out"; fail "backup list"; }
echo "ok: backup list went through router-1"

echo "== 3. no router answers"
kill -9 "$(cat "$DIR/run/router-1.pid")" || fail "no router-1 pid"
out=$("$STRATA" failover pe west --dir "$DIR" 2>&1) && fail "failover with no router succeeded: $out"
echo "$out" | grep -q "router $R0 (nothing listens); router-1 $R1 (nothing listens)" ||
  fail "the routers are not named: $out"
echo "$out" | grep -q "strata up --dir $DIR" || fail "no advice to start the routers: $out"
echo "ok: $out"
echo PASS
