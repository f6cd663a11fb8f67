/*
 * bk_crc32c FILE — prints the CRC32C (Castagnoli, as export manifests hold it) of FILE in 8
 * lower-case hex digits. Tests that re-sign large export manifests use it: a CRC32C computed
 * byte by byte in Python takes tens of seconds for the 10 MB manifest of 60,000 pieces.
 */
#include <inttypes.h>
#include <stdio.h>

#include "strata/base.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: bk_crc32c FILE\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    static unsigned char buf[1 << 16];
    uint32_t crc = 0;
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        crc = st_crc32c(crc, buf, n);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        fprintf(stderr, "%s: read error\n", argv[1]);
        return 1;
    }
    printf("%08" PRIx32 "\n", crc);
    return 0;
}
