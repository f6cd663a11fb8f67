/* replay_main.c — runs a libFuzzer target without libFuzzer (SQLite's fuzzcheck idea), so gcc
 * and ASan builds test every fuzz target in CI: each file of the corpus folder given as argv[1],
 * then each corpus file with random byte flips, then random inputs, all from a fixed seed. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REPLAY_FILE_MAX (4u << 20)
#define REPLAY_RANDOM_INPUTS 3000

static uint64_t rng_state = 0x5eed5eed12345678ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static size_t read_file(const char *path, uint8_t *buf) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, REPLAY_FILE_MAX, f);
    fclose(f);
    return n;
}

static void run_with_flips(const uint8_t *data, size_t n, uint8_t *scratch) {
    LLVMFuzzerTestOneInput(data, n);
    for (int round = 0; round < 20 && n > 0; round++) {
        memcpy(scratch, data, n);
        int flips = 1 + (int)(rnd() % 4);
        for (int i = 0; i < flips; i++)
            scratch[rnd() % n] ^= (uint8_t)(1u << (rnd() % 8));
        size_t len = (round % 5 == 4) ? (size_t)(rnd() % n) : n; /* sometimes truncated */
        LLVMFuzzerTestOneInput(scratch, len);
    }
}

int main(int argc, char **argv) {
    uint8_t *buf = malloc(REPLAY_FILE_MAX), *scratch = malloc(REPLAY_FILE_MAX);
    if (!buf || !scratch)
        return 2;
    int files = 0;
    DIR *d = argc > 1 ? opendir(argv[1]) : NULL;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", argv[1], e->d_name);
        size_t n = read_file(path, buf);
        run_with_flips(buf, n, scratch);
        files++;
    }
    if (d)
        closedir(d);
    for (int i = 0; i < REPLAY_RANDOM_INPUTS; i++) {
        size_t n = (size_t)(rnd() % 512);
        for (size_t k = 0; k < n; k++)
            buf[k] = (uint8_t)rnd();
        LLVMFuzzerTestOneInput(buf, n);
    }
    printf("replayed %d corpus files (+ flips) and %d random inputs: no crash\n", files,
           REPLAY_RANDOM_INPUTS);
    free(buf);
    free(scratch);
    return 0;
}
