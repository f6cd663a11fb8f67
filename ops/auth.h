/* ops/auth.h — `strata auth` (principals, tokens and roles in a router's auth file) and the
 * principals `strata up --secure` creates (docs/security.md). */
#ifndef STRATA_OPS_AUTH_H
#define STRATA_OPS_AUTH_H

#include "strata/base.h"

#define OPS_AUTH_TOKENS_FILE "tokens"         /* in secure_dir: "ROLE TOKEN" lines, 0600 */
#define OPS_AUTH_PRINCIPALS_FILE "principals" /* in secure_dir: the router's --auth-file */

/* Creates three principals named admin, writer and reader holding those roles on the whole
 * instance, with new random tokens; writes <secure_dir>/tokens (mode 0600, one line per
 * principal: "ROLE TOKEN", admin first) and the auth file <secure_dir>/principals (0600, token
 * hashes only) for strata-router --auth-file. secure_dir must exist. Both files are replaced
 * when present (every earlier token stops working once the router reloads). INTERNAL with the
 * system's reason when a file cannot be written. */
st_code ops_auth_bootstrap(const char *secure_dir, st_err *err);

/* strata auth add-principal|rotate|remove|grant|revoke|list --file FILE ... */
int ops_auth_main(int argc, char **argv);

#endif
