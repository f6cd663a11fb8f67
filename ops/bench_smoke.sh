#!/usr/bin/env bash
# Smoke test for `strata bench`: a short verified run must exit 0 and print the key=value result
# line with result=ok. No speed is asserted.
#   bench_smoke.sh STRATA emulator          against the official emulator (77 = skipped if absent)
#   bench_smoke.sh STRATA node NODE_BIN     against a strata-node the bench starts (--node)
#   bench_smoke.sh STRATA up                an instance of two clusters the bench starts with
#                                           `strata up` (--up 2 --direct): through the router and
#                                           straight to the node, with the replication lag probe
set -u
strata=$1
mode=$2
emulator=${STRATA_EMULATOR:-/usr/lib/google-cloud-sdk/platform/bigtable-emulator/cbtemulator}
tmp=$(mktemp -d "${STRATA_TEST_TMP:-/tmp}/bench-smoke.XXXXXX")
emu_pid=
cleanup() {
  if [ -n "$emu_pid" ]; then kill "$emu_pid" 2>/dev/null; wait "$emu_pid" 2>/dev/null; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

args=(--workload write,read,scan --requests 500 --conns 2 --streams 4 --keys 2000 --quiet)
case $mode in
  emulator)
    if [ ! -x "$emulator" ]; then echo "skip: no emulator at $emulator"; exit 77; fi
    "$emulator" -host 127.0.0.1 -port 0 >"$tmp/emu.log" 2>&1 &
    emu_pid=$!
    addr=
    for _ in $(seq 1 300); do
      addr=$(grep -Eo '127\.0\.0\.1:[0-9]+' "$tmp/emu.log" | head -n1)
      [ -n "$addr" ] && break
      sleep 0.1
    done
    if [ -z "$addr" ]; then echo "emulator did not start:"; cat "$tmp/emu.log"; exit 1; fi
    target=(--target "$addr")
    ;;
  node)
    node_bin=$3
    if [ ! -x "$node_bin" ]; then echo "skip: no strata-node at $node_bin"; exit 77; fi
    target=(--node --node-bin "$node_bin")
    ;;
  up)
    target=(--up 2 --direct --lag-interval-ms 1)
    ;;
  *) echo "usage: $0 STRATA emulator|node|up [NODE_BIN]"; exit 2 ;;
esac

TMPDIR=$tmp "$strata" bench "${target[@]}" "${args[@]}" >"$tmp/out" 2>"$tmp/err"
rc=$?
cat "$tmp/out"
if [ $rc -ne 0 ]; then
  echo "strata bench exited $rc; stderr:"; cat "$tmp/err"; exit 1
fi
line=$(grep '^strata-bench ' "$tmp/out")
for want in result=ok errors=0 write. read. scan. load.; do
  case $line in
    *"$want"*) ;;
    *) echo "key=value line lacks '$want': $line"; exit 1 ;;
  esac
done
for wl in write read scan; do
  calls=$(echo "$line" | grep -Eo "$wl\.[a-z]+\.calls=[0-9]+" | head -n1 | cut -d= -f2)
  if [ "${calls:-0}" -ne 500 ]; then echo "$wl: expected 500 verified calls, got '${calls:-}'"; exit 1; fi
done
if [ "$mode" = up ]; then
  for want in write.strata.proc.router.rss_peak_mb= write.strata.proc.east-0.rss_peak_mb= \
              write.strata.proc.west-0.cpu_s= write.strata.lag.samples= write.strata.lag.lost=0 \
              write.node.calls=500 read.router_overhead.ops_s=; do
    case $line in
      *"$want"*) ;;
      *) echo "key=value line lacks '$want': $line"; exit 1 ;;
    esac
  done
fi
echo "ok"
