/* gc_test — proves a GC rule set is a deep copy (the caller's rules can change or vanish
 * afterwards), is found by family name, rejects malformed rules, and that rule evaluation gives
 * the documented answer for each kind and for nested union / intersection, including the
 * "versions unknown" mode compactions use. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "rowread.h"

#define HOUR_US (3600LL * 1000000)

static void test_gc_set_deep_copy_and_find(void **state) {
    (void)state;
    char fam_a[] = "alpha", fam_b[] = "beta";
    sto_gc_rule kids[2] = {{.kind = STO_GC_MAX_VERSIONS, .max_versions = 2},
                           {.kind = STO_GC_MAX_AGE, .max_age_us = HOUR_US}};
    sto_family_gc fams[3] = {
        {.family = st_slice_make(fam_b, 4),
         .rule = {.kind = STO_GC_UNION, .children = kids, .n_children = 2}},
        {.family = st_slice_make(fam_a, 5),
         .rule = {.kind = STO_GC_MAX_VERSIONS, .max_versions = 1}},
        {.family = ST_SLICE_LIT("none"), .rule = {.kind = STO_GC_NONE}},
    };
    sto_gc_set *g;
    assert_int_equal(sto_gc_set_new(fams, 3, &g), ST_OK);
    /* Scribble over the source: the set must not notice. */
    memset(fam_a, 'x', 5);
    memset(fam_b, 'x', 4);
    kids[0].max_versions = 99;
    kids[1].kind = STO_GC_NONE;
    const sto_gc_rule *r = sto_gc_set_find(g, ST_SLICE_LIT("beta"));
    assert_non_null(r);
    assert_int_equal(r->kind, STO_GC_UNION);
    assert_int_equal(r->n_children, 2);
    assert_int_equal(r->children[0].max_versions, 2);
    assert_int_equal(r->children[1].kind, STO_GC_MAX_AGE);
    r = sto_gc_set_find(g, ST_SLICE_LIT("alpha"));
    assert_non_null(r);
    assert_int_equal(r->max_versions, 1);
    assert_null(sto_gc_set_find(g, ST_SLICE_LIT("none"))); /* NONE keeps all: same as absent */
    assert_null(sto_gc_set_find(g, ST_SLICE_LIT("gamma")));
    assert_null(sto_gc_set_find(g, ST_SLICE_LIT("alph")));
    assert_null(sto_gc_set_find(NULL, ST_SLICE_LIT("alpha")));
    sto_gc_set_ref(g);
    sto_gc_set_unref(g);
    assert_non_null(sto_gc_set_find(g, ST_SLICE_LIT("alpha")));
    sto_gc_set_unref(g);

    assert_int_equal(sto_gc_set_new(NULL, 0, &g), ST_OK);
    assert_null(sto_gc_set_find(g, ST_SLICE_LIT("alpha")));
    sto_gc_set_unref(g);
}

static void test_gc_set_rejects_bad_rules(void **state) {
    (void)state;
    sto_gc_set *g = NULL;
    sto_family_gc f = {.family = ST_SLICE_LIT("f"),
                       .rule = {.kind = STO_GC_MAX_VERSIONS, .max_versions = -1}};
    assert_int_equal(sto_gc_set_new(&f, 1, &g), ST_INVALID_ARGUMENT);
    f.rule = (sto_gc_rule){.kind = STO_GC_MAX_AGE, .max_age_us = -5};
    assert_int_equal(sto_gc_set_new(&f, 1, &g), ST_INVALID_ARGUMENT);
    f.rule = (sto_gc_rule){.kind = (sto_gc_kind)77};
    assert_int_equal(sto_gc_set_new(&f, 1, &g), ST_INVALID_ARGUMENT);
    f.rule = (sto_gc_rule){.kind = STO_GC_UNION, .children = NULL, .n_children = 3};
    assert_int_equal(sto_gc_set_new(&f, 1, &g), ST_INVALID_ARGUMENT);
    /* Nesting deeper than STO_GC_DEPTH_MAX. */
    sto_gc_rule chain[STO_GC_DEPTH_MAX + 2];
    for (int i = 0; i < STO_GC_DEPTH_MAX + 2; i++)
        chain[i] = (sto_gc_rule){.kind = STO_GC_UNION, .children = &chain[i + 1], .n_children = 1};
    chain[STO_GC_DEPTH_MAX + 1] = (sto_gc_rule){.kind = STO_GC_MAX_VERSIONS, .max_versions = 1};
    f.rule = chain[0];
    assert_int_equal(sto_gc_set_new(&f, 1, &g), ST_INVALID_ARGUMENT);
    f.rule = chain[2];
    assert_int_equal(sto_gc_set_new(&f, 1, &g), ST_OK);
    sto_gc_set_unref(g);
    /* One rule per family. */
    sto_family_gc twice[2] = {{.family = ST_SLICE_LIT("f"), .rule = {.kind = STO_GC_NONE}},
                              {.family = ST_SLICE_LIT("f"), .rule = {.kind = STO_GC_NONE}}};
    assert_int_equal(sto_gc_set_new(twice, 2, &g), ST_INVALID_ARGUMENT);
}

static void test_gc_rule_evaluation(void **state) {
    (void)state;
    const int64_t now = 1000 * HOUR_US;
    const int64_t fresh = now - HOUR_US / 2, old = now - 2 * HOUR_US;
    sto_gc_rule none = {.kind = STO_GC_NONE};
    sto_gc_rule v2 = {.kind = STO_GC_MAX_VERSIONS, .max_versions = 2};
    sto_gc_rule age = {.kind = STO_GC_MAX_AGE, .max_age_us = HOUR_US};
    assert_false(sto_gc_rule_garbage(&none, 100, 0, now, true));
    assert_false(sto_gc_rule_garbage(&v2, 2, old, now, true));
    assert_true(sto_gc_rule_garbage(&v2, 3, fresh, now, true));
    assert_false(sto_gc_rule_garbage(&v2, 3, fresh, now, false)); /* unknown: keep */
    assert_false(sto_gc_rule_garbage(&age, 9, fresh, now, true));
    assert_true(sto_gc_rule_garbage(&age, 1, old, now, true));
    assert_true(sto_gc_rule_garbage(&age, 1, old, now, false));
    assert_false(sto_gc_rule_garbage(&age, 1, now - HOUR_US, now, true)); /* exactly max age */
    assert_true(sto_gc_rule_garbage(&age, 1, now - HOUR_US - 1, now, true));
    assert_false(sto_gc_rule_garbage(&age, 1, now + 5, now, true)); /* future timestamps */
    assert_false(sto_gc_rule_garbage(&age, 1, 0, 0, true));

    sto_gc_rule both[2] = {v2, age};
    sto_gc_rule uni = {.kind = STO_GC_UNION, .children = both, .n_children = 2};
    sto_gc_rule inter = {.kind = STO_GC_INTERSECTION, .children = both, .n_children = 2};
    assert_true(sto_gc_rule_garbage(&uni, 3, fresh, now, true));
    assert_true(sto_gc_rule_garbage(&uni, 1, old, now, true));
    assert_false(sto_gc_rule_garbage(&uni, 2, fresh, now, true));
    assert_false(sto_gc_rule_garbage(&inter, 3, fresh, now, true));
    assert_false(sto_gc_rule_garbage(&inter, 1, old, now, true));
    assert_true(sto_gc_rule_garbage(&inter, 3, old, now, true));
    assert_false(sto_gc_rule_garbage(&inter, 3, old, now, false));

    /* intersection(intersection(max_age, max_versions 3), max_versions 1), then as a union. */
    sto_gc_rule v1 = {.kind = STO_GC_MAX_VERSIONS, .max_versions = 1};
    sto_gc_rule v3 = {.kind = STO_GC_MAX_VERSIONS, .max_versions = 3};
    sto_gc_rule inner_kids[2] = {age, v3};
    sto_gc_rule inner = {.kind = STO_GC_INTERSECTION, .children = inner_kids, .n_children = 2};
    sto_gc_rule outer_kids[2] = {inner, v1};
    sto_gc_rule outer = {.kind = STO_GC_INTERSECTION, .children = outer_kids, .n_children = 2};
    assert_false(sto_gc_rule_garbage(&outer, 4, fresh, now, true));
    assert_false(sto_gc_rule_garbage(&outer, 3, old, now, true));
    assert_true(sto_gc_rule_garbage(&outer, 4, old, now, true));
    sto_gc_rule nested_union_kids[2] = {inner, v1};
    sto_gc_rule nested_union = {
        .kind = STO_GC_UNION, .children = nested_union_kids, .n_children = 2};
    assert_true(sto_gc_rule_garbage(&nested_union, 2, fresh, now, true));
    assert_false(sto_gc_rule_garbage(&nested_union, 1, old, now, true));
    assert_true(sto_gc_rule_garbage(&nested_union, 4, old, now, true));

    sto_gc_rule empty_inter = {.kind = STO_GC_INTERSECTION};
    sto_gc_rule empty_union = {.kind = STO_GC_UNION};
    assert_false(sto_gc_rule_garbage(&empty_inter, 100, 0, now, true));
    assert_false(sto_gc_rule_garbage(&empty_union, 100, 0, now, true));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gc_set_deep_copy_and_find),
        cmocka_unit_test(test_gc_set_rejects_bad_rules),
        cmocka_unit_test(test_gc_rule_evaluation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
