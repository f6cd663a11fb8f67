/* node/regex_cost.h — what compiling a regex costs, estimated from its text before RE2 sees it.
 *
 * RE2 compiles on the node's event loop, and its work is not proportional to the pattern's bytes:
 * a repetition x{n} is compiled as n copies of x, and every Unicode class escape (\pL, \p{Greek},
 * \PN) makes the parser build the class's hundreds of Unicode ranges even though Bigtable regexes
 * match Latin-1 bytes. A 9 KB filter of 400 regexes (\pL|\pN){300} took 0.5 to 2 s to compile;
 * 3,000 \pL in one regex took 0.35 s. RE2's max_mem bounds the compiled program, not this work
 * (it does not count the parser's Unicode ranges, nor copies that compile to nothing), so the
 * filter's regexes are weighed here and refused past a budget before any of them is compiled.
 *
 * The unit is one compiled instruction of a repeated copy, at most about 0.5 microseconds
 * measured (one literal, one range of a class); most constructs cost 0.05 to 0.4 us a unit. The
 * estimate is conservative: it reads the pattern as RE2 would but charges what it cannot tell
 * apart at the worst price (a class by its bytes, every repetition at its largest count, every
 * \p as the largest Unicode class). */
#ifndef STRATA_NODE_REGEX_COST_H
#define STRATA_NODE_REGEX_COST_H

#include <stddef.h>
#include <stdint.h>

/* Fixed cost of one regex: the RE2 object, its options and an empty program (8 us measured). */
#define NODE_REGEX_COST_BASE 32
/* Parsing one Unicode class escape (\pL: 130 to 150 us, its ranges built one by one). */
#define NODE_REGEX_COST_UNICODE_PARSE 512
/* Compiling one copy of a Unicode class (its ranges walked, up to 7 instructions: 1.5 to 5 us
 * for \pL). */
#define NODE_REGEX_COST_UNICODE_COPY 16
/* Returned for patterns nested deeper than this; RE2's own limit is 1,000 levels. */
#define NODE_REGEX_COST_DEPTH_MAX 1000
/* Estimates saturate here (no overflow whatever the pattern says). */
#define NODE_REGEX_COST_MAX ((uint64_t)1 << 48)

/* Estimated compile work of pattern[0..len), in the units above: NODE_REGEX_COST_BASE, plus one
 * per byte, plus NODE_REGEX_COST_UNICODE_PARSE per Unicode class escape, plus the weight of the
 * pattern with every repetition expanded (x{n,m} counts x m times). Never fails: a pattern RE2
 * would reject gets an estimate too (RE2 reports its error when it is compiled), and one nested
 * past NODE_REGEX_COST_DEPTH_MAX gets NODE_REGEX_COST_MAX. */
uint64_t node_regex_cost(const uint8_t *pattern, size_t len);

#endif
