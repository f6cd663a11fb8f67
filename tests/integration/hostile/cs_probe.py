#!/usr/bin/env python3
"""cs_probe.py PORT [TABLE] — throws malformed ReadChangeStream requests at PORT and prints
each answer (status, events); flags answers that are not a clean gRPC status."""
import sys, time
from cslib import *

port = int(sys.argv[1]); T = sys.argv[2] if len(sys.argv) > 2 else 'probe'
print('create', create_cs(port, T)[1:])
t0 = now_us()
for i in range(3):
    print('write', mutate(port, T, 'r%d' % i, [set_cell('cf', 'q', 'v%d' % i)])[1:])
now = now_us()
BIG = 1 << 62
cases = {
    'plain': cs_req(T, start_us=t0, end_us=now + 500000),
    'no partition field': cs_req(T, partition=None, start_us=t0, end_us=now + 500000),
    'start>end part': cs_req(T, partition=rng('z', 'a'), start_us=t0, end_us=now + 500000),
    'empty part a..a': cs_req(T, partition=rng('a', 'a'), start_us=t0, end_us=now + 500000),
    'huge key part': cs_req(T, partition=rng('a' * 200000), start_us=t0, end_us=now + 500000),
    'end<start': cs_req(T, start_us=now, end_us=t0),
    'start far future': cs_req(T, start_us=now + 10**12, end_us=now + 10**12 + 1),
    'start far past': cs_req(T, start_us=1, end_us=now),
    'start negative secs': cs_req(T, start_us=-5 * 10**6, end_us=now),
    'end huge': cs_req(T, start_us=t0, end_us=BIG, hb_s=1),
    'end negative': cs_req(T, start_us=t0, end_us=-10**6),
    'hb 0': cs_req(T, start_us=t0, end_us=now + 300000, hb_s=0, hb_ns=0),
    'hb negative': cs_req(T, start_us=t0, end_us=now + 300000, hb_s=-5),
    'hb huge': cs_req(T, start_us=t0, end_us=now + 300000, hb_s=1 << 62),
    'hb ns overflow': cs_req(T, start_us=t0, end_us=now + 300000, hb_ns=(1 << 63) - 1),
    'tok garbage': cs_req(T, tokens=[(b'', 'garbage')], end_us=now + 300000),
    'tok empty': cs_req(T, tokens=[(b'', '')], end_us=now + 300000),
    'tok huge': cs_req(T, tokens=[(b'', '1.' + '9' * 100000)], end_us=now + 300000),
    'tok W overflow': cs_req(T, tokens=[(b'', '1.99999999999999999999999')], end_us=now + 300000),
    'tok W 0': cs_req(T, tokens=[(b'', '1.0')], end_us=now + 300000),
    'tok H<W': cs_req(T, tokens=[(b'', '1.%d.%d.61' % (now, t0))], end_us=now + 300000),
    'tok H=W': cs_req(T, tokens=[(b'', '1.%d.%d.61' % (now, now))], end_us=now + 300000),
    'tok W future': cs_req(T, tokens=[(b'', '1.%d' % (now + 10**11))], end_us=now + 10**11 + 10),
    'tok H future': cs_req(T, tokens=[(b'', '1.%d.%d.72' % (t0, now + 10**11))], end_us=now + 300000),
    'tok neg': cs_req(T, tokens=[(b'', '1.-5')], end_us=now + 300000),
    'tok K 5KiB': cs_req(T, tokens=[(b'', '1.%d.%d.%s' % (t0, now, '61' * 2100))], end_us=now + 300000),
    'tok K uppercase': cs_req(T, tokens=[(b'', '1.%d.%d.AA' % (t0, now))], end_us=now + 300000),
    'tok K odd hex': cs_req(T, tokens=[(b'', '1.%d.%d.abc' % (t0, now))], end_us=now + 300000),
    'tok other part': cs_req(T, tokens=[(rng('a', 'b'), '1.%d' % t0)], end_us=now + 300000),
    'tok 2 overlapping': cs_req(T, tokens=[(b'', '1.%d' % t0), (b'', '1.%d' % t0)], end_us=now + 300000),
    'tok 2 covering': cs_req(T, tokens=[(rng(None, 'm'), '1.%d' % t0), (rng('m', None), '1.%d' % t0)], end_us=now + 300000),
    '1000 tokens': cs_req(T, tokens=[(rng(('k%05d' % i).encode(), ('k%05d' % (i + 1)).encode()), '1.%d' % t0) for i in range(1000)], end_us=now + 300000),
    'tok + start': cs_req(T, start_us=t0, tokens=[(b'', '1.%d' % t0)], end_us=now + 300000),
    'version 2 tok': cs_req(T, tokens=[(b'', '2.%d' % t0)], end_us=now + 300000),
    'missing table': cs_req('nope', start_us=t0, end_us=now + 300000),
    'bad profile': cs_req(T, start_us=t0, end_us=now + 300000, profile='nope'),
    'table name junk': fld(1, '\x00' * 10) + fld(3, b''),
    'deep nesting': fld(1, tname(T)) + fld(3, fld(1, b'\x0a\x00' * 0) + b''.join([b''])) + (b'\x1a\x80\x80\x80\x80\x10'),
    'truncated': cs_req(T, start_us=t0)[:-3],
    'unknown fields': cs_req(T, start_us=t0, end_us=now + 300000) + fld(99, 'x' * 1000) + fld(100, 7),
}
# deep nesting in an unknown field
deep = b''
for _ in range(5000): deep = fld(1, deep)
cases['deep unknown 5000'] = cs_req(T, start_us=t0, end_us=now + 300000) + fld(50, deep)
cases['deep partition'] = fld(1, tname(T)) + fld(3, deep)
for name, req in cases.items():
    try:
        ev, st, msg, err = ncs(port, req, limit=4)
        recs = sum(1 for e in ev if e[0] == 'rec'); hbs = sum(1 for e in ev if e[0] == 'hb')
        close = [e[1:3] + (e[4][:80],) for e in ev if e[0] == 'close']
        print('%-20s st=%s err=%s recs=%d hb=%d close=%s msg=%s' % (name, st, err, recs, hbs, close, (msg or '')[:150]))
    except Exception as e:
        print('%-20s EXC %r' % (name, e))
