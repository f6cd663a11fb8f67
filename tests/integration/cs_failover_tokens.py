#!/usr/bin/env python3
"""cs_failover_tokens.py PORT DIR — hostile version 2 change stream tokens on `strata up --clusters 2
--nodes 1` (east = cluster 1, west = cluster 2), read through a profile routed to east
(docs/changestreams.md, Tokens and Failover: the applied bound). A row is written at time t1;
tokens with W after t1 and Y before it are read up to an end_time:
  - C of another cluster (west, a cluster that does not exist, 0, 2^32-1): start at Y, the row
    comes (safe start);
  - C of east itself: start at W, the row does not come (a same-cluster token);
  - Y = 0: start at the oldest record, the row comes;
  - Y > W, C >= 2^32, a v2 token with a leading zero: INVALID_ARGUMENT naming the token form;
  - the largest W and Y: the stream starts (at the node's resolved time), a row written then comes;
  - a v1 and a v2 token for the two halves of the partition: start at the smallest, the row
    comes; a v1 and a v2 token for the same partition: INVALID_ARGUMENT.
Exit 0 when all hold, 1 otherwise."""
import os, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hostile'))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cslib import *
from csconsumer import Checks
from sec_attack import grpc_status

port, d = int(sys.argv[1]), sys.argv[2]
T = 'ft%d' % (now_us() % 100000)
PROFILE = 'p' + T
checks = Checks()
expect = checks.expect


def read(tokens, end_us):
    c = Conn(port, timeout=20)
    sid = c.headers(BT + 'ReadChangeStream')
    c.data_fc(sid, grpc_msg(cs_req(T, partition=rng(), tokens=tokens, end_us=end_us, profile=PROFILE)))
    data, hdrs, why = c.wait_end(sid, 20)
    c.s.close()
    st = grpc_status(data, hdrs, why)
    ev = decode(data)
    return [e for e in ev if e[0] == 'rec'], ('0' if st == 'end' else st, repr(hdrs)), why, ev


def code(st):
    return st[0]


def has(got, row):
    return any(e[1] == row.encode() for e in got)


print('profile', create_profile(port, PROFILE, 'east')[1:])
print('create', create_cs(port, T)[1:])
t0 = now_us()
time.sleep(0.05)
print('write', mutate(port, T, 'a', [set_cell('cf', 'q', 'first')], profile=PROFILE)[1:])
time.sleep(0.05)
w = now_us()
time.sleep(0.3)
end = now_us()
for c, comes in ((2, True), (99, True), (0, True), (4294967295, True), (1, False)):
    got, st, why, ev = read([(rng(), '2.%d.%d.%d' % (c, t0, w))], end)
    expect('C=%d: status OK, the row %s' % (c, 'comes' if comes else 'does not come (starts at W)'),
           code(st) == '0' and has(got, 'a') == comes, '%s %s %d records' % (st[0], why, len(got)))
got, st, why, ev = read([(rng(), '2.2.0.%d' % w)], end)
expect('Y=0: the row comes', code(st) == '0' and has(got, 'a'), '%s %d records' % (st[0], len(got)))
for bad in ('2.2.%d.%d' % (w + 1, w), '2.4294967296.%d.%d' % (t0, w), '2.02.%d.%d' % (t0, w),
            '2.2.-1.%d' % w, '2.2.%d.%d.' % (t0, w)):
    got, st, why, ev = read([(rng(), bad)], end)
    expect('%s: INVALID_ARGUMENT' % bad[:30], code(st) == '3', '%s' % (st[0],))
got, st, why, ev = read([(rng(None, 'm'), '1.%d' % w), (rng('m', None), '2.2.%d.%d' % (t0, w))], end)
expect('v1 [, m) + v2 [m, ): the row comes', code(st) == '0' and has(got, 'a'), '%s %d' % (st[0], len(got)))
got, st, why, ev = read([(rng(), '1.%d' % w), (rng(), '2.2.%d.%d' % (t0, w))], end)
expect('v1 and v2 for the same partition: INVALID_ARGUMENT', code(st) == '3', '%s' % (st[0],))
huge = '2.4294967295.9223372036854775807.9223372036854775807'
t2 = now_us()
got_late = []
import threading
def late_write():
    time.sleep(0.5)
    print('write', mutate(port, T, 'b', [set_cell('cf', 'q', 'late')], profile=PROFILE)[1:])
th = threading.Thread(target=late_write); th.start()
got, st, why, ev = read([(rng(), huge)], t2 + 1500000)
th.join()
expect('largest W and Y: the stream starts, a later row comes', code(st) == '0' and has(got, 'b'),
       '%s %s %d records' % (st[0], why, len(got)))
checks.exit()
