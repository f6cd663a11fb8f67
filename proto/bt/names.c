/* names.c — the resource-id rules Bigtable applies to table ids, family names and app-profile
 * ids, shared by the node and the router so both refuse the same names. */
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
