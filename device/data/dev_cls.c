/* dev_cls.c - classification batches (dev_cls.h). */
#include "dev_cls.h"

int dev_cls_make_rows(const dev_shard *s, const uint64_t *seq, dev_mlm_batch *out, sl_err *err)
{
    int T = dev_shard_seq_len(s);
    if (!out->tokens || out->B <= 0 || out->T != T)
        return sl_err_set(err, SL_EINVAL, "batch is (%d,%d), the shard's sequences are %d tokens",
                          out->B, out->T, T);
    if (!dev_shard_labels(s))
        return sl_err_set(err, SL_EINVAL, "the shard has no labels");
    uint64_t N = dev_shard_count(s);
    for (int b = 0; b < out->B; b++)
        if (seq[b] >= N)
            return sl_err_set(err, SL_EINVAL, "sequence %llu is past the shard's %llu",
                              (unsigned long long)seq[b], (unsigned long long)N);
    for (int b = 0; b < out->B; b++) {
        size_t row = (size_t)b * (size_t)T;
        int len = dev_shard_read(s, seq[b], out->tokens + row);
        for (int t = 0; t < T; t++) {
            out->valid[row + (size_t)t] = t < len;
            out->segments[row + (size_t)t] = 0;
            out->labels[row + (size_t)t] = DEV_MLM_IGNORE;
        }
        out->labels[row] = dev_shard_label(s, seq[b]);
    }
    return 0;
}
