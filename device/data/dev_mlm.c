#include "dev_mlm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sl_mem.h"
#include "sl_rng.h"

/* Stream tag for masking ("MLM"), so masks never share numbers with dropout
 * or initialisation drawn under the same seed. */
#define MLM_STREAM 0x4d4c4d00ull

int dev_mlm_batch_alloc(dev_mlm_batch *b, int B, int T)
{
    memset(b, 0, sizeof *b);
    if (B <= 0 || T <= 0)
        return -1;
    size_t n = (size_t)B * (size_t)T;
    b->B = B;
    b->T = T;
    b->tokens = sl_xmalloc(n * sizeof(int32_t));
    b->labels = sl_xmalloc(n * sizeof(int32_t));
    b->valid = sl_xmalloc(n * sizeof(int32_t));
    b->segments = sl_xcalloc(n, sizeof(int32_t));
    return 0;
}

void dev_mlm_batch_free(dev_mlm_batch *b)
{
    free(b->tokens);
    free(b->labels);
    free(b->valid);
    free(b->segments);
    memset(b, 0, sizeof *b);
}

typedef struct cand {
    uint32_t key;
    int pos;
} cand;

static int cand_cmp(const void *x, const void *y)
{
    const cand *a = x, *b = y;
    if (a->key != b->key)
        return a->key < b->key ? -1 : 1;
    return a->pos - b->pos;
}

int dev_mlm_mask_seq(int32_t *tok, int32_t *labels, int len, int T, const dev_special *sp,
                     int vocab_size, float mask_prob, uint64_t seed, uint64_t epoch,
                     uint64_t seq_index)
{
    for (int t = 0; t < T; t++)
        labels[t] = DEV_MLM_IGNORE;
    uint64_t stream = sl_rng_stream(sl_rng_stream(MLM_STREAM, epoch), seq_index);
    cand c[4096];
    cand *cs = len <= 4096 ? c : sl_xmalloc((size_t)len * sizeof *cs);
    int n = 0;
    for (int t = 0; t < len; t++) {
        int32_t id = tok[t];
        if (id == sp->cls || id == sp->sep || id == sp->pad)
            continue;
        /* Word 4t: the choice key; 4t+1: mask/random/keep; 4t+2: random id. */
        cs[n].key = sl_rng_u32(seed, stream, 4 * (uint64_t)t);
        cs[n].pos = t;
        n++;
    }
    int k = 0;
    if (n > 0) {
        /* Round p to 6 digits first so 0.15f behaves as 0.15 (half to even, as Python's round). */
        double p = nearbyint((double)mask_prob * 1e6) / 1e6;
        k = (int)nearbyint(p * n);
        if (k < 1)
            k = 1;
        if (k > n)
            k = n;
        qsort(cs, (size_t)n, sizeof *cs, cand_cmp);
    }
    for (int i = 0; i < k; i++) {
        int t = cs[i].pos;
        labels[t] = tok[t];
        double u = sl_rng_u32(seed, stream, 4 * (uint64_t)t + 1) * (1.0 / 4294967296.0);
        if (u < 0.8)
            tok[t] = sp->mask;
        else if (u < 0.9)
            tok[t] = (int32_t)(((uint64_t)sl_rng_u32(seed, stream, 4 * (uint64_t)t + 2) *
                                (uint64_t)vocab_size) >> 32);
    }
    if (cs != c)
        free(cs);
    return k;
}

static int check_batch(const dev_shard *s, const dev_special *sp, int vocab_size,
                       float mask_prob, const dev_mlm_batch *out, sl_err *err)
{
    int T = dev_shard_seq_len(s);
    if (!out->tokens || out->B <= 0 || out->T != T)
        return sl_err_set(err, SL_EINVAL, "batch is (%d,%d), the shard's sequences are %d tokens",
                          out->B, out->T, T);
    if (!(mask_prob > 0.0f && mask_prob < 1.0f))
        return sl_err_set(err, SL_EINVAL, "mask probability %g: must be in (0, 1)",
                          (double)mask_prob);
    if (vocab_size < dev_shard_vocab_size(s))
        return sl_err_set(err, SL_EINVAL, "vocabulary size %d is smaller than the shard's %d",
                          vocab_size, dev_shard_vocab_size(s));
    if (sp->mask < 0 || sp->mask >= vocab_size || sp->pad < 0 || sp->cls < 0 || sp->sep < 0)
        return sl_err_set(err, SL_EINVAL, "special token ids missing or out of range");
    return 0;
}

/* Row b: shard sequence `idx`, masked with the key (seed, epoch, key). */
static void fill_row(const dev_shard *s, const dev_special *sp, int vocab_size, float mask_prob,
                     uint64_t seed, uint64_t epoch, uint64_t idx, uint64_t key,
                     dev_mlm_batch *out, int b)
{
    int T = out->T;
    int32_t *tok = out->tokens + (size_t)b * (size_t)T;
    int len = dev_shard_read(s, idx, tok);
    for (int t = 0; t < T; t++) {
        out->valid[(size_t)b * (size_t)T + (size_t)t] = t < len;
        out->segments[(size_t)b * (size_t)T + (size_t)t] = 0;
    }
    dev_mlm_mask_seq(tok, out->labels + (size_t)b * (size_t)T, len, T, sp, vocab_size, mask_prob,
                     seed, epoch, key);
}

int dev_mlm_make_batch(const dev_shard *s, const dev_special *sp, int vocab_size, float mask_prob,
                       uint64_t seed, uint64_t epoch, uint64_t first_seq, dev_mlm_batch *out,
                       sl_err *err)
{
    if (check_batch(s, sp, vocab_size, mask_prob, out, err))
        return -1;
    uint64_t N = dev_shard_count(s);
    for (int b = 0; b < out->B; b++) {
        uint64_t g = first_seq + (uint64_t)b;
        fill_row(s, sp, vocab_size, mask_prob, seed, epoch, g % N, g, out, b);
    }
    return 0;
}

int dev_mlm_make_rows(const dev_shard *s, const dev_special *sp, int vocab_size, float mask_prob,
                      uint64_t seed, const uint64_t *seq, const uint64_t *epoch,
                      dev_mlm_batch *out, sl_err *err)
{
    if (check_batch(s, sp, vocab_size, mask_prob, out, err))
        return -1;
    uint64_t N = dev_shard_count(s);
    for (int b = 0; b < out->B; b++)
        if (seq[b] >= N)
            return sl_err_set(err, SL_EINVAL, "sequence %llu is past the shard's %llu",
                              (unsigned long long)seq[b], (unsigned long long)N);
    for (int b = 0; b < out->B; b++)
        fill_row(s, sp, vocab_size, mask_prob, seed, epoch[b], seq[b], seq[b], out, b);
    return 0;
}
