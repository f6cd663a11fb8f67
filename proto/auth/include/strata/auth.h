/* strata/auth.h — principals, bearer tokens and roles: the auth file that strata-router reads
 * (--auth-file) and the `strata` CLI writes (`strata auth`, `strata up --secure`), the bearer
 * header parser, and the permission each public method needs. docs/security.md describes the
 * model; docs/formats/auth-file.md the file.
 *
 * Tokens are 256-bit random strings; the file keeps only their SHA-256. No salt: a salt protects
 * guessable secrets (passwords) from precomputed tables, and a 256-bit random token is not
 * guessable, while an unsalted hash lets a token be found with one hash and one lookup.
 *
 * Roles are nested: reader < writer < admin, so a permission needs a minimum role and a principal
 * holds, on a resource, the highest role granted on it (instance-wide, or on that table).
 *
 * Pure (no I/O) except st_auth_load, st_auth_save and st_auth_token_new. Thread-compatible. */
#ifndef STRATA_AUTH_H
#define STRATA_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/base.h"

#define ST_AUTH_NAME_MAX 64               /* principal name bytes: [A-Za-z0-9._@-] */
#define ST_AUTH_TABLE_MAX 50              /* table id bytes (Bigtable's limit) */
#define ST_AUTH_PRINCIPALS_MAX 10000      /* principals in one file */
#define ST_AUTH_GRANTS_MAX 100000         /* grant lines in one file */
#define ST_AUTH_FILE_BYTES_MAX (16 << 20) /* the auth file's size */
#define ST_AUTH_HASH_BYTES 32             /* SHA-256 */
#define ST_AUTH_TOKEN_PREFIX "st1_"       /* then 64 hex digits: 256 random bits */
#define ST_AUTH_TOKEN_LEN (4 + 64)
#define ST_AUTH_TOKEN_BYTES_MAX 4096 /* longer bearer tokens are refused unhashed */

typedef enum st_role {
    ST_ROLE_NONE = 0,
    ST_ROLE_READER = 1, /* roles/bigtable.reader */
    ST_ROLE_WRITER = 2, /* roles/bigtable.user */
    ST_ROLE_ADMIN = 3,  /* roles/bigtable.admin */
} st_role;

typedef struct st_auth_principal {
    char name[ST_AUTH_NAME_MAX + 1];
    uint8_t hash[ST_AUTH_HASH_BYTES]; /* SHA-256 of the token */
} st_auth_principal;

typedef struct st_auth_grant {
    char principal[ST_AUTH_NAME_MAX + 1];
    st_role role;
    char table[ST_AUTH_TABLE_MAX + 1]; /* "" = the whole instance */
} st_auth_grant;

typedef struct st_auth_hash_ent {
    uint8_t hash[ST_AUTH_HASH_BYTES];
    size_t idx; /* in principals */
} st_auth_hash_ent;

/* The parsed file. Principals in file order; by_hash indexes them sorted by hash. */
typedef struct st_auth_db {
    st_auth_principal *principals;
    size_t n_principals;
    st_auth_grant *grants;
    size_t n_grants;
    st_auth_hash_ent *by_hash;
    size_t n_orphan_grants; /* grant lines naming no principal listed above them: ignored */
} st_auth_db;

void st_auth_db_init(st_auth_db *db);
void st_auth_db_free(st_auth_db *db); /* then empty again */

/* Parses the file's text into db (initialised; replaced). INVALID_ARGUMENT with a message naming
 * the line for a malformed line, a duplicate principal or token hash, or more than the maxima;
 * RESOURCE_EXHAUSTED without memory. db is empty on error. A grant naming no principal listed
 * above it grants nothing (counted in n_orphan_grants), so deleting a principal's line revokes
 * it. */
st_code st_auth_parse(st_slice text, st_auth_db *db, st_err *err);
/* The file's text for db (appended to out). */
st_code st_auth_format(const st_auth_db *db, st_buf *out);
/* Reads and parses path (NOT_FOUND when absent, the errors of st_auth_parse). */
st_code st_auth_load(const char *path, st_auth_db *db, st_err *err);
/* Writes db to path atomically (a temporary file in the same folder, fsync, rename), mode 0600.
 * INTERNAL with the system's reason when that fails. */
st_code st_auth_save(const char *path, const st_auth_db *db, st_err *err);
/* The same atomic write, mode 0600, of any bytes (the tokens file of `strata up --secure`). */
st_code st_auth_write_file(const char *path, st_slice data, st_err *err);

/* ---- editing (the CLI) ---- */
bool st_auth_name_valid(const char *name);
bool st_auth_table_valid(const char *table);
/* Index of the principal, or SIZE_MAX. */
size_t st_auth_principal_find(const st_auth_db *db, const char *name);
/* Adds a principal whose token hashes to hash (ALREADY_EXISTS, INVALID_ARGUMENT for a bad name,
 * RESOURCE_EXHAUSTED). Sets a new hash for an existing one with st_auth_principal_rehash. */
st_code st_auth_principal_add(st_auth_db *db, const char *name, const uint8_t *hash, st_err *err);
st_code st_auth_principal_rehash(st_auth_db *db, const char *name, const uint8_t *hash,
                                 st_err *err);
/* Removes a principal and its grants (NOT_FOUND). */
st_code st_auth_principal_remove(st_auth_db *db, const char *name, st_err *err);
/* Grants role on table ("" or NULL: the instance); replaces the role of an existing grant of the
 * same principal and table. NOT_FOUND for an unknown principal. */
st_code st_auth_grant_add(st_auth_db *db, const char *principal, st_role role, const char *table,
                          st_err *err);
/* Removes the grant of principal on table (NOT_FOUND when there is none). */
st_code st_auth_grant_remove(st_auth_db *db, const char *principal, const char *table, st_err *err);

/* ---- tokens ---- */
void st_auth_hash(st_slice token, uint8_t out[ST_AUTH_HASH_BYTES]);
/* A new random token (ST_AUTH_TOKEN_LEN characters and a NUL in out, cap > ST_AUTH_TOKEN_LEN)
 * and its hash. INTERNAL when the system has no randomness to give. */
st_code st_auth_token_new(char *out, size_t cap, uint8_t hash[ST_AUTH_HASH_BYTES], st_err *err);
/* The principal whose token hashes to hash, or NULL. The final comparison is constant-time. */
const st_auth_principal *st_auth_find_hash(const st_auth_db *db,
                                           const uint8_t hash[ST_AUTH_HASH_BYTES]);
/* The token of an `authorization` header value "Bearer TOKEN" (scheme case-insensitive, spaces
 * around the token allowed; the token: RFC 6750's token68 characters, at most
 * ST_AUTH_TOKEN_BYTES_MAX). false when header is NULL or not such a value. */
bool st_auth_bearer_parse(const char *header, st_slice *token);

/* ---- roles and permissions ---- */
/* "reader" | "writer" | "admin", or the IAM names roles/bigtable.reader | .user | .admin. */
st_role st_auth_role_parse(const char *name);
const char *st_auth_role_name(st_role role);     /* "reader" ... */
const char *st_auth_role_iam_name(st_role role); /* "roles/bigtable.reader" ... */
/* The highest role the file grants principal on table (NULL: instance-wide grants only). */
st_role st_auth_file_role(const st_auth_db *db, const char *principal, const char *table);

/* What a public method needs: a permission named as Cloud Bigtable names it, the minimum role,
 * and where it applies (a table named by the request, or the instance). */
typedef enum st_auth_scope {
    ST_AUTH_SCOPE_INSTANCE, /* grants on the instance only */
    ST_AUTH_SCOPE_TABLE,    /* the table the request names (its field 1), or instance */
    ST_AUTH_SCOPE_ANY,      /* every authenticated principal (TestIamPermissions) */
} st_auth_scope;
typedef struct st_auth_perm {
    const char *name;    /* "bigtable.tables.readRows" */
    st_role role;        /* minimum role */
    st_auth_scope scope; /* TABLE: held through a table's grants too; INSTANCE: the instance's */
} st_auth_perm;
typedef struct st_auth_method {
    const char *path; /* "/google.bigtable.v2.Bigtable/ReadRows" */
    const char *perm; /* permission name */
    st_auth_scope scope;
    bool nested; /* SCOPE_TABLE: the name is field 1 of the message in field 1 (UpdateTable) */
    bool admin;  /* written to the audit log even when allowed */
} st_auth_method;
/* The entry for a method path, or NULL (a method without an entry is refused when auth is on). */
const st_auth_method *st_auth_method_find(const char *path);
/* The permission of that name, or NULL. */
const st_auth_perm *st_auth_perm_find(const char *name);
/* Every permission, for documentation and tests. */
const st_auth_perm *st_auth_perms(size_t *n);
const st_auth_method *st_auth_methods(size_t *n);  /* sorted by path */
const st_auth_method *st_auth_services(size_t *n); /* paths ending in '/' */

#endif
