#!/usr/bin/env python3
"""read_turns_loop.py PORT READERS VALUE_MIB — many reads of a large cell leave the node's event
loop free between their turns (docs/readrows.md, Flow control and fairness). Raw HTTP/2, stdlib
only (hostile/h2raw.py).

Creates table t and writes row big with one cell of VALUE_MIB MiB. A ping connection keeps one
HTTP/2 PING in flight at all times (the next goes out when the last is answered), the way a
router's keepalive watches a node. Then one write on another connection carries READERS
ReadRows of row big, so the node receives all of them in one pass of its loop; each read's first
turn copies and encodes the whole value, which takes the loop tens of milliseconds. The check
counts the PINGs the node answered between the first DATA of the first read and the first DATA of
the last: every answer needs a pass of the loop that polled the sockets between two turns. When
every read's turn ran in the same pass (the node polled only once they all were done) the count
was 0; the reads must now leave at least READERS // 2 of them, a bound on the order of turns, not
on their speed (the client answers a PING at once, in far less time than a turn takes).
Exit 0 on success, 1 on a failed check, 2 on a setup error."""
import os, select, struct, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hostile'))
from h2raw import Conn, frames, fld, grpc_msg, frame, hlit, DATA, HEADERS, PING, SETTINGS

PARENT = 'projects/p/instances/i'
TABLE = PARENT + '/tables/t'
ADMIN = '/google.bigtable.admin.v2.BigtableTableAdmin/'
DATA_API = '/google.bigtable.v2.Bigtable/'


def unary(port, path, body):
    c = Conn(port, timeout=120)
    sid = c.headers(path)
    c.data_fc(sid, grpc_msg(body))
    data, hdrs, why = c.wait_end(sid, 120)
    c.s.close()
    return why == 'end' and any(b'grpc-status\x010' in h or b'grpc-status' not in h for h in hdrs)


def setup(port, mib):
    family = fld(1, 'f') + fld(2, b'')
    table = fld(3, family)  # column_families: map entry f -> ColumnFamily{}
    if not unary(port, ADMIN + 'CreateTable', fld(1, PARENT) + fld(2, 't') + fld(3, table)):
        sys.exit('CreateTable failed')
    cell = fld(1, 'f') + fld(2, 'c') + fld(3, 1000) + fld(4, b'v' * (mib << 20))
    if not unary(port, DATA_API + 'MutateRow', fld(1, TABLE) + fld(2, 'big') + fld(3, fld(1, cell))):
        sys.exit('MutateRow of the large cell failed')


def read_requests(c, n):
    """n ReadRows of row big as one buffer of frames (streams 1, 3, ...)."""
    req = grpc_msg(fld(1, TABLE) + fld(2, fld(1, 'big')))
    out = b''
    for i in range(n):
        sid = 1 + 2 * i
        h = b''.join(hlit(k, v) for k, v in [
            (':method', 'POST'), (':scheme', 'http'), (':path', DATA_API + 'ReadRows'),
            (':authority', 'localhost'), ('content-type', 'application/grpc'), ('te', 'trailers')])
        out += frame(HEADERS, 4, sid, h) + frame(DATA, 1, sid, req)
    return out


def main():
    port, readers, mib = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    setup(port, mib)
    pinger, reader = Conn(port, timeout=60), Conn(port, timeout=60)
    # A stream window of 1 KiB: the first DATA of every read fits in one write of the node, so
    # the reads' answers do not spread over several passes of its loop.
    reader.s.sendall(frame(SETTINGS, 0, 0, struct.pack('>HI', 4, 1024)))
    pinger.s.sendall(frame(PING, 0, 0, b'keepaliv'))
    time.sleep(0.2)
    reader.s.sendall(read_requests(reader, readers))
    started, pongs = set(), 0
    deadline = time.time() + 120
    while len(started) < readers:
        if time.time() > deadline:
            print('FAIL: only %d of %d reads answered in 120 s' % (len(started), readers))
            return 1
        ready, _, _ = select.select([pinger.s, reader.s], [], [], 1.0)
        for s in ready:
            c = pinger if s is pinger.s else reader
            for t, fl, sid, p in frames(c):
                if c is pinger and t == PING and fl & 1:
                    pongs += 1 if started else 0
                    pinger.s.sendall(frame(PING, 0, 0, b'keepaliv'))
                if c is reader and t == DATA and p:
                    started.add(sid)
    print('pings answered between the first turns of %d reads of a %d MiB cell: %d'
          % (readers, mib, pongs))
    if pongs < readers // 2:
        print('FAIL: the node polled its sockets %d times during %d long read turns: turns that '
              'are due run in one pass of its loop (want at least %d)'
              % (pongs, readers, readers // 2))
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
