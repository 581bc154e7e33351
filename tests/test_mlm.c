/* MLM masking: BERT's statistics over >100k positions, labels only where
 * chosen, and a batch that does not depend on how it is cut into micro-batches. */
#include <string.h>

#include "data_gen.h"
#include "dev_mlm.h"
#include "dev_shard.h"
#include "dev_tok.h"
#include "dev_vocab.h"
#include "dev_vocab_build.h"
#include "sl_test.h"

static dev_shard *shard;
static dev_special sp;
static int V, T;

static int make_shard(void)
{
    size_t len;
    char *text = gen_corpus(5, 1500, &len);
    dev_vocab *v = gen_vocab(text, len, false, 2000);
    int docs = v ? gen_shard(v, text, len, 48, tmp_path("m.shard"), NULL) : -1;
    dev_vocab_free(v);
    free(text);
    if (docs <= 0)
        return -1;
    sl_err err = {0};
    shard = dev_shard_open(tmp_path("m.shard"), &err);
    if (!shard)
        return -1;
    sp = dev_shard_special(shard);
    V = dev_shard_vocab_size(shard);
    T = dev_shard_seq_len(shard);
    return 0;
}

static void test_statistics(void)
{
    const int B = 16;
    dev_mlm_batch b;
    CHECK(dev_mlm_batch_alloc(&b, B, T) == 0);
    int32_t *orig = malloc((size_t)T * sizeof *orig);
    uint64_t cand = 0, chosen = 0, masked = 0, random = 0, kept = 0, first_half = 0;
    uint64_t seqs_without = 0, nseq = 0;
    int bad_label = 0, bad_special = 0, bad_valid = 0;
    sl_err err = {0};
    for (uint64_t first = 0; cand < 100000; first += (uint64_t)B) {
        if (dev_mlm_make_batch(shard, &sp, V, 0.15f, 1234, 0, first, &b, &err)) {
            CHECKF(0, "%s", err.msg);
            break;
        }
        for (int r = 0; r < B; r++) {
            int len = dev_shard_read(shard, (first + (uint64_t)r) % dev_shard_count(shard), orig);
            const int32_t *tk = b.tokens + r * T, *lb = b.labels + r * T, *va = b.valid + r * T;
            int n = 0, k = 0;
            for (int t = 0; t < T; t++) {
                bad_valid += va[t] != (t < len) || b.segments[r * T + t] != 0;
                int special = orig[t] == sp.cls || orig[t] == sp.sep || orig[t] == sp.pad;
                if (special) {
                    bad_special += lb[t] != DEV_MLM_IGNORE || tk[t] != orig[t];
                    continue;
                }
                n++;
                if (lb[t] == DEV_MLM_IGNORE) {
                    bad_label += tk[t] != orig[t];
                    continue;
                }
                bad_label += lb[t] != orig[t];
                k++;
                first_half += t < len / 2;
                if (tk[t] == sp.mask)
                    masked++;
                else if (tk[t] == orig[t])
                    kept++;
                else
                    random++;
                bad_label += tk[t] < 0 || tk[t] >= V;
            }
            cand += (uint64_t)n;
            chosen += (uint64_t)k;
            seqs_without += k == 0;
            nseq++;
        }
    }
    double fc = (double)chosen / (double)cand;
    double fm = (double)masked / (double)chosen, fr = (double)random / (double)chosen,
           fk = (double)kept / (double)chosen;
    printf("  %llu positions, %.4f chosen; of those %.4f [MASK], %.4f random, %.4f kept\n",
           (unsigned long long)cand, fc, fm, fr, fk);
    CHECK(cand >= 100000);
    CHECK_NEAR(fc, 0.15, 0.01);
    CHECK_NEAR(fm, 0.80, 0.015);
    CHECK_NEAR(fr, 0.10, 0.012);
    CHECK_NEAR(fk, 0.10, 0.012);
    CHECK_NEAR((double)first_half / (double)chosen, 0.5, 0.03); /* positions spread evenly */
    CHECK(seqs_without == 0); /* at least one prediction per sequence */
    CHECK(bad_label == 0);
    CHECK(bad_special == 0);
    CHECK(bad_valid == 0);
    free(orig);
    dev_mlm_batch_free(&b);
}

static int same_batch(const dev_mlm_batch *a, int row, const dev_mlm_batch *b)
{
    size_t off = (size_t)row * (size_t)T, n = (size_t)b->B * (size_t)T * sizeof(int32_t);
    return !memcmp(a->tokens + off, b->tokens, n) && !memcmp(a->labels + off, b->labels, n) &&
           !memcmp(a->valid + off, b->valid, n) && !memcmp(a->segments + off, b->segments, n);
}

static void test_microbatch_independence(void)
{
    dev_mlm_batch full, one, four;
    dev_mlm_batch_alloc(&full, 8, T);
    dev_mlm_batch_alloc(&one, 1, T);
    dev_mlm_batch_alloc(&four, 4, T);
    const uint64_t first = 37, seed = 99, epoch = 3;
    CHECK(dev_mlm_make_batch(shard, &sp, V, 0.15f, seed, epoch, first, &full, NULL) == 0);
    int ok1 = 1, ok4 = 1;
    for (int m = 0; m < 8; m++) {
        dev_mlm_make_batch(shard, &sp, V, 0.15f, seed, epoch, first + (uint64_t)m, &one, NULL);
        ok1 &= same_batch(&full, m, &one);
    }
    for (int m = 0; m < 2; m++) {
        dev_mlm_make_batch(shard, &sp, V, 0.15f, seed, epoch, first + 4 * (uint64_t)m, &four, NULL);
        ok4 &= same_batch(&full, 4 * m, &four);
    }
    CHECK(ok1);
    CHECK(ok4);
    /* the same call again gives the same batch; another epoch or seed does not */
    dev_mlm_batch again;
    dev_mlm_batch_alloc(&again, 8, T);
    dev_mlm_make_batch(shard, &sp, V, 0.15f, seed, epoch, first, &again, NULL);
    CHECK(same_batch(&full, 0, &again));
    dev_mlm_make_batch(shard, &sp, V, 0.15f, seed, epoch + 1, first, &again, NULL);
    CHECK(memcmp(full.labels, again.labels, 8 * (size_t)T * sizeof(int32_t)) != 0);
    dev_mlm_make_batch(shard, &sp, V, 0.15f, seed + 1, epoch, first, &again, NULL);
    CHECK(memcmp(full.labels, again.labels, 8 * (size_t)T * sizeof(int32_t)) != 0);
    /* wrapping past the end of the shard reads from the start again */
    uint64_t N = dev_shard_count(shard);
    dev_mlm_make_batch(shard, &sp, V, 0.15f, seed, epoch, N - 2, &again, NULL);
    int32_t *orig = malloc((size_t)T * sizeof *orig);
    int len = dev_shard_read(shard, 1, orig);
    int ok = 1;
    for (int t = 0; t < len; t++)
        ok &= again.labels[3 * T + t] == DEV_MLM_IGNORE ? again.tokens[3 * T + t] == orig[t]
                                                        : again.labels[3 * T + t] == orig[t];
    CHECK(ok);
    free(orig);
    dev_mlm_batch_free(&again);
    dev_mlm_batch_free(&full);
    dev_mlm_batch_free(&one);
    dev_mlm_batch_free(&four);
}

static void test_errors(void)
{
    dev_mlm_batch b;
    sl_err err = {0};
    dev_mlm_batch_alloc(&b, 2, T + 1);
    CHECK(dev_mlm_make_batch(shard, &sp, V, 0.15f, 1, 0, 0, &b, &err) == -1);
    CHECK(strstr(err.msg, "tokens") != NULL);
    dev_mlm_batch_free(&b);
    dev_mlm_batch_alloc(&b, 2, T);
    CHECK(dev_mlm_make_batch(shard, &sp, V, 0.0f, 1, 0, 0, &b, &err) == -1);
    CHECK(dev_mlm_make_batch(shard, &sp, V, 1.0f, 1, 0, 0, &b, &err) == -1);
    CHECK(dev_mlm_make_batch(shard, &sp, V - 1, 0.15f, 1, 0, 0, &b, &err) == -1);
    CHECK(strstr(err.msg, "smaller than the shard") != NULL);
    dev_special nomask = sp;
    nomask.mask = -1;
    CHECK(dev_mlm_make_batch(shard, &nomask, V, 0.15f, 1, 0, 0, &b, &err) == -1);
    /* a larger model vocabulary is fine (random ids may use it) */
    CHECK(dev_mlm_make_batch(shard, &sp, V + 100, 0.15f, 1, 0, 0, &b, &err) == 0);
    dev_mlm_batch_free(&b);
    CHECK(dev_mlm_batch_alloc(&b, 0, T) == -1);
}

static void test_short_sequences(void)
{
    /* k = max(1, round(0.15 n)): n=1..3 -> 1, n=10 -> 2 (1.5 rounds to even), n=20 -> 3 */
    static const int n_k[][2] = {{1, 1}, {2, 1}, {3, 1}, {10, 2}, {20, 3}, {30, 4}, {46, 7}};
    int32_t tok[48], lab[48];
    for (size_t i = 0; i < sizeof n_k / sizeof n_k[0]; i++) {
        int n = n_k[i][0];
        tok[0] = sp.cls;
        for (int t = 1; t <= n; t++)
            tok[t] = 200 + t;
        tok[n + 1] = sp.sep;
        for (int t = n + 2; t < 48; t++)
            tok[t] = sp.pad;
        int k = dev_mlm_mask_seq(tok, lab, n + 2, 48, &sp, V, 0.15f, 5, 0, i);
        int labelled = 0;
        for (int t = 0; t < 48; t++)
            labelled += lab[t] != DEV_MLM_IGNORE;
        CHECKF(k == n_k[i][1] && labelled == k, "n=%d k=%d labelled=%d", n, k, labelled);
    }
}

int main(void)
{
    if (make_shard()) {
        CHECK(0);
        return sl_test_done();
    }
    RUN(test_statistics);
    RUN(test_microbatch_independence);
    RUN(test_errors);
    RUN(test_short_sequences);
    dev_shard_close(shard);
    tmp_cleanup();
    return sl_test_done();
}
