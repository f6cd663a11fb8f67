"""bk_manifest.py — what the backup export tests need to forge an export directory (stdlib only):
the CRC-32C of a file, and a MANIFEST text signed as strata backup export writes it
(docs/formats/backup-export.md: its lines, then "end CRC SHA256" of them)."""
import hashlib


def crc32c(data, crc=0):
    crc ^= 0xffffffff
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82f63b78 & -(crc & 1))
    return crc ^ 0xffffffff


def signed(lines):
    """The MANIFEST bytes of lines (a list of str), with its end line."""
    text = ("\n".join(lines) + "\n").encode()
    return text + b"end %08x %s\n" % (crc32c(text), hashlib.sha256(text).hexdigest().encode())
