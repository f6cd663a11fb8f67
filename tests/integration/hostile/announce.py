#!/usr/bin/env python3
"""announce.py — requests that announce a large message and send little of it must not take the
request budget (--max-buffered-request-bytes) from other calls (stdlib only).

  announce.py TABLE PORT...
      on each PORT, one connection opens two MutateRows streams whose gRPC prefix announces a
      message of 256 MiB - 1 bytes, then trickles 2 KiB per stream per second and never ends.
      Meanwhile, on fresh connections to every PORT, MutateRow and a one-row ReadRows must
      succeed, then a MutateRow of a 64 MiB value to the first PORT must succeed too.
Exit 0 when every probe succeeded, 1 otherwise, 2 on a setup error."""
import os, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from h2raw import Conn, fld, grpc_msg, frame, DATA, status_of

TABLE_PREFIX = 'projects/p/instances/i/tables/'
ANNOUNCED = (256 << 20) - 1  # --max-message-bytes (256 MiB) admits it


class Announcer:
    """Two streams on one connection, each announcing ANNOUNCED bytes and sending a trickle."""

    def __init__(self, port):
        self.c = Conn(port)
        self.sids = [self.c.headers('/google.bigtable.v2.Bigtable/MutateRows') for _ in range(2)]
        for sid in self.sids:
            self.c.send(frame(DATA, 0, sid, b'\x00' + ANNOUNCED.to_bytes(4, 'big') + b'\n' * 2048))
        self.last = time.time()

    def trickle(self):
        if time.time() - self.last < 1:
            return
        self.last = time.time()
        for sid in self.sids:
            self.c.send(frame(DATA, 0, sid, b'\x00' * 2048))


def call(port, method, req, limit=60, fc=False):
    """(ok, why): a unary or server-streaming call on a fresh connection; ok when the stream
    ended with at least one message and no non-zero grpc-status."""
    c = Conn(port, timeout=limit)
    sid = c.headers('/google.bigtable.v2.Bigtable/' + method)
    (c.data_fc if fc else c.data)(sid, grpc_msg(req))
    data, hdrs, why = c.wait_end(sid, limit)
    st = status_of(hdrs)  # empty when the server Huffman-coded the status
    c.s.close()
    ok = why == 'end' and len(data) >= 5 and (not st or st[0] == '0')
    return ok, '%s %s, %d bytes' % (why, st, len(data))


def mutate(port, table, row, value, fc=False):
    cell = fld(1, 'cf') + fld(2, 'q') + fld(3, 1000) + fld(4, value)
    return call(port, 'MutateRow', fld(1, TABLE_PREFIX + table) + fld(2, row) + fld(3, fld(1, cell)),
                fc=fc)


def read_row(port, table, row):
    return call(port, 'ReadRows', fld(1, TABLE_PREFIX + table) + fld(2, fld(1, row)))


def main(table, ports):
    try:
        holders = [Announcer(p) for p in ports]
    except OSError as e:
        print('cannot connect: %r' % e); return 2
    print('%d streams announce %d bytes each and send 2 KiB/s' % (2 * len(ports), ANNOUNCED))
    failed = 0
    for i in range(5):
        for p in ports:
            for h in holders: h.trickle()
            for what, (ok, why) in (('MutateRow', mutate(p, table, 'probe%d' % i, b'v')),
                                    ('ReadRows', read_row(p, table, 'probe%d' % i))):
                if not ok:
                    failed += 1
                    print('FAIL: %s on port %d while the streams hold their announcements: %s' %
                          (what, p, why))
        time.sleep(0.3)
    if failed:
        return 1
    print('every probe succeeded on ports %s' % ports)
    for h in holders: h.trickle()
    t0 = time.time()
    ok, why = mutate(ports[0], table, 'big', os.urandom(1 << 20) * 64, fc=True)
    if not ok:
        print('FAIL: a 64 MiB MutateRow on port %d: %s' % (ports[0], why)); return 1
    print('a 64 MiB MutateRow succeeded in %.1f s' % (time.time() - t0))
    for h in holders:  # the announcing streams were not ended by any of this
        try: h.c.send(frame(DATA, 0, h.sids[0], b'\x00'))
        except OSError as e: print('an announcing connection was closed: %r' % e)
    return 0


if __name__ == '__main__':
    if len(sys.argv) < 3:
        print(__doc__); sys.exit(2)
    sys.exit(main(sys.argv[1], [int(p) for p in sys.argv[2:]]))
