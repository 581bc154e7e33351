/* fuzz_optim.c - libFuzzer target: the optimizer state of a checkpoint
 * (dev_ckpt_load) for a small stage, in both formats: optim.safetensors
 * listed in a manifest, and the earlier optim.bin beside a model.
 *
 * First byte: bit 0 the rest is the whole file, else it is written over a
 * valid file (fu_overwrite); bit 1 re-signs optim.bin's BLAKE2b-256
 * trailer (the checks behind it are reached) or, for optim.safetensors,
 * rewrites the manifest with the file's sum (the parts' checks are
 * reached); bit 2 asks for LAMB; bit 3 picks optim.safetensors. Properties:
 * a refused checkpoint leaves the stage's step as it was, an accepted one
 * sets a step that fits an int. */
#include <sodium.h>
#include <sys/stat.h>

#include "dev_ckpt.h"
#include "dev_stage.h"
#include "fuzz_util.h"
#include "sl_file.h"

static dev_stage *stage;
static uint8_t *good_bin, *good_st;
static size_t good_bin_len, good_st_len;

static void done(void)
{
    dev_stage_free(stage);
    free(good_bin);
    free(good_st);
}

/* optim.bin as the earlier format wrote it: header, table, moments, sum. */
static void write_legacy(const char *path)
{
    int nt;
    const dev_tensor *t = dev_stage_tensors(stage, &nt);
    size_t np;
    float *mv = dev_stage_optim_state(stage, &np);
    uint8_t h[64] = {0};
    memcpy(h, "SKYOPT01", 8);
    h[8] = 1;
    h[16] = (uint8_t)dev_stage_get_step(stage);
    const dev_config *c = dev_stage_config(stage);
    uint32_t v[] = {0, 2, (uint32_t)c->hidden, (uint32_t)c->layers, (uint32_t)c->vocab,
                    (uint32_t)c->intermediate, (uint32_t)nt};
    memcpy(h + 24, v, sizeof v);
    uint64_t total = 0;
    for (int k = 0; k < nt; k++)
        total += t[k].numel;
    memcpy(h + 56, &total, 8);
    FILE *f = fopen(path, "wb");
    crypto_generichash_state hs;
    crypto_generichash_init(&hs, NULL, 0, 32);
#define PUT(p, n) (fwrite((p), 1, (n), f), crypto_generichash_update(&hs, (const void *)(p), (n)))
    PUT(h, 64);
    for (int k = 0; k < nt; k++) {
        uint16_t len = (uint16_t)strlen(t[k].name);
        uint64_t ne = t[k].numel;
        PUT(&len, 2);
        PUT(t[k].name, len);
        PUT(&ne, 8);
    }
    for (int which = 0; which < 2; which++)
        for (int k = 0; k < nt; k++)
            PUT(mv + (size_t)which * np + t[k].offset, t[k].numel * sizeof(float));
#undef PUT
    uint8_t sum[32];
    crypto_generichash_final(&hs, sum, sizeof sum);
    fwrite(sum, 1, sizeof sum, f);
    fclose(f);
}

static uint8_t *slurp(const char *path, size_t *n)
{
    char *buf = NULL;
    sl_err err = {0};
    if (sl_read_file(path, 1u << 24, &buf, n, &err))
        fu_die("read", err.msg);
    return (uint8_t *)buf;
}

static void setup(void)
{
    if (stage)
        return;
    dev_config c;
    sl_err err = {0};
    if (sodium_init() < 0 ||
        dev_config_parse(&c, "{\"hidden_size\": 8, \"num_hidden_layers\": 1, "
                             "\"num_attention_heads\": 2, \"intermediate_size\": 16, "
                             "\"vocab_size\": 12, \"max_position_embeddings\": 8}",
                         &err))
        fu_die("config", err.msg);
    if (!(stage = dev_stage_create(&c, 0, 2, 1, 4, 1, 7, NULL, 0, &err)))
        fu_die("stage", err.msg);
    dev_stage_set_step(stage, 5);
    /* the new format in "new/", the earlier one in "old/" */
    const char *nd = fu_path("new"), *od = fu_path("old");
    mkdir(od, 0700);
    char p[4200];
    snprintf(p, sizeof p, "%s/model.safetensors", od);
    if (dev_ckpt_save(&stage, 1, DEV_OPT_ADAMW, nd, NULL, 0, &err) ||
        dev_ckpt_save_model(stage, p, &err) || dev_stage_pull(stage, &err))
        fu_die("checkpoint", err.msg);
    snprintf(p, sizeof p, "%s/optim.bin", od);
    write_legacy(p);
    dev_stage_drop_views(stage);
    good_bin = slurp(p, &good_bin_len);
    snprintf(p, sizeof p, "%s/optim.safetensors", nd);
    good_st = slurp(p, &good_st_len);
    atexit(done);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    if (!size)
        return 0;
    int st = (data[0] & 8) != 0;
    const uint8_t *good = st ? good_st : good_bin;
    size_t good_len = st ? good_st_len : good_bin_len;
    uint8_t *b;
    size_t n;
    if (data[0] & 1) {
        n = size - 1;
        b = malloc(n ? n : 1);
        memcpy(b, data + 1, n);
    } else {
        n = good_len;
        b = fu_overwrite(good, good_len, data + 1, size - 1);
    }
    if ((data[0] & 2) && !st)
        fu_resign(b, n, 32);
    const char *dir = fu_path(st ? "new" : "old");
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, st ? "optim.safetensors" : "optim.bin");
    fu_write(p, b, n);
    free(b);
    sl_err err = {0};
    if (st && (data[0] & 2)) { /* the manifest vouches for the fuzzed file */
        dev_ckpt_file f[3];
        if (dev_ckpt_file_of(dir, "model.safetensors", &f[0], &err) ||
            dev_ckpt_file_of(dir, "optim.safetensors", &f[1], &err) ||
            dev_ckpt_file_of(dir, "config.json", &f[2], &err) ||
            dev_ckpt_write_manifest(dir, 5, DEV_OPT_ADAMW, 0, f, 3, &err))
            fu_die("manifest", err.msg);
    }
    dev_stage_set_step(stage, 3);
    int kind = (data[0] & 4) ? DEV_OPT_LAMB : DEV_OPT_ADAMW;
    if (dev_ckpt_load(stage, kind, dir, &err) != 0) {
        REQUIRE(err.msg[0] && dev_stage_get_step(stage) == 3);
    } else {
        REQUIRE(dev_stage_get_step(stage) >= 0);
    }
    return 0;
}
