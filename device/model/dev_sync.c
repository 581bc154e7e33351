/* dev_sync.c - the replicas' reduce (dev_sync.h): its one definition of the
 * result, and the in-process hub. */
#include "dev_sync.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev_codec.h"
#include "sl_mem.h"

void dev_sync_weights(dev_sync_cfg *c, const int *batch, int replicas)
{
    double total = 0;
    for (int r = 0; r < replicas; r++)
        total += batch[r];
    c->replicas = replicas;
    for (int r = 0; r < DEV_SYNC_MAX_REPLICAS; r++) {
        c->weight[r] = r < replicas ? batch[r] / total : 0.0;
        c->batch[r] = r < replicas ? batch[r] : 0;
    }
}

int dev_sync_present(const dev_sync_cfg *c, int r, uint64_t round)
{
    return !(c->away_to[r] && round >= c->away_from[r] && round <= c->away_to[r]);
}

void dev_sync_round_weights(const dev_sync_cfg *c, uint64_t round, double *w)
{
    int all = 1;
    double total = 0;
    for (int r = 0; r < c->replicas; r++) {
        if (dev_sync_present(c, r, round))
            total += c->batch[r];
        else
            all = 0;
    }
    for (int r = 0; r < DEV_SYNC_MAX_REPLICAS; r++)
        w[r] = all ? c->weight[r]
               : r < c->replicas && dev_sync_present(c, r, round) ? c->batch[r] / total : 0.0;
}

size_t dev_sync_k(const dev_sync_cfg *c, size_t n)
{
    return c->codec == DEV_CODEC_TOPK ? dev_topk_k(n, c->topk) : 0;
}

size_t dev_sync_payload_len(const dev_sync_cfg *c, size_t n, size_t cols)
{
    size_t len = 0;
    sl_err err = {0};
    if (dev_codec_payload_len(c->codec, n, cols, dev_sync_k(c, n), &len, &err))
        return 0;
    return len;
}

int dev_sync_combine(const dev_sync_cfg *c, const uint8_t *const *payload, size_t n, size_t cols,
                     float *out, float *scratch, sl_err *err)
{
    int R = c->replicas;
    size_t k = dev_sync_k(c, n);
    for (int r = 0; r < R; r++)
        if (payload[r] &&
            dev_codec_decode(c->codec, payload[r], n, cols, k, scratch + (size_t)r * n, err))
            return sl_err_wrap(err, "replica %d's payload", r);
    for (size_t i = 0; i < n; i++) {
        double acc = 0.0;
        for (int r = 0; r < R; r++)
            if (payload[r])
                acc += c->weight[r] * (double)scratch[(size_t)r * n + i];
        out[i] = (float)acc;
    }
    return 0;
}

/* ---- the in-process hub ---------------------------------------------------
 * Two barriers per round: after the first every participant's tensors are
 * published and each combines its own tensors from the others' payloads;
 * the second keeps the payloads alive until everyone has read them. */

typedef struct member {
    dev_sync s; /* first: a member is its dev_sync */
    dev_sync_hub *h;
    uint64_t round;
    const dev_sync_tensor *t;
    int n;
    float *scratch; /* R * the largest tensor's floats */
    size_t scratch_cap;
} member;

struct dev_sync_hub {
    dev_sync_cfg c;
    int P;      /* participants */
    int *first; /* [R + 1]: replica r's members are first[r] .. first[r+1]-1 */
    member *m;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int in, out;              /* arrived at each barrier */
    uint64_t gen_in, gen_out; /* completed barriers */
    int aborted;
    char why[300];
};

static int aborted_err(dev_sync_hub *h, sl_err *err)
{
    return sl_err_set(err, SL_ECANCELED, "%s", h->why);
}

static void hub_abort(dev_sync *s, const char *why)
{
    dev_sync_hub *h = ((member *)s)->h;
    pthread_mutex_lock(&h->mu);
    if (!h->aborted) {
        h->aborted = 1;
        snprintf(h->why, sizeof h->why, "%s", why);
    }
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

/* Waits for all P participants; -1 if the hub is aborted meanwhile. Called
 * with h->mu held. */
static int barrier(dev_sync_hub *h, int *count, uint64_t *gen)
{
    if (h->aborted)
        return -1;
    if (++*count == h->P) {
        *count = 0;
        ++*gen;
        pthread_cond_broadcast(&h->cv);
        return 0;
    }
    uint64_t g = *gen;
    while (*gen == g && !h->aborted)
        pthread_cond_wait(&h->cv, &h->mu);
    return *gen == g ? -1 : 0;
}

/* Replica r's contribution to tensor `want` (exactly one of its members
 * gives it), or NULL with err. */
static const dev_sync_tensor *contribution(dev_sync_hub *h, int r, const dev_sync_tensor *want,
                                           sl_err *err)
{
    const dev_sync_tensor *got = NULL;
    for (int j = h->first[r]; j < h->first[r + 1]; j++) {
        const member *m = &h->m[j];
        for (int k = 0; k < m->n; k++) {
            const dev_sync_tensor *t = &m->t[k];
            if (!t->payload || strcmp(t->name, want->name))
                continue;
            if (got) {
                sl_err_set(err, SL_EINVAL, "replica %d gives tensor '%s' twice", r, want->name);
                return NULL;
            }
            got = t;
        }
    }
    if (!got)
        sl_err_set(err, SL_EINVAL, "replica %d gives no tensor '%s'", r, want->name);
    else if (got->n != want->n || got->cols != want->cols) {
        sl_err_set(err, SL_EINVAL, "tensor '%s': replica %d's has %zu elements in rows of %zu, "
                   "this one %zu in rows of %zu", want->name, r, got->n, got->cols, want->n,
                   want->cols);
        return NULL;
    }
    return got;
}

static int combine_mine(member *me, sl_err *err)
{
    dev_sync_hub *h = me->h;
    int R = h->c.replicas;
    for (int j = 0; j < h->P; j++)
        if (h->m[j].round != me->round)
            return sl_err_set(err, SL_EINVAL, "replica %d stage %d is at round %llu, replica %d "
                              "stage %d at %llu", h->m[j].s.replica, h->m[j].s.stage,
                              (unsigned long long)h->m[j].round, me->s.replica, me->s.stage,
                              (unsigned long long)me->round);
    const uint8_t *payload[DEV_SYNC_MAX_REPLICAS];
    dev_sync_cfg rc = h->c;
    dev_sync_round_weights(&h->c, me->round, rc.weight);
    for (int k = 0; k < me->n; k++) {
        const dev_sync_tensor *t = &me->t[k];
        for (int r = 0; r < R; r++) {
            payload[r] = NULL;
            if (!dev_sync_present(&h->c, r, me->round))
                continue;
            const dev_sync_tensor *c = contribution(h, r, t, err);
            if (!c)
                return -1;
            payload[r] = c->payload;
        }
        size_t need = (size_t)R * t->n;
        if (need > me->scratch_cap) {
            sl_aligned_free(me->scratch);
            me->scratch_cap = 0;
            if (!(me->scratch = sl_try_aligned_alloc(need * sizeof(float))))
                return sl_err_set(err, SL_ENOMEM, "cannot allocate %zu floats to reduce '%s'",
                                  need, t->name);
            me->scratch_cap = need;
        }
        if (dev_sync_combine(&rc, payload, t->n, t->cols, t->out, me->scratch, err))
            return sl_err_wrap(err, "tensor '%s'", t->name);
    }
    return 0;
}

static int hub_reduce(dev_sync *s, uint64_t round, const dev_sync_tensor *t, int n, sl_err *err)
{
    member *me = (member *)s;
    dev_sync_hub *h = me->h;
    pthread_mutex_lock(&h->mu);
    me->round = round;
    me->t = t;
    me->n = n;
    int rc = barrier(h, &h->in, &h->gen_in);
    pthread_mutex_unlock(&h->mu);
    if (rc)
        return aborted_err(h, err);
    if (combine_mine(me, err)) {
        char why[300];
        snprintf(why, sizeof why, "replica %d stage %d: %.250s", s->replica, s->stage, err->msg);
        hub_abort(s, why);
        return -1;
    }
    pthread_mutex_lock(&h->mu);
    rc = barrier(h, &h->out, &h->gen_out);
    pthread_mutex_unlock(&h->mu);
    return rc ? aborted_err(h, err) : 0;
}

static void hub_member_free(dev_sync *s) { (void)s; }

static const dev_sync_ops hub_ops = {hub_reduce, hub_abort, hub_member_free};

dev_sync_hub *dev_sync_hub_create(const dev_sync_cfg *c, const int *stages, sl_err *err)
{
    if (c->replicas < 1 || c->replicas > DEV_SYNC_MAX_REPLICAS) {
        sl_err_set(err, SL_EINVAL, "%d replicas: 1 to %d", c->replicas, DEV_SYNC_MAX_REPLICAS);
        return NULL;
    }
    dev_sync_hub *h = sl_xcalloc(1, sizeof *h);
    h->c = *c;
    h->first = sl_xcalloc((size_t)c->replicas + 1, sizeof *h->first);
    for (int r = 0; r < c->replicas; r++) {
        if (stages[r] < 1) {
            free(h->first);
            free(h);
            sl_err_set(err, SL_EINVAL, "replica %d has no stage", r);
            return NULL;
        }
        h->first[r + 1] = h->first[r] + stages[r];
    }
    h->P = h->first[c->replicas];
    h->m = sl_xcalloc((size_t)h->P, sizeof *h->m);
    for (int r = 0; r < c->replicas; r++)
        for (int i = 0; i < stages[r]; i++) {
            member *m = &h->m[h->first[r] + i];
            m->s = (dev_sync){.ops = &hub_ops, .c = *c, .replica = r, .stage = i};
            m->h = h;
        }
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    return h;
}

dev_sync *dev_sync_hub_member(dev_sync_hub *h, int replica, int stage)
{
    return &h->m[h->first[replica] + stage].s;
}

void dev_sync_hub_reset(dev_sync_hub *h)
{
    pthread_mutex_lock(&h->mu);
    h->aborted = 0;
    h->why[0] = 0;
    h->in = h->out = 0;
    pthread_mutex_unlock(&h->mu);
}

void dev_sync_hub_free(dev_sync_hub *h)
{
    if (!h)
        return;
    for (int j = 0; j < h->P; j++)
        sl_aligned_free(h->m[j].scratch);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h->m);
    free(h->first);
    free(h);
}
