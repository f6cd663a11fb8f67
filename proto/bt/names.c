/* names.c — the resource-id rules Bigtable applies to table ids, family names and app-profile
 * ids, shared by the node and the router so both refuse the same names. */
#include <stdio.h>
#include <string.h>

#include "strata/btutil.h"

bool btu_id_valid(const char *id, size_t max, bool allow_lead_punct) {
    size_t n = strlen(id);
    if (n == 0 || n > max || (!allow_lead_punct && (id[0] == '-' || id[0] == '.')))
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = id[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return false;
    }
    return true;
}

bool btu_table_id_valid(const char *id) {
    return btu_id_valid(id, BTU_TABLE_ID_MAX, false);
}

bool btu_family_valid(const char *family) {
    return btu_id_valid(family, BTU_FAMILY_NAME_MAX, true);
}

st_code btu_table_name_parse(const char *name, size_t max, st_slice *project, st_slice *instance,
                             st_slice *table_id, st_err *err) {
    static const char *const lits[] = {"projects", NULL, "instances", NULL, "tables", NULL};
    st_slice v[3];
    size_t total = strlen(name), k = 0;
    const char *p = name, *end = name + total;
    bool ok = total <= max;
    for (size_t i = 0; ok && i < 6; i++) {
        const char *slash = memchr(p, '/', (size_t)(end - p));
        size_t len = slash ? (size_t)(slash - p) : (size_t)(end - p);
        ok = len > 0 && (i == 5 ? slash == NULL : slash != NULL) &&
             (!lits[i] || (strlen(lits[i]) == len && memcmp(p, lits[i], len) == 0));
        if (ok && !lits[i])
            v[k++] = st_slice_make(p, len);
        p += len + 1;
    }
    if (!ok)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "invalid table name '%.200s': expected "
                          "projects/<project>/instances/<instance>/tables/<table> (at most %zu "
                          "bytes)",
                          name, max);
    char id[BTU_TABLE_ID_MAX + 1];
    bool id_ok = v[2].len <= BTU_TABLE_ID_MAX;
    if (id_ok) {
        memcpy(id, v[2].data, v[2].len);
        id[v[2].len] = '\0';
        id_ok = btu_table_id_valid(id);
    }
    if (!id_ok)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "invalid table id '%.*s' in '%.200s': use 1-%d of [-_.a-zA-Z0-9], not "
                          "starting with '-' or '.'",
                          (int)(v[2].len > 64 ? 64 : v[2].len), (const char *)v[2].data, name,
                          BTU_TABLE_ID_MAX);
    if (project)
        *project = v[0];
    if (instance)
        *instance = v[1];
    if (table_id)
        *table_id = v[2];
    return ST_OK;
}
