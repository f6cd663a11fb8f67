#!/usr/bin/env bash
# The test command: installs what is missing, builds a normal build and an AddressSanitizer+UBSan
# build, and runs every test in both through CTest. Usage: ops/test.sh [ctest args...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

bash ops/setup.sh

# Formatting (docs/style.md: .clang-format is checked in CI). Fix with:
#   git ls-files '*.c' '*.h' '*.cc' | xargs clang-format -i
if command -v clang-format >/dev/null 2>&1; then
  echo "== clang-format check"
  if ! git ls-files '*.c' '*.h' '*.cc' | xargs clang-format --dry-run --Werror 2>/tmp/strata-format.log; then
    grep -m 20 'error:' /tmp/strata-format.log
    echo "ops/test.sh: files are not clang-formatted; run: git ls-files '*.c' '*.h' '*.cc' | xargs clang-format -i"
    exit 1
  fi
fi

jobs=${STRATA_JOBS:-2}
run_build() {
  local dir=$1; shift
  echo "== configure $dir $*"
  cmake -S . -B "$dir" -G Ninja "$@" >/dev/null
  echo "== build $dir"
  ninja -C "$dir" -j "$jobs"
}

# Warnings are errors here (STRATA_WERROR); a plain cmake build only reports them.
run_build build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_WERROR=ON
run_build build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_SANITIZE=ON -DSTRATA_WERROR=ON

status=0
for dir in build build-asan; do
  echo "== test $dir"
  # ASan: fail on leaks too; UBSan already aborts on the first report (-fno-sanitize-recover).
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
    ctest --test-dir "$dir" --output-on-failure --timeout 900 -j "$jobs" "$@" || status=1
done
if [ $status -ne 0 ]; then
  echo "ops/test.sh: some tests failed (see above); rerun one with: ctest --test-dir build -R NAME -V"
fi
exit $status
