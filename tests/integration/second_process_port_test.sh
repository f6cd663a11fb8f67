#!/usr/bin/env bash
# second_process_port_test.sh — a second strata-router or strata-node started on a port another
# process holds must fail before it does anything: the router used to connect to the nodes of
# its topology and load the instance metadata (writing the default app profile where it was
# missing) before it found its port taken; the node used to create, lock and recover its data
# directory first. Each now claims its port first and exits 1 naming the bind failure, with no
# connection to its nodes and no directory created. Skips (77) without python3.
# Usage: second_process_port_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
BIN=$(dirname "$STRATA")/..
command -v python3 >/dev/null || { echo "python3 missing: skipped"; exit 77; }
TMPD=$(make_tmp)
DIR=$TMPD # fail() shows the logs under $DIR

# One listener stands for the taken port, another for a node of the topology; both are bound
# before their one line "ports TAKEN NODE ready" is printed (a line read half-written has no
# "ready"), and each then counts the connections it accepts.
python3 -c '
import socket, sys, threading, time
socks = []
for _ in range(2):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(64); socks.append(s)
def hold(s, name):
    while True:
        c, _ = s.accept(); print(name, "accepted", flush=True); c.close()
print("ports %d %d ready" % (socks[0].getsockname()[1], socks[1].getsockname()[1]), flush=True)
for s, n in zip(socks, ("taken", "node")):
    threading.Thread(target=hold, args=(s, n), daemon=True).start()
time.sleep(600)' >"$TMPD/holder.out" 2>&1 &
PIDS+=($!)
PORTS=$(wait_line "$TMPD/holder.out" '^ports [0-9]+ [0-9]+ ready$') || fail "the port holders did not start"
read -r _ TAKEN NODEP _ <<<"$PORTS"
[ -n "$TAKEN" ] && [ -n "$NODEP" ] || fail "the port holders did not start"

cat >"$TMPD/topology" <<TOPO
project = p
instance = i
[cluster east]
zone = zone-a
node = 127.0.0.1:$NODEP $TMPD/east-0
[router]
listen = 127.0.0.1:$TAKEN
TOPO

echo "== a router on a taken port"
timeout 60 "$BIN/router/strata-router" --config "$TMPD/topology" >"$TMPD/router.out" 2>&1
rc=$?
[ $rc -eq 1 ] || { cat "$TMPD/router.out"; fail "strata-router exited $rc, want 1"; }
grep -q "in use" "$TMPD/router.out" || { cat "$TMPD/router.out"; fail "no bind failure named"; }
! grep -q "node accepted" "$TMPD/holder.out" || fail "the router connected to a node before failing"

echo "== a node on a taken port"
timeout 60 "$BIN/node/strata-node" --data "$TMPD/new-node" --listen "127.0.0.1:$TAKEN" \
  >"$TMPD/node.out" 2>&1
rc=$?
[ $rc -eq 1 ] || { cat "$TMPD/node.out"; fail "strata-node exited $rc, want 1"; }
grep -q "in use" "$TMPD/node.out" || { cat "$TMPD/node.out"; fail "no bind failure named"; }
[ ! -e "$TMPD/new-node" ] || fail "the node created its data directory before failing"
echo "PASS"
