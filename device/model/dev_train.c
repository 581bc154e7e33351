#include "dev_train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sl_mem.h"

struct dev_train {
    dev_config c;
    int n, B, T, micro;
    uint64_t seed;
    dev_stage **st;
    float **act, **grad; /* boundary buffers between stage i and i+1 */
};

dev_train *dev_train_create(const dev_config *c, const int *bounds, int nstages, int B, int T,
                            int micro, uint64_t seed, sl_err *err)
{
    return dev_train_create_on(c, bounds, nstages, B, T, micro, seed, NULL, 0, err);
}

dev_train *dev_train_create_on(const dev_config *c, const int *bounds, int nstages, int B, int T,
                               int micro, uint64_t seed, const kn_be *be, unsigned flags,
                               sl_err *err)
{
    if (nstages < 1 || bounds[0] != 0 || bounds[nstages] != dev_unit_count(c)) {
        sl_err_set(err, SL_EINVAL, "stages must cover units 0..%d", dev_unit_count(c) - 1);
        return NULL;
    }
    for (int i = 0; i < nstages; i++)
        if (bounds[i + 1] <= bounds[i]) {
            sl_err_set(err, SL_EINVAL, "stage %d owns no unit", i);
            return NULL;
        }
    if (B < 1 || micro < 1 || B % micro != 0) {
        sl_err_set(err, SL_EINVAL, "batch %d is not a multiple of the micro-batch count %d", B,
                   micro);
        return NULL;
    }
    dev_train *tr = sl_xcalloc(1, sizeof *tr);
    tr->c = *c;
    tr->n = nstages;
    tr->B = B;
    tr->T = T;
    tr->micro = micro;
    tr->seed = seed;
    tr->st = sl_xcalloc((size_t)nstages, sizeof *tr->st);
    tr->act = sl_xcalloc((size_t)nstages, sizeof *tr->act);
    tr->grad = sl_xcalloc((size_t)nstages, sizeof *tr->grad);
    size_t nc = (size_t)(B / micro) * T * c->hidden;
    for (int i = 0; i < nstages; i++) {
        tr->st[i] = dev_stage_create(c, bounds[i], bounds[i + 1] - 1, B / micro, T, 1, seed, be,
                                     flags, err);
        if (!tr->st[i]) {
            dev_train_free(tr);
            return NULL;
        }
        if (i + 1 < nstages) {
            tr->act[i] = sl_xaligned_alloc(nc * sizeof(float));
            tr->grad[i] = sl_xaligned_alloc(nc * sizeof(float));
        }
    }
    return tr;
}

void dev_train_free(dev_train *tr)
{
    if (!tr)
        return;
    for (int i = 0; i < tr->n; i++) {
        dev_stage_free(tr->st[i]);
        sl_aligned_free(tr->act[i]);
        sl_aligned_free(tr->grad[i]);
    }
    free(tr->st);
    free(tr->act);
    free(tr->grad);
    free(tr);
}

int dev_train_nstages(const dev_train *tr) { return tr->n; }
dev_stage *dev_train_stage(dev_train *tr, int i) { return tr->st[i]; }

static int check_batch(const dev_train *tr, const dev_batch *b, sl_err *err)
{
    if (b->B != tr->B || b->T != tr->T)
        return sl_err_set(err, SL_EINVAL, "batch %dx%d, the trainer was built for %dx%d", b->B,
                          b->T, tr->B, tr->T);
    return 0;
}

static dev_micro micro_of(const dev_train *tr, const dev_batch *b, int m, uint64_t step,
                          float scale, int train)
{
    int Bm = tr->B / tr->micro;
    size_t off = (size_t)m * Bm * tr->T;
    dev_micro mb = {
        .B = Bm,
        .T = tr->T,
        .tokens = b->tokens + off,
        .segments = b->segments ? b->segments + off : NULL,
        .valid = b->valid + off,
        .labels = b->labels + off,
        .seq0 = b->seq0 + (uint64_t)m * Bm,
        .step = step,
        .seed = tr->seed,
        .loss_scale = scale,
        .train = train,
    };
    return mb;
}

static int forward_all(dev_train *tr, const dev_micro *mb, double *loss, int *masked, sl_err *err)
{
    for (int i = 0; i < tr->n; i++)
        if (dev_stage_forward(tr->st[i], 0, mb, i ? tr->act[i - 1] : NULL,
                              i + 1 < tr->n ? tr->act[i] : NULL, loss, masked, err))
            return sl_err_wrap(err, "stage %d forward", i);
    return 0;
}

int dev_train_grads(dev_train *tr, const dev_batch *b, uint64_t step, dev_step_info *info,
                    sl_err *err)
{
    if (check_batch(tr, b, err))
        return -1;
    size_t N = (size_t)b->B * b->T;
    int total = 0;
    for (size_t i = 0; i < N; i++)
        total += b->labels[i] != -100;
    float scale = total ? 1.0f / (float)total : 0.0f;
    for (int i = 0; i < tr->n; i++)
        if (dev_stage_zero_grad(tr->st[i], err))
            return sl_err_wrap(err, "stage %d", i);
    double loss = 0;
    for (int m = 0; m < tr->micro; m++) {
        dev_micro mb = micro_of(tr, b, m, step, scale, 1);
        double l = 0;
        int k = 0;
        if (forward_all(tr, &mb, &l, &k, err))
            return -1;
        loss += l;
        for (int i = tr->n - 1; i >= 0; i--)
            if (dev_stage_backward(tr->st[i], 0, &mb, i + 1 < tr->n ? tr->grad[i] : NULL,
                                   i ? tr->grad[i - 1] : NULL, err))
                return sl_err_wrap(err, "stage %d backward", i);
    }
    for (int i = 0; i < tr->n; i++)
        if (dev_stage_grad_finish(tr->st[i], err))
            return sl_err_wrap(err, "stage %d", i);
    if (tr->n > 1 && dev_stage_tied_exchange(tr->st[0], tr->st[tr->n - 1], err))
        return sl_err_wrap(err, "tied embeddings");
    double sumsq = 0;
    for (int i = 0; i < tr->n; i++) {
        double part;
        if (dev_stage_grad_sumsq(tr->st[i], &part, err))
            return sl_err_wrap(err, "stage %d", i);
        sumsq += part;
    }
    info->loss = total ? loss / total : 0.0;
    info->masked = total;
    info->grad_norm = sqrt(sumsq);
    info->lr = 0;
    return 0;
}

int dev_train_step(dev_train *tr, const dev_batch *b, const dev_optim *o, dev_step_info *info,
                   sl_err *err)
{
    uint64_t step = (uint64_t)dev_stage_get_step(tr->st[0]) + 1;
    if (dev_train_grads(tr, b, step, info, err))
        return -1;
    float clip = dev_clip_scale(info->grad_norm, o->clip);
    info->lr = dev_optim_lr(o, (int)step);
    for (int i = 0; i < tr->n; i++)
        if (dev_stage_step(tr->st[i], o, clip, err))
            return sl_err_wrap(err, "stage %d", i);
    return 0;
}

int dev_train_eval(dev_train *tr, const dev_batch *b, double *loss_sum, int *masked, sl_err *err)
{
    if (check_batch(tr, b, err))
        return -1;
    *loss_sum = 0;
    *masked = 0;
    for (int m = 0; m < tr->micro; m++) {
        dev_micro mb = micro_of(tr, b, m, 0, 0.0f, 0);
        double l = 0;
        int k = 0;
        if (forward_all(tr, &mb, &l, &k, err))
            return -1;
        *loss_sum += l;
        *masked += k;
    }
    return 0;
}

int dev_train_check_shard(const dev_config *c, const dev_shard *s, sl_err *err)
{
    if (dev_shard_vocab_size(s) > c->vocab)
        return sl_err_set(err, SL_EINVAL,
                          "the shard's vocabulary has %d tokens, the model's vocab_size is %d",
                          dev_shard_vocab_size(s), c->vocab);
    if (dev_shard_seq_len(s) > c->max_pos)
        return sl_err_set(err, SL_EINVAL,
                          "the shard's sequences are %d tokens, max_position_embeddings is %d",
                          dev_shard_seq_len(s), c->max_pos);
    if (dev_shard_count(s) == 0)
        return sl_err_set(err, SL_EINVAL, "the shard holds no sequences");
    return 0;
}
