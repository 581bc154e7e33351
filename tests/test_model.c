/* The whole model against PyTorch: loss and the gradient of every parameter
 * of a small BERT (odd shapes, padding, both GELU forms) with the same
 * weights, exchanged through safetensors, and the same masked batch, dropout
 * 0; with 1 and 4 micro-batches; the head's logits at the masked positions
 * (dev_stage_forward_logits). A model saved by torch loads here and gives
 * torch's loss. tests/ref/bert_ref.py is the reference (python3-torch). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dev_ckpt.h"
#include "dev_safetensors.h"
#include "dev_testutil.h"
#include "dev_train.h"
#include "kn_ops.h"
#include "kn_testutil.h"
#include "sl_config.h"

static char g_dir[] = "/tmp/skyloom-model-XXXXXX";

static void write_i32(const char *name, const int32_t *x, size_t n)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "wb");
    CHECK(f && fwrite(x, 4, n, f) == n);
    if (f)
        fclose(f);
}

static double read_double(const char *name)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "r");
    double v = NAN;
    CHECK(f && fscanf(f, "%lf", &v) == 1);
    if (f)
        fclose(f);
    return v;
}

static double max_abs(const float *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m > 1e-30 ? m : 1e-30;
}

/* Compares every gradient of the stage with torch's (HF names; qkv split). */
static void compare_grads(dev_stage *s, dev_st *ref, double tol)
{
    int nt;
    const dev_tensor *t = dev_stage_tensors(s, &nt);
    float *g = dev_stage_grads(s, NULL);
    double worst = 0;
    for (int k = 0; k < nt; k++) {
        int parts = (t[k].flags & DEV_T_QKV) ? 3 : 1;
        size_t per = t[k].numel / (size_t)parts;
        for (int i = 0; i < parts; i++) {
            char name[128];
            if (parts == 3) {
                const char *q = strstr(t[k].name, ".qkv.");
                static const char *const w[3] = {"query", "key", "value"};
                snprintf(name, sizeof name, "%.*s.%s.%s", (int)(q - t[k].name), t[k].name, w[i],
                         q + 5);
            } else {
                snprintf(name, sizeof name, "%s", t[k].name);
            }
            const dev_st_tensor *r = dev_st_find(ref, name);
            CHECKF(r != NULL, "torch has no gradient '%s'", name);
            if (!r)
                continue;
            float *want = kt_alloc(per);
            sl_err err = {0};
            CHECK(dev_st_read_f32(ref, r, 0, per, want, &err) == 0);
            /* The key bias has no effect on softmax: its true gradient is 0
             * and both sides hold rounding noise; measure it against the
             * scale of the query bias's gradient instead. */
            const float *ours = g + t[k].offset + i * per;
            double e = strstr(name, "self.key.bias")
                           ? max_abs(ours, per) / max_abs(g + t[k].offset, per)
                           : kt_rel(ours, want, per);
            CHECKF(e <= tol, "gradient of %s: rel error %.3g > %g", name, e, tol);
            if (e > worst)
                worst = e;
            free(want);
        }
    }
    printf("    %d tensors, worst gradient rel error %.3g\n", nt, worst);
}

/* dev_stage_forward_logits against torch's logits, and against its own loss:
 * at the masked positions (MLM, V classes), or of every sequence, labelled
 * at its position 0 (classification, V = K classes). */
static void compare_logits(dev_stage *s, const dt_batch *b, int V, int classify)
{
    char p[256];
    snprintf(p, sizeof p, "%s/logits.f64", g_dir);
    FILE *f = fopen(p, "rb");
    CHECK(f != NULL);
    if (!f)
        return;
    size_t cap = (size_t)b->B * b->T * V;
    double *want64 = calloc(cap, sizeof *want64);
    size_t got = fread(want64, sizeof *want64, cap, f);
    fclose(f);
    dev_micro mb = {.B = b->B, .T = b->T, .tokens = b->tok, .segments = b->seg, .valid = b->valid,
                    .labels = b->lab, .step = 1, .seed = 99, .loss_scale = 1, .train = 0};
    float *logits = kt_alloc(cap), *want = kt_alloc(cap);
    int M = 0;
    double loss_sum = 0;
    sl_err err = {0};
    CHECKF(dev_stage_forward_logits(s, 0, &mb, NULL, logits, cap, &M, &loss_sum, &err) == 0, "%s",
           err.msg);
    CHECKF(got == (size_t)M * V, "torch wrote %zu logits, we have %d x %d", got, M, V);
    CHECK(!classify || M == b->B);
    for (size_t i = 0; i < got; i++)
        want[i] = (float)want64[i];
    KT_CHECK_REL(classify ? "logits of the sequences" : "logits at masks", logits, want,
                 (size_t)M * V, 1e-4);
    /* the loss the same forward reports is the cross-entropy of these logits */
    double ce = 0;
    for (int j = 0, i = 0; i < b->B * b->T; i++) {
        if (classify && i % b->T == 0 && b->lab[i] == -100)
            j++; /* a sequence without a class has logits but no loss */
        if (b->lab[i] == -100)
            continue;
        const float *r = logits + (size_t)(classify ? i / b->T : j++) * V;
        double mx = r[0], se = 0;
        for (int v = 1; v < V; v++)
            mx = r[v] > mx ? r[v] : mx;
        for (int v = 0; v < V; v++)
            se += exp(r[v] - mx);
        ce += mx + log(se) - r[b->lab[i]];
    }
    CHECK_NEAR(loss_sum, ce, 1e-5 * ce);
    /* too little room is refused */
    CHECK(dev_stage_forward_logits(s, 0, &mb, NULL, logits, (size_t)M * V - 1, &M, &loss_sum,
                                   &err) == -1 &&
          strstr(err.msg, "need") != NULL);
    free(logits);
    free(want);
    free(want64);
}

/* K = 0: BertForMaskedLM; K > 0: BertForSequenceClassification, K classes. */
static void run_case(const char *label, int gelu, int L, int K)
{
    printf("  case %s\n", label);
    dev_config c = {.hidden = 96, .layers = L, .heads = 3, .intermediate = 160, .vocab = 211,
                    .max_pos = 40, .type_vocab = 2, .ln_eps = 1e-12f, .gelu = gelu,
                    .hidden_dropout = 0, .attn_dropout = 0, .init_range = 0.05f,
                    .task = K ? DEV_TASK_CLASSIFY : DEV_TASK_MLM, .num_labels = K};
    int B = K ? 8 : 4, T = 37;
    sl_err err = {0};
    int bounds[2] = {0, L + 2};
    dev_train *tr = dev_train_create(&c, bounds, 1, B, T, 1, 99, &err);
    CHECKF(tr != NULL, "%s", err.msg);
    if (!tr)
        return;
    dev_stage *s = dev_train_stage(tr, 0);
    /* Non-trivial LayerNorm and bias values, so their gradients are exercised. */
    int nt;
    const dev_tensor *t = dev_stage_tensors(s, &nt);
    float *p = dev_stage_params(s, NULL);
    for (int k = 0; k < nt; k++)
        if (t[k].cols == 0)
            for (size_t j = 0; j < t[k].numel; j++)
                p[t[k].offset + j] += 0.1f * sl_rng_normal(7, (uint64_t)k, j);

    dt_batch b;
    dt_make_batch(&b, B, T, c.vocab, 40);
    if (K)
        dt_classify(&b, K, 41);
    size_t n = (size_t)B * T;
    write_i32("tokens", b.tok, n);
    write_i32("segments", b.seg, n);
    write_i32("valid", b.valid, n);
    write_i32("labels", b.lab, n);
    char path[256], cmd[1024];
    snprintf(path, sizeof path, "%s/dims.txt", g_dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "C %d\nL %d\nNH %d\nF %d\nV %d\nP %d\nTV %d\nB %d\nT %d\neps 1e-12\ngelu %d\n"
               "task %d\nK %d\n",
            c.hidden, c.layers, c.heads, c.intermediate, c.vocab, c.max_pos, c.type_vocab, B, T,
            gelu, K ? 1 : 0, K);
    fclose(f);
    snprintf(path, sizeof path, "%s/model.safetensors", g_dir);
    CHECKF(dev_ckpt_save_model(s, path, &err) == 0, "%s", err.msg);
    const char *py = getenv("SKYLOOM_PYTHON");
    snprintf(cmd, sizeof cmd, "%s %s/tests/ref/bert_ref.py %s", py ? py : "/usr/bin/python3",
             SKYLOOM_SOURCE_ROOT, g_dir);
    int rc = system(cmd);
    CHECKF(rc == 0, "reference script failed (%d): is python3-torch installed? (make deps)", rc);
    if (rc != 0)
        goto out;

    dev_batch db = dt_view(&b);
    dev_step_info info;
    CHECKF(dev_train_grads(tr, &db, 1, &info, &err) == 0, "%s", err.msg);
    double want = read_double("loss.txt");
    printf("    loss %.9f, torch %.9f\n", info.loss, want);
    CHECK_NEAR(info.loss, want, 1e-5 * want);

    snprintf(path, sizeof path, "%s/grads.safetensors", g_dir);
    dev_st *ref = dev_st_open(path, &err);
    CHECKF(ref != NULL, "%s", err.msg);
    if (ref)
        compare_grads(s, ref, 1e-4);
    compare_logits(s, &b, K ? K : c.vocab, K > 0);

    /* The same batch in 4 micro-batches: the same gradient. */
    dev_train *tr4 = dev_train_create(&c, bounds, 1, B, T, 4, 99, &err);
    size_t np;
    float *p4 = dev_stage_params(dev_train_stage(tr4, 0), &np);
    memcpy(p4, p, np * sizeof(float));
    CHECKF(dev_train_grads(tr4, &db, 1, &info, &err) == 0, "%s", err.msg);
    CHECK_NEAR(info.loss, want, 1e-5 * want);
    if (ref)
        compare_grads(dev_train_stage(tr4, 0), ref, 1e-4);
    dev_st_close(ref);

    /* A model saved by torch loads here and gives torch's loss. */
    snprintf(path, sizeof path, "%s/torch_model.safetensors", g_dir);
    CHECKF(dev_ckpt_load_model(s, path, &err) == 0, "%s", err.msg);
    double sum;
    int masked;
    CHECK(dev_train_eval(tr, &db, &sum, &masked, &err) == 0);
    double tl = read_double("torch_loss.txt");
    printf("    torch-saved model: loss %.9f, torch %.9f\n", sum / masked, tl);
    CHECK_NEAR(sum / masked, tl, 1e-5 * tl);
    dev_train_free(tr4);
out:
    dt_free_batch(&b);
    dev_train_free(tr);
}

static void test_vs_torch_erf(void) { run_case("L=2 H=96 A=3 F=160 V=211 T=37, gelu erf", KN_GELU_ERF, 2, 0); }
static void test_vs_torch_tanh(void) { run_case("L=1, gelu tanh", KN_GELU_TANH, 1, 0); }
/* BertForSequenceClassification: pooler, classifier, 5 classes, one of the
 * eight sequences without a class */
static void test_classify_vs_torch(void)
{
    run_case("classification, L=2, K=5, gelu erf", KN_GELU_ERF, 2, 5);
}

static void all(void)
{
    RUN(test_vs_torch_erf);
    RUN(test_vs_torch_tanh);
    RUN(test_classify_vs_torch);
}

int main(void)
{
    if (dt_in_tmpdir(g_dir, all))
        return 1;
    return sl_test_done();
}
