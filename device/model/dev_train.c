/* dev_train.c - a chain of stage runners in this process (dev_train.h). With
 * several stages each runner has a thread of its own, started once and fed
 * one command per step; they meet only through the in-process port. */
#include "dev_train.h"

#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bal.h"
#include "sl_mem.h"

enum { CMD_GRADS = 1, CMD_STEP, CMD_EVAL, CMD_QUIT };

typedef struct worker {
    dev_train *tr;
    int i;
    pthread_t th;
    int rc;
    sl_err err;
    dev_step_info info;
    double loss_sum;
    int masked;
} worker;

struct dev_train {
    dev_config c;
    int n, B, T, micro, threads;
    uint64_t seed;
    dev_stage **st;
    dev_pipe **pipe;
    dev_port_hub *hub;
    worker *w;
    int started; /* worker threads running */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t gen; /* commands issued */
    int cmd, pending;
    const dev_batch *b;
    const dev_optim *o;
    uint64_t step;
};

static void run_cmd(dev_train *tr, worker *w, int cmd)
{
    dev_pipe *pp = tr->pipe[w->i];
    const dev_batch *b = w->i == 0 ? tr->b : NULL;
    sl_err_clear(&w->err);
    if (cmd == CMD_GRADS)
        w->rc = dev_pipe_grads(pp, b, tr->step, &w->info, &w->err);
    else if (cmd == CMD_STEP)
        w->rc = dev_pipe_step(pp, b, tr->o, &w->info, &w->err);
    else
        w->rc = dev_pipe_eval(pp, b, &w->loss_sum, &w->masked, &w->err);
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    dev_train *tr = w->tr;
    omp_set_num_threads(tr->threads);
    uint64_t seen = 0;
    pthread_mutex_lock(&tr->mu);
    for (;;) {
        while (tr->gen == seen)
            pthread_cond_wait(&tr->cv, &tr->mu);
        seen = tr->gen;
        int cmd = tr->cmd;
        pthread_mutex_unlock(&tr->mu);
        if (cmd == CMD_QUIT)
            return NULL;
        run_cmd(tr, w, cmd);
        pthread_mutex_lock(&tr->mu);
        if (--tr->pending == 0)
            pthread_cond_broadcast(&tr->cv);
    }
}

/* Runs cmd on every stage and waits for all; the error reported is the one
 * that stopped the pipeline, not the others' "stopped" that followed it. */
static int run_all(dev_train *tr, int cmd, sl_err *err)
{
    if (tr->n == 1) {
        run_cmd(tr, &tr->w[0], cmd);
    } else {
        pthread_mutex_lock(&tr->mu);
        tr->cmd = cmd;
        tr->pending = tr->n;
        tr->gen++;
        pthread_cond_broadcast(&tr->cv);
        while (tr->pending > 0)
            pthread_cond_wait(&tr->cv, &tr->mu);
        pthread_mutex_unlock(&tr->mu);
    }
    const worker *bad = NULL;
    for (int i = 0; i < tr->n; i++)
        if (tr->w[i].rc && (!bad || (bad->err.code == SL_ECANCELED &&
                                     tr->w[i].err.code != SL_ECANCELED)))
            bad = &tr->w[i];
    if (!bad)
        return 0;
    if (err)
        *err = bad->err;
    if (tr->hub)
        dev_port_hub_reset(tr->hub);
    return -1;
}

static void stop_workers(dev_train *tr)
{
    if (!tr->started)
        return;
    pthread_mutex_lock(&tr->mu);
    tr->cmd = CMD_QUIT;
    tr->gen++;
    pthread_cond_broadcast(&tr->cv);
    pthread_mutex_unlock(&tr->mu);
    for (int i = 0; i < tr->started; i++)
        pthread_join(tr->w[i].th, NULL);
    tr->started = 0;
}

static int default_threads(int n)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int k = cores > 0 ? (int)(cores / n) : 1;
    return k < 1 ? 1 : k;
}

static int check_bounds(const dev_config *c, const int *bounds, int n, int B, int micro,
                        sl_err *err)
{
    if (n < 1 || bounds[0] != 0 || bounds[n] != dev_unit_count(c))
        return sl_err_set(err, SL_EINVAL, "stages must cover units 0..%d",
                          dev_unit_count(c) - 1);
    for (int i = 0; i < n; i++)
        if (bounds[i + 1] <= bounds[i])
            return sl_err_set(err, SL_EINVAL, "stage %d owns no unit", i);
    if (B < 1 || micro < 1 || B % micro != 0)
        return sl_err_set(err, SL_EINVAL, "batch %d is not a multiple of the micro-batch count %d",
                          B, micro);
    return 0;
}

dev_train *dev_train_open(const dev_config *c, const int *bounds, int nstages, int B, int T,
                          int micro, uint64_t seed, const dev_train_opts *o, sl_err *err)
{
    dev_train_opts def = {.schedule = BAL_1F1B};
    if (!o)
        o = &def;
    if (check_bounds(c, bounds, nstages, B, micro, err))
        return NULL;
    if (o->schedule != BAL_1F1B && o->schedule != BAL_GPIPE) {
        sl_err_set(err, SL_EINVAL, "unknown schedule %d", o->schedule);
        return NULL;
    }
    dev_train *tr = sl_xcalloc(1, sizeof *tr);
    tr->c = *c;
    tr->n = nstages;
    tr->B = B;
    tr->T = T;
    tr->micro = micro;
    tr->seed = seed;
    tr->threads = o->stage_threads > 0 ? o->stage_threads : default_threads(nstages);
    pthread_mutex_init(&tr->mu, NULL);
    pthread_cond_init(&tr->cv, NULL);
    tr->st = sl_xcalloc((size_t)nstages, sizeof *tr->st);
    tr->pipe = sl_xcalloc((size_t)nstages, sizeof *tr->pipe);
    tr->w = sl_xcalloc((size_t)nstages, sizeof *tr->w);
    if (nstages > 1) {
        int nt = 16 * dev_unit_count(c) + 3;
        dev_port_hub_cfg hc = {
            .stages = nstages,
            .depth = micro,
            .act_floats = (size_t)(B / micro) * T * c->hidden,
            .valid_ints = (size_t)(B / micro) * T,
            .label_ints = (size_t)B * T,
            /* the MLM head's decoder is the word embeddings; a classifier shares nothing */
            .tied_floats = c->task == DEV_TASK_CLASSIFY ? 0 : (size_t)c->vocab * c->hidden,
            .gather_max = nt,
        };
        if (!(tr->hub = dev_port_hub_create(&hc, err)))
            goto fail;
    }
    for (int i = 0; i < nstages; i++) {
        dev_pipe_cfg pc = {.stages = nstages, .index = i, .schedule = o->schedule, .warmup = -1,
                           .B = B, .T = T, .micro = micro, .seed = seed};
        const kn_be *be = o->stage_be && o->stage_be[i] ? o->stage_be[i] : o->be;
        tr->st[i] = dev_stage_create(c, bounds[i], bounds[i + 1] - 1, B / micro, T,
                                     dev_pipe_slots(&pc), seed, be, o->flags, err);
        if (!tr->st[i])
            goto fail;
        tr->pipe[i] = dev_pipe_create(tr->st[i], &pc, tr->hub ? dev_port_hub_port(tr->hub, i) : NULL,
                                      err);
        if (!tr->pipe[i])
            goto fail;
        tr->w[i] = (worker){.tr = tr, .i = i};
    }
    for (int i = 0; nstages > 1 && i < nstages; i++) {
        if (pthread_create(&tr->w[i].th, NULL, worker_main, &tr->w[i])) {
            sl_err_set(err, SL_ENOMEM, "cannot start the thread of stage %d", i);
            goto fail;
        }
        tr->started = i + 1;
    }
    return tr;
fail:
    dev_train_free(tr);
    return NULL;
}

dev_train *dev_train_create(const dev_config *c, const int *bounds, int nstages, int B, int T,
                            int micro, uint64_t seed, sl_err *err)
{
    return dev_train_open(c, bounds, nstages, B, T, micro, seed, NULL, err);
}

dev_train *dev_train_create_on(const dev_config *c, const int *bounds, int nstages, int B, int T,
                               int micro, uint64_t seed, const kn_be *be, unsigned flags,
                               sl_err *err)
{
    dev_train_opts o = {.schedule = BAL_1F1B, .be = be, .flags = flags};
    return dev_train_open(c, bounds, nstages, B, T, micro, seed, &o, err);
}

void dev_train_free(dev_train *tr)
{
    if (!tr)
        return;
    stop_workers(tr);
    for (int i = 0; i < tr->n; i++) {
        dev_pipe_free(tr->pipe[i]);
        dev_stage_free(tr->st[i]);
    }
    dev_port_hub_free(tr->hub);
    free(tr->st);
    free(tr->pipe);
    free(tr->w);
    pthread_cond_destroy(&tr->cv);
    pthread_mutex_destroy(&tr->mu);
    free(tr);
}

int dev_train_nstages(const dev_train *tr) { return tr->n; }
dev_stage *dev_train_stage(dev_train *tr, int i) { return tr->st[i]; }
dev_pipe *dev_train_pipe(dev_train *tr, int i) { return tr->pipe[i]; }

int dev_train_grads(dev_train *tr, const dev_batch *b, uint64_t step, dev_step_info *info,
                    sl_err *err)
{
    tr->b = b;
    tr->step = step;
    if (run_all(tr, CMD_GRADS, err))
        return -1;
    *info = tr->w[tr->n - 1].info;
    return 0;
}

int dev_train_step(dev_train *tr, const dev_batch *b, const dev_optim *o, dev_step_info *info,
                   sl_err *err)
{
    tr->b = b;
    tr->o = o;
    if (run_all(tr, CMD_STEP, err))
        return -1;
    *info = tr->w[tr->n - 1].info;
    return 0;
}

int dev_train_eval(dev_train *tr, const dev_batch *b, double *loss_sum, int *masked, sl_err *err)
{
    tr->b = b;
    if (run_all(tr, CMD_EVAL, err))
        return -1;
    *loss_sum = tr->w[tr->n - 1].loss_sum;
    *masked = tr->w[tr->n - 1].masked;
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
    if (c->task == DEV_TASK_CLASSIFY) {
        const dev_labels *l = dev_shard_labels(s);
        if (!l)
            return sl_err_set(err, SL_EINVAL, "the shard has no labels, and a classification "
                              "needs them (skyloom data prepare --labels)");
        if (dev_labels_count(l) != c->num_labels)
            return sl_err_set(err, SL_EINVAL, "the shard has %d labels, the config's num_labels "
                              "is %d (set num_labels, or id2label, in config.json)",
                              dev_labels_count(l), c->num_labels);
    }
    return 0;
}
