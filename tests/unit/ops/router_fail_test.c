/* router_fail_test.c — ops_router_fail_of and ops_router_hint: a failure of this process's own
 * connection to the router is told from the router's answer about a node it cannot reach (the
 * router quotes that node's connection error inside its own words; `strata failover` right
 * after a zone died took such an answer for a dead router and gave up instead of retrying), and
 * TLS sent to a plaintext router is named as such. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "certs.h"

static void test_own_connection(void **state) {
    (void)state;
    assert_int_equal(ops_router_fail_of(ST_UNAVAILABLE,
                                        "connection to 127.0.0.1:1 failed: connect failed: "
                                        "Connection refused",
                                        false),
                     OPS_ROUTER_FAIL_DOWN);
    assert_int_equal(ops_router_fail_of(ST_UNAVAILABLE,
                                        "connection to 127.0.0.1:1 failed: connection closed by "
                                        "the server",
                                        false),
                     OPS_ROUTER_FAIL_TLS);
    assert_int_equal(ops_router_fail_of(ST_UNAVAILABLE,
                                        "connection to 127.0.0.1:1 failed: TLS handshake failed: "
                                        "unknown ca",
                                        true),
                     OPS_ROUTER_FAIL_TLS);
    /* as the CLI words it: "CALL at ADDR: CODE: MSG" */
    assert_int_equal(ops_router_fail_of(ST_UNAVAILABLE,
                                        "UpdateTable t at 127.0.0.1:1: UNAVAILABLE: connection to "
                                        "127.0.0.1:1 failed: connection closed by the server",
                                        false),
                     OPS_ROUTER_FAIL_TLS);
    assert_int_equal(ops_router_fail_of(ST_UNAUTHENTICATED, "bad token", false),
                     OPS_ROUTER_FAIL_TOKEN);
}

static void test_router_answer_quoting_a_node(void **state) {
    (void)state;
    const char *msg = "could not store app profile 'app': connection to "
                      "unix:/tmp/i/east-0/node.sock failed: connect failed: Connection refused";
    assert_int_equal(ops_router_fail_of(ST_UNAVAILABLE, msg, false), OPS_ROUTER_FAIL_OTHER);
    assert_int_equal(ops_router_fail_of(ST_UNAVAILABLE, msg, true), OPS_ROUTER_FAIL_OTHER);
    assert_string_equal(ops_router_hint(ST_UNAVAILABLE, msg, false, false), "");
    const char *relayed = "UpdateTable t at 127.0.0.1:1: UNAVAILABLE: connection to "
                          "unix:/tmp/i/east-0/node.sock failed: connect failed";
    assert_int_equal(ops_router_fail_of(ST_UNAVAILABLE, relayed, false), OPS_ROUTER_FAIL_OTHER);
    const char *closed = "node 127.0.0.1:5 failed: connection closed by the server";
    assert_int_equal(ops_router_fail_of(ST_UNAVAILABLE, closed, false), OPS_ROUTER_FAIL_OTHER);
}

static void test_tls_to_plaintext_router(void **state) {
    (void)state;
    const char *wrong = "connection to 127.0.0.1:1 failed: TLS handshake failed: "
                        "error:0A00010B:SSL routines::wrong version number";
    assert_non_null(strstr(ops_router_hint(ST_UNAVAILABLE, wrong, true, true), "plaintext"));
    const char *closed = "connection to 127.0.0.1:1 failed: connection closed by the server";
    assert_non_null(strstr(ops_router_hint(ST_UNAVAILABLE, closed, true, true), "plaintext"));
    /* a real handshake failure keeps the CA advice */
    const char *ca = "connection to 127.0.0.1:1 failed: TLS handshake failed: unknown ca";
    assert_non_null(strstr(ops_router_hint(ST_UNAVAILABLE, ca, true, true), "--tls-ca FILE"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_own_connection),
        cmocka_unit_test(test_router_answer_quoting_a_node),
        cmocka_unit_test(test_tls_to_plaintext_router),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
