/* fuzz_replay.c - runs a libFuzzer target without libFuzzer, as an ordinary
 * test in every build (gcc, ASan): first 3000 seeded random inputs, then
 * every file in the directories given (regress/<name>/: inputs that once
 * crashed; corpus/<name>/: seeds). A broken property aborts, failing the test.
 * Missing directories are fine. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sl_rng.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    uint8_t *buf = malloc(1 << 20);
    size_t n = buf ? fread(buf, 1, 1 << 20, f) : 0;
    fclose(f);
    if (!buf)
        return 0;
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 1;
}

static int run_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    char **names = NULL;
    size_t count = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (count == cap) {
            cap = cap ? 2 * cap : 64;
            char **grown = realloc(names, cap * sizeof(*names));
            if (!grown)
                break;
            names = grown;
        }
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        names[count] = malloc(len);
        if (!names[count])
            break;
        snprintf(names[count], len, "%s/%s", dir, e->d_name);
        count++;
    }
    closedir(d);
    qsort(names, count, sizeof(*names), by_name);
    int ran = 0;
    for (size_t i = 0; i < count; i++) {
        ran += run_file(names[i]);
        free(names[i]);
    }
    free(names);
    return ran;
}

int main(int argc, char **argv)
{
    static uint8_t buf[4096];
    int ran = 0;
    for (uint64_t it = 0; it < 3000; it++) {
        size_t n = sl_rng_u32(0xf022, 1, it) % sizeof(buf);
        for (size_t i = 0; i < n; i++)
            buf[i] = (uint8_t)sl_rng_u32(0xf022, 2 + it, i);
        LLVMFuzzerTestOneInput(buf, n);
        ran++;
    }
    for (int i = 1; i < argc; i++)
        ran += run_dir(argv[i]);
    printf("%d inputs ran, no property broken\n", ran);
    return 0;
}
