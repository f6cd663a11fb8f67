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
