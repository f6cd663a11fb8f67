/* ops/backup_check.c — whether a parsed export MANIFEST describes a backup that can exist
 * (docs/formats/backup-export.md, "Consistency of the fields"): the line parser checks each
 * line's syntax, this checks the fields against each other — names that are Bigtable names of one
 * instance, a known backup type, times in order, pieces that cover the key space, sizes that fit
 * a Backup's size_bytes. A manifest failing here was forged or damaged before its checksum line
 * was written, which the checksum cannot tell; verify and import refuse it before reading any
 * file, naming the field. */
#include <stdio.h>
#include <string.h>

#include "backup_dir.h"
#include "strata/btutil.h"

/* Frozen instants are the nodes' clocks, start and end the router's: allow this much skew. */
#define BK_CLOCK_SKEW_US (3600LL * 1000000)
/* 9999-12-31T23:59:59Z, the last instant a google.protobuf.Timestamp holds. */
#define BK_TIME_MAX_US 253402300799999999LL
#define BK_ID_MAX 50 /* backup and table ids, as Cloud Bigtable */

/* [_a-zA-Z0-9][-_.a-zA-Z0-9]{0,49}: backup ids and table ids alike. */
static bool id_ok(const char *s, size_t n) {
    if (n == 0 || n > BK_ID_MAX || s[0] == '-' || s[0] == '.')
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return false;
    }
    return true;
}

/* Matches name against "projects/P/instances/I/<kind>/..." and returns the rest after
 * "instances/I/" (NULL when it does not match); prefix gets "projects/P/instances/I/". */
static const char *instance_part(const char *name, char *prefix, size_t cap) {
    static const char *const want[] = {"projects/", "instances/"};
    const char *p = name;
    for (int k = 0; k < 2; k++) {
        size_t w = strlen(want[k]);
        if (strncmp(p, want[k], w))
            return NULL;
        const char *slash = strchr(p + w, '/');
        if (!slash || slash == p + w)
            return NULL;
        p = slash + 1;
    }
    if ((size_t)(p - name) >= cap)
        return NULL;
    memcpy(prefix, name, (size_t)(p - name));
    prefix[p - name] = '\0';
    return p;
}

static st_code check_names(const ops_bk_manifest *m, const char *what, st_err *err) {
    char bi[OPS_BK_NAME_MAX + 1], ti[OPS_BK_NAME_MAX + 1];
    const char *b = instance_part(m->backup, bi, sizeof bi);
    const char *cl = b && !strncmp(b, "clusters/", 9) ? b + 9 : NULL;
    const char *slash = cl ? strchr(cl, '/') : NULL;
    const char *id = slash && slash > cl && !strncmp(slash, "/backups/", 9) ? slash + 9 : NULL;
    if (!id || !id_ok(id, strlen(id)))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "%s: field backup '%s' is not projects/P/instances/I/clusters/C/backups/"
                          "ID with ID 1-%d of [-_.a-zA-Z0-9] not starting with - or . (forged or "
                          "damaged: export it again)",
                          what, m->backup, BK_ID_MAX);
    const char *t = instance_part(m->source_table, ti, sizeof ti);
    const char *tid = t && !strncmp(t, "tables/", 7) ? t + 7 : NULL;
    if (!tid || !id_ok(tid, strlen(tid)))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "%s: field source_table '%s' is not projects/P/instances/I/tables/ID "
                          "with ID 1-%d of [-_.a-zA-Z0-9] not starting with - or . (forged or "
                          "damaged: export it again)",
                          what, m->source_table, BK_ID_MAX);
    if (strcmp(bi, ti))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "%s: field source_table '%s' is not in the instance of field backup "
                          "'%s' (a backup is made of a table of its own instance: forged or "
                          "damaged, export it again)",
                          what, m->source_table, m->backup);
    return ST_OK;
}

static st_code time_bad(const char *what, const char *field, int64_t v, const char *why,
                        st_err *err) {
    return st_err_set(err, ST_INVALID_ARGUMENT,
                      "%s: field %s %lld %s (forged or damaged: export it again)", what, field,
                      (long long)v, why);
}

static st_code check_times(const ops_bk_manifest *m, const char *what, st_err *err) {
    if (m->backup_type != 1 && m->backup_type != 2)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "%s: field backup_type %d is not 1 (STANDARD) or 2 (HOT) (forged or "
                          "damaged: export it again)",
                          what, m->backup_type);
    if (m->start_us <= 0 || m->start_us > BK_TIME_MAX_US)
        return time_bad(what, "start_us", m->start_us, "is not a time after 1970 and before 10000",
                        err);
    if (m->end_us < m->start_us || m->end_us > BK_TIME_MAX_US)
        return time_bad(what, "end_us", m->end_us, "is before start_us (or after year 9999)", err);
    if (m->expire_us <= m->end_us || m->expire_us > BK_TIME_MAX_US)
        return time_bad(what, "expire_us", m->expire_us, "is not after end_us (or after year 9999)",
                        err);
    if (m->hot_us != 0 && m->backup_type != 2)
        return time_bad(what, "hot_to_standard_us", m->hot_us,
                        "is given for a backup_type other than 2 (HOT)", err);
    if (m->hot_us != 0 && (m->hot_us <= m->start_us || m->hot_us > BK_TIME_MAX_US))
        return time_bad(what, "hot_to_standard_us", m->hot_us, "is not after start_us", err);
    return ST_OK;
}

static st_code check_piece(const ops_bk_manifest *m, size_t i, const char *what, st_err *err) {
    const ops_bk_piece *p = &m->pieces[i];
    if (i == 0 && p->start_key.len)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "%s: piece %s, the first, starts at a key: the pieces leave the keys "
                          "before it out (forged or damaged: export it again)",
                          what, p->id);
    const ops_bk_piece *prev = i > 0 ? &m->pieces[i - 1] : NULL;
    int c = prev ? st_slice_cmp(st_buf_slice(&prev->end_key), st_buf_slice(&p->start_key)) : 0;
    if (prev && (!prev->end_key.len || c > 0)) /* sorted by start: prev reaches into p */
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "%s: pieces %s and %s overlap: the pieces hold some keys twice (forged "
                          "or damaged: export it again)",
                          what, prev->id, p->id);
    if (c != 0)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "%s: piece %s does not start where piece %s ends: the pieces leave a "
                          "gap in the key space (forged or damaged: export it again)",
                          what, p->id, prev->id);
    if (i + 1 == m->n_pieces && p->end_key.len)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "%s: piece %s, the last, ends at a key: the pieces leave the keys after "
                          "it out (forged or damaged: export it again)",
                          what, p->id);
    if (p->frozen_us < m->start_us - BK_CLOCK_SKEW_US ||
        p->frozen_us > m->end_us + BK_CLOCK_SKEW_US)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "%s: piece %s field frozen_us %lld is not between start_us and end_us "
                          "(give or take an hour of clock skew) (forged or damaged: export it "
                          "again)",
                          what, p->id, (long long)p->frozen_us);
    return ST_OK;
}

/* The schema a restore installs on every node: a Table the nodes' PutTable accepts, or no
 * restore of the import could ever succeed. */
static st_code check_schema(const ops_bk_manifest *m, const char *what, st_err *err) {
    st_err why = {0};
    Google__Bigtable__Admin__V2__Table *t = (void *)btu_pb_unpack(
        &google__bigtable__admin__v2__table__descriptor, NULL, st_buf_slice(&m->schema), &why);
    if (t)
        btu_schema_check(t, &why);
    else if (why.code == ST_OK)
        st_err_set(&why, ST_INVALID_ARGUMENT, "not a google.bigtable.admin.v2.Table");
    if (t)
        protobuf_c_message_free_unpacked(&t->base, NULL);
    if (why.code == ST_OK)
        return ST_OK;
    return st_err_set(err, ST_INVALID_ARGUMENT,
                      "%s: field schema: %s (no table could have it: forged or damaged, export "
                      "it again)",
                      what, why.msg);
}

st_code ops_bk_manifest_check(const ops_bk_manifest *m, const char *what, st_err *err) {
    st_code rc = check_names(m, what, err);
    if (rc == ST_OK)
        rc = check_times(m, what, err);
    if (rc == ST_OK)
        rc = check_schema(m, what, err);
    if (rc != ST_OK)
        return rc;
    if (m->n_pieces == 0)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "%s: no piece line: a backup covers its table's key space with at least "
                          "one piece (forged or damaged: export it again)",
                          what);
    uint64_t total = 0;
    for (size_t i = 0; i < m->n_pieces; i++) {
        if ((rc = check_piece(m, i, what, err)) != ST_OK)
            return rc;
        for (size_t j = 0; j < m->pieces[i].n_files; j++) {
            total += m->pieces[i].files[j].size; /* each at most INT64_MAX: no wrap in 2 steps */
            if (total > INT64_MAX)
                return st_err_set(err, ST_INVALID_ARGUMENT,
                                  "%s: the file sizes add up past 2^63-1 bytes at file %s of "
                                  "piece %s (a backup's size_bytes cannot hold it: forged or "
                                  "damaged, export it again)",
                                  what, m->pieces[i].files[j].name, m->pieces[i].id);
        }
    }
    return ST_OK;
}
