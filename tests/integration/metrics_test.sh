#!/usr/bin/env bash
# metrics_test.sh — Prometheus metrics of real processes (docs/metrics.md): a standalone
# strata-node started with --metrics 127.0.0.1:0 prints its metrics address, serves GET /metrics
# (text format 0.0.4) with RPC counters by method and code after a few cbt calls, latency
# histograms, storage gauges, tablets, the hottest tablet and process metrics, and answers 404
# elsewhere; then a member node behind strata-router, both with --metrics, where the router's
# page shows its own RPC counters, cluster health and tablet-map refreshes.
# Fetches with python3's urllib (no curl needed). Skips (77) without cbt or python3.
# Usage: metrics_test.sh PATH/TO/strata-node [PATH/TO/strata-router]
set -u
. "$(dirname "$0")/lib.sh"
NODE_BIN=$1
ROUTER_BIN=${2:-}
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }

fail=0
check() { # WHAT CONDITION...
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fail=1; fi
}
# fetch URL OUT: the body into OUT; prints the HTTP status and the content type.
fetch() {
  python3 - "$1" "$2" <<'PY'
import sys, urllib.request, urllib.error
try:
    with urllib.request.urlopen(sys.argv[1], timeout=30) as r:
        open(sys.argv[2], "wb").write(r.read())
        print(r.status, r.headers.get("Content-Type"))
except urllib.error.HTTPError as e:
    open(sys.argv[2], "wb").write(e.read())
    print(e.code, e.headers.get("Content-Type"))
PY
}
# value FILE SERIES: the value of the sample whose name and labels are exactly SERIES.
value() { awk -v s="$2" '$1 == s { print $2; exit }' "$1"; }
ge() { [ -n "$1" ] && awk -v a="$1" -v b="$2" 'BEGIN{exit !(a+0 >= b+0)}'; }
has() { grep -q -- "$2" "$1"; }

BT='service="google.bigtable.v2.Bigtable"'
dir=$(make_tmp)

# ---- a standalone node ----
"$NODE_BIN" --data "$dir/n0" --listen 127.0.0.1:0 --metrics 127.0.0.1:0 >"$dir/n0.log" 2>&1 &
PIDS+=("$!")
line=$(wait_line "$dir/n0.log" 'listening on .*') || exit 1
ADDR=$(echo "$line" | grep -Eo 'on 127\.0\.0\.1:[0-9]+' | grep -Eo '127.*')
MURL=$(echo "$line" | grep -Eo 'metrics=http://[^ ]+' | sed 's/^metrics=//')
check "startup line names the metrics address" [ -n "$MURL" ]

cbtr "$ADDR" createtable t families=cf >/dev/null || { echo "FAIL: createtable"; fail=1; }
for k in a b c; do cbtr "$ADDR" set t "$k" cf:q=v >/dev/null || fail=1; done
cbtr "$ADDR" read t >/dev/null || fail=1
cbtr "$ADDR" read nosuchtable >/dev/null 2>&1

status=$(fetch "$MURL" "$dir/page")
check "GET /metrics is 200 text/plain version=0.0.4" \
  grep -q '^200 text/plain; version=0.0.4' <<<"$status"
check "MutateRow OK counted (3 sets)" \
  ge "$(value "$dir/page" "strata_rpc_server_handled_total{$BT,method=\"MutateRow\",code=\"OK\"}")" 3
check "ReadRows OK counted" \
  ge "$(value "$dir/page" "strata_rpc_server_handled_total{$BT,method=\"ReadRows\",code=\"OK\"}")" 1
check "ReadRows NOT_FOUND counted (unknown table)" \
  ge "$(value "$dir/page" "strata_rpc_server_handled_total{$BT,method=\"ReadRows\",code=\"NOT_FOUND\"}")" 1
check "MutateRow latency histogram ends with +Inf = count" [ \
  "$(value "$dir/page" "strata_rpc_server_handling_seconds_bucket{$BT,method=\"MutateRow\",le=\"+Inf\"}")" = \
  "$(value "$dir/page" "strata_rpc_server_handling_seconds_count{$BT,method=\"MutateRow\"}")" ]
for g in strata_storage_memtable_bytes strata_storage_block_cache_bytes \
         strata_storage_block_cache_hits_total strata_storage_sstables strata_storage_flushes_total \
         strata_storage_compactions_total strata_storage_write_stall_seconds_total \
         strata_storage_log_bytes strata_node_tablets process_cpu_seconds_total \
         process_resident_memory_bytes; do
  check "gauge $g present" has "$dir/page" "^$g "
done
check "one tablet" [ "$(value "$dir/page" strata_node_tablets)" = 1 ]
check "memtable holds the writes" ge "$(value "$dir/page" strata_storage_memtable_bytes)" 1
check "TYPE lines" has "$dir/page" '^# TYPE strata_rpc_server_handling_seconds histogram$'
status=$(fetch "${MURL%/metrics}/nope" "$dir/nope")
check "other paths are 404" grep -q '^404' <<<"$status"

# ---- a member node behind strata-router ----
if [ -n "$ROUTER_BIN" ]; then
  "$NODE_BIN" --data "$dir/m1" --listen 127.0.0.1:0 --node-num 1 --metrics 127.0.0.1:0 \
    >"$dir/m1.log" 2>&1 &
  PIDS+=("$!")
  line=$(wait_line "$dir/m1.log" 'listening on .*') || exit 1
  A1=$(echo "$line" | grep -Eo 'on 127\.0\.0\.1:[0-9]+' | grep -Eo '127.*')
  NURL=$(echo "$line" | grep -Eo 'metrics=http://[^ ]+' | sed 's/^metrics=//')
  cat >"$dir/topology" <<TOPO
project = p
instance = i
[cluster east]
zone = zone-a
node = $A1 $dir/m1
TOPO
  "$ROUTER_BIN" --config "$dir/topology" --listen 127.0.0.1:0 --metrics 127.0.0.1:0 \
    >"$dir/r.log" 2>&1 &
  PIDS+=("$!")
  line=$(wait_line "$dir/r.log" 'listening on .*') || exit 1
  R=$(echo "$line" | grep -Eo 'on 127\.0\.0\.1:[0-9]+' | grep -Eo '127.*')
  RURL=$(echo "$line" | grep -Eo 'metrics=http://[^ ]+' | sed 's/^metrics=//')
  check "router startup line names the metrics address" [ -n "$RURL" ]
  cbtr "$R" createtable rt families=cf >/dev/null || { echo "FAIL: createtable via router"; fail=1; }
  cbtr "$R" set rt k cf:q=v >/dev/null || fail=1
  cbtr "$R" read rt >/dev/null || fail=1
  status=$(fetch "$RURL" "$dir/rpage")
  check "router GET /metrics is 200" grep -q '^200 text/plain; version=0.0.4' <<<"$status"
  check "router MutateRow OK" \
    ge "$(value "$dir/rpage" "strata_rpc_server_handled_total{$BT,method=\"MutateRow\",code=\"OK\"}")" 1
  check "router ReadRows OK" \
    ge "$(value "$dir/rpage" "strata_rpc_server_handled_total{$BT,method=\"ReadRows\",code=\"OK\"}")" 1
  check "cluster east up" [ "$(value "$dir/rpage" 'strata_router_cluster_up{cluster="east"}')" = 1 ]
  check "tablet-map refreshes counted" \
    ge "$(value "$dir/rpage" 'strata_router_tablet_map_refreshes_total{cluster="east"}')" 1
  for g in strata_router_retries_total strata_router_failovers_total strata_router_node_up \
           process_cpu_seconds_total process_resident_memory_bytes; do
    check "router gauge $g present" has "$dir/rpage" "^$g[ {]"
  done
  status=$(fetch "$NURL" "$dir/npage")
  check "member node counts the router's MutateRow" \
    ge "$(value "$dir/npage" "strata_rpc_server_handled_total{$BT,method=\"MutateRow\",code=\"OK\"}")" 1
  check "member node counts ListTablets" \
    ge "$(value "$dir/npage" 'strata_rpc_server_handled_total{service="strata.internal.v1.Node",method="ListTablets",code="OK"}')" 1
fi

if [ "$fail" = 0 ]; then echo "metrics_test: PASS"; else echo "metrics_test: FAIL"; fi
exit "$fail"
