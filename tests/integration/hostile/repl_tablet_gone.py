"""repl_tablet_gone.py — tablet ids that vanish while a peer cluster lags (stdlib only).
Usage: repl_tablet_gone.py NODE_PORT write T PREFIX N | split T KEY
  write: N rows PREFIX%04d (cf:q = v) straight to the node, each acknowledged;
  split: splits the node's tablet of table T holding KEY at KEY (strata.internal.v1.Node)."""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cslib import call, fields, fld, msgs, mutate, set_cell, tname
from h2raw import Conn

NODE = '/strata.internal.v1.Node/'


def ok(res):
    data, st, why = res
    assert why == 'end' and st in ([], ['0']), (st, why)
    return data


def write(port, t, prefix, n):
    c = Conn(port, timeout=30)
    for i in range(n):
        ok(mutate(port, t, '%s%04d' % (prefix, i), [set_cell('cf', 'q', 'v')], conn=c))


def split(port, t, key):
    data = ok(call(port, NODE + 'ListTablets', fld(1, tname(t))))
    for m in msgs(data):
        for num, _, tab in fields(m):
            if num != 1:
                continue
            f = {k: v for k, _, v in fields(tab)}
            start, end = f.get(3, b''), f.get(4, b'')
            if start < key.encode() and (not end or key.encode() < end):
                ok(call(port, NODE + 'SplitTablet', fld(1, f[1]) + fld(2, key)))
                return
    raise SystemExit('no tablet of %s holds %s' % (t, key))


port, what = int(sys.argv[1]), sys.argv[2]
if what == 'write':
    write(port, sys.argv[3], sys.argv[4], int(sys.argv[5]))
else:
    split(port, sys.argv[3], sys.argv[4])
