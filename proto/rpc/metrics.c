/* metrics.c — the Prometheus text format writers, the RPC server's per-method metrics, and
 * process metrics from /proc/self (strata/metrics.h, rpc_metrics.h; docs/metrics.md). */
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "rpc_metrics.h"

/* ---- the text format ---- */

void prom_out_init(prom_out *o, st_buf *buf) {
    o->buf = buf;
    o->rc = ST_OK;
}

static void out_append(prom_out *o, const void *data, size_t len) {
    if (o->rc != ST_OK)
        return;
    if (o->buf->len + len > METRICS_PAGE_BYTES_MAX) {
        o->rc = ST_RESOURCE_EXHAUSTED;
        return;
    }
    o->rc = st_buf_append(o->buf, data, len);
}

void prom_printf(prom_out *o, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        if (o->rc == ST_OK)
            o->rc = ST_INTERNAL;
        return;
    }
    if ((size_t)n < sizeof small) {
        out_append(o, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1); /* rare: a long label value */
    if (!big) {
        if (o->rc == ST_OK)
            o->rc = ST_RESOURCE_EXHAUSTED;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    out_append(o, big, (size_t)n);
    free(big);
}

/* Escapes \ and newline (HELP text), and " too (label values). */
static void escape(prom_out *o, const char *s, bool quote) {
    const char *run = s;
    for (const char *p = s; *p; p++) {
        const char *rep = *p == '\\'             ? "\\\\"
                          : *p == '\n'           ? "\\n"
                          : (quote && *p == '"') ? "\\\""
                                                 : NULL;
        if (!rep)
            continue;
        out_append(o, run, (size_t)(p - run));
        out_append(o, rep, 2);
        run = p + 1;
    }
    out_append(o, run, strlen(run));
}

void prom_escape_label(prom_out *o, const char *value) {
    escape(o, value ? value : "", true);
}

void prom_family(prom_out *o, const char *name, const char *type, const char *help) {
    prom_printf(o, "# HELP %s ", name);
    escape(o, help, false);
    prom_printf(o, "\n# TYPE %s %s\n", name, type);
}

/* name{a="x",b="y"  — the caller closes with extra labels and/or "}". */
static void labels_open(prom_out *o, const char *name, const prom_label *l, size_t n) {
    out_append(o, name, strlen(name));
    for (size_t i = 0; i < n; i++) {
        prom_printf(o, "%c%s=\"", i ? ',' : '{', l[i].name);
        prom_escape_label(o, l[i].value);
        out_append(o, "\"", 1);
    }
}

static void fmt_f64(char *out, size_t cap, double v) {
    if (isnan(v))
        snprintf(out, cap, "NaN");
    else if (isinf(v))
        snprintf(out, cap, "%s", v > 0 ? "+Inf" : "-Inf");
    else
        snprintf(out, cap, "%.15g", v);
}

void prom_sample_u64(prom_out *o, const char *name, const prom_label *l, size_t n, uint64_t v) {
    labels_open(o, name, l, n);
    prom_printf(o, "%s %llu\n", n ? "}" : "", (unsigned long long)v);
}

void prom_sample_f64(prom_out *o, const char *name, const prom_label *l, size_t n, double v) {
    char num[64];
    fmt_f64(num, sizeof num, v);
    labels_open(o, name, l, n);
    prom_printf(o, "%s %s\n", n ? "}" : "", num);
}

void prom_histogram(prom_out *o, const char *name, const prom_label *l, size_t n,
                    const double *bounds, const uint64_t *counts, size_t n_bounds, double sum) {
    char metric[256], le[64];
    snprintf(metric, sizeof metric, "%s_bucket", name);
    uint64_t cum = 0;
    for (size_t i = 0; i <= n_bounds; i++) {
        cum += counts[i];
        if (i < n_bounds)
            fmt_f64(le, sizeof le, bounds[i]);
        else
            snprintf(le, sizeof le, "+Inf");
        labels_open(o, metric, l, n);
        prom_printf(o, "%cle=\"%s\"} %llu\n", n ? ',' : '{', le, (unsigned long long)cum);
    }
    snprintf(metric, sizeof metric, "%s_sum", name);
    prom_sample_f64(o, metric, l, n, sum);
    snprintf(metric, sizeof metric, "%s_count", name);
    prom_sample_u64(o, metric, l, n, cum);
}

/* ---- process ---- */

static uint64_t open_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return 0;
    uint64_t n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n ? n - 1 : 0; /* the directory stream's own descriptor */
}

void prom_process(prom_out *o) {
    struct rusage ru;
    double cpu = 0;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
              (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
    unsigned long long vm_pages = 0, rss_pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%llu %llu", &vm_pages, &rss_pages) != 2)
            vm_pages = rss_pages = 0;
        fclose(f);
    }
    long page = sysconf(_SC_PAGESIZE);
    uint64_t page_bytes = page > 0 ? (uint64_t)page : 4096;
    struct rlimit rl;
    uint64_t max_fds = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? (uint64_t)rl.rlim_cur : 0;

    prom_family(o, "process_cpu_seconds_total", "counter", "User and system CPU time spent.");
    prom_sample_f64(o, "process_cpu_seconds_total", NULL, 0, cpu);
    prom_family(o, "process_resident_memory_bytes", "gauge", "Resident memory size.");
    prom_sample_u64(o, "process_resident_memory_bytes", NULL, 0, rss_pages * page_bytes);
    prom_family(o, "process_virtual_memory_bytes", "gauge", "Virtual memory size.");
    prom_sample_u64(o, "process_virtual_memory_bytes", NULL, 0, vm_pages * page_bytes);
    prom_family(o, "process_open_fds", "gauge", "Open file descriptors.");
    prom_sample_u64(o, "process_open_fds", NULL, 0, open_fds());
    prom_family(o, "process_max_fds", "gauge", "Limit on open file descriptors.");
    prom_sample_u64(o, "process_max_fds", NULL, 0, max_fds);
}

/* ---- the RPC server's per-method metrics ---- */

const int64_t rpc_latency_bounds_us[RPC_LATENCY_BUCKETS] = {
    100,    250,    500,    1000,    2500,    5000,    10000,    25000,    50000,
    100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000, 30000000, 60000000,
};

void rpc_metrics_init(rpc_metrics *m) {
    memset(m, 0, sizeof *m);
}

void rpc_metrics_deinit(rpc_metrics *m) {
    for (size_t i = 0; i < m->n; i++)
        free(m->paths[i]);
    free(m->paths);
    free(m->v);
    memset(m, 0, sizeof *m);
}

st_code rpc_metrics_add(rpc_metrics *m, const char *path) {
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 32;
        rpc_method_metrics *v = realloc(m->v, cap * sizeof *v);
        if (!v)
            return ST_RESOURCE_EXHAUSTED;
        m->v = v;
        char **p = realloc(m->paths, cap * sizeof *p);
        if (!p)
            return ST_RESOURCE_EXHAUSTED;
        m->paths = p;
        m->cap = cap;
    }
    char *dup = strdup(path);
    if (!dup)
        return ST_RESOURCE_EXHAUSTED;
    memset(&m->v[m->n], 0, sizeof m->v[m->n]);
    m->paths[m->n++] = dup;
    return ST_OK;
}

void rpc_metrics_record(rpc_metrics *m, size_t idx, st_code code, int64_t latency_us) {
    rpc_method_metrics *mm = idx < m->n ? &m->v[idx] : &m->unknown;
    unsigned c = (unsigned)code < RPC_METRICS_CODES ? (unsigned)code : (unsigned)ST_UNKNOWN;
    mm->codes[c]++;
    if (latency_us < 0)
        latency_us = 0;
    size_t b = 0; /* a linear scan: 18 bounds, most calls stop in the first few */
    while (b < RPC_LATENCY_BUCKETS && latency_us > rpc_latency_bounds_us[b])
        b++;
    mm->buckets[b]++;
    mm->count++;
    mm->sum_us += (uint64_t)latency_us;
}

/* "/google.bigtable.v2.Bigtable/ReadRows" -> service and method (buffers of cap bytes). */
static void split_path(const char *path, char *service, char *method, size_t cap) {
    const char *p = path[0] == '/' ? path + 1 : path;
    const char *slash = strrchr(p, '/');
    if (!slash) {
        snprintf(service, cap, "%s", "");
        snprintf(method, cap, "%s", p);
        return;
    }
    snprintf(service, cap, "%.*s", (int)(slash - p), p);
    snprintf(method, cap, "%s", slash + 1);
}

#define RPC_PATH_LABEL_MAX 256

static void render_codes(const rpc_method_metrics *mm, const char *service, const char *method,
                         prom_out *o) {
    for (unsigned c = 0; c < RPC_METRICS_CODES; c++) {
        if (c != ST_OK && mm->codes[c] == 0)
            continue; /* OK always, so every method has a series from the start */
        prom_label l[] = {
            {"service", service}, {"method", method}, {"code", st_code_name((st_code)c)}};
        prom_sample_u64(o, "strata_rpc_server_handled_total", l, 3, mm->codes[c]);
    }
}

static void render_hist(const rpc_method_metrics *mm, const char *service, const char *method,
                        prom_out *o) {
    double bounds[RPC_LATENCY_BUCKETS];
    for (size_t i = 0; i < RPC_LATENCY_BUCKETS; i++)
        bounds[i] = (double)rpc_latency_bounds_us[i] / 1e6;
    prom_label l[] = {{"service", service}, {"method", method}};
    prom_histogram(o, "strata_rpc_server_handling_seconds", l, 2, bounds, mm->buckets,
                   RPC_LATENCY_BUCKETS, (double)mm->sum_us / 1e6);
}

void rpc_metrics_render(const rpc_metrics *m, prom_out *o) {
    char service[RPC_PATH_LABEL_MAX], method[RPC_PATH_LABEL_MAX];
    prom_family(o, "strata_rpc_server_handled_total", "counter",
                "RPCs completed on the server, by method and final gRPC status code "
                "(cancelled and deadline-exceeded calls included).");
    for (size_t i = 0; i < m->n; i++) {
        split_path(m->paths[i], service, method, sizeof service);
        render_codes(&m->v[i], service, method, o);
    }
    if (m->unknown.count)
        render_codes(&m->unknown, "unknown", "unknown", o);
    prom_family(o, "strata_rpc_server_handling_seconds", "histogram",
                "Time from a call's request headers to its final status, by method (methods "
                "called at least once).");
    for (size_t i = 0; i < m->n; i++) {
        if (!m->v[i].count)
            continue;
        split_path(m->paths[i], service, method, sizeof service);
        render_hist(&m->v[i], service, method, o);
    }
    if (m->unknown.count)
        render_hist(&m->unknown, "unknown", "unknown", o);
}
