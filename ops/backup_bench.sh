#!/usr/bin/env bash
# ops/backup_bench.sh — measures `strata backup` on this machine (docs/backups.md, "Speed"):
# two local instances (`strata up`, one cluster of one node each); a table of SIZE_MB written
# into A with `strata bench --workload bulkwrite` (64 KiB values); then, once each:
#   - backup create --wait on A (after a first backup flushed the memtable), and the extra disk
#     it costs (du of A's node before and after: hard links cost no data blocks);
#   - export to a directory, against `cp -a` and `cp -r` (then `sync`) of the exported files in the
#     same run (the export hard-links files that pieces share; cp -a keeps those links, cp -r
#     copies each);
#   - the disk's sequential write bandwidth: dd if=/dev/zero bs=1M count=1024 conv=fsync;
#   - import into B, and restore on B, against that bandwidth;
#   - the CPU seconds (user + system) of the CLI and of the node for the export and each import,
#     per GiB of distinct bytes: a figure that load on the machine moves much less than the times.
# BENCH_IMPORTS=N (default 1) imports the export N times (as b1, b1-2, ... b1-N) and reports each
# run and the best; the restore uses b1.
# Prints one human line per figure and a final `backup-bench key=value ...` line. Not a test:
# run it by hand on a quiet machine.
# Usage: ops/backup_bench.sh [SIZE_MB (default 512)] [STRATA_BINARY]
set -eu
MB=${1:-512}
STRATA=${2:-$(cd "$(dirname "$0")/.." && pwd)/build/ops/strata}
[ -x "$STRATA" ] || { echo "no strata binary at $STRATA: build first, or pass it" >&2; exit 2; }
T=$(mktemp -d "${TMPDIR:-/tmp}/backup-bench.XXXXXX")
A=$T/a
B=$T/b
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PA=$(port)
PB=$(port)
cleanup() {
  "$STRATA" down --dir "$A" >/dev/null 2>&1 || true
  "$STRATA" down --dir "$B" >/dev/null 2>&1 || true
  rm -rf "$T"
}
trap cleanup EXIT
now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.3f}')"; }
rate() { python3 -c "print(f'{$1 / 1048576 / $2:.1f}')"; } # MiB/s of BYTES SECONDS
ratio() { python3 -c "print(f'{$1 / $2:.2f}')"; }
du_b() { du -sb "$1" | cut -f1; }
# CPU seconds (user + system) a process has used so far: /proc/PID/stat fields 14 and 15
cpu_of() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"; }
node_pid() { cat "$(ls "$1"/run/*-0.pid | head -n1)"; }
# runs a command (its output dropped) and prints the CPU seconds (user + system) it used
TIMEFORMAT='%U %S'
timed() { { time "$@" >/dev/null 2>"$T/cmd.err"; } 2>"$T/time.out" || { cat "$T/cmd.err" >&2; return 1; }; awk '{ print $1 + $2 }' "$T/time.out"; }
per_gib() { python3 -c "print(f'{$1 * 1073741824 / $2:.2f}')"; }

"$STRATA" up --dir "$A" --port "$PA" --clusters 1 --nodes 1 >/dev/null
"$STRATA" up --dir "$B" --port "$PB" --clusters 1 --nodes 1 >/dev/null
CL=$(sed -n 's/^\[cluster \([^]]*\)\]$/\1/p' "$A/topology" | head -n1)
NODE=$(ls -d "$A/$CL"-0)
KEYS=$((MB * 16))
echo "loading $MB MiB ($KEYS rows of 64 KiB) into table big of A..." >&2
# bulkwrite sends 100 rows per MutateRows call: KEYS / 100 calls write each key once
"$STRATA" bench --dir "$A" --project p --instance i --table big --workload bulkwrite \
  --dist sequential --keys "$KEYS" --requests $(((KEYS + 99) / 100)) --value-size 65536 \
  --no-lag --quiet \
  >"$T/load.out" 2>&1 || { cat "$T/load.out" >&2; exit 1; }
BK=("$STRATA" backup --dir "$A" --quiet)
"${BK[@]}" create big --id warm --wait >/dev/null # flushes the memtable: b1 then costs links only
sync
d0=$(du_b "$NODE")
t0=$(now)
"${BK[@]}" create big --id b1 --wait >/dev/null
t1=$(now)
sync
d1=$(du_b "$NODE")
create_s=$(secs "$t0" "$t1")
BYTES=$("${BK[@]}" describe b1 --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["size_bytes"])')
extra=$((d1 - d0))
echo "create: $create_s s for a backup of $BYTES bytes; extra disk $extra bytes ($(python3 -c "print(f'{100 * $extra / $BYTES:.4f}')")%)"

NA=$(node_pid "$A")
c0=$(cpu_of "$NA")
t0=$(now)
export_cli_cpu=$(timed "${BK[@]}" export b1 "$T/exp")
t1=$(now)
export_node_cpu=$(python3 -c "print(f'{$(cpu_of "$NA") - $c0:.2f}')")
export_s=$(secs "$t0" "$t1")
# format 2 holds each distinct file once under files/; format 1 (older strata) hard-linked the
# files pieces share under pieces/: cp -a (links kept) copies the same distinct bytes, cp -r
# copies every link as a file of its own
SUB=files
[ -d "$T/exp/files" ] || SUB=pieces
DISTINCT=$(du -sb "$T/exp/$SUB" | cut -f1)
t0=$(now)
cp -a "$T/exp/$SUB" "$T/cpa"
sync
t1=$(now)
rm -rf "$T/cpa"
sync
t2=$(now)
cp -r "$T/exp/$SUB" "$T/cp"
sync
t3=$(now)
rm -rf "$T/cp"
cpa_s=$(secs "$t0" "$t1")
cp_s=$(secs "$t2" "$t3")
echo "export: $export_s s for $DISTINCT distinct bytes ($(rate "$DISTINCT" "$export_s") MiB/s, every file fsync'd); cp -a + sync: $cpa_s s ($(rate "$DISTINCT" "$cpa_s") MiB/s); cp -r + sync: $cp_s s ($(rate "$(du -sb --apparent-size "$T/exp/$SUB" -l | cut -f1)" "$cp_s") MiB/s)"
echo "export CPU: CLI $export_cli_cpu s, node $export_node_cpu s ($(per_gib "$export_cli_cpu" "$DISTINCT") and $(per_gib "$export_node_cpu" "$DISTINCT") s per GiB distinct)"

t0=$(now)
dd if=/dev/zero of="$T/dd" bs=1M count=1024 conv=fsync status=none
t1=$(now)
rm -f "$T/dd"
dd_s=$(secs "$t0" "$t1")
DD_BPS=$(python3 -c "print(1073741824 / $dd_s)")
echo "dd (1 GiB, bs=1M, conv=fsync): $dd_s s ($(rate 1073741824 "$dd_s") MiB/s)"

NB=$(node_pid "$B")
import_s=
for r in $(seq 1 "${BENCH_IMPORTS:-1}"); do
  as=()
  [ "$r" = 1 ] || as=(--as "b1-$r")
  c0=$(cpu_of "$NB")
  t0=$(now)
  cli_cpu=$(timed "$STRATA" backup --dir "$B" --quiet import "$T/exp" "${as[@]}")
  t1=$(now)
  node_cpu=$(python3 -c "print(f'{$(cpu_of "$NB") - $c0:.2f}')")
  s=$(secs "$t0" "$t1")
  echo "import run $r: $s s ($(rate "$DISTINCT" "$s") MiB/s of the distinct bytes, $(python3 -c "print(f'{$DISTINCT / $s / $DD_BPS:.2f}')") of dd); CPU: CLI $cli_cpu s, node $node_cpu s ($(per_gib "$cli_cpu" "$DISTINCT") and $(per_gib "$node_cpu" "$DISTINCT") s per GiB distinct)"
  if [ -z "$import_s" ] || python3 -c "import sys; sys.exit(0 if $s < $import_s else 1)"; then
    import_s=$s import_cli_cpu=$cli_cpu import_node_cpu=$node_cpu
  fi
done
t0=$(now)
"$STRATA" backup --dir "$B" --quiet restore b1 --to big2 --wait >/dev/null
t1=$(now)
restore_s=$(secs "$t0" "$t1")
import_ratio=$(python3 -c "print(f'{$BYTES / $import_s / $DD_BPS:.2f}')")
restore_ratio=$(python3 -c "print(f'{$BYTES / $restore_s / $DD_BPS:.2f}')")
import_distinct_ratio=$(python3 -c "print(f'{$DISTINCT / $import_s / $DD_BPS:.2f}')")
echo "import (best of ${BENCH_IMPORTS:-1}): $import_s s ($(rate "$BYTES" "$import_s") MiB/s of the pieces' $BYTES bytes, $import_ratio of dd; $(rate "$DISTINCT" "$import_s") MiB/s of the $DISTINCT distinct bytes, $import_distinct_ratio of dd)"
echo "restore: $restore_s s ($(rate "$BYTES" "$restore_s") MiB/s, $restore_ratio of dd)"
echo "backup-bench size_bytes=$BYTES create_s=$create_s extra_disk_bytes=$extra" \
  "distinct_bytes=$DISTINCT export_s=$export_s cp_a_sync_s=$cpa_s cp_r_sync_s=$cp_s" \
  "export_vs_cp_a=$(ratio "$cpa_s" "$export_s") export_vs_cp_r=$(ratio "$cp_s" "$export_s")" \
  "dd_s=$dd_s import_s=$import_s" \
  "import_vs_dd=$import_ratio import_distinct_vs_dd=$import_distinct_ratio" \
  "restore_s=$restore_s restore_vs_dd=$restore_ratio" \
  "export_cpu_cli_s=$export_cli_cpu export_cpu_node_s=$export_node_cpu" \
  "import_cpu_cli_s_per_gib=$(per_gib "$import_cli_cpu" "$DISTINCT")" \
  "import_cpu_node_s_per_gib=$(per_gib "$import_node_cpu" "$DISTINCT") load=$(cut -d' ' -f1-3 /proc/loadavg | tr ' ' /)"
