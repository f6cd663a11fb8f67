#!/usr/bin/env python3
"""cs_big_row.py PORT [N [BYTES]] — FAILS: one MutateRow of N SetCells of BYTES each (default
257 x 540,000 bytes, 139 MB) into table big_off (change streams off) and big_on (on), through
the router of any `strata up`. Without streams it is accepted; with streams it is refused with
INVALID_ARGUMENT: a row mutation of more than 256 mutations (NODE_CS_REF_MUTS_MAX) keeps every
value in its change record, so the row and its record together pass the log record's 256 MiB
(STO_LOG_RECORD_BYTES_MAX). 256 x 540,000 is accepted with streams on (values by reference)."""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
from cslib import *
from cs_hostile4 import rcall
port = int(sys.argv[1])
n = int(sys.argv[2]) if len(sys.argv) > 2 else 257
size = int(sys.argv[3]) if len(sys.argv) > 3 else 540000
got = {}
for t, ret in (('big_off', 0), ('big_on', 86400)):
    create_cs(port, t, retention=ret)
    body = fld(1, tname(t)) + fld(2, b'row') + b''.join(
        fld(3, set_cell('cf', b'q%d' % i, b'x' * size, 1000)) for i in range(n))
    got[t] = rcall(port, BT + 'MutateRow', body, limit=120)[1]
    print('%s: %d bytes, status %s' % (t, len(body), got[t]))
sys.exit(0 if got['big_on'] == got['big_off'] == '0' else 1)
