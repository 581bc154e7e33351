/* dev_port_local.c - the in-process port: stages on threads of one process
 * exchange through a hub of bounded queues under one mutex. Every message is
 * copied into a slot the hub allocated up front, so a sender's buffer is free
 * again when the call returns, as with the network port. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev_port.h"
#include "sl_mem.h"

typedef struct msg {
    int mb;
    size_t n, nvalid;
    float *x;
    int32_t *valid;
} msg;

/* One direction of one link: a ring of `cap` preallocated messages. */
typedef struct queue {
    msg *slot;
    int head, count, cap;
} queue;

typedef struct lport {
    dev_port base;
    dev_port_hub *h;
    uint64_t tied_round, gather_round; /* this stage's count of each rendezvous */
} lport;

struct dev_port_hub {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dev_port_hub_cfg c;
    queue *fwd, *bwd; /* fwd[i]: i -> i+1, bwd[i]: i+1 -> i */
    int32_t *labels;
    int masked, have_labels;
    float *tied[2];          /* [0] stage 0's partial, [1] the last stage's */
    uint64_t posted[2], taken[2];
    double *gvals[2];        /* double-buffered by round parity */
    int *gcount[2];
    int garrived;
    uint64_t ground;         /* gathers completed */
    int aborted;
    char why[256];
    lport *ports;
};

static void queue_free(queue *q)
{
    for (int k = 0; q->slot && k < q->cap; k++) {
        sl_aligned_free(q->slot[k].x);
        free(q->slot[k].valid);
    }
    free(q->slot);
}

static int queue_init(queue *q, int cap, size_t nx, size_t nv)
{
    q->cap = cap;
    q->slot = calloc((size_t)cap, sizeof *q->slot);
    if (!q->slot)
        return -1;
    for (int k = 0; k < cap; k++) {
        q->slot[k].x = sl_try_aligned_alloc((nx ? nx : 1) * sizeof(float));
        q->slot[k].valid = nv ? malloc(nv * sizeof(int32_t)) : NULL;
        if (!q->slot[k].x || (nv && !q->slot[k].valid))
            return -1;
    }
    return 0;
}

static const dev_port_ops local_ops;

void dev_port_hub_free(dev_port_hub *h)
{
    if (!h)
        return;
    for (int i = 0; h->fwd && i + 1 < h->c.stages; i++) {
        queue_free(&h->fwd[i]);
        queue_free(&h->bwd[i]);
    }
    free(h->fwd);
    free(h->bwd);
    free(h->labels);
    sl_aligned_free(h->tied[0]);
    sl_aligned_free(h->tied[1]);
    for (int k = 0; k < 2; k++) {
        free(h->gvals[k]);
        free(h->gcount[k]);
    }
    free(h->ports);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

dev_port_hub *dev_port_hub_create(const dev_port_hub_cfg *c, sl_err *err)
{
    int p = c->stages;
    if (p < 1 || c->depth < 1 || c->gather_max < 1) {
        sl_err_set(err, SL_EINVAL, "port hub: %d stages, depth %d, gather %d", p, c->depth,
                   c->gather_max);
        return NULL;
    }
    dev_port_hub *h = calloc(1, sizeof *h);
    if (!h) {
        sl_err_set(err, SL_ENOMEM, "port hub: out of memory");
        return NULL;
    }
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    h->c = *c;
    int ok = (h->fwd = calloc((size_t)p, sizeof *h->fwd)) && (h->bwd = calloc((size_t)p, sizeof *h->bwd)) &&
             (h->ports = calloc((size_t)p, sizeof *h->ports));
    for (int i = 0; ok && i + 1 < p; i++)
        ok = !queue_init(&h->fwd[i], c->depth, c->act_floats, c->valid_ints) &&
             !queue_init(&h->bwd[i], c->depth, c->act_floats, 0);
    if (ok && p > 1 && c->label_ints)
        ok = (h->labels = malloc(c->label_ints * sizeof(int32_t))) != NULL;
    for (int k = 0; ok && p > 1 && c->tied_floats && k < 2; k++)
        ok = (h->tied[k] = sl_try_aligned_alloc(c->tied_floats * sizeof(float))) != NULL;
    for (int k = 0; ok && k < 2; k++)
        ok = (h->gvals[k] = calloc((size_t)p * (size_t)c->gather_max, sizeof(double))) &&
             (h->gcount[k] = calloc((size_t)p, sizeof(int)));
    if (!ok) {
        dev_port_hub_free(h);
        sl_err_set(err, SL_ENOMEM, "port hub: cannot allocate the queues of %d stages", p);
        return NULL;
    }
    for (int i = 0; i < p; i++)
        h->ports[i] = (lport){.base = {.ops = &local_ops, .stages = p, .index = i}, .h = h};
    return h;
}

dev_port *dev_port_hub_port(dev_port_hub *h, int i) { return &h->ports[i].base; }

void dev_port_hub_reset(dev_port_hub *h)
{
    pthread_mutex_lock(&h->mu);
    for (int i = 0; i + 1 < h->c.stages; i++) {
        h->fwd[i].head = h->fwd[i].count = 0;
        h->bwd[i].head = h->bwd[i].count = 0;
    }
    h->have_labels = 0;
    h->posted[0] = h->posted[1] = h->taken[0] = h->taken[1] = 0;
    h->garrived = 0;
    h->ground = 0;
    for (int i = 0; i < h->c.stages; i++)
        h->ports[i].tied_round = h->ports[i].gather_round = 0;
    h->aborted = 0;
    h->why[0] = 0;
    pthread_mutex_unlock(&h->mu);
}

/* Waits on the hub's condition; -1 (err set) once the hub is aborted. Called
 * with the mutex held. */
static int wait_or_abort(dev_port_hub *h, int index, sl_err *err)
{
    if (!h->aborted)
        pthread_cond_wait(&h->cv, &h->mu);
    if (h->aborted)
        return sl_err_set(err, SL_ECANCELED, "stage %d: pipeline stopped: %s", index, h->why);
    return 0;
}

static int aborted(dev_port_hub *h, int index, sl_err *err)
{
    return h->aborted ? sl_err_set(err, SL_ECANCELED, "stage %d: pipeline stopped: %s", index, h->why)
                      : 0;
}

static int put(dev_port_hub *h, queue *q, int index, int mb, const float *x, size_t n,
               const int32_t *valid, size_t nvalid, sl_err *err)
{
    if (n > h->c.act_floats || nvalid > h->c.valid_ints)
        return sl_err_set(err, SL_EINVAL,
                          "stage %d: message of %zu floats and %zu mask entries over the hub's "
                          "%zu and %zu",
                          index, n, nvalid, h->c.act_floats, h->c.valid_ints);
    pthread_mutex_lock(&h->mu);
    int rc = 0;
    while (!rc && q->count == q->cap)
        rc = wait_or_abort(h, index, err);
    if (!rc && !(rc = aborted(h, index, err))) {
        msg *m = &q->slot[(q->head + q->count) % q->cap];
        m->mb = mb;
        m->n = n;
        m->nvalid = nvalid;
        memcpy(m->x, x, n * sizeof(float));
        if (nvalid)
            memcpy(m->valid, valid, nvalid * sizeof(int32_t));
        q->count++;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

static int take(dev_port_hub *h, queue *q, int index, const char *what, int mb, float *x, size_t n,
                int32_t *valid, size_t nvalid, sl_err *err)
{
    pthread_mutex_lock(&h->mu);
    int rc = 0;
    while (!rc && q->count == 0)
        rc = wait_or_abort(h, index, err);
    if (!rc) {
        msg *m = &q->slot[q->head];
        if (m->mb != mb || m->n != n || m->nvalid != nvalid)
            rc = sl_err_set(err, SL_EINVAL,
                            "stage %d: expected the %s of micro-batch %d (%zu values), got "
                            "micro-batch %d (%zu values)",
                            index, what, mb, n, m->mb, m->n);
        else {
            memcpy(x, m->x, n * sizeof(float));
            if (nvalid)
                memcpy(valid, m->valid, nvalid * sizeof(int32_t));
            q->head = (q->head + 1) % q->cap;
            q->count--;
            pthread_cond_broadcast(&h->cv);
        }
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

static int lp_begin(dev_port *p, uint64_t step, sl_err *err)
{
    (void)step;
    lport *l = (lport *)p;
    pthread_mutex_lock(&l->h->mu);
    int rc = aborted(l->h, p->index, err);
    pthread_mutex_unlock(&l->h->mu);
    return rc;
}

static int no_link(const dev_port *p, int next, sl_err *err)
{
    int to = p->index + (next ? 1 : -1);
    if (to < 0 || to >= p->stages)
        return sl_err_set(err, SL_EINVAL, "stage %d has no %s stage", p->index,
                          next ? "next" : "previous");
    return 0;
}

static int lp_send_act(dev_port *p, int mb, const float *x, size_t n, const int32_t *valid,
                       size_t nvalid, sl_err *err)
{
    lport *l = (lport *)p;
    if (no_link(p, 1, err))
        return -1;
    return put(l->h, &l->h->fwd[p->index], p->index, mb, x, n, valid, nvalid, err);
}

static int lp_recv_act(dev_port *p, int mb, float *x, size_t n, int32_t *valid, size_t nvalid,
                       sl_err *err)
{
    lport *l = (lport *)p;
    if (no_link(p, 0, err))
        return -1;
    return take(l->h, &l->h->fwd[p->index - 1], p->index, "activation", mb, x, n, valid, nvalid,
                err);
}

static int lp_send_grad(dev_port *p, int mb, const float *g, size_t n, sl_err *err)
{
    lport *l = (lport *)p;
    if (no_link(p, 0, err))
        return -1;
    return put(l->h, &l->h->bwd[p->index - 1], p->index, mb, g, n, NULL, 0, err);
}

static int lp_recv_grad(dev_port *p, int mb, float *g, size_t n, sl_err *err)
{
    lport *l = (lport *)p;
    if (no_link(p, 1, err))
        return -1;
    return take(l->h, &l->h->bwd[p->index], p->index, "gradient", mb, g, n, NULL, 0, err);
}

static int lp_send_labels(dev_port *p, const int32_t *labels, size_t n, int masked, sl_err *err)
{
    dev_port_hub *h = ((lport *)p)->h;
    if (p->index != 0 || p->stages < 2 || n > h->c.label_ints)
        return sl_err_set(err, SL_EINVAL, "stage %d cannot send %zu labels", p->index, n);
    pthread_mutex_lock(&h->mu);
    int rc = 0;
    while (!rc && h->have_labels)
        rc = wait_or_abort(h, p->index, err);
    if (!rc && !(rc = aborted(h, p->index, err))) {
        memcpy(h->labels, labels, n * sizeof(int32_t));
        h->masked = masked;
        h->have_labels = 1;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

static int lp_recv_labels(dev_port *p, int32_t *labels, size_t n, int *masked, sl_err *err)
{
    dev_port_hub *h = ((lport *)p)->h;
    if (p->index != p->stages - 1 || p->stages < 2 || n > h->c.label_ints)
        return sl_err_set(err, SL_EINVAL, "stage %d cannot receive %zu labels", p->index, n);
    pthread_mutex_lock(&h->mu);
    int rc = 0;
    while (!rc && !h->have_labels)
        rc = wait_or_abort(h, p->index, err);
    if (!rc) {
        memcpy(labels, h->labels, n * sizeof(int32_t));
        *masked = h->masked;
        h->have_labels = 0;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

/* Both ends post their partial, then each copies the other's; round numbers
 * instead of flags, so nothing needs resetting between steps. */
static int lp_tied_exchange(dev_port *p, const float *mine, float *theirs, size_t n, sl_err *err)
{
    lport *l = (lport *)p;
    dev_port_hub *h = l->h;
    int side = p->index == 0 ? 0 : p->index == p->stages - 1 ? 1 : -1;
    if (side < 0 || p->stages < 2 || n > h->c.tied_floats)
        return sl_err_set(err, SL_EINVAL, "stage %d has no tied partner for %zu floats",
                          p->index, n);
    uint64_t r = ++l->tied_round;
    pthread_mutex_lock(&h->mu);
    int rc = aborted(h, p->index, err);
    if (!rc) {
        memcpy(h->tied[side], mine, n * sizeof(float));
        h->posted[side] = r;
        pthread_cond_broadcast(&h->cv);
    }
    while (!rc && h->posted[1 - side] < r)
        rc = wait_or_abort(h, p->index, err);
    if (!rc) {
        memcpy(theirs, h->tied[1 - side], n * sizeof(float));
        h->taken[side] = r;
        pthread_cond_broadcast(&h->cv);
    }
    /* the other side's buffer is overwritten only at the next round, after
     * it saw that this side took it */
    while (!rc && h->taken[1 - side] < r)
        rc = wait_or_abort(h, p->index, err);
    pthread_mutex_unlock(&h->mu);
    return rc;
}

static int lp_gather(dev_port *p, const double *mine, int n, double *all, int cap, int *n_all,
                     sl_err *err)
{
    lport *l = (lport *)p;
    dev_port_hub *h = l->h;
    int gm = h->c.gather_max;
    if (n < 0 || n > gm)
        return sl_err_set(err, SL_EINVAL, "stage %d: gather of %d values, at most %d", p->index,
                          n, gm);
    uint64_t r = l->gather_round++;
    int par = (int)(r & 1);
    pthread_mutex_lock(&h->mu);
    int rc = aborted(h, p->index, err);
    if (!rc) {
        memcpy(h->gvals[par] + (size_t)p->index * gm, mine, (size_t)n * sizeof(double));
        h->gcount[par][p->index] = n;
        if (++h->garrived == p->stages) {
            h->garrived = 0;
            h->ground++;
            pthread_cond_broadcast(&h->cv);
        }
    }
    while (!rc && h->ground <= r)
        rc = wait_or_abort(h, p->index, err);
    int k = 0;
    for (int i = 0; !rc && i < p->stages; i++) {
        int c = h->gcount[par][i];
        if (k + c > cap) {
            rc = sl_err_set(err, SL_EINVAL, "stage %d: gather needs more than %d values",
                            p->index, cap);
            break;
        }
        memcpy(all + k, h->gvals[par] + (size_t)i * gm, (size_t)c * sizeof(double));
        k += c;
    }
    pthread_mutex_unlock(&h->mu);
    *n_all = k;
    return rc;
}

static void lp_abort(dev_port *p, const char *why)
{
    dev_port_hub *h = ((lport *)p)->h;
    pthread_mutex_lock(&h->mu);
    if (!h->aborted) {
        h->aborted = 1;
        snprintf(h->why, sizeof h->why, "%s", why);
    }
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

static void lp_free(dev_port *p) { (void)p; }

static const dev_port_ops local_ops = {
    .begin = lp_begin,
    .send_act = lp_send_act,
    .recv_act = lp_recv_act,
    .send_grad = lp_send_grad,
    .recv_grad = lp_recv_grad,
    .send_labels = lp_send_labels,
    .recv_labels = lp_recv_labels,
    .tied_exchange = lp_tied_exchange,
    .gather = lp_gather,
    .abort = lp_abort,
    .free = lp_free,
};
