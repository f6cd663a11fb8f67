/* backup_meta.c — metadata writes of backups that must not race between routers
 * (docs/backups.md, "Several routers").
 *
 * Every router keeps its own copy of the metadata and checks names against it, so two routers
 * of one instance asked to create the same backup id (or to restore into the same table id) at
 * the same moment would both pass their checks. The creation itself is therefore a
 * compare-and-set on the first cluster's metadata table, as IAM policy changes are (iam.c): a
 * CheckAndMutateRow that writes the row only if it holds no cell. The node runs it under the
 * row's lock, so exactly one router wins; the other answers ALREADY_EXISTS. The winner then
 * writes the record to every cluster as any metadata write.
 *
 * A restore has no record until it commits (the table is invisible while it is restored), so it
 * claims its table id with a row "bkclaim/<table name>" holding its operation's name, created
 * the same way and deleted (only if it still names that operation) when the operation ends.
 * Readers ignore the prefix (docs/formats/metadata.md). */
#include "backup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BK_CLAIM_PREFIX "bkclaim/"

typedef struct bk_cas {
    rtr_ctx *r;
    rtr_meta_kind kind; /* create: the record's kind (claims: not written elsewhere) */
    bool claim;         /* a restore's claim: only cluster 0's row */
    bool release;       /* a claim given back */
    char *name;
    st_buf pb;
    rtr_meta_done_fn done;
    void *arg;
} bk_cas;

static void cas_free(bk_cas *c) {
    free(c->name);
    st_buf_free(&c->pb);
    free(c);
}

static void created_everywhere(void *arg, st_code code, const char *msg) {
    bk_cas *c = arg;
    c->done(c->arg, code, msg);
    cas_free(c);
}

static void cas_done(void *arg, st_code code, const char *message, bool matched) {
    bk_cas *c = arg;
    if (code != ST_OK) {
        st_err err = {0};
        st_err_set(&err, code,
                   "could not record %s in the metadata of cluster %s (the first of the "
                   "topology, where new backups and restores are compared and set; retry when "
                   "it is reachable): %s",
                   c->name, c->r->clusters[0].topo->id, message);
        c->done(c->arg, code, err.msg);
        cas_free(c);
        return;
    }
    if (c->release) { /* done whether or not the claim still named the operation */
        c->done(c->arg, ST_OK, NULL);
        cas_free(c);
        return;
    }
    if (matched) {
        c->done(c->arg, ST_ALREADY_EXISTS, "another router created it first");
        cas_free(c);
        return;
    }
    if (c->claim) {
        c->done(c->arg, ST_OK, NULL);
        cas_free(c);
        return;
    }
    st_slice s = st_buf_slice(&c->pb);
    rtr_meta_write(c->r, c->kind, c->name, &s, created_everywhere, c);
}

/* Sends the compare-and-set for row key to cluster 0. */
static void cas_send(bk_cas *c, st_slice key, const st_slice *pb, const st_slice *expect) {
    st_code rc = rtr_meta_cas(c->r, key, expect, pb, cas_done, c);
    if (rc == ST_OK)
        return;
    c->done(c->arg, rc,
            rc != ST_UNAVAILABLE ? "out of memory"
                                 : "no tablet of the metadata table is known in the first "
                                   "cluster, where new backups and restores are compared and "
                                   "set: retry when it is reachable");
    cas_free(c);
}

static bk_cas *cas_new(rtr_ctx *r, rtr_meta_kind kind, const char *name, const st_slice *pb,
                       rtr_meta_done_fn done, void *arg) {
    bk_cas *c = calloc(1, sizeof *c);
    if (c) {
        st_buf_init(&c->pb);
        c->name = strdup(name);
    }
    if (!c || !c->name || (pb && st_buf_append(&c->pb, pb->data, pb->len) != ST_OK)) {
        if (c)
            cas_free(c);
        done(arg, ST_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    c->r = r;
    c->kind = kind;
    c->done = done;
    c->arg = arg;
    return c;
}

void rtr_bk_meta_create(rtr_ctx *r, rtr_meta_kind kind, const char *name, st_slice pb,
                        rtr_meta_done_fn done, void *arg) {
    bk_cas *c = cas_new(r, kind, name, &pb, done, arg);
    if (!c)
        return;
    st_buf key;
    st_buf_init(&key);
    if (rtr_meta_row_key(kind, name, &key) != ST_OK) {
        st_buf_free(&key);
        done(arg, ST_RESOURCE_EXHAUSTED, "out of memory");
        cas_free(c);
        return;
    }
    cas_send(c, st_buf_slice(&key), &pb, NULL);
    st_buf_free(&key);
}

/* "bkclaim/<table>" into key. */
static st_code claim_key(const char *table, st_buf *key) {
    st_buf_reset(key);
    if (st_buf_append(key, BK_CLAIM_PREFIX, strlen(BK_CLAIM_PREFIX)) != ST_OK ||
        st_buf_append(key, table, strlen(table)) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    return ST_OK;
}

static void claim_op(rtr_ctx *r, const char *table, const char *op, bool take,
                     rtr_meta_done_fn done, void *arg) {
    st_slice v = st_slice_cstr(op);
    bk_cas *c = cas_new(r, RTR_META_KIND_OP, table, take ? &v : NULL, done, arg);
    if (!c)
        return;
    c->claim = take;
    c->release = !take;
    st_buf key;
    st_buf_init(&key);
    if (claim_key(table, &key) != ST_OK) {
        st_buf_free(&key);
        done(arg, ST_RESOURCE_EXHAUSTED, "out of memory");
        cas_free(c);
        return;
    }
    cas_send(c, st_buf_slice(&key), take ? &v : NULL, take ? NULL : &v);
    st_buf_free(&key);
}

void rtr_bk_claim(rtr_ctx *r, const char *table, const char *op, rtr_meta_done_fn done, void *arg) {
    claim_op(r, table, op, true, done, arg);
}

void rtr_bk_unclaim(rtr_ctx *r, const char *table, const char *op, rtr_meta_done_fn done,
                    void *arg) {
    claim_op(r, table, op, false, done, arg);
}

st_code rtr_bk_first_get(rtr_ctx *r, rtr_meta_kind kind, const char *name, rtr_meta_get_fn done,
                         void *arg) {
    st_buf key;
    st_buf_init(&key);
    st_code rc =
        kind == RTR_META_KIND_OP ? claim_key(name, &key) : rtr_meta_row_key(kind, name, &key);
    if (rc == ST_OK)
        rc = rtr_meta_get(r, st_buf_slice(&key), done, arg);
    st_buf_free(&key);
    return rc;
}

/* ---- a table id reserved by CreateTable or RestoreTable ---- */

typedef struct bk_reserve {
    rtr_ctx *r;
    char *table, *token;
    bool retried; /* a stale CreateTable claim was released and the claim tried again */
    rtr_meta_done_fn done;
    void *arg;
} bk_reserve;

static void reserve_end(bk_reserve *v, st_code code, const char *msg) {
    v->done(v->arg, code, msg);
    free(v->table);
    free(v->token);
    free(v);
}

static void released(void *arg, st_code code, const char *msg) {
    char *what = arg;
    if (code != ST_OK)
        st_log(ST_LOG_WARN, "router", "releasing the claim %s: %s", what,
               msg ? msg : st_code_name(code));
    free(what);
}

/* Gives back the claim if it still holds token; not waited for. */
static void release(rtr_ctx *r, const char *table, const char *token) {
    char *what = strdup(token);
    if (what)
        rtr_bk_unclaim(r, table, what, released, what);
}

static void reserve_claim(bk_reserve *v);

static void table_read(void *arg, st_code code, const char *msg, bool found, st_slice value) {
    bk_reserve *v = arg;
    (void)value;
    if (code != ST_OK || found)
        release(v->r, v->table, v->token);
    if (code != ST_OK) {
        st_err err = {0};
        st_err_set(&err, code,
                   "could not read table %s in the metadata of cluster %s (the first of the "
                   "topology; retry when it is reachable): %s",
                   v->table, v->r->clusters[0].topo->id, msg ? msg : st_code_name(code));
        reserve_end(v, code, err.msg);
        return;
    }
    reserve_end(v, found ? ST_ALREADY_EXISTS : ST_OK,
                found ? "the table was created a moment ago (through another router)" : NULL);
}

static void stale_released(void *arg, st_code code, const char *msg) {
    bk_reserve *v = arg;
    (void)msg;
    if (code != ST_OK) {
        reserve_end(v, code,
                    "could not release a stale claim in the metadata of the first "
                    "cluster: retry when it is reachable");
        return;
    }
    reserve_claim(v);
}

/* Whether token is a CreateTable claim of this run that no running call holds. */
static bool create_claim_orphaned(rtr_ctx *r, const char *token, const char *owner) {
    if (strcmp(owner, rtr_bk_owner(r)) != 0)
        return false;
    for (size_t i = 0; i < r->bk->n_creating; i++)
        if (strcmp(r->bk->creating[i], token) == 0)
            return false;
    return true;
}

/* A CreateTable claim ("tablecreate/<us>/<router>") of an earlier run of this router, or older
 * than RTR_BK_CREATE_CLAIM_TTL_US, is one whose router died while creating the table; one of
 * this run that no running call holds was left by a call that failed while its claim's write was
 * in doubt. Either is released and the claim tried again. */
static void claim_read(void *arg, st_code code, const char *msg, bool found, st_slice value) {
    bk_reserve *v = arg;
    (void)msg;
    char old[RTR_OP_NAME_MAX + 1];
    long long us = 0;
    size_t pre = strlen(RTR_BK_CREATE_CLAIM);
    bool create = code == ST_OK && found && value.len < sizeof old && value.len > pre &&
                  !memcmp(value.data, RTR_BK_CREATE_CLAIM, pre);
    if (create) {
        memcpy(old, value.data, value.len);
        old[value.len] = '\0';
    }
    const char *owner = create ? strchr(old + pre, '/') : NULL; /* "/host:port/<start us>" */
    bool stale =
        owner && sscanf(old + pre, "%lld", &us) == 1 &&
        (st_wall_us() - us > RTR_BK_CREATE_CLAIM_TTL_US ||
         rtr_bk_owner_is_past_me(v->r, owner + 1) || create_claim_orphaned(v->r, old, owner + 1));
    if (!stale) {
        reserve_end(v, ST_ALREADY_EXISTS, "another router is creating or restoring it");
        return;
    }
    st_log(ST_LOG_WARN, "router",
           "table=%s: releasing the claim %s of a CreateTable that never finished", v->table, old);
    v->retried = true;
    rtr_bk_unclaim(v->r, v->table, old, stale_released, v);
}

/* Reads row key of the first cluster's metadata into then; false when it could not be sent
 * (v ended with the error). */
static bool reserve_read(bk_reserve *v, rtr_meta_kind kind, rtr_meta_get_fn then) {
    st_buf key;
    st_buf_init(&key);
    st_code rc = kind == RTR_META_KIND_OP ? claim_key(v->table, &key)
                                          : rtr_meta_row_key(kind, v->table, &key);
    if (rc == ST_OK)
        rc = rtr_meta_get(v->r, st_buf_slice(&key), then, v);
    st_buf_free(&key);
    if (rc == ST_OK)
        return true;
    if (kind == RTR_META_KIND_TABLE)
        release(v->r, v->table, v->token);
    reserve_end(v, rc,
                rc == ST_UNAVAILABLE ? "no tablet of the metadata table is known in the first "
                                       "cluster: retry when it is reachable"
                                     : "out of memory");
    return false;
}

/* The claim is taken (or refused): the table's record is then read where it is written first,
 * so a table created (or restored) through another router a moment ago, whose record this
 * router's copy does not hold yet, is found. */
static void claimed(void *arg, st_code code, const char *msg) {
    bk_reserve *v = arg;
    if (code == ST_ALREADY_EXISTS && !v->retried)
        reserve_read(v, RTR_META_KIND_OP, claim_read);
    else if (code == ST_OK)
        reserve_read(v, RTR_META_KIND_TABLE, table_read);
    else
        reserve_end(v, code,
                    code == ST_ALREADY_EXISTS ? "another router is creating or restoring it" : msg);
}

static void reserve_claim(bk_reserve *v) {
    rtr_bk_claim(v->r, v->table, v->token, claimed, v);
}

void rtr_bk_reserve_table(rtr_ctx *r, const char *table, const char *token, rtr_meta_done_fn done,
                          void *arg) {
    bk_reserve *v = calloc(1, sizeof *v);
    if (v) {
        v->table = strdup(table);
        v->token = strdup(token);
    }
    if (!v || !v->table || !v->token) {
        if (v) {
            free(v->table);
            free(v->token);
        }
        free(v);
        done(arg, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    v->r = r;
    v->done = done;
    v->arg = arg;
    reserve_claim(v);
}

bool rtr_bk_create_token(rtr_ctx *r, char *out, size_t cap) {
    rtr_bk *bk = r->bk;
    snprintf(out, cap, "%s%lld/%s", RTR_BK_CREATE_CLAIM, (long long)st_wall_us(), rtr_bk_owner(r));
    if (bk->n_creating == bk->cap_creating) {
        size_t cap2 = bk->cap_creating ? bk->cap_creating * 2 : 8;
        char **grown = realloc(bk->creating, cap2 * sizeof *grown);
        if (!grown)
            return false;
        bk->creating = grown;
        bk->cap_creating = cap2;
    }
    char *copy = strdup(out);
    if (copy)
        bk->creating[bk->n_creating++] = copy;
    return copy != NULL;
}

void rtr_bk_create_end(rtr_ctx *r, const char *token) {
    rtr_bk *bk = r->bk;
    for (size_t i = 0; i < bk->n_creating; i++)
        if (strcmp(bk->creating[i], token) == 0) {
            free(bk->creating[i]);
            bk->creating[i] = bk->creating[--bk->n_creating];
            return;
        }
}
