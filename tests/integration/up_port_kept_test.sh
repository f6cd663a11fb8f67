#!/usr/bin/env bash
# up_port_kept_test.sh — `strata down` then `strata up --dir DIR` without --port starts the router
# on the port the instance had (it moved to 8086, so clients and `--port`-less scripts of the
# instance lost it, and an instance already on 8086 made the start fail); `--port` still moves
# it. One cluster of one node. Skips (77) without python3.
# Usage: up_port_kept_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
command -v python3 >/dev/null || { echo "python3 missing: skipped"; exit 77; }
up_single up_port_kept
cs_py create t 0 || fail "creating table t"
router_addr() { sed -n '/^\[router\]/,$s/^listen = //p' "$DIR/topology"; }

echo "== down, then up without --port"
"$STRATA" down --dir "$DIR" >/dev/null 2>&1 || fail "strata down"
"$STRATA" up --dir "$DIR" >"$TMPD/up2.out" 2>&1 || { cat "$TMPD/up2.out"; fail "strata up again"; }
[ "$(router_addr)" = "127.0.0.1:$PORT" ] || fail "the router moved to $(router_addr), not 127.0.0.1:$PORT"
[ "$(cs_py exists t)" = 1 ] || fail "table t is not served on port $PORT after the restart"

echo "== down, then up --port NEW"
"$STRATA" down --dir "$DIR" >/dev/null 2>&1 || fail "strata down"
PORT=$(free_port)
"$STRATA" up --dir "$DIR" --port "$PORT" >"$TMPD/up3.out" 2>&1 || { cat "$TMPD/up3.out"; fail "strata up --port"; }
[ "$(router_addr)" = "127.0.0.1:$PORT" ] || fail "--port $PORT left the router on $(router_addr)"
[ "$(cs_py exists t)" = 1 ] || fail "table t is not served on the new port $PORT"
echo "PASS"
