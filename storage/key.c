/* key.c — internal keys (format: docs/formats/keys.md). Encoding keeps memcmp order equal to the
 * order of (row, family, qualifier, timestamp desc, version desc); decoding validates every byte,
 * since keys come back from disk and a bad one must become ST_DATA_LOSS, not a crash. */
#include "key.h"

#include <string.h>

/* Bytes that separate and close components (see key.h). */
enum {
    KEY_ESC = 0x00,      /* escape byte inside enc(x) */
    KEY_ESC_ZERO = 0xff, /* 0x00 0xff = a literal 0x00 */
    KEY_ESC_END = 0x01,  /* 0x00 0x01 = end of component */
    KEY_TAG_DEL = 0x01,  /* a tombstone of the scope so far */
    KEY_TAG_MORE = 0x02, /* a narrower scope follows */
};

_Static_assert(STO_KEY_STAMP_BYTES == sizeof(uint64_t), "stamps are 64-bit");

static inline uint64_t key_not(uint64_t v) {
    return UINT64_MAX - v;
}

/* Components up to this long are escaped byte by byte: cheaper than a memchr and a memcpy per
 * 0x00 for short ones with zeros, such as a change record's family and qualifier (a stamp and
 * an index, big-endian). */
#define KEY_SHORT_COMPONENT 32

/* Writes enc(x) at p (room for 2 * x.len + 2 bytes): 0x00 escaped as 0x00 0xff, then 0x00 0x01.
 * Returns the end. Most long components hold no 0x00: memchr finds that and one memcpy copies. */
static uint8_t *key_write_component(uint8_t *p, st_slice x) {
    size_t i = 0;
    if (x.len <= KEY_SHORT_COMPONENT) {
        for (; i < x.len; i++) {
            *p++ = x.data[i];
            if (x.data[i] == KEY_ESC)
                *p++ = KEY_ESC_ZERO;
        }
    }
    while (i < x.len) {
        const uint8_t *z = memchr(x.data + i, 0, x.len - i);
        size_t run = z ? (size_t)(z - (x.data + i)) : x.len - i;
        memcpy(p, x.data + i, run);
        p += run;
        i += run;
        if (z) {
            *p++ = KEY_ESC;
            *p++ = KEY_ESC_ZERO;
            i++;
        }
    }
    *p++ = KEY_ESC;
    *p++ = KEY_ESC_END;
    return p;
}

/* Appends enc(x). */
static st_code key_put_component(st_buf *out, st_slice x) {
    if (x.len > (SIZE_MAX - 2) / 2)
        return ST_RESOURCE_EXHAUSTED;
    st_code rc = st_buf_reserve(out, 2 * x.len + 2);
    if (rc != ST_OK)
        return rc;
    out->len = (size_t)(key_write_component(out->data + out->len, x) - out->data);
    return ST_OK;
}

static uint8_t *key_write_be64(uint8_t *p, uint64_t v) {
    st_put_be64(p, v);
    return p + 8;
}

st_code sto_key_encode_row_prefix(st_buf *out, st_slice row) {
    return key_put_component(out, row);
}

/* Timestamps and deletion bounds are never negative in stored keys, so decoding can reject
 * anything else as corruption. */
static bool key_fields_valid(const sto_key *k) {
    switch (k->kind) {
    case STO_KEY_ROW_DEL:
    case STO_KEY_FAMILY_DEL:
        return true;
    case STO_KEY_COLUMN_DEL:
        return k->del_start_us >= 0 && k->del_end_us >= k->del_start_us;
    case STO_KEY_CELL:
        return k->ts_us >= 0;
    }
    return false;
}

st_code sto_key_encode(st_buf *out, const sto_key *k) {
    if (!key_fields_valid(k))
        return ST_INVALID_ARGUMENT;
    /* Room for the longest encoding (every byte escaped), reserved once. */
    size_t parts = k->row.len, max;
    if (k->kind != STO_KEY_ROW_DEL)
        parts += k->family.len + k->qualifier.len;
    if (parts < k->row.len || parts > (SIZE_MAX - 64) / 2)
        return ST_RESOURCE_EXHAUSTED;
    max = 2 * parts + 3 * 3 + 4 * 8;
    st_code rc = st_buf_reserve(out, max);
    if (rc != ST_OK)
        return rc;
    uint8_t *p = key_write_component(out->data + out->len, k->row);
    if (k->kind == STO_KEY_ROW_DEL) {
        *p++ = KEY_TAG_DEL;
    } else {
        *p++ = KEY_TAG_MORE;
        p = key_write_component(p, k->family);
        *p++ = k->kind == STO_KEY_FAMILY_DEL ? KEY_TAG_DEL : KEY_TAG_MORE;
        if (k->kind != STO_KEY_FAMILY_DEL) {
            p = key_write_component(p, k->qualifier);
            *p++ = k->kind == STO_KEY_COLUMN_DEL ? KEY_TAG_DEL : KEY_TAG_MORE;
        }
    }
    if (k->kind == STO_KEY_CELL)
        p = key_write_be64(p, key_not((uint64_t)k->ts_us));
    p = key_write_be64(p, key_not(k->version));
    if (k->kind == STO_KEY_COLUMN_DEL) {
        p = key_write_be64(p, (uint64_t)k->del_end_us);
        p = key_write_be64(p, (uint64_t)k->del_start_us);
    }
    ST_ASSERT((size_t)(p - (out->data + out->len)) <= max);
    out->len = (size_t)(p - out->data);
    return ST_OK;
}

/* Scans enc(x) starting at pos; returns the offset just past its terminator, or 0 if malformed.
 * *esc is set when an escaped 0x00 was met. memchr keeps the common no-zero case fast. */
static size_t key_scan_component(const uint8_t *p, size_t len, size_t pos, bool *esc) {
    *esc = false;
    while (pos < len) {
        const uint8_t *z = memchr(p + pos, KEY_ESC, len - pos);
        if (!z)
            return 0;
        size_t i = (size_t)(z - p);
        if (i + 1 >= len)
            return 0;
        if (p[i + 1] == KEY_ESC_END)
            return i + 2;
        if (p[i + 1] != KEY_ESC_ZERO)
            return 0;
        *esc = true;
        pos = i + 2;
    }
    return 0;
}

size_t sto_key_row_prefix_len(st_slice ikey) {
    bool esc;
    return ikey.len ? key_scan_component(ikey.data, ikey.len, 0, &esc) : 0;
}

/* Parses the fixed-size trailer that follows the last tag byte at pos. */
static bool key_parse_trailer(const uint8_t *p, size_t len, size_t pos, sto_key_parts *out) {
    size_t need = out->kind == STO_KEY_CELL         ? 16 /* ~ts ~version */
                  : out->kind == STO_KEY_COLUMN_DEL ? 24 /* ~version be64(end) be64(start) */
                                                    : 8; /* ~version */
    if (len - pos != need)
        return false;
    if (out->kind == STO_KEY_CELL) {
        uint64_t ts = key_not(st_get_be64(p + pos));
        if (ts > (uint64_t)INT64_MAX)
            return false;
        out->ts_us = (int64_t)ts;
        pos += 8;
    }
    out->version = key_not(st_get_be64(p + pos));
    if (out->kind == STO_KEY_COLUMN_DEL) {
        uint64_t end = st_get_be64(p + pos + 8), start = st_get_be64(p + pos + 16);
        if (end > (uint64_t)INT64_MAX || start > end)
            return false;
        out->del_end_us = (int64_t)end;
        out->del_start_us = (int64_t)start;
    }
    return true;
}

/* Reads the tag byte at *pos: 0x01 ends the key with kind `del`, 0x02 continues. */
static bool key_tag(const uint8_t *p, size_t len, size_t *pos, bool *more) {
    if (*pos >= len || (p[*pos] != KEY_TAG_DEL && p[*pos] != KEY_TAG_MORE))
        return false;
    *more = p[*pos] == KEY_TAG_MORE;
    (*pos)++;
    return true;
}

bool sto_key_parse(st_slice ikey, sto_key_parts *out) {
    const uint8_t *p = ikey.data;
    size_t len = ikey.len, pos;
    bool more;
    memset(out, 0, sizeof *out);
    if (len == 0 || !(pos = key_scan_component(p, len, 0, &out->row_esc)))
        return false;
    out->row_end = pos;
    out->kind = STO_KEY_ROW_DEL;
    if (!key_tag(p, len, &pos, &more))
        return false;
    if (more) {
        if (!(pos = key_scan_component(p, len, pos, &out->fam_esc)))
            return false;
        out->fam_end = pos;
        out->kind = STO_KEY_FAMILY_DEL;
        if (!key_tag(p, len, &pos, &more))
            return false;
    }
    if (more) {
        if (!(pos = key_scan_component(p, len, pos, &out->qual_esc)))
            return false;
        out->qual_end = pos;
        out->kind = STO_KEY_COLUMN_DEL;
        if (!key_tag(p, len, &pos, &more))
            return false;
        if (more)
            out->kind = STO_KEY_CELL;
    }
    return key_parse_trailer(p, len, pos, out);
}

st_code sto_key_unescape(st_slice enc, st_buf *out) {
    st_buf_reset(out);
    if (enc.len < 2 || st_buf_reserve(out, enc.len) != ST_OK)
        return enc.len < 2 ? ST_DATA_LOSS : ST_RESOURCE_EXHAUSTED;
    size_t i = 0, n = 0;
    while (i < enc.len) {
        uint8_t b = enc.data[i];
        if (b != KEY_ESC) {
            out->data[n++] = b;
            i++;
            continue;
        }
        if (i + 1 >= enc.len)
            return ST_DATA_LOSS;
        if (enc.data[i + 1] == KEY_ESC_END) {
            if (i + 2 != enc.len)
                return ST_DATA_LOSS;
            out->len = n;
            return ST_OK;
        }
        if (enc.data[i + 1] != KEY_ESC_ZERO)
            return ST_DATA_LOSS;
        out->data[n++] = 0;
        i += 2;
    }
    return ST_DATA_LOSS;
}

/* Unescapes [start, end) of p (an enc(x) with terminator) into scratch, whose capacity was
 * reserved up front so earlier slices into it stay valid. */
static st_slice key_component(const uint8_t *p, size_t start, size_t end, bool esc,
                              st_buf *scratch) {
    if (!esc)
        return st_slice_make(p + start, end - start - 2);
    uint8_t *dst = scratch->data + scratch->len, *d = dst;
    for (size_t i = start; i < end - 2; i++) {
        *d++ = p[i];
        if (p[i] == KEY_ESC)
            i++; /* skip the 0xff of the escape */
    }
    scratch->len += (size_t)(d - dst);
    return st_slice_make(dst, (size_t)(d - dst));
}

bool sto_key_decode(st_slice ikey, sto_key *k, st_buf *scratch) {
    sto_key_parts pt;
    if (!sto_key_parse(ikey, &pt))
        return false;
    st_buf_reset(scratch);
    if ((pt.row_esc || pt.fam_esc || pt.qual_esc) && st_buf_reserve(scratch, ikey.len) != ST_OK)
        return false;
    memset(k, 0, sizeof *k);
    k->kind = pt.kind;
    k->row = key_component(ikey.data, 0, pt.row_end, pt.row_esc, scratch);
    if (pt.fam_end)
        k->family = key_component(ikey.data, pt.row_end + 1, pt.fam_end, pt.fam_esc, scratch);
    if (pt.qual_end)
        k->qualifier = key_component(ikey.data, pt.fam_end + 1, pt.qual_end, pt.qual_esc, scratch);
    k->ts_us = pt.ts_us;
    k->version = pt.version;
    k->del_start_us = pt.del_start_us;
    k->del_end_us = pt.del_end_us;
    return true;
}

bool sto_key_row(st_slice ikey, st_slice *row, st_buf *scratch) {
    bool esc;
    size_t end = ikey.len ? key_scan_component(ikey.data, ikey.len, 0, &esc) : 0;
    if (!end)
        return false;
    st_buf_reset(scratch);
    if (esc && st_buf_reserve(scratch, ikey.len) != ST_OK)
        return false;
    *row = key_component(ikey.data, 0, end, esc, scratch);
    return true;
}
