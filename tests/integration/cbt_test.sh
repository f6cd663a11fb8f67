#!/usr/bin/env bash
# cbt_test.sh — drives a real strata-node with the official cbt CLI through the commands an
# application needs, and (where the official emulator is installed) runs the same commands against
# cbtemulator and requires byte-identical output. Timestamps are explicit so answers compare
# exactly; then the node is restarted and everything is read back.
# Usage: cbt_test.sh PATH/TO/strata-node
set -u
. "$(dirname "$0")/lib.sh"
NODE_BIN=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi

# The command script: one cbt invocation per line (arguments split on spaces).
CSV=$(make_tmp)/import.csv
cat >"$CSV" <<'CSVEOF'
,cf1,,cf2
,qa,qb,qc
imp1,a1@1000,b1@2000,c1@3000
imp2,,b2@4000,
imp3,a3@5000,,c3@6000
CSVEOF
read -r -d '' SCRIPT <<EOS
createtable t1 families=cf1:maxversions=2,cf2:never splits=m
createfamily t1 cf3
setgcpolicy t1 cf3 maxage=1d
ls
ls t1
set t1 r1 cf1:a=v1@1000 cf1:b=v2@1000
set t1 r1 cf1:a=v3@2000
set t1 r2 cf2:c=hello@3000
set t1 zz cf1:a=late@4000 cf3:x=y@5000
set t1 n1 cf1:a=n@1000
lookup t1 r1
read t1
read t1 start=n end=zz
read t1 prefix=r
read t1 regex=r.*
read t1 columns=cf1:a
read t1 cells-per-column=1
read t1 count=2
read t1 reversed=true
count t1
deletecolumn t1 r1 cf1 b
lookup t1 r1
deleterow t1 r2
read t1
import t1 $CSV timestamp=value-encoded
read t1 prefix=imp
count t1
deleteallrows t1
count t1
read t1
createtable t2
ls
deletetable t2
ls
EOS

normalize() { grep -v 'creds flag unset' | sed -E 's/[0-9]{4}\/[0-9]{2}\/[0-9]{2} [0-9:]{8} //'; }

run_script() { # ADDR OUTFILE
  local addr=$1 out=$2
  : >"$out"
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    echo "\$ cbt $line" >>"$out"
    # shellcheck disable=SC2086
    BIGTABLE_EMULATOR_HOST=$addr timeout 60 "$CBT" -project p -instance i $line 2>&1 | normalize >>"$out"
    echo "[exit ${PIPESTATUS[0]}]" >>"$out"
  done <<<"$SCRIPT"
}

data=$(make_tmp)/node
start_node "$NODE_BIN" "$data" || exit 1
out_node=$(make_tmp)/node.out
run_script "$NODE_ADDR" "$out_node"

fail=0
if grep -q '^\[exit [^0]' "$out_node"; then
  echo "FAIL: a cbt command failed against strata-node:"; grep -B3 '^\[exit [^0]' "$out_node"; fail=1
fi
for want in 'cf3		age() > 1d' '"v3"' 'hello' 'a1' 'b2'; do
  grep -qF "$want" "$out_node" || { echo "FAIL: output lacks '$want'"; fail=1; }
done

if start_emulator; then
  out_emu=$(make_tmp)/emu.out
  run_script "$EMU_ADDR" "$out_emu"
  if ! diff -u "$out_emu" "$out_node"; then
    echo "FAIL: strata-node output differs from the emulator's (- emulator, + strata)"; fail=1
  else
    echo "cbt output identical to the emulator's over $(grep -c '^\$ cbt' "$out_node") commands"
  fi
else
  echo "emulator not installed: compared against built-in expectations only"
fi

# Restart: everything written must come back.
BIGTABLE_EMULATOR_HOST=$NODE_ADDR "$CBT" -project p -instance i set t1 keep cf1:q=survives@7000 cf2:z=2@8000 >/dev/null 2>&1
before=$(BIGTABLE_EMULATOR_HOST=$NODE_ADDR "$CBT" -project p -instance i read t1 2>&1 | normalize)
stop_node
start_node "$NODE_BIN" "$data" || exit 1
after=$(BIGTABLE_EMULATOR_HOST=$NODE_ADDR "$CBT" -project p -instance i read t1 2>&1 | normalize)
if [ "$before" != "$after" ] || ! grep -q survives <<<"$after"; then
  echo "FAIL: data changed across a restart"; echo "before: $before"; echo "after: $after"; fail=1
else
  echo "restart: table contents identical after stopping and starting the node"
fi
[ $fail -eq 0 ] && echo "cbt_test: 1 passed, 0 failed" || echo "cbt_test: 0 passed, 1 failed"
exit $fail
