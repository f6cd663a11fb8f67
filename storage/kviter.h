/* kviter.h — the internal iterator over (ikey, value) entries that memtables, SSTables, the
 * merging iterator and range-restricting wrappers all implement (private to storage/).
 * Keys are internal keys (key.h), memcmp ordered. Slices returned by key()/value() are valid
 * until the next positioning call. An iterator that meets an error becomes invalid and reports
 * it through status(). */
#ifndef STO_KVITER_H
#define STO_KVITER_H

#include "strata/base.h"

typedef struct sto_kviter sto_kviter;

typedef struct sto_kviter_ops {
    void (*seek)(sto_kviter *it, st_slice target); /* first entry >= target */
    void (*seek_first)(sto_kviter *it);
    void (*seek_last)(sto_kviter *it);
    void (*next)(sto_kviter *it);
    void (*prev)(sto_kviter *it);
    bool (*valid)(sto_kviter *it);
    st_slice (*key)(sto_kviter *it);
    st_slice (*value)(sto_kviter *it);
    st_code (*status)(sto_kviter *it, st_err *err);
    void (*free)(sto_kviter *it);
} sto_kviter_ops;

struct sto_kviter {
    const sto_kviter_ops *ops;
};

/* Merges n children (taking ownership) into one ordered stream, forward and backward. Equal keys
 * from several children are all returned (child order breaks ties: lower index first). With one
 * child, returns that child itself. */
sto_kviter *sto_merge_iter_new(sto_kviter **children, size_t n);

/* Restricts child (taken) to ikeys in [lo, hi) (empty hi = unbounded); bounds are copied. Used
 * for split tablets that share a parent's SSTables. */
sto_kviter *sto_range_iter_new(sto_kviter *child, st_slice lo, st_slice hi);

/* Hides the entries of system families (sto_family_is_system) of child (taken): the view of a
 * file restored from a backup, whose change history belongs to another table. */
sto_kviter *sto_nosys_iter_new(sto_kviter *child);

#endif
