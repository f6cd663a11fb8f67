#!/usr/bin/env python3
"""hold.py — hostile clients for the memory tests of this folder (stdlib only).

  hold.py write PORT TABLE ROWS BYTES          writes ROWS rows of a BYTES-byte value (cf:q)
  hold.py create PORT TABLE                    creates TABLE with family cf
  hold.py check PORT TABLE ROWS BYTES          exit 0 if a scan returns every row write wrote
  hold.py rmw-storm PORT TABLE ROW THREADS PID  THREADS clients increment ROW; kill -9 PID midway
  hold.py rmw-after PORT TABLE ROW OTHER       once OTHER is served again, exit 0 if ROW is too
  hold.py rmw-down PORT TABLE ROW N            N increments of ROW, 0.1 s apart, while its node is
      down (each fails; some meet the router's redials of the node, whose connects fail)
  hold.py readers PORT TABLE CONNS STREAMS PIDS LIMIT_MB
      opens CONNS connections x STREAMS ReadRows of the whole TABLE and never reads an answer
  hold.py metadata PORT CONNS STREAMS PIDS LIMIT_MB
      opens CONNS connections x STREAMS requests, each with ~60 KiB of metadata and no message
  hold.py stall-then-read PORT TABLE CONNS STREAMS PIDS LIMIT_MB ROWS BYTES
      readers, then a scan from another connection must return every row (written by write)
      while they stall, then the readers read: every stream must end with every row
  hold.py serve-while-stalled PORT TABLE CONNS STREAMS PIDS LIMIT_MB ROWS BYTES
      readers, then a MutateRow and a one-row ReadRows from another connection must each answer
      within 20 s while they stall, then as stall-then-read
  hold.py timed PORT TABLE PROFILE N MAX_MS   N ReadRows one after another; exit 1 if one took
      longer than MAX_MS
  hold.py scan-range PORT TABLE START END SECS  ReadRows of [START, END); exit 0 if it ended
      within SECS with at least one row (prints the rows and how the stream ended)
Both hold modes then sample the VmRSS of every pid in PIDS (comma-separated) every 0.5 s until it
has been stable for 4 samples (the server has stopped taking memory) or one exceeds LIMIT_MB:
exit 0 and "bounded" in the first case, exit 1 and "UNBOUNDED" in the second. Exit 2: setup
error (connection refused, a write failed)."""
import os, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from h2raw import Conn, fld, grpc_msg

TABLE_PREFIX = 'projects/p/instances/i/tables/'


def rss_mb(pid):
    with open('/proc/%s/status' % pid) as f:
        return int(f.read().split('VmRSS:')[1].split()[0]) // 1024


def write(port, table, rows, size):
    c = Conn(port)
    for i in range(rows):
        sid = c.headers('/google.bigtable.v2.Bigtable/MutateRow')
        cell = fld(1, 'cf') + fld(2, 'q') + fld(3, 1000) + fld(4, os.urandom(size))
        c.data_fc(sid, grpc_msg(fld(1, TABLE_PREFIX + table) + fld(2, 'r%06d' % i) + fld(3, fld(1, cell))))
        if c.wait_end(sid, 120)[2] != 'end':
            print('write of row %d did not complete' % i); return 2
    sid = c.headers('/google.bigtable.v2.Bigtable/ReadRows')  # the statuses are not decoded: count
    c.data(sid, grpc_msg(fld(1, TABLE_PREFIX + table)))
    got = len(c.wait_end(sid, 120)[0])
    if got < rows * size:
        print('the table holds %d bytes, not the %d written' % (got, rows * size)); return 2
    print('wrote %d rows of %d bytes' % (rows, size)); return 0


def create(port, table):
    """CreateTable TABLE with one family cf (no GC rule)."""
    c = Conn(port)
    sid = c.headers('/google.bigtable.admin.v2.BigtableTableAdmin/CreateTable')
    families = fld(3, fld(1, 'cf') + fld(2, b''))  # Table.column_families: {"cf": {}}
    c.data(sid, grpc_msg(fld(1, 'projects/p/instances/i') + fld(2, table) + fld(3, families)))
    return 0 if c.wait_end(sid, 60)[2] == 'end' else 2


def check(port, table, rows, size):
    """Exit 0 when a full scan of TABLE returns every row key r000000..r<ROWS-1> (written by write)."""
    c = Conn(port)
    sid = c.headers('/google.bigtable.v2.Bigtable/ReadRows')
    c.data(sid, grpc_msg(fld(1, TABLE_PREFIX + table)))
    data = c.wait_end(sid, 120)[0]
    missing = [i for i in range(rows) if ('r%06d' % i).encode() not in data]
    print('scan returned %d bytes; %d of %d rows missing %s' % (len(data), len(missing), rows, missing[:5]))
    return 0 if not missing else 1


def watch(conns, pids, limit):
    last, stable, peak = None, 0, {}
    for _ in range(1200):  # hang guard only: a bounded server is stable within seconds
        now = {p: rss_mb(p) for p in pids}
        for p, v in now.items(): peak[p] = max(peak.get(p, 0), v)
        if any(v > limit for v in now.values()):
            print('UNBOUNDED: rss %s MB exceeds %d MB while %d connections hold their calls' % (now, limit, len(conns)))
            return 1
        stable = stable + 1 if now == last else 0
        if stable >= 4:
            print('bounded: rss %s MB (peak %s) stays under %d MB' % (now, peak, limit)); return 0
        last = now; time.sleep(0.5)
        for c in conns:  # answer pings and settings, never read the streams' data
            c.s.setblocking(False)
            try: c.s.recv(0)
            except (BlockingIOError, OSError): pass
            c.s.setblocking(True)
    print('rss never settled: %s MB' % last); return 1


def hold(port, conns_n, streams, table, pids, limit):
    conns = []
    for _ in range(conns_n):
        c = Conn(port)
        for _ in range(streams):
            try:
                if table is None:
                    c.headers('/google.bigtable.v2.Bigtable/ReadRows',
                              extra=[('x-pad-%d' % k, 'a' * 3900) for k in range(15)])
                else:
                    sid = c.headers('/google.bigtable.v2.Bigtable/ReadRows')
                    c.data(sid, grpc_msg(fld(1, TABLE_PREFIX + table)))
            except OSError as e:  # refused or closed by the server: that bounds it too
                print('connection closed by the server: %r' % e); break
        conns.append(c)
    return watch(conns, pids, limit)


def drain(conns, rows, size, plan=None):
    """Opens every held stream's window wide and reads them to their end: exit 0 when each
    stream ended, brought at least ROWS x SIZE bytes and every row key r000000.. exactly once
    (a key is counted where a chunk's row_key field holds it: the values are random, and a key
    with that tag shows up in them with odds of 2^-72), 1 otherwise. plan: (stream index on its
    connection) -> the keys that stream must bring, in that order (rows_limit, reversed)."""
    import re, struct
    from h2raw import frame, DATA, WINUP, RST, GOAWAY
    bad, key = 0, re.compile(rb'\n\x07(r\d{6})')
    all_keys = [('r%06d' % i).encode() for i in range(rows)]
    for c in conns:
        got, ended, keys, tail = {}, set(), {}, {}
        sids = list(range(1, c.next, 2))
        c.s.sendall(b''.join(frame(WINUP, 0, sid, struct.pack('>I', 1 << 30)) for sid in sids))
        c.s.settimeout(60)
        while len(ended) < len(sids):
            try: t, fl, sid, p = c.read_frame()
            except (OSError, EOFError) as e:
                print('connection failed while draining: %r' % e); return 1
            if t == GOAWAY: print('GOAWAY while draining'); return 1
            if t == DATA:
                got[sid] = got.get(sid, 0) + len(p)
                seen = tail.get(sid, b'') + p  # a key cut across two frames is whole here
                for k in key.findall(seen):
                    keys.setdefault(sid, {})[k] = keys.get(sid, {}).get(k, 0) + 1
                tail[sid] = seen[-8:]  # shorter than a tagged key: none is counted twice
                if p: c.s.sendall(frame(WINUP, 0, 0, struct.pack('>I', len(p))))
            if t == RST or (fl & 1 and t in (DATA, 1)): ended.add(sid)
        order = {s: (plan or {}).get((s - 1) // 2, all_keys) for s in sids}
        short = [s for s in sids if got.get(s, 0) < len(order[s]) * size or
                 keys.get(s) != {k: 1 for k in order[s]} or list(keys.get(s, {})) != order[s]]
        bad += len(short)
        if short:
            k, expect = keys.get(short[0], {}), {k: 1 for k in order[short[0]]}
            print('%d streams ended short or with rows missing or repeated, e.g. stream %d: %d bytes, '
                  'rows %s' % (len(short), short[0], got.get(short[0], 0),
                               {x.decode(): n for x, n in sorted(k.items()) if expect.get(x) != n} or 'none'))
    print('drained %d connections: %d streams short, or with a row missing or repeated' % (len(conns), bad))
    return 0 if bad == 0 else 1


def stall_then_read(port, conns_n, streams, table, pids, limit, rows, size):
    """readers, then: a scan from another connection must return every row while the readers
    stall; then the readers read and every stream must end with every row."""
    conns = []
    for _ in range(conns_n):
        c = Conn(port)
        for _ in range(streams):
            sid = c.headers('/google.bigtable.v2.Bigtable/ReadRows')
            c.data(sid, grpc_msg(fld(1, TABLE_PREFIX + table)))
        conns.append(c)
    if watch(conns, pids, limit) != 0: return 1
    if check(port, table, rows, size) != 0:
        print('a scan from another connection failed while the readers stall'); return 1
    return drain(conns, rows, size)


def serve_while_stalled(port, conns_n, streams, table, pids, limit, rows, size):
    """readers (all on one connection when conns_n is 1), then: a MutateRow and a ReadRows of one
    row from another connection must answer within 20 s each while the readers stall (the
    router's connection to the node is shared by every call to it); then as stall_then_read."""
    from h2raw import status_of
    # every fourth scan each: forward, reversed, forward with a rows_limit, reversed with one
    keys, limit_n = [('r%06d' % i).encode() for i in range(rows)], rows - rows // 4
    plan = {i: [keys, keys[::-1], keys[:limit_n], keys[::-1][:limit_n]][i % 4] for i in range(streams)}
    conns = []
    for _ in range(conns_n):
        c = Conn(port)
        for i in range(streams):  # FeatureFlags{reverse_scans: true}: a client that may reverse
            sid = c.headers('/google.bigtable.v2.Bigtable/ReadRows', extra=[('bigtable-features', 'CAE=')])
            req = fld(1, TABLE_PREFIX + table)
            if i % 4 >= 2: req += fld(4, limit_n)
            if i % 2: req += fld(7, 1)
            c.data(sid, grpc_msg(req))
        conns.append(c)
    if watch(conns, pids, limit) != 0: return 1
    c = Conn(port)
    t0 = time.time()
    sid = c.headers('/google.bigtable.v2.Bigtable/MutateRow')
    cell = fld(1, 'cf') + fld(2, 'q') + fld(3, 1000) + fld(4, b'probe')
    c.data_fc(sid, grpc_msg(fld(1, TABLE_PREFIX + table) + fld(2, 'probe') + fld(3, fld(1, cell))))
    _, hdrs, why = c.wait_end(sid, 20)
    ms = (time.time() - t0) * 1000
    st = status_of(hdrs)  # crude: empty when the status is Huffman-coded
    if why != 'end' or (st and st[0] != '0'):
        print('MutateRow through the router while %d scans stall: %s %s after %.0f ms' %
              (conns_n * streams, why, status_of(hdrs), ms)); return 1
    print('MutateRow answered in %.0f ms while %d scans stall' % (ms, conns_n * streams))
    t0 = time.time()
    sid = c.headers('/google.bigtable.v2.Bigtable/ReadRows')
    c.data(sid, grpc_msg(fld(1, TABLE_PREFIX + table) + fld(2, fld(1, 'r000000'))))
    data, hdrs, why = c.wait_end(sid, 20)
    ms = (time.time() - t0) * 1000
    if why != 'end' or b'r000000' not in data:
        print('ReadRows of one row through the router while %d scans stall: %s after %.0f ms' %
              (conns_n * streams, why, ms)); return 1
    print('ReadRows of one row answered in %.0f ms while %d scans stall' % (ms, conns_n * streams))
    if check(port, table, rows, size) != 0:
        print('a scan from another connection failed while the readers stall'); return 1
    return drain(conns, rows, size, plan)


def stall_sockets(port, table, conns_n, streams, rows, probe='row', bound_ms=3000):
    """conns_n connections of `streams` full scans each, whose sockets are never read again
    (the router's writes to them back up), then ReadRows of one row and MutateRow of another
    from another connection, five times a second apart: each must answer within bound_ms
    (probe 'scan': a ReadRows of a range of one row instead, not a point read). Calls to
    the node used to wait for the router's ration of stream resets (about (N - 860) / 25 s for N
    such scans), then behind the scans waiting for a stream slot on the router's one connection
    to the node (9-12 s under AddressSanitizer); they answer in milliseconds now."""
    conns = []
    for _ in range(conns_n):
        c = Conn(port)
        for _ in range(streams):
            sid = c.headers('/google.bigtable.v2.Bigtable/ReadRows')
            c.data(sid, grpc_msg(fld(1, TABLE_PREFIX + table)))
        conns.append(c)
    time.sleep(3)  # the scans fill their windows and the router parks or pauses them
    worst, times = 0, []
    for i in range(5):
        c = Conn(port)
        key = 'r%06d' % (i * 7 % rows)
        t0 = time.time()
        sid = c.headers('/google.bigtable.v2.Bigtable/ReadRows')
        if probe == 'row':
            rows_set = fld(1, key)
        else:  # a scan of a few rows: not a point read, so it goes the node's scan connection
            rows_set = fld(2, fld(1, key) + fld(3, key + '~'))
        c.data(sid, grpc_msg(fld(1, TABLE_PREFIX + table) + fld(2, rows_set)))
        data, _, why = c.wait_end(sid, 60)
        ms = (time.time() - t0) * 1000
        if why != 'end' or key.encode() not in data:
            print('ReadRows (%s) while %d scans stall: %s after %.0f ms' %
                  (probe, conns_n * streams, why, ms)); return 1
        t1 = time.time()
        sid = c.headers('/google.bigtable.v2.Bigtable/MutateRow')
        cell = fld(1, 'cf') + fld(2, 'p') + fld(3, 1000) + fld(4, 'x')
        c.data(sid, grpc_msg(fld(1, TABLE_PREFIX + table) + fld(2, 'probe%d' % i) +
                             fld(3, fld(1, cell))))
        why = c.wait_end(sid, 60)[2]
        wms = (time.time() - t1) * 1000
        if why != 'end':
            print('MutateRow while %d scans stall: %s after %.0f ms' % (conns_n * streams, why, wms))
            return 1
        times.append('%.0f/%.0f' % (ms, wms))
        worst = max(worst, ms, wms)
        time.sleep(1)
    print('ReadRows (%s) / MutateRow answered within %s ms while %d scans stall' %
          (probe, ' '.join(times), conns_n * streams))
    return 0 if worst < bound_ms else 1


def scan_range(port, table, start, end, secs):
    """ReadRows of [start, end); 0 when it ended with at least one row."""
    c = Conn(port)
    sid = c.headers('/google.bigtable.v2.Bigtable/ReadRows')
    c.data(sid, grpc_msg(fld(1, TABLE_PREFIX + table) + fld(2, fld(2, fld(1, start) + fld(3, end)))))
    data, _, why = c.wait_end(sid, secs)
    rows = data.count(b'r0')
    print('scan [%s, %s): %d rows, %s' % (start, end, rows, why))
    return 0 if why == 'end' and rows > 0 else 1


def timed_reads(port, table, profile, n):
    """n ReadRows of TABLE with app profile PROFILE, one after another: prints each one's ms."""
    worst = 0
    for _ in range(n):
        c = Conn(port)
        t0 = time.time()
        sid = c.headers('/google.bigtable.v2.Bigtable/ReadRows')
        c.data(sid, grpc_msg(fld(1, TABLE_PREFIX + table) + fld(5, profile)))
        why = c.wait_end(sid, 120)[2]
        ms = int((time.time() - t0) * 1000)
        worst = max(worst, ms)
        print('ReadRows via %s: %s after %d ms' % (profile, why, ms))
        c.s.close()
    print('worst %d ms' % worst)
    return worst


def rmw_once(c, table, row):
    """One ReadModifyWriteRow +1 on row/cf:n; True when it answered a row (statuses are not
    decoded: a failed call carries no message)."""
    sid = c.headers('/google.bigtable.v2.Bigtable/ReadModifyWriteRow')
    rule = fld(1, 'cf') + fld(2, 'n') + fld(4, 1)
    c.data(sid, grpc_msg(fld(1, TABLE_PREFIX + table) + fld(2, row) + fld(3, rule)))
    data, _, why = c.wait_end(sid, 30)
    return why == 'end' and len(data) > 5


def rmw_storm(port, table, row, threads, pid):
    """THREADS clients increment the same counter; after 200 answers the node PID is frozen, then
    killed -9 0.3 s later; returns when every client has seen a failure."""
    import signal, threading
    state = {'ok': 0, 'failed': set(), 'stop': False}
    def client(k):
        c = Conn(port)
        while not state['stop']:
            try:
                if rmw_once(c, table, row): state['ok'] += 1
                else: state['failed'].add(k)
            except OSError:
                state['failed'].add(k)
                try: c = Conn(port)
                except OSError: time.sleep(0.1)
    ts = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(threads)]
    for t in ts: t.start()
    for _ in range(600):
        if state['ok'] >= 200: break
        time.sleep(0.1)
    # Frozen first, so every client's call is out on the node's connection when it dies: one
    # drop under 16 identical calls (a kill between two calls would leave one call alone in the
    # drop, which the guard is meant to suspect).
    os.kill(int(pid), signal.SIGSTOP)
    time.sleep(0.3)
    os.kill(int(pid), signal.SIGKILL)
    for _ in range(300):
        if len(state['failed']) == threads: break
        time.sleep(0.1)
    state['stop'] = True
    print('%d increments answered before the kill; %d clients saw a failure' % (state['ok'], len(state['failed'])))
    return 0


def rmw_after(port, table, row, other):
    """Waits (bounded) until an increment of row OTHER succeeds (the node is back), then sends the
    hot increment of ROW once: exit 0 if it is served."""
    for _ in range(600):
        try:
            if rmw_once(Conn(port), table, other): break
        except OSError: pass
        time.sleep(0.1)
    else:
        print('the node never came back'); return 2
    ok = rmw_once(Conn(port), table, row)
    print('node back (a cold row is served); the hot row is %s' % ('served' if ok else 'REFUSED'))
    return 0 if ok else 1


def rmw_down(port, table, row, n):
    failed = 0
    for _ in range(n):
        try:
            failed += not rmw_once(Conn(port), table, row)
        except OSError:
            failed += 1
        time.sleep(0.1)
    print('%d of %d increments failed while the node was down' % (failed, n))
    return 0


def main(a):
    if a[0] == 'rmw-storm': return rmw_storm(int(a[1]), a[2], a[3], int(a[4]), a[5])
    if a[0] == 'rmw-down': return rmw_down(int(a[1]), a[2], a[3], int(a[4]))
    if a[0] == 'rmw-after': return rmw_after(int(a[1]), a[2], a[3], a[4])
    if a[0] == 'create': return create(int(a[1]), a[2])
    if a[0] == 'scan-range': return scan_range(int(a[1]), a[2], a[3], a[4], float(a[5]))
    if a[0] == 'stall-sockets':
        return stall_sockets(int(a[1]), a[2], int(a[3]), int(a[4]), int(a[5]), *a[6:7],
                             *[int(x) for x in a[7:8]])
    if a[0] == 'check': return check(int(a[1]), a[2], int(a[3]), int(a[4]))
    if a[0] == 'timed': return 1 if timed_reads(int(a[1]), a[2], a[3], int(a[4])) > int(a[5]) else 0
    if a[0] == 'write': return write(int(a[1]), a[2], int(a[3]), int(a[4]))
    if a[0] == 'readers': return hold(int(a[1]), int(a[3]), int(a[4]), a[2], a[5].split(','), int(a[6]))
    if a[0] == 'stall-then-read':
        return stall_then_read(int(a[1]), int(a[3]), int(a[4]), a[2], a[5].split(','), int(a[6]), int(a[7]), int(a[8]))
    if a[0] == 'serve-while-stalled':
        return serve_while_stalled(int(a[1]), int(a[3]), int(a[4]), a[2], a[5].split(','), int(a[6]), int(a[7]), int(a[8]))
    if a[0] == 'metadata': return hold(int(a[1]), int(a[2]), int(a[3]), None, a[4].split(','), int(a[5]))
    print(__doc__); return 2


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
