/* MLM masking: BERT's statistics over >100k positions, labels only where
 * chosen, and a batch that does not depend on how it is cut into micro-batches. */
#include <string.h>

#include "data_gen.h"
#include "dev_mlm.h"
#include "dev_order.h"
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

/* dev_order: each epoch reads every sequence of the range exactly once, in
 * an order that changes with the epoch and the seed and is far from the
 * shard's; without shuffling it is the shard's order. */
static void test_order(void)
{
    static const uint64_t counts[] = {1, 2, 3, 5, 64, 65, 1000, 4097};
    sl_err err = {0};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        uint64_t n = counts[c], first = 7;
        dev_order o;
        CHECK(dev_order_init(&o, first + n + 3, first, n, 42, 1, &err) == 0);
        unsigned char *seen = calloc(n, 1);
        uint32_t *e0 = malloc(n * sizeof *e0);
        int bad = 0;
        uint64_t fixed = 0, differ = 0;
        for (uint64_t ep = 0; ep < 3; ep++) {
            memset(seen, 0, n);
            for (uint64_t i = 0; i < n; i++) {
                uint64_t e = 99, q = dev_order_seq(&o, ep * n + i, &e);
                if (e != ep || q < first || q >= first + n || seen[q - first]) {
                    bad++;
                    continue;
                }
                seen[q - first] = 1;
                if (ep == 0) {
                    e0[i] = (uint32_t)(q - first);
                    fixed += q - first == i;
                } else if (ep == 1) {
                    differ += e0[i] != q - first;
                }
            }
        }
        CHECKF(bad == 0, "count %llu: %d positions outside the range or repeated",
               (unsigned long long)n, bad);
        if (n >= 64) { /* a random permutation has ~1 fixed point; two epochs' orders differ */
            CHECKF(fixed < 8 && differ > n * 9 / 10, "count %llu: %llu fixed, %llu differ",
                   (unsigned long long)n, (unsigned long long)fixed, (unsigned long long)differ);
            dev_order o2 = o;
            o2.seed = 43;
            uint64_t d = 0;
            for (uint64_t i = 0; i < n; i++)
                d += dev_order_seq(&o2, i, NULL) != dev_order_seq(&o, i, NULL);
            CHECKF(d > n * 9 / 10, "another seed moved only %llu of %llu", (unsigned long long)d,
                   (unsigned long long)n);
        }
        o.shuffle = 0;
        uint64_t e;
        CHECK(dev_order_seq(&o, 2 * n + n / 2, &e) == first + n / 2 && e == 2);
        free(seen);
        free(e0);
    }
    /* a huge range: positions stay inside and distinct (no table behind it) */
    dev_order big;
    CHECK(dev_order_init(&big, (1ull << 40) + 5, 5, 0, 1, 1, &err) == 0 && big.count == 1ull << 40);
    uint64_t prev[64];
    int ok = 1;
    for (int i = 0; i < 64; i++) {
        prev[i] = dev_order_seq(&big, (uint64_t)i * 1000003u, NULL);
        ok &= prev[i] >= 5 && prev[i] < (1ull << 40) + 5;
        for (int j = 0; j < i; j++)
            ok &= prev[j] != prev[i];
    }
    CHECK(ok);
    /* ranges outside the shard are refused with the numbers */
    dev_order o;
    CHECK(dev_order_init(&o, 100, 100, 0, 1, 1, &err) == -1 && strstr(err.msg, "past the end of the shard") != NULL);
    CHECK(dev_order_init(&o, 100, 50, 51, 1, 1, &err) == -1 && strstr(err.msg, "50..100") != NULL);
    CHECK(dev_order_init(&o, 100, 50, 50, 1, 1, &err) == 0 && o.count == 50);
}

/* dev_mlm_make_rows reads the rows it is given, masked as make_batch masks
 * the same sequence in the same epoch; a row past the shard is an error. */
static void test_rows(void)
{
    dev_mlm_batch a, b;
    dev_mlm_batch_alloc(&a, 3, T);
    dev_mlm_batch_alloc(&b, 1, T);
    /* a long sequence, so that two maskings of it differ for certain */
    uint64_t L = 0;
    int32_t *tmp = malloc((size_t)T * sizeof *tmp);
    while (L + 1 < dev_shard_count(shard) && dev_shard_read(shard, L, tmp) < 30)
        L++;
    free(tmp);
    uint64_t seq[3] = {L, 3, L}, ep[3] = {0, 2, 1};
    sl_err err = {0};
    CHECK(dev_mlm_make_rows(shard, &sp, V, 0.15f, 5, seq, ep, &a, &err) == 0);
    for (int r = 0; r < 3; r++) {
        dev_mlm_make_batch(shard, &sp, V, 0.15f, 5, ep[r], seq[r], &b, NULL);
        CHECKF(same_batch(&a, r, &b), "row %d", r);
    }
    /* the same sequence in another epoch: the same text, masked otherwise */
    CHECK(memcmp(a.valid, a.valid + 2 * T, (size_t)T * sizeof(int32_t)) == 0);
    CHECK(memcmp(a.labels, a.labels + 2 * T, (size_t)T * sizeof(int32_t)) != 0);
    seq[1] = dev_shard_count(shard);
    CHECK(dev_mlm_make_rows(shard, &sp, V, 0.15f, 5, seq, ep, &a, &err) == -1);
    CHECK(strstr(err.msg, "past the shard") != NULL);
    dev_mlm_batch_free(&a);
    dev_mlm_batch_free(&b);
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
    RUN(test_order);
    RUN(test_rows);
    dev_shard_close(shard);
    tmp_cleanup();
    return sl_test_done();
}
