/* Checkpoints and configs: save/load round trips bit for bit (weights,
 * optimizer moments, step; resuming continues exactly), a full model loads
 * into the slices of a split, and damaged or mismatched files are refused
 * with the tensor's name: truncated, flipped bytes (header and data), wrong
 * shape, missing tensor, extra layer, wrong optimizer, wrong unit range. A
 * refused load leaves the stage untouched. */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dev_ckpt.h"
#include "dev_config.h"
#include "dev_safetensors.h"
#include "dev_testutil.h"
#include "kn_testutil.h"

static char g_dir[] = "/tmp/skyloom-ckpt-XXXXXX";
static const dev_config cfg = {.hidden = 32, .layers = 2, .heads = 2, .intermediate = 48,
                               .vocab = 61, .max_pos = 16, .type_vocab = 2, .ln_eps = 1e-12f,
                               .gelu = 0, .hidden_dropout = 0.1f, .attn_dropout = 0.0f,
                               .init_range = 0.02f};
enum { B = 2, T = 12 };

/* g_dir/name in one of 16 rotating buffers (callers keep what they need longer). */
static const char *path(const char *name)
{
    static char buf[16][256];
    static int i;
    i = (i + 1) % 16;
    snprintf(buf[i], sizeof buf[i], "%s/%s", g_dir, name);
    return buf[i];
}

static void copy_file(const char *from, const char *to, long truncate_to, long flip_at)
{
    FILE *f = fopen(from, "rb");
    CHECK(f != NULL);
    if (!f)
        return;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *buf = malloc((size_t)n);
    CHECK(fread(buf, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    if (flip_at >= 0 && flip_at < n)
        buf[flip_at] ^= 0x10;
    if (truncate_to >= 0 && truncate_to < n)
        n = truncate_to;
    f = fopen(to, "wb");
    CHECK(f && fwrite(buf, 1, (size_t)n, f) == (size_t)n);
    if (f)
        fclose(f);
    free(buf);
}

static dev_train *trained(int steps, const dev_optim *o)
{
    sl_err err = {0};
    int bounds[2] = {0, 4};
    dev_train *tr = dev_train_create(&cfg, bounds, 1, B, T, 1, 3, &err);
    for (int s = 0; s < steps; s++) {
        dt_batch b;
        dt_make_batch(&b, B, T, cfg.vocab, 500 + (uint64_t)s);
        dev_batch db = dt_view(&b);
        dev_step_info info;
        CHECKF(dev_train_step(tr, &db, o, &info, &err) == 0, "%s", err.msg);
        dt_free_batch(&b);
    }
    return tr;
}

static double next_loss(dev_train *tr, const dev_optim *o)
{
    dt_batch b;
    dt_make_batch(&b, B, T, cfg.vocab, 900);
    dev_batch db = dt_view(&b);
    dev_step_info info = {0};
    sl_err err = {0};
    CHECKF(dev_train_step(tr, &db, o, &info, &err) == 0, "%s", err.msg);
    CHECKF(dev_train_step(tr, &db, o, &info, &err) == 0, "%s", err.msg);
    dt_free_batch(&b);
    return info.loss;
}

static long file_size(const char *p)
{
    struct stat st;
    return stat(p, &st) ? -1 : (long)st.st_size;
}

/* Loading `file` must fail with a message containing `want`, leaving the
 * stage's weights as they were. */
static void refused(dev_stage *s, const char *file, const char *want, const char *what)
{
    size_t np;
    float *p = dev_stage_params(s, &np);
    float *before = kt_alloc(np);
    memcpy(before, p, np * sizeof(float));
    sl_err err = {0};
    int rc = dev_ckpt_load_model(s, file, &err);
    CHECKF(rc == -1, "%s: loaded", what);
    CHECKF(strstr(err.msg, want) != NULL, "%s: message '%s' lacks '%s'", what, err.msg, want);
    CHECKF(kt_bitwise_equal(before, p, np), "%s: a refused load changed the weights", what);
    printf("    %-28s -> %s\n", what, err.msg + (strncmp(err.msg, g_dir, strlen(g_dir)) ? 0 : strlen(g_dir) + 1));
    free(before);
}

static void test_round_trip_and_resume(void)
{
    dev_optim o;
    dev_optim_default(&o);
    o.lr = 1e-3f;
    dev_train *a = trained(3, &o);
    dev_stage *s = dev_train_stage(a, 0);
    sl_err err = {0};
    CHECKF(dev_ckpt_save(&s, 1, o.kind, path("ck"), NULL, 0, &err) == 0, "%s", err.msg);
    dev_train *b = trained(0, &o);
    dev_stage *t = dev_train_stage(b, 0);
    CHECKF(dev_ckpt_load(t, o.kind, path("ck"), &err) == 0, "%s", err.msg);
    size_t np;
    const float *ps = dev_stage_params(s, &np);
    CHECK(kt_bitwise_equal(ps, dev_stage_params(t, NULL), np));
    CHECK(kt_bitwise_equal(dev_stage_optim_state(s, NULL), dev_stage_optim_state(t, NULL), 2 * np));
    CHECK(dev_stage_get_step(t) == 3);
    dev_config back;
    CHECKF(dev_config_load(&back, path("ck/config.json"), &err) == 0, "%s", err.msg);
    CHECK(back.hidden == cfg.hidden && back.layers == cfg.layers && back.vocab == cfg.vocab &&
          back.ln_eps == cfg.ln_eps && back.hidden_dropout == cfg.hidden_dropout);
    double la = next_loss(a, &o), lb = next_loss(b, &o);
    CHECKF(la == lb, "resumed run: loss %.17g vs %.17g", lb, la);
    /* a part of another save is refused: by the manifest's sum, and by its
     * step when the manifest is replaced too */
    CHECKF(dev_ckpt_save(&s, 1, o.kind, path("ck5"), NULL, 0, &err) == 0, "%s", err.msg);
    copy_file(path("ck/manifest.json"), path("ck3.manifest"), -1, -1);
    copy_file(path("ck5/optim.safetensors"), path("ck/optim.safetensors"), -1, -1);
    sl_err e = {0};
    CHECKF(dev_ckpt_load(t, o.kind, path("ck"), &e) == -1 && strstr(e.msg, "another checksum"),
           "mixed saves: '%s'", e.msg);
    copy_file(path("ck5/manifest.json"), path("ck/manifest.json"), -1, -1);
    copy_file(path("ck3.manifest"), path("ck5/manifest.json"), -1, -1);
    CHECKF(dev_ckpt_load(t, o.kind, path("ck"), &e) == -1 && strstr(e.msg, "another checksum"),
           "mixed manifest: '%s'", e.msg);
    /* a checkpoint whose model lost its metadata (checksums and all) is
     * refused, even with a manifest that matches it, though the same file
     * loads as a model from elsewhere */
    CHECKF(dev_ckpt_save(&s, 1, o.kind, path("ck6"), NULL, 0, &err) == 0, "%s", err.msg);
    FILE *f = fopen(path("ck6/model.safetensors"), "r+b");
    static char hdr[16384];
    size_t got = f ? fread(hdr, 1, sizeof hdr, f) : 0;
    char *m = memmem(hdr, got, "\"__metadata__\":{", 16), *me = m ? strstr(m, "},") : NULL;
    CHECK(m && me);
    if (f && m && me) {
        memset(m, ' ', (size_t)(me - m) + 2);
        CHECK(fseek(f, 0, SEEK_SET) == 0 && fwrite(hdr, 1, got, f) == got);
    }
    if (f)
        fclose(f);
    dev_ckpt_file mf[3];
    CHECK(dev_ckpt_file_of(path("ck6"), "model.safetensors", &mf[0], &err) == 0 &&
          dev_ckpt_file_of(path("ck6"), "optim.safetensors", &mf[1], &err) == 0 &&
          dev_ckpt_file_of(path("ck6"), "config.json", &mf[2], &err) == 0 &&
          dev_ckpt_write_manifest(path("ck6"), dev_stage_get_step(s), o.kind, 0, mf, 3, &err) == 0);
    CHECKF(dev_ckpt_load(t, o.kind, path("ck6"), &e) == -1 && strstr(e.msg, "has no checksums"),
           "metadata blanked: '%s'", e.msg);
    CHECKF(dev_ckpt_load_model(t, path("ck6/model.safetensors"), &e) == 0, "%s", e.msg);
    /* The full model loads into the slices of a 2-stage split (the head's
     * decoder copy from the word embeddings) and evaluates identically. */
    int bounds[3] = {0, 2, 4};
    dev_train *split = dev_train_create(&cfg, bounds, 2, B, T, 1, 77, &err);
    CHECKF(dev_ckpt_save_model(s, path("full.safetensors"), &err) == 0, "%s", err.msg);
    for (int i = 0; i < 2; i++)
        CHECKF(dev_ckpt_load_model(dev_train_stage(split, i), path("full.safetensors"), &err) == 0,
               "%s", err.msg);
    dt_batch bt;
    dt_make_batch(&bt, B, T, cfg.vocab, 1234);
    dev_batch db = dt_view(&bt);
    double l1, l2;
    int m1, m2;
    CHECK(dev_train_eval(a, &db, &l1, &m1, &err) == 0);
    CHECK(dev_train_eval(split, &db, &l2, &m2, &err) == 0);
    CHECKF(l1 == l2 && m1 == m2, "split eval %.17g vs %.17g", l2, l1);
    /* and a slice saves the head's copy as cls.predictions.decoder.weight */
    CHECKF(dev_ckpt_save_model(dev_train_stage(split, 1), path("slice.safetensors"), &err) == 0,
           "%s", err.msg);
    dev_st *st = dev_st_open(path("slice.safetensors"), &err);
    CHECK(st && dev_st_find(st, "cls.predictions.decoder.weight") &&
          !dev_st_find(st, "bert.embeddings.word_embeddings.weight") &&
          dev_st_find(st, "bert.encoder.layer.1.attention.self.value.bias"));
    dev_st_close(st);
    dt_free_batch(&bt);
    dev_train_free(split);
    dev_train_free(a);
    dev_train_free(b);
}

static void test_damaged_model(void)
{
    dev_optim o;
    dev_optim_default(&o);
    dev_train *a = trained(1, &o);
    dev_stage *s = dev_train_stage(a, 0);
    sl_err err = {0};
    char good[256];
    snprintf(good, sizeof good, "%s", path("good.safetensors"));
    CHECKF(dev_ckpt_save_model(s, good, &err) == 0, "%s", err.msg);
    long n = file_size(good);
    dev_st *st = dev_st_open(good, &err);
    const dev_st_tensor *last = dev_st_at(st, dev_st_count(st) - 1);
    const dev_st_tensor *wte = dev_st_find(st, "bert.embeddings.word_embeddings.weight");
    long data_flip = (long)(wte->offset + 100);
    char last_name[128];
    snprintf(last_name, sizeof last_name, "%s", last->name);
    dev_st_close(st);

    dev_train *fresh = trained(0, &o);
    dev_stage *t = dev_train_stage(fresh, 0);
    copy_file(good, path("trunc.safetensors"), n - 40, -1);
    refused(t, path("trunc.safetensors"), "truncated", "truncated");
    copy_file(good, path("trunc2.safetensors"), 5, -1);
    refused(t, path("trunc2.safetensors"), "too short", "truncated to 5 bytes");
    copy_file(good, path("flip.safetensors"), -1, data_flip);
    refused(t, path("flip.safetensors"), "word_embeddings.weight': checksum mismatch",
            "flipped data byte");
    copy_file(good, path("len.safetensors"), -1, 6);
    refused(t, path("len.safetensors"), "bad header length", "flipped header length");
    /* flip a byte inside a checksum's key, then inside a tensor's name */
    FILE *f = fopen(good, "rb");
    static char hdr[16384];
    size_t got = f ? fread(hdr, 1, sizeof hdr, f) : 0;
    CHECK(got == sizeof hdr);
    if (f)
        fclose(f);
    char *q = memmem(hdr, got, "blake2b/bert.embeddings.LayerNorm.bias", 38);
    CHECK(q != NULL);
    copy_file(good, path("key.safetensors"), -1, q ? (long)(q - hdr) + 12 : 20);
    refused(t, path("key.safetensors"), "which the file does not have",
            "flipped byte in a checksum key");
    q = memmem(hdr, got, "\"bert.embeddings.LayerNorm.bias\":{", 33);
    CHECK(q != NULL);
    copy_file(good, path("name.safetensors"), -1, q ? (long)(q - hdr) + 12 : 20);
    refused(t, path("name.safetensors"), "tensor '", "flipped byte in a name");
    /* bytes after the last tensor */
    copy_file(good, path("tail.safetensors"), -1, -1);
    f = fopen(path("tail.safetensors"), "ab");
    CHECK(f && fwrite("junk", 1, 4, f) == 4);
    if (f)
        fclose(f);
    refused(t, path("tail.safetensors"), "4 bytes of trailing data after the last tensor",
            "trailing bytes");
    /* __metadata__ that is not an object of strings cannot turn the checksums
     * off: a damaged tensor behind it is still refused */
    const char *meta = memmem(hdr, got, "\"__metadata__\":{", 16);
    const char *mend = meta ? memchr(meta, '}', got - (size_t)(meta - hdr)) : NULL;
    CHECK(meta && mend);
    static const char *const repl[] = {"\"__metadata__\":5", "\"__metadata__\":{\"format\":1}"};
    for (int i = 0; i < 2 && meta && mend; i++) {
        char *buf = malloc((size_t)n);
        FILE *g = fopen(good, "rb");
        CHECK(g && fread(buf, 1, (size_t)n, g) == (size_t)n);
        if (g)
            fclose(g);
        size_t at = (size_t)(meta - hdr), len = (size_t)(mend - meta) + 1;
        memset(buf + at, ' ', len);
        memcpy(buf + at, repl[i], strlen(repl[i]));
        buf[data_flip] ^= 0x10;
        g = fopen(path("meta.safetensors"), "wb");
        CHECK(g && fwrite(buf, 1, (size_t)n, g) == (size_t)n);
        if (g)
            fclose(g);
        free(buf);
        refused(t, path("meta.safetensors"), "__metadata__ must be an object of strings",
                i ? "metadata with a number" : "metadata 5 over a damaged tensor");
    }

    /* wrong shape: a model of another width */
    dev_config wide = cfg;
    wide.hidden = 48;
    wide.heads = 3;
    int b4[2] = {0, 4};
    dev_train *w = dev_train_create(&wide, b4, 1, B, T, 1, 3, &err);
    CHECKF(dev_ckpt_save_model(dev_train_stage(w, 0), path("wide.safetensors"), &err) == 0, "%s",
           err.msg);
    refused(t, path("wide.safetensors"), "bert.embeddings.word_embeddings.weight' has shape [61, 48], the config needs [61, 32]",
            "wrong shape");
    dev_train_free(w);
    /* an extra layer */
    dev_config deep = cfg;
    deep.layers = 3;
    int b5[2] = {0, 5};
    dev_train *d = dev_train_create(&deep, b5, 1, B, T, 1, 3, &err);
    CHECKF(dev_ckpt_save_model(dev_train_stage(d, 0), path("deep.safetensors"), &err) == 0, "%s",
           err.msg);
    refused(t, path("deep.safetensors"), "has layer 2 but the config has 2 layers", "extra layer");
    dev_train_free(d);
    /* a missing tensor: rewrite the file without its last tensor */
    st = dev_st_open(good, &err);
    int cnt = dev_st_count(st);
    dev_st_out *outs = calloc((size_t)cnt, sizeof *outs);
    float **bufs = calloc((size_t)cnt, sizeof *bufs);
    int k = 0;
    for (int i = 0; i < cnt; i++) {
        const dev_st_tensor *x = dev_st_at(st, i);
        if (!strcmp(x->name, last_name))
            continue;
        bufs[k] = kt_alloc(x->numel);
        CHECK(dev_st_read_f32(st, x, 0, x->numel, bufs[k], &err) == 0);
        snprintf(outs[k].name, sizeof outs[k].name, "%s", x->name);
        outs[k].ndim = x->ndim;
        outs[k].shape[0] = x->shape[0];
        outs[k].shape[1] = x->ndim > 1 ? x->shape[1] : 0;
        outs[k].data = bufs[k];
        k++;
    }
    dev_st_close(st);
    CHECKF(dev_st_write(path("missing.safetensors"), outs, k, NULL, &err) == 0, "%s", err.msg);
    char want[200];
    snprintf(want, sizeof want, "missing tensor '%s'", last_name);
    refused(t, path("missing.safetensors"), want, "missing tensor");
    for (int i = 0; i < k; i++)
        free(bufs[i]);
    free(bufs);
    free(outs);
    refused(t, path("does-not-exist"), "No such file", "no file");
    dev_train_free(fresh);
    dev_train_free(a);
}

/* A damaged or mismatched checkpoint directory is refused with the reason
 * and the stage keeps its state. */
static void test_damaged_checkpoint(void)
{
    dev_optim o;
    dev_optim_default(&o);
    dev_train *a = trained(2, &o);
    dev_stage *s = dev_train_stage(a, 0);
    sl_err err = {0};
    CHECKF(dev_ckpt_save(&s, 1, DEV_OPT_ADAMW, path("good"), NULL, 0, &err) == 0, "%s", err.msg);
    long n = file_size(path("good/optim.safetensors"));
    dev_train *fresh = trained(0, &o);
    dev_stage *t = dev_train_stage(fresh, 0);
    struct {
        const char *file;
        long trunc, flip;
        int kind;
        const char *want, *what;
    } cases[] = {
        {"optim.safetensors", n - 1, -1, DEV_OPT_ADAMW, "another checksum", "moments truncated"},
        {"optim.safetensors", -1, n / 2, DEV_OPT_ADAMW, "another checksum", "flipped moment byte"},
        {"model.safetensors", -1, 100, DEV_OPT_ADAMW, "another checksum", "flipped model byte"},
        {"manifest.json", 20, -1, DEV_OPT_ADAMW, "not a Skyloom checkpoint manifest", "manifest cut"},
        {"optim.safetensors", -2, -1, DEV_OPT_ADAMW, "No such file", "moments missing"},
        {NULL, -1, -1, DEV_OPT_LAMB, "state of optimizer adamw, this run uses lamb", "wrong optimizer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", path("bad"), path("good"), path("bad"));
        CHECK(system(cmd) == 0);
        if (cases[i].file) {
            char f[200];
            snprintf(f, sizeof f, "good/%s", cases[i].file);
            const char *from = path(f);
            snprintf(f, sizeof f, "bad/%s", cases[i].file);
            if (cases[i].trunc == -2)
                CHECK(unlink(path(f)) == 0);
            else
                copy_file(from, path(f), cases[i].trunc, cases[i].flip);
        }
        sl_err e = {0};
        int rc = dev_ckpt_load(t, cases[i].kind, path("bad"), &e);
        CHECKF(rc == -1 && strstr(e.msg, cases[i].want), "%s: '%s'", cases[i].what, e.msg);
        CHECK(dev_stage_get_step(t) == 0);
        printf("    %-28s -> %s\n", cases[i].what, strstr(e.msg, "bad") ? strstr(e.msg, "bad") : e.msg);
    }
    /* bf16 moments are not loaded into fp32 ones, nor the reverse */
    dev_stage *b16 = dev_stage_create(&cfg, 0, 3, B, T, 1, 3, NULL, DEV_STAGE_BF16_STATE, &err);
    sl_err e = {0};
    CHECK(b16 && dev_ckpt_load(b16, DEV_OPT_ADAMW, path("good"), &e) == -1 &&
          strstr(e.msg, "--optim-state fp32"));
    printf("    %-28s -> %s\n", "bf16 run, fp32 checkpoint", strstr(e.msg, "good") ? strstr(e.msg, "good") : e.msg);
    dev_stage_free(b16);
    CHECK(dev_ckpt_load(t, DEV_OPT_ADAMW, g_dir, &e) == -1 && strstr(e.msg, "not a checkpoint"));
    dev_train_free(fresh);
    dev_train_free(a);
}

/* Writes the earlier optimizer file (optim.bin) of a one-stage run as that
 * format had it: header, table of our tensor names, moments, BLAKE2b. */
static void write_legacy_optim(dev_stage *s, const char *file)
{
    CHECK(dev_stage_pull(s, NULL) == 0);
    int nt;
    const dev_tensor *t = dev_stage_tensors(s, &nt);
    size_t np;
    float *mv = dev_stage_optim_state(s, &np);
    uint8_t h[64] = {0};
    memcpy(h, "SKYOPT01", 8);
    uint64_t total = 0;
    for (int k = 0; k < nt; k++)
        total += t[k].numel;
    h[8] = 1;
    h[12] = DEV_OPT_ADAMW;
    uint64_t step = (uint64_t)dev_stage_get_step(s);
    memcpy(h + 16, &step, 8);
    uint32_t v[] = {0, (uint32_t)cfg.layers + 1, (uint32_t)cfg.hidden, (uint32_t)cfg.layers,
                    (uint32_t)cfg.vocab, (uint32_t)cfg.intermediate, (uint32_t)nt};
    memcpy(h + 24, v, sizeof v);
    memcpy(h + 56, &total, 8);
    FILE *f = fopen(file, "wb");
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
    dev_stage_drop_views(s);
}

/* Checkpoints by name: parts written by any cut (one file for all stages, or
 * one tagged part per stage) load into any other cut, moments included, and
 * training continues bit for bit; the earlier format (optim.bin) is read by
 * name too. */
static void test_any_cut(void)
{
    dev_optim o;
    dev_optim_default(&o);
    o.lr = 1e-3f;
    sl_err err = {0};
    static const int one[] = {0, 4}, three[] = {0, 1, 3, 4}, two[] = {0, 2, 4};
    dev_train *ref = trained(2, &o); /* one stage */
    dev_train *src = dev_train_create(&cfg, three, 3, B, T, 1, 3, &err);
    for (int s = 0; s < 2; s++) {
        dt_batch b;
        dt_make_batch(&b, B, T, cfg.vocab, 500 + (uint64_t)s);
        dev_batch db = dt_view(&b);
        dev_step_info info;
        CHECKF(dev_train_step(src, &db, &o, &info, &err) == 0, "%s", err.msg);
        dt_free_batch(&b);
    }
    /* one tagged part per stage, then the manifest */
    dev_ckpt_file files[8];
    int nf = 0;
    for (int i = 0; i < 3; i++) {
        dev_stage *st = dev_train_stage(src, i);
        char tag[16];
        snprintf(tag, sizeof tag, "s%d", i);
        CHECKF(dev_ckpt_write_part(&st, 1, o.kind, path("parts"), tag, files + nf, &err) == 0,
               "%s", err.msg);
        nf += 2;
    }
    CHECKF(dev_ckpt_write_manifest(path("parts"), 2, o.kind, 0, files, nf, &err) == 0, "%s", err.msg);
    /* the earlier format, from the one-stage run */
    dev_stage *r0 = dev_train_stage(ref, 0);
    CHECK(mkdir(path("old"), 0755) == 0);
    CHECKF(dev_ckpt_save_model(r0, path("old/model.safetensors"), &err) == 0, "%s", err.msg);
    write_legacy_optim(r0, path("old/optim.bin"));
    const char *dirs[] = {"parts", "old"};
    for (int d = 0; d < 2; d++)
        for (int c = 0; c < 2; c++) {
            const int *bounds = c ? two : one;
            int n = c ? 2 : 1;
            dev_train *dst = dev_train_create(&cfg, bounds, n, B, T, 1, 3, &err);
            for (int i = 0; i < n; i++)
                CHECKF(dev_ckpt_load(dev_train_stage(dst, i), o.kind, path(dirs[d]), &err) == 0,
                       "%s into %d stages: %s", dirs[d], n, err.msg);
            CHECK(dev_stage_get_step(dev_train_stage(dst, n - 1)) == 2);
            /* every tensor and both moments equal the one-stage run's */
            int nt;
            const dev_tensor *t = dev_stage_tensors(r0, &nt);
            size_t np;
            const float *pr = dev_stage_params(r0, &np), *mr = dev_stage_optim_state(r0, NULL);
            int same = 1;
            for (int k = 0; k < nt; k++)
                for (int i = 0; i < n; i++) {
                    dev_stage *st = dev_train_stage(dst, i);
                    int mt;
                    const dev_tensor *u = dev_stage_tensors(st, &mt);
                    size_t mp;
                    const float *pd = dev_stage_params(st, &mp);
                    CHECK(dev_stage_pull(st, &err) == 0);
                    const float *md = dev_stage_optim_state(st, NULL);
                    for (int j = 0; j < mt; j++)
                        if (!strcmp(u[j].name, t[k].name) ||
                            ((u[j].flags & DEV_T_TIED) && !strcmp(t[k].name, "bert.embeddings.word_embeddings.weight")))
                            same &= kt_bitwise_equal(pd + u[j].offset, pr + t[k].offset, t[k].numel) &&
                                    kt_bitwise_equal(md + u[j].offset, mr + t[k].offset, t[k].numel) &&
                                    kt_bitwise_equal(md + mp + u[j].offset, mr + np + t[k].offset, t[k].numel);
                }
            CHECKF(same, "%s into %d stages: a tensor or moment differs", dirs[d], n);
            double l1 = next_loss(dst, &o);
            dev_train *again = trained(2, &o);
            double l0 = next_loss(again, &o);
            CHECKF(l0 == l1, "%s into %d stages: next loss %.17g vs %.17g", dirs[d], n, l1, l0);
            printf("    %-6s -> %d stage%s: tensors, moments and the next steps equal\n", dirs[d], n,
                   n > 1 ? "s" : "");
            dev_train_free(again);
            dev_train_free(dst);
        }
    dev_train_free(src);
    dev_train_free(ref);
}

/* A file per unit (what devices upload in a job), and a device given only
 * the files of its own units: it loads its stage from them and equals the
 * whole run; a stage of other units cannot, nor can the strict loader. */
static void test_unit_parts(void)
{
    dev_optim o;
    dev_optim_default(&o);
    o.lr = 1e-3f;
    sl_err err = {0};
    static const int three[] = {0, 1, 3, 4}, two[] = {0, 2, 4};
    dev_train *ref = trained(2, &o);
    dev_train *src = dev_train_create(&cfg, three, 3, B, T, 1, 3, &err);
    for (int s = 0; s < 2; s++) {
        dt_batch b;
        dt_make_batch(&b, B, T, cfg.vocab, 500 + (uint64_t)s);
        dev_batch db = dt_view(&b);
        dev_step_info info;
        CHECKF(dev_train_step(src, &db, &o, &info, &err) == 0, "%s", err.msg);
        dt_free_batch(&b);
    }
    dev_ckpt_file all[16];
    int nall = 0;
    for (int i = 0; i < 3; i++) {
        dev_stage *st = dev_train_stage(src, i);
        dev_ckpt_file *f = NULL;
        int nf = 0;
        char tag[16];
        snprintf(tag, sizeof tag, "d%d", i);
        CHECKF(dev_ckpt_write_unit_parts(&st, 1, o.kind, path("units"), tag, &f, &nf, &err) == 0,
               "%s", err.msg);
        int u0, u1;
        dev_stage_units(st, &u0, &u1);
        CHECKF(nf == 2 * (u1 - u0 + 1), "stage %d: %d files", i, nf);
        for (int k = 0; k < nf; k++)
            all[nall++] = f[k];
        free(f);
    }
    CHECKF(dev_ckpt_write_manifest(path("units"), 2, o.kind, 0, all, nall, &err) == 0, "%s", err.msg);
    /* the files a device running units 2-3 is given */
    CHECK(mkdir(path("given"), 0755) == 0);
    static const char *const names[] = {"manifest.json", "model.d1-u2.safetensors",
                                        "optim.d1-u2.safetensors", "model.d2-u3.safetensors",
                                        "optim.d2-u3.safetensors"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char from[96], to[96];
        snprintf(from, sizeof from, "units/%s", names[i]);
        snprintf(to, sizeof to, "given/%s", names[i]);
        CHECKF(link(path(from), path(to)) == 0, "%s", names[i]);
    }
    dev_train *dst = dev_train_create(&cfg, two, 2, B, T, 1, 3, &err);
    dev_stage *mine = dev_train_stage(dst, 1), *other = dev_train_stage(dst, 0);
    CHECKF(dev_ckpt_load_fetched(mine, o.kind, path("given"), &err) == 0, "%s", err.msg);
    CHECK(dev_ckpt_load(mine, o.kind, path("given"), &err) == -1 && strstr(err.msg, "lists it"));
    CHECK(dev_ckpt_load_fetched(other, o.kind, path("given"), &err) == -1 &&
          strstr(err.msg, "no part holds tensor"));
    /* units 2-3 equal the one-stage run's, tensors and moments */
    dev_stage *r0 = dev_train_stage(ref, 0);
    int nt, mt;
    const dev_tensor *t = dev_stage_tensors(r0, &nt), *u = dev_stage_tensors(mine, &mt);
    size_t np, mp;
    const float *pr = dev_stage_params(r0, &np), *mr = dev_stage_optim_state(r0, NULL);
    CHECK(dev_stage_pull(mine, &err) == 0);
    const float *pd = dev_stage_params(mine, &mp), *md = dev_stage_optim_state(mine, NULL);
    int same = 1, seen = 0;
    for (int k = 0; k < nt; k++)
        for (int j = 0; j < mt; j++)
            if (!strcmp(u[j].name, t[k].name)) {
                seen++;
                same &= kt_bitwise_equal(pd + u[j].offset, pr + t[k].offset, t[k].numel) &&
                        kt_bitwise_equal(md + u[j].offset, mr + t[k].offset, t[k].numel) &&
                        kt_bitwise_equal(md + mp + u[j].offset, mr + np + t[k].offset, t[k].numel);
            }
    CHECKF(same && seen > 0, "units 2-3 from their own files: %d tensors, equal %d", seen, same);
    dev_train_free(dst);
    dev_train_free(src);
    dev_train_free(ref);
}

static void test_config(void)
{
    dev_config c;
    sl_err err = {0};
    CHECK(dev_config_parse(&c, "{\"hidden_size\": 64, \"num_hidden_layers\": 2, "
                               "\"num_attention_heads\": 4, \"intermediate_size\": 128, "
                               "\"vocab_size\": 100, \"hidden_act\": \"gelu_new\"}", &err) == 0);
    CHECK(c.max_pos == 512 && c.type_vocab == 2 && c.gelu == 1 && c.ln_eps == 1e-12f &&
          c.hidden_dropout == 0.1f && c.attn_dropout == 0.1f);
    static const struct {
        const char *json, *want;
    } bad[] = {
        {"{\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 128, "
         "\"vocab_size\": 100}", "hidden_size: missing"},
        {"{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 5, "
         "\"intermediate_size\": 128, \"vocab_size\": 100}", "multiple of num_attention_heads"},
        {"{\"hidden_size\": \"64\", \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
         "\"intermediate_size\": 128, \"vocab_size\": 100}", "hidden_size: must be an integer"},
        {"{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
         "\"intermediate_size\": 128, \"vocab_size\": 100, \"hidden_act\": \"relu\"}",
         "hidden_act: 'relu' is not supported"},
        {"{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
         "\"intermediate_size\": 128, \"vocab_size\": 100, \"hidden_dropout_prob\": 1.5}",
         "hidden_dropout_prob: must be between"},
        {"{\"hidden_size\": 64, \"num_hidden_layers\": -1, \"num_attention_heads\": 4, "
         "\"intermediate_size\": 128, \"vocab_size\": 100}", "num_hidden_layers: must be between 1 and 256"},
        {"[1, 2]", "(top level): must be an object"},
        {"{\"hidden_size\": 64,", "config:1: column"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sl_err e = {0};
        CHECKF(dev_config_parse(&c, bad[i].json, &e) == -1 && strstr(e.msg, bad[i].want),
               "config %zu: '%s'", i, e.msg);
    }
}

/* A classifier's checkpoint: saved by a split (two parts), its config.json
 * as BertForSequenceClassification's (names, num_labels, problem_type) read
 * back; it loads into one stage bit for bit; dev_ckpt_task tells it from an
 * MLM one; --init from the MLM one starts the head afresh (its names
 * reported) and takes the rest; the MLM model's MLM head is refused by a
 * stage only when it would be read as one. */
static void test_classifier(void)
{
    static const char *const names[] = {"neg", "pos", "mixed"};
    dev_config cc = cfg;
    cc.task = DEV_TASK_CLASSIFY;
    cc.num_labels = 3;
    cc.cls_dropout = 0.1f;
    cc.label_names = names;
    sl_err err = {0};
    int two[] = {0, 2, 4};
    dev_train *tr = dev_train_create(&cc, two, 2, B, T, 2, 5, &err);
    CHECKF(tr != NULL, "%s", err.msg);
    if (!tr)
        return;
    dev_optim o;
    dev_optim_default(&o);
    dt_batch b;
    dt_make_batch(&b, B, T, cfg.vocab, 77);
    dt_classify(&b, 3, 78);
    dev_batch db = dt_view(&b);
    dev_step_info info;
    CHECKF(dev_train_step(tr, &db, &o, &info, &err) == 0, "%s", err.msg);
    dev_stage *st[2] = {dev_train_stage(tr, 0), dev_train_stage(tr, 1)};
    CHECKF(dev_ckpt_save(st, 2, o.kind, path("cls"), NULL, 0, &err) == 0, "%s", err.msg);
    dev_config back;
    char **got = NULL;
    int n = 0;
    CHECKF(dev_config_load(&back, path("cls/config.json"), &err) == 0 &&
               dev_config_load_names(path("cls/config.json"), &got, &n, &err) == 0,
           "%s", err.msg);
    CHECK(back.num_labels == 3 && back.problem_type == BAL_PROBLEM_SINGLE_LABEL &&
          back.cls_dropout == 0.1f && back.task == DEV_TASK_MLM && n == 3 &&
          !strcmp(got[2], "mixed"));
    dev_config_free_names(got, n);
    CHECK(dev_ckpt_task(path("cls"), &err) == DEV_TASK_CLASSIFY);
    int one[] = {0, 4};
    dev_train *t1 = dev_train_create(&cc, one, 1, B, T, 1, 9, &err);
    dev_stage *s1 = dev_train_stage(t1, 0);
    CHECKF(dev_ckpt_load(s1, o.kind, path("cls"), &err) == 0, "%s", err.msg);
    int nt;
    const dev_tensor *t = dev_stage_tensors(s1, &nt);
    for (int k = 0; k < nt; k++) {
        size_t numel = 0;
        float *x = dt_find(tr, t[k].name, 0, &numel);
        CHECKF(x && kt_bitwise_equal(x, dev_stage_params(s1, NULL) + t[k].offset, numel),
               "%s not loaded as saved", t[k].name);
    }
    /* from an MLM checkpoint: the head initialised, the rest loaded */
    dev_optim mo;
    dev_optim_default(&mo);
    mo.lr = 1e-3f;
    dev_train *m = trained(1, &mo);
    dev_stage *ms = dev_train_stage(m, 0);
    CHECKF(dev_ckpt_save(&ms, 1, mo.kind, path("mlm"), NULL, 0, &err) == 0, "%s", err.msg);
    CHECK(dev_ckpt_task(path("mlm"), &err) == DEV_TASK_MLM);
    char fresh[256];
    CHECKF(dev_ckpt_init_model(s1, path("mlm/model.safetensors"), fresh, sizeof fresh, &err) == 0,
           "%s", err.msg);
    CHECKF(!strcmp(fresh, "bert.pooler.dense.weight, bert.pooler.dense.bias, classifier.weight, "
                          "classifier.bias"), "fresh: %s", fresh);
    size_t numel = 0;
    float *we = dt_find(m, "bert.encoder.layer.1.output.dense.weight", 0, &numel);
    for (int k = 0; k < nt; k++)
        if (!strcmp(t[k].name, "bert.encoder.layer.1.output.dense.weight"))
            CHECK(we && kt_bitwise_equal(we, dev_stage_params(s1, NULL) + t[k].offset, numel));
    CHECK(dev_ckpt_check_model(&cc, path("mlm/model.safetensors"), &err) == 0);
    /* strict loading wants the head; an MLM stage refuses the classifier */
    sl_err e = {0};
    CHECK(dev_ckpt_load_model(s1, path("mlm/model.safetensors"), &e) == -1 &&
          strstr(e.msg, "missing tensor 'bert.pooler.dense.weight'"));
    dev_train *t2 = dev_train_create(&cc, one, 1, B, T, 1, 9, &err);
    CHECK(dev_ckpt_init_model(dev_train_stage(t2, 0), path("cls/model.safetensors"), fresh,
                              sizeof fresh, &err) == 0 && fresh[0] == 0);
    CHECK(dev_ckpt_load_model(ms, path("cls/model.safetensors"), &e) == -1 &&
          strstr(e.msg, "the file holds a classification head"));
    dt_free_batch(&b);
    dev_train_free(t2);
    dev_train_free(m);
    dev_train_free(t1);
    dev_train_free(tr);
}

static void write_st(const char *name, const char *hdr, const void *data, size_t n)
{
    uint64_t hl = strlen(hdr);
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)(hl >> (8 * i));
    FILE *f = fopen(path(name), "wb");
    CHECK(f && fwrite(len, 1, 8, f) == 8 && fwrite(hdr, 1, hl, f) == hl &&
          fwrite(data, 1, n, f) == n);
    if (f)
        fclose(f);
}

static void st_refused(const char *name, const char *want)
{
    sl_err err = {0};
    dev_st *st = dev_st_open(path(name), &err);
    CHECKF(st == NULL && strstr(err.msg, want), "%s: %s", name, st ? "opened" : err.msg);
    dev_st_close(st);
}

/* The tensors must tile the data; __metadata__ is a map of strings; a
 * checksum covers the raw bytes of any dtype. */
static void test_safetensors_layout(void)
{
    static const uint8_t data[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    write_st("gap.safetensors",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
             data, 12);
    st_refused("gap.safetensors", "4 bytes before tensor 'b' belong to no tensor");
    write_st("overlap.safetensors",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
             data, 12);
    st_refused("overlap.safetensors", "tensors 'a' and 'b' overlap");
    write_st("tail.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
             data, 8);
    st_refused("tail.safetensors", "4 bytes of trailing data");
    write_st("meta.safetensors",
             "{\"__metadata__\":[\"x\"],\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
             data, 4);
    st_refused("meta.safetensors", "__metadata__ must be an object of strings");
    /* "skyloom." metadata without checksums: ours, damaged */
    write_st("nosum.safetensors",
             "{\"__metadata__\":{\"skyloom.step\":\"3\"},"
             "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
             data, 4);
    sl_err err = {0};
    float x[8];
    dev_st *st = dev_st_open(path("nosum.safetensors"), &err);
    CHECK(st && dev_st_checked(st) &&
          dev_st_read_f32(st, dev_st_find(st, "a"), 0, 1, x, &err) == -1 &&
          strstr(err.msg, "has no checksum"));
    dev_st_close(st);
    /* an F16 tensor with its checksum: verified on its raw bytes */
    uint8_t h[16];
    char hex[33], hdr[256];
    crypto_generichash(h, 16, data, 8, NULL, 0);
    sodium_bin2hex(hex, sizeof hex, h, 16);
    snprintf(hdr, sizeof hdr,
             "{\"__metadata__\":{\"blake2b/h\":\"%s\"},"
             "\"h\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]}}",
             hex);
    write_st("f16.safetensors", hdr, data, 8);
    st = dev_st_open(path("f16.safetensors"), &err);
    CHECK(st && dev_st_read_f32(st, dev_st_find(st, "h"), 0, 4, x, &err) == 0);
    dev_st_close(st);
    uint8_t bad[8];
    memcpy(bad, data, 8);
    bad[5] ^= 1;
    write_st("f16bad.safetensors", hdr, bad, 8);
    st = dev_st_open(path("f16bad.safetensors"), &err);
    CHECK(st && dev_st_read_f32(st, dev_st_find(st, "h"), 0, 4, x, &err) == -1 &&
          strstr(err.msg, "checksum mismatch"));
    dev_st_close(st);
}

/* F16 and BF16 tensors (as torch users often save) are widened to F32. */
static void test_half_precision(void)
{
    const char *hdr = "{\"h\":{\"dtype\":\"F16\",\"shape\":[6],\"data_offsets\":[0,12]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[12,16]},"
                      "\"i\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[16,24]}}";
    uint16_t h[6] = {0x3C00, 0xC000, 0x3800, 0x0001, 0x7C00, 0x0000};
    uint16_t b[2] = {0x3F80, 0xC0A0};
    uint64_t n = strlen(hdr);
    FILE *f = fopen(path("half.safetensors"), "wb");
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)(n >> (8 * i));
    int64_t one = 1;
    CHECK(f && fwrite(len, 1, 8, f) == 8 && fwrite(hdr, 1, n, f) == n && fwrite(h, 2, 6, f) == 6 &&
          fwrite(b, 2, 2, f) == 2 && fwrite(&one, 8, 1, f) == 1);
    if (f)
        fclose(f);
    sl_err err = {0};
    dev_st *st = dev_st_open(path("half.safetensors"), &err);
    CHECKF(st != NULL, "%s", err.msg);
    if (!st)
        return;
    float x[6];
    CHECK(dev_st_read_f32(st, dev_st_find(st, "h"), 0, 6, x, &err) == 0);
    CHECK(x[0] == 1.0f && x[1] == -2.0f && x[2] == 0.5f && x[3] == 0x1p-24f && isinf(x[4]) &&
          x[5] == 0.0f);
    CHECK(dev_st_read_f32(st, dev_st_find(st, "b"), 0, 2, x, &err) == 0);
    CHECK(x[0] == 1.0f && x[1] == -5.0f);
    CHECK(dev_st_read_f32(st, dev_st_find(st, "i"), 0, 1, x, &err) == -1 && strstr(err.msg, "I64"));
    dev_st_close(st);
}

/* Under ASan, a failed huge allocation must return NULL like malloc does. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* A config too large for memory is an error, not an exit. */
static void test_too_big(void)
{
    dev_config c = cfg;
    c.hidden = 16384;
    c.heads = 16;
    c.vocab = 1 << 22;
    sl_err err = {0};
    int bounds[2] = {0, 4};
    dev_train *tr = dev_train_create(&c, bounds, 1, 2, 8, 1, 1, &err);
    CHECKF(tr == NULL && err.code == SL_ENOMEM && strstr(err.msg, "cannot allocate"), "'%s'",
           err.msg);
    printf("    %s\n", err.msg);
    dev_train_free(tr);
}

static void all(void)
{
    RUN(test_too_big);
    RUN(test_half_precision);
    RUN(test_safetensors_layout);
    RUN(test_config);
    RUN(test_round_trip_and_resume);
    RUN(test_damaged_model);
    RUN(test_damaged_checkpoint);
    RUN(test_any_cut);
    RUN(test_classifier);
    RUN(test_unit_parts);
}

int main(void)
{
    if (dt_in_tmpdir(g_dir, all))
        return 1;
    return sl_test_done();
}
