/* dev_net.c - a job's links on one device and the network port (dev_net.h). */
#include "dev_net.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dev_exch.h"
#include "dev_model.h"
#include "dev_stagesvc.h"
#include "sl_log.h"
#include "sl_mem.h"
#include "sl_time.h"

#define PREFIX 11               /* room for StageFrame's tag and length */
#define STREAM_LIFE_MS (30LL * 24 * 3600 * 1000)
#define MAX_MESSAGE (300u << 20)
#define DEV_SYNC_ROUND_MAX 8     /* local stages that meet in a federation's round */
/* sync rounds a sync flow may hold queued: a sender finishes its round only
 * once it has every replica's payloads, this device's among them, so it is
 * at most one round ahead of what this device takes */
#define SYNC_ROUNDS 2

/* Frame kinds, in the order of enum dev_direction. */
enum { K_ACT, K_GRAD, K_MASK, K_LABELS, K_TIED, K_GATHER, K_GRES, K_SYNC, NK };
static int kind_of(int dir)
{
    switch (dir) {
    case DEV_DIR_ACTIVATION: return K_ACT;
    case DEV_DIR_GRADIENT: return K_GRAD;
    case DEV_DIR_MASK: return K_MASK;
    case DEV_DIR_LABELS: return K_LABELS;
    case DEV_DIR_TIED: return K_TIED;
    case DEV_DIR_GATHER: return K_GATHER;
    case DEV_DIR_GATHER_RESULT: return K_GRES;
    case DEV_DIR_SYNC: return K_SYNC;
    default: return -1;
    }
}
static const char *const kind_name[NK] = {"activation", "gradient", "mask", "labels",
                                          "tied gradient", "gather", "gather result", "sync payload"};

typedef struct qmsg {
    struct qmsg *next;
    rpc_buf buf;           /* network: the StageFrame message holding the frame */
    const uint8_t *frame;
    size_t len;
    dev_frame_hdr h;       /* local links: the header as a frame would carry it */
    void *data;            /* local links: a copy of the elements */
    size_t nbytes;
} qmsg;

/* One direction of a link. */
typedef struct flow {
    int from, to;
    dev_link_tx tx;
    int tx_ok;
    pthread_mutex_t txmu;
    dev_link_rx rx;
    int rx_ok;
    dev_topk_ef ef;
    int ef_ok;
    qmsg *qh[NK], *qt[NK];
    uint64_t got[NK];
    uint64_t raw, wire;    /* sent */
    size_t queued[NK];     /* received network messages not taken yet, in bytes */
    size_t max_queued[NK]; /* the most each kind may hold (kind_budget) */
} flow;

typedef struct omsg {
    struct omsg *next;
    rpc_msg m;
    size_t off, len;
} omsg;

enum { L_LOCAL, L_CLIENT, L_SERVER, L_OTHER };

typedef struct link {
    dev_net *n;
    int a, b;              /* stages, a < b */
    int mode;
    flow down, up;         /* a -> b, b -> a */
    rpc_channel *ch;
    rpc_stream *st;
    rpc_stream *connecting; /* client: a stream being opened (an abort interrupts it) */
    int state;             /* 0 waiting, 1 up, 2 ended */
    int sender_done, receiver_done; /* client: those threads have ended (or never ran) */
    omsg *oh, *ot;
    pthread_t sender, receiver;
    int has_sender, has_receiver;
    int serving;           /* a dev_net_accept runs on it */
} link;

typedef struct nport {
    dev_port base;
    dev_net *n;
    uint64_t step;
    int first;             /* the first stage of its chain (base.index is within it) */
} nport;

/* A local stage's replica sync (a federation). */
typedef struct nsync {
    dev_sync base;
    dev_net *n;
    int g;                 /* the stage */
    int slot;              /* its place among the local stages */
} nsync;

struct dev_net {
    dev_net_cfg c;
    dev_net_stage *stage;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    link *links;
    int nlinks;
    nport *ports;          /* [stages]; only local stages are used */
    nsync *syncs;          /* [stages] in a federation; only local stages are used */
    int nlocal;
    /* a federation's round: the local stages meet here (under mu) */
    const dev_sync_tensor *rv_t[DEV_SYNC_ROUND_MAX];
    int rv_g[DEV_SYNC_ROUND_MAX];
    int rv_n[DEV_SYNC_ROUND_MAX];
    uint64_t rv_round[DEV_SYNC_ROUND_MAX];
    int rv_arrived;
    uint64_t rv_gen;
    dev_tensor *layout;    /* the whole model's tensors (the sync's names and units) */
    int nlayout;
    int aborted, closing;
    char why[320];
    char lost[32];         /* the peer whose link broke, when that stopped the net */
    uint64_t refused[DEV_FR_NREASONS];
};

static const dev_port_ops net_ops;
static const dev_sync_ops sync_ops;

static int local(const dev_net *n, int stage) { return !strcmp(n->stage[stage].device, n->c.self_id); }

static const char *peer_of(const dev_net *n, const link *l)
{
    return n->stage[local(n, l->a) ? l->b : l->a].device;
}

static link *link_of(dev_net *n, int a, int b)
{
    for (int i = 0; i < n->nlinks; i++)
        if (n->links[i].a == a && n->links[i].b == b)
            return &n->links[i];
    return NULL;
}

/* The link of a port's chain carrying labels and the tied gradient: its
 * first stage to its last. */
static link *side_link(dev_net *n, const dev_port *p)
{
    int first = ((const nport *)p)->first;
    return link_of(n, first, first + p->stages - 1);
}

/* A port's stage as the net numbers it. */
static int gi(const dev_port *p) { return ((const nport *)p)->first + p->index; }

/* ---- abort ---------------------------------------------------------------- */

static void abort_locked(dev_net *n, const char *why)
{
    if (!n->aborted) {
        n->aborted = 1;
        snprintf(n->why, sizeof n->why, "%s", why);
        if (!n->closing)
            sl_log_warn("device: pipeline stopped", "job=j%016llx epoch=%u reason=\"%s\"",
                        (unsigned long long)n->c.job, n->c.epoch, why);
    }
    for (int i = 0; i < n->nlinks; i++) {
        if (n->links[i].st)
            rpc_stream_interrupt(n->links[i].st);
        if (n->links[i].connecting)
            rpc_stream_interrupt(n->links[i].connecting);
    }
    pthread_cond_broadcast(&n->cv);
}

/* Stops the net because the link to `peer` broke (peer unreachable, its
 * stream failed): the peer is named only if this is the first cause. */
static void abort_lost_locked(dev_net *n, const char *peer, const char *why)
{
    if (!n->aborted && !n->closing)
        snprintf(n->lost, sizeof n->lost, "%s", peer);
    abort_locked(n, why);
}

int dev_net_lost_peer(dev_net *n, char *peer, size_t cap)
{
    pthread_mutex_lock(&n->mu);
    int have = n->lost[0] != 0;
    snprintf(peer, cap, "%s", n->lost);
    pthread_mutex_unlock(&n->mu);
    return have;
}

void dev_net_abort_peer(dev_net *n, const char *peer, const char *why)
{
    pthread_mutex_lock(&n->mu);
    abort_lost_locked(n, peer, why);
    pthread_mutex_unlock(&n->mu);
}

/* The device at the other end of link l. */
static const char *peer_of(const dev_net *n, const link *l);

int dev_net_serves_peer(dev_net *n, const char *peer)
{
    for (int i = 0; i < n->nlinks; i++)
        if (n->links[i].mode == L_SERVER && !strcmp(n->stage[n->links[i].a].device, peer))
            return 1;
    return 0;
}

int dev_net_neighbour(dev_net *n, int k, char *peer, size_t cap)
{
    for (int i = 0, seen = 0; i < n->nlinks; i++) {
        const link *l = &n->links[i];
        if (l->mode != L_CLIENT && l->mode != L_SERVER)
            continue;
        const char *p = peer_of(n, l);
        int dup = 0; /* one entry per device */
        for (int j = 0; j < i && !dup; j++)
            dup = (n->links[j].mode == L_CLIENT || n->links[j].mode == L_SERVER) &&
                  !strcmp(peer_of(n, &n->links[j]), p);
        if (dup)
            continue;
        if (seen++ == k) {
            snprintf(peer, cap, "%s", p);
            return 1;
        }
    }
    return 0;
}

void dev_net_abort(dev_net *n, const char *why)
{
    pthread_mutex_lock(&n->mu);
    abort_locked(n, why);
    pthread_mutex_unlock(&n->mu);
}

int dev_net_aborted(dev_net *n, char *why, size_t cap)
{
    pthread_mutex_lock(&n->mu);
    int a = n->aborted;
    if (a && why)
        snprintf(why, cap, "%s", n->why);
    pthread_mutex_unlock(&n->mu);
    return a;
}

static int stopped(dev_net *n, int stage, sl_err *err)
{
    return sl_err_set(err, SL_ECANCELED, "stage %d: pipeline stopped: %s", stage, n->why);
}

/* ---- set-up ----------------------------------------------------------------- */

static void flow_free(flow *f)
{
    if (f->tx_ok)
        dev_link_tx_free(&f->tx);
    if (f->rx_ok)
        dev_link_rx_free(&f->rx);
    if (f->ef_ok)
        dev_topk_ef_free(&f->ef);
    for (int k = 0; k < NK; k++)
        while (f->qh[k]) {
            qmsg *q = f->qh[k];
            f->qh[k] = q->next;
            rpc_buf_free(&q->buf);
            free(q->data);
            free(q);
        }
    pthread_mutex_destroy(&f->txmu);
}

/* The unit of a tensor the sync names (the tied copy goes by the word
 * embeddings' name), its entry in the model's layout; NULL if unknown. */
static const dev_tensor *sync_tensor(const dev_net *n, const char *name)
{
    for (int k = 0; k < n->nlayout; k++)
        if (!(n->layout[k].flags & DEV_T_TIED) && !strcmp(n->layout[k].name, name))
            return &n->layout[k];
    return NULL;
}

static int is_word(const char *name) { return !strcmp(name, "bert.embeddings.word_embeddings.weight"); }

static size_t cols_of(const dev_tensor *t) { return t->cols ? (size_t)t->cols : t->numel; }

/* A sync payload's frame (header, payload, tag) as it crosses. */
static size_t sync_frame_len(size_t len)
{
    dev_frame_hdr h;
    memset(&h, 0, sizeof h);
    h.direction = DEV_DIR_SYNC;
    h.codec = DEV_CODEC_NONE;
    h.dtype = DEV_DTYPE_U8;
    h.ndim = 1;
    h.dims[0] = (uint32_t)len;
    return dev_frame_max_len(&h);
}

/* The bytes of one round's sync frames from stage `from` to stage `to`:
 * each tensor `from` gives that `to` receives for its device. */
static size_t sync_round_bytes(const dev_net *n, int from, int to)
{
    size_t total = 0;
    const dev_net_stage *f = &n->stage[from];
    for (int k = 0; k < n->nlayout; k++) {
        const dev_tensor *t = &n->layout[k];
        if ((t->flags & DEV_T_TIED) || t->unit < f->first_unit || t->unit > f->last_unit)
            continue;
        if (!dev_exch_sync_target(&n->c, to, t->unit, 0) &&
            !(is_word(t->name) && dev_exch_sync_target(&n->c, to, 0, 1)))
            continue;
        total += sync_frame_len(dev_sync_payload_len(&n->c.sync, t->numel, cols_of(t))) + PREFIX;
    }
    return total;
}

/* The bytes of one kind of frame that a flow this device receives may hold
 * queued: one step's worth (a frame per micro-batch for activations, masks
 * and gradients, else one), each frame at its largest (codec none or, for
 * topk gradients, topk of every element; sealed) with the StageFrame prefix; 0 for a kind the flow does not carry. No
 * neighbour that follows the plan gets further ahead: a step ends with the
 * gather, which every stage waits for before it sends anything of the next
 * step. */
static size_t kind_budget(const dev_net *n, int a, int b, int down, int dir)
{
    const dev_net_cfg *c = &n->c;
    if (!dev_exch_allowed_in(c, a, b, down, dir))
        return 0;
    if (dir == DEV_DIR_SYNC)
        return SYNC_ROUNDS * sync_round_bytes(n, down ? a : b, down ? b : a);
    size_t elems = 0, per_step = 1;
    uint8_t dtype = DEV_DTYPE_F32;
    switch (dir) {
    case DEV_DIR_ACTIVATION:
    case DEV_DIR_GRADIENT: elems = c->act_floats; per_step = (size_t)c->depth; break;
    case DEV_DIR_MASK: elems = c->mask_ints; dtype = DEV_DTYPE_I32; per_step = (size_t)c->depth; break;
    case DEV_DIR_LABELS: elems = c->label_ints; dtype = DEV_DTYPE_I32; break;
    case DEV_DIR_TIED: elems = c->tied_floats; break;
    default: elems = c->gather_max; dtype = DEV_DTYPE_F64; break; /* gather, its result */
    }
    dev_frame_hdr h;
    memset(&h, 0, sizeof h);
    h.direction = (uint8_t)dir;
    h.codec = DEV_CODEC_NONE;
    h.dtype = dtype;
    h.ndim = 1;
    h.dims[0] = (uint32_t)(elems ? elems : 1);
    size_t one = dev_frame_max_len(&h);
    if (dir == DEV_DIR_GRADIENT && c->codec_grad == DEV_CODEC_TOPK) {
        h.codec = DEV_CODEC_TOPK; /* an index beside each value: larger than none near k = n */
        h.k = h.dims[0];
        size_t topk = dev_frame_max_len(&h);
        one = topk > one ? topk : one;
    }
    return per_step * (one + PREFIX);
}

/* Keys of a flow that crosses the network: this end sends or receives. */
static int flow_init(dev_net *n, flow *f, int from, int to, int mode, sl_err *err)
{
    f->from = from;
    f->to = to;
    pthread_mutex_init(&f->txmu, NULL);
    if (mode == L_LOCAL || mode == L_OTHER)
        return 0;
    int sending = local(n, from);
    int peer = sending ? to : from;
    dev_link_cfg lc = {.job_id = n->c.job, .epoch = n->c.epoch, .from_stage = (uint16_t)from,
                       .to_stage = (uint16_t)to, .sealed = n->c.sealed, .max_payload = 0};
    if (sending) {
        if (dev_link_tx_init(&f->tx, &lc, n->c.self_kp, n->stage[peer].link_key, err))
            return -1;
        f->tx_ok = 1;
    } else {
        if (dev_link_rx_init(&f->rx, &lc, n->c.self_kp, n->stage[peer].link_key, err))
            return -1;
        f->rx_ok = 1;
        int a = from < to ? from : to, b = from < to ? to : from;
        static const int dirs[NK] = {DEV_DIR_ACTIVATION, DEV_DIR_GRADIENT, DEV_DIR_MASK,
                                     DEV_DIR_LABELS, DEV_DIR_TIED, DEV_DIR_GATHER,
                                     DEV_DIR_GATHER_RESULT, DEV_DIR_SYNC};
        for (int k = 0; k < NK; k++)
            f->max_queued[k] = kind_budget(n, a, b, from < to, dirs[k]);
    }
    return 0;
}

dev_net *dev_net_open(const dev_net_cfg *c, sl_err *err)
{
    int p = c->stages;
    if (p < 1 || p > 65535 || c->depth < 1) {
        sl_err_set(err, SL_EINVAL, "a pipeline of %d stages and %d micro-batches", p, c->depth);
        return NULL;
    }
    int fed = c->replicas >= 2;
    if (fed && (c->replicas > DEV_SYNC_MAX_REPLICAS || !c->model ||
                c->sync.replicas != c->replicas)) {
        sl_err_set(err, SL_EINVAL, "a federation of %d replicas needs its model and sync", c->replicas);
        return NULL;
    }
    dev_net *n = sl_xcalloc(1, sizeof *n);
    n->c = *c;
    n->stage = sl_xmalloc((size_t)p * sizeof *n->stage);
    memcpy(n->stage, c->stage, (size_t)p * sizeof *n->stage);
    n->c.stage = n->stage;
    if (!n->c.connect_timeout_ms)
        n->c.connect_timeout_ms = 60000;
    pthread_mutex_init(&n->mu, NULL);
    pthread_cond_init(&n->cv, NULL);
    for (int i = 0; i < p; i++)
        n->nlocal += local(n, i);
    if (fed) {
        size_t total;
        if (n->nlocal > DEV_SYNC_ROUND_MAX) {
            sl_err_set(err, SL_EINVAL, "%d stages on this device, a federation's device holds at "
                       "most %d", n->nlocal, DEV_SYNC_ROUND_MAX);
            dev_net_free(n);
            return NULL;
        }
        if (dev_model_layout(c->model, 0, dev_unit_head(c->model), &n->layout, &n->nlayout,
                             &total, err)) {
            dev_net_free(n);
            return NULL;
        }
        for (int i = 0; i < p; i++)
            if (n->stage[i].first_unit < 0 || n->stage[i].last_unit < n->stage[i].first_unit ||
                n->stage[i].last_unit > dev_unit_head(c->model)) {
                sl_err_set(err, SL_EINVAL, "stage %d: units %d..%d of a model of %d", i,
                           n->stage[i].first_unit, n->stage[i].last_unit,
                           dev_unit_count(c->model));
                dev_net_free(n);
                return NULL;
            }
    }
    /* the links as dev_exch_link has them: each chain, its side link of the
     * tied gradient when first and last are not neighbours, the sync links */
    int nl = 0;
    for (int a = 0; a < p; a++)
        for (int b = a + 1; b < p; b++)
            nl += dev_exch_link(&n->c, a, b);
    n->links = sl_xcalloc((size_t)nl + 1, sizeof *n->links);
    for (int a = 0; a < p; a++)
        for (int b = a + 1; b < p; b++) {
            if (!dev_exch_link(&n->c, a, b))
                continue;
            link *l = &n->links[n->nlinks++];
            l->n = n;
            l->a = a;
            l->b = b;
            int la = local(n, a), lb = local(n, b);
            l->mode = la && lb ? L_LOCAL : la ? L_CLIENT : lb ? L_SERVER : L_OTHER;
            l->state = l->mode == L_LOCAL ? 1 : 0;
            l->sender_done = l->receiver_done = 1; /* until dev_net_start starts them */
            if (flow_init(n, &l->down, a, b, l->mode, err) ||
                flow_init(n, &l->up, b, a, l->mode, err)) {
                dev_net_free(n);
                return NULL;
            }
            if (n->c.codec_grad == DEV_CODEC_TOPK && l->mode == L_SERVER &&
                dev_topk_ef_init(&l->up.ef, c->act_floats, err) == 0)
                l->up.ef_ok = 1;
        }
    /* a Stage server takes DEV_STAGE_STREAMS_PER_PEER streams from one
     * device: half of them for one plan's links, the rest for the previous
     * epoch's while they close, and retries */
    for (int i = 0; fed && i < n->nlinks; i++) {
        const char *peer = peer_of(n, &n->links[i]);
        int with = 0;
        for (int k = 0; k < n->nlinks; k++)
            with += (n->links[k].mode == L_CLIENT || n->links[k].mode == L_SERVER) &&
                    !strcmp(peer_of(n, &n->links[k]), peer);
        if (with > DEV_STAGE_STREAMS_PER_PEER / 2) {
            sl_err_set(err, SL_EINVAL, "the plan has %d links between this device and %s, more "
                       "than the %d a Stage server takes from one device in a plan", with, peer,
                       DEV_STAGE_STREAMS_PER_PEER / 2);
            dev_net_free(n);
            return NULL;
        }
    }
    n->ports = sl_xcalloc((size_t)p, sizeof *n->ports);
    for (int i = 0; i < p; i++) {
        int first = 0, cn = p;
        if (fed) {
            first = i;
            while (first > 0 && n->stage[first - 1].replica == n->stage[i].replica)
                first--;
            for (cn = 1; first + cn < p && n->stage[first + cn].replica == n->stage[i].replica;)
                cn++;
        }
        n->ports[i] = (nport){.base = {.ops = &net_ops, .stages = cn, .index = i - first}, .n = n,
                              .first = first};
    }
    if (fed) {
        n->syncs = sl_xcalloc((size_t)p, sizeof *n->syncs);
        for (int i = 0, slot = 0; i < p; i++)
            if (local(n, i))
                n->syncs[i] = (nsync){.base = {.ops = &sync_ops, .c = c->sync,
                                               .replica = n->stage[i].replica,
                                               .stage = n->ports[i].base.index},
                                      .n = n, .g = i, .slot = slot++};
    }
    return n;
}

dev_port *dev_net_port(dev_net *n, int i)
{
    return i >= 0 && i < n->c.stages && local(n, i) ? &n->ports[i].base : NULL;
}

dev_sync *dev_net_sync(dev_net *n, int i)
{
    return n->syncs && i >= 0 && i < n->c.stages && local(n, i) ? &n->syncs[i].base : NULL;
}

/* ---- sending ------------------------------------------------------------------ */

static size_t dtype_size(int dtype) { return dev_frame_dtype_size(dtype); }

/* Queues one message on a flow: a frame on the network, a copy in memory. */
static int put(dev_net *n, link *l, flow *f, dev_frame_hdr *h, const void *data, int stage,
               sl_err *err)
{
    size_t elems = dev_frame_elems(h), raw = elems * dtype_size(h->dtype);
    if (l->mode == L_LOCAL) {
        qmsg *q = sl_xcalloc(1, sizeof *q);
        q->h = *h;
        q->h.epoch = n->c.epoch;
        q->nbytes = raw;
        q->data = sl_try_malloc(raw ? raw : 1);
        if (!q->data) {
            free(q);
            return sl_err_set(err, SL_ENOMEM, "stage %d: %zu bytes for a message", stage, raw);
        }
        memcpy(q->data, data, raw);
        int k = kind_of(h->direction);
        pthread_mutex_lock(&n->mu);
        int rc = n->aborted ? stopped(n, stage, err) : 0;
        if (!rc) {
            if (f->qt[k])
                f->qt[k]->next = q;
            else
                f->qh[k] = q;
            f->qt[k] = q;
            f->raw += raw;
            f->got[k]++;
            pthread_cond_broadcast(&n->cv);
        }
        pthread_mutex_unlock(&n->mu);
        if (rc) {
            free(q->data);
            free(q);
        }
        return rc;
    }
    omsg *o = sl_xcalloc(1, sizeof *o);
    size_t cap = dev_frame_max_len(h);
    if (cap == 0) {
        free(o);
        return sl_err_set(err, SL_EINVAL, "stage %d: a %s that no frame can carry", stage,
                          kind_name[kind_of(h->direction)]);
    }
    rpc_msg_alloc(&o->m, cap + PREFIX);
    size_t len = 0;
    pthread_mutex_lock(&f->txmu);
    int rc = dev_frame_encode_any(&f->tx, h, data, f->ef_ok ? &f->ef : NULL, o->m.data + PREFIX,
                                  cap, &len, err);
    pthread_mutex_unlock(&f->txmu);
    if (rc) {
        rpc_msg_free(&o->m);
        free(o);
        return sl_err_wrap(err, "stage %d", stage);
    }
    uint8_t tag[PREFIX];
    size_t pre = rpc_frame_wrap(tag, len);
    memcpy(o->m.data + PREFIX - pre, tag, pre);
    o->off = PREFIX - pre;
    o->len = pre + len;
    pthread_mutex_lock(&n->mu);
    rc = n->aborted ? stopped(n, stage, err) : 0;
    if (!rc) {
        if (l->ot)
            l->ot->next = o;
        else
            l->oh = o;
        l->ot = o;
        f->raw += raw;
        f->wire += o->len;
        pthread_cond_broadcast(&n->cv);
    }
    pthread_mutex_unlock(&n->mu);
    if (rc) {
        rpc_msg_free(&o->m);
        free(o);
    }
    return rc;
}

/* ---- receiving ------------------------------------------------------------------ */

static void refuse_count(dev_net *n, int reason)
{
    if (reason > 0 && reason < DEV_FR_NREASONS)
        n->refused[reason]++;
}

/* Takes the next message of a kind from a flow into dst and checks it is the
 * one expected (step, micro-batch, shape). A frame that fails its checks is
 * refused, counted and dropped, and the next one is awaited. */
static int take(dev_net *n, link *l, flow *f, int dir, uint64_t step, int mb, int dtype,
                const uint32_t *dims, int ndim, void *dst, uint64_t *aux, int stage, sl_err *err)
{
    int k = kind_of(dir);
    size_t want = dtype_size(dtype);
    for (int d = 0; d < ndim; d++)
        want *= dims[d];
    for (;;) {
        pthread_mutex_lock(&n->mu);
        while (!n->aborted && !f->qh[k] && l->state != 2)
            pthread_cond_wait(&n->cv, &n->mu);
        qmsg *q = f->qh[k];
        int rc = 0;
        if (q) {
            f->qh[k] = q->next;
            if (!f->qh[k])
                f->qt[k] = NULL;
            f->queued[k] -= q->buf.len;
        } else if (n->aborted) {
            rc = stopped(n, stage, err);
        } else {
            /* a neighbour closes its side only once it sent all it had: an
             * end while a frame is still due means it went away */
            rc = sl_err_set(err, SL_EIO, "stage %d: the link to stage %d ended before its %s came",
                            stage, f->from, kind_name[k]);
            abort_lost_locked(n, n->stage[local(n, l->a) ? l->b : l->a].device, err->msg);
        }
        pthread_mutex_unlock(&n->mu);
        if (rc)
            return -1;
        dev_frame_hdr h;
        sl_err ferr = {0};
        int ok;
        if (l->mode == L_LOCAL) {
            h = q->h;
            ok = q->nbytes == want;
            if (ok)
                memcpy(dst, q->data, want);
        } else {
            ok = dev_frame_decode_any(&f->rx, q->frame, q->len, &h, dst, want, &ferr) == 0;
            if (!ok) {
                pthread_mutex_lock(&n->mu);
                refuse_count(n, f->rx.last);
                pthread_mutex_unlock(&n->mu);
            }
        }
        rpc_buf_free(&q->buf);
        free(q->data);
        free(q);
        if (ok && (h.direction != dir || h.dtype != dtype || h.step != step ||
                   (mb >= 0 && h.microbatch != mb) || h.ndim != ndim ||
                   memcmp(h.dims, dims, (size_t)ndim * sizeof *dims))) {
            snprintf(ferr.msg, sizeof ferr.msg, "a %s of step %llu micro-batch %u where step %llu "
                     "micro-batch %d was expected", kind_name[k], (unsigned long long)h.step,
                     h.microbatch, (unsigned long long)step, mb);
            ok = 0;
            pthread_mutex_lock(&n->mu);
            refuse_count(n, DEV_FR_MISROUTED);
            pthread_mutex_unlock(&n->mu);
        }
        if (ok) {
            if (aux)
                *aux = h.aux;
            return 0;
        }
        sl_log_warn("device: frame refused", "stage=%d from=%d kind=%s reason=\"%s\"", stage,
                    f->from, kind_name[k], ferr.msg);
    }
}

/* Waits for the next message of a kind and returns its first dimension
 * (the gather's length), 0 if none came. */
static uint32_t peek_len(dev_net *n, link *l, flow *f, int k)
{
    pthread_mutex_lock(&n->mu);
    while (!n->aborted && !f->qh[k] && l->state != 2)
        pthread_cond_wait(&n->cv, &n->mu);
    qmsg *q = f->qh[k];
    uint32_t len = 0;
    if (q && l->mode == L_LOCAL) {
        len = q->h.dims[0];
    } else if (q) {
        dev_frame_hdr h;
        if (dev_frame_parse_header(q->frame, q->len, 0, &h, NULL, NULL) == 0)
            len = h.dims[0];
    } else if (!n->aborted) { /* the link ended with a frame still due (see take) */
        char why[200];
        const char *peer = n->stage[local(n, l->a) ? l->b : l->a].device;
        snprintf(why, sizeof why, "the link between stages %d and %d (device %s) ended before "
                 "its %s came", l->a, l->b, peer, kind_name[k]);
        abort_lost_locked(n, peer, why);
    }
    pthread_mutex_unlock(&n->mu);
    return len;
}

/* The receiving loop of a network link (client: its own thread; server:
 * the Stage handler's thread). Frames are only parsed here, to be queued by
 * kind; the stage that takes one authenticates and opens it. */
static void receive_loop(link *l, flow *in)
{
    dev_net *n = l->n;
    for (;;) {
        rpc_buf b;
        sl_err err = {0};
        int r = rpc_stream_recv(l->st, &b, &err);
        if (r <= 0) {
            /* the other end closed its side (it is done with the job) or the
             * stream failed; a stage still waiting for data from this link
             * fails then, in take() */
            pthread_mutex_lock(&n->mu);
            l->state = 2;
            if (r < 0 && !n->closing && !n->aborted) {
                char why[300];
                const char *peer = n->stage[local(n, l->a) ? l->b : l->a].device;
                snprintf(why, sizeof why, "the link between stages %d and %d (device %s) ended%s%.200s",
                         l->a, l->b, peer, r < 0 ? ": " : "", r < 0 ? err.msg : "");
                abort_lost_locked(n, peer, why);
            }
            pthread_cond_broadcast(&n->cv);
            pthread_mutex_unlock(&n->mu);
            return;
        }
        const uint8_t *fr;
        size_t fl;
        dev_frame_hdr h;
        sl_err ferr = {0};
        int why = dev_exch_frame_in(&n->c, l->a, l->b, in == &l->down, b.data, b.len, &fr, &fl,
                                    &h, &ferr);
        int k = why == DEV_FR_OK ? kind_of(h.direction) : -1;
        pthread_mutex_lock(&n->mu);
        if (k < 0) {
            if (why == DEV_FR_OK)
                why = DEV_FR_BAD_HEADER;
            refuse_count(n, why);
            pthread_mutex_unlock(&n->mu);
            sl_log_warn("device: frame refused", "link=%d-%d reason=\"%s: %s\"", l->a, l->b,
                        dev_frame_reason_name(why), ferr.msg);
            rpc_buf_free(&b);
            continue;
        }
        if (b.len > in->max_queued[k] - in->queued[k]) {
            /* a neighbour that runs further ahead than the plan lets it:
             * what does not fit is refused, never queued */
            refuse_count(n, DEV_FR_QUEUE_FULL);
            uint64_t nfull = n->refused[DEV_FR_QUEUE_FULL];
            size_t queued = in->queued[k], cap = in->max_queued[k];
            pthread_mutex_unlock(&n->mu);
            if ((nfull & (nfull - 1)) == 0) /* the 1st, 2nd, 4th, 8th, ... */
                sl_log_warn("device: frame refused", "link=%d-%d kind=%s reason=\"queue full: "
                            "%zu bytes queued, %zu more do not fit under %zu\" refused=%llu", l->a,
                            l->b, kind_name[k], queued, b.len, cap, (unsigned long long)nfull);
            rpc_buf_free(&b);
            continue;
        }
        in->queued[k] += b.len;
        qmsg *q = sl_xcalloc(1, sizeof *q);
        q->buf = b;
        q->frame = fr;
        q->len = fl;
        if (in->qt[k])
            in->qt[k]->next = q;
        else
            in->qh[k] = q;
        in->qt[k] = q;
        in->got[k]++;
        pthread_cond_broadcast(&n->cv);
        pthread_mutex_unlock(&n->mu);
    }
}

static void *receiver_main(void *arg)
{
    link *l = arg;
    receive_loop(l, &l->up);
    pthread_mutex_lock(&l->n->mu);
    l->receiver_done = 1;
    pthread_cond_broadcast(&l->n->cv);
    pthread_mutex_unlock(&l->n->mu);
    return NULL;
}

/* Sends queued frames until the link closes (all sent) or the net stops. */
static int send_loop(link *l)
{
    dev_net *n = l->n;
    for (;;) {
        pthread_mutex_lock(&n->mu);
        while (!n->aborted && !l->oh && !n->closing)
            pthread_cond_wait(&n->cv, &n->mu);
        omsg *o = l->oh;
        if (o) {
            l->oh = o->next;
            if (!l->oh)
                l->ot = NULL;
        }
        int done = n->aborted || (!o && n->closing);
        pthread_mutex_unlock(&n->mu);
        if (!o || done) {
            if (o) {
                rpc_msg_free(&o->m);
                free(o);
            }
            return n->aborted ? -1 : 0;
        }
        sl_err err = {0};
        int rc = rpc_stream_send_msg(l->st, &o->m, o->off, o->len, &err);
        free(o);
        if (rc) {
            char why[300];
            const char *peer = n->stage[local(n, l->a) ? l->b : l->a].device;
            snprintf(why, sizeof why, "sending to stage %d (device %s): %.200s",
                     local(n, l->a) ? l->b : l->a, peer, err.msg);
            pthread_mutex_lock(&n->mu);
            abort_lost_locked(n, peer, why);
            pthread_mutex_unlock(&n->mu);
            return -1;
        }
    }
}

/* The server's answer: the hello of the link as sent. */
static int hello_matches(const dev_net *n, const link *l, const rpc_buf *b)
{
    dev_exch_hello h;
    sl_err err = {0};
    return dev_exch_hello_parse(b->data, b->len, &h, &err) == DEV_EXCH_OK && h.job == n->c.job &&
           h.epoch == n->c.epoch && h.from == (uint32_t)l->a && h.to == (uint32_t)l->b;
}

/* Client: open the stream and have the hello answered, retrying while the
 * neighbour is not there yet (not started, or not yet serving this job).
 * The stream being opened is on the link (l->connecting) so that an abort
 * interrupts it, and each attempt's waits are bounded by the hello's time. */
static int connect_link(link *l, sl_err *err)
{
    dev_net *n = l->n;
    const dev_net_stage *peer = &n->stage[l->b];
    double deadline = sl_now_s() + n->c.connect_timeout_ms / 1000.0;
    int backoff_ms = 50;
    char last[400] = "no attempt";
    if (!(l->ch = dev_stagesvc_connect(n->c.state, peer->address, peer->device, MAX_MESSAGE, err)))
        return -1;
    for (;;) {
        sl_err e = {0};
        rpc_stream *st = rpc_stream_new(l->ch, RPC_M_STAGE_EXCHANGE, STREAM_LIFE_MS, &e);
        pthread_mutex_lock(&n->mu);
        int stop = n->aborted;
        if (!stop)
            l->connecting = st;
        pthread_mutex_unlock(&n->mu);
        if (stop) {
            rpc_stream_cancel(st);
            return stopped(n, l->a, err);
        }
        if (st) {
            rpc_stream_set_idle(st, DEV_EXCH_HELLO_MS);
            rpc_buf hb = {0}, ack = {0};
            dev_exch_hello_pack(n->c.job, n->c.epoch, (uint32_t)l->a, (uint32_t)l->b, &hb);
            int r = rpc_stream_start(st, &e) == 0 && rpc_stream_send(st, hb.data, hb.len, &e) == 0
                        ? rpc_stream_recv(st, &ack, &e)
                        : -1;
            rpc_buf_free(&hb);
            int ok = r == 1 && hello_matches(n, l, &ack);
            rpc_buf_free(&ack);
            pthread_mutex_lock(&n->mu);
            l->connecting = NULL;
            if (ok && !n->aborted) {
                rpc_stream_set_idle(st, 0); /* the link's waits are the pipeline's */
                l->st = st;
                l->state = 1;
                pthread_cond_broadcast(&n->cv);
                pthread_mutex_unlock(&n->mu);
                return 0;
            }
            if (n->aborted)
                rpc_stream_interrupt(st);
            pthread_mutex_unlock(&n->mu);
            rpc_status rs = {0};
            int code = rpc_stream_finish(st, &rs); /* bounded: the idle limit is still set */
            snprintf(last, sizeof last, "%s: %s", rpc_code_name(code), rs.details);
            if (code != RPC_UNAVAILABLE && code != RPC_FAILED_PRECONDITION &&
                code != RPC_DEADLINE_EXCEEDED && code != RPC_OK && code != RPC_CANCELLED &&
                code != RPC_RESOURCE_EXHAUSTED)
                return sl_err_set(err, SL_EIO, "stage %d to %d (device %s at %s): %s", l->a, l->b,
                                  peer->device, peer->address, last);
        } else {
            snprintf(last, sizeof last, "%.380s", e.msg);
        }
        if (sl_now_s() > deadline)
            return sl_err_set(err, SL_EIO, "stage %d could not reach stage %d (device %s at %s) "
                              "within %d s: %s", l->a, l->b, peer->device, peer->address,
                              n->c.connect_timeout_ms / 1000, last);
        /* the backoff waits on the net: an abort ends it */
        pthread_mutex_lock(&n->mu);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)backoff_ms * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        if (!n->aborted)
            pthread_cond_timedwait(&n->cv, &n->mu, &ts);
        pthread_mutex_unlock(&n->mu);
        backoff_ms = backoff_ms < 1000 ? 2 * backoff_ms : 1000;
    }
}

static void sender_end(link *l)
{
    pthread_mutex_lock(&l->n->mu);
    l->sender_done = 1;
    pthread_cond_broadcast(&l->n->cv);
    pthread_mutex_unlock(&l->n->mu);
}

static void *sender_main(void *arg)
{
    link *l = arg;
    dev_net *n = l->n;
    sl_err err = {0};
    if (connect_link(l, &err)) {
        pthread_mutex_lock(&n->mu);
        abort_lost_locked(n, n->stage[l->b].device, err.msg);
        pthread_mutex_unlock(&n->mu);
        sender_end(l);
        return NULL;
    }
    pthread_mutex_lock(&n->mu);
    l->receiver_done = 0;
    if (pthread_create(&l->receiver, NULL, receiver_main, l) == 0) {
        l->has_receiver = 1;
        pthread_mutex_unlock(&n->mu);
    } else {
        l->receiver_done = 1;
        pthread_mutex_unlock(&n->mu);
        dev_net_abort(n, "cannot start a receiving thread");
        sender_end(l);
        return NULL;
    }
    if (send_loop(l) == 0) { /* closing: no more frames from this end */
        sl_err e = {0};
        rpc_stream_close_send(l->st, &e);
    }
    sender_end(l);
    return NULL;
}

int dev_net_start(dev_net *n, sl_err *err)
{
    for (int i = 0; i < n->nlinks; i++) {
        link *l = &n->links[i];
        if (l->mode != L_CLIENT)
            continue;
        pthread_mutex_lock(&n->mu);
        l->sender_done = 0;
        pthread_mutex_unlock(&n->mu);
        if (pthread_create(&l->sender, NULL, sender_main, l)) {
            pthread_mutex_lock(&n->mu);
            l->sender_done = 1;
            pthread_mutex_unlock(&n->mu);
            dev_net_abort(n, "cannot start a sending thread");
            return sl_err_set(err, SL_ENOMEM, "cannot start a sending thread");
        }
        l->has_sender = 1;
    }
    return 0;
}

/* ---- the server side ---------------------------------------------------------- */

static void *server_sender_main(void *arg)
{
    link *l = arg;
    send_loop(l);
    return NULL;
}

int dev_net_accept(dev_net *n, const char *peer_id, const dev_exch_hello *h, rpc_stream *s,
                   rpc_status *st)
{
    int from, to;
    sl_err herr = {0};
    int refusal = dev_exch_hello_check(&n->c, peer_id, h, &from, &to, &herr);
    if (refusal)
        return rpc_status_set(st, dev_exch_refusal_code(refusal), "%s", herr.msg);
    link *l = link_of(n, from, to);
    if (!l || l->mode != L_SERVER)
        return rpc_status_set(st, RPC_INTERNAL, "link %d-%d is not served here", from, to);
    pthread_mutex_lock(&n->mu);
    if (l->serving || l->state != 0 || n->aborted) {
        pthread_mutex_unlock(&n->mu);
        return rpc_status_set(st, RPC_ALREADY_EXISTS, "link %d-%d is already served", from, to);
    }
    l->serving = 1;
    l->st = s; /* from here an abort interrupts the stream */
    pthread_mutex_unlock(&n->mu);
    rpc_buf ack = {0};
    dev_exch_hello_pack(n->c.job, n->c.epoch, (uint32_t)from, (uint32_t)to, &ack);
    sl_err err = {0};
    int rc = rpc_stream_send(s, ack.data, ack.len, &err);
    rpc_buf_free(&ack);
    if (rc) {
        pthread_mutex_lock(&n->mu);
        l->serving = 0;
        l->st = NULL;
        pthread_cond_broadcast(&n->cv);
        pthread_mutex_unlock(&n->mu);
        return rpc_status_set(st, RPC_UNAVAILABLE, "%s", err.msg);
    }
    pthread_mutex_lock(&n->mu);
    l->state = 1;
    if (n->aborted)
        rpc_stream_interrupt(s);
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
    pthread_t snd;
    int have_snd = pthread_create(&snd, NULL, server_sender_main, l) == 0;
    if (!have_snd)
        dev_net_abort(n, "cannot start a sending thread");
    receive_loop(l, &l->down);
    /* the client closed (or the net stopped): the sender ends once this
     * device closes its links or the net is aborted */
    if (have_snd)
        pthread_join(snd, NULL);
    pthread_mutex_lock(&n->mu);
    l->st = NULL;
    l->state = 2;
    l->serving = 0;
    int aborted = n->aborted;
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
    return aborted ? rpc_status_set(st, RPC_ABORTED, "%s", n->why) : RPC_OK;
}

/* ---- closing -------------------------------------------------------------------- */

/* A client link's stream, taken out of the link under the lock before it is
 * finished or cancelled (and freed): an abort from another thread (a "stop"
 * task) must not interrupt a call being freed. NULL for a server link, whose
 * stream belongs to its handler. *aborted: whether the net was aborted. */
static rpc_stream *take_client_stream(dev_net *n, link *l, int *aborted)
{
    pthread_mutex_lock(&n->mu);
    rpc_stream *st = l->mode == L_CLIENT ? l->st : NULL;
    if (st)
        l->st = NULL;
    *aborted = n->aborted;
    pthread_mutex_unlock(&n->mu);
    return st;
}

/* Whether every link has ended its part: server links no longer served,
 * client links' sender and receiver done. Under n->mu. */
static int links_done_locked(const dev_net *n)
{
    for (int i = 0; i < n->nlinks; i++) {
        const link *l = &n->links[i];
        if ((l->mode == L_SERVER && l->serving) ||
            (l->mode == L_CLIENT && (!l->sender_done || !l->receiver_done)))
            return 0;
    }
    return 1;
}

int dev_net_close(dev_net *n, int timeout_ms, sl_err *err)
{
    /* this device sends what is queued and half-closes its streams; the
     * links end when the other ends close theirs. Past the deadline (a
     * neighbour that never closes, or never reads) the net is aborted, which
     * interrupts every stream, so nothing below waits for a peer. */
    pthread_mutex_lock(&n->mu);
    n->closing = 1;
    pthread_cond_broadcast(&n->cv);
    double deadline = sl_now_s() + timeout_ms / 1000.0;
    while (!n->aborted && !links_done_locked(n)) {
        if (sl_now_s() > deadline) {
            abort_locked(n, "the job's links did not close in time");
            break;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&n->cv, &n->mu, &ts);
    }
    pthread_mutex_unlock(&n->mu);
    for (int i = 0; i < n->nlinks; i++) {
        link *l = &n->links[i];
        if (l->has_sender)
            pthread_join(l->sender, NULL);
        l->has_sender = 0;
        if (l->has_receiver)
            pthread_join(l->receiver, NULL);
        l->has_receiver = 0;
        int aborted;
        rpc_stream *st = take_client_stream(n, l, &aborted);
        if (st) {
            rpc_status rs = {0};
            if (aborted)
                rpc_stream_interrupt(st);
            rpc_stream_set_idle(st, DEV_EXCH_HELLO_MS);
            rpc_stream_finish(st, &rs);
        }
    }
    char why[320];
    if (dev_net_aborted(n, why, sizeof why))
        return sl_err_set(err, SL_EIO, "%s", why);
    return 0;
}

void dev_net_free(dev_net *n)
{
    if (!n)
        return;
    dev_net_abort(n, "closed");
    for (int i = 0; i < n->nlinks; i++) {
        link *l = &n->links[i];
        if (l->has_sender)
            pthread_join(l->sender, NULL);
        if (l->has_receiver)
            pthread_join(l->receiver, NULL);
        /* a server link's stream belongs to its handler, which is gone
         * before the net is freed (the node waits for it) */
        int aborted;
        rpc_stream_cancel(take_client_stream(n, l, &aborted));
        if (l->ch)
            rpc_channel_destroy(l->ch);
        while (l->oh) {
            omsg *o = l->oh;
            l->oh = o->next;
            rpc_msg_free(&o->m);
            free(o);
        }
        flow_free(&l->down);
        flow_free(&l->up);
    }
    free(n->links);
    free(n->ports);
    free(n->syncs);
    free(n->layout);
    free(n->stage);
    pthread_cond_destroy(&n->cv);
    pthread_mutex_destroy(&n->mu);
    free(n);
}

void dev_net_take_bytes(dev_net *n, int i, dev_net_bytes *b)
{
    memset(b, 0, sizeof *b);
    pthread_mutex_lock(&n->mu);
    for (int k = 0; k < n->nlinks; k++) {
        link *l = &n->links[k];
        flow *fl[2] = {&l->down, &l->up};
        for (int d = 0; d < 2; d++) {
            flow *f = fl[d];
            if (f->from != i)
                continue;
            uint64_t wire = l->mode == L_LOCAL ? f->raw : f->wire;
            int cn, first = n->ports[i].first;
            cn = n->ports[i].base.stages;
            int chain = l->a >= first && l->b < first + cn &&
                        dev_exch_is_link(cn, l->a - first, l->b - first);
            if (!chain) {
                b->raw_sync += f->raw;
                b->wire_sync += wire;
            } else if (l->b - l->a > 1) {
                b->raw_side += f->raw;
                b->wire_side += wire;
            } else if (f->to > f->from) {
                b->raw_down += f->raw;
                b->wire_down += wire;
            } else {
                b->raw_up += f->raw;
                b->wire_up += wire;
            }
            f->raw = f->wire = 0;
        }
    }
    pthread_mutex_unlock(&n->mu);
}

void dev_net_refused(dev_net *n, uint64_t out[DEV_FR_NREASONS])
{
    pthread_mutex_lock(&n->mu);
    memcpy(out, n->refused, sizeof n->refused);
    pthread_mutex_unlock(&n->mu);
}

uint64_t dev_net_received(dev_net *n, int i, int dir)
{
    int k = kind_of(dir);
    uint64_t total = 0;
    if (k < 0)
        return 0;
    pthread_mutex_lock(&n->mu);
    for (int x = 0; x < n->nlinks; x++) {
        link *l = &n->links[x];
        if (l->down.to == i)
            total += l->down.got[k];
        if (l->up.to == i)
            total += l->up.got[k];
    }
    pthread_mutex_unlock(&n->mu);
    return total;
}

/* ---- the port ---------------------------------------------------------------------- */

static dev_net *net_of(dev_port *p) { return ((nport *)p)->n; }
static uint64_t step_of(dev_port *p) { return ((nport *)p)->step; }

static int np_begin(dev_port *p, uint64_t step, sl_err *err)
{
    dev_net *n = net_of(p);
    ((nport *)p)->step = step;
    pthread_mutex_lock(&n->mu);
    int rc = n->aborted ? stopped(n, p->index, err) : 0;
    pthread_mutex_unlock(&n->mu);
    return rc;
}

static dev_frame_hdr hdr(int dir, int codec, int dtype, uint64_t step, int mb, uint64_t aux,
                         int ndim, uint32_t d0, uint32_t d1, uint32_t d2)
{
    dev_frame_hdr h;
    memset(&h, 0, sizeof h);
    h.direction = (uint8_t)dir;
    h.codec = (uint8_t)codec;
    h.dtype = (uint8_t)dtype;
    h.step = step;
    h.microbatch = (uint16_t)mb;
    h.aux = aux;
    h.ndim = (uint8_t)ndim;
    h.dims[0] = d0;
    h.dims[1] = d1;
    h.dims[2] = d2;
    return h;
}

static int np_send_act(dev_port *p, int mb, const float *x, size_t nx, const int32_t *valid,
                       size_t nvalid, sl_err *err)
{
    dev_net *n = net_of(p);
    link *l = link_of(n, gi(p), gi(p) + 1);
    if (p->index + 1 >= p->stages || !l || nvalid == 0 || nx % nvalid)
        return sl_err_set(err, SL_EINVAL, "stage %d sends no activation", gi(p));
    uint64_t s = step_of(p);
    dev_frame_hdr hm = hdr(DEV_DIR_MASK, DEV_CODEC_NONE, DEV_DTYPE_I32, s, mb, 0, 1,
                           (uint32_t)nvalid, 0, 0);
    dev_frame_hdr ha = hdr(DEV_DIR_ACTIVATION, n->c.codec_act, DEV_DTYPE_F32, s, mb, 0, 2,
                           (uint32_t)nvalid, (uint32_t)(nx / nvalid), 0);
    return put(n, l, &l->down, &hm, valid, gi(p), err) ||
           put(n, l, &l->down, &ha, x, gi(p), err);
}

static int np_recv_act(dev_port *p, int mb, float *x, size_t nx, int32_t *valid, size_t nvalid,
                       sl_err *err)
{
    dev_net *n = net_of(p);
    link *l = p->index > 0 ? link_of(n, gi(p) - 1, gi(p)) : NULL;
    if (!l || nvalid == 0 || nx % nvalid)
        return sl_err_set(err, SL_EINVAL, "stage %d receives no activation", gi(p));
    uint64_t s = step_of(p);
    uint32_t dm[1] = {(uint32_t)nvalid}, da[2] = {(uint32_t)nvalid, (uint32_t)(nx / nvalid)};
    return take(n, l, &l->down, DEV_DIR_MASK, s, mb, DEV_DTYPE_I32, dm, 1, valid, NULL, gi(p),
                err) ||
           take(n, l, &l->down, DEV_DIR_ACTIVATION, s, mb, DEV_DTYPE_F32, da, 2, x, NULL,
                gi(p), err);
}

/* Activations and gradients cross as (tokens, hidden): the int8 codec
 * scales each token's row. */
static int np_send_grad(dev_port *p, int mb, const float *g, size_t ng, sl_err *err)
{
    dev_net *n = net_of(p);
    link *l = p->index > 0 ? link_of(n, gi(p) - 1, gi(p)) : NULL;
    if (!l)
        return sl_err_set(err, SL_EINVAL, "stage %d sends no gradient", gi(p));
    size_t rows = n->c.mask_ints ? n->c.mask_ints : 1;
    if (ng % rows)
        rows = 1;
    dev_frame_hdr h = hdr(DEV_DIR_GRADIENT, n->c.codec_grad, DEV_DTYPE_F32, step_of(p), mb, 0, 2,
                          (uint32_t)rows, (uint32_t)(ng / rows), 0);
    if (n->c.codec_grad == DEV_CODEC_TOPK)
        h.k = (uint32_t)dev_topk_k(ng, n->c.topk);
    return put(n, l, &l->up, &h, g, gi(p), err);
}

static int np_recv_grad(dev_port *p, int mb, float *g, size_t ng, sl_err *err)
{
    dev_net *n = net_of(p);
    link *l = p->index + 1 < p->stages ? link_of(n, gi(p), gi(p) + 1) : NULL;
    if (!l)
        return sl_err_set(err, SL_EINVAL, "stage %d receives no gradient", gi(p));
    size_t rows = n->c.mask_ints ? n->c.mask_ints : 1;
    if (ng % rows)
        rows = 1;
    uint32_t d[2] = {(uint32_t)rows, (uint32_t)(ng / rows)};
    return take(n, l, &l->up, DEV_DIR_GRADIENT, step_of(p), mb, DEV_DTYPE_F32, d, 2, g, NULL,
                gi(p), err);
}

static int np_send_labels(dev_port *p, const int32_t *labels, size_t nl, int masked, sl_err *err)
{
    dev_net *n = net_of(p);
    link *l = side_link(n, p);
    if (!l || p->index != 0)
        return sl_err_set(err, SL_EINVAL, "stage %d sends no labels", gi(p));
    dev_frame_hdr h = hdr(DEV_DIR_LABELS, DEV_CODEC_NONE, DEV_DTYPE_I32, step_of(p), 0,
                          (uint64_t)masked, 1, (uint32_t)nl, 0, 0);
    return put(n, l, &l->down, &h, labels, gi(p), err);
}

static int np_recv_labels(dev_port *p, int32_t *labels, size_t nl, int *masked, sl_err *err)
{
    dev_net *n = net_of(p);
    link *l = side_link(n, p);
    if (!l || p->index != p->stages - 1)
        return sl_err_set(err, SL_EINVAL, "stage %d receives no labels", gi(p));
    uint32_t d[1] = {(uint32_t)nl};
    uint64_t aux = 0;
    if (take(n, l, &l->down, DEV_DIR_LABELS, step_of(p), 0, DEV_DTYPE_I32, d, 1, labels, &aux,
             gi(p), err))
        return -1;
    if (aux > nl)
        return sl_err_set(err, SL_ECORRUPT, "stage %d: %llu masked tokens among %zu labels",
                          gi(p), (unsigned long long)aux, nl);
    *masked = (int)aux;
    return 0;
}

static int np_tied(dev_port *p, const float *mine, float *theirs, size_t nt, sl_err *err)
{
    dev_net *n = net_of(p);
    link *l = side_link(n, p);
    int first = p->index == 0;
    if (!l || (!first && p->index != p->stages - 1))
        return sl_err_set(err, SL_EINVAL, "stage %d has no tied partner", gi(p));
    uint64_t s = step_of(p);
    dev_frame_hdr h = hdr(DEV_DIR_TIED, DEV_CODEC_NONE, DEV_DTYPE_F32, s, 0, 0, 1, (uint32_t)nt, 0, 0);
    uint32_t d[1] = {(uint32_t)nt};
    return put(n, l, first ? &l->down : &l->up, &h, mine, gi(p), err) ||
           take(n, l, first ? &l->up : &l->down, DEV_DIR_TIED, s, 0, DEV_DTYPE_F32, d, 1, theirs,
                NULL, gi(p), err);
}

/* Down the chain stage by stage, each adding its values; the last has them
 * all and sends the whole back up. */
static int np_gather(dev_port *p, const double *mine, int nm, double *all, int cap, int *n_all,
                     sl_err *err)
{
    dev_net *n = net_of(p);
    int i = gi(p), first = ((nport *)p)->first, last = first + p->stages - 1;
    uint64_t s = step_of(p);
    int have = 0;
    if (i > first) { /* the values so far: their count comes with the frame */
        link *l = link_of(n, i - 1, i);
        uint32_t len = peek_len(n, l, &l->down, K_GATHER);
        if (len == 0 || (int)len + nm > cap)
            return dev_net_aborted(n, NULL, 0) ? stopped(n, i, err)
                                                : sl_err_set(err, SL_ECORRUPT, "stage %d: a gather "
                                                             "of %u values", i, len);
        uint32_t d[1] = {len};
        if (take(n, l, &l->down, DEV_DIR_GATHER, s, 0, DEV_DTYPE_F64, d, 1, all, NULL, i, err))
            return -1;
        have = (int)len;
    }
    if (have + nm > cap)
        return sl_err_set(err, SL_EINVAL, "stage %d: gather of more than %d values", i, cap);
    memcpy(all + have, mine, (size_t)nm * sizeof *mine);
    have += nm;
    if (i < last) {
        link *dn = link_of(n, i, i + 1);
        dev_frame_hdr h = hdr(DEV_DIR_GATHER, DEV_CODEC_NONE, DEV_DTYPE_F64, s, 0, 0, 1,
                              (uint32_t)have, 0, 0);
        if (put(n, dn, &dn->down, &h, all, i, err))
            return -1;
        /* the whole comes back up; its length is the last stage's */
        uint32_t len = peek_len(n, dn, &dn->up, K_GRES);
        if (len == 0 || (int)len > cap)
            return dev_net_aborted(n, NULL, 0) ? stopped(n, i, err)
                                                : sl_err_set(err, SL_ECORRUPT, "stage %d: a gather "
                                                             "result of %u values", i, len);
        uint32_t d[1] = {len};
        if (take(n, dn, &dn->up, DEV_DIR_GATHER_RESULT, s, 0, DEV_DTYPE_F64, d, 1, all, NULL, i, err))
            return -1;
        have = (int)len;
    }
    if (i > first) {
        link *up = link_of(n, i - 1, i);
        dev_frame_hdr h = hdr(DEV_DIR_GATHER_RESULT, DEV_CODEC_NONE, DEV_DTYPE_F64, s, 0, 0, 1,
                              (uint32_t)have, 0, 0);
        if (put(n, up, &up->up, &h, all, i, err))
            return -1;
    }
    *n_all = have;
    return 0;
}

/* ---- the replica sync (a federation) ---------------------------------------------- */

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

/* Takes the next sync frame of a flow into dst (cap bytes): its tensor key
 * (aux) and length. A frame that does not authenticate is refused, counted
 * and the next one awaited (as take does); one of another round, or longer
 * than any payload due on the flow, fails the round. */
static int take_sync(dev_net *n, link *l, flow *f, uint64_t round, uint8_t *dst, size_t cap,
                     uint64_t *key, size_t *len, int stage, sl_err *err)
{
    if (l->mode == L_LOCAL)
        return sl_err_set(err, SL_EINVAL, "stage %d: a sync payload within this device", stage);
    for (;;) {
        pthread_mutex_lock(&n->mu);
        while (!n->aborted && !f->qh[K_SYNC] && l->state != 2)
            pthread_cond_wait(&n->cv, &n->mu);
        qmsg *q = f->qh[K_SYNC];
        int rc = 0;
        if (q) {
            f->qh[K_SYNC] = q->next;
            if (!f->qh[K_SYNC])
                f->qt[K_SYNC] = NULL;
            f->queued[K_SYNC] -= q->buf.len;
        } else if (n->aborted) {
            rc = stopped(n, stage, err);
        } else {
            rc = sl_err_set(err, SL_EIO, "stage %d: the link to stage %d ended before its sync "
                            "payloads came", stage, f->from);
            abort_lost_locked(n, n->stage[f->from].device, err->msg);
        }
        pthread_mutex_unlock(&n->mu);
        if (rc)
            return -1;
        dev_frame_hdr h;
        sl_err ferr = {0};
        int ok = dev_frame_decode_any(&f->rx, q->frame, q->len, &h, dst, cap, &ferr) == 0;
        int reason = ok ? DEV_FR_OK : f->rx.last;
        rpc_buf_free(&q->buf);
        free(q->data);
        free(q);
        if (!ok) {
            pthread_mutex_lock(&n->mu);
            refuse_count(n, reason);
            pthread_mutex_unlock(&n->mu);
            if (reason == DEV_FR_CAPACITY)
                return sl_err_set(err, SL_ECORRUPT, "stage %d: a sync payload from stage %d longer "
                                  "than any due (%zu bytes at most): %s", stage, f->from, cap,
                                  ferr.msg);
            sl_log_warn("device: frame refused", "stage=%d from=%d kind=sync reason=\"%s\"", stage,
                        f->from, ferr.msg);
            continue;
        }
        if (h.direction != DEV_DIR_SYNC || h.dtype != DEV_DTYPE_U8 || h.ndim != 1 ||
            h.step != round) {
            pthread_mutex_lock(&n->mu);
            refuse_count(n, DEV_FR_MISROUTED);
            pthread_mutex_unlock(&n->mu);
            return sl_err_set(err, SL_ECORRUPT, "stage %d: a sync payload of round %llu from "
                              "stage %d where round %llu was due", stage,
                              (unsigned long long)h.step, f->from, (unsigned long long)round);
        }
        *key = h.aux;
        *len = h.dims[0];
        return 0;
    }
}

/* One tensor name this device holds in a round. */
typedef struct sname {
    const char *name;
    uint64_t key;                 /* the frames' aux */
    const dev_tensor *t;          /* its entry in the model's layout */
    size_t n, cols, len;          /* elements, row length, payload bytes */
    const uint8_t *mine;          /* this replica's payload, when a local stage gives it */
    int giver;                    /* that stage */
    float *out[DEV_SYNC_ROUND_MAX];
    int nout;
    uint8_t *got[DEV_SYNC_MAX_REPLICAS]; /* the other replicas' payloads, received */
    int from[DEV_SYNC_MAX_REPLICAS];     /* the stage each comes from, -1: not due */
    int to;                       /* the local stage that receives them */
} sname;

/* The stage of replica r holding unit u, -1 if none. */
static int holder(const dev_net *n, int r, int u)
{
    for (int i = 0; i < n->c.stages; i++)
        if (n->stage[i].replica == r && u >= n->stage[i].first_unit && u <= n->stage[i].last_unit)
            return i;
    return -1;
}

static int gather_names(dev_net *n, uint64_t round, sname **out, int *nout, sl_err *err)
{
    int cap = 0;
    for (int k = 0; k < n->nlocal; k++)
        cap += n->rv_n[k];
    sname *v = sl_xcalloc((size_t)cap + 1, sizeof *v);
    int nv = 0;
    *out = v;
    for (int k = 0; k < n->nlocal; k++) {
        if (n->rv_round[k] != round)
            return sl_err_set(err, SL_EINVAL, "stage %d is at round %llu, stage %d at %llu",
                              n->rv_g[k], (unsigned long long)n->rv_round[k], n->rv_g[0],
                              (unsigned long long)round);
        for (int j = 0; j < n->rv_n[k]; j++) {
            const dev_sync_tensor *t = &n->rv_t[k][j];
            sname *e = NULL;
            for (int x = 0; x < nv && !e; x++)
                if (!strcmp(v[x].name, t->name))
                    e = &v[x];
            if (!e) {
                const dev_tensor *lt = sync_tensor(n, t->name);
                if (!lt)
                    return sl_err_set(err, SL_EINVAL, "tensor '%.80s' is not of the model", t->name);
                e = &v[nv++];
                e->name = t->name;
                e->key = fnv1a(t->name);
                e->t = lt;
                e->n = lt->numel;
                e->cols = cols_of(lt);
                e->len = dev_sync_payload_len(&n->c.sync, e->n, e->cols);
                e->giver = -1;
                for (int x = 0; x + 1 < nv; x++)
                    if (v[x].key == e->key)
                        return sl_err_set(err, SL_EINVAL, "tensors '%s' and '%s' hash alike",
                                          v[x].name, e->name);
            }
            if (t->n != e->n || t->cols != e->cols)
                return sl_err_set(err, SL_EINVAL, "tensor '%s': %zu elements in rows of %zu, the "
                                  "model's are %zu in rows of %zu", t->name, t->n, t->cols, e->n,
                                  e->cols);
            if (t->payload) {
                if (e->mine)
                    return sl_err_set(err, SL_EINVAL, "tensor '%s' is given twice", t->name);
                e->mine = t->payload;
                e->giver = n->rv_g[k];
            }
            e->out[e->nout++] = t->out;
        }
    }
    *nout = nv;
    return 0;
}

static int sync_round(dev_net *n, uint64_t round, sl_err *err)
{
    int R = n->c.replicas, me = n->stage[n->rv_g[0]].replica, nv = 0, rc = 0;
    sname *v = NULL;
    float *scratch = NULL;
    uint8_t *buf = NULL;
    size_t maxn = 1, maxlen = 1;
    if ((rc = gather_names(n, round, &v, &nv, err)))
        goto out;
    /* what this device gives: to every stage of another device that
     * receives the tensor for its device */
    for (int x = 0; x < nv && !rc; x++) {
        sname *e = &v[x];
        int u = e->t->unit, w = is_word(e->name);
        for (int b = 0; e->mine && b < n->c.stages && !rc; b++) {
            if (local(n, b) || !(dev_exch_sync_target(&n->c, b, u, 0) ||
                                 (w && dev_exch_sync_target(&n->c, b, 0, 1))))
                continue;
            int a = e->giver;
            link *l = link_of(n, a < b ? a : b, a < b ? b : a);
            if (!l) {
                rc = sl_err_set(err, SL_EINTERNAL, "no sync link between stages %d and %d", a, b);
                break;
            }
            dev_frame_hdr h = hdr(DEV_DIR_SYNC, DEV_CODEC_NONE, DEV_DTYPE_U8, round, 0, e->key, 1,
                                  (uint32_t)e->len, 0, 0);
            rc = put(n, l, a < b ? &l->down : &l->up, &h, e->mine, a, err);
        }
    }
    if (rc)
        goto out;
    /* what it takes: each other replica's payload of each tensor, from the
     * stage that gives it there, by the local stage that receives it */
    for (int x = 0; x < nv; x++) {
        sname *e = &v[x];
        int u = e->t->unit, w = is_word(e->name);
        e->to = -1;
        for (int b = 0; b < n->c.stages && e->to < 0; b++)
            if (local(n, b) && (dev_exch_sync_target(&n->c, b, u, 0) ||
                                (w && dev_exch_sync_target(&n->c, b, 0, 1))))
                e->to = b;
        for (int r = 0; r < R; r++) {
            e->from[r] = -1;
            if ((r == me && e->mine) || !dev_sync_present(&n->c.sync, r, round))
                continue; /* an owner away: its replica has no stage and gives nothing */
            int a = holder(n, r, u);
            if (a < 0 || local(n, a) || e->to < 0) {
                rc = sl_err_set(err, SL_EINVAL, "tensor '%s': replica %d gives it nowhere this "
                                "device receives it", e->name, r);
                goto out;
            }
            e->from[r] = a;
        }
        maxn = e->n > maxn ? e->n : maxn;
        maxlen = e->len > maxlen ? e->len : maxlen;
    }
    for (int x = 0; x < nv && !rc; x++)
        for (int r = 0; r < R && !rc; r++) {
            sname *e = &v[x];
            int a = e->from[r];
            if (a < 0 || e->got[r])
                continue;
            /* the next frame of that flow: any tensor due on it */
            int b = e->to;
            link *l = link_of(n, a < b ? a : b, a < b ? b : a);
            if (!l) {
                rc = sl_err_set(err, SL_EINTERNAL, "no sync link between stages %d and %d", a, b);
                break;
            }
            if (!buf && !(buf = sl_try_malloc(maxlen))) {
                rc = sl_err_set(err, SL_ENOMEM, "%zu bytes for a sync payload", maxlen);
                break;
            }
            uint64_t key = 0;
            size_t len = 0;
            if ((rc = take_sync(n, l, a < b ? &l->down : &l->up, round, buf, maxlen, &key, &len, b,
                                err)))
                break;
            sname *g = NULL;
            for (int y = 0; y < nv && !g; y++)
                if (v[y].key == key && v[y].from[r] == a && v[y].to == b && !v[y].got[r])
                    g = &v[y];
            if (!g)
                rc = sl_err_set(err, SL_ECORRUPT, "stage %d sent a sync payload of no tensor due "
                                "from it (key %016llx)", a, (unsigned long long)key);
            else if (len != g->len)
                rc = sl_err_set(err, SL_ECORRUPT, "stage %d sent %zu bytes of tensor '%s', whose "
                                "payload is %zu", a, len, g->name, g->len);
            else {
                g->got[r] = buf;
                buf = NULL;
                x = -1; /* from the start: the tensor first due may still wait */
                break;
            }
        }
    if (rc)
        goto out;
    if (!(scratch = sl_try_aligned_alloc((size_t)R * maxn * sizeof(float)))) {
        rc = sl_err_set(err, SL_ENOMEM, "cannot allocate %zu floats to combine", (size_t)R * maxn);
        goto out;
    }
    dev_sync_cfg rc_cfg = n->c.sync;
    dev_sync_round_weights(&n->c.sync, round, rc_cfg.weight);
    for (int x = 0; x < nv && !rc; x++) {
        sname *e = &v[x];
        const uint8_t *pl[DEV_SYNC_MAX_REPLICAS];
        for (int r = 0; r < R; r++)
            pl[r] = !dev_sync_present(&n->c.sync, r, round) ? NULL
                    : e->from[r] < 0 ? e->mine : e->got[r];
        if (dev_sync_combine(&rc_cfg, pl, e->n, e->cols, e->out[0], scratch, err)) {
            rc = sl_err_wrap(err, "tensor '%s'", e->name);
            break;
        }
        for (int k = 1; k < e->nout; k++)
            memcpy(e->out[k], e->out[0], e->n * sizeof(float));
    }
out:
    for (int x = 0; x < nv; x++)
        for (int r = 0; r < R; r++)
            free(v[x].got[r]);
    free(v);
    free(buf);
    sl_aligned_free(scratch);
    return rc ? -1 : 0;
}

static int sync_reduce(dev_sync *s, uint64_t round, const dev_sync_tensor *t, int nt, sl_err *err)
{
    nsync *me = (nsync *)s;
    dev_net *n = me->n;
    pthread_mutex_lock(&n->mu);
    if (n->aborted) {
        int rc = stopped(n, me->g, err);
        pthread_mutex_unlock(&n->mu);
        return rc;
    }
    n->rv_t[me->slot] = t;
    n->rv_n[me->slot] = nt;
    n->rv_round[me->slot] = round;
    n->rv_g[me->slot] = me->g;
    if (++n->rv_arrived < n->nlocal) {
        uint64_t gen = n->rv_gen;
        while (n->rv_gen == gen && !n->aborted)
            pthread_cond_wait(&n->cv, &n->mu);
        int rc = n->aborted ? stopped(n, me->g, err) : 0;
        pthread_mutex_unlock(&n->mu);
        return rc;
    }
    n->rv_arrived = 0;
    pthread_mutex_unlock(&n->mu);
    int rc = sync_round(n, round, err);
    if (rc) {
        char why[320];
        snprintf(why, sizeof why, "replica sync of step %llu: %.280s", (unsigned long long)round,
                 err->msg);
        dev_net_abort(n, why);
    }
    pthread_mutex_lock(&n->mu);
    n->rv_gen++;
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
    return rc;
}

static void sync_abort(dev_sync *s, const char *why) { dev_net_abort(((nsync *)s)->n, why); }
static void sync_free(dev_sync *s) { (void)s; }

static const dev_sync_ops sync_ops = {sync_reduce, sync_abort, sync_free};

static void np_abort(dev_port *p, const char *why) { dev_net_abort(net_of(p), why); }
static void np_free(dev_port *p) { (void)p; }

static const dev_port_ops net_ops = {
    .begin = np_begin,
    .send_act = np_send_act,
    .recv_act = np_recv_act,
    .send_grad = np_send_grad,
    .recv_grad = np_recv_grad,
    .send_labels = np_send_labels,
    .recv_labels = np_recv_labels,
    .tied_exchange = np_tied,
    .gather = np_gather,
    .abort = np_abort,
    .free = np_free,
};
