#!/usr/bin/env python3
"""cs_hostile4.py — change stream records at the API's limits, through the router of `strata up
--clusters 2 --nodes 1` (cs_hostile4_test.sh), on top of hostile/cslib.py. Prints "ok: WHAT" or
"FAIL: WHAT ..."; exit status 1 when a case failed.

  cs_hostile4.py limits PORT DIR STRATA
      a MutateRow of 100,000 mutations (the API's limit) on a table with change streams on and
      five families: 100,000 SetCells, and a DeleteFromRow with 99,999 SetCells. Both are
      accepted as on a table without streams (they were INVALID_ARGUMENT: the row's record cell
      made 100,001 mutations, and the DeleteFromRow's five DeleteFromFamily more), and each
      record holds them all (the DeleteFromRow as one DeleteFromFamily per family): live on
      east, on west, and from storage after kill -9 and a restart of east's node.
  cs_hostile4.py bigrow PORT DIR STRATA
      a MutateRow of 257 SetCells of about 540 KB (139 MB) on a table with change streams on:
      accepted as without streams (it was INVALID_ARGUMENT: a row mutation of more than 256
      mutations kept every value in its record, and the row with its record passed the log
      record's 256 MiB), and a row of 300 small SetCells with a column written twice and a
      family deleted after its cells (values that must stay in the record): every value comes
      back whole, live on east, on west, and from storage after kill -9 of east's node.
  cs_hostile4.py manyrefs PORT DIR STRATA
      256 writes of 256 cells of 64 bytes to one row (65,536 values by reference), then a
      catch-up read from storage after kill -9 of east's node: every record with every value.
      The reader compared each of the row's cells with every reference it held (4 billion
      comparisons in one turn): the node answered nothing for seconds, the router dropped its
      link (no answer to a keepalive PING within 3 s) and the stream ended UNAVAILABLE with
      nothing delivered, at every retry.
  cs_hostile4.py order PORT DIR STRATA
      4 writers, each writing one row 48 times through a single-cluster profile, values of 1.5 MB
      and 10 bytes alternating, each write acknowledged before the next: the second cluster's
      stream gives each row's records in the order written. A shipper keeps several batches in
      flight, and a small batch sent after a large one reached the peer node first and was
      applied first, so two writes of a row came out of that cluster's stream swapped.
  cs_hostile4.py starts PORT DIR STRATA
      a start_time in the future or 2 days ago is INVALID_ARGUMENT for one tablet and for a
      partition over two (not a CloseStream at that time); the start 2 days ago names as the
      oldest change the time streams were turned on (it named now minus the retention, and a
      retry just after that was refused again), and a start just after the bound named is read;
      a retention_period that is not a valid Duration is refused as such.
  cs_hostile4.py mirror PORT DIR STRATA [SEED [WRITES]]
      random writes of every kind (MutateRow, MutateRows, both branches of CheckAndMutateRow,
      ReadModifyWriteRow; SetCells with server and fixed timestamps, values from 0 bytes to
      300 KB, every delete shape; binary row keys and empty qualifiers) to a table with change
      streams on; its stream, applied as MutateRows to a table without streams, must leave both
      reading the same cells (every version, every value): read live, then from storage after
      kill -9 of the node (values by reference) into an emptied copy.
"""
import calendar, random, re
import os, socket, subprocess, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hostile'))
from cslib import *
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cs_attack import rcall  # one call on a new connection: (bytes, grpc-status, end reason)

failed = []
FAMS = ('cf', 'f2', 'f3', 'f4', 'f5')
CHUNK = 256 << 10  # the largest value chunk a DataChange carries


def expect(what, ok, detail=''):
    print(('ok: %s %s' % (what, detail)) if ok else 'FAIL: %s %s' % (what, detail))
    if not ok: failed.append(what)


def profile(port, name, cluster):
    body = (fld(1, INST) + fld(2, name) + fld(3, fld(6, fld(1, cluster))) + fld(4, 1))
    return rcall(port, '/google.bigtable.admin.v2.BigtableInstanceAdmin/CreateAppProfile', body)[1]


def replayed(seen, rec):
    """Whether rec repeats a record of its row already read: a peer cluster records a replicated
    write again when its batch was sent again after being applied (the link dropped before the
    answer, e.g. the peer busy for more than the 3 s keepalive with a row of 139 MB under
    AddressSanitizer). Delivery is at least once (docs/changestreams.md, Guarantees); each row
    here is written once per record, so an identical record is such a repeat."""
    key = (rec[1], tuple(rec[5]))
    if key in seen:
        return True
    seen.add(key)
    return False


def records(port, table, start, prof):
    """{row: {kind: count}, ...} of the records of table from start to now through prof."""
    data, st, _ = rcall(port, BT + 'ReadChangeStream',
                     cs_req(table, partition=rng(), start_us=start, end_us=now_us(), profile=prof), limit=120)
    out, seen = {}, set()
    for e in decode(data):
        if e[0] == 'rec' and not replayed(seen, e):
            kinds = {}
            for c in e[5]:
                k = c[0] if c[0] != 'delfam' else 'delfam:' + c[1].decode()
                kinds[k] = kinds.get(k, 0) + 1
            out.setdefault(e[1].decode(), []).append(kinds)
    return out, st


def check_everywhere(port, d, strata, read, want):
    """read(profile) -> (result, status) compared with want: live on east, on west, and from
    storage on east after kill -9 and a restart of its node."""
    for where, prof in (('live on east', 'oneast'), ('on west', 'onwest'), ('from storage on east', 'oneast')):
        if where == 'on west':
            time.sleep(3)  # replication
        if where.startswith('from storage'):
            restart(d, strata, 'east-0', port)
        for _ in range(40):
            got, st = read(prof)
            if st == '0' and len(got) == len(want): break
            time.sleep(0.5)
        expect('records %s' % where, got == want,
               'differ: %s' % [(r, [x for x in got.get(r, []) if x not in w][:4]) for r, w in want.items()])


def write(port, body, limit=60):
    """A MutateRow with fixed timestamps, retried on UNAVAILABLE as the official clients do: a
    node busy for a second with a row of 100 MB is marked down by the router's health probe
    until it answers again, and the call meant for it ends UNAVAILABLE meanwhile."""
    for _ in range(30):
        st = rcall(port, BT + 'MutateRow', body, limit=limit)[1]
        if st != '14':
            return st
        time.sleep(0.5)
    return st


def restart(d, strata, name, port):
    """kill -9 of node name, strata up again, and back once the router reads through it."""
    subprocess.run(['kill', '-9', open(os.path.join(d, 'run', name + '.pid')).read().strip()])
    subprocess.run([strata, 'up', '--dir', d], capture_output=True)
    for _ in range(60):
        if rcall(port, BT + 'ReadRows', fld(1, tname('ready')) + fld(4, 1), limit=10)[1] == '0':
            return
        time.sleep(0.5)


def limits(port, d, strata):
    for name, cluster in (('oneast', 'east'), ('onwest', 'west')):
        expect('profile ' + name, profile(port, name, cluster) in ('0', '6'))  # or ALREADY_EXISTS
    t_on, t_off = 'lim_on', 'lim_off'
    for t, ret in ((t_on, 86400), (t_off, 0)):
        expect('create ' + t, create_cs(port, t, families=FAMS, retention=ret)[2] == 'end')
    rows = {'full': [set_cell('cf', b'q%d' % i, b'v', 1000) for i in range(100000)],
            'delrow': [fld(4, b'')] + [set_cell('cf', b'q%d' % i, b'v', 1000) for i in range(99999)]}
    want = {'full': [{'set': 100000}],
            'delrow': [dict([('set', 99999)] + [('delfam:' + f, 1) for f in FAMS])]}
    start = now_us()
    for t in (t_off, t_on):
        for row, muts in rows.items():
            body = fld(1, tname(t)) + fld(2, row) + b''.join(fld(3, m) for m in muts)
            st = write(port, body, limit=120)
            expect('MutateRow %s of %d mutations on %s' % (row, len(muts), t), st == '0', 'status ' + st)
    check_everywhere(port, d, strata, lambda prof: records(port, t_on, start, prof), want)


def values(port, table, start, prof):
    """{row: [(family, qualifier, value length), ...]} of the SetCells of table's records."""
    data, st, _ = rcall(port, BT + 'ReadChangeStream',
                     cs_req(table, partition=rng(), start_us=start, end_us=now_us(), profile=prof), limit=180)
    out, seen = {}, set()
    for e in decode(data):
        if e[0] != 'rec' or replayed(seen, e):
            continue
        cells = out.setdefault(e[1].decode(), [])
        for c in e[5]:
            if c[0] != 'set':
                continue
            cell = (c[1].decode(), c[2].decode(), c[4])
            # a value's chunks (256 KiB each but the last) come one after the other
            if cells and cells[-1][:2] == cell[:2] and cells[-1][2] and cells[-1][2] % CHUNK == 0:
                cells[-1] = cell[:2] + (cells[-1][2] + cell[2],)
            else:
                cells.append(cell)
    return out, st


def bigrow(port, d, strata):
    for name, cluster in (('oneast', 'east'), ('onwest', 'west')):
        expect('profile ' + name, profile(port, name, cluster) in ('0', '6'))  # or ALREADY_EXISTS
    t = 'big_on'
    expect('create ' + t, create_cs(port, t, families=('cf', 'f2'))[2] == 'end')
    start = now_us()
    big = [('cf', 'q%d' % i, 540000 + i) for i in range(257)]
    body = fld(1, tname(t)) + fld(2, 'big') + b''.join(
        fld(3, set_cell(f, q.encode(), b'%c' % (65 + n % 26) * n, 1000)) for f, q, n in big)
    st = write(port, body, limit=180)
    expect('MutateRow of 257 cells, %d bytes' % len(body), st == '0', 'status ' + st)
    small = [('cf', 'q%d' % i, 100 + i) for i in range(300)] + [('cf', 'dup', 200), ('cf', 'dup', 300)]
    small += [('f2', 'gone%d' % i, 150 + i) for i in range(3)]
    muts = [set_cell(f, q.encode(), b'v' * n, 1000) for f, q, n in small] + [fld(3, fld(1, 'f2'))]
    st = write(port, fld(1, tname(t)) + fld(2, 'small') + b''.join(fld(3, m) for m in muts))
    expect('MutateRow of 306 mutations', st == '0', 'status ' + st)
    want = {'big': big, 'small': small}
    check_everywhere(port, d, strata, lambda prof: values(port, t, start, prof), want)


def manyrefs(port, d, strata):
    t = 'manyrefs'
    expect('create ' + t, create_cs(port, t)[2] == 'end')
    start = now_us()
    for w in range(256):
        body = fld(1, tname(t)) + fld(2, 'hot') + b''.join(
            fld(3, set_cell('cf', b'q%d-%d' % (w, i), b'v' * 64, 1000)) for i in range(256))
        st = write(port, body)
        if st != '0':
            return expect('write %d of 256 cells' % w, False, 'status ' + st)
    restart(d, strata, 'east-0', port)
    for _ in range(40):  # the router reconnects to the restarted node: UNAVAILABLE until then
        data, st, _ = rcall(port, BT + 'ReadChangeStream',
                            cs_req(t, partition=rng(), start_us=start, end_us=now_us()), limit=120)
        recs = [e for e in decode(data) if e[0] == 'rec']
        if recs or st != '14': break
        time.sleep(0.5)
    full = sum(1 for e in recs for c in e[5] if c[0] == 'set' and c[4] == 64)
    expect('catch-up of 256 records holding 65,536 values by reference', st == '0' and full == 65536,
           'status %s, %d records, %d values of 64 bytes' % (st, len(recs), full))


def mirror_write(port, src, rnd, n):
    rows = [b'r%02d' % i for i in range(12)] + [b'\x00', b'\xff\xfe']
    quals = [b'', b'a', b'b', b'\x00q']

    def val():
        size = rnd.choice([0, 1, 10, 63, 64, 100, 300, 70000, 300000])
        return bytes(rnd.randrange(256) for _ in range(min(size, 64))) * (size // 64) + bytes(size % 64)

    def mut():
        k, f, q = rnd.random(), rnd.choice(('cf', 'f2')), rnd.choice(quals)
        if k < 0.9:
            return set_cell(f, q, val(), rnd.choice([-1, 0, 1000, 2000, 3000, 5000]))
        if k < 0.97:
            a, b = sorted(rnd.sample([0, 1000, 2000, 3000, 5000, 6000], 2))
            r = rnd.choice([b'', fld(1, a) + fld(2, b), fld(1, a), fld(2, b)])
            return fld(2, fld(1, f) + fld(2, q) + (fld(3, r) if r else b''))
        return fld(3, fld(1, f)) if k < 0.995 else fld(4, b'')

    ok = 0
    for _ in range(n):
        r, k = rnd.choice(rows), rnd.random()
        if k < 0.6:
            path, body = 'MutateRow', fld(2, r) + b''.join(fld(3, mut()) for _ in range(rnd.randint(1, 5)))
        elif k < 0.75:
            path, body = 'MutateRows', b''.join(
                fld(2, fld(1, rnd.choice(rows)) + b''.join(fld(2, mut()) for _ in range(rnd.randint(1, 3))))
                for _ in range(rnd.randint(1, 4)))
        elif k < 0.87:
            pred = fld(8, b'cf') if rnd.random() < 0.5 else fld(9, b'a')  # family / qualifier regex
            path, body = 'CheckAndMutateRow', fld(2, r) + fld(6, pred) + b''.join(
                fld(4, mut()) for _ in range(rnd.randint(0, 2))) + b''.join(fld(5, mut()) for _ in range(rnd.randint(0, 2)))
        else:
            op = fld(3, b'xy' * rnd.randint(1, 40)) if rnd.random() < 0.5 else fld(4, rnd.randint(-5, 5))
            path, body = 'ReadModifyWriteRow', fld(2, r) + fld(3, fld(1, rnd.choice(('cf', 'f2'))) + fld(2, rnd.choice(quals)) + op)
        ok += rcall(port, BT + path, fld(1, tname(src)) + body)[1] == '0'
    return ok


def mirror_records(port, table, start, end, prof=None):
    """[(row, [(kind, {field: value}), ...])] of table's stream, chunked values joined."""
    data, st, _ = rcall(port, BT + 'ReadChangeStream',
                        cs_req(table, partition=rng(), start_us=start, end_us=end, profile=prof), limit=120)
    recs, cur, chunk = [], None, None
    for m in msgs(data):
        for num, _, v in fields(m):
            if num != 1:
                continue
            d, mods = {}, []
            for f, _, x in fields(v):
                if f != 6:
                    d[f] = x
                    continue
                ch = dict((a, b) for a, _, b in fields(x))
                kind, _, body = list(fields(ch[2]))[0]
                info = dict((a, b) for a, _, b in fields(ch[1])) if 1 in ch else None
                mods.append((kind, dict((a, b) for a, _, b in fields(body)), info))
            if d.get(1) != 3:  # not CONTINUATION
                cur = (d.get(3), [])
            for kind, body, info in mods:
                if kind == 1 and info is not None:
                    if not info.get(2):
                        chunk = dict(body)
                        chunk[4] = b''
                    chunk[4] += body.get(4, b'')
                    if info.get(3):
                        cur[1].append((1, chunk))
                    continue
                cur[1].append((kind, body))
            if d.get(8):
                recs.append(cur)
    return recs, st


def mirror_apply(port, dst, recs):
    bad = 0
    for row, mods in recs:
        muts = []
        for kind, b in mods:
            if kind == 1:
                muts.append(set_cell(b[1], b.get(2, b''), b.get(4, b''), b.get(3, 0)))
            elif kind == 2:
                r = dict((a, x) for a, _, x in fields(b.get(3, b'')))
                rr = (fld(1, r[1]) if r.get(1) else b'') + (fld(2, r[2]) if r.get(2) else b'')
                muts.append(fld(2, fld(1, b[1]) + fld(2, b.get(2, b'')) + (fld(3, rr) if rr else b'')))
            else:
                muts.append(fld(3, fld(1, b[1])))
        bad += write(port, fld(1, tname(dst)) + fld(2, row) + b''.join(fld(3, m) for m in muts)) != '0'
    return bad


def mirror_cells(port, table):
    """[(row, family, qualifier, timestamp, value length, value hash)] as ReadRows returns them."""
    import hashlib
    data, st, _ = rcall(port, BT + 'ReadRows', fld(1, tname(table)), limit=60)
    cells, row, fam, q, pend = [], None, None, None, None
    for m in msgs(data):
        for num, _, v in fields(m):
            if num != 1:
                continue
            c = dict((f, x) for f, _, x in fields(v))
            row = c.get(1, row)
            fam = dict((a, x) for a, _, x in fields(c[2])).get(1) if 2 in c else fam
            q = dict((a, x) for a, _, x in fields(c[3])).get(1, b'') if 3 in c else q
            if pend is None:
                pend = [row, fam, q, c.get(4, 0), b'']
            pend[4] += c.get(5, b'')
            if not c.get(6):  # the cell's last chunk
                cells.append(tuple(pend[:4]) + (len(pend[4]), hashlib.sha1(pend[4]).hexdigest()))
                pend = None
    return cells


def mirror(port, d, strata, seed=1, n=400):
    rnd = random.Random(seed)
    src, dst = 'mirror%d_src' % seed, 'mirror%d_dst' % seed
    for t, ret in ((src, 86400), (dst, 0)):
        fams = fld(3, fld(1, 'cf') + fld(2, fld(1, fld(1, 3)))) + fld(3, fld(1, 'f2') + fld(2, b''))  # cf: 3 versions
        cfg = fld(8, fld(1, fld(1, ret))) if ret else b''
        expect('create ' + t, rcall(port, ADMIN + 'CreateTable', fld(1, INST) + fld(2, t) + fld(3, fams + cfg))[1] == '0')
    start = now_us()
    ok = mirror_write(port, src, rnd, n)
    end = now_us()
    expect('profile onwest', profile(port, 'onwest', 'west') in ('0', '6'))
    for where, prof in (('live', None), ('on west', 'onwest'), ('from storage', None)):
        if where == 'on west':
            time.sleep(3)  # replication
        if where == 'from storage':
            restart(d, strata, 'east-0', port)
        for _ in range(40 if prof or where != 'live' else 0):  # the copy emptied again
            if rcall(port, ADMIN + 'DropRowRange', fld(1, tname(dst)) + fld(3, 1))[1] == '0': break
            time.sleep(0.5)
        recs, st = mirror_records(port, src, start, now_us() if prof else end, prof)
        bad = mirror_apply(port, dst, recs)
        a, b = mirror_cells(port, src), mirror_cells(port, dst)
        expect('%s: %d of %d writes, %d records applied (%d refused), the copy reads the same %d cells' % (
            where, ok, n, len(recs), bad, len(a)), st == '0' and bad == 0 and a == b,
            'status %s; only in the table: %s; only in the copy: %s' % (
                st, sorted(set(a) - set(b))[:4], sorted(set(b) - set(a))[:4]))

def order(port, d, strata):
    """Writes of one row, each acknowledged before the next, come out of the second cluster's
    stream in the order they were made, when large and small batches alternate on the link."""
    import threading
    for name, cluster in (('oneast', 'east'), ('onwest', 'west')):
        expect('profile ' + name, profile(port, name, cluster) in ('0', '6'))  # or ALREADY_EXISTS
    t, rows, n = 'order_on', ['o%d' % w for w in range(4)], 48
    expect('create ' + t, create_cs(port, t)[2] == 'end')
    start = now_us()
    bad = []

    def writer(row):
        for i in range(n):
            size = 1500000 if i % 2 == 0 else 10
            body = fld(1, tname(t)) + fld(2, row) + fld(3, set_cell('cf', b'q', b'x' * size, (i + 1) * 1000))
            st = write(port, body + fld(4, 'oneast'))
            if st != '0':
                bad.append((row, i, st))
    threads = [threading.Thread(target=writer, args=(r,)) for r in rows]
    for th in threads: th.start()
    for th in threads: th.join()
    expect('%d writes to each of %d rows' % (n, len(rows)), not bad, str(bad[:4]))
    want = dict((r, [(i + 1) * 1000 for i in range(n)]) for r in rows)
    for where, prof in (('on east', 'oneast'), ('on west', 'onwest')):
        for _ in range(40):
            data, st, _ = rcall(port, BT + 'ReadChangeStream',
                                cs_req(t, partition=rng(), start_us=start, end_us=now_us(), profile=prof), limit=120)
            got = {}
            for e in decode(data):
                if e[0] != 'rec':
                    continue
                seq = got.setdefault(e[1].decode(), [])
                for c in e[5]:
                    if c[0] == 'set' and (not seq or seq[-1] != c[3]):  # a value's chunks: one cell
                        seq.append(c[3])
            if st == '0' and all(len(got.get(r, [])) >= n for r in rows): break
            time.sleep(0.5)
        expect('records %s in the order written' % where, st == '0' and got == want,
               'status %s: %s' % (st, [(r, got.get(r, [])[:12]) for r in rows if got.get(r) != want[r]][:2]))


def open_stream(port, req):
    """A ReadChangeStream of request bytes req on a connection of its own, left open: (the
    connection, 'open' once a Heartbeat came or the grpc-status it ended with)."""
    c = Conn(port, timeout=60)
    sid = c.headers(BT + 'ReadChangeStream')
    c.data_fc(sid, grpc_msg(req))
    a = time.time()
    while time.time() - a < 20:
        t, fl, s, p = c.read_frame()
        if s != sid:
            continue
        if t == 0 and p:
            return c, 'open'
        if fl & 1:
            return c, 'ended'
    return c, 'silent'


def padded(base, size):
    """base (a ReadChangeStream request) with an unknown field 99 making it size bytes."""
    req = base + fld(99, b'\0' * max(0, size - len(base) - 6))
    return base + fld(99, b'\0' * max(0, size - len(base) - 6 - (len(req) - size)))


def small_write_ok(port, table, what):
    d, st, msg, err = ncall(port, BT + 'MutateRow', fld(1, tname(table)) + fld(2, 'w') +
                            fld(3, set_cell('cf', 'q', 'v')), limit=20)
    expect('%s: a small MutateRow is served (status %s %s)' % (what, st, (msg or '')[:160]),
           st == 0)


def budget(port, d, strata):
    """Open streams keep their requests (the router re-sends them to nodes) but not the
    process's buffered-request budget (--max-buffered-request-bytes, 256 MiB), which is for
    requests on their way in: two open streams of 128 MiB requests refused every other call of
    every client. A request over 1 MiB is refused; requests of open streams are held to 32 MiB
    in all (RESOURCE_EXHAUSTED past it), and other calls go on meanwhile."""
    t = 'budget'
    create_cs(port, t)
    time.sleep(0.3)
    base = cs_req(t, hb_s=1)
    big = [open_stream(port, padded(base, 128 << 20)) for _ in range(2)]
    expect('128 MiB requests are refused', all(r != 'open' for _, r in big), str(big))
    small_write_ok(port, t, 'two 128 MiB stream requests sent')
    for c, _ in big:
        c.s.close()
    streams = [open_stream(port, padded(base, 1000 << 10)) for _ in range(36)]
    opened = sum(1 for _, r in streams if r == 'open')
    print('streams of 1000 KiB requests: %d of 36 open' % opened, flush=True)
    expect('streams of 1000 KiB requests open up to the 32 MiB bound (%d)' % opened,
           28 <= opened <= 33)
    small_write_ok(port, t, '%d streams of 1000 KiB requests open' % opened)
    for c, _ in streams:
        c.s.close()
    time.sleep(1)
    c, r = open_stream(port, padded(base, 1000 << 10))
    expect('a stream opens again once the others closed (%s)' % (r,), r == 'open')
    c.s.close()


def bound_of(msg):
    """The time a start_time refusal names as the oldest change held, in microseconds."""
    m = re.search(r'is before (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z, the oldest change',
                  msg or '')
    if not m:
        return None
    day = calendar.timegm(time.strptime(m.group(1), '%Y-%m-%dT%H:%M:%S'))
    return day * 10**6 + int(float(m.group(2) or 0) * 10**6)


def starts_before_history(port, d, strata, t, on_us):
    """Streams on since on_us with a day of retention: a start 2 days ago is refused naming the
    time streams were turned on (the later bound), by the router for one tablet and for two, and
    by `strata changes --from`; a start just after that bound is read. The router named now minus
    the retention, and the retry just after it was refused again, naming the other bound."""
    start = now_us() - 2 * 86400 * 10**6
    for part, shape in ((rng('g'), 'one tablet'), (rng('c', 'p'), 'two tablets')):
        _, st, msg, _ = ncs(port, cs_req(t, partition=part, start_us=start), limit=6)
        b = bound_of(msg)
        expect('start_time 2 days ago, partition over %s: the bound named is when streams were '
               'turned on (%s s after it; status %s %s)' % (
                   shape, None if b is None else (b - on_us) / 1e6, st, (msg or '')[:160]),
               st == 3 and b is not None and on_us <= b <= on_us + 30 * 10**6)
        if b is None:
            continue
        while now_us() < b + 2 * 10**6:  # the start must lie before the end (now)
            time.sleep(0.1)
        ev, st, msg, _ = ncs(port, cs_req(t, partition=part, start_us=b + 10**6,
                                          end_us=now_us()), limit=10)
        expect('a start_time just after that bound, over %s, is read (status %s %s)'
               % (shape, st, (msg or '')[:160]), st == 0)
    p = subprocess.run([strata, 'changes', '--dir', d, '--table', t, '--from', '-2d'],
                       capture_output=True, text=True, timeout=60)
    b = bound_of(p.stderr)
    expect('strata changes --from -2d names when streams were turned on (exit %d: %s)'
           % (p.returncode, p.stderr.strip()[:200]),
           p.returncode == 1 and b is not None and on_us <= b <= on_us + 30 * 10**6)


def bad_retentions(port, t):
    """A retention_period that is not a valid google.protobuf.Duration (nanos outside
    [0, 1e9) with positive seconds) is INVALID_ARGUMENT saying so, in CreateTable and
    UpdateTable; it printed as another value (86400 s and -1 ns as 86400.000000001 s). A valid
    Duration out of range still names its value."""
    mask = fld(2, fld(1, 'change_stream_config.retention_period'))
    for secs, nanos, want in ((86400, -1, 'not a valid Duration'),
                              (86400, 2 * 10**9, 'not a valid Duration'),
                              (8 * 86400, 5, 'is 691200.000000005s')):
        cfg = fld(8, fld(1, fld(1, secs) + fld(2, nanos)))
        for what, path, body in (
                ('CreateTable', 'CreateTable', fld(1, INST) + fld(2, t + 'bad') + fld(3, cfg)),
                ('UpdateTable', 'UpdateTable', fld(1, fld(1, tname(t)) + cfg) + mask)):
            _, st, msg, _ = ncall(port, ADMIN + path, body)
            expect('%s with retention {%d s, %d ns}: INVALID_ARGUMENT "%s" (status %s %s)'
                   % (what, secs, nanos, want, st, (msg or '')[:200]),
                   st == 3 and want in (msg or ''))


def starts(port, d, strata):
    """A start_time in the future or before the table's retention is INVALID_ARGUMENT for a
    partition spanning tablets too: the router answered such a request with a CloseStream whose
    tokens sat at that time, which the nodes then read from their resolved stamp (writes made
    before the start_time delivered) or refused as tokens."""
    t = 'starts'
    on_us = now_us()
    create_cs(port, t)
    split_tablets([n for n in topology_nodes(d) if n[0].startswith('east')], t, 'g')
    ncs(port, cs_req(t, partition=rng('c', 'p'), end_us=now_us() + 10**6), limit=4)  # map fresh
    for what, start in (('60 s in the future', now_us() + 60 * 10**6),
                        ('2 days ago (retention 1 day)', now_us() - 2 * 86400 * 10**6)):
        for part, shape in ((rng('g'), 'one tablet'), (rng('c', 'p'), 'two tablets')):
            ev, st, msg, err = ncs(port, cs_req(t, partition=part, start_us=start), limit=6)
            closes = [e for e in ev or [] if e[0] == 'close']
            expect('start_time %s, partition over %s: INVALID_ARGUMENT (status %s %s, %d '
                   'CloseStream)' % (what, shape, st, (msg or '')[:100], len(closes)),
                   st == 3 and not closes)
    starts_before_history(port, d, strata, t, on_us)
    bad_retentions(port, t)


def maxmsg(port, d, strata):
    """A second router with --max-message-bytes 100000 over the instance: a burst of 300 records
    of 1 KB (one batch of the node of about 128 KiB, each message 1.1 KB) is relayed whole (the
    batch was checked as one message against the per-message limit: nothing relayed, RESOURCE
    _EXHAUSTED at every resume), and a record of a 250 KB value, over that router's limit, ends
    the stream FAILED_PRECONDITION naming the flag (it was INTERNAL blaming the node)."""
    router = os.path.join(os.path.dirname(os.path.realpath(strata)), '..', 'router', 'strata-router')
    profile(port, 'oneast', 'east')  # ALREADY_EXISTS after another mode made it
    sock = socket.socket()
    sock.bind(('127.0.0.1', 0))
    rport = sock.getsockname()[1]
    sock.close()
    log = open(os.path.join(d, 'logs', 'router-maxmsg.log'), 'w')
    proc = subprocess.Popen([router, '--config', os.path.join(d, 'topology'), '--listen',
                             '127.0.0.1:%d' % rport, '--max-message-bytes', '100000'],
                            stdout=log, stderr=log)
    try:
        t = 'maxmsg'
        create_cs(port, t)
        time.sleep(1.2)
        start = now_us()
        entries = b''.join(fld(2, fld(1, b'r%04d' % i) + fld(2, set_cell('cf', 'q', b'v' * 1000)))
                           for i in range(300))
        st = rcall(port, BT + 'MutateRows', fld(1, tname(t)) + entries, limit=60)[1]
        expect('MutateRows of 300 rows of 1 KB', st == '0', 'status %s' % st)
        mid = now_us()
        expect('a 250 KB value', write(port, fld(1, tname(t)) + fld(2, b'big') +
                                       fld(3, set_cell('cf', 'q', b'w' * 250000))) == '0')
        end = now_us()
        for _ in range(40):
            ev, st, msg, _ = ncs(rport, cs_req(t, partition=rng(), start_us=start, end_us=mid,
                                               profile='oneast'), limit=30)
            if st != 14:
                break
            time.sleep(0.5)  # the new router still learning the tablet map
        recs = [e for e in ev or [] if e[0] == 'rec']
        expect('300 records of 1 KB through a router with --max-message-bytes 100000 (status %s '
               '%s, %d records)' % (st, msg, len(recs)), st == 0 and len({e[1] for e in recs}) == 300)
        ev, st, msg, _ = ncs(rport, cs_req(t, partition=rng(), start_us=mid, end_us=end,
                                           profile='oneast'), limit=30)
        expect('a record over that router\'s limit: FAILED_PRECONDITION naming the flag (status %s '
               '%s)' % (st, msg), st == 9 and '--max-message-bytes' in (msg or ''))
    finally:
        proc.kill()
        proc.wait()


def main():
    mode = sys.argv[1]
    create_cs(int(sys.argv[2]), 'ready', retention=0)  # read by restart(); ALREADY_EXISTS after the first
    if mode == 'limits':
        limits(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    elif mode == 'bigrow':
        bigrow(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    elif mode == 'order':
        order(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    elif mode == 'manyrefs':
        manyrefs(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    elif mode == 'starts':
        starts(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    elif mode == 'budget':
        budget(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    elif mode == 'maxmsg':
        maxmsg(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    elif mode == 'mirror':
        mirror(int(sys.argv[2]), sys.argv[3], sys.argv[4], *[int(a) for a in sys.argv[5:7]])
    else:
        sys.exit('unknown mode ' + mode)
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
