#!/usr/bin/env bash
# table_churn_test.sh — a long-lived instance must not grow with churn: on `strata up` (2 clusters
# x 1 node + router), cycles of create table (2 families, 2 splits, change streams on) / write 100
# rows / read them / read the change stream / delete table, and of an app profile created,
# updated and deleted (hostile/table_churn.py), leave every process with the open files and
# threads it had after the first cycles, its anonymous memory growing by less than
# CHURN_KB_PER_CYCLE (20 KiB) per cycle (a dropped tablet used to keep its memtable and GC rules
# until the node stopped: ~98 KiB per cycle of 3 tablets), the data directories without files of
# the deleted tables, and the logs without warnings that come back every cycle.
# Usage: table_churn_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
export STRATA
HOSTILE=$(cd "$(dirname "$0")" && pwd)/hostile
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
WARM=${CHURN_WARM:-10}
CYCLES=${CHURN_CYCLES:-60}
KB_PER_CYCLE=${CHURN_KB_PER_CYCLE:-20}
CHECK_MEMORY=1
NODE_BIN=$(dirname "$STRATA")/../node/strata-node
if grep -aq __asan_init "$NODE_BIN"; then # freed memory waits in its quarantine, counted in RSS
  echo "AddressSanitizer build: memory growth is not checked (leaks are its own report)"
  CHECK_MEMORY=0
fi

instance_init table_churn
FAIL_TAIL_LINES=10
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
NAMES=(east-0 west-0 router)

# sample: prints "name fds threads rss_anon_kb" per process. The router's links and the clients'
# connections come and go, so fds are taken at their lowest over a few looks, a second apart.
sample() {
  local name pid fds min th rss i
  for name in "${NAMES[@]}"; do
    pid=$(cat "$DIR/run/$name.pid")
    min=1000000
    for i in 1 2 3; do
      fds=$(ls "/proc/$pid/fd" | wc -l)
      [ "$fds" -lt "$min" ] && min=$fds
      [ "$i" -lt 3 ] && sleep 0.5
    done
    th=$(awk '/^Threads:/{print $2}' "/proc/$pid/status")
    rss=$(awk '/^RssAnon:/{print $2}' "/proc/$pid/status")
    echo "$name $min $th $rss"
  done
}

warnings() { cat "$DIR"/logs/*.log | grep -Ec 'level=(warn|error)'; }

churn() {
  python3 "$HOSTILE/table_churn.py" "$PORT" "$DIR" "$1" "$2" 1 || fail "churn cycles $1..$2"
}

echo "== $WARM warm-up cycles (the change ring, caches and pools take their size)"
churn 1 "$WARM"
sleep 1
BASE=$(sample)
WBASE=$(warnings)
echo "$BASE"
echo "== $CYCLES more cycles"
churn $((WARM + 1)) $((WARM + CYCLES))
sleep 1
AFTER=$(sample)
WAFTER=$(warnings)
echo "$AFTER"

while read -r name fds th rss; do
  read -r _ fds2 th2 rss2 < <(echo "$AFTER" | grep "^$name ")
  echo "$name: fds $fds -> $fds2, threads $th -> $th2, anon memory $rss -> $rss2 KiB" \
    "($(((rss2 - rss) / CYCLES)) KiB per cycle)"
  [ "$fds2" -le "$fds" ] || fail "$name: open files grew from $fds to $fds2 over $CYCLES cycles"
  [ "$th2" -le "$th" ] || fail "$name: threads grew from $th to $th2 over $CYCLES cycles"
  [ "$CHECK_MEMORY" = 0 ] || [ $((rss2 - rss)) -lt $((KB_PER_CYCLE * CYCLES)) ] ||
    fail "$name: anonymous memory grew $((rss2 - rss)) KiB over $CYCLES cycles (bound $KB_PER_CYCLE per cycle)"
done <<<"$BASE"

echo "== no files of deleted tables"
for n in east-0 west-0; do
  SSTS=$(find "$DIR/$n/storage/sst" -type f | wc -l)
  SEGS=$(find "$DIR/$n/storage/log" -type f | wc -l)
  echo "$n: $SSTS SSTables, $SEGS log segments, $(du -sk "$DIR/$n" | cut -f1) KiB"
  [ "$SSTS" -eq 0 ] || fail "$n keeps $SSTS SSTables with no table left"
  [ "$SEGS" -le 2 ] || fail "$n keeps $SEGS log segments with no table left"
done
LS=$(cbtr "127.0.0.1:$PORT" ls) || fail "cbt ls: $LS"
[ -z "$LS" ] || fail "ListTables still lists: $LS"

echo "== warnings: $WBASE after the warm-up, $WAFTER after"
[ "$WAFTER" -le "$WBASE" ] || {
  cat "$DIR"/logs/*.log | grep -E 'level=(warn|error)' | tail -5
  fail "the logs gained $((WAFTER - WBASE)) warnings over $CYCLES clean cycles"
}
echo "PASS"
