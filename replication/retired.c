/* retired.c — tablets that stopped existing here while their table lives on (split parents, and
 * tablets moved away before the peers had all their records).
 * A log record names its tablet only, and the shipper finds the table through the tablet. The
 * names learned in memory are lost at a restart, and storage lists live tablets only, so after a
 * split and a restart the parent's unshipped records looked like records of a dropped table and
 * were skipped for good (and consistency tokens then said yes). The retired ids are therefore
 * kept in <state_dir>/retired-tablets until every peer has recorded a position past the
 * tablet's last record. Loop thread only. */
#include "repl_internal.h"
#include "shipper_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RETIRED_FILE "retired-tablets"
#define RETIRED_HEADER "repl-retired v1\n"

static void retired_path(const repl_ctx *r, char *out, size_t cap) {
    snprintf(out, cap, "%s/" RETIRED_FILE, r->state_dir);
}

/* Every peer recorded a position past every record at or below lsn. */
static bool retired_shipped(const repl_ctx *r, uint64_t lsn) {
    if (lsn == 0)
        return false; /* the split is still under way: its last record is not known yet */
    for (size_t i = 0; i < r->n_shippers; i++)
        if (shipper_durable_get(r->shippers[i]) <= lsn)
            return false;
    return true;
}

static void retired_remove_at(repl_ctx *r, size_t i) {
    free(r->retired[i].table);
    r->retired[i] = r->retired[--r->n_retired];
}

/* Drops the entries every peer has passed; true when one went. */
static bool retired_prune(repl_ctx *r) {
    bool changed = false;
    for (size_t i = r->n_retired; i-- > 0;)
        if (retired_shipped(r, r->retired[i].lsn)) {
            retired_remove_at(r, i);
            changed = true;
        }
    return changed;
}

/* Rewrites the file atomically from memory (removed when empty). */
static st_code retired_save(repl_ctx *r, st_err *err) {
    char path[sizeof r->state_dir + 32];
    retired_path(r, path, sizeof path);
    st_env *env = st_env_posix();
    if (r->n_retired == 0) {
        st_code rc = env->ops->remove(env, path, err);
        return rc == ST_NOT_FOUND ? ST_OK : rc;
    }
    st_buf b;
    st_buf_init(&b);
    st_code rc = st_buf_append(&b, RETIRED_HEADER, strlen(RETIRED_HEADER));
    for (size_t i = 0; rc == ST_OK && i < r->n_retired; i++) {
        char line[64];
        int len = snprintf(line, sizeof line, "%" PRIu64 " %" PRIu64 " ", r->retired[i].id,
                           r->retired[i].lsn);
        rc = st_buf_append(&b, line, (size_t)len);
        if (rc == ST_OK)
            rc = st_buf_append(&b, r->retired[i].table, strlen(r->retired[i].table));
        if (rc == ST_OK)
            rc = st_buf_append_byte(&b, '\n');
    }
    if (rc != ST_OK)
        rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory saving retired tablets");
    else
        rc = st_env_write_atomic(env, path, b.data, b.len, err);
    st_buf_free(&b);
    return rc;
}

static st_code retired_add(repl_ctx *r, uint64_t id, uint64_t lsn, const char *table) {
    repl_retired *v = realloc(r->retired, (r->n_retired + 1) * sizeof *v);
    if (!v)
        return ST_RESOURCE_EXHAUSTED;
    r->retired = v;
    char *t = strdup(table);
    if (!t)
        return ST_RESOURCE_EXHAUSTED;
    v[r->n_retired++] = (repl_retired){.id = id, .lsn = lsn, .table = t};
    return ST_OK;
}

/* Parses one "<id> <lsn> <table>" line; false when it is not one. */
static bool retired_parse(char *line, uint64_t *id, uint64_t *lsn, char **table) {
    char *end;
    *id = strtoull(line, &end, 10);
    if (end == line || *end != ' ')
        return false;
    line = end + 1;
    *lsn = strtoull(line, &end, 10);
    if (end == line || *end != ' ' || !end[1])
        return false;
    *table = end + 1;
    return true;
}

st_code repl_retired_load(repl_ctx *r, st_err *err) {
    char path[sizeof r->state_dir + 32];
    retired_path(r, path, sizeof path);
    st_buf b;
    st_buf_init(&b);
    st_code rc = st_env_read_all(st_env_posix(), path, &b, err);
    if (rc == ST_NOT_FOUND) {
        st_buf_free(&b);
        return ST_OK;
    }
    if (rc == ST_OK && (b.len < strlen(RETIRED_HEADER) ||
                        memcmp(b.data, RETIRED_HEADER, strlen(RETIRED_HEADER)) != 0))
        rc = st_err_set(err, ST_DATA_LOSS, "%s: not a retired-tablets file", path);
    if (rc == ST_OK && st_buf_append_byte(&b, 0) != ST_OK)
        rc = ST_RESOURCE_EXHAUSTED;
    uint64_t last = sto_log_last_lsn(r->o.db);
    char *save = NULL;
    for (char *line = rc == ST_OK ? strtok_r((char *)b.data + strlen(RETIRED_HEADER), "\n", &save)
                                  : NULL;
         line && rc == ST_OK; line = strtok_r(NULL, "\n", &save)) {
        uint64_t id, lsn;
        char *table;
        if (!retired_parse(line, &id, &lsn, &table)) {
            rc = st_err_set(err, ST_DATA_LOSS, "%s: bad line '%.80s'", path, line);
            break;
        }
        /* A split cut short by the crash: the parent's records all precede the log's end. */
        rc = retired_add(r, id, lsn ? lsn : last, table);
        if (rc == ST_OK)
            repl_tablet_named(r, id, table);
    }
    st_buf_free(&b);
    if (rc == ST_OK && retired_prune(r))
        rc = retired_save(r, err);
    return rc;
}

st_code repl_tablet_retire(repl_ctx *r, uint64_t tablet_id, const char *table, st_err *err) {
    if (!r || r->n_shippers == 0)
        return ST_OK;
    retired_prune(r);
    if (retired_add(r, tablet_id, 0, table) != ST_OK)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory retiring a tablet");
    repl_tablet_named(r, tablet_id, table);
    return retired_save(r, err);
}

void repl_tablet_retire_done(repl_ctx *r, uint64_t tablet_id, bool gone) {
    for (size_t i = 0; r && i < r->n_retired; i++)
        if (r->retired[i].id == tablet_id && r->retired[i].lsn == 0) {
            if (gone) /* recorded at the next save; until then the entry is simply kept */
                r->retired[i].lsn = sto_log_last_lsn(r->o.db);
            else
                retired_remove_at(r, i);
            return;
        }
}

void repl_table_dropped(repl_ctx *r, const char *table) {
    if (!r)
        return;
    repl_names_forget(r, table);
    bool changed = false;
    for (size_t i = r->n_retired; i-- > 0;)
        if (strcmp(r->retired[i].table, table) == 0) {
            retired_remove_at(r, i);
            changed = true;
        }
    st_err err = {0};
    if (changed && retired_save(r, &err) != ST_OK)
        st_log(ST_LOG_WARN, "repl", "table=%s dropped, but saving retired tablets failed: %s",
               table, err.msg);
}

bool repl_table_shipping(repl_ctx *r, const char *table) {
    for (size_t i = 0; r && i < r->n_shippers; i++)
        if (shipper_table_in_flight(r->shippers[i], table))
            return true;
    return false;
}

void repl_retired_free(repl_ctx *r) {
    while (r->n_retired)
        retired_remove_at(r, r->n_retired - 1);
    free(r->retired);
    r->retired = NULL;
}
