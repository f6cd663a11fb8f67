#!/usr/bin/env python3
"""cs_ring_overflow.py PORT [ROWS] [BYTES] — a live ReadChangeStream (heartbeat 300 ms) on a
standalone strata-node whose client stops reading while ROWS x BYTES (default 100 x 1 MiB; 40 is
enough) are written, then reads with open windows for READ_S seconds (default 60; gives up after
IDLE_S, default 30, without a frame). Expected: every row's record, and heartbeats.
Defect: after 15-38 records the stream sends nothing more, not even heartbeats.
Exit 1 if a row has no record. The same stream read without the pause gets every record."""
import struct, sys
from cslib import *

port = int(sys.argv[1]); ROWS = int(sys.argv[2]) if len(sys.argv) > 2 else 100
B = int(sys.argv[3]) if len(sys.argv) > 3 else 1 << 20
T = 'ring_%d' % (now_us() % 100000)
create_cs(port, T)
t0 = now_us()
r = Conn(port, timeout=120)
w = Conn(port, timeout=120)
for i in range(ROWS):
    mutate(port, T, 'r%05d' % i, [set_cell('cf', 'q', os.urandom(B))], conn=w)
    if i == 2:  # the stream is live now; its client stops reading after its first window
        end = None
        sid = r.headers(BT + 'ReadChangeStream')
        r.data_fc(sid, grpc_msg(cs_req(T, start_us=t0, hb_ns=300000000, end_us=None)))
end = now_us() + 500000
# the already open stream has no end_time: read it for a while with full windows, then compare
seen = []
from h2raw import DATA
import socket
r.send(frame(WINUP, 0, sid, struct.pack('>I', 1 << 30)))
buf = b''
deadline = time.time() + float(os.environ.get('READ_S', '60'))
r.s.settimeout(float(os.environ.get("IDLE_S", "30")))
while time.time() < deadline:
    try: t, fl, s, p = r.read_frame()
    except socket.timeout: break
    if s == sid and t == DATA:
        buf += p
        r.send(frame(WINUP, 0, 0, struct.pack('>I', len(p))))
    if s == sid and fl & 1: break
evs = decode(buf[:sum(5 + len(m) for m in msgs(buf))])
seen = [e[1].decode() for e in evs if e[0] == 'rec']
missing = sorted(set('r%05d' % i for i in range(ROWS)) - set(seen))
hbs = [e[1] for e in evs if e[0] == 'hb']
recs = [e for e in evs if e[0] == 'rec']
print('heartbeats %d, first %s, last %s; last record token %s' % (len(hbs), hbs[:1], hbs[-1:], recs[-1][4] if recs else None))
print('records %d (distinct %d), missing %d %s; close %s' % (len(seen), len(set(seen)), len(missing), missing[:5],
      [e[1:3] for e in evs if e[0] == 'close']))
if missing and recs:
    ev, st, msg, err = ncs(port, cs_req(T, tokens=[(b'', recs[-1][4])], end_us=now_us() + 300000), 30)
    again = set(e[1].decode() for e in ev or [] if e[0] == 'rec')
    print('a new stream from the last token: status %s, %d of the %d missing rows' % (st, len(set(missing) & again), len(missing)))
sys.exit(1 if missing else 0)
