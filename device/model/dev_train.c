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

#define WORD_EMBEDDINGS "bert.embeddings.word_embeddings.weight"

enum { CMD_GRADS = 1, CMD_STEP, CMD_EVAL, CMD_QUIT };

typedef struct worker {
    dev_train *tr;
    int r, i; /* replica, stage */
    pthread_t th;
    int rc;
    sl_err err;
    dev_step_info info;
    double loss_sum;
    int masked;
} worker;

/* One replica: a chain of stages and their port. */
typedef struct replica {
    int n, B;
    dev_stage **st;
    dev_pipe **pipe;
    dev_port_hub *hub;
} replica;

struct dev_train {
    dev_config c;
    int R, T, micro, threads;
    uint64_t seed;
    replica *rep;
    dev_sync_hub *sync;
    dev_fed_cfg fed;
    int has_fed;
    worker *w;
    int nw;
    int started; /* worker threads running */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t gen; /* commands issued */
    int cmd, pending;
    const dev_batch *b; /* [R] */
    const dev_optim *o;
    uint64_t step;
};

static void run_cmd(dev_train *tr, worker *w, int cmd)
{
    dev_pipe *pp = tr->rep[w->r].pipe[w->i];
    sl_err_clear(&w->err);
    w->rc = 0;
    if (cmd == CMD_EVAL && w->r != 0)
        return;
    const dev_batch *b = w->i == 0 ? &tr->b[w->r] : NULL;
    if (cmd == CMD_GRADS)
        w->rc = dev_pipe_grads(pp, b, tr->step, &w->info, &w->err);
    else if (cmd == CMD_STEP)
        w->rc = dev_pipe_step(pp, b, tr->o, &w->info, &w->err);
    else /* evaluation: replica 0 */
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
    if (tr->nw == 1) {
        run_cmd(tr, &tr->w[0], cmd);
    } else {
        pthread_mutex_lock(&tr->mu);
        tr->cmd = cmd;
        tr->pending = tr->nw;
        tr->gen++;
        pthread_cond_broadcast(&tr->cv);
        while (tr->pending > 0)
            pthread_cond_wait(&tr->cv, &tr->mu);
        pthread_mutex_unlock(&tr->mu);
    }
    const worker *bad = NULL;
    for (int i = 0; i < tr->nw; i++)
        if (tr->w[i].rc && (!bad || (bad->err.code == SL_ECANCELED &&
                                     tr->w[i].err.code != SL_ECANCELED)))
            bad = &tr->w[i];
    if (!bad)
        return 0;
    if (err) {
        *err = bad->err;
        if (tr->R > 1)
            sl_err_wrap(err, "replica %d", bad->r);
    }
    for (int r = 0; r < tr->R; r++)
        if (tr->rep[r].hub)
            dev_port_hub_reset(tr->rep[r].hub);
    if (tr->sync)
        dev_sync_hub_reset(tr->sync);
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

/* Replica r's stages, runners and port. */
static int open_replica(dev_train *tr, int r, const dev_replica_cfg *rc, const dev_train_opts *o,
                        sl_err *err)
{
    const dev_config *c = &tr->c;
    replica *rp = &tr->rep[r];
    int n = rc->nstages, B = rc->B, micro = tr->micro, T = tr->T;
    rp->n = n;
    rp->B = B;
    rp->st = sl_xcalloc((size_t)n, sizeof *rp->st);
    rp->pipe = sl_xcalloc((size_t)n, sizeof *rp->pipe);
    if (n > 1) {
        int nt = 16 * dev_unit_count(c) + 3;
        dev_port_hub_cfg hc = {
            .stages = n,
            .depth = micro,
            .act_floats = (size_t)(B / micro) * T * c->hidden,
            .valid_ints = (size_t)(B / micro) * T,
            .label_ints = (size_t)B * T,
            /* the MLM head's decoder is the word embeddings; a classifier shares nothing */
            .tied_floats = c->task == DEV_TASK_CLASSIFY ? 0 : (size_t)c->vocab * c->hidden,
            .gather_max = nt,
        };
        if (!(rp->hub = dev_port_hub_create(&hc, err)))
            return -1;
    }
    for (int i = 0; i < n; i++) {
        dev_pipe_cfg pc = {.stages = n, .index = i, .schedule = o->schedule, .warmup = -1,
                           .B = B, .T = T, .micro = micro, .seed = tr->seed, .replica = r};
        const kn_be *const *sbe = rc->stage_be ? rc->stage_be : o->stage_be;
        const kn_be *be = sbe && sbe[i] ? sbe[i] : o->be;
        rp->st[i] = dev_stage_create(c, rc->bounds[i], rc->bounds[i + 1] - 1, B / micro, T,
                                     dev_pipe_slots(&pc), tr->seed, be, o->flags, err);
        if (!rp->st[i])
            return -1;
        rp->pipe[i] = dev_pipe_create(rp->st[i], &pc, rp->hub ? dev_port_hub_port(rp->hub, i) : NULL,
                                      err);
        if (!rp->pipe[i])
            return -1;
        if (tr->has_fed &&
            dev_pipe_set_fed(rp->pipe[i], &tr->fed, dev_sync_hub_member(tr->sync, r, i), err))
            return -1;
    }
    return 0;
}

/* Owners away: under outer:H only, each back at an outer step, and never
 * all at once. */
static int check_away(const dev_fed_cfg *f, sl_err *err)
{
    const dev_sync_cfg *c = &f->sync;
    uint64_t latest_from = 0, earliest_to = UINT64_MAX;
    int away = 0;
    for (int r = 0; r < c->replicas; r++) {
        if (!c->away_to[r])
            continue;
        away++;
        if (f->mode != DEV_SYNC_OUTER)
            return sl_err_set(err, SL_EINVAL, "an owner away needs --sync outer:H (under step "
                              "every round needs every replica)");
        if (c->away_from[r] < 1 || c->away_from[r] > c->away_to[r] ||
            c->away_to[r] % (uint64_t)f->every)
            return sl_err_set(err, SL_EINVAL, "replica %d away from step %llu to %llu: the steps "
                              "must be 1 <= from <= to, and to a multiple of H = %d (an outer "
                              "step)", r, (unsigned long long)c->away_from[r],
                              (unsigned long long)c->away_to[r], f->every);
        if (c->away_from[r] > latest_from)
            latest_from = c->away_from[r];
        if (c->away_to[r] < earliest_to)
            earliest_to = c->away_to[r];
    }
    if (away == c->replicas && latest_from <= earliest_to)
        return sl_err_set(err, SL_EINVAL, "every replica is away at step %llu",
                          (unsigned long long)latest_from);
    return 0;
}

/* The lowest replica present at round `round`. */
static int first_present(const dev_train *tr, uint64_t round)
{
    for (int r = 0; r < tr->R; r++)
        if (dev_sync_present(&tr->fed.sync, r, round))
            return r;
    return 0;
}

/* Replica r back after the outer step `step`: it holds theta_outer, v and
 * theta_r = theta_outer already (it received the round); it takes the inner
 * optimizer moments of replica p (the lowest present), by tensor name
 * whatever the cuts, and its error-feedback residual restarts at 0. */
static int rejoin(dev_train *tr, int r, int p, sl_err *err)
{
    for (int i = 0; i < tr->rep[r].n; i++) {
        dev_stage *to = tr->rep[r].st[i];
        if (dev_stage_pull(to, err))
            return -1;
        size_t nto;
        float *mto = dev_stage_optim_state(to, &nto);
        int nt;
        const dev_tensor *tt = dev_stage_tensors(to, &nt);
        for (int k = 0; k < nt; k++) {
            const char *name = (tt[k].flags & DEV_T_TIED) ? WORD_EMBEDDINGS : tt[k].name;
            int found = 0;
            for (int j = 0; j < tr->rep[p].n && !found; j++) {
                dev_stage *from = tr->rep[p].st[j];
                int ns;
                const dev_tensor *ts = dev_stage_tensors(from, &ns);
                for (int q = 0; q < ns && !found; q++) {
                    if ((ts[q].flags & DEV_T_TIED) || strcmp(ts[q].name, name) ||
                        ts[q].numel != tt[k].numel)
                        continue;
                    if (dev_stage_pull(from, err))
                        return -1;
                    size_t nfrom;
                    const float *mfrom = dev_stage_optim_state(from, &nfrom);
                    memcpy(mto + tt[k].offset, mfrom + ts[q].offset, tt[k].numel * sizeof(float));
                    memcpy(mto + nto + tt[k].offset, mfrom + nfrom + ts[q].offset,
                           tt[k].numel * sizeof(float));
                    found = 1;
                }
            }
            if (!found)
                return sl_err_set(err, SL_EINVAL, "replica %d rejoins, but replica %d holds no "
                                  "tensor '%s'", r, p, name);
        }
        if (dev_stage_push(to, err))
            return -1;
        float *e = dev_fed_residual(dev_pipe_fed(tr->rep[r].pipe[i]));
        if (e)
            memset(e, 0, nto * sizeof(float));
    }
    return 0;
}

dev_train *dev_train_open_fed(const dev_config *c, const dev_replica_cfg *rep, int R, int T,
                              int micro, uint64_t seed, const dev_train_opts *o,
                              const dev_fed_cfg *fed, sl_err *err)
{
    dev_train_opts def = {.schedule = BAL_1F1B};
    if (!o)
        o = &def;
    if (R < 1 || R > DEV_SYNC_MAX_REPLICAS || (!fed && R != 1)) {
        sl_err_set(err, SL_EINVAL, "%d replicas: 1 to %d, several only in a federation", R,
                   DEV_SYNC_MAX_REPLICAS);
        return NULL;
    }
    for (int r = 0; r < R; r++)
        if (check_bounds(c, rep[r].bounds, rep[r].nstages, rep[r].B, micro, err)) {
            if (R > 1)
                sl_err_wrap(err, "replica %d", r);
            return NULL;
        }
    if (o->schedule != BAL_1F1B && o->schedule != BAL_GPIPE) {
        sl_err_set(err, SL_EINVAL, "unknown schedule %d", o->schedule);
        return NULL;
    }
    dev_train *tr = sl_xcalloc(1, sizeof *tr);
    tr->c = *c;
    tr->R = R;
    tr->T = T;
    tr->micro = micro;
    tr->seed = seed;
    pthread_mutex_init(&tr->mu, NULL);
    pthread_cond_init(&tr->cv, NULL);
    tr->rep = sl_xcalloc((size_t)R, sizeof *tr->rep);
    int stages[DEV_SYNC_MAX_REPLICAS], batch[DEV_SYNC_MAX_REPLICAS];
    for (int r = 0; r < R; r++) {
        stages[r] = rep[r].nstages;
        batch[r] = rep[r].B;
        tr->nw += rep[r].nstages;
    }
    tr->threads = o->stage_threads > 0 ? o->stage_threads : default_threads(tr->nw);
    if (fed) {
        tr->has_fed = 1;
        tr->fed = *fed;
        dev_sync_weights(&tr->fed.sync, batch, R);
        if (check_away(&tr->fed, err))
            goto fail;
        if (!(tr->sync = dev_sync_hub_create(&tr->fed.sync, stages, err)))
            goto fail;
    }
    tr->w = sl_xcalloc((size_t)tr->nw, sizeof *tr->w);
    for (int r = 0, k = 0; r < R; r++) {
        if (open_replica(tr, r, &rep[r], o, err)) {
            if (R > 1)
                sl_err_wrap(err, "replica %d", r);
            goto fail;
        }
        for (int i = 0; i < rep[r].nstages; i++)
            tr->w[k++] = (worker){.tr = tr, .r = r, .i = i};
    }
    for (int k = 0; tr->nw > 1 && k < tr->nw; k++) {
        if (pthread_create(&tr->w[k].th, NULL, worker_main, &tr->w[k])) {
            sl_err_set(err, SL_ENOMEM, "cannot start the thread of replica %d stage %d",
                       tr->w[k].r, tr->w[k].i);
            goto fail;
        }
        tr->started = k + 1;
    }
    return tr;
fail:
    dev_train_free(tr);
    return NULL;
}

dev_train *dev_train_open(const dev_config *c, const int *bounds, int nstages, int B, int T,
                          int micro, uint64_t seed, const dev_train_opts *o, sl_err *err)
{
    dev_replica_cfg one = {.bounds = bounds, .nstages = nstages, .B = B};
    return dev_train_open_fed(c, &one, 1, T, micro, seed, o, NULL, err);
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
    for (int r = 0; r < tr->R; r++) {
        replica *rp = &tr->rep[r];
        for (int i = 0; i < rp->n; i++) {
            dev_pipe_free(rp->pipe ? rp->pipe[i] : NULL);
            dev_stage_free(rp->st ? rp->st[i] : NULL);
        }
        dev_port_hub_free(rp->hub);
        free(rp->st);
        free(rp->pipe);
    }
    dev_sync_hub_free(tr->sync);
    free(tr->rep);
    free(tr->w);
    pthread_cond_destroy(&tr->cv);
    pthread_mutex_destroy(&tr->mu);
    free(tr);
}

int dev_train_nstages(const dev_train *tr) { return tr->rep[0].n; }
dev_stage *dev_train_stage(dev_train *tr, int i) { return tr->rep[0].st[i]; }
dev_pipe *dev_train_pipe(dev_train *tr, int i) { return tr->rep[0].pipe[i]; }
int dev_train_replicas(const dev_train *tr) { return tr->R; }
int dev_train_replica_nstages(const dev_train *tr, int r) { return tr->rep[r].n; }
dev_stage *dev_train_replica_stage(dev_train *tr, int r, int i) { return tr->rep[r].st[i]; }
dev_pipe *dev_train_replica_pipe(dev_train *tr, int r, int i) { return tr->rep[r].pipe[i]; }
const dev_fed_cfg *dev_train_fed(const dev_train *tr) { return tr->has_fed ? &tr->fed : NULL; }

/* Replica r's runners agree on the step's figures; its last stage's. */
static const worker *replica_last(const dev_train *tr, int r)
{
    int k = 0;
    for (int q = 0; q <= r; q++)
        k += tr->rep[q].n;
    return &tr->w[k - 1];
}

void dev_train_replica_info(const dev_train *tr, int r, dev_step_info *info)
{
    *info = replica_last(tr, r)->info;
}

uint64_t dev_train_sync_bytes(dev_train *tr)
{
    uint64_t total = 0;
    for (int r = 0; tr->has_fed && r < tr->R; r++)
        for (int i = 0; i < tr->rep[r].n; i++)
            total += dev_fed_bytes(dev_pipe_fed(tr->rep[r].pipe[i]));
    return total;
}

static void step_info(const dev_train *tr, uint64_t step, dev_step_info *info)
{
    *info = replica_last(tr, 0)->info;
    if (tr->R == 1)
        return;
    info->loss = 0;
    info->masked = 0;
    double w[DEV_SYNC_MAX_REPLICAS];
    dev_sync_round_weights(&tr->fed.sync, step, w);
    for (int r = 0; r < tr->R; r++) {
        if (w[r] == 0.0) /* an owner away: none of its steps counts */
            continue;
        const dev_step_info *ri = &replica_last(tr, r)->info;
        info->loss += w[r] * ri->loss;
        info->masked += ri->masked;
    }
}

int dev_train_grads(dev_train *tr, const dev_batch *b, uint64_t step, dev_step_info *info,
                    sl_err *err)
{
    tr->b = b;
    tr->step = step;
    if (run_all(tr, CMD_GRADS, err))
        return -1;
    step_info(tr, step, info);
    return 0;
}

int dev_train_step(dev_train *tr, const dev_batch *b, const dev_optim *o, dev_step_info *info,
                   sl_err *err)
{
    tr->b = b;
    tr->o = o;
    if (run_all(tr, CMD_STEP, err))
        return -1;
    uint64_t step = (uint64_t)dev_stage_get_step(tr->rep[0].st[0]);
    step_info(tr, step, info);
    for (int r = 0; tr->has_fed && r < tr->R; r++)
        if (tr->fed.sync.away_to[r] == step && rejoin(tr, r, first_present(tr, step), err))
            return sl_err_wrap(err, "step %llu", (unsigned long long)step);
    return 0;
}

int dev_train_eval(dev_train *tr, const dev_batch *b, double *loss_sum, int *masked, sl_err *err)
{
    tr->b = b;
    if (run_all(tr, CMD_EVAL, err))
        return -1;
    const worker *w = replica_last(tr, 0);
    *loss_sum = w->loss_sum;
    *masked = w->masked;
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
