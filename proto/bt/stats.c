/* stats.c — ReadRowsResponse.request_stats, built by the node for its part of a read and by the
 * router for a read over several node calls (docs/readrows.md). */
#include "strata/btutil.h"

#include "google/bigtable/v2/request_stats.pb-c.h"

size_t btu_read_stats_pack(const btu_read_stats *s, int64_t latency_us, uint8_t *buf) {
    Google__Bigtable__V2__ReadIterationStats it;
    Google__Protobuf__Duration lat;
    Google__Bigtable__V2__RequestLatencyStats ls;
    Google__Bigtable__V2__FullReadStatsView view;
    Google__Bigtable__V2__RequestStats stats;
    google__bigtable__v2__read_iteration_stats__init(&it);
    google__protobuf__duration__init(&lat);
    google__bigtable__v2__request_latency_stats__init(&ls);
    google__bigtable__v2__full_read_stats_view__init(&view);
    google__bigtable__v2__request_stats__init(&stats);
    it.rows_seen_count = s->rows_seen;
    it.rows_returned_count = s->rows_returned;
    it.cells_seen_count = s->cells_seen;
    it.cells_returned_count = s->cells_returned;
    lat.seconds = latency_us / 1000000;
    lat.nanos = (int32_t)(latency_us % 1000000) * 1000;
    ls.frontend_server_latency = &lat;
    view.read_iteration_stats = &it;
    view.request_latency_stats = &ls;
    stats.stats_view_case = GOOGLE__BIGTABLE__V2__REQUEST_STATS__STATS_VIEW_FULL_READ_STATS_VIEW;
    stats.full_read_stats_view = &view;
    size_t len = protobuf_c_message_get_packed_size(&stats.base);
    uint8_t *p = buf;
    *p++ = (BTU_READ_STATS_FIELD << 3) | 2;
    p += st_put_varint64(p, len);
    p += protobuf_c_message_pack(&stats.base, p);
    return (size_t)(p - buf);
}
