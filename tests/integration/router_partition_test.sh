#!/usr/bin/env bash
# router_partition_test.sh — proves a router survives a *silent* partition of a cluster and takes
# it back soon after the heal. Cluster east's one node runs in a network namespace of its own,
# reached over a veth pair (addresses from 198.18.0.0/15, the benchmarking range, used only inside
# this test's namespace and link); cluster west's node and the router run in the host namespace.
# failover_driver writes and reads continuously through a route-any profile. Then the namespace's
# end of the link goes down: packets to east vanish without a reset or an ICMP error, as in a
# partition that drops them. The router must find east silent (health probe deadline, keepalive
# PINGs), keep serving from west with no failed request, and after the link comes back, take east
# up again, and west's replication shipper must deliver to east a row written during the cut
# (the seconds each took are printed, not asserted). The router must also have found east's link
# silent (calls open, nothing received for half a second: docs/router.md, "Silent nodes and
# links"), which moves multi-cluster requests before the probes mark east down; the client's
# longest pause is printed as a figure (well under 1 s with that, 1.1-3.2 s without), not
# asserted. About 30 s.
# Skips (exit 77) unless run as root with `ip netns` and cbt available.
# Usage: router_partition_test.sh BIN_DIR PATH/TO/failover_driver
#   (BIN_DIR holds node/strata-node and router/strata-router)
set -u
. "$(dirname "$0")/lib.sh"
BIN=$1
DRIVER=$2
NODE_BIN=$BIN/node/strata-node
ROUTER_BIN=$BIN/router/strata-router
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
if [ "$(id -u)" != 0 ]; then echo "not root: skipping"; exit 77; fi
NS=strata-pt-$$
HOST_IF=spth$$
NS_IF=sptn$$
if ! ip netns add "$NS" 2>/dev/null; then echo "ip netns unavailable: skipping"; exit 77; fi
NET=$((RANDOM % 250 + 1)) # 198.18.NET.0/30, so parallel runs use different links
HOST_IP=198.18.$NET.1
NS_IP=198.18.$NET.2

TMPD=$(mktemp -d "${STRATA_TEST_TMP:-/tmp}/router_partition.XXXXXX")
PROCS=()
DRIVER_PID=
finish() {
  [ -n "$DRIVER_PID" ] && kill "$DRIVER_PID" 2>/dev/null
  for p in "${PROCS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PROCS[@]}"; do wait "$p" 2>/dev/null; done
  ip link del "$HOST_IF" 2>/dev/null
  ip netns del "$NS" 2>/dev/null
  rm -rf "$TMPD"
  cleanup
}
trap finish EXIT

fail() {
  echo "FAIL: $*" >&2
  for f in "$TMPD"/*.log "$TMPD"/driver.out; do
    [ -e "$f" ] || continue
    echo "--- $f (last 25 lines)" >&2
    tail -n 25 "$f" >&2
  done
  exit 1
}

wait_for() { # WHAT COMMAND...: polls (hang guard: 600 x 0.1 s), never a timing assertion
  local what=$1 i
  shift
  for i in $(seq 1 600); do
    if "$@"; then return 0; fi
    sleep 0.1
  done
  fail "gave up waiting for $what"
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
log_has() { grep -q -- "$2" "$TMPD/$1.log"; }
keys_written() { { wc -l <"$TMPD/keys"; } 2>/dev/null || echo 0; }
keys_at_least() { [ "$(keys_written)" -ge "$1" ]; }
count_in() { grep -c -- "$2" "$TMPD/$1.log" 2>/dev/null || true; }
grew() { [ "$(count_in "$1" "$2")" -gt "$3" ]; }

echo "== namespace $NS, link $HOST_IP <-> $NS_IP"
ip link add "$HOST_IF" type veth peer name "$NS_IF" || fail "cannot create a veth pair"
ip link set "$NS_IF" netns "$NS"
ip addr add "$HOST_IP/30" dev "$HOST_IF"
ip link set "$HOST_IF" up
ip netns exec "$NS" ip addr add "$NS_IP/30" dev "$NS_IF"
ip netns exec "$NS" ip link set "$NS_IF" up
ip netns exec "$NS" ip link set lo up

EAST_PORT=$(free_port)
WEST_PORT=$(free_port)
ROUTER_PORT=$(free_port)
cat >"$TMPD/topology" <<EOF
project = p
instance = i

[cluster east]
zone = zone-a
node = $NS_IP:$EAST_PORT $TMPD/east-0

[cluster west]
zone = zone-b
node = $HOST_IP:$WEST_PORT $TMPD/west-0

[router]
listen = 127.0.0.1:$ROUTER_PORT
EOF

echo "== nodes and router"
ip netns exec "$NS" "$NODE_BIN" --data "$TMPD/east-0" --listen "$NS_IP:$EAST_PORT" --node-num 1 \
  --cluster-num 1 --config "$TMPD/topology" >"$TMPD/east-0.log" 2>&1 &
PROCS+=("$!")
"$NODE_BIN" --data "$TMPD/west-0" --listen "$HOST_IP:$WEST_PORT" --node-num 2 --cluster-num 2 \
  --config "$TMPD/topology" >"$TMPD/west-0.log" 2>&1 &
PROCS+=("$!")
wait_for "east-0 to listen" log_has east-0 "listening"
wait_for "west-0 to listen" log_has west-0 "listening"
"$ROUTER_BIN" --config "$TMPD/topology" --no-unix >"$TMPD/router.log" 2>&1 &
PROCS+=("$!")
wait_for "the router to listen" log_has router "listening"

export BIGTABLE_EMULATOR_HOST=127.0.0.1:$ROUTER_PORT
cbtq() { timeout 60 "$CBT" -project p -instance i "$@" >/dev/null 2>&1; }
cbtq createtable pt || fail "cbt createtable"
cbtq createfamily pt cf || fail "cbt createfamily"
cbtq createappprofile i any "multi-cluster" route-any || fail "cbt createappprofile"
cbtq createappprofile i oneast "east only" route-to=east || fail "cbt createappprofile oneast"
on_east() { timeout 30 "$CBT" -project p -instance i lookup pt "$1" app-profile=oneast 2>/dev/null |
  grep -q "^$1"; }

echo "== the driver writes and reads through 'any'"
"$DRIVER" "127.0.0.1:$ROUTER_PORT" pt any "$TMPD/stop" "$TMPD/keys" >"$TMPD/driver.out" 2>&1 &
DRIVER_PID=$!
wait_for "200 writes" keys_at_least 200

echo "== east's link drops every packet silently"
DOWNS=$(count_in router "cluster=east health=down")
UPS=$(count_in router "cluster=east health=up")
ip netns exec "$NS" ip link set "$NS_IF" down
wait_for "the router to take east out" grew router "cluster=east health=down" "$DOWNS"
AT=$(keys_written)
wait_for "300 writes through west" keys_at_least $((AT + 300))
DURING=$(sed -n "$((AT + 200))p" "$TMPD/keys") # written to west while east was cut off
sleep 5 # long enough for connections to east to be found silent and redials to time out
echo "== heal"
ip netns exec "$NS" ip link set "$NS_IF" up
HEAL_MS=$(date +%s%3N)
wait_for "the router to take east back" grew router "cluster=east health=up" "$UPS"
echo "figure: east marked up $(($(date +%s%3N) - HEAL_MS)) ms after the heal"
wait_for "$DURING to replicate from west to east" on_east "$DURING"
echo "figure: $DURING (written to west during the cut) on east $(($(date +%s%3N) - HEAL_MS)) ms after the heal"
BACK=$(keys_written)
wait_for "200 writes after the heal" keys_at_least $((BACK + 200))

touch "$TMPD/stop"
wait "$DRIVER_PID"
DRIVER_PID=
SUMMARY=$(tail -n 1 "$TMPD/driver.out")
echo "$SUMMARY"
echo "figure: longest client pause $(echo "$SUMMARY" | grep -Eo 'longest_gap_ms=[0-9]+' | cut -d= -f2) ms"
grep -E "keepalive|client connection failed| silent" "$TMPD/router.log" | head -n 3
grep -q "node=$NS_IP:$EAST_PORT silent" "$TMPD/router.log" ||
  fail "the router never found east's link silent (calls open, nothing received)"
echo "$SUMMARY" | grep -q "writes_failed=0 " || fail "the client saw failed writes: $SUMMARY"
echo "$SUMMARY" | grep -q "reads_failed=0 " || fail "the client saw failed reads: $SUMMARY"
echo "ok: no request failed through a silent partition of east"
echo "PASS"
