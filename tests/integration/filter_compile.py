#!/usr/bin/env python3
"""filter_compile.py PORT — a legal filter whose regexes are costly to compile is refused before
it holds the node's event loop (docs/filters.md, Limits against hostile filters). Raw HTTP/2,
stdlib only (hostile/h2raw.py).

Compiling runs on the loop before the call reads anything: an interleave of 400 value regexes
(\\pL|\\pN){300} (9 KB, within the 20 KB and 20-level limits, each regex accepted by RE2) held it
0.5 to 2 s for a row that does not exist, a CheckAndMutateRow predicate the same. Checks:

1. ReadRows of a row that does not exist with that filter, and with 3,000 \\pL in 10 regexes:
   INVALID_ARGUMENT (3), where the node compiled them and answered OK.
2. CheckAndMutateRow with that predicate: INVALID_ARGUMENT, and nothing written.
3. BURST such reads sent in one write on one connection while a second connection keeps an
   HTTP/2 PING in flight: every read ends, and the PING is answered (the shell script then checks
   that the node's log has no 'event loop blocked', which the old node logged: the burst held its
   loop for seconds in one pass).
4. Ordinary regexes still work: an interleave of 40 regexes of filter_loop.py's kind, and a
   value regex that selects the row written in setup.
Exit 0 on success, 1 on a failed check, 2 on a setup error."""
import os, select, struct, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hostile'))
from h2raw import Conn, frames, fld, grpc_msg, frame, hlit, DATA, HEADERS, PING, SETTINGS
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sec_attack import grpc_status

PARENT = 'projects/p/instances/i'
TABLE = PARENT + '/tables/t'
ADMIN = '/google.bigtable.admin.v2.BigtableTableAdmin/'
DATA_API = '/google.bigtable.v2.Bigtable/'
BURST = 6  # 6 x 9 KB requests stay within HTTP/2's initial 64 KiB window
ORDINARY = b'.*(a|b|c|d|e|f|g|h|x)+.*[0-9]{2,}.*x{5,}.*'


def call(port, path, body):
    """One call on a new connection (grpc-status is then a literal): (status, data)."""
    c = Conn(port, timeout=120)
    sid = c.headers(path)
    c.data_fc(sid, grpc_msg(body))
    data, hdrs, why = c.wait_end(sid, 120)
    c.s.close()
    if why != 'end':
        sys.exit('%s: the call did not end (%s)' % (path, why))
    return grpc_status(data, hdrs, why), data


def setup(port):
    family = fld(1, 'cf') + fld(2, b'')
    st, _ = call(port, ADMIN + 'CreateTable', fld(1, PARENT) + fld(2, 't') + fld(3, fld(3, family)))
    cell = fld(1, fld(1, 'cf') + fld(2, 'q') + fld(3, 1000) + fld(4, 'v1'))
    st2, _ = call(port, DATA_API + 'MutateRow', fld(1, TABLE) + fld(2, 'r1') + fld(3, cell))
    if st != '0' or st2 != '0':
        print('setup failed: CreateTable %s, MutateRow %s' % (st, st2))
        sys.exit(2)


def interleave(patterns):
    return fld(2, b''.join(fld(1, fld(9, p)) for p in patterns))


def bomb():
    """The 400 (\\pL|\\pN){300} value regexes, each made distinct."""
    base = b'(\\pL|\\pN){300}'
    return interleave([base] + [base + b'|%d' % i for i in range(1, 400)])


def read_body(row, filt):
    return fld(1, TABLE) + fld(2, fld(1, row)) + fld(3, filt)


def burst(port):
    """BURST bomb reads in one write while a PING is in flight: (reads ended, PINGs answered)."""
    pinger, reader = Conn(port, timeout=60), Conn(port, timeout=60)
    pinger.s.sendall(frame(PING, 0, 0, b'keepaliv'))
    time.sleep(0.2)
    req = grpc_msg(read_body('nonexistent', bomb()))
    h = b''.join(hlit(k, v) for k, v in [
        (':method', 'POST'), (':scheme', 'http'), (':path', DATA_API + 'ReadRows'),
        (':authority', 'localhost'), ('content-type', 'application/grpc'), ('te', 'trailers')])
    reader.s.sendall(b''.join(frame(HEADERS, 4, 1 + 2 * i, h) + frame(DATA, 1, 1 + 2 * i, req)
                              for i in range(BURST)))
    ended, pongs, deadline = set(), 0, time.time() + 120
    while len(ended) < BURST or pongs == 0:
        if time.time() > deadline:
            sys.exit('the burst did not end in 120 s (%d reads ended, %d PINGs answered)' %
                     (len(ended), pongs))
        ready, _, _ = select.select([pinger.s, reader.s], [], [], 1.0)
        for s in ready:
            c = pinger if s is pinger.s else reader
            for t, fl, sid, _ in frames(c):
                if c is pinger and t == PING and fl & 1:
                    pongs += 1
                    if len(ended) < BURST:
                        pinger.s.sendall(frame(PING, 0, 0, b'keepaliv'))
                if c is reader and t in (DATA, HEADERS) and fl & 1:
                    ended.add(sid)
    return len(ended), pongs


def check(ok, what):
    print(('ok: ' if ok else 'FAIL: ') + what)
    return ok


def main():
    port = int(sys.argv[1])
    setup(port)
    good = True
    st, _ = call(port, DATA_API + 'ReadRows', read_body('nonexistent', bomb()))
    good &= check(st == '3', 'ReadRows with 400 regexes (\\pL|\\pN){300}: status %s (want 3)' % st)
    pl = interleave([b'\\pL' * 300 + b'|%d' % i for i in range(10)])
    st, _ = call(port, DATA_API + 'ReadRows', read_body('nonexistent', pl))
    good &= check(st == '3', 'ReadRows with 3,000 \\pL in 10 regexes: status %s (want 3)' % st)
    mut = fld(1, fld(1, 'cf') + fld(2, 'bomb') + fld(3, 1000) + fld(4, 'x'))  # set_cell
    cam = fld(1, TABLE) + fld(2, 'nonexistent') + fld(6, bomb()) + fld(4, mut) + fld(5, mut)
    st, _ = call(port, DATA_API + 'CheckAndMutateRow', cam)
    good &= check(st == '3', 'CheckAndMutateRow with the 400 regexes as predicate: status %s '
                  '(want 3)' % st)
    st, data = call(port, DATA_API + 'ReadRows', fld(1, TABLE))
    good &= check(st == '0' and b'bomb' not in data and b'nonexistent' not in data,
                  'nothing written by the refused CheckAndMutateRow (status %s)' % st)
    ended, pongs = burst(port)
    good &= check(ended == BURST and pongs > 0,
                  '%d reads with the 400 regexes sent in one write: %d ended, %d PINGs answered'
                  % (BURST, ended, pongs))
    st, _ = call(port, DATA_API + 'ReadRows', read_body('nonexistent', interleave([ORDINARY] * 40)))
    good &= check(st == '0', 'ReadRows with 40 ordinary regexes: status %s (want 0)' % st)
    st, data = call(port, DATA_API + 'ReadRows', read_body('r1', fld(9, b'v.*')))
    good &= check(st == '0' and b'v1' in data, 'value regex v.* reads row r1 (status %s)' % st)
    return 0 if good else 1


if __name__ == '__main__':
    sys.exit(main())
