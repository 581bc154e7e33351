/* fuzz_safetensors.c - libFuzzer target: the safetensors reader.
 *
 * First byte odd: the rest is the whole file. Even: the rest is the JSON
 * header up to the first NUL, then the tensor bytes; the 8-byte length is
 * filled in (so the fuzzer writes JSON, not lengths). Every tensor is read.
 * Properties: an opened file's tensors cover its data exactly; a file of
 * ours (dev_st_checked) never yields a tensor without a checksum. */
#include "dev_safetensors.h"
#include "fuzz_util.h"

#define MAX_READ (1u << 20)
static float buf[MAX_READ];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fu_path("t.safetensors");
    uint64_t fsize, hlen = 0;
    if (size && (data[0] & 1)) {
        fu_write(path, data + 1, size - 1);
        fsize = size - 1;
        for (int i = 7; i >= 0 && size >= 9; i--)
            hlen = hlen << 8 | data[1 + i];
    } else {
        const uint8_t *in = size ? data + 1 : data;
        size_t n = size ? size - 1 : 0;
        const uint8_t *nul = memchr(in, 0, n);
        size_t hl = nul ? (size_t)(nul - in) : n, rest = nul ? n - hl - 1 : 0;
        uint8_t *f = malloc(8 + n + 1);
        for (int i = 0; i < 8; i++)
            f[i] = (uint8_t)((uint64_t)hl >> (8 * i));
        memcpy(f + 8, in, hl);
        if (rest)
            memcpy(f + 8 + hl, nul + 1, rest);
        fu_write(path, f, 8 + hl + rest);
        free(f);
        fsize = 8 + hl + rest;
        hlen = hl;
    }
    sl_err err = {0};
    dev_st *st = dev_st_open(path, &err);
    if (!st) {
        REQUIRE(err.msg[0]);
        return 0;
    }
    uint64_t covered = 0, end = 8 + hlen;
    for (int i = 0; i < dev_st_count(st); i++) {
        const dev_st_tensor *t = dev_st_at(st, i);
        covered += t->nbytes;
        if (t->offset + t->nbytes > end)
            end = t->offset + t->nbytes;
        REQUIRE(dev_st_find(st, t->name) == t);
        if (t->numel > MAX_READ)
            continue;
        int rc = dev_st_read_f32(st, t, 0, (size_t)t->numel, buf, &err);
        if (t->dtype == DEV_ST_OTHER)
            REQUIRE(rc == -1);
        char key[200];
        snprintf(key, sizeof key, "blake2b/%s", t->name);
        if (dev_st_checked(st) && !dev_st_meta(st, key))
            REQUIREF(rc == -1, "tensor '%s' read without its checksum", t->name);
        if (t->numel >= 2)
            dev_st_read_f32(st, t, 1, 1, buf, &err);
        REQUIRE(dev_st_read_f32(st, t, t->numel, 1, buf, &err) == -1);
    }
    /* the tensors tile the data: no overlap (the sizes add up), no gap, no tail */
    REQUIREF(covered == fsize - 8 - hlen && end == fsize, "covered %llu of %llu, end %llu",
             (unsigned long long)covered, (unsigned long long)(fsize - 8 - hlen),
             (unsigned long long)end);
    dev_st_close(st);
    return 0;
}
