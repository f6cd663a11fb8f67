# h2raw.py — a minimal stdlib-only HTTP/2 + gRPC client that sends exactly the frames it is told
# (hostile tests: no flow control unless data_fc is used, no HPACK decoding).
import socket, struct, time, sys
DATA, HEADERS, RST, SETTINGS, PING, GOAWAY, WINUP, CONT = 0, 1, 3, 4, 6, 7, 8, 9

def hint(v, prefix_bits, first=0):
    mx = (1 << prefix_bits) - 1
    if v < mx: return bytes([first | v])
    out = [first | mx]; v -= mx
    while v >= 128: out.append((v & 127) | 128); v >>= 7
    out.append(v); return bytes(out)

def hlit(name, value):
    if isinstance(name, str): name = name.encode()
    if isinstance(value, str): value = value.encode()
    return b'\x00' + hint(len(name), 7) + name + hint(len(value), 7) + value

def varint(v):
    if v < 0: v += 1 << 64
    out = b''
    while True:
        b = v & 127; v >>= 7
        if v: out += bytes([b | 128])
        else: return out + bytes([b])

def fld(num, val):
    if isinstance(val, int): return varint(num << 3) + varint(val)
    if isinstance(val, str): val = val.encode()
    return varint(num << 3 | 2) + varint(len(val)) + val

def frame(t, flags, sid, payload):
    return struct.pack('>I', len(payload))[1:] + bytes([t, flags]) + struct.pack('>I', sid) + payload

def grpc_msg(body, compressed=0, declared=None):
    return bytes([compressed]) + struct.pack('>I', len(body) if declared is None else declared) + body

class Conn:
    def __init__(self, port, host='127.0.0.1', timeout=10):
        self.s = socket.create_connection((host, port), timeout=timeout)
        self.s.sendall(b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n' + frame(SETTINGS, 0, 0, b'') +
                       frame(WINUP, 0, 0, struct.pack('>I', (1 << 30))))
        self.buf = b''
        self.next = 1
        self.conn_win = 65535
        self.init_win = 65535
        self.win = {}
    def headers(self, path, extra=(), end=False, sid=None):
        if sid is None: sid = self.next; self.next += 2
        h = b''.join(hlit(k, v) for k, v in [(':method', 'POST'), (':scheme', 'http'), (':path', path),
             (':authority', 'localhost'), ('content-type', 'application/grpc'), ('te', 'trailers')] + list(extra))
        parts = [h[i:i + 16384] for i in range(0, len(h), 16384)] or [b'']
        out = b''
        for i, p in enumerate(parts):
            last = i == len(parts) - 1
            if i == 0: out += frame(HEADERS, (4 if last else 0) | (1 if end else 0), sid, p)
            else: out += frame(CONT, 4 if last else 0, sid, p)
        self.s.sendall(out)
        return sid
    def data(self, sid, payload, end=True, chunk=16384):
        if not payload and end: self.s.sendall(frame(DATA, 1, sid, b'')); return
        for i in range(0, len(payload), chunk):
            last = i + chunk >= len(payload)
            self.s.sendall(frame(DATA, 1 if (last and end) else 0, sid, payload[i:i + chunk]))
    def send(self, b): self.s.sendall(b)
    def data_fc(self, sid, payload, end=True):
        """Sends payload on sid respecting the peer's flow-control windows."""
        self.win.setdefault(sid, self.init_win)
        off = 0
        while off < len(payload) or (end and off == 0 and not payload):
            n = min(16384, len(payload) - off, self.conn_win, self.win[sid])
            if n <= 0 and len(payload) > off:
                self.read_frame(); continue
            last = off + n >= len(payload)
            self.s.sendall(frame(DATA, 1 if (last and end) else 0, sid, payload[off:off + n]))
            self.conn_win -= n; self.win[sid] -= n; off += n
            if last: break
    def read_frame(self):
        while len(self.buf) < 9:
            d = self.s.recv(65536)
            if not d: raise EOFError('closed')
            self.buf += d
        ln = int.from_bytes(self.buf[:3], 'big'); t = self.buf[3]; fl = self.buf[4]
        sid = struct.unpack('>I', self.buf[5:9])[0] & 0x7fffffff
        while len(self.buf) < 9 + ln:
            d = self.s.recv(65536)
            if not d: raise EOFError('closed mid-frame')
            self.buf += d
        p = self.buf[9:9 + ln]; self.buf = self.buf[9 + ln:]
        if t == SETTINGS and not fl & 1:
            for j in range(0, len(p), 6):
                k, v = struct.unpack('>HI', p[j:j + 6])
                if k == 4:
                    for s_ in self.win: self.win[s_] += v - self.init_win
                    self.init_win = v
            self.s.sendall(frame(SETTINGS, 1, 0, b''))
        if t == WINUP:
            inc = struct.unpack('>I', p)[0] & 0x7fffffff
            if sid == 0: self.conn_win += inc
            else: self.win[sid] = self.win.get(sid, self.init_win) + inc
        if t == PING and not fl & 1: self.s.sendall(frame(PING, 1, 0, p))
        return t, fl, sid, p
    def wait_end(self, sid, limit=30):
        """Collect frames until stream sid ends; returns (data bytes, list of header blocks raw, reason)."""
        end = time.time() + limit; data = bytearray(); hdrs = []  # += on bytes is quadratic
        self.s.settimeout(limit)
        while time.time() < end:
            try: t, fl, s, p = self.read_frame()
            except socket.timeout: return bytes(data), hdrs, 'timeout'
            except (EOFError, ConnectionResetError) as e: return bytes(data), hdrs, 'eof:' + str(e)
            if t == GOAWAY: return bytes(data), hdrs, 'goaway:' + p[8:].decode('latin1') + ' code=%d' % struct.unpack('>I', p[4:8])[0]
            if s != sid: continue
            if t == DATA:
                data += p
                if p: self.s.sendall(frame(WINUP, 0, 0, struct.pack('>I', len(p))) + frame(WINUP, 0, sid, struct.pack('>I', len(p))))
            if t == HEADERS: hdrs.append(p)
            if t == RST: return bytes(data), hdrs, 'rst:%d' % struct.unpack('>I', p)[0]
            if fl & 1: return bytes(data), hdrs, 'end'
        return bytes(data), hdrs, 'timeout'

def frames(c):
    """The frames already received on c: reads the socket once (blocking until something comes),
    then every whole frame buffered (c.read_frame acks SETTINGS). EOFError when the peer closed."""
    d = c.s.recv(1 << 20)
    if not d:
        raise EOFError('the peer closed the connection')
    c.buf += d
    out = []
    while len(c.buf) >= 9 and len(c.buf) >= 9 + int.from_bytes(c.buf[:3], 'big'):
        out.append(c.read_frame())
    return out


def status_of(hdrs):
    """Crude: find grpc-status / grpc-message literal strings in raw header blocks (works when
    the server sends literals without Huffman)."""
    import re
    out = []
    for h in hdrs:
        m = re.search(rb'grpc-status.(\d+)', h)
        if m: out.append(m.group(1).decode())
        m = re.search(rb'grpc-message.(.{0,200})', h, re.S)
        if m: out.append(m.group(1)[:200])
    return out
