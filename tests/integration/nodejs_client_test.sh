#!/usr/bin/env bash
# nodejs_client_test.sh — runs one scenario of the official Cloud Bigtable Node.js client
# (@google-cloud/bigtable, pinned in nodejs/package.json + package-lock.json) against a real
# strata-node and, where it is installed, against the official emulator, and requires the same
# canonical JSON answers from both (nodejs/client_test.js prints them; lines starting with `#`
# are cases where the emulator is known to differ from Cloud Bigtable, printed but not compared).
# The client script also asserts key expectations itself, so the run without the emulator still
# checks strata-node, and its output is then compared with the emulator's recorded answers
# (nodejs/expected.jsonl; STRATA_NODEJS_REGEN=1 rewrites it from a run with the emulator).
# Dependencies are installed with `npm ci` into a cache under the build tree (STRATA_NODEJS_CACHE,
# default <build>/nodejs-deps), reused while the lock file is unchanged.
# Exit 77 (skipped) when node/npm are missing or too old, or when npm cannot reach its registry.
# Usage: nodejs_client_test.sh PATH/TO/strata-node
set -u
. "$(dirname "$0")/lib.sh"
NODE_BIN=$1
SRC=$(cd "$(dirname "$0")/nodejs" && pwd)
CACHE=${STRATA_NODEJS_CACHE:-$(cd "$(dirname "$NODE_BIN")/.." && pwd)/nodejs-deps}

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "SKIP: node and npm are needed (Node.js >= 18) and are not installed"; exit 77
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 18 ]; then
  echo "SKIP: Node.js $(node --version) is older than the client's minimum (18)"; exit 77
fi

# install_deps: npm ci into $CACHE unless the installed tree comes from this very lock file.
install_deps() {
  local stamp="$CACHE/node_modules/.strata-lock.sha256" want log
  want=$(sha256sum "$SRC/package-lock.json" | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] &&
     [ -f "$CACHE/node_modules/@google-cloud/bigtable/package.json" ]; then
    return 0
  fi
  mkdir -p "$CACHE" || return 1
  cp "$SRC/package.json" "$SRC/package-lock.json" "$CACHE/" || return 1
  log="$CACHE/npm-ci.log"
  echo "installing the Node.js client into $CACHE (npm ci)"
  timeout 300 npm ci --prefix "$CACHE" --no-audit --no-fund >"$log" 2>&1
  local rc=$? net='ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ENETUNREACH|EHOSTUNREACH'
  if [ $rc -ne 0 ]; then
    if [ $rc -eq 124 ] || grep -Eq "$net|network|socket hang up" "$log"; then
      echo "SKIP: npm could not reach its registry to install @google-cloud/bigtable (no network?):"
      grep -E -m 4 'npm error (code|errno|syscall|network)|npm ERR! (code|errno|network)' "$log"
      return 77
    fi
    echo "FAIL: npm ci failed (not a network error); last lines of $log:"; tail -n 20 "$log"
    return 1
  fi
  echo "$want" >"$stamp"
}
install_deps
rc=$?
[ $rc -eq 0 ] || exit $rc
version=$(node -p "require('$CACHE/node_modules/@google-cloud/bigtable/package.json').version")
echo "client: @google-cloud/bigtable $version on Node.js $(node --version)"

# run_client ADDR TARGET OUT: the scenario against one server; stderr (error messages, failed
# expectations) goes to OUT.err. Returns the script's exit code.
run_client() {
  BIGTABLE_EMULATOR_HOST=$1 NODE_PATH="$CACHE/node_modules" timeout 300 \
    node "$SRC/client_test.js" "$2" >"$3" 2>"$3.err"
}

fail=0
tmp=$(make_tmp)
start_node "$NODE_BIN" "$tmp/node" || exit 1
run_client "$NODE_ADDR" strata "$tmp/strata.out"
rc=$?
grep -v -e MetadataLookupWarning -e 'trace-warnings' "$tmp/strata.out.err"
if [ $rc -ne 0 ]; then
  echo "FAIL: the Node.js client scenario against strata-node exited $rc"; fail=1
fi
steps=$(grep -c . "$tmp/strata.out")

if start_emulator; then
  run_client "$EMU_ADDR" emulator "$tmp/emu.out"
  erc=$?
  if [ $erc -eq 1 ]; then
    echo "note: the emulator missed some expectations (its own behaviour, not strata-node's):"
    grep 'EXPECTATION' "$tmp/emu.out.err"
  elif [ $erc -ne 0 ]; then
    echo "FAIL: the scenario against the emulator exited $erc:"; cat "$tmp/emu.out.err"; fail=1
  fi
  if ! diff -u <(grep -v '^#' "$tmp/emu.out") <(grep -v '^#' "$tmp/strata.out"); then
    echo "FAIL: strata-node answered differently from the emulator (- emulator, + strata-node)"
    fail=1
  else
    echo "answers identical to the emulator's over $(grep -vc '^#' "$tmp/strata.out") steps"
  fi
  echo "not compared (the emulator differs from Cloud Bigtable; strata-node checked against"
  echo "Cloud's answer in client_test.js):"
  diff <(grep '^#' "$tmp/emu.out") <(grep '^#' "$tmp/strata.out") |
    sed -n 's/^</  emulator:/p; s/^>/  strata:  /p'
  # The golden file stands in for the emulator where it is not installed: warn when it is stale.
  if ! diff -q <(grep -v '^#' "$tmp/emu.out") "$SRC/expected.jsonl" >/dev/null; then
    echo "note: nodejs/expected.jsonl differs from this emulator's answers; regenerate it with"
    echo "  STRATA_NODEJS_REGEN=1 $0 $NODE_BIN   (if the scenario changed)"
    [ -n "${STRATA_NODEJS_REGEN:-}" ] && grep -v '^#' "$tmp/emu.out" >"$SRC/expected.jsonl" &&
      echo "regenerated $SRC/expected.jsonl"
  fi
else
  # Without the emulator: its recorded answers (nodejs/expected.jsonl) and the expectations.
  if ! diff -u "$SRC/expected.jsonl" <(grep -v '^#' "$tmp/strata.out"); then
    echo "FAIL: strata-node's answers differ from the emulator's recorded ones (-recorded +strata)"
    fail=1
  else
    echo "emulator not installed: answers identical to its recorded answers (nodejs/expected.jsonl)"
  fi
fi
# A sanitizer build reports at exit (leaks) or aborts: both land in the node's log.
stop_node
if grep -Eq 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$tmp/node.log"; then
  echo "FAIL: strata-node's log has a sanitizer report:"; cat "$tmp/node.log"; fail=1
fi
if [ $fail -eq 0 ]; then
  echo "nodejs_client_test: 1 passed, 0 failed ($steps steps)"
else
  keep="${STRATA_TEST_TMP:-/tmp}/nodejs_client_test.strata.out"
  cp "$tmp/strata.out" "$keep" 2>/dev/null && echo "strata-node's answers kept in $keep"
  echo "nodejs_client_test: 0 passed, 1 failed"
fi
exit $fail
