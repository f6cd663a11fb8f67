/*
 * Proves the progress lines of long `strata backup` commands (ops/progress.c) say what an
 * operator needs: sizes in binary units, done / total with a percent, the mean rate and an ETA
 * from it; a percent-only form for server operations; and that a quiet progress prints nothing
 * while a plain (non-terminal) one prints whole lines, never carriage returns.
 */
#define _DEFAULT_SOURCE /* open_memstream */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "progress.h"

static void test_progress_bytes_units(void **state) {
    (void)state;
    char b[32];
    ops_progress_bytes(17, b, sizeof b);
    assert_string_equal(b, "17 B");
    ops_progress_bytes(1536, b, sizeof b);
    assert_string_equal(b, "1.5 KiB");
    ops_progress_bytes(3ull << 30, b, sizeof b);
    assert_string_equal(b, "3.0 GiB");
}

static void test_progress_line_rate_and_eta(void **state) {
    (void)state;
    ops_progress p;
    ops_progress_init(&p, "export", OPS_PROGRESS_BYTES, 100u << 20, true);
    p.done = 25u << 20;
    char line[256];
    ops_progress_line(&p, p.start_us + 5000000, line, sizeof line); /* 25 MiB in 5 s */
    assert_non_null(strstr(line, "25.0 MiB / 100.0 MiB"));
    assert_non_null(strstr(line, " 25%"));
    assert_non_null(strstr(line, "5.0 MiB/s"));
    assert_non_null(strstr(line, "ETA 00:15")); /* 75 MiB at 5 MiB/s */
    assert_non_null(strstr(line, "[######..................]"));
}

static void test_progress_percent_form(void **state) {
    (void)state;
    ops_progress p;
    ops_progress_init(&p, "restore", OPS_PROGRESS_PERCENT, 100, true);
    p.done = 40;
    char line[256];
    ops_progress_line(&p, p.start_us + 3000000, line, sizeof line);
    assert_non_null(strstr(line, " 40% 3s"));
}

static void test_progress_plain_and_quiet(void **state) {
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    ops_progress p;
    ops_progress_init(&p, "verify", OPS_PROGRESS_BYTES, 10, false);
    p.out = f;
    p.tty = false;
    ops_progress_add(&p, 5); /* first call prints: no line printed yet */
    ops_progress_finish(&p, true);
    fflush(f);
    assert_null(memchr(buf, '\r', len));
    assert_true(len > 0 && buf[len - 1] == '\n');
    fclose(f);
    free(buf);
    buf = NULL;
    f = open_memstream(&buf, &len);
    ops_progress_init(&p, "verify", OPS_PROGRESS_BYTES, 10, true);
    p.out = f;
    ops_progress_add(&p, 5);
    ops_progress_note(&p, "x");
    ops_progress_finish(&p, true);
    fflush(f);
    assert_int_equal(len, 0);
    fclose(f);
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_progress_bytes_units),
        cmocka_unit_test(test_progress_line_rate_and_eta),
        cmocka_unit_test(test_progress_percent_form),
        cmocka_unit_test(test_progress_plain_and_quiet),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
