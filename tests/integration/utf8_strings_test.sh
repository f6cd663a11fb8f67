#!/usr/bin/env bash
# utf8_strings_test.sh — string fields of requests must be UTF-8, as proto3 requires
# (docs/operations.md, Text is UTF-8): a CreateAppProfile whose description is not UTF-8, a CreateTable whose
# table id is not, and a MutateRow whose family name is not (refused by the node: the router
# forwards data calls unparsed) end INVALID_ARGUMENT naming the field, so nothing is stored that
# grpc-go clients could not read back; `cbt listappprofile` keeps working; a description in
# UTF-8 beyond ASCII (accents, 4-byte characters) is stored and read back as sent.
# Raw gRPC through hostile/h2raw.py (python3); the cbt part skips without cbt.
# Usage: utf8_strings_test.sh PATH/TO/strata (skips, 77, without python3)
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
up_single utf8_strings
expect_match() { # WHAT REGEX GOT
  if printf '%s' "$3" | grep -Eq -- "$2"; then echo "ok: $1"; else fail "$1: want /$2/, got '$3'"; fi
}
raw() { # PYTHON-EXPRESSION-OF-(PATH, BODY): prints the call's grpc-status
  HERE=$(cd "$(dirname "$0")" && pwd) python3 - "$PORT" "$1" <<'PY'
import os, sys
sys.path.insert(0, os.path.join(os.environ['HERE'], 'hostile'))
sys.path.insert(0, os.environ['HERE'])
from cslib import ADMIN, BT, INST, fld, tname
from h2raw import Conn, grpc_msg
from sec_attack import grpc_status
IA = '/google.bigtable.admin.v2.BigtableInstanceAdmin/'
def profile(name, desc):  # single-cluster to east, ignore_warnings
    return IA + 'CreateAppProfile', (fld(1, INST) + fld(2, name) +
                                     fld(3, fld(6, fld(1, 'east')) + fld(3, desc)) + fld(4, 1))
path, body = eval(sys.argv[2])
c = Conn(int(sys.argv[1]), timeout=30)
sid = c.headers(path)
c.data(sid, grpc_msg(body))
print('status', grpc_status(*c.wait_end(sid, 30)))
PY
}

expect_match "CreateAppProfile with a description not UTF-8" \
  "^status 3$" "$(raw "profile('bad', b'bad\\xff\\xfeutf8')")"
expect_match "CreateTable with a table id not UTF-8" "^status 3$" \
  "$(raw "(ADMIN + 'CreateTable', fld(1, INST) + fld(2, b't\\xff') + fld(3, b''))")"
cs_py create t 0
expect_match "MutateRow with a family name not UTF-8 (the node refuses it)" "^status 3$" \
  "$(raw "(BT + 'MutateRow', fld(1, tname('t')) + fld(2, 'r1') + fld(3, fld(1, fld(1, b'c\\xc0\\xaf') + fld(2, 'q') + fld(4, 'v'))))")"
expect_match "a description holding a UTF-16 surrogate" "^status 3$" \
  "$(raw "profile('bad2', b'\\xed\\xa0\\x80')")"
expect_match "a description in UTF-8 beyond ASCII is stored" "^status 0$" \
  "$(raw "profile('good', 'café ✓ 𝄞'.encode())")"

if [ -n "$CBT" ]; then
  out=$(BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT timeout 60 "$CBT" -project p -instance i listappprofile i 2>&1) ||
    fail "cbt listappprofile: $out"
  expect_match "cbt listappprofile reads every profile" 'good' "$out"
  expect_match "the description comes back as sent" 'café ✓ 𝄞' \
    "$(BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT timeout 60 "$CBT" -project p -instance i getappprofile i good 2>&1)"
else
  echo "cbt not installed: skipping the cbt part"
fi
echo PASS
