#!/usr/bin/env bash
# up_test.sh — proves `strata up / status / down` manage a whole local instance: up starts 2
# clusters x 2 nodes and a router in a private directory on a free port, status reports every
# node and the router healthy, the official cbt CLI creates a table, writes and reads a cell
# through the router, a second up changes nothing, an up of another directory on the running
# router's port is refused with advice that applies (not --port under --config) and leaves no
# directory, and down leaves no process behind.
# Usage: up_test.sh PATH/TO/strata [BIN_DIR]   (BIN_DIR: where strata-node and strata-router are;
# default: found by strata next to its build tree)
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
BIN_ARGS=()
if [ $# -ge 2 ] && [ -n "$2" ]; then BIN_ARGS=(--bin-dir "$2"); fi
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi

instance_init up_test
FAIL_TAIL_LINES=20

echo "== strata up --dir $DIR --port $PORT --clusters 2 --nodes 2"
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 2 "${BIN_ARGS[@]}" ||
  fail "strata up failed"
for name in east-0 east-1 west-0 west-1 router; do
  [ -s "$DIR/run/$name.pid" ] || fail "no pid file for $name"
done
grep -q "listen = 127.0.0.1:$PORT" "$DIR/topology" || fail "topology lacks the router on $PORT"

echo "== strata status"
STATUS=$("$STRATA" status --dir "$DIR") || { echo "$STATUS"; fail "strata status says unhealthy"; }
echo "$STATUS"
for name in east-0 east-1 west-0 west-1; do
  echo "$STATUS" | grep -Eq "^(east|west) +zone-[ab] +$name +127\.0\.0\.1:[0-9]+ +[0-9]+ +ok " ||
    fail "status does not show $name healthy"
done
echo "$STATUS" | grep -Eq "^router +127\.0\.0\.1:$PORT +[0-9]+ +ok" || fail "router not healthy"
echo "$STATUS" | grep -q "4 of 4 nodes healthy, 1 of 1 routers healthy" || fail "summary line"

echo "== status counts a hard-linked file once (backups and split children share SSTables)"
data_kib() { # DATA of node $1 in KiB
  "$STRATA" status --dir "$DIR" | awk -v n="$1" '$3 == n { for (i = 2; i <= NF; i++) if ($i ~ /^(B|KiB|MiB|GiB)$/) {
    u = $i; f = (u == "KiB") ? 1 : (u == "MiB") ? 1024 : (u == "GiB") ? 1048576 : 1/1024
    printf "%d\n", $(i-1) * f; exit } }'
}
data_mib() { # DATA of node $1 in MiB
  local k
  k=$(data_kib "$1") && [ -n "$k" ] && echo $((k / 1024))
}
BEFORE=$(data_mib east-0)
head -c $((16 << 20)) /dev/urandom >"$DIR/east-0/linked.test"
for i in 1 2 3 4 5 6 7; do ln "$DIR/east-0/linked.test" "$DIR/east-0/linked.test.$i"; done
AFTER=$(data_mib east-0)
rm -f "$DIR"/east-0/linked.test*
[ -n "$BEFORE" ] && [ "$AFTER" -ge $((BEFORE + 15)) ] && [ "$AFTER" -le $((BEFORE + 24)) ] ||
  fail "DATA of east-0 went from $BEFORE to $AFTER MiB with 16 MiB linked 8 times"

echo "== cbt through the router"
export BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT
C=("$CBT" -project p -instance i)
"${C[@]}" createtable upt || fail "cbt createtable"
"${C[@]}" createfamily upt cf || fail "cbt createfamily"
"${C[@]}" set upt row1 cf:col=hello || fail "cbt set"
OUT=$("${C[@]}" read upt) || fail "cbt read"
echo "$OUT"
echo "$OUT" | grep -q '^row1' || fail "read lacks row1"
echo "$OUT" | grep -q '"hello"' || fail "read lacks the value"
"${C[@]}" ls | grep -qx upt || fail "ls lacks the table"

echo "== strata up again changes nothing"
PIDS_BEFORE=$(cat "$DIR"/run/*.pid | sort)
AGAIN=$("$STRATA" up --dir "$DIR" --port "$PORT" "${BIN_ARGS[@]}") || fail "second up failed"
echo "$AGAIN" | grep -q "Already running" || fail "second up did not say it is running"
[ "$(cat "$DIR"/run/*.pid | sort)" = "$PIDS_BEFORE" ] || fail "second up changed the processes"
if echo "$AGAIN" | grep -q "are ignored"; then fail "second up on the same port said flags are ignored"; fi
# another port or shape for a running instance is said to be ignored, not silently dropped
AGAIN=$("$STRATA" up --dir "$DIR" --port $((PORT + 1)) --nodes 2 "${BIN_ARGS[@]}") ||
  fail "up with other flags failed"
echo "$AGAIN" | grep -q -- "--port, --clusters, --nodes and --split-bytes are ignored" ||
  fail "up with another port did not say it is ignored: $AGAIN"
[ "$(cat "$DIR"/run/*.pid | sort)" = "$PIDS_BEFORE" ] || fail "up with other flags changed the processes"

echo "== another --dir on the running router's port is refused and leaves no directory"
NEW=$DIR.new
"$STRATA" up --dir "$NEW" --port "$PORT" --clusters 1 --nodes 1 "${BIN_ARGS[@]}" >"$NEW.out" 2>&1 &&
  fail "up on a taken router port started: $(cat "$NEW.out")"
grep -q -- "already in use.*--port PORT" "$NEW.out" || fail "no --port advice: $(cat "$NEW.out")"
[ ! -e "$NEW" ] || fail "the refused up left $NEW: $(ls -A "$NEW")"
# under --config the file names the router, so --port is no advice
printf 'project = p\ninstance = i\n[cluster east]\nzone = zone-a\nnode = 127.0.0.1:%s\n[router]\nlisten = 127.0.0.1:%s\n' \
  "$(free_port)" "$PORT" >"$NEW.cfg"
"$STRATA" up --dir "$NEW" --config "$NEW.cfg" "${BIN_ARGS[@]}" >"$NEW.out" 2>&1 &&
  fail "up --config on a taken router port started: $(cat "$NEW.out")"
grep -q "router address 127.0.0.1:$PORT (from $NEW.cfg) is already in use.*change the file" "$NEW.out" ||
  fail "under --config: $(cat "$NEW.out")"
grep -q -- "--port" "$NEW.out" && fail "under --config the advice names --port: $(cat "$NEW.out")"
[ ! -e "$NEW" ] || fail "the refused up --config left $NEW: $(ls -A "$NEW")"
rm -f "$NEW.out" "$NEW.cfg"

echo "== an empty --dir is refused, never taken as the default instance"
if STRATA_HOME="$DIR" "$STRATA" down --dir "" --purge >"$DIR.empty.out" 2>&1; then
  fail "down --dir '' --purge ran: $(cat "$DIR.empty.out")"
fi
grep -q -- "--dir is empty" "$DIR.empty.out" || fail "down --dir '' said: $(cat "$DIR.empty.out")"
[ "$(cat "$DIR"/run/*.pid | sort)" = "$PIDS_BEFORE" ] || fail "down --dir '' touched the instance"
rm -f "$DIR.empty.out"

echo "== strata down"
"$STRATA" down --dir "$DIR" || fail "strata down failed"
for p in $PIDS_BEFORE; do
  if kill -0 "$p" 2>/dev/null && ! grep -q '^Z' <(awk '{print $3}' "/proc/$p/stat" 2>/dev/null); then
    fail "process $p still running after down"
  fi
done
[ -z "$(ls -A "$DIR/run")" ] || fail "pid files left: $(ls "$DIR/run")"
[ -d "$DIR/east-0" ] || fail "down removed data without --purge"
if "$STRATA" status --dir "$DIR" >/dev/null 2>&1; then fail "status says healthy after down"; fi

echo "== status follows a data directory that is a symbolic link (a node on a disk of its own)"
STOPPED=$(data_kib east-0)
mv "$DIR/east-0" "$DIR/east-0.disk" && ln -s "$DIR/east-0.disk" "$DIR/east-0" || fail "symlink"
LINKED=$(data_kib east-0)
rm "$DIR/east-0" && mv "$DIR/east-0.disk" "$DIR/east-0" || fail "undo the symlink"
[ -n "$STOPPED" ] && [ "$STOPPED" -gt 0 ] && [ "$LINKED" = "$STOPPED" ] ||
  fail "DATA of east-0 through a symlink: $LINKED KiB, $STOPPED KiB without"

echo "== strata down --purge"
"$STRATA" down --dir "$DIR" --purge || fail "down --purge failed"
[ ! -e "$DIR/topology" ] && [ ! -e "$DIR/east-0" ] || fail "purge left instance files"
echo "PASS"
