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

make_tmp() {
  local d
  d=$(mktemp -d "${STRATA_TEST_TMP:-/tmp}/it.XXXXXX")
  TMPDIRS+=("$d")
  echo "$d"
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

# start_emulator -> sets EMU_ADDR (returns 1 if the emulator is not installed)
start_emulator() {
  [ -x "$EMULATOR" ] || return 1
  local port log
  log=$(make_tmp)/emu.log
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$EMULATOR" -host 127.0.0.1 -port "$port" >"$log" 2>&1 &
  PIDS+=("$!")
  EMU_ADDR=$(wait_line "$log" '127\.0\.0\.1:[0-9]+') || return 1
}
