#!/usr/bin/env python3
"""cs_flood.py PORT PIDS [STREAMS] [ROWS] [BYTES] — writes ROWS rows of BYTES into a change stream
table, then opens STREAMS ReadChangeStreams of the whole history on ONE connection and never reads
them; samples VmRSS of PIDS (comma-separated); then an RST storm: 2000 streams opened and reset at
once on another connection; finally checks the server still answers a fresh stream with every
record. Prints RSS figures; exit 1 if the final stream is incomplete."""
import sys
from cslib import *
from h2raw import RST

port, pids = int(sys.argv[1]), sys.argv[2].split(',')
N = int(sys.argv[3]) if len(sys.argv) > 3 else 500
ROWS = int(sys.argv[4]) if len(sys.argv) > 4 else 100
B = int(sys.argv[5]) if len(sys.argv) > 5 else 100000
rss = lambda: [int(open('/proc/%s/status' % p).read().split('VmRSS:')[1].split()[0]) // 1024 for p in pids]
T = 'flood_%d' % (now_us() % 100000)
create_cs(port, T)
t0 = now_us()
c = Conn(port, timeout=120)
for i in range(ROWS):
    mutate(port, T, 'r%05d' % i, [set_cell('cf', 'q', os.urandom(B))], conn=c)
t1 = now_us() + 500000
print('history %.1f MB; rss before %s' % (ROWS * B / 1e6, rss()))
h = Conn(port, timeout=120)
req = grpc_msg(cs_req(T, start_us=t0, end_us=t1))
for i in range(N):
    sid = h.headers(BT + 'ReadChangeStream'); h.data(sid, req)
peak = rss()
for _ in range(40):
    time.sleep(0.5); now = rss(); peak = [max(a, b) for a, b in zip(peak, now)]
print('%d unread streams on one connection: rss peak %s MB' % (N, peak))
# RST storm
r = Conn(port, timeout=60)
for i in range(2000):
    sid = r.headers(BT + 'ReadChangeStream'); r.data(sid, req)
    r.send(frame(RST, 0, sid, struct.pack('>I', 8)))
time.sleep(2)
print('after 2000 open+RST: rss %s' % rss())
h.s.close(); r.s.close()
time.sleep(2)
print('after closing: rss %s' % rss())
n = []
why = stream_cs(port, cs_req(T, start_us=t0, end_us=t1), lambda e: n.append(e), limit=60)
recs = [e[1] for e in n if e[0] == 'rec']
print('fresh stream: %s, %d records of %d, close %s' % (why, len(recs), ROWS, [e[1] for e in n if e[0] == 'close']))
sys.exit(0 if len(set(recs)) == ROWS else 1)
