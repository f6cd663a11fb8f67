/* version.c — the version every Strata binary prints with --version (set in CMakeLists.txt). */
#include "strata/base.h"
#include "strata_version.h"

const char *st_version(void) {
    return STRATA_VERSION_STRING;
}
