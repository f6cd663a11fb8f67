#!/usr/bin/env python3
"""move_full.py CASE NODE_BIN ROUTER_BIN DIR — a move during which a disk fills up, on a
cluster of two nodes (A: node 1, B: node 2) behind a router with the balancer off; the full disk
is a small tmpfs the caller mounted at DIR/b (CASE target) or DIR/a (CASE source)
(docs/cluster.md, Moves, "A drop that fails").

target: A's tablet (~6 MB, two CopyRows batches) is moved to B, A waiting 2 s between batches
(STRATA_TEST_MOVE=batch_ms); meanwhile B's disk is filled up: the copy fails, and so does the
drop of B's partial copy (its manifest cannot be written). The space comes back, the
tablet is moved to B again (a new copy under a new id) and B is restarted. B must list one tablet
of the table, and every acknowledged row must be read through the router, new writes too.
Before, B forgot the partial copy when its drop failed; after the restart storage's copy came
back as an ordinary tablet over the same range as the real one, and B served the empty copy:
reads answered OK without the rows, writes went into the dead copy.

source: A holds its move 3 s between the copy and the activation (STRATA_TEST_MOVE=hold_ms);
meanwhile A's disk is filled up to one page, so its DATA/outgoing line can be written but not the
manifest dropping its tablet once B activated the copy. A is killed, the space comes back, A
restarts: it must not serve its old tablet (it lists none of the table), every row is read, new
writes too. Before, A forgot the tablet and its DATA/outgoing line, and after the restart served
the old copy of a range B now owned.
"""
import os, signal, subprocess, sys, threading, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cslib import *
from moverig import Rig

case, node_bin, router_bin, d = sys.argv[1:5]
rig = Rig(node_bin, router_bin, d)
procs, bad = rig.procs, rig.bad
expect, wait_listen, start_node, stop = rig.expect, rig.wait_listen, rig.start_node, rig.stop
# Rows of VALUE bytes: ~6 MB on A for target (more than one CopyRows batch of 4 MiB); for
# source, less than the tmpfs's 30 MiB so that the log fits.
N = 1500 if case == 'target' else 200
VALUE = 4000


def log_of(name):
    return open(os.path.join(d, name + '.log'), errors='replace').read()


def node_move(src, dst, tid):
    data, st, why = call(src, '/strata.internal.v1.Node/MoveTablet',
                         fld(1, tid) + fld(2, '127.0.0.1:%d' % dst), limit=120)
    return why == 'end' and (st or 0) == 0 and len(data) > 5, st, why


def load(table, first, n, prefix='r'):
    value = 'x' * VALUE
    for b in range(first, first + n, 100):
        body = fld(1, tname(table)) + b''.join(
            fld(2, fld(1, '%s%05d' % (prefix, j)) + fld(2, set_cell('cf', 'q', value)))
            for j in range(b, min(first + n, b + 100)))
        data, st, why = call(R, BT + 'MutateRows', body)
        if why != 'end' or st:
            sys.exit('FAIL: loading %s: %s %s' % (table, why, st))


def on_a(table):
    """The table's only tablet, moved onto A if the router put it on B."""
    for _ in range(3):
        h = [(n, t) for n, p in (('a', A), ('b', B)) for t in tablets_on(p, table)]
        if len(h) == 1 and h[0][0] == 'a':
            return h[0][1][0]
        if len(h) == 1:
            node_move(B, A, h[0][1][0])
        time.sleep(0.2)
    sys.exit('FAIL: the tablet of %s is not on A' % table)


A = start_node('a', 1, faults='batch_ms=2000' if case == 'target' else 'hold_ms=3000')
B = start_node('b', 2)
R = rig.start_router(A, B)
keys = rig.keys


def fill(node, leave):
    """Fills node's tmpfs up to leave bytes: the filler's path."""
    path = os.path.join(d, node, 'filler')
    with open(path, 'wb') as f:
        st = os.statvfs(os.path.join(d, node))
        os.posix_fallocate(f.fileno(), 0, st.f_bavail * st.f_frsize - leave)
    return path


def move_while(fill_node, leave):
    """Moves A's tablet to B, filling fill_node's disk once B's copy exists: the move's answer."""
    res = {}
    th = threading.Thread(target=lambda: res.update(r=node_move(A, B, tid)))
    th.start()
    for _ in range(500):
        if tablets_on(B, T, incoming=True):
            break
        time.sleep(0.01)
    time.sleep(0.5)
    path = fill(fill_node, leave)
    th.join()
    return res['r'], path


def all_rows_read(extra=0):
    k = keys(T)
    expect('every acknowledged row is read after the restart',
           k is not None and len(k) == N + extra,
           '%s rows of %d' % (len(k) if k is not None else k, N + extra))


def target_case():
    global B
    # The first batch is copied, the second one waits 2 s: B's disk fills up meanwhile.
    (ok, st, why), filler = move_while('b', 0)
    expect('the move to the full disk fails', not ok, (st, why))
    time.sleep(0.5)  # A's DropTablet of the partial copy
    expect('setup: the partial copy could not be dropped (its manifest)',
           'could not drop the partial copy' in log_of('a'), '')
    os.unlink(filler)
    for _ in range(100):  # the failed drop is retried once space is back (1 s, then 2 s, ...)
        if 'a retry of its failed drop' in log_of('b'):
            break
        time.sleep(0.1)
    expect('B dropped the partial copy once space was back',
           'a retry of its failed drop' in log_of('b'))
    ok, st, why = node_move(A, B, tid)
    expect('the move succeeds with space back', ok, (st, why))

    stop('b')
    B = start_node('b', 2, port=B)
    listed = tablets_on(B, T, incoming=True)
    expect('B lists one tablet of the table after its restart', len(listed) == 1, listed)
    all_rows_read()
    load(T, 0, 10, prefix='n')
    all_rows_read(10)


def source_case():
    global A
    # The copy is done and A holds the move 3 s: A's disk fills up to one page meanwhile.
    (ok, st, why), filler = move_while('a', 4096)
    expect('the move answers OK (B activated its copy)', ok, (st, why))
    expect('setup: A could not drop its tablet (its manifest)',
           'copied but not dropped here' in log_of('a'))
    expect('A no longer lists the tablet', not tablets_on(A, T, incoming=True))
    stop('a', signal.SIGKILL)
    os.unlink(filler)
    A = start_node('a', 1, port=A)
    expect('A, restarted, serves none of the moved range', not tablets_on(A, T, incoming=True),
           tablets_on(A, T, incoming=True))
    all_rows_read()
    load(T, 0, 10, prefix='n')
    all_rows_read(10)


try:
    T = 'full%d' % (now_us() % 100000)
    expect('create', create_cs(R, T, retention=0)[2] == 'end')
    load(T, 0, N)
    tid = on_a(T)
    target_case() if case == 'target' else source_case()
finally:
    for name in list(procs):
        stop(name)
sys.exit(1 if bad else 0)
