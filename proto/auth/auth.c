/* auth.c — the principals and grants of an auth file in memory: names, editing, the index of
 * token hashes, and the role a principal holds (strata/auth.h). */
#include "strata/auth.h"

#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void st_auth_db_init(st_auth_db *db) {
    memset(db, 0, sizeof *db);
}

void st_auth_db_free(st_auth_db *db) {
    free(db->principals);
    free(db->grants);
    free(db->by_hash);
    st_auth_db_init(db);
}

static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '@' || c == '-';
}

bool st_auth_name_valid(const char *name) {
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > ST_AUTH_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!name_char(name[i]))
            return false;
    return true;
}

/* Bigtable's table ids: [_a-zA-Z0-9][-_.a-zA-Z0-9]*, at most 50 characters. */
bool st_auth_table_valid(const char *table) {
    size_t n = table ? strlen(table) : 0;
    if (n == 0 || n > ST_AUTH_TABLE_MAX || table[0] == '-' || table[0] == '.')
        return false;
    for (size_t i = 0; i < n; i++)
        if (!name_char(table[i]) || table[i] == '@')
            return false;
    return true;
}

/* ---- hash index ---- */

static int by_hash_cmp(const void *a, const void *b) {
    return memcmp(((const st_auth_hash_ent *)a)->hash, ((const st_auth_hash_ent *)b)->hash,
                  ST_AUTH_HASH_BYTES);
}

/* Rebuilds by_hash. INVALID_ARGUMENT when two principals share a hash (one token, two names). */
static st_code index_build(st_auth_db *db, st_err *err) {
    free(db->by_hash);
    db->by_hash = malloc((db->n_principals ? db->n_principals : 1) * sizeof *db->by_hash);
    if (!db->by_hash)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t i = 0; i < db->n_principals; i++) {
        memcpy(db->by_hash[i].hash, db->principals[i].hash, ST_AUTH_HASH_BYTES);
        db->by_hash[i].idx = i;
    }
    qsort(db->by_hash, db->n_principals, sizeof *db->by_hash, by_hash_cmp);
    for (size_t i = 1; i < db->n_principals; i++)
        if (!memcmp(db->by_hash[i - 1].hash, db->by_hash[i].hash, ST_AUTH_HASH_BYTES))
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "principals %s and %s have the same token: rotate one of them "
                              "(strata auth rotate NAME)",
                              db->principals[db->by_hash[i - 1].idx].name,
                              db->principals[db->by_hash[i].idx].name);
    return ST_OK;
}

const st_auth_principal *st_auth_find_hash(const st_auth_db *db,
                                           const uint8_t hash[ST_AUTH_HASH_BYTES]) {
    size_t lo = 0, hi = db->n_principals;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const st_auth_hash_ent *e = &db->by_hash[mid];
        int c = memcmp(e->hash, hash, ST_AUTH_HASH_BYTES);
        if (c == 0) /* the search leaks where a hash sorts, never a token; the match is exact */
            return CRYPTO_memcmp(e->hash, hash, ST_AUTH_HASH_BYTES) == 0 ? &db->principals[e->idx]
                                                                         : NULL;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* ---- editing ---- */

size_t st_auth_principal_find(const st_auth_db *db, const char *name) {
    for (size_t i = 0; i < db->n_principals; i++)
        if (!strcmp(db->principals[i].name, name))
            return i;
    return SIZE_MAX;
}

static st_code principal_push(st_auth_db *db, const char *name, const uint8_t *hash, st_err *err) {
    if (!st_auth_name_valid(name))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "bad principal name '%.80s': use 1 to %d letters, digits or . _ @ -",
                          name, ST_AUTH_NAME_MAX);
    if (st_auth_principal_find(db, name) != SIZE_MAX)
        return st_err_set(err, ST_ALREADY_EXISTS, "principal %s already exists", name);
    if (db->n_principals >= ST_AUTH_PRINCIPALS_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "more than %d principals",
                          ST_AUTH_PRINCIPALS_MAX);
    st_auth_principal *v = realloc(db->principals, (db->n_principals + 1) * sizeof *v);
    if (!v)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    db->principals = v;
    st_auth_principal *p = &v[db->n_principals++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    memcpy(p->hash, hash, ST_AUTH_HASH_BYTES);
    return ST_OK;
}

st_code st_auth_principal_add(st_auth_db *db, const char *name, const uint8_t *hash, st_err *err) {
    st_code rc = principal_push(db, name, hash, err);
    if (rc != ST_OK)
        return rc;
    rc = index_build(db, err);
    if (rc != ST_OK) {
        db->n_principals--;
        index_build(db, NULL);
    }
    return rc;
}

st_code st_auth_principal_rehash(st_auth_db *db, const char *name, const uint8_t *hash,
                                 st_err *err) {
    size_t i = st_auth_principal_find(db, name);
    if (i == SIZE_MAX)
        return st_err_set(err, ST_NOT_FOUND,
                          "no principal %.80s: add it with strata auth "
                          "add-principal NAME",
                          name);
    uint8_t old[ST_AUTH_HASH_BYTES];
    memcpy(old, db->principals[i].hash, sizeof old);
    memcpy(db->principals[i].hash, hash, ST_AUTH_HASH_BYTES);
    st_code rc = index_build(db, err);
    if (rc != ST_OK) {
        memcpy(db->principals[i].hash, old, sizeof old);
        index_build(db, NULL);
    }
    return rc;
}

st_code st_auth_principal_remove(st_auth_db *db, const char *name, st_err *err) {
    size_t i = st_auth_principal_find(db, name);
    if (i == SIZE_MAX)
        return st_err_set(err, ST_NOT_FOUND, "no principal %.80s", name);
    memmove(&db->principals[i], &db->principals[i + 1],
            (db->n_principals - i - 1) * sizeof *db->principals);
    db->n_principals--;
    size_t k = 0;
    for (size_t j = 0; j < db->n_grants; j++)
        if (strcmp(db->grants[j].principal, name))
            db->grants[k++] = db->grants[j];
    db->n_grants = k;
    return index_build(db, err);
}

static size_t grant_find(const st_auth_db *db, const char *principal, const char *table) {
    for (size_t i = 0; i < db->n_grants; i++)
        if (!strcmp(db->grants[i].principal, principal) && !strcmp(db->grants[i].table, table))
            return i;
    return SIZE_MAX;
}

st_code st_auth_grant_add(st_auth_db *db, const char *principal, st_role role, const char *table,
                          st_err *err) {
    table = table ? table : "";
    if (st_auth_principal_find(db, principal) == SIZE_MAX)
        return st_err_set(err, ST_NOT_FOUND,
                          "no principal %.80s: add it first (strata auth add-principal NAME)",
                          principal);
    if (role == ST_ROLE_NONE)
        return st_err_set(err, ST_INVALID_ARGUMENT, "no role: use reader, writer or admin");
    if (table[0] && !st_auth_table_valid(table))
        return st_err_set(err, ST_INVALID_ARGUMENT, "bad table id '%.80s'", table);
    size_t i = grant_find(db, principal, table);
    if (i != SIZE_MAX) {
        db->grants[i].role = role;
        return ST_OK;
    }
    if (db->n_grants >= ST_AUTH_GRANTS_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "more than %d grants", ST_AUTH_GRANTS_MAX);
    st_auth_grant *v = realloc(db->grants, (db->n_grants + 1) * sizeof *v);
    if (!v)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    db->grants = v;
    st_auth_grant *g = &v[db->n_grants++];
    memset(g, 0, sizeof *g);
    snprintf(g->principal, sizeof g->principal, "%s", principal);
    snprintf(g->table, sizeof g->table, "%s", table);
    g->role = role;
    return ST_OK;
}

st_code st_auth_grant_remove(st_auth_db *db, const char *principal, const char *table,
                             st_err *err) {
    table = table ? table : "";
    size_t i = grant_find(db, principal, table);
    if (i == SIZE_MAX)
        return st_err_set(err, ST_NOT_FOUND, "principal %.80s has no grant on %s%.80s", principal,
                          table[0] ? "table " : "the instance", table);
    memmove(&db->grants[i], &db->grants[i + 1], (db->n_grants - i - 1) * sizeof *db->grants);
    db->n_grants--;
    return ST_OK;
}

st_role st_auth_file_role(const st_auth_db *db, const char *principal, const char *table) {
    st_role best = ST_ROLE_NONE;
    for (size_t i = 0; i < db->n_grants; i++) {
        const st_auth_grant *g = &db->grants[i];
        if (g->role > best && !strcmp(g->principal, principal) &&
            (!g->table[0] || (table && !strcmp(g->table, table))))
            best = g->role;
    }
    return best;
}
