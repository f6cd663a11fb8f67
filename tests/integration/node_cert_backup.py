#!/usr/bin/env python3
"""node_cert_backup.py — what a node's certificate (OU=strata-node) reads and writes on another
node of a secure instance (node_cert_backup_test.sh; docs/security.md, Internal links). Raw TLS +
HTTP/2 through hostile/h2raw.py, presenting DIR/secure/<name>.pem. Prints "ok: WHAT" or
"FAIL: WHAT: ..." per case; exit status 1 when a case failed.

  node_cert_backup.py NODE_PORT SECURE_DIR NODE_CERT BACKUP TABLE SECRET

BACKUP (a full backup name) is held by the node at NODE_PORT, of TABLE (a full table name) whose
rows hold SECRET. NODE_CERT names the node certificate presented (e.g. west-0).
"""
import os, socket, ssl, struct, sys
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, 'hostile'))
from h2raw import Conn, fld, grpc_msg, frame, SETTINGS, WINUP
from sec_attack import grpc_status

NODE = '/strata.internal.v1.Node/'
failed = []


class CConn(Conn):
    """h2raw.Conn over TLS presenting a client certificate of the cluster CA."""
    def __init__(self, port, sdir, who):
        ctx = ssl.create_default_context(cafile=os.path.join(sdir, 'ca.pem'))
        ctx.set_alpn_protocols(['h2'])
        ctx.load_cert_chain(os.path.join(sdir, who + '.pem'), os.path.join(sdir, who + '.key'))
        raw = socket.create_connection(('127.0.0.1', port), timeout=30)
        self.s = ctx.wrap_socket(raw, server_hostname='localhost')
        self.s.sendall(b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n' + frame(SETTINGS, 0, 0, b'') +
                       frame(WINUP, 0, 0, struct.pack('>I', 1 << 30)))
        self.buf, self.next, self.conn_win, self.init_win, self.win = b'', 1, 65535, 65535, {}


def call(port, sdir, who, method, body):
    """(grpc-status as a string, the response's message bytes, all of them concatenated)."""
    c = CConn(port, sdir, who)
    sid = c.headers(NODE + method)
    c.data(sid, grpc_msg(body))
    data, hdrs, why = c.wait_end(sid, 30)
    c.s.close()
    out, i = b'', 0
    while i + 5 <= len(data):
        n = struct.unpack('>I', data[i + 1:i + 5])[0]
        out += data[i + 5:i + 5 + n]
        i += 5 + n
    return grpc_status(data, hdrs, why), out


def parse(b):
    """Protobuf fields of b as (number, value): ints for varints, bytes for the rest."""
    i, out = 0, []
    def varint():
        nonlocal i
        v = sh = 0
        while True:
            c = b[i]; i += 1; v |= (c & 0x7f) << sh; sh += 7
            if not c & 0x80: return v
    while i < len(b):
        k = varint()
        if k & 7 == 0: out.append((k >> 3, varint()))
        elif k & 7 == 2:
            n = varint(); out.append((k >> 3, b[i:i + n])); i += n
        elif k & 7 == 1: out.append((k >> 3, b[i:i + 8])); i += 8
        elif k & 7 == 5: out.append((k >> 3, b[i:i + 4])); i += 4
    return out


def expect(what, want, got):
    ok = got == want
    print(('ok: %s (%r)' % (what, got)) if ok else 'FAIL: %s: want %r, got %r' % (what, want, got))
    if not ok: failed.append(what)


UNAUTHENTICATED, PERMISSION_DENIED, OK = '16', '7', '0'


def main():
    port, sdir, node, backup, table, secret = sys.argv[1:7]
    port, secret = int(port), secret.encode()
    # The operator's certificate reads the piece: its names, and the secret in its file.
    st, resp = call(port, sdir, 'admin', 'ListBackupPieces', fld(1, backup))
    expect('admin lists the backup pieces', OK, st)
    piece = dict((f, v) for f, v in parse(parse(resp)[0][1]) if f in (1, 2))[2].decode()
    files = [dict(parse(v))[1].decode() for f, v in parse(parse(resp)[0][1]) if f == 6]
    read = lambda who, ticket=b'': call(port, sdir, who, 'ReadBackupFile',
                                        fld(1, backup) + fld(2, piece) + fld(3, files[0]) +
                                        (fld(5, ticket) if ticket else b''))
    st, data = read('admin')
    expect('admin reads the piece file, which holds the secret', (OK, True), (st, secret in data))

    # A node's certificate alone reads no backup.
    st, resp = call(port, sdir, node, 'ListBackupPieces', b'')
    expect('node cert: ListBackupPieces of every backup', UNAUTHENTICATED, st)
    st, resp = call(port, sdir, node, 'ListBackupPieces', fld(1, backup) + fld(2, piece))
    expect('node cert: ListBackupPieces of the piece without a ticket', UNAUTHENTICATED, st)
    st, data = read(node)
    expect('node cert: ReadBackupFile without a ticket', (UNAUTHENTICATED, False),
           (st, secret in data))
    st, data = read(node, b'0' * 32)
    expect('node cert: ReadBackupFile with a forged ticket', (UNAUTHENTICATED, False),
           (st, secret in data))
    st, _ = call(port, sdir, node, 'GrantBackupRead', fld(1, backup) + fld(2, piece))
    expect('node cert: GrantBackupRead', PERMISSION_DENIED, st)
    st, _ = call(port, sdir, node, 'PullBackupPiece',
                 fld(1, '127.0.0.1:1') + fld(2, backup) + fld(3, piece))
    expect('node cert: PullBackupPiece', PERMISSION_DENIED, st)

    # A ticket a router (here the operator) asked for opens that piece, and only that one.
    st, resp = call(port, sdir, 'admin', 'GrantBackupRead', fld(1, backup) + fld(2, piece))
    expect('admin: GrantBackupRead', OK, st)
    ticket = dict(parse(resp)).get(1, b'')
    st, data = read(node, ticket)
    expect('node cert with the ticket reads the piece', (OK, True), (st, secret in data))
    st, _ = call(port, sdir, node, 'ListBackupPieces',
                 fld(1, backup) + fld(2, piece) + fld(3, ticket))
    expect('node cert with the ticket lists the piece', OK, st)
    st, _ = call(port, sdir, node, 'ListBackupPieces', fld(1, backup) + fld(3, ticket))
    expect('node cert with the ticket: every piece of the backup', UNAUTHENTICATED, st)
    other = backup.rsplit('/', 1)[0] + '/other'
    st, _ = call(port, sdir, node, 'ListBackupPieces', fld(1, other) + fld(2, piece) + fld(3, ticket))
    expect('node cert with the ticket: another backup', UNAUTHENTICATED, st)

    # CopyRows from a node's certificate writes only into a move's incoming copy.
    st, resp = call(port, sdir, node, 'ListTablets', fld(1, table))
    expect('node cert: ListTablets', OK, st)
    tablet = dict(parse(dict(parse(resp))[1]))[1]
    st, _ = call(port, sdir, node, 'CopyRows', fld(1, tablet) + fld(2, b'not a row'))
    expect('node cert: CopyRows rows into a serving tablet', PERMISSION_DENIED, st)
    st, _ = call(port, sdir, 'admin', 'CopyRows', fld(1, tablet) + fld(2, b'not a row'))
    expect('admin: CopyRows reaches the row checks', '3', st)  # INVALID_ARGUMENT
    st, _ = call(port, sdir, node, 'CopyRows', fld(1, tablet) + fld(3, 1))
    expect('node cert: CopyRows with only a clock (after a move)', OK, st)
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
