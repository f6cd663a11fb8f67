#!/usr/bin/env python3
"""move_peer.py CASE STRATA DIR PORT — tablet moves while a peer cluster has not received the
tablet's writes, on an instance of two clusters (east, west) of two nodes each (`strata up`
in DIR, router on PORT). Rows are written straight to the node holding the table's tablet, and
moves are MoveTablet calls to it (stdlib only). CASE:

lag   (nodes started with STRATA_TEST_MOVE=hold_ms=1500: each move holds 1.5 s after its copy)
      1. Both clusters take rows while cut from each other, then both move the table's tablet
         at once, and the link heals while the moves hold: each moving tablet refuses the
         other cluster's replicated writes, so a move that waits for its peers to have the
         tablet's writes waits for the other move. Both moves must succeed (they used to wait
         10 s, holding writes, and fail UNAVAILABLE), and every row must reach both clusters.
      2. The same while the link stays cut, then both clusters killed (-9) and restarted before
         the heal: the rows the moved tablets left unshipped must still reach the peer.
tomb  West writes rows r1..r4 while cut from east; east then deletes r1 (DeleteFromRow), r2's
      family (DeleteFromFamily) and r3's column (DeleteFromColumn), later than west's writes,
      and moves its tablet; the link heals. West's writes reach east's moved tablet after the
      move: the deletes must still cover them there, as they do on west. Both clusters must end
      with r4 only (the move used to copy visible cells only, so east showed r1..r3 forever).
"""
import os, subprocess, sys, threading, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cslib import ADMIN, INST, call, create_cs, fields, fld, msgs, mutate, row_keys, set_cell, \
    tablets_on, tname, topology_nodes

case, strata, d, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
NODES = topology_nodes(d)
CLUSTERS = {c: [(n, p) for n, p in NODES if n.startswith(c + '-')] for c in ('east', 'west')}
bad = []


def expect(what, ok, detail=''):
    print('%s: %s %s' % ('ok' if ok else 'FAIL', what, detail), flush=True)
    if not ok:
        bad.append(what)


def chaos(*args):
    r = subprocess.run([strata, 'chaos'] + list(args) + ['--dir', d], capture_output=True, text=True,
                       timeout=120)
    if r.returncode != 0:
        sys.exit('FAIL: strata chaos %s: %s %s' % (' '.join(args), r.stdout, r.stderr))


def owner(cluster, table):
    """(name, port, tablet id) of the node of cluster holding table's only tablet."""
    for _ in range(100):
        held = [(n, p, t[0]) for n, p in CLUSTERS[cluster] for t in tablets_on(p, table)]
        if len(held) == 1:
            return held[0]
        time.sleep(0.1)
    sys.exit('FAIL: %s does not hold one tablet of %s' % (cluster, table))


def ok_call(res, what):
    data, st, why = res
    if why != 'end' or st not in ([], ['0']):
        sys.exit('FAIL: %s: %s %s' % (what, why, st))
    return data


def write(cluster, table, keys):
    n, p, _ = owner(cluster, table)
    for k in keys:
        ok_call(mutate(p, table, k, [set_cell('cf', 'q', 'v' + k)]), 'write %s on %s' % (k, n))


def delete(cluster, table, key, mut):
    n, p, _ = owner(cluster, table)
    ok_call(mutate(p, table, key, [mut]), 'delete in %s on %s' % (key, n))


def move(cluster, table, out):
    """Moves table's tablet to the other node of cluster; out[cluster] = (ok, status, seconds)."""
    n, p, tid = owner(cluster, table)
    other = [q for m, q in CLUSTERS[cluster] if m != n][0]
    t0 = time.time()
    data, st, why = call(p, '/strata.internal.v1.Node/MoveTablet',
                         fld(1, tid) + fld(2, '127.0.0.1:%d' % other), limit=60)
    out[cluster] = (why == 'end' and st in ([], ['0']) and len(data) > 5, (why, st), time.time() - t0)


def move_both(table, heal_after_s=None):
    out = {}
    th = [threading.Thread(target=move, args=(c, table, out)) for c in CLUSTERS]
    for t in th:
        t.start()
    if heal_after_s is not None:
        time.sleep(heal_after_s)
        chaos('heal')
    for t in th:
        t.join()
    for c in CLUSTERS:
        expect('move in %s' % c, out[c][0], 'status %s after %.1f s' % (out[c][1], out[c][2]))


def consistent(table):
    d1, _, why = call(port, ADMIN + 'GenerateConsistencyToken', fld(1, tname(table)))
    tok = [v for m in msgs(d1) for n, _, v in fields(m) if n == 1]
    if why != 'end' or not tok:
        return False
    d2, _, why = call(port, ADMIN + 'CheckConsistency', fld(1, tname(table)) + fld(2, tok[0]))
    return why == 'end' and any(n == 1 and v for m in msgs(d2) for n, _, v in fields(m))


def rows(cluster, table):
    n, p, _ = owner(cluster, table)
    keys, why = row_keys(p, table)
    return sorted(keys) if why == 'end' else None


def converge(table, want):
    """Waits (bounded) for a consistent answer and both clusters holding want; checks it."""
    for _ in range(300):
        if consistent(table) and all(rows(c, table) == want for c in CLUSTERS):
            break
        time.sleep(0.2)
    for c in CLUSTERS:
        got = rows(c, table)
        expect('%s holds %d rows' % (c, len(want)), got == want,
               '' if got == want else 'got %s' % got)


def create(table):
    ok_call(create_cs(port, table, retention=0), 'create ' + table)
    for c in CLUSTERS:
        owner(c, table)


if case == 'lag':
    create('m')
    chaos('partition', 'east', 'west')
    write('east', 'm', ['e%02d' % i for i in range(20)])
    write('west', 'm', ['w%02d' % i for i in range(20)])
    print('== 1. both clusters move the tablet, the link heals during the moves', flush=True)
    move_both('m', heal_after_s=0.5)
    want = sorted(['e%02d' % i for i in range(20)] + ['w%02d' % i for i in range(20)])
    converge('m', want)
    print('== 2. both clusters move it back while cut, are killed (-9) and restarted', flush=True)
    chaos('partition', 'east', 'west')
    write('east', 'm', ['f%02d' % i for i in range(20)])
    write('west', 'm', ['x%02d' % i for i in range(20)])
    move_both('m')
    for c in CLUSTERS:
        chaos('kill-cluster', c)
        chaos('restart-cluster', c)
    chaos('heal')
    want = sorted(want + ['f%02d' % i for i in range(20)] + ['x%02d' % i for i in range(20)])
    converge('m', want)
elif case == 'tomb':
    create('t')
    chaos('partition', 'east', 'west')
    write('west', 't', ['r1', 'r2', 'r3', 'r4'])
    time.sleep(0.05)  # east's deletes commit later than west's writes
    delete('east', 't', 'r1', fld(4, b''))
    delete('east', 't', 'r2', fld(3, fld(1, 'cf')))
    delete('east', 't', 'r3', fld(2, fld(1, 'cf') + fld(2, 'q')))
    out = {}
    move('east', 't', out)
    expect('move in east', out['east'][0], 'status %s' % (out['east'][1],))
    chaos('heal')
    converge('t', ['r4'])
else:
    sys.exit('unknown case ' + case)

if bad:
    sys.exit('FAIL: %s' % ', '.join(bad))
print('PASS')
