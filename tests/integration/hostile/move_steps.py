#!/usr/bin/env python3
"""move_steps.py CASE NODE_BIN ROUTER_BIN DIR — a tablet move stopped at one exact step, on a cluster
of two nodes (A: node 1, B: node 2) behind a router with the balancer off. The step is reached
through the nodes' test-only fault settings (STRATA_TEST_MOVE, node/node_internal.h). CASE:

drop       A holds each move 4 s between the end of the copy and the activation. A DropRowRange
           sent to B meanwhile (B holds only the incoming copy) must not delete the copy's rows
           (streams on and off); one sent through the router meanwhile must succeed and drop every
           row once the move completed, while rows written after it returned stay.
activated  A kills itself (SIGKILL) after B activated its copy, before A drops its own tablet; A
           restarted: one node serves the range, every row is read, writes work.
created    B kills itself after creating the incoming copy in storage, before answering; B
           restarted must not serve the leftover copy, and the range can be moved there again.
activating B kills itself on receiving the activation, before it; answering: after it (durable),
answering  before the answer. The move fails at once; A's tablet takes no write until B is back
           and A learned from it what became of the copy: one node serves the range afterwards
           (A with activating, B with answering), every row is read, writes work.
idle       A is killed with kill -9 while it holds the move (its copy on B incoming); B must drop
           the abandoned copy once it has been idle for incoming_idle_ms (2 s here).
family     A waits 3 s between copy batches; family g is dropped through the router while the
           move is half-way: B's purge must also cover the rows copied after it (it waits for
           the move to end and purges again), so g created anew is empty on every row.
"""
import os, signal, subprocess, sys, threading, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cslib import *
from moverig import Rig

case, node_bin, router_bin, d = sys.argv[1:5]
rig = Rig(node_bin, router_bin, d)
procs, bad = rig.procs, rig.bad
expect, wait_listen, start_node, stop = rig.expect, rig.wait_listen, rig.start_node, rig.stop


FAULTS = {'drop': ('hold_ms=4000', ''), 'activated': ('kill=activated', ''),
          'created': ('', 'kill=created'), 'activating': ('', 'kill=activating'),
          'answering': ('', 'kill=answering'), 'idle': ('hold_ms=20000', 'incoming_idle_ms=2000'),
          'family': ('batch_ms=3000', '')}
fa, fb = FAULTS[case]
A = start_node('a', 1, faults=fa)
B = start_node('b', 2, faults=fb)
R = rig.start_router(A, B)
keys = rig.keys


def node_move(src, dst, tid, limit=60):
    data, st, why = call(src, '/strata.internal.v1.Node/MoveTablet',
                         fld(1, tid) + fld(2, '127.0.0.1:%d' % dst), limit=limit)
    return why == 'end' and (st or 0) == 0 and len(data) > 5, st, why


def moving_on(port, table):
    data, st, why = call(port, '/strata.internal.v1.Node/ListTablets', fld(1, tname(table)), limit=10)
    return any(dict((a, b) for a, _, b in fields(v)).get(8)
               for m in msgs(data) for f, _, v in fields(m) if f == 1)


def held(table):
    return [(n, t) for n, p in (('a', A), ('b', B)) for t in tablets_on(p, table)]


def to_a(table):
    """The table's only tablet onto A (the router may have put it on B)."""
    for _ in range(3):
        h = held(table)
        if len(h) == 1 and h[0][0] == 'a':
            return h[0][1][0]
        if len(h) == 1:
            print('to A:', node_move(B, A, h[0][1][0]))
        time.sleep(0.2)
    sys.exit('FAIL: the tablet of %s is not on A: %s' % (table, held(table)))


def load(table, n, prefix='r'):
    for b in range(0, n, 250):
        body = fld(1, tname(table)) + b''.join(
            fld(2, fld(1, '%s%05d' % (prefix, j)) + fld(2, set_cell('cf', 'q', 'v%d' % j)))
            for j in range(b, min(n, b + 250)))
        data, st, why = call(R, BT + 'MutateRows', body)
        if why != 'end' or st:
            sys.exit('FAIL: loading %s: %s %s' % (table, why, st))


def drop_all(port, table):
    data, st, why = call(port, ADMIN + 'DropRowRange', fld(1, tname(table)) + fld(3, 1), limit=60)
    return why == 'end' and not st, st


def start_move(src, dst, tid, res):
    th = threading.Thread(target=lambda: res.update(r=node_move(src, dst, tid)))
    th.start()
    for _ in range(500):
        if tablets_on(dst, T, incoming=True):
            break
        time.sleep(0.01)
    return th


def table_on_a():
    """Table T (streams on) with N rows, its one tablet on A: the tablet's id."""
    expect('create', create_cs(R, T)[2] == 'end')
    load(T, N)
    return to_a(T)


def restarted_counts(who_serves):
    """After the restarts: who_serves alone lists the range, and every row (N + 10) is read."""
    h = held(T)
    expect('one node serves the range', len(h) == 1 and h[0][0] == who_serves, h)
    load(T, 10, prefix='n')
    k = keys(T)
    expect('every row is read', k is not None and len(k) == N + 10,
           '%s rows' % (len(k) if k is not None else k))


N = 500
T = 'ms%s%d' % (case, now_us() % 100000)
if case == 'drop':
    for table, retention in ((T + 'cs', 86400), (T + 'plain', 0)):
        T = table
        expect('create ' + T, create_cs(R, T, retention=retention)[2] == 'end')
        load(T, N)
        tid = to_a(T)
        res = {}
        th = start_move(A, B, tid, res)
        time.sleep(1.0)  # the copy of 500 small rows is done: the move holds before activating
        ok, st = drop_all(B, T)
        print('DropRowRange on B while it holds the incoming copy only: %s %s' % (ok, st))
        th.join()
        expect('%s: the move succeeded' % T, res['r'][0], res['r'])
        k = keys(T)
        expect('%s: a drop sent to B before it owned the range left the rows' % T,
               k is not None and len(k) == N, '%s rows' % (len(k) if k is not None else k))
    # Through the router, while the range moves (streams on: node-side deletes).
    T = T[:-len('plain')] + 'cs'
    tid = to_a(T)
    res, dres = {}, {}
    th = start_move(A, B, tid, res)
    time.sleep(0.5)
    t0 = time.time()
    ok, st = drop_all(R, T)
    print('DropRowRange through the router during the move: %s %s in %.1fs' % (ok, st, time.time() - t0))
    th.join()
    expect('the drop through the router succeeded', ok, st)
    expect('the move succeeded', res['r'][0], res['r'])
    load(T, 10, prefix='n')
    k = keys(T)
    expect('only the rows written after the drop remain',
           k is not None and sorted(k) == ['n%05d' % i for i in range(10)],
           '%s rows, first %s' % (len(k) if k is not None else k, (k or [])[:3]))
    # Sent to A while the move holds, and the move then fails (B killed): A waits for the move's
    # end, gets the tablet back and drops its rows.
    load(T, 100, prefix='m')
    tid = to_a(T)
    res = {}
    th = start_move(A, B, tid, res)
    time.sleep(0.5)
    dth = threading.Thread(target=lambda: dres.update(r=drop_all(A, T)))
    dth.start()
    time.sleep(0.5)
    stop('b', signal.SIGKILL)
    th.join()
    dth.join()
    expect('the move failed with the target killed', not res['r'][0], res['r'])
    expect('the drop sent to the source succeeded', dres['r'][0], dres['r'])
    B = start_node('b', 2, port=B)
    k = keys(T)
    expect('the source dropped the rows of the tablet it kept', k == [], '%s rows' % (len(k) if k is not None else k))
elif case == 'activated':
    tid = table_on_a()
    print('move:', node_move(A, B, tid, limit=30))
    procs.pop('a').wait(30)  # it killed itself after the activation
    A = start_node('a', 1, port=A)
    time.sleep(3)
    expect('the restarted source learned of the activation and dropped its tablet',
           'was activated; dropped here' in open(os.path.join(d, 'a.log')).read())
    restarted_counts('b')
elif case == 'created':
    tid = table_on_a()
    print('move:', node_move(A, B, tid, limit=30))
    procs.pop('b').wait(30)  # it killed itself after creating the copy
    B = start_node('b', 2, port=B)
    time.sleep(1)
    expect('it keeps no copy at all', not tablets_on(B, T, incoming=True), tablets_on(B, T, True))
    restarted_counts('a')
    expect('the range moves there again', node_move(A, B, tid)[0])
elif case in ('activating', 'answering'):
    tid = table_on_a()
    print('move:', node_move(A, B, tid, limit=30))
    procs.pop('b').wait(30)  # it killed itself on the activation
    time.sleep(1)
    expect('A keeps its tablet moving (no writes) while B cannot say what became of the copy',
           moving_on(A, T))
    B = start_node('b', 2, port=B)
    time.sleep(3)
    restarted_counts('a' if case == 'activating' else 'b')
elif case == 'idle':
    tid = table_on_a()
    res = {}
    th = start_move(A, B, tid, res)
    time.sleep(0.5)
    expect('B holds an incoming copy', tablets_on(B, T, incoming=True))
    stop('a', signal.SIGKILL)
    th.join()
    for _ in range(100):
        if not tablets_on(B, T, incoming=True):
            break
        time.sleep(0.1)
    expect('B dropped the abandoned copy', not tablets_on(B, T, incoming=True),
           tablets_on(B, T, True))
    A = start_node('a', 1, port=A)
    time.sleep(1)
    k = keys(T)
    expect('every row is read', k is not None and len(k) == N,
           '%s rows' % (len(k) if k is not None else k))
elif case == 'family':
    F = 6000  # two cells a row: two copy batches of at most 10,000 cells
    expect('create', create_cs(R, T, families=('cf', 'g'), retention=0)[2] == 'end')
    for b in range(0, F, 250):
        body = fld(1, tname(T)) + b''.join(
            fld(2, fld(1, 'r%05d' % j) + fld(2, set_cell('cf', 'q', 'v')) + fld(2, set_cell('g', 'q', 'w')))
            for j in range(b, min(F, b + 250)))
        data, st, why = call(R, BT + 'MutateRows', body)
        if why != 'end' or st:
            sys.exit('FAIL: loading: %s %s' % (why, st))
    tid = to_a(T)
    res = {}
    th = start_move(A, B, tid, res)
    time.sleep(1.0)  # the first batch is on B; A waits 3 s before the second
    drop_g = fld(1, tname(T)) + fld(2, fld(1, 'g') + fld(4, 1))
    data, st, why = call(R, ADMIN + 'ModifyColumnFamilies', drop_g, limit=60)
    expect('family g dropped during the move', why == 'end' and not st, (why, st))
    th.join()
    expect('the move succeeded', res['r'][0], res['r'])
    add_g = fld(1, tname(T)) + fld(2, fld(1, 'g') + fld(2, b''))
    data, st, why = call(R, ADMIN + 'ModifyColumnFamilies', add_g, limit=60)
    expect('family g created again', why == 'end' and not st, (why, st))
    for fam, want in (('cf', F), ('g', 0)):
        body = fld(1, tname(T)) + fld(3, fld(5, fam))  # filter: family_name_regex_filter
        data, st, why = call(R, BT + 'ReadRows', body, limit=60)
        n = sum(1 for m in msgs(data) for f, _, v in fields(m) if f == 1)
        expect('%d cells of family %s' % (want, fam), why == 'end' and not st and n == want,
               '%s chunks (%s %s)' % (n, why, st))
    k = keys(T)
    expect('every row is read', k is not None and len(k) == F, '%s rows' % (len(k) if k is not None else k))
for name in list(procs):
    stop(name)
print('FAIL' if bad else 'PASS')
sys.exit(1 if bad else 0)
