#!/usr/bin/env python3
"""changes_backpressure.py PORT ROUTER_PID ROWS ROW_BYTES LIMIT_MB [NODE_METRICS_ADDR] — a
ReadChangeStream through strata-router whose client stops reading (raw HTTP/2, stdlib only,
hostile/h2raw.py).

Creates table cs with change streams on, writes ROWS rows of ROW_BYTES bytes, opens a
ReadChangeStream of the whole table (one tablet) from before the writes to shortly after them,
and reads nothing for a while: the router must not buffer the whole history (its RSS may grow by
at most LIMIT_MB; 0 = only print it, for sanitizer builds whose allocator keeps freed memory).
Then it reads the stream to its end: every row's record exactly once, in row
order (one partition on one node: stamp order is write order), ended by CloseStream OK.
With NODE_METRICS_ADDR (the node's --metrics HOST:PORT), the node must have served exactly one
ReadChangeStream call, none of them CANCELLED: the router paused the node's stream with flow
control while the client did not read, instead of cancelling it and opening another.
Exit 0 on success, 1 on a failed check, 2 on a setup error."""
import os, re, struct, sys, time, urllib.request
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hostile'))
from h2raw import Conn, fld, grpc_msg, WINUP, frame

TABLE = 'projects/p/instances/i/tables/cs'


def rss_mb(pid):
    with open('/proc/%s/status' % pid) as f:
        return int(f.read().split('VmRSS:')[1].split()[0]) / 1024.0


def ts(us):
    return fld(1, us // 1000000) + fld(2, (us % 1000000) * 1000)


def unary(port, path, body):
    c = Conn(port)
    sid = c.headers(path)
    c.data_fc(sid, grpc_msg(body))
    return c.wait_end(sid, 120)[2] == 'end'


def fields(b):
    """(number, wire type, value) of a protobuf message's fields (varints and bytes only)."""
    i = 0
    while i < len(b):
        key, i = varint_at(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint_at(b, i)
        elif wt == 2:
            n, i = varint_at(b, i)
            v, i = b[i:i + n], i + n
        elif wt == 1:
            v, i = b[i:i + 8], i + 8
        elif wt == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError('wire type %d' % wt)
        yield num, wt, v


def varint_at(b, i):
    v, shift = 0, 0
    while True:
        c = b[i]; i += 1
        v |= (c & 127) << shift; shift += 7
        if not c & 128:
            return v, i


T0 = time.time()


def node_cs_calls(addr):
    """{code: count} of the node's finished ReadChangeStream calls (strata_rpc_server_handled_total)."""
    text = urllib.request.urlopen('http://%s/metrics' % addr, timeout=10).read().decode()
    out = {}
    for m in re.finditer(r'strata_rpc_server_handled_total\{([^}]*)\} (\d+)', text):
        lab = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if lab.get('method') == 'ReadChangeStream' and int(m.group(2)):
            out[lab['code']] = int(m.group(2))
    return out


def main():
    port, pid, rows, size, limit = (int(sys.argv[1]), sys.argv[2], int(sys.argv[3]),
                                    int(sys.argv[4]), float(sys.argv[5]))
    maddr = sys.argv[6] if len(sys.argv) > 6 else None
    cfg = fld(8, fld(1, fld(1, 86400)))  # Table.change_stream_config.retention_period = 1 day
    families = fld(3, fld(1, 'cf') + fld(2, b''))
    if not unary(port, '/google.bigtable.admin.v2.BigtableTableAdmin/CreateTable',
                 fld(1, 'projects/p/instances/i') + fld(2, 'cs') + fld(3, families + cfg)):
        print('CreateTable failed'); return 2
    start = int(time.time() * 1e6)
    print('[%.1fs] table created' % (time.time() - T0))
    w = Conn(port)
    for i in range(rows):
        sid = w.headers('/google.bigtable.v2.Bigtable/MutateRow')
        cell = fld(1, 'cf') + fld(2, 'q') + fld(3, 1000) + fld(4, os.urandom(size))
        w.data_fc(sid, grpc_msg(fld(1, TABLE) + fld(2, 'r%06d' % i) + fld(3, fld(1, cell))))
        if w.wait_end(sid, 120)[2] != 'end':
            print('write of row %d did not complete' % i); return 2
    end = int(time.time() * 1e6) + 1500000
    print('[%.1fs] rows written' % (time.time() - T0))
    base = rss_mb(pid)
    c = Conn(port)
    # Only the connection window is opened (Conn does that); the stream keeps 64 KiB.
    sid = c.headers('/google.bigtable.v2.Bigtable/ReadChangeStream')
    req = (fld(1, TABLE) + fld(3, b'') + fld(4, ts(start)) + fld(5, ts(end)) +
           fld(7, fld(2, 200000000)))
    c.data(sid, grpc_msg(req))
    peak, last, stable = base, None, 0
    for _ in range(120):  # hang guard only: settles within seconds
        time.sleep(0.5)
        now = rss_mb(pid); peak = max(peak, now)
        stable = stable + 1 if last is not None and abs(now - last) < 0.5 else 0
        last = now
        if stable >= 4 and time.time() * 1e6 > end:
            break
    grew = peak - base
    print('[%.1fs] ' % (time.time() - T0), end='')
    print('router rss %.1f MB before the stream, peak %.1f MB while the client did not read '
          '(+%.1f MB; history %.1f MB)' % (base, peak, grew, rows * size / 1048576.0))
    c.send(frame(WINUP, 0, sid, struct.pack('>I', 1 << 28)))  # now a fast reader
    data, hdrs, why = c.wait_end(sid, 120)
    if why != 'end':
        print('the stream did not end: %s' % why); return 1
    print('[%.1fs] stream read' % (time.time() - T0))
    seen, cur, close = [], None, None
    i = 0
    while i + 5 <= len(data):
        n = struct.unpack('>I', data[i + 1:i + 5])[0]
        msg = data[i + 5:i + 5 + n]; i += 5 + n
        for num, wt, v in fields(msg):
            if num == 1:  # DataChange
                done = False
                for f, _, x in fields(v):
                    if f == 3 and x: cur = x.decode()
                    if f == 8: done = bool(x)
                if done: seen.append(cur)
            elif num == 3:  # CloseStream
                close = 0
                for f, _, x in fields(v):
                    if f == 1:
                        close = dict((a, b) for a, _, b in fields(x)).get(1, 0)
    want = ['r%06d' % k for k in range(rows)]
    bounded = limit <= 0 or grew <= limit  # limit 0: sanitizer builds, figures only
    calls_ok = True
    if maddr:
        calls = {}
        for _ in range(100):  # the node counts a call once it ended: poll (hang guard only)
            calls = node_cs_calls(maddr)
            if calls:
                break
            time.sleep(0.1)
        calls_ok = calls == {'OK': 1}
        print('node-side ReadChangeStream calls by final status: %s (want exactly one, OK: a slow '
              'reader must not make the router cancel and reopen it)' % calls)
    ok = seen == want and close == 0 and bounded and calls_ok
    print('%d records read (%d rows written), %d duplicates, %d missing, CloseStream %s: %s' %
          (len(seen), rows, len(seen) - len(set(seen)), len(set(want) - set(seen)), close,
           'ok' if ok else 'WRONG'))
    if not bounded:
        print('the router held %.1f MB for a client that did not read (limit %.1f)' % (grew, limit))
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
