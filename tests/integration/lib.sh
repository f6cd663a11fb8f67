# lib.sh — helpers for shell integration tests: start strata-node / the emulator on free loopback
# ports, wait for them, stop them at exit. Sourced by the *_test.sh scripts.
# Exit code 77 means "skipped" (CTest SKIP_RETURN_CODE).

EMULATOR=${STRATA_EMULATOR:-/usr/lib/google-cloud-sdk/platform/bigtable-emulator/cbtemulator}
CBT=${STRATA_CBT:-$(command -v cbt || true)}
PIDS=()
TMPDIRS=()

cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  for d in "${TMPDIRS[@]}"; do rm -rf "$d"; done
}
trap cleanup EXIT

# make_tmp: prints a fresh directory, removed at exit. Callers run it in $(...), a subshell that
# cannot add to TMPDIRS, so the directories go inside one root made (and registered) here.
mkdir -p "${STRATA_TEST_TMP:-/tmp}"
IT_TMP_ROOT=$(mktemp -d "${STRATA_TEST_TMP:-/tmp}/it.XXXXXX") || {
  echo "cannot make a directory in ${STRATA_TEST_TMP:-/tmp}: point STRATA_TEST_TMP at a writable one" >&2
  exit 1
}
TMPDIRS+=("$IT_TMP_ROOT")
make_tmp() {
  mktemp -d "$IT_TMP_ROOT/XXXXXX"
}

# wait_line FILE REGEX: waits (bounded) until FILE has a line matching REGEX; prints the match.
wait_line() {
  local file=$1 re=$2 i
  for i in $(seq 1 300); do
    if grep -Eo "$re" "$file" 2>/dev/null | head -n1 | grep -q .; then
      grep -Eo "$re" "$file" | head -n1
      return 0
    fi
    sleep 0.1
  done
  echo "timed out waiting for '$re' in $file:" >&2
  cat "$file" >&2
  return 1
}

# start_node BIN DATA_DIR -> sets NODE_PID and NODE_ADDR
start_node() {
  local bin=$1 data=$2 log
  log="$data.log"
  "$bin" --data "$data" --listen 127.0.0.1:0 >"$log" 2>&1 &
  NODE_PID=$!
  PIDS+=("$NODE_PID")
  NODE_ADDR=$(wait_line "$log" '127\.0\.0\.1:[0-9]+') || return 1
}

stop_node() {
  kill "$NODE_PID" 2>/dev/null
  wait "$NODE_PID" 2>/dev/null
  return 0
}

# free_port: prints a loopback TCP port that was free a moment ago.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# start_emulator -> sets EMU_ADDR (returns 1 if the emulator is not installed)
start_emulator() {
  [ -x "$EMULATOR" ] || return 1
  local port log
  log=$(make_tmp)/emu.log
  port=$(free_port)
  "$EMULATOR" -host 127.0.0.1 -port "$port" >"$log" 2>&1 &
  PIDS+=("$!")
  EMU_ADDR=$(wait_line "$log" '127\.0\.0\.1:[0-9]+') || return 1
}

# start_member DATA NUM [LISTEN [--unix]] -> sets NODE_PID and NODE_ADDR: a strata-node ($NODE_BIN)
# with --node-num NUM, so it can serve in a cluster behind strata-router; LISTEN defaults to a
# free loopback port; --unix also serves DATA/node.sock. The log (DATA.log) is appended to, so a
# restarted member keeps the log of its earlier run. Exits the test if the node never listens.
start_member() {
  local data=$1 num=$2 listen=${3:-127.0.0.1:0} sock=()
  [ "${4:-}" = "--unix" ] && sock=(--unix "$data/node.sock")
  "$NODE_BIN" --data "$data" --listen "$listen" --node-num "$num" "${sock[@]}" >>"$data.log" 2>&1 &
  NODE_PID=$!
  PIDS+=("$NODE_PID")
  NODE_ADDR=$(wait_line "$data.log" 'listening on 127\.0\.0\.1:[0-9]+' | grep -Eo '127\.0\.0\.1:[0-9]+') ||
    exit 1
}

# two_clusters DIR: one node per cluster (east: node 1, west: node 2) in DIR/east and DIR/west,
# and DIR/topology naming them (project p, instance i); sets EAST and WEST to their addresses,
# EAST_PID to the east node's pid.
two_clusters() {
  local dir=$1
  start_member "$dir/east" 1; EAST=$NODE_ADDR; EAST_PID=$NODE_PID
  start_member "$dir/west" 2; WEST=$NODE_ADDR
  cat >"$dir/topology" <<TOPO
project = p
instance = i
[cluster east]
zone = zone-a
node = $EAST $dir/east
[cluster west]
zone = zone-b
node = $WEST $dir/west
TOPO
}

# start_router TOPOLOGY LOG [ARGS...] -> sets ROUTER_PID and ROUTER_ADDR: a strata-router
# ($ROUTER_BIN) on a free loopback port, with the extra ARGS. Exits the test if it never listens.
start_router() {
  local topo=$1 log=$2
  shift 2
  "$ROUTER_BIN" --config "$topo" --listen 127.0.0.1:0 "$@" >"$log" 2>&1 &
  ROUTER_PID=$!
  PIDS+=("$ROUTER_PID")
  ROUTER_ADDR=$(wait_line "$log" 'listening on 127\.0\.0\.1:[0-9]+' | grep -Eo '127\.0\.0\.1:[0-9]+') || exit 1
}

# cbtr ADDR ARGS...: the cbt CLI against the server at ADDR (project p, instance i), its output
# and errors on stdout without cbt's credentials notice; bounded so a stuck call cannot hang
# the test. Returns cbt's exit status.
cbtr() {
  local addr=$1
  shift
  BIGTABLE_EMULATOR_HOST=$addr timeout 60 "$CBT" -project p -instance i "$@" 2>&1 | grep -v 'creds flag unset'
  return "${PIPESTATUS[0]}"
}

# For tests that run a whole local instance with `strata up` (STRATA: the strata binary).
# instance_init NAME -> sets TMPD (a private directory named after NAME), DIR (the instance
# directory inside it) and PORT (a free port for the router), and makes the EXIT trap stop the
# instance (`strata down`) and remove TMPD before the usual cleanup. Run it in the test's own
# shell, not in $(...): the trap and the variables must outlive the call.
instance_init() {
  TMPD=$(mktemp -d "${STRATA_TEST_TMP:-/tmp}/$1.XXXXXX")
  DIR=$TMPD/inst
  PORT=$(free_port)
  trap instance_teardown EXIT
}

# up_single NAME [ARGS...]: instance_init NAME, then `strata up --clusters 1 --nodes 1 ARGS...`
# ($STRATA); fails the test when it does not start.
up_single() {
  instance_init "$1"
  "$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 "${@:2}" >"$TMPD/up.out" 2>&1 ||
    { cat "$TMPD/up.out"; fail "strata up"; }
}

# up_secure_single [ARGS...]: `strata up --secure --clusters 1 --nodes 1 ARGS...` in $DIR on
# $PORT (after instance_init; a later --nodes wins); sets S (DIR/secure) and cbts ARGS... (cbt
# with the command line up printed: its CA and admin token). Fails the test when it does not start.
up_secure_single() {
  "$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 --secure "$@" >"$TMPD/up.out" 2>&1 ||
    { cat "$TMPD/up.out"; fail "strata up --secure"; }
  S=$DIR/secure
  local line
  line=$(grep -E '^  cbt ' "$TMPD/up.out" | sed 's/^  //; s/ ls$//')
  read -r -a SECURE_CBT <<<"${line/#cbt/$CBT}"
}
cbts() { env -u BIGTABLE_EMULATOR_HOST timeout 60 "${SECURE_CBT[@]}" "$@" 2>&1; }

# cs_py create T [RETENTION_S] | write T K... | exists T: through hostile/cslib.py (python3) on
# the router at $PORT: makes table T (family cf, change streams kept RETENTION_S, default a day,
# 0 for off), writes rows K... (cf:q = vK), or prints 1 or 0 for whether table T exists.
cs_py() {
  HOSTILE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/hostile python3 - "$PORT" "$@" <<'EOF'
import os, sys
sys.path.insert(0, os.environ['HOSTILE'])
from cslib import ADMIN, call, create_cs, fld, mutate, set_cell, tname
port, what, t, rest = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
if what == 'create':
    assert create_cs(port, t, retention=int(rest[0]) if rest else 86400)[2] == 'end'
elif what == 'write':
    for k in rest:
        assert mutate(port, t, k, [set_cell('cf', 'q', 'v' + k)])[2] == 'end'
else:
    print(1 if call(port, ADMIN + 'GetTable', fld(1, tname(t)))[0] else 0)
EOF
}

instance_teardown() {
  "$STRATA" down --dir "$DIR" >/dev/null 2>&1
  rm -rf "$TMPD"
  cleanup
}

# fail MESSAGE...: for instance tests: says MESSAGE, shows the last FAIL_TAIL_LINES (default 30)
# lines of every log of the instance in $DIR and of the files listed in FAIL_EXTRA_LOGS, and ends
# the test with status 1.
FAIL_TAIL_LINES=30
FAIL_EXTRA_LOGS=()
fail() {
  local f
  echo "FAIL: $*" >&2
  for f in "$DIR"/logs/*.log "${FAIL_EXTRA_LOGS[@]}"; do
    [ -e "$f" ] || continue
    echo "--- $f (last $FAIL_TAIL_LINES lines)" >&2
    tail -n "$FAIL_TAIL_LINES" "$f" >&2
  done
  exit 1
}
