/* rowmut.h — private to storage/: what the commit log needs of the row mutation codec beyond
 * its public calls (strata/storage.h). */
#ifndef STO_ROWMUT_H
#define STO_ROWMUT_H

#include "strata/storage.h"

/* An upper bound of the row's encoding (every varint counted at its maximum), so the log can
 * reserve a record's room once; false when it does not fit a size_t. */
bool sto_row_mut_bound(const sto_row_mut *row, size_t *out);

#endif
