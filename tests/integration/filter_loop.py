#!/usr/bin/env python3
"""filter_loop.py PORT — heavy but legal row filters leave the node's event loop free
(docs/filters.md, Work per cell; docs/readrows.md, Flow control and fairness). Raw HTTP/2,
stdlib only (hostile/h2raw.py).

Creates table t: ROWS rows of 10 cells of 60 bytes, and row wide of WIDE cells. Then:

1. A ReadRows of the whole table with an interleave of REGEXES value regexes (a row-level
   filter, legal: under the 20 KB and 20-level limits) while a ping connection keeps one HTTP/2
   PING in flight. The check counts the PINGs the node answered while the read ran: every answer
   needs a pass of the loop that polled its sockets between two turns of the read. When a turn
   charged each cell only the filter's streamed head (nothing here) it ran 1,000 rows x 10 cells x
   REGEXES regexes, and the node answered 1 to 3 PINGs during the whole read; a turn now counts
   the row-level filter's work, and the read leaves at least MIN_PONGS of them (a bound on the
   number of turns, not on their speed).
2. CheckAndMutateRow on row wide with an interleave of 300 value regexes as predicate: it was
   evaluated in one piece on the loop (0.7 s a call); it must now be refused with
   FAILED_PRECONDITION, and write nothing. A light predicate on the same row still
   runs and writes its branch.
Exit 0 on success, 1 on a failed check, 2 on a setup error."""
import os, select, struct, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hostile'))
from h2raw import Conn, frames, fld, grpc_msg, frame, DATA, HEADERS, PING, SETTINGS
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sec_attack import grpc_status

PARENT = 'projects/p/instances/i'
TABLE = PARENT + '/tables/t'
ADMIN = '/google.bigtable.admin.v2.BigtableTableAdmin/'
DATA_API = '/google.bigtable.v2.Bigtable/'
ROWS, WIDE, REGEXES, MIN_PONGS = 2000, 6000, 100, 20
PATTERN = b'.*(a|b|c|d|e|f|g|h|x)+.*[0-9]{2,}.*x{5,}.*'


def call(port, path, body):
    """One call on a new connection (so grpc-status is a literal, not from the dynamic table):
    its gRPC status code as a string."""
    c = Conn(port, timeout=120)
    sid = c.headers(path)
    c.data_fc(sid, grpc_msg(body))
    data, hdrs, why = c.wait_end(sid, 120)
    c.s.close()
    if why != 'end':
        sys.exit('%s: the call did not end (%s)' % (path, why))
    return grpc_status(data, hdrs, why)


def cell(q, value):
    return fld(1, fld(1, 'cf') + fld(2, q) + fld(3, 1000) + fld(4, value))


def setup(port):
    family = fld(1, 'cf') + fld(2, b'')
    if call(port, ADMIN + 'CreateTable', fld(1, PARENT) + fld(2, 't') + fld(3, fld(3, family)))!= '0':
        sys.exit('CreateTable failed')
    value = b'abcdefgh0123456789' * 3 + b'xyxyxy'  # 60 bytes; no xxxxx: no regex matches
    for b in range(0, ROWS, 500):
        entries = b''.join(fld(2, fld(1, 'r%05d' % i) + b''.join(fld(2, cell('q%d' % j, value))
                                                                 for j in range(10)))
                           for i in range(b, b + 500))
        if call(port, DATA_API + 'MutateRows', fld(1, TABLE) + entries)!= '0':
            sys.exit('MutateRows failed')
    muts = b''.join(fld(3, cell('w%05d' % j, value)) for j in range(WIDE))
    if call(port, DATA_API + 'MutateRow', fld(1, TABLE) + fld(2, 'wide') + muts)!= '0':
        sys.exit('MutateRow of the wide row failed')


def interleave(n):
    return fld(2, b''.join(fld(1, fld(9, PATTERN)) for _ in range(n)))


def heavy_read(port):
    """PINGs answered while the read with the heavy row-level filter ran, and its status."""
    pinger, reader = Conn(port, timeout=60), Conn(port, timeout=60)
    reader.s.sendall(frame(SETTINGS, 0, 0, struct.pack('>HI', 4, (1 << 30) - 1)))
    pinger.s.sendall(frame(PING, 0, 0, b'keepaliv'))
    time.sleep(0.2)
    sid = reader.headers(DATA_API + 'ReadRows')
    rows = fld(2, fld(1, 'r') + fld(4, 's'))  # the ROWS rows r..., not row wide
    reader.data_fc(sid, grpc_msg(fld(1, TABLE) + fld(2, rows) + fld(3, interleave(REGEXES))))
    pongs, hdrs, deadline = 0, [], time.time() + 120
    while True:
        if time.time() > deadline:
            sys.exit('the heavy read did not end in 120 s')
        ready, _, _ = select.select([pinger.s, reader.s], [], [], 1.0)
        for s in ready:
            c = pinger if s is pinger.s else reader
            for t, fl, fsid, p in frames(c):
                if c is pinger and t == PING and fl & 1:
                    pongs += 1
                    pinger.s.sendall(frame(PING, 0, 0, b'keepaliv'))
                if c is reader and fsid == sid and t == HEADERS:
                    hdrs.append(p)
                if c is reader and fsid == sid and t in (DATA, HEADERS) and fl & 1:
                    return pongs, grpc_status(b'', hdrs, 'end')


def cam(port, predicate, hit):
    body = (fld(1, TABLE) + fld(2, 'wide') + fld(6, predicate) + fld(4, cell(hit, b'y')) +
            fld(5, cell('miss', b'y')))
    return call(port, DATA_API + 'CheckAndMutateRow', body)


def main():
    port = int(sys.argv[1])
    setup(port)
    ok = True
    pongs, st = heavy_read(port)
    print('PINGs answered during a read of %d rows with an interleave of %d value regexes: %d, '
          'status %s' % (ROWS, REGEXES, pongs, st))
    if st != '0':
        print('FAIL: the heavy read ended with %s' % st)
        ok = False
    if pongs < MIN_PONGS:
        print('FAIL: the node polled its sockets %d times during the read (want at least %d): '
              'its turns ran the row-level filter over 1,000 rows each' % (pongs, MIN_PONGS))
        ok = False
    code = cam(port, interleave(300), 'hit')
    print('CheckAndMutateRow with 300 value regexes over %d cells: status %s' % (WIDE, code))
    if code != '9':
        print('FAIL: the heavy predicate was evaluated on the loop, not refused with '
              'FAILED_PRECONDITION')
        ok = False
    code = cam(port, fld(9, b'.*y.*'), 'light')
    print('CheckAndMutateRow with one value regex over %d cells: status %s' % (WIDE, code))
    if code != '0':
        print('FAIL: the light predicate failed')
        ok = False
    read = fld(1, TABLE) + fld(2, fld(1, 'wide')) + fld(3, fld(6, b'hit|miss|light'))
    c = Conn(port, timeout=60)
    sid = c.headers(DATA_API + 'ReadRows')
    c.data_fc(sid, grpc_msg(read))
    data, _, _ = c.wait_end(sid, 60)
    c.s.close()
    written = [q for q in (b'hit', b'miss', b'light') if q in data]
    print('branch cells written on row wide: %s' % written)
    if written != [b'light']:
        print('FAIL: want only the light predicate\'s true branch written')
        ok = False
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
