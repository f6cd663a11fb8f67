/* key_test — proves the internal key encoding keeps tuple order under memcmp, round-trips every
 * kind, and rejects malformed bytes: random keys whose components are drawn from the bytes that
 * matter to the escaping (0x00, 0x01, 0x02, 0xff) are compared against a tuple-order model, and
 * truncated or mutated encodings must fail to decode (or decode to a key that re-encodes to the
 * very same bytes). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "key.h"

#define COMP_MAX 6 /* longest random component */

typedef struct rkey {
    sto_key k;
    uint8_t row[COMP_MAX], fam[COMP_MAX], qual[COMP_MAX];
} rkey;

static st_rng g_rng;

static void rand_comp(uint8_t *buf, st_slice *out) {
    static const uint8_t alphabet[] = {0x00, 0x01, 0x02, 0xff, 'a'};
    size_t n = (size_t)st_rng_below(&g_rng, COMP_MAX + 1);
    for (size_t i = 0; i < n; i++)
        buf[i] = alphabet[st_rng_below(&g_rng, sizeof alphabet)];
    *out = st_slice_make(buf, n);
}

static uint64_t rand_u64(void) {
    static const uint64_t picks[] = {0, 1, 2, 1000, UINT64_MAX - 1, UINT64_MAX};
    if (st_rng_below(&g_rng, 2))
        return picks[st_rng_below(&g_rng, 6)];
    return st_rng_next(&g_rng);
}

static int64_t rand_ts(void) {
    return (int64_t)(rand_u64() >> 1);
}

static void rand_key(rkey *r) {
    memset(r, 0, sizeof *r);
    r->k.kind = (sto_key_kind)(1 + st_rng_below(&g_rng, 4));
    rand_comp(r->row, &r->k.row);
    if (r->k.kind != STO_KEY_ROW_DEL)
        rand_comp(r->fam, &r->k.family);
    if (r->k.kind == STO_KEY_COLUMN_DEL || r->k.kind == STO_KEY_CELL)
        rand_comp(r->qual, &r->k.qualifier);
    r->k.version = rand_u64();
    if (r->k.kind == STO_KEY_CELL)
        r->k.ts_us = rand_ts();
    if (r->k.kind == STO_KEY_COLUMN_DEL) {
        int64_t a = rand_ts(), b = rand_ts();
        r->k.del_start_us = a < b ? a : b;
        r->k.del_end_us = a < b ? b : a;
    }
}

static int cmp_desc(uint64_t a, uint64_t b) {
    return a > b ? -1 : (a < b ? 1 : 0);
}
static int cmp_asc(uint64_t a, uint64_t b) {
    return a < b ? -1 : (a > b ? 1 : 0);
}
static int sgn(int c) {
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
}

/* The order key.h promises, written as tuple comparisons. */
static int model_cmp(const sto_key *a, const sto_key *b) {
    int c = st_slice_cmp(a->row, b->row);
    if (c)
        return sgn(c);
    int sa = a->kind != STO_KEY_ROW_DEL, sb = b->kind != STO_KEY_ROW_DEL;
    if (sa != sb || !sa)
        return sa != sb ? sa - sb : cmp_desc(a->version, b->version);
    if ((c = st_slice_cmp(a->family, b->family)))
        return sgn(c);
    sa = a->kind != STO_KEY_FAMILY_DEL, sb = b->kind != STO_KEY_FAMILY_DEL;
    if (sa != sb || !sa)
        return sa != sb ? sa - sb : cmp_desc(a->version, b->version);
    if ((c = st_slice_cmp(a->qualifier, b->qualifier)))
        return sgn(c);
    sa = a->kind != STO_KEY_COLUMN_DEL, sb = b->kind != STO_KEY_COLUMN_DEL;
    if (sa != sb)
        return sa - sb;
    if (!sa) {
        if ((c = cmp_desc(a->version, b->version)))
            return c;
        if ((c = cmp_asc((uint64_t)a->del_end_us, (uint64_t)b->del_end_us)))
            return c;
        return cmp_asc((uint64_t)a->del_start_us, (uint64_t)b->del_start_us);
    }
    if ((c = cmp_desc((uint64_t)a->ts_us, (uint64_t)b->ts_us)))
        return c;
    return cmp_desc(a->version, b->version);
}

static void assert_key_eq(const sto_key *a, const sto_key *b) {
    assert_int_equal(a->kind, b->kind);
    assert_true(st_slice_eq(a->row, b->row));
    assert_true(st_slice_eq(a->family, b->family));
    assert_true(st_slice_eq(a->qualifier, b->qualifier));
    assert_int_equal(a->version, b->version);
    if (a->kind == STO_KEY_CELL)
        assert_int_equal(a->ts_us, b->ts_us);
    if (a->kind == STO_KEY_COLUMN_DEL) {
        assert_int_equal(a->del_start_us, b->del_start_us);
        assert_int_equal(a->del_end_us, b->del_end_us);
    }
}

static void test_key_roundtrip_random(void **state) {
    (void)state;
    st_rng_seed(&g_rng, st_test_seed("test_key_roundtrip_random"));
    st_buf enc, scratch, row;
    st_buf_init(&enc);
    st_buf_init(&scratch);
    st_buf_init(&row);
    for (int i = 0; i < 20000; i++) {
        rkey r;
        sto_key d;
        st_slice rs;
        rand_key(&r);
        st_buf_reset(&enc);
        assert_int_equal(sto_key_encode(&enc, &r.k), ST_OK);
        assert_true(sto_key_decode(st_buf_slice(&enc), &d, &scratch));
        assert_key_eq(&r.k, &d);
        assert_true(sto_key_row(st_buf_slice(&enc), &rs, &row));
        assert_true(st_slice_eq(rs, r.k.row));
        st_buf_reset(&row);
        assert_int_equal(sto_key_encode_row_prefix(&row, r.k.row), ST_OK);
        assert_int_equal(sto_key_row_prefix_len(st_buf_slice(&enc)), row.len);
        assert_true(st_slice_has_prefix(st_buf_slice(&enc), st_buf_slice(&row)));
    }
    st_buf_free(&enc);
    st_buf_free(&scratch);
    st_buf_free(&row);
}

static void test_key_memcmp_order_is_tuple_order(void **state) {
    (void)state;
    st_rng_seed(&g_rng, st_test_seed("test_key_memcmp_order_is_tuple_order"));
    st_buf ea, eb;
    st_buf_init(&ea);
    st_buf_init(&eb);
    for (int i = 0; i < 50000; i++) {
        rkey a, b;
        rand_key(&a);
        if (st_rng_below(&g_rng, 3) == 0) {
            b = a; /* share a prefix, differ late */
            b.k.row = st_slice_make(b.row, a.k.row.len);
            b.k.family = st_slice_make(b.fam, a.k.family.len);
            b.k.qualifier = st_slice_make(b.qual, a.k.qualifier.len);
            if (st_rng_below(&g_rng, 2))
                b.k.version = rand_u64();
            else
                b.k.ts_us = rand_ts();
        } else {
            rand_key(&b);
        }
        st_buf_reset(&ea);
        st_buf_reset(&eb);
        assert_int_equal(sto_key_encode(&ea, &a.k), ST_OK);
        assert_int_equal(sto_key_encode(&eb, &b.k), ST_OK);
        int got = sgn(st_slice_cmp(st_buf_slice(&ea), st_buf_slice(&eb)));
        assert_int_equal(got, model_cmp(&a.k, &b.k));
        /* Keys of one row share exactly the row prefix; keys of different rows never do. */
        size_t la = sto_key_row_prefix_len(st_buf_slice(&ea));
        size_t lb = sto_key_row_prefix_len(st_buf_slice(&eb));
        bool same_prefix = la == lb && memcmp(ea.data, eb.data, la) == 0;
        assert_int_equal(same_prefix, st_slice_eq(a.k.row, b.k.row));
    }
    st_buf_free(&ea);
    st_buf_free(&eb);
}

/* Whatever bytes decode must re-encode to themselves (one encoding per key). */
static void check_canonical(st_slice bytes, st_buf *scratch, st_buf *re) {
    sto_key d;
    if (!sto_key_decode(bytes, &d, scratch))
        return;
    st_buf_reset(re);
    assert_int_equal(sto_key_encode(re, &d), ST_OK);
    assert_true(st_slice_eq(st_buf_slice(re), bytes));
}

static void test_key_malformed_rejected(void **state) {
    (void)state;
    st_rng_seed(&g_rng, st_test_seed("test_key_malformed_rejected"));
    st_buf enc, scratch, re, row;
    st_buf_init(&enc);
    st_buf_init(&scratch);
    st_buf_init(&re);
    st_buf_init(&row);
    sto_key d;
    sto_key_parts pt;
    for (int i = 0; i < 5000; i++) {
        rkey r;
        rand_key(&r);
        st_buf_reset(&enc);
        assert_int_equal(sto_key_encode(&enc, &r.k), ST_OK);
        /* Every strict prefix and every one-byte extension is invalid. */
        for (size_t n = 0; n < enc.len; n++) {
            assert_false(sto_key_decode(st_slice_make(enc.data, n), &d, &scratch));
            assert_false(sto_key_parse(st_slice_make(enc.data, n), &pt));
        }
        assert_int_equal(st_buf_append_byte(&enc, (uint8_t)st_rng_next(&g_rng)), ST_OK);
        assert_false(sto_key_decode(st_buf_slice(&enc), &d, &scratch));
        enc.len--;
        /* Random byte flips either fail or decode canonically. */
        for (int j = 0; j < 8; j++) {
            size_t pos = (size_t)st_rng_below(&g_rng, enc.len);
            uint8_t old = enc.data[pos];
            enc.data[pos] = (uint8_t)st_rng_next(&g_rng);
            check_canonical(st_buf_slice(&enc), &scratch, &re);
            st_slice rs;
            (void)sto_key_row(st_buf_slice(&enc), &rs, &row);
            (void)sto_key_row_prefix_len(st_buf_slice(&enc));
            enc.data[pos] = old;
        }
    }
    /* Specific shapes: bad escape, bad tag, timestamp out of range, inverted delete range. */
    static const uint8_t bad_escape[] = {'r', 0x00, 0x02, 0x00, 0x01, 0x01, 0, 0, 0, 0, 0, 0, 0, 0};
    static const uint8_t bad_tag[] = {'r', 0x00, 0x01, 0x03, 0, 0, 0, 0, 0, 0, 0, 0};
    static const uint8_t no_term[] = {'r', 'o', 'w'};
    assert_false(sto_key_decode(st_slice_make(bad_escape, sizeof bad_escape), &d, &scratch));
    assert_false(sto_key_decode(st_slice_make(bad_tag, sizeof bad_tag), &d, &scratch));
    assert_int_equal(sto_key_row_prefix_len(st_slice_make(no_term, sizeof no_term)), 0);
    assert_int_equal(sto_key_row_prefix_len(st_slice_make(bad_escape, sizeof bad_escape)), 0);
    assert_int_equal(sto_key_row_prefix_len(st_slice_make(NULL, 0)), 0);

    sto_key k = {.kind = STO_KEY_CELL,
                 .row = ST_SLICE_LIT("r"),
                 .family = ST_SLICE_LIT("f"),
                 .qualifier = ST_SLICE_LIT("q"),
                 .ts_us = 5,
                 .version = 7};
    st_buf_reset(&enc);
    assert_int_equal(sto_key_encode(&enc, &k), ST_OK);
    enc.data[enc.len - 16] = 0x7f; /* ~ts below 2^63: ts would exceed INT64_MAX */
    assert_false(sto_key_decode(st_buf_slice(&enc), &d, &scratch));

    k.kind = STO_KEY_COLUMN_DEL;
    k.del_start_us = 10;
    k.del_end_us = 20;
    st_buf_reset(&enc);
    assert_int_equal(sto_key_encode(&enc, &k), ST_OK);
    st_put_be64(enc.data + enc.len - 8, 30); /* start > end */
    assert_false(sto_key_decode(st_buf_slice(&enc), &d, &scratch));

    st_buf_free(&enc);
    st_buf_free(&scratch);
    st_buf_free(&re);
    st_buf_free(&row);
}

static void test_key_encode_rejects_bad_fields(void **state) {
    (void)state;
    st_buf enc;
    st_buf_init(&enc);
    sto_key k = {
        .kind = STO_KEY_CELL, .row = ST_SLICE_LIT("r"), .family = ST_SLICE_LIT("f"), .ts_us = -1};
    assert_int_equal(sto_key_encode(&enc, &k), ST_INVALID_ARGUMENT);
    k.kind = STO_KEY_COLUMN_DEL;
    k.del_start_us = 5;
    k.del_end_us = 4;
    assert_int_equal(sto_key_encode(&enc, &k), ST_INVALID_ARGUMENT);
    k.kind = (sto_key_kind)9;
    assert_int_equal(sto_key_encode(&enc, &k), ST_INVALID_ARGUMENT);
    assert_int_equal(enc.len, 0);
    st_buf_free(&enc);
}

static void test_key_unescape_components(void **state) {
    (void)state;
    st_buf enc, out;
    st_buf_init(&enc);
    st_buf_init(&out);
    static const uint8_t raw[] = {0x00, 'a', 0x00, 0x00, 0xff, 0x01};
    assert_int_equal(sto_key_encode_row_prefix(&enc, st_slice_make(raw, sizeof raw)), ST_OK);
    assert_int_equal(enc.len, sizeof raw + 3 + 2);
    assert_int_equal(sto_key_unescape(st_buf_slice(&enc), &out), ST_OK);
    assert_true(st_slice_eq(st_buf_slice(&out), st_slice_make(raw, sizeof raw)));
    enc.len--; /* cut the terminator */
    assert_int_equal(sto_key_unescape(st_buf_slice(&enc), &out), ST_DATA_LOSS);
    st_buf_free(&enc);
    st_buf_free(&out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_roundtrip_random),
        cmocka_unit_test(test_key_memcmp_order_is_tuple_order),
        cmocka_unit_test(test_key_malformed_rejected),
        cmocka_unit_test(test_key_encode_rejects_bad_fields),
        cmocka_unit_test(test_key_unescape_components),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
