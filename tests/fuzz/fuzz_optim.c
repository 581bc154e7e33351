/* fuzz_optim.c - libFuzzer target: the optimizer-state reader (optim.bin,
 * dev_ckpt_load_optim) for a small stage.
 *
 * First byte bit 0: the rest is the whole file; clear: the rest is written
 * over a valid file of this stage (fu_overwrite). Bit 1 re-signs the
 * BLAKE2b-256 trailer so the header, table and size checks behind it are
 * reached. Properties: a refused file leaves the stage's step as it was, an
 * accepted one sets a step that fits an int. */
#include "dev_ckpt.h"
#include "dev_stage.h"
#include "fuzz_util.h"
#include "sl_file.h"

static dev_stage *stage;
static uint8_t *good;
static size_t good_len;

static void done(void)
{
    dev_stage_free(stage);
    free(good);
}

static void setup(void)
{
    if (stage)
        return;
    const char *path = fu_path("good.bin");
    dev_config c;
    sl_err err = {0};
    if (dev_config_parse(&c, "{\"hidden_size\": 8, \"num_hidden_layers\": 1, "
                             "\"num_attention_heads\": 2, \"intermediate_size\": 16, "
                             "\"vocab_size\": 12, \"max_position_embeddings\": 8}",
                         &err))
        fu_die("config", err.msg);
    if (!(stage = dev_stage_create(&c, 0, 2, 1, 4, 1, 7, NULL, 0, &err)))
        fu_die("stage", err.msg);
    dev_stage_set_step(stage, 5);
    char *buf = NULL;
    if (dev_ckpt_save_optim(stage, DEV_OPT_ADAMW, path, &err) ||
        sl_read_file(path, 1u << 24, &buf, &good_len, &err))
        fu_die("optim.bin", err.msg);
    good = (uint8_t *)buf;
    atexit(done);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    if (!size)
        return 0;
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
    if (data[0] & 2)
        fu_resign(b, n, 32);
    const char *path = fu_path("t.bin");
    fu_write(path, b, n);
    free(b);
    dev_stage_set_step(stage, 5);
    sl_err err = {0};
    int kind = (data[0] & 4) ? DEV_OPT_LAMB : DEV_OPT_ADAMW;
    if (dev_ckpt_load_optim(stage, kind, path, &err) != 0) {
        REQUIRE(err.msg[0] && dev_stage_get_step(stage) == 5);
    } else {
        REQUIRE(dev_stage_get_step(stage) >= 0);
    }
    return 0;
}
