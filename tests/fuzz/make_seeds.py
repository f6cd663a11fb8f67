#!/usr/bin/env python3
"""Writes the seed corpora of fuzz_peek, fuzz_wire, fuzz_h2server and fuzz_topology (valid
inputs: real Bigtable requests and answers, a real HTTP/2 client connection, real topology
files) into tests/fuzz/corpus/. Run from anywhere; files found by fuzzing are kept beside them."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def varint(v):
    v &= (1 << 64) - 1
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def fld(num, val):
    """A field: bytes -> length-delimited, int -> varint."""
    if isinstance(val, int):
        return varint(num << 3) + varint(val)
    if isinstance(val, str):
        val = val.encode()
    return varint(num << 3 | 2) + varint(len(val)) + val


TABLE = "projects/p/instances/i/tables/t"


def set_cell(ts=1000, family="cf", value=b"v"):
    return fld(1, fld(1, family) + fld(2, "q") + fld(3, ts) + fld(4, value))


DELETE_ROW = fld(4, b"")
DELETE_FAMILY = fld(3, fld(1, "cf"))
RANGE = fld(2, fld(1, "a") + fld(3, "m"))
READ_ROWS = {
    "read_rows_keys": fld(1, TABLE) + fld(2, fld(1, "r1") + fld(1, "r2")) + fld(5, "default"),
    "read_rows_range": fld(1, TABLE) + fld(2, RANGE) + fld(3, fld(5, "cf")) + fld(4, 10),
    "read_rows_reversed": fld(1, TABLE) + fld(2, RANGE) + fld(4, 1) + fld(7, 1),
    "read_rows_all": fld(1, TABLE),
}
MUTATE_ROW = {
    "mutate_row": fld(1, TABLE) + fld(2, "row1") + fld(3, set_cell()) + fld(3, DELETE_FAMILY),
    "mutate_row_server_time": fld(1, TABLE) + fld(2, "row1") + fld(3, set_cell(ts=-1)),
    "mutate_row_delete": fld(1, TABLE) + fld(2, "row1") + fld(3, DELETE_ROW) + fld(4, "p1"),
}


def entry(row, *muts):
    return fld(2, fld(1, row) + b"".join(fld(2, m) for m in muts))


MUTATE_ROWS = {
    "mutate_rows": fld(1, TABLE) + entry("a", set_cell()) + entry("b", set_cell(), DELETE_ROW),
    "mutate_rows_server_time": fld(1, TABLE) + entry("a", set_cell(ts=-1)) + fld(3, "p1"),
    "mutate_rows_one": fld(1, TABLE) + entry("z", DELETE_FAMILY),
}


def status(code, msg):
    return fld(1, code) + (fld(2, msg) if msg else b"")


MUTATE_ROWS_RESPONSE = fld(1, fld(1, 0) + fld(2, status(0, ""))) + fld(
    1, fld(1, 1) + fld(2, status(5, "table not found: create it first")))


def chunk(row=None, commit=False, reset=False):
    c = b""
    if row is not None:
        c += fld(1, row) + fld(2, fld(1, "cf")) + fld(3, fld(1, "q"))
    c += fld(4, 1000) + fld(6, "value")
    if reset:
        c += fld(8, 1)
    if commit:
        c += fld(9, 1)
    return fld(1, c)


READ_ROWS_RESPONSE = (chunk("r1", commit=True) + chunk("r2") + chunk(commit=True) +
                      fld(2, "r9"))
READ_ROWS_RESPONSE_RESET = chunk("r1") + chunk(reset=True) + chunk("r2", commit=True)

# ---- HTTP/2 ----
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def frame(ftype, flags, stream, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(
        ">I", stream) + payload


def lit(name, value):
    """HPACK literal without indexing, new name, no Huffman."""
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def headers_block(path):
    return (b"\x83\x86" +  # :method POST, :scheme http (static table)
            b"\x04" + bytes([len(path)]) + path +  # :path, indexed name
            b"\x01\x09localhost" +  # :authority
            lit(b"content-type", b"application/grpc") + lit(b"te", b"trailers") +
            lit(b"grpc-timeout", b"5S"))


def grpc(msg):
    return b"\x00" + struct.pack(">I", len(msg)) + msg


SETTINGS = frame(4, 0, 0, struct.pack(">HI", 4, 65535) + struct.pack(">HI", 3, 100))
SETTINGS_ACK = frame(4, 1, 0, b"")
MUTATE_PATH = b"/google.bigtable.v2.Bigtable/MutateRow"
READ_PATH = b"/google.bigtable.v2.Bigtable/ReadRows"


def call(stream, path, msg, end_headers=True):
    return frame(1, 0x4, stream, headers_block(path)) + frame(0, 0x1, stream, grpc(msg))


H2 = {
    "unary": PREFACE + SETTINGS + SETTINGS_ACK + call(1, MUTATE_PATH, MUTATE_ROW["mutate_row"]),
    "streaming": PREFACE + SETTINGS + call(1, READ_PATH, READ_ROWS["read_rows_range"]),
    "two_calls": PREFACE + SETTINGS + call(1, MUTATE_PATH, MUTATE_ROW["mutate_row"]) +
    call(3, READ_PATH, READ_ROWS["read_rows_keys"]),
    "continuation": PREFACE + SETTINGS +
    frame(1, 0, 1, headers_block(MUTATE_PATH)[:20]) +
    frame(9, 0x4, 1, headers_block(MUTATE_PATH)[20:]) +
    frame(0, 0, 1, grpc(MUTATE_ROW["mutate_row"])[:7]) +
    frame(0, 0x1, 1, grpc(MUTATE_ROW["mutate_row"])[7:]),
    "control": PREFACE + SETTINGS + frame(6, 0, 0, b"12345678") +
    frame(8, 0, 0, struct.pack(">I", 1 << 20)) + frame(1, 0x4, 1, headers_block(READ_PATH)) +
    frame(3, 0, 1, struct.pack(">I", 8)) + frame(7, 0, 0, struct.pack(">II", 0, 0)),
    "empty_message": PREFACE + SETTINGS + call(1, MUTATE_PATH, b""),
    "unknown_method": PREFACE + SETTINGS + call(1, b"/x.Y/Z", b""),
    "bad_prefix": PREFACE + SETTINGS + frame(1, 0x4, 1, headers_block(MUTATE_PATH)) +
    frame(0, 0x1, 1, b"\x01\xff\xff\xff\xff"),
}

TOPOLOGY = {
    "example": """# comments and blank lines are ignored
project = p
instance = i
split_bytes = 268435456
[cluster east]
zone = zone-a
node = 127.0.0.1:7101 /var/lib/strata/east-0
node = 127.0.0.1:7102 /var/lib/strata/east-1
[cluster west]
zone = zone-b
node = 127.0.0.1:7201 /var/lib/strata/west-0
[router]
listen = 127.0.0.1:8086
""",
    "minimal": "[cluster c]\nnode = localhost:9000\n",
    "spaces_ipv6": "project = example.com:proj\r\n\t[ cluster  a-1 ]\r\nnode = [::1]:7000  /d/with space\r\n"
    "[router]\nlisten = [::1]:8000\nlisten = 127.0.0.1:8001\n",
    "bad_line": "[cluster east]\nnode = 127.0.0.1:0\n",
}


def write(target, files):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)


write("fuzz_peek", {**{k: b"\x00" + v for k, v in READ_ROWS.items()},
                    **{k: b"\x01" + v for k, v in MUTATE_ROW.items()},
                    **{k: b"\x02" + v for k, v in MUTATE_ROWS.items()}})
write("fuzz_wire", {
    "copy_read_rows": b"\x00\x00\x04\x00\x02" + READ_ROWS["read_rows_range"],
    "copy_mutate_rows": b"\x00\x02\x00\x00\x01" + MUTATE_ROWS["mutate_rows"],
    "split_mutate_rows": b"\x01\x00\x00\x00\x00" + MUTATE_ROWS["mutate_rows"],
    "split_interleaved": b"\x01\x00\x00\x00\x00" + entry("a", DELETE_ROW) + fld(1, TABLE) +
    entry("b", set_cell()) + fld(3, "p1"),
    "merge_response": b"\x02\x02\x00\x00\x00" + MUTATE_ROWS_RESPONSE,
    "track_read_rows": b"\x03\x00\x40\x40\x40" + READ_ROWS_RESPONSE,
    "track_reversed_split": b"\x03\x01\x03\x05\x07" + READ_ROWS_RESPONSE_RESET,
})
write("fuzz_h2server", H2)
write("fuzz_topology", TOPOLOGY)


def ts(us):
    return fld(1, us // 1000000) + fld(2, (us % 1000000) * 1000)


def data_change(row, chunks, kind=1, cluster="east", done=1, token="1.1796455919303000"):
    return fld(1, fld(1, kind) + fld(2, cluster) + fld(3, row) + fld(4, ts(1796455919303000)) +
               fld(5, 1) + b"".join(fld(6, c) for c in chunks) + fld(8, done) + fld(9, token) +
               fld(10, ts(1796455919302000)))


def mchunk(value, info=None):
    sc = fld(1, "cf") + fld(2, "q") + fld(3, 1000) + fld(4, value)
    return (fld(1, info) if info is not None else b"") + fld(2, fld(1, sc))


# ReadChangeStreamResponse messages as a node sends them: whole changes, a value chunked within
# one message and over two, a delete, a heartbeat and a CloseStream.
write("fuzz_cswire", {
    "set_cells": data_change("row1", [mchunk(b"v" * 10), mchunk(b"w" * 70)]),
    "chunked_whole": data_change("row2", [mchunk(b"a" * 5, fld(1, 8) + fld(2, 0)),
                                          mchunk(b"b" * 3, fld(1, 8) + fld(2, 5) + fld(3, 1))]),
    "chunked_open": data_change("row3", [mchunk(b"a" * 5, fld(1, 8) + fld(2, 0))], done=0),
    "continuation": data_change("", [mchunk(b"b" * 3, fld(1, 8) + fld(2, 5) + fld(3, 1))], kind=3),
    "gc_delete": data_change("row4", [fld(2, fld(3, fld(1, "cf")))], kind=2, cluster=""),
    "heartbeat": fld(2, fld(1, fld(2, "1.1796455919303000")) + fld(2, ts(1796455919302000))),
    "close_stream": fld(3, fld(1, fld(1, 0))),
    "empty": b"",
})
