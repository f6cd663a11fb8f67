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
#   - import into B, and restore on B, against that bandwidth.
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

t0=$(now)
"${BK[@]}" export b1 "$T/exp" >/dev/null
t1=$(now)
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

t0=$(now)
dd if=/dev/zero of="$T/dd" bs=1M count=1024 conv=fsync status=none
t1=$(now)
rm -f "$T/dd"
dd_s=$(secs "$t0" "$t1")
DD_BPS=$(python3 -c "print(1073741824 / $dd_s)")
echo "dd (1 GiB, bs=1M, conv=fsync): $dd_s s ($(rate 1073741824 "$dd_s") MiB/s)"

t0=$(now)
"$STRATA" backup --dir "$B" --quiet import "$T/exp" >/dev/null
t1=$(now)
import_s=$(secs "$t0" "$t1")
t0=$(now)
"$STRATA" backup --dir "$B" --quiet restore b1 --to big2 --wait >/dev/null
t1=$(now)
restore_s=$(secs "$t0" "$t1")
import_ratio=$(python3 -c "print(f'{$BYTES / $import_s / $DD_BPS:.2f}')")
restore_ratio=$(python3 -c "print(f'{$BYTES / $restore_s / $DD_BPS:.2f}')")
import_distinct_ratio=$(python3 -c "print(f'{$DISTINCT / $import_s / $DD_BPS:.2f}')")
echo "import: $import_s s ($(rate "$BYTES" "$import_s") MiB/s of the pieces' $BYTES bytes, $import_ratio of dd; $(rate "$DISTINCT" "$import_s") MiB/s of the $DISTINCT distinct bytes, $import_distinct_ratio of dd)"
echo "restore: $restore_s s ($(rate "$BYTES" "$restore_s") MiB/s, $restore_ratio of dd)"
echo "backup-bench size_bytes=$BYTES create_s=$create_s extra_disk_bytes=$extra" \
  "distinct_bytes=$DISTINCT export_s=$export_s cp_a_sync_s=$cpa_s cp_r_sync_s=$cp_s" \
  "export_vs_cp_a=$(ratio "$cpa_s" "$export_s") export_vs_cp_r=$(ratio "$cp_s" "$export_s")" \
  "dd_s=$dd_s import_s=$import_s" \
  "import_vs_dd=$import_ratio import_distinct_vs_dd=$import_distinct_ratio" \
  "restore_s=$restore_s restore_vs_dd=$restore_ratio load=$(cut -d' ' -f1-3 /proc/loadavg | tr ' ' /)"
