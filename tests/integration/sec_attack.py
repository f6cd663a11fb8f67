#!/usr/bin/env python3
"""sec_attack.py — hostile TLS + HTTP/2 clients against a router with --auth-file (sec_hostile_test.sh).
Frames are built by hostile/h2raw.py (exactly what is asked for, no HPACK decoding); each case prints
"ok: WHAT" or "FAIL: WHAT: want ..., got ..." and the exit status is 1 when a case failed.

  sec_attack.py tokens PORT CA TOKENS     authorization header variants, roles calling admin and
                                          internal methods, hostile SetIamPolicy requests
  sec_attack.py storm PORT CA TOKENS IDLE HALF   IDLE TCP connections that never speak and HALF
                                          handshakes stalled mid-ClientHello stay open while a
                                          client with a token is served
  sec_attack.py tls PORT CA               no ALPN, TLS 1.0 and 1.1 offers
  sec_attack.py hup PORT CA TOKENS PID AUTHFILE N   N SIGHUP reloads (the auth file rewritten
                                          each time) while four clients call with a stable token
"""
import os, signal, socket, ssl, struct, sys, threading, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hostile'))
from h2raw import Conn, fld, grpc_msg, frame, SETTINGS, WINUP, HEADERS, CONT, hlit, status_of

INST = 'projects/p/instances/i'
TA = '/google.bigtable.admin.v2.BigtableTableAdmin/'
IA = '/google.bigtable.admin.v2.BigtableInstanceAdmin/'
failed = []


def expect(what, want, got):
    ok = got in want if isinstance(want, (list, tuple, set)) else got == want
    print(('ok: %s (%r)' % (what, got)) if ok else 'FAIL: %s: want %r, got %r' % (what, want, got))
    if not ok: failed.append(what)


def tls_ctx(ca, alpn=True):
    ctx = ssl.create_default_context(cafile=ca)
    if alpn: ctx.set_alpn_protocols(['h2'])
    return ctx


class TConn(Conn):
    """h2raw.Conn over TLS (SNI localhost, ALPN h2)."""
    def __init__(self, port, ca, timeout=10, ctx=None):
        raw = socket.create_connection(('127.0.0.1', port), timeout=timeout)
        self.s = (ctx or tls_ctx(ca)).wrap_socket(raw, server_hostname='localhost')
        self.s.sendall(b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n' + frame(SETTINGS, 0, 0, b'') +
                       frame(WINUP, 0, 0, struct.pack('>I', 1 << 30)))
        self.buf, self.next, self.conn_win, self.init_win, self.win = b'', 1, 65535, 65535, {}


GRPC_STATUS_HUFF = bytes.fromhex('9acac8b21234da8f')  # "grpc-status", HPACK Huffman-coded


def grpc_status(data, hdrs, why):
    """The call's grpc-status from raw header blocks: a literal value after the name (plain or
    Huffman-coded); a name or value taken from the dynamic table is not decoded, so a call that
    returned a message and ended cleanly counts as '0'."""
    for h in hdrs:
        for name in (GRPC_STATUS_HUFF, b'grpc-status'):
            i = h.find(name)
            if i >= 0 and i + len(name) < len(h) and not h[i + len(name)] & 0x80:
                n = h[i + len(name)]
                return h[i + len(name) + 1:i + len(name) + 1 + n].decode('latin1')
    if data and why == 'end': return '0'
    for k in ('goaway', 'eof'):
        if why.startswith(k): return k + ':'
    return why


def call(port, ca, path, body, hdrs, limit=15):
    """One call on a new connection; returns the grpc-status as a string, 'rst:N', 'goaway...',
    'eof...' or 'timeout'."""
    try:
        c = TConn(port, ca, timeout=limit)
        sid = c.headers(path, hdrs)
        c.data(sid, grpc_msg(body))
        data, h, why = c.wait_end(sid, limit)
        c.s.close()
    except (OSError, EOFError) as e:
        return 'error:' + type(e).__name__
    return grpc_status(data, h, why)


def tokens_of(path):
    out = {}
    for line in open(path):
        p = line.split()
        if len(p) == 2: out[p[0]] = p[1]
    return out


def bearer(t):
    return [('authorization', 'Bearer ' + t)]


def tokens_cases(port, ca, tok):
    A, R, W = tok['admin'], tok['reader'], tok['writer']
    lt = (TA + 'ListTables', fld(1, INST))
    bad = '3'  # NUL, CR and LF are forbidden in HTTP/2 fields: INVALID_ARGUMENT
    cases = [
        ('valid admin token', [('authorization', 'Bearer ' + A)], '0'),
        ('no authorization', [], '16'),
        ('empty value', [('authorization', '')], '16'),
        ('Bearer and nothing', [('authorization', 'Bearer')], '16'),
        ('Bearer and spaces', [('authorization', 'Bearer    ')], '16'),
        ('BEARER casing', [('authorization', 'BEARER ' + A)], '0'),
        ('bEaReR casing', [('authorization', 'bEaReR ' + A)], '0'),
        ('Bearer: colon', [('authorization', 'Bearer: ' + A)], '16'),
        ('NUL after token', [('authorization', b'Bearer ' + A.encode() + b'\x00')], bad),
        ('NUL inside token', [('authorization', b'Bearer ' + A[:8].encode() + b'\x00' + A[9:].encode())], bad),
        ('NUL-terminated prefix of token', [('authorization', b'Bearer ' + A[:8].encode() + b'\x00garbage')], bad),
        ('NUL in another header', [('authorization', 'Bearer ' + A), ('x-other', 'a\x00b')], bad),
        ('NUL in a header name', [('authorization', 'Bearer ' + A), ('x-\x00', 'b')], bad),
        ('NUL in the path', [('authorization', 'Bearer ' + A), (':path', TA + 'ListTables\x00x')], '3'),
        ('non-ASCII after token', [('authorization', ('Bearer ' + A + '\u00e9').encode())], '16'),
        ('0xff bytes', [('authorization', b'Bearer \xff\xfe' + A.encode())], '16'),
        ('CR LF inside', [('authorization', 'Bearer ' + A + '\r\nx: y')], bad),
        ('token of 4 KB', [('authorization', 'Bearer ' + 'x' * 4096)], '16'),
        # Only the first authorization header counts.
        ('valid then garbage header', [('authorization', 'Bearer ' + A), ('authorization', 'Bearer nope')], '0'),
        ('garbage then valid header', [('authorization', 'Bearer nope'), ('authorization', 'Bearer ' + A)], '16'),
        ('uppercase header name', [('Authorization', 'Bearer ' + A)], ['16', 'rst:1', '0']),
    ]
    for what, h, want in cases:
        expect(what, want, call(port, ca, lt[0], lt[1], h))
    # 1 MB of header (CONTINUATION frames): refused by --max-header-bytes, the router lives on.
    got = call(port, ca, lt[0], lt[1], [('authorization', 'Bearer ' + 'y' * (1 << 20))])
    # The server may close the connection while the client still sends: any clean refusal.
    refused = ['8', 'rst:11', 'rst:1', 'goaway:', 'eof:', 'error:SSLEOFError', 'error:ConnectionResetError',
               'error:BrokenPipeError', 'error:SSLZeroReturnError']
    expect('1 MB authorization header refused', refused, got)
    got = call(port, ca, lt[0], lt[1], [('authorization', 'Bearer ' + A), ('x-pad', 'z' * (1 << 20))])
    expect('valid token with 1 MB other header refused', refused, got)
    expect('served after the huge headers', '0', call(port, ca, lt[0], lt[1], bearer(A)))

    t1 = INST + '/tables/t1'
    roles = [
        ('reader then admin header: GetIamPolicy', None, IA + 'GetIamPolicy', fld(1, INST), '7',
         [('authorization', 'Bearer ' + R), ('authorization', 'Bearer ' + A)]),
        ('reader CreateTable', R, TA + 'CreateTable', fld(1, INST) + fld(2, 'x1'), '7'),
        ('writer CreateTable', W, TA + 'CreateTable', fld(1, INST) + fld(2, 'x1'), '7'),
        ('reader DeleteTable', R, TA + 'DeleteTable', fld(1, t1), '7'),
        ('writer DropRowRange', W, TA + 'DropRowRange', fld(1, t1) + fld(3, b'\x01'), '7'),
        ('reader MutateRow', R, '/google.bigtable.v2.Bigtable/MutateRow', fld(1, t1) + fld(2, 'r'), '7'),
        ('writer SetIamPolicy (instance)', W, IA + 'SetIamPolicy', fld(1, INST) + fld(2, b''), '7'),
        ('reader GetIamPolicy (table)', R, TA + 'GetIamPolicy', fld(1, t1), '7'),
        ('writer CreateAppProfile', W, IA + 'CreateAppProfile', fld(1, INST) + fld(2, 'ap'), '7'),
        ('writer UpdateTable', W, TA + 'UpdateTable', fld(1, fld(1, t1)), '7'),
        ('reader CancelOperation', R, '/google.longrunning.Operations/CancelOperation', fld(1, 'operations/x'), '7'),
        ('admin Node/GetStatus', A, '/strata.internal.v1.Node/GetStatus', b'', '12'),
        ('admin Replication/Apply', A, '/strata.internal.v1.Replication/Apply', b'', '12'),
        ('reader Node/DropTablet', R, '/strata.internal.v1.Node/DropTablet', b'', '12'),
        ('reader BackupAdmin', R, '/strata.internal.v1.BackupAdmin/ListBackups', fld(1, INST), ['7', '12']),
        ('no token internal', None, '/strata.internal.v1.Node/GetStatus', b'', ['16', '12']),
    ]
    for what, t, path, body, want, *h in roles:
        expect(what, want, call(port, ca, path, body, h[0] if h else bearer(t) if t else []))
    iam_cases(port, ca, A, R)


def binding(role, *members):
    return fld(4, fld(1, role) + b''.join(fld(2, m) for m in members))


def iam_cases(port, ca, A, tok_reader):
    sp = IA + 'SetIamPolicy'
    reader = 'roles/bigtable.reader'
    cases = [
        ('role of 1 MB', binding('roles/' + 'a' * (1 << 20), 'user:bob'), ['3', '8']),
        ('unknown role', binding('roles/owner', 'user:bob'), '3'),
        ('role with NUL', binding('roles/bigtable.reader\x00x', 'user:bob'), '3'),
        ('empty role', binding('', 'user:bob'), '3'),
        ('member of 1 MB', binding(reader, 'user:' + 'b' * (1 << 20)), ['3', '8']),
        ('member with NUL', binding(reader, 'user:bob\x00admin'), '3'),
        ('member kind only', binding(reader, 'user:'), '3'),
        ('allUsers', binding(reader, 'allUsers'), '3'),
        ('10,000 bindings of unknown roles', b''.join(binding('roles/x%d' % i, 'user:u') for i in range(10000)), '3'),
        ('truncated binding', fld(4, b'') [:1] + b'\x7f', '3'),
        ('binding of garbage bytes', fld(4, b'\xff' * 64), '3'),
        ('version 3 (no condition)', fld(1, 3) + binding(reader, 'user:bob'), ['3', '0']),
        # A condition that is never true must not become an unconditional admin grant.
        ('conditional admin binding', fld(1, 3) + fld(4, fld(1, 'roles/bigtable.admin') + fld(2, 'user:reader') +
                                                     fld(3, fld(1, 'request.time < timestamp("2000-01-01T00:00:00Z")'))), '3'),
        ('binding with an unknown field', fld(4, fld(1, reader) + fld(2, 'user:bob') + fld(9, 'x')), '3'),
        ('etag of 1 MB', fld(3, b'e' * (1 << 20)) + binding(reader, 'user:bob'), ['10', '3', '8']),
    ]
    for what, pol, want in cases:
        expect('SetIamPolicy ' + what, want, call(port, ca, sp, fld(1, INST) + fld(2, pol), bearer(A)))
    expect('SetIamPolicy policy not a message', ['3'], call(port, ca, sp, fld(1, INST) + fld(2, b'\xff\xff\xff'), bearer(A)))
    expect('SetIamPolicy truncated request', ['3'], call(port, ca, sp, fld(1, INST)[:-3], bearer(A)))
    expect('GetIamPolicy after the hostile sets', '0', call(port, ca, IA + 'GetIamPolicy', fld(1, INST), bearer(A)))
    expect('reader still not admin after the hostile sets', '7',
           call(port, ca, TA + 'CreateTable', fld(1, INST) + fld(2, 'condt'), bearer(tok_reader)))


def storm(port, ca, tok, n_idle, n_half):
    A = tok['admin']
    held = []
    for _ in range(n_idle):
        held.append(socket.create_connection(('127.0.0.1', port), timeout=10))
    # A TLS record header and the first bytes of a ClientHello, then nothing.
    for _ in range(n_half):
        s = socket.create_connection(('127.0.0.1', port), timeout=10)
        s.sendall(b'\x16\x03\x01\x02\x00\x01\x00\x01')
        held.append(s)
    print('holding %d idle and %d half-handshake connections' % (n_idle, n_half))
    got = [call(port, ca, TA + 'ListTables', fld(1, INST), bearer(A), limit=30) for _ in range(10)]
    expect('10 ListTables served while they are held', [['0'] * 10], got)
    # An established connection keeps being served (several calls on one connection).
    c = TConn(port, ca, timeout=30)
    st = []
    for _ in range(5):
        sid = c.headers(TA + 'ListTables', bearer(A))
        c.data(sid, grpc_msg(fld(1, INST)))
        data, h, why = c.wait_end(sid, 30)
        st.append(grpc_status(data, h, why))
    expect('established connection served 5 calls', [['0'] * 5], st)
    for s in held: s.close()


def tls_cases(port, ca):
    # Without ALPN h2 the server closes the connection (gRPC needs h2).
    try:
        c = TConn(port, ca, ctx=tls_ctx(ca, alpn=False))
        sid = c.headers(TA + 'ListTables', [])
        c.data(sid, grpc_msg(fld(1, INST)))
        data, h, why = c.wait_end(sid, 15)
        got = grpc_status(data, h, why)
    except (OSError, EOFError) as e:
        got = 'closed'
    expect('no ALPN: connection closed', ['eof:', 'closed'], got)
    for name, ver in (('TLS 1.0', ssl.TLSVersion.TLSv1), ('TLS 1.1', ssl.TLSVersion.TLSv1_1)):
        ctx = tls_ctx(ca)
        ctx.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        ctx.maximum_version = ver
        try: ctx.set_ciphers('DEFAULT:@SECLEVEL=0')
        except ssl.SSLError: pass
        try:
            s = ctx.wrap_socket(socket.create_connection(('127.0.0.1', port), timeout=10),
                                server_hostname='localhost')
            got = 'handshake done: ' + s.version()
            s.close()
        except ssl.SSLError as e:
            got = 'refused'
            print('  %s: %s' % (name, e))
        except OSError as e:
            got = 'refused'
            print('  %s: %s' % (name, e))
        expect(name + ' offer refused', 'refused', got)


def hup(port, ca, tok, pid, authfile, n):
    A = tok['admin']
    content = open(authfile, 'rb').read()
    stop = threading.Event()
    res = {}

    def client(k):
        c = TConn(port, ca, timeout=30)
        seen = res.setdefault(k, {})
        while not stop.is_set():
            sid = c.headers(TA + 'ListTables', bearer(A))
            c.data(sid, grpc_msg(fld(1, INST)))
            data, h, why = c.wait_end(sid, 30)
            st = grpc_status(data, h, why)
            seen[st] = seen.get(st, 0) + 1
            if why != 'end': return
    th = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in th: t.start()
    for i in range(n):
        # Rewritten in place (same content, new mtime/inode) and reloaded at once.
        tmp = authfile + '.tmp'
        with open(tmp, 'wb') as f: f.write(content)
        os.chmod(tmp, 0o600)
        os.rename(tmp, authfile)
        os.kill(pid, signal.SIGHUP)
        time.sleep(0.01)
    time.sleep(0.3)
    stop.set()
    for t in th: t.join(60)
    total = {}
    for seen in res.values():
        for k, v in seen.items(): total[k] = total.get(k, 0) + v
    print('  statuses over %d reloads: %s' % (n, total))
    expect('every call during reloads OK', ['0'], ','.join(sorted(total)))


def main():
    cmd, port, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if cmd == 'tokens': tokens_cases(port, ca, tokens_of(sys.argv[4]))
    elif cmd == 'storm': storm(port, ca, tokens_of(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
    elif cmd == 'tls': tls_cases(port, ca)
    elif cmd == 'hup': hup(port, ca, tokens_of(sys.argv[4]), int(sys.argv[5]), sys.argv[6], int(sys.argv[7]))
    else: sys.exit('unknown command ' + cmd)
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
