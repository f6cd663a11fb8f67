#!/usr/bin/env python3
"""cs_watermark_late.py PORT [CLUSTER] — on `strata up --clusters 2 --nodes 2`: one stream
(heartbeats every 100 ms) while 6 writers do ReadModifyWriteRow and CheckAndMutateRow on one
row and MutateRow on 50 others for 10 s. Counts records whose commit_timestamp is below an
estimated_low_watermark the stream already sent (a Heartbeat or an earlier DataChange).
Cloud Bigtable: the watermark is "usually lower than or equal to any timestamp for a record
that will be delivered in the future"; a consumer such as Beam treats such records as late.
Before write_stamp (node/changes_write.c) 15-20% of the records were late on the origin
cluster by up to ~200 us (a write's stamp was taken after its rows' commit times), and by up
to 25 ms read through a profile of the peer CLUSTER (west). Exit 1 when any record is late."""
import sys, time, threading, struct
sys.path.insert(0, __import__('os').path.dirname(__import__('os').path.abspath(__file__)))
from cslib import *
port = int(sys.argv[1])
prof = sys.argv[2] if len(sys.argv) > 2 else None
T = 'wm%d' % (now_us() % 100000)
create_cs(port, T)
if prof: print('profile', create_profile(port, prof + T, prof)[1:])
time.sleep(0.3)
def ts_us(b):
    d = dict((a, x) for a, _, x in fields(b)); return d.get(1, 0) * 10**6 + d.get(2, 0) // 1000
evs = []
def on(e): evs.append((e, None))
# custom: need commit ts + watermark: read raw
raw = []
def rd():
    c = Conn(port, timeout=30)
    sid = c.headers(BT + 'ReadChangeStream')
    c.data_fc(sid, grpc_msg(cs_req(T, start_us=now_us() - 10**5, end_us=now_us() + 12 * 10**6, hb_ns=10**8, profile=(prof + T) if prof else None)))
    data, hdrs, why = c.wait_end(sid, 30)
    raw.append(data)
th = threading.Thread(target=rd); th.start(); time.sleep(0.5)
stop = False
def w(k):
    c = Conn(port, timeout=30); i = 0
    while not stop:
        i += 1
        if k % 3 == 0:
            call(port, BT + 'ReadModifyWriteRow', fld(1, tname(T)) + fld(2, 'hot') + fld(3, fld(1, 'cf') + fld(2, 'n') + fld(4, 1)), conn=c)
        elif k % 3 == 1:
            call(port, BT + 'CheckAndMutateRow', fld(1, tname(T)) + fld(2, 'hot') + fld(4, set_cell('cf', 'c', 'x%d' % i)), conn=c)
        else:
            mutate(port, T, 'r%d' % (i % 50), [set_cell('cf', 'q', 'v')], conn=c)
ths = [threading.Thread(target=w, args=(k,)) for k in range(6)]
for t in ths: t.start()
time.sleep(10); stop = True
for t in ths: t.join()
th.join()
maxwm = 0; late = []; n = 0; kinds = {}; tot = {}
for m in msgs(raw[0]):
    for num, wt, v in fields(m):
        if num == 1:
            d = {}
            for f, _, x in fields(v): d[f] = x
            if 4 in d:
                ct = ts_us(d[4]); n += 1
                if ct < maxwm: late.append(maxwm - ct); kinds[d.get(3)[:1]] = kinds.get(d.get(3)[:1], 0) + 1
                tot[d.get(3)[:1]] = tot.get(d.get(3)[:1], 0) + 1
            if 10 in d: maxwm = max(maxwm, ts_us(d[10]))
        elif num == 2:
            d = dict((a, x) for a, _, x in fields(v))
            if 2 in d: maxwm = max(maxwm, ts_us(d[2]))
late.sort()
print('records', n, 'with commit_timestamp below an earlier watermark:', len(late), 'by up to', late[-5:] if late else None, 'us')
print('late by row kind', kinds, 'of', tot)
sys.exit(1 if late else 0)
