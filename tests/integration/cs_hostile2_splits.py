#!/usr/bin/env python3
"""cs_hostile2_splits.py PORT STRATA DIR — a table of 1000 tablets with change streams, made
while a change stream of another table is open through the router (`strata up --dir DIR`):
  - CreateTable with 999 splits succeeds (the router used to send every CreateTablet at once:
    each node created hundreds of tablets on its loop without answering the router's keepalive
    PINGs, the router dropped its node connections and the CreateTable, and every call on them,
    failed UNAVAILABLE);
  - the open stream is still served: a row written afterwards reaches it;
  - GenerateInitialChangeStreamPartitions answers the 1000 partitions, and `strata changes`
    reads a row written into every 37th of them.
Exit 0 when all hold, 1 otherwise."""
import os, subprocess, sys, threading, time, json
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hostile'))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cslib import *
from csconsumer import Checks
from sec_attack import grpc_status

port, strata, d = int(sys.argv[1]), sys.argv[2], sys.argv[3]
checks = Checks()
expect = checks.expect


def gcall(path, body, limit=120):
    c = Conn(port, timeout=limit)
    sid = c.headers(path)
    c.data_fc(sid, grpc_msg(body))
    data, hdrs, why = c.wait_end(sid, limit)
    c.s.close()
    return data, grpc_status(data, hdrs, why)


A, B = 'spa%d' % (now_us() % 100000), 'spb%d' % (now_us() % 100000)
create_cs(port, A)
t0 = now_us()
res = {}


def reader():
    c = Conn(port, timeout=90)
    sid = c.headers(BT + 'ReadChangeStream')
    c.data_fc(sid, grpc_msg(cs_req(A, start_us=t0, end_us=t0 + 80 * 10**6, hb_s=1)))
    got = bytearray()
    c.s.settimeout(90)
    end = time.time() + 85
    while time.time() < end and b'after' not in got:
        try: t, fl, s, p = c.read_frame()
        except Exception as e:
            res['why'] = str(e); break
        if s == sid and t == 0:
            got += p
            if p: c.send(frame(WINUP, 0, 0, struct.pack('>I', len(p))) + frame(WINUP, 0, sid, struct.pack('>I', len(p))))
        if s == sid and fl & 1:
            res['why'] = 'ended'; break
    res['got'] = bytes(got)
    c.s.close()


th = threading.Thread(target=reader)
th.start()
time.sleep(1)
splits = b''.join(fld(4, fld(1, 'k%04d' % i)) for i in range(1, 1000))
_, st = gcall(ADMIN + 'CreateTable', fld(1, INST) + fld(2, B) + fld(3, fld(3, fld(1, 'cf') + fld(2, b'')) +
                                                            fld(8, fld(1, fld(1, 86400)))) + splits)
expect('CreateTable with 999 splits while a stream is open', st == '0', 'status %s' % st)
_, st = gcall(BT + 'MutateRow', fld(1, tname(A)) + fld(2, 'after') + fld(3, set_cell('cf', 'q', 'v')))
expect('a write to the streamed table afterwards', st == '0', 'status %s' % st)
th.join(90)
expect('the open stream got the write made after the CreateTable', b'after' in res.get('got', b''),
       'stream: %s' % res.get('why'))
if st == '0' and not checks.failures:
    data, st = gcall(BT + 'GenerateInitialChangeStreamPartitions', fld(1, tname(B)))
    n = len(list(msgs(data)))
    expect('GenerateInitialChangeStreamPartitions answers 1000 partitions', st == '0' and n == 1000,
           '%s partitions, status %s' % (n, st))
    rows = ['k%04d' % i for i in range(1, 1000, 37)]
    t1 = now_us()
    c = Conn(port, timeout=30)
    for r in rows: mutate(port, B, r, [set_cell('cf', 'q', 'v')], conn=c)
    p = subprocess.run([strata, 'changes', '--dir', d, '--table', B, '--from', rfc3339(t1), '--quiet'],
                       capture_output=True, text=True, timeout=120)
    seen = sorted({json.loads(l)['row'] for l in p.stdout.splitlines() if l.strip()})
    expect('strata changes reads the rows of the 1000 partitions', p.returncode == 0 and seen == rows,
           '%d of %d rows, status %d %s' % (len(seen), len(rows), p.returncode, p.stderr[-300:]))
checks.exit()
