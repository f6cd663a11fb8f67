/* schema.c — whether a Table's schema is one CreateTable could have made (btutil.h). A backup's
 * schema comes back from an export directory, where a forged or damaged manifest could hold any
 * Table; the CLI and the router check it before an import, with the node's PutTable rules, so
 * no backup becomes READY that no restore could ever install. */
#include <inttypes.h>
#include <string.h>

#include "strata/btutil.h"

typedef Google__Bigtable__Admin__V2__GcRule pb_gc;

/* A max_age is a google.protobuf.Duration (seconds within +-BTU_DURATION_SECONDS_MAX, nanos
 * within +-999,999,999 and of the seconds' sign) of at least 1 ms: Bigtable's floor, since a
 * shorter age (0 included) would hide every cell as soon as it is written, so every write would
 * succeed and nothing would ever be readable. The two are told apart: advice to set a longer age
 * is wrong for one far too long. */
static st_code max_age_check(const Google__Protobuf__Duration *d, st_err *err) {
    int64_t s = d ? d->seconds : 0;
    int32_t ns = d ? d->nanos : 0;
    if (s > BTU_DURATION_SECONDS_MAX || s < -BTU_DURATION_SECONDS_MAX || ns > 999999999 ||
        ns < -999999999 || (s > 0 && ns < 0) || (s < 0 && ns > 0))
        return st_err_set(
            err, ST_INVALID_ARGUMENT,
            "GC rule max_age is not a valid google.protobuf.Duration (seconds %" PRId64
            ", nanos %d): seconds must be within +-%" PRId64
            " (about 10,000 years) and nanos within 0..999,999,999",
            s, (int)ns, (int64_t)BTU_DURATION_SECONDS_MAX);
    if (s < 0 || ns < 0 || (s == 0 && ns < 1000000))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "GC rule max_age must be at least 1 ms (seconds %" PRId64
                          ", nanos %d): set a longer age, or no max_age to keep cells",
                          s, (int)ns);
    return ST_OK;
}

st_code btu_gc_rule_level(const pb_gc *r, pb_gc *const **kids, size_t *n, st_err *err) {
    *kids = NULL;
    *n = 0;
    switch (r->rule_case) {
    case GOOGLE__BIGTABLE__ADMIN__V2__GC_RULE__RULE__NOT_SET:
        return ST_OK;
    case GOOGLE__BIGTABLE__ADMIN__V2__GC_RULE__RULE_MAX_NUM_VERSIONS:
        if (r->max_num_versions < 1)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "GC rule max_num_versions must be at least 1, got %d",
                              r->max_num_versions);
        return ST_OK;
    case GOOGLE__BIGTABLE__ADMIN__V2__GC_RULE__RULE_MAX_AGE:
        return max_age_check(r->max_age, err);
    case GOOGLE__BIGTABLE__ADMIN__V2__GC_RULE__RULE_INTERSECTION:
        if (r->intersection) {
            *kids = r->intersection->rules;
            *n = r->intersection->n_rules;
        }
        return ST_OK;
    case GOOGLE__BIGTABLE__ADMIN__V2__GC_RULE__RULE_UNION:
        if (r->union_) {
            *kids = r->union_->rules;
            *n = r->union_->n_rules;
        }
        return ST_OK;
    default:
        return st_err_set(err, ST_INVALID_ARGUMENT, "unknown GC rule kind %d", (int)r->rule_case);
    }
}

st_code btu_gc_rule_size_check(const char *fam, const pb_gc *r, st_err *err) {
    size_t len = r ? google__bigtable__admin__v2__gc_rule__get_packed_size(r) : 0;
    if (len <= BTU_GC_RULE_BYTES_MAX)
        return ST_OK;
    return st_err_set(err, ST_INVALID_ARGUMENT,
                      "family %s: the GC rule serializes to %zu bytes, over the limit of %d", fam,
                      len, BTU_GC_RULE_BYTES_MAX);
}

bool btu_pb_has_unknown(const ProtobufCMessage *m, uint32_t num) {
    for (unsigned i = 0; m && i < m->n_unknown_fields; i++)
        if (m->unknown_fields[i].tag == num)
            return true;
    return false;
}

/* ColumnFamily.value_type in the upstream API (a google.bigtable.admin.v2.Type), and the Type
 * member that makes a family an aggregate. Our ColumnFamily leaves value_type out, so it arrives
 * as an unknown field. */
#define FAMILY_VALUE_TYPE_FIELD 3
#define TYPE_AGGREGATE_FIELD 6

/* The unknown fields Strata understands and stores: a family's value_type. */
static bool unknown_kept(const ProtobufCMessageDescriptor *d, uint32_t num) {
    return d == &google__bigtable__admin__v2__column_family__descriptor &&
           num == FAMILY_VALUE_TYPE_FIELD;
}

/* The message member at field f of m, or NULL (unset, or another oneof member). */
static ProtobufCMessage *member_msg(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
    if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
        *(uint32_t *)((char *)m + f->quantifier_offset) != f->id)
        return NULL;
    return *(ProtobufCMessage **)((char *)m + f->offset);
}

void btu_pb_drop_unknown(ProtobufCMessage *m) {
    if (!m)
        return;
    unsigned kept = 0;
    for (unsigned i = 0; i < m->n_unknown_fields; i++)
        if (unknown_kept(m->descriptor, m->unknown_fields[i].tag))
            m->unknown_fields[kept++] = m->unknown_fields[i];
    m->n_unknown_fields = kept;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        if (f->label != PROTOBUF_C_LABEL_REPEATED) {
            btu_pb_drop_unknown(member_msg(m, f));
            continue;
        }
        size_t n = *(size_t *)((char *)m + f->quantifier_offset);
        ProtobufCMessage **v = *(ProtobufCMessage ***)((char *)m + f->offset);
        for (size_t k = 0; k < n; k++)
            btu_pb_drop_unknown(v[k]);
    }
}

/* Reads a varint at *p (before end); false when malformed. */
static bool varint_read(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    *v = 0;
    for (int shift = 0; *p < end && shift < 64; shift += 7) {
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return true;
    }
    return false;
}

/* Skips the value of a field of wire type wt at *p; false when malformed. */
static bool field_skip(const uint8_t **p, const uint8_t *end, uint32_t wt) {
    uint64_t v;
    size_t n;
    switch (wt) {
    case 0:
        return varint_read(p, end, &v);
    case 1:
        n = 8;
        break;
    case 2:
        if (!varint_read(p, end, &v) || v > (uint64_t)(end - *p))
            return false;
        n = (size_t)v;
        break;
    case 5:
        n = 4;
        break;
    default:
        return false;
    }
    if ((size_t)(end - *p) < n)
        return false;
    *p += n;
    return true;
}

/* Whether the Type message in [p, end) names an aggregate_type (a malformed one counts as
 * not). */
static bool type_is_aggregate(const uint8_t *p, const uint8_t *end) {
    uint64_t tag;
    while (p < end && varint_read(&p, end, &tag)) {
        if (tag >> 3 == TYPE_AGGREGATE_FIELD)
            return true;
        if (!field_skip(&p, end, (uint32_t)(tag & 7)))
            return false;
    }
    return false;
}

/* Whether a family's value_type is an aggregate (AddToCell / MergeToCell) rather than a type
 * annotation such as String, Bytes or Int64. protobuf-c keeps a length-delimited unknown field's
 * length prefix in its data. */
static bool value_type_aggregate(const ProtobufCMessage *cf) {
    for (unsigned i = 0; i < cf->n_unknown_fields; i++) {
        const ProtobufCMessageUnknownField *u = &cf->unknown_fields[i];
        const uint8_t *p = u->data, *end = u->data + u->len;
        uint64_t len;
        if (u->tag == FAMILY_VALUE_TYPE_FIELD &&
            u->wire_type == PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED && varint_read(&p, end, &len) &&
            len == (uint64_t)(end - p) && type_is_aggregate(p, end))
            return true;
    }
    return false;
}

st_code btu_family_check(const char *fam, const Google__Bigtable__Admin__V2__ColumnFamily *cf,
                         st_err *err) {
    if (!cf)
        return ST_OK;
    if (btu_pb_has_unknown(&cf->base, FAMILY_VALUE_TYPE_FIELD) && value_type_aggregate(&cf->base))
        return st_err_set(err, ST_UNIMPLEMENTED,
                          "column family %s has an aggregate value_type: aggregate column families "
                          "(AddToCell, MergeToCell) are not supported; create the family without "
                          "value_type and keep counters with ReadModifyWriteRow increments",
                          fam);
    /* A type annotation (String, Bytes, Int64...) changes no write path, but the schema's every
     * copy (router metadata, node catalogs, backup manifests, exports) would have to keep it:
     * refused until they all do, saying it is not an aggregate (docs/bigtable.md). */
    if (btu_pb_has_unknown(&cf->base, FAMILY_VALUE_TYPE_FIELD))
        return st_err_set(err, ST_UNIMPLEMENTED,
                          "column family %s has a value_type (a type annotation, not an "
                          "aggregate): Strata does not store column family value types yet; "
                          "create the family without value_type (values are bytes either way)",
                          fam);
    return btu_gc_rule_size_check(fam, cf->gc_rule, err);
}

static st_code gc_check(const char *fam, const pb_gc *r, int depth, size_t *rules, st_err *err) {
    if (!r)
        return ST_OK;
    if (depth > BTU_GC_DEPTH_MAX || ++*rules > BTU_GC_RULES_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "family %s: GC rule too large: at most %d levels and %d rules", fam,
                          BTU_GC_DEPTH_MAX, BTU_GC_RULES_MAX);
    pb_gc *const *kids;
    size_t n;
    if (btu_gc_rule_level(r, &kids, &n, err) != ST_OK) {
        st_err_prefix(err, "family %s: ", fam);
        return err->code;
    }
    for (size_t i = 0; i < n; i++)
        if (gc_check(fam, kids[i], depth + 1, rules, err) != ST_OK)
            return err->code;
    return ST_OK;
}

bool btu_cs_retention_ok(const Google__Protobuf__Duration *d) {
    return d->seconds >= BTU_CS_RETENTION_MIN_S && d->nanos >= 0 && d->nanos < 1000000000 &&
           (d->seconds < BTU_CS_RETENTION_MAX_S ||
            (d->seconds == BTU_CS_RETENTION_MAX_S && !d->nanos));
}

static st_code cs_check(const Google__Bigtable__Admin__V2__ChangeStreamConfig *c, st_err *err) {
    if (!c || !c->retention_period || btu_cs_retention_ok(c->retention_period))
        return ST_OK; /* off, or kept 1 to 7 days */
    return st_err_set(err, ST_INVALID_ARGUMENT,
                      "change_stream_config.retention_period is %llds: it must be between 1 and "
                      "7 days",
                      (long long)c->retention_period->seconds);
}

st_code btu_schema_check(const Google__Bigtable__Admin__V2__Table *t, st_err *err) {
    if (t->n_column_families > BTU_FAMILIES_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "%zu column families: at most %d",
                          t->n_column_families, BTU_FAMILIES_MAX);
    for (size_t i = 0; i < t->n_column_families; i++) {
        const char *fam = t->column_families[i]->key;
        if (!fam || !btu_family_valid(fam))
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "invalid column family name '%s': use 1-%d of [-_.a-zA-Z0-9]",
                              fam ? fam : "", BTU_FAMILY_NAME_MAX);
        for (size_t j = 0; j < i; j++) /* at most BTU_FAMILIES_MAX: quadratic is fine */
            if (!strcmp(fam, t->column_families[j]->key))
                return st_err_set(err, ST_INVALID_ARGUMENT, "column family %s listed twice", fam);
        const Google__Bigtable__Admin__V2__ColumnFamily *cf = t->column_families[i]->value;
        size_t rules = 0;
        if (cf && gc_check(fam, cf->gc_rule, 0, &rules, err) != ST_OK)
            return err->code;
        if (cf && btu_pb_has_unknown(&cf->base, FAMILY_VALUE_TYPE_FIELD))
            return btu_family_check(fam, cf, err);
    }
    return cs_check(t->change_stream_config, err);
}

bool btu_mod_drops(
    const Google__Bigtable__Admin__V2__ModifyColumnFamiliesRequest__Modification *m) {
    return m->mod_case ==
               GOOGLE__BIGTABLE__ADMIN__V2__MODIFY_COLUMN_FAMILIES_REQUEST__MODIFICATION__MOD_DROP &&
           m->drop;
}

st_code
btu_drop_protection_check(const char *table, bool protection,
                          const Google__Bigtable__Admin__V2__ModifyColumnFamiliesRequest *req,
                          st_err *err) {
    for (size_t i = 0; protection && i < req->n_modifications; i++)
        if (btu_mod_drops(req->modifications[i]))
            return st_err_set(err, ST_FAILED_PRECONDITION,
                              "table %s has deletion_protection, which forbids dropping its column "
                              "families (%s): turn it off first (UpdateTable, update_mask "
                              "deletion_protection, deletion_protection false)",
                              table, req->modifications[i]->id);
    return ST_OK;
}
