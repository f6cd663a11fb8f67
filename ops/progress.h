/* ops/progress.h — progress of a long command on stderr, private to ops/: on a terminal one line
 * redrawn in place (a bar, bytes or percent, rate, ETA); otherwise a plain line now and then, so
 * logs of scripted runs stay short. Data and results go to stdout, never here. */
#ifndef STRATA_OPS_PROGRESS_H
#define STRATA_OPS_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define OPS_PROGRESS_TTY_MS 200 /* redraw interval on a terminal */
#define OPS_PROGRESS_PLAIN_S 5  /* interval of plain lines otherwise */
#define OPS_PROGRESS_LABEL_MAX 64

typedef enum ops_progress_unit {
    OPS_PROGRESS_BYTES = 0, /* done/total are bytes: shows sizes, rate and ETA */
    OPS_PROGRESS_PERCENT,   /* done is 0..100 of an operation the server reports */
} ops_progress_unit;

typedef struct ops_progress {
    FILE *out;  /* stderr, or a test's file */
    bool tty;   /* redraw in place */
    bool quiet; /* print nothing */
    ops_progress_unit unit;
    char label[OPS_PROGRESS_LABEL_MAX]; /* "strata backup export" */
    uint64_t total, done;
    int64_t start_us, last_print_us;
    bool drawn; /* a tty line is on screen (ends with a newline at the finish) */
} ops_progress;

/* Starts a progress on stderr (tty when isatty(stderr)); total 0 = unknown. */
void ops_progress_init(ops_progress *p, const char *label, ops_progress_unit unit, uint64_t total,
                       bool quiet);
/* Sets the total once it is known (after the progress started: its clock runs from the init). */
void ops_progress_total(ops_progress *p, uint64_t total);
/* Adds bytes (or sets the percent, OPS_PROGRESS_PERCENT) and prints when the interval passed. */
void ops_progress_add(ops_progress *p, uint64_t n);
void ops_progress_set(ops_progress *p, uint64_t done);
/* A message line that does not break the bar (the bar is redrawn after it). */
void ops_progress_note(ops_progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The final line (always printed unless quiet): totals, time and mean rate. */
void ops_progress_finish(ops_progress *p, bool ok);
/* "1.5 GiB", "312 KiB", "17 B" into out. */
void ops_progress_bytes(uint64_t n, char *out, size_t cap);
/* Formats the current line (without "\r" or newline) into out: exposed for tests. */
void ops_progress_line(const ops_progress *p, int64_t now_us, char *out, size_t cap);

#endif
