/* ops/progress.c — progress lines on stderr for long commands (progress.h). */
#define _DEFAULT_SOURCE /* isatty */
#include "progress.h"

#include <stdarg.h>
#include <string.h>
#include <unistd.h>

#include "strata/base.h"

#define PROGRESS_BAR_WIDTH 24

void ops_progress_init(ops_progress *p, const char *label, ops_progress_unit unit, uint64_t total,
                       bool quiet) {
    memset(p, 0, sizeof *p);
    p->out = stderr;
    p->tty = isatty(STDERR_FILENO);
    p->quiet = quiet;
    p->unit = unit;
    p->total = total;
    snprintf(p->label, sizeof p->label, "%s", label);
    p->start_us = st_mono_us();
}

void ops_progress_bytes(uint64_t n, char *out, size_t cap) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    size_t u = 0;
    while (v >= 1024 && u + 1 < sizeof units / sizeof units[0]) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(out, cap, "%llu B", (unsigned long long)n);
    else
        snprintf(out, cap, "%.1f %s", v, units[u]);
}

static void fmt_eta(double s, char *out, size_t cap) {
    if (s < 0 || s > 99 * 3600)
        snprintf(out, cap, "--:--");
    else if (s >= 3600)
        snprintf(out, cap, "%dh%02dm", (int)(s / 3600), (int)s % 3600 / 60);
    else
        snprintf(out, cap, "%02d:%02d", (int)s / 60, (int)s % 60);
}

static void fmt_bar(double frac, char *out) {
    int full = (int)(frac * PROGRESS_BAR_WIDTH + 0.5);
    out[0] = '[';
    for (int i = 0; i < PROGRESS_BAR_WIDTH; i++)
        out[1 + i] = i < full ? '#' : '.';
    out[1 + PROGRESS_BAR_WIDTH] = ']';
    out[2 + PROGRESS_BAR_WIDTH] = '\0';
}

void ops_progress_line(const ops_progress *p, int64_t now_us, char *out, size_t cap) {
    double secs = (double)(now_us - p->start_us) / 1e6;
    double frac = p->total ? (double)p->done / (double)p->total : 0;
    if (frac > 1)
        frac = 1;
    char bar[PROGRESS_BAR_WIDTH + 3], eta[16];
    fmt_bar(frac, bar);
    if (p->unit == OPS_PROGRESS_PERCENT) {
        snprintf(out, cap, "%s %s %3llu%% %.0fs", p->label, bar, (unsigned long long)p->done, secs);
        return;
    }
    char done[32], total[32], rate[32];
    double bps = secs > 0 ? (double)p->done / secs : 0;
    ops_progress_bytes(p->done, done, sizeof done);
    ops_progress_bytes(p->total, total, sizeof total);
    ops_progress_bytes((uint64_t)bps, rate, sizeof rate);
    fmt_eta(bps > 0 && p->total >= p->done ? (double)(p->total - p->done) / bps : -1, eta,
            sizeof eta);
    if (p->total)
        snprintf(out, cap, "%s %s %s / %s %3.0f%% %s/s ETA %s", p->label, bar, done, total,
                 frac * 100, rate, eta);
    else
        snprintf(out, cap, "%s %s %s/s", p->label, done, rate);
}

static void print_now(ops_progress *p, int64_t now) {
    char line[256];
    ops_progress_line(p, now, line, sizeof line);
    if (p->tty) {
        fprintf(p->out, "\r%s\033[K", line);
        p->drawn = true;
    } else {
        fprintf(p->out, "%s\n", line);
    }
    fflush(p->out);
    p->last_print_us = now;
}

static void maybe_print(ops_progress *p) {
    if (p->quiet)
        return;
    int64_t now = st_mono_us();
    int64_t every = p->tty ? OPS_PROGRESS_TTY_MS * 1000LL : OPS_PROGRESS_PLAIN_S * 1000000LL;
    if (now - p->last_print_us >= every)
        print_now(p, now);
}

void ops_progress_total(ops_progress *p, uint64_t total) {
    p->total = total;
}

void ops_progress_add(ops_progress *p, uint64_t n) {
    p->done += n;
    maybe_print(p);
}

void ops_progress_set(ops_progress *p, uint64_t done) {
    p->done = done;
    maybe_print(p);
}

void ops_progress_note(ops_progress *p, const char *fmt, ...) {
    if (p->quiet)
        return;
    if (p->drawn)
        fprintf(p->out, "\r\033[K");
    p->drawn = false;
    fprintf(p->out, "%s: ", p->label);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(p->out, fmt, ap);
    va_end(ap);
    fputc('\n', p->out);
    fflush(p->out);
}

void ops_progress_finish(ops_progress *p, bool ok) {
    if (p->quiet)
        return;
    int64_t now = st_mono_us();
    if (ok && p->unit == OPS_PROGRESS_PERCENT)
        p->done = 100;
    if (p->tty) {
        print_now(p, now);
        fputc('\n', p->out);
    } else if (ok) {
        print_now(p, now);
    }
    p->drawn = false;
    fflush(p->out);
}
