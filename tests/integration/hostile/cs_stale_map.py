#!/usr/bin/env python3
"""cs_stale_map.py PORT — start `strata up --clusters 1 --nodes 1 --split-bytes 1000000` first.
A ReadChangeStream of a whole table with streams on, through the router, while rows are written
until the node splits the tablet and ends the stream with CloseStream (new partitions A, B).
Then each new partition is read through the router, as a client following CloseStream does,
without any GenerateInitialChangeStreamPartitions call (which would refresh the router's map).
Expected: the router forwards A and B to the node (records), or answers CloseStream with the
tablets of now (each inside A or B). Defect: the router answers from its stale tablet map, a
CloseStream whose new partition is the old, already split tablet (a "merge" back into a tablet
that no longer exists); a client following it goes round in circles.
Exit 1 when that happens."""
import sys
from cslib import *

port = int(sys.argv[1])
T = 'stale_%d' % (now_us() % 100000)
create_cs(port, T)
t0 = now_us()
c = Conn(port, timeout=60)
w = Conn(port, timeout=60)
sid = c.headers(BT + 'ReadChangeStream')
c.data_fc(sid, grpc_msg(cs_req(T, start_us=t0, hb_ns=200000000)))
import threading
got = []
th = threading.Thread(target=lambda: got.append(stream_cs(port, cs_req(T, start_us=t0, hb_ns=200000000), got.append, limit=60)))
th.start()
i = 0
while th.is_alive() and i < 400:
    mutate(port, T, '%08x' % ((i * 2654435761) % (1 << 32)), [set_cell('cf', 'q', os.urandom(50000))], conn=w)
    i += 1
th.join(10)
close = [e for e in got if isinstance(e, tuple) and e[0] == 'close']
if not close:
    print('no CloseStream after %d rows: %s' % (i, got[-3:])); sys.exit(2)
print('after %d rows the node closed the whole-table stream: code %d, tokens %s, new partitions %s' %
      (i, close[0][1], close[0][2], close[0][3]))
bad = 0
for rr, tok in close[0][2]:
    ev, st, msg, err = ncs(port, cs_req(T, partition=rr, tokens=[(rr, tok)], end_us=now_us() + 500000), 8)
    cl = [e for e in (ev or []) if e[0] == 'close']
    print('read partition %r from %s: status %s, %d records, close %s' %
          (rr, tok, st, sum(1 for e in ev or [] if e[0] == 'rec'), [(x[1], x[3]) for x in cl]))
    for x in cl:
        if x[1] != 0:
            for np in x[3]:
                inner = dict((a, b) for a, _, b in fields(np)).get(1, b'')
                if inner != rr and len(x[3]) == 1:
                    print('  DEFECT: CloseStream sends the consumer of %r to %r, wider than the partition' % (rr, inner)); bad += 1
sys.exit(1 if bad else 0)
