/* bal_sim.c - discrete-event replay of one pipeline iteration.
 *
 * Resources: every device computes one operation at a time; each stage runs
 * its operations in its schedule's fixed order. Two stages on one device (a
 * U-shaped chain's data owner) share its compute: when the device is free it
 * starts the op that has been ready longest (ties: the later stage, which
 * drains work). Every directed link sends one message at a time
 * (serialization = bytes / bandwidth), and the message arrives one latency
 * later. Sends run on the link, not the device, so they overlap compute.
 * Devices of one cpu pool (a machine) share its cores: while the devices
 * computing on it ask for more cores than it has, each op runs slower by
 * cores / asked (processor sharing, as a fair scheduler gives it), and its
 * end moves whenever an op of the pool starts or ends. A link between two
 * devices of one pool and one network namespace (loopback) moves its bytes
 * with the pool's cores (copies, encryption): while it sends it asks for one
 * core too.
 * The optimizer steps wait for the global gradient norm: once every stage
 * has run its last backward, the stages' partial sums travel down the chain
 * and the total back up (one latency per link each way), then every stage
 * steps its optimizer; the iteration ends with the last step.
 *
 * Orders: GPipe runs F0..F(m-1) then B0..B(m-1). 1F1B (PipeDream-flush)
 * warms up with min(p-i-1, m) forwards, then alternates F and B, then drains
 * the backwards, so at most p-i micro-batches are stashed on stage i; a plan
 * may warm up further ahead of slow links (bal_stage.warmup). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bal_int.h"
#include "sl_mem.h"

enum { EV_DONE, EV_XMIT, EV_ARRIVE, EV_NORM };

typedef struct event {
    double t;
    uint64_t seq;
    int type, stage, dir, mb;
    uint64_t ver; /* pooled EV_DONE and EV_XMIT: stale unless it equals xver */
} event;

typedef struct heap {
    event *a;
    size_t n, cap;
} heap;

static int ev_less(const event *x, const event *y)
{
    return x->t < y->t || (x->t == y->t && x->seq < y->seq);
}

static void heap_push(heap *h, event e)
{
    if (h->n == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 256;
        h->a = sl_xrealloc(h->a, h->cap * sizeof(event));
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!ev_less(&e, &h->a[p]))
            break;
        h->a[i] = h->a[p];
        i = p;
    }
    h->a[i] = e;
}

static event heap_pop(heap *h)
{
    event top = h->a[0], last = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && ev_less(&h->a[c + 1], &h->a[c]))
            c++;
        if (!ev_less(&h->a[c], &last))
            break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n)
        h->a[i] = last;
    return top;
}

typedef struct link_q { /* one directed link: FIFO of micro-batches */
    int *q;
    int head, tail, busy;
} link_q;

typedef struct pool_user {
    int pool, busy, stage, kind, mb;
    double need, left, rate, since, start;
    uint64_t ver;
} pool_user;

typedef struct sim {
    const bal_plan *pl;
    int p, m, schedule;
    int *ops;          /* [i * 2m + k]: mb for forward, -(mb+1) for backward */
    int *pc, *inflight, *done;
    int *res, *rbusy;  /* stage -> its device's compute resource; resource busy */
    int *rfirst, *rnext; /* stages of a resource as a list (-1 ends) */
    /* cpu pools. Their users are the compute resources (x = r) and the
     * directed links (x = nres + 2i: i -> i+1, nres + 2i + 1: i+1 -> i): a
     * user's pool (-1: none), the cores it asks for, and while it runs, its
     * op's work left at full speed, its rate since `xsince` */
    int nres, npool, nx;
    pool_user *x;
    double *pcpus, *pasked; /* per pool: its cores, what its running ops ask for */
    double *avail;     /* when the stage's previous op ended */
    int drained;       /* stages past their last backward */
    double norm_at;    /* when the global norm is known everywhere (-1 before) */
    double *act, *grad; /* [i * m + mb] arrival time, -1 until it arrives */
    link_q *fwd, *bwd; /* fwd[i]: i -> i+1; bwd[i]: i+1 -> i */
    heap h;
    uint64_t seq;
    bal_timeline *tl;
    int want_seg;
    size_t seg_cap;
} sim;

static void add_seg(sim *S, double a, double b, int stage, int kind, int mb)
{
    if (!S->want_seg)
        return;
    bal_timeline *tl = S->tl;
    if ((size_t)tl->n_seg == S->seg_cap) {
        S->seg_cap = S->seg_cap ? 2 * S->seg_cap : 1024;
        tl->seg = sl_xrealloc(tl->seg, S->seg_cap * sizeof(bal_segment));
    }
    tl->seg[tl->n_seg++] = (bal_segment){a, b, stage, kind, mb};
}

static void push(sim *S, double t, int type, int stage, int dir, int mb)
{
    heap_push(&S->h, (event){t, S->seq++, type, stage, dir, mb, 0});
}

/* The work the pool's running ops have done since their last change of rate. */
static void pool_advance(sim *S, int g, double t)
{
    for (pool_user *u = S->x; u < S->x + S->nx; u++)
        if (u->pool == g && u->busy) {
            u->left -= (t - u->since) * u->rate;
            if (u->left < 0)
                u->left = 0;
            u->since = t;
        }
}

/* Every running op of the pool at the pool's rate now: a new end each. */
static void pool_schedule(sim *S, int g, double t)
{
    double rate = S->pasked[g] > S->pcpus[g] ? S->pcpus[g] / S->pasked[g] : 1;
    for (pool_user *u = S->x; u < S->x + S->nx; u++)
        if (u->pool == g && u->busy) {
            u->rate = rate;
            heap_push(&S->h, (event){t + u->left / rate, S->seq++,
                                     u - S->x < S->nres ? EV_DONE : EV_XMIT, u->stage, u->kind,
                                     u->mb, ++u->ver});
        }
}

/* User x of pool g starts an op of `dur` seconds at full speed. */
static void pool_start(sim *S, int x, int stage, int kind, int mb, double dur, double t)
{
    pool_user *u = &S->x[x];
    pool_advance(S, u->pool, t);
    *u = (pool_user){.pool = u->pool, .busy = 1, .stage = stage, .kind = kind, .mb = mb,
                     .need = u->need, .left = dur, .since = t, .start = t, .ver = u->ver};
    S->pasked[u->pool] += u->need;
    pool_schedule(S, u->pool, t);
}

/* The pool user of the link out of stage `from` in direction dir (0: to
 * from + 1, 1: to from - 1). */
static int link_user(const sim *S, int from, int dir)
{
    return S->nres + (dir == 0 ? 2 * from : 2 * (from - 1) + 1);
}

/* The pool user an event ends an op of. */
static int user_of(const sim *S, const event *e)
{
    return e->type == EV_DONE ? S->res[e->stage] : link_user(S, e->stage, e->dir);
}

static const int seg_kind[3] = {BAL_SEG_FWD, BAL_SEG_BWD, BAL_SEG_OPT};

/* Time spent on an op: compute by kind, or a message on a link. */
static void account(sim *S, int link, int stage, int kind, int mb, double a, double b)
{
    if (link) {
        add_seg(S, a, b, stage, kind == 0 ? BAL_SEG_SEND_ACT : BAL_SEG_SEND_GRAD, mb);
        S->tl->stage[stage].send_s += b - a;
        S->tl->stage[kind == 0 ? stage + 1 : stage - 1].recv_s += b - a;
        return;
    }
    add_seg(S, a, b, stage, seg_kind[kind], mb);
    bal_stage_stats *st = &S->tl->stage[stage];
    double *acc[3] = {&st->fwd_s, &st->bwd_s, &st->optim_s};
    *acc[kind] += b - a;
}

/* Starts op `kind` (0 forward, 1 backward, 2 optimizer) of stage i for `dur`
 * seconds at full speed. A pooled device's time is counted when it ends. */
static void run_op(sim *S, int i, int kind, int mb, double dur, double t)
{
    int r = S->res[i];
    S->rbusy[r] = 1;
    if (S->x[r].pool >= 0) {
        pool_start(S, r, i, kind, mb, dur, t);
        return;
    }
    push(S, t + dur, EV_DONE, i, kind, mb);
    account(S, 0, i, kind, mb, t, t + dur);
}

/* A pooled op ended at t (0: the event is stale). */
static int pool_done(sim *S, const event *e, double t)
{
    int x = user_of(S, e);
    pool_user *u = &S->x[x];
    if (e->ver != u->ver)
        return 0;
    pool_advance(S, u->pool, t);
    u->busy = 0;
    S->pasked[u->pool] -= u->need;
    if (S->pasked[u->pool] < 1e-9)
        S->pasked[u->pool] = 0;
    account(S, x >= S->nres, e->stage, e->dir, e->mb, u->start, t);
    pool_schedule(S, u->pool, t);
    return 1;
}

int bal_stage_computes(int schedule, int stages, int i, int micro_batches, int warmup, int *out)
{
    int p = stages, m = micro_batches, k = 0;
    if (p < 1 || i < 0 || i >= p || m < 1 || (schedule != BAL_1F1B && schedule != BAL_GPIPE))
        return -1;
    int warm = bal_warm_forwards(schedule, p, i, m, warmup), f = 0, b = 0;
    while (f < m || b < m)
        out[k++] = bal_next_is_forward(f, b, warm, m) ? f++ : -(++b);
    return k;
}

int bal_stage_ops(int schedule, int stages, int i, int micro_batches, int warmup, bal_op *ops)
{
    int m = micro_batches, *c = sl_xmalloc(2 * (size_t)(m > 0 ? m : 1) * sizeof(int));
    int n = bal_stage_computes(schedule, stages, i, m, warmup, c), k = 0;
    int first = i == 0, last = i == stages - 1;
    for (int j = 0; j < n; j++) /* F(mb): receive, compute, send; B(mb) the other way */
        if (c[j] >= 0) {
            if (!first)
                ops[k++] = (bal_op){BAL_OP_RECV_ACT, c[j]};
            ops[k++] = (bal_op){BAL_OP_FWD, c[j]};
            if (!last)
                ops[k++] = (bal_op){BAL_OP_SEND_ACT, c[j]};
        } else {
            if (!last)
                ops[k++] = (bal_op){BAL_OP_RECV_GRAD, -c[j] - 1};
            ops[k++] = (bal_op){BAL_OP_BWD, -c[j] - 1};
            if (!first)
                ops[k++] = (bal_op){BAL_OP_SEND_GRAD, -c[j] - 1};
        }
    free(c);
    return n < 0 ? -1 : k;
}

int bal_warmups_check(int stages, int micro_batches, const int *warmup, sl_err *err)
{
    int m = micro_batches;
    for (int i = 0; i < stages; i++) {
        if (warmup[i] < 0)
            return sl_err_set(err, SL_EINVAL, "stage %d: warm-up %d is negative", i, warmup[i]);
        if (i + 1 == stages)
            break;
        int w = warmup[i] > m ? m : warmup[i];
        int next = warmup[i + 1] > m ? m : warmup[i + 1];
        int need = next + 1 > m ? m : next + 1;
        if (w < need)
            return sl_err_set(err, SL_EINVAL,
                              "stage %d warms up with %d forwards, stage %d with %d: stage %d "
                              "would wait for a forward that stage %d sends only after a "
                              "backward (each stage needs one forward more than the next)",
                              i, w, i + 1, next, i + 1, i);
    }
    return 0;
}

/* The simulator replays the computes of bal_stage_ops (bal_stage_computes);
 * sends and receives are its links. */
static void build_ops(sim *S)
{
    int p = S->p, m = S->m;
    for (int i = 0; i < p; i++) {
        int warm = S->schedule == S->pl->schedule ? S->pl->stage[i].warmup : -1;
        bal_stage_computes(S->schedule, p, i, m, warm, S->ops + (size_t)i * 2 * m);
    }
}

/* A directed link starts its next message if it is idle. */
static void link_kick(sim *S, link_q *l, int from, int dir, double t)
{
    if (l->busy || l->head == l->tail)
        return;
    const bal_stage *st = &S->pl->stage[dir == 0 ? from : from - 1];
    double ser = dir == 0 ? st->act_s : st->grad_s;
    int mb = l->q[l->head++];
    l->busy = 1;
    int x = link_user(S, from, dir);
    if (S->x[x].pool >= 0) {
        pool_start(S, x, from, dir, mb, ser, t);
        return;
    }
    push(S, t + ser, EV_XMIT, from, dir, mb);
    account(S, 1, from, dir, mb, t, t + ser);
}

/* When stage i's next op can start (-1: its input has not arrived). */
static double ready_at(const sim *S, int i)
{
    int m = S->m;
    if (S->done[i])
        return -1;
    if (S->pc[i] == 2 * m)
        return S->norm_at < 0 ? -1 : S->norm_at > S->avail[i] ? S->norm_at : S->avail[i];
    int op = S->ops[(size_t)i * 2 * m + S->pc[i]];
    double in = 0;
    if (op >= 0 && i > 0)
        in = S->act[(size_t)i * m + op];
    else if (op < 0)
        in = S->grad[(size_t)i * m + (-op - 1)];
    if (in < 0)
        return -1;
    return in > S->avail[i] ? in : S->avail[i];
}

static void start(sim *S, int i, double t)
{
    int m = S->m;
    const bal_stage *st = &S->pl->stage[i];
    if (S->pc[i] == 2 * m) {
        run_op(S, i, 2, -1, st->optim_s, t);
        return;
    }
    int op = S->ops[(size_t)i * 2 * m + S->pc[i]];
    if (op >= 0) {
        if (++S->inflight[i] > S->tl->stage[i].peak_inflight)
            S->tl->stage[i].peak_inflight = S->inflight[i];
        run_op(S, i, 0, op, st->fwd_s, t);
    } else {
        run_op(S, i, 1, -op - 1, st->bwd_s, t);
    }
}

/* A free device starts the op of its stages that has been ready longest. */
static void kick(sim *S, int r, double t)
{
    if (S->rbusy[r])
        return;
    int best = -1;
    double bt = 0;
    for (int i = S->rfirst[r]; i >= 0; i = S->rnext[i]) {
        double x = ready_at(S, i);
        if (x >= 0 && (best < 0 || x < bt || (x == bt && i > best))) {
            best = i;
            bt = x;
        }
    }
    if (best >= 0)
        start(S, best, t);
}

static void sim_free(sim *S)
{
    free(S->ops);
    free(S->pc);
    free(S->res);
    free(S->rbusy);
    free(S->rfirst);
    free(S->rnext);
    free(S->x);
    free(S->pcpus);
    free(S->pasked);
    free(S->avail);
    free(S->inflight);
    free(S->done);
    free(S->act);
    free(S->grad);
    if (S->fwd)
        for (int i = 0; i < S->p; i++) {
            free(S->fwd[i].q);
            free(S->bwd[i].q);
        }
    free(S->fwd);
    free(S->bwd);
    free(S->h.a);
}

/* The cpu pools of the plan's devices, by name; the size is the first
 * stage's that names it. A device asks for at most the pool's cores; a link
 * whose two ends share a pool and a network namespace asks for one. */
static int pool_of_stage(sim *S, int *first, int i)
{
    const bal_stage *st = &S->pl->stage[i];
    if (!st->cpu_pool[0] || !(st->pool_cpus > 0) || !(st->cpus > 0))
        return -1;
    int g = 0;
    while (g < S->npool && strcmp(S->pl->stage[first[g]].cpu_pool, st->cpu_pool))
        g++;
    if (g == S->npool) {
        first[S->npool++] = i;
        S->pcpus[g] = st->pool_cpus;
    }
    return g;
}

static void pools(sim *S)
{
    size_t X = (size_t)S->nres + 2 * (size_t)S->p;
    S->nx = (int)X;
    S->x = sl_xcalloc(X, sizeof *S->x);
    S->pcpus = sl_xcalloc(X, sizeof(double));
    S->pasked = sl_xcalloc(X, sizeof(double));
    int *first = sl_xmalloc(X * sizeof(int)); /* a pool's first stage */
    for (size_t i = 0; i < X; i++)
        S->x[i].pool = -1;
    for (int r = 0; r < S->nres; r++) {
        int g = pool_of_stage(S, first, S->rfirst[r]);
        const bal_stage *st = &S->pl->stage[S->rfirst[r]];
        S->x[r].pool = g;
        if (g >= 0)
            S->x[r].need = st->cpus < S->pcpus[g] ? st->cpus : S->pcpus[g];
    }
    for (int i = 0; i + 1 < S->p; i++) {
        int g = pool_of_stage(S, first, i), h = pool_of_stage(S, first, i + 1);
        const char *a = S->pl->stage[i].net_ns, *b = S->pl->stage[i + 1].net_ns;
        if (g < 0 || g != h || !a[0] || strcmp(a, b))
            continue;
        for (int dir = 0; dir < 2; dir++) {
            pool_user *u = &S->x[link_user(S, dir == 0 ? i : i + 1, dir)];
            u->pool = g;
            u->need = S->pcpus[g] < 1 ? S->pcpus[g] : 1;
        }
    }
    free(first);
}

bal_timeline *bal_simulate(const bal_plan *pl, int schedule, int segments, sl_err *err)
{
    int p = pl->n_stages, m = pl->micro_batches;
    if (p < 1 || m < 1 || (schedule != BAL_1F1B && schedule != BAL_GPIPE)) {
        sl_err_set(err, SL_EINVAL, "simulate: need stages, micro-batches and a schedule");
        return NULL;
    }
    if ((double)p * m > 5e7) {
        sl_err_set(err, SL_EINVAL, "simulate: %d stages x %d micro-batches is too large", p, m);
        return NULL;
    }
    size_t P = (size_t)p, M = (size_t)m;
    sim S = {.pl = pl, .p = p, .m = m, .schedule = schedule, .want_seg = segments, .norm_at = -1};
    double gather_s = 0; /* the norm's partial sums down the chain and the total back */
    for (int i = 0; i + 1 < p; i++)
        gather_s += 2 * pl->stage[i].lat_s;
    S.ops = sl_xmalloc(P * 2 * M * sizeof(int));
    S.pc = sl_xcalloc(P, sizeof(int));
    S.inflight = sl_xcalloc(P, sizeof(int));
    S.done = sl_xcalloc(P, sizeof(int));
    S.avail = sl_xcalloc(P, sizeof(double));
    S.act = sl_xmalloc(P * M * sizeof(double));
    S.grad = sl_xmalloc(P * M * sizeof(double));
    for (size_t j = 0; j < P * M; j++)
        S.act[j] = S.grad[j] = -1;
    /* one compute resource per device; stages on it listed in order */
    S.res = sl_xmalloc(P * sizeof(int));
    S.rbusy = sl_xcalloc(P, sizeof(int));
    S.rfirst = sl_xmalloc(P * sizeof(int));
    S.rnext = sl_xmalloc(P * sizeof(int));
    int nres = 0;
    for (int i = 0; i < p; i++) {
        S.res[i] = -1;
        S.rnext[i] = -1;
        for (int j = 0; j < i && S.res[i] < 0; j++)
            if (pl->stage[j].device == pl->stage[i].device)
                S.res[i] = S.res[j];
        if (S.res[i] < 0) {
            S.res[i] = nres;
            S.rfirst[nres++] = i;
        } else {
            int j = S.rfirst[S.res[i]];
            while (S.rnext[j] >= 0)
                j = S.rnext[j];
            S.rnext[j] = i;
        }
    }
    S.nres = nres;
    pools(&S);
    S.fwd = sl_xcalloc(P, sizeof(link_q));
    S.bwd = sl_xcalloc(P, sizeof(link_q));
    for (size_t i = 0; i < P; i++) {
        S.fwd[i].q = sl_xmalloc(M * sizeof(int));
        S.bwd[i].q = sl_xmalloc(M * sizeof(int));
    }
    bal_timeline *tl = sl_xcalloc(1, sizeof *tl);
    tl->schedule = schedule;
    tl->n_stages = p;
    tl->micro_batches = m;
    tl->stage = sl_xcalloc(P, sizeof *tl->stage);
    S.tl = tl;
    build_ops(&S);
    for (int r = 0; r < nres; r++)
        kick(&S, r, 0);
    double now = 0;
    while (S.h.n) {
        event e = heap_pop(&S.h);
        now = e.t;
        int i = e.stage;
        if (e.type == EV_DONE) {
            if (S.x[S.res[i]].pool >= 0 && !pool_done(&S, &e, now))
                continue;
            S.rbusy[S.res[i]] = 0;
            S.avail[i] = now;
            if (e.dir == 2) {
                S.done[i] = 1;
                tl->stage[i].end_s = now;
                kick(&S, S.res[i], now);
                continue;
            }
            S.pc[i]++;
            if (S.pc[i] == 2 * m && ++S.drained == p)
                push(&S, now + gather_s, EV_NORM, 0, 0, -1);
            if (e.dir == 0 && i < p - 1) {
                S.fwd[i].q[S.fwd[i].tail++] = e.mb;
                link_kick(&S, &S.fwd[i], i, 0, now);
            } else if (e.dir == 0) {
                S.grad[(size_t)i * M + e.mb] = now; /* the loss: backward may start */
            }
            if (e.dir == 1) {
                S.inflight[i]--;
                if (i > 0) {
                    S.bwd[i - 1].q[S.bwd[i - 1].tail++] = e.mb;
                    link_kick(&S, &S.bwd[i - 1], i, 1, now);
                }
            }
            kick(&S, S.res[i], now);
        } else if (e.type == EV_NORM) {
            S.norm_at = now;
            for (int r = 0; r < nres; r++)
                kick(&S, r, now);
        } else if (e.type == EV_XMIT) {
            if (S.x[user_of(&S, &e)].pool >= 0 && !pool_done(&S, &e, now))
                continue;
            link_q *l = e.dir == 0 ? &S.fwd[i] : &S.bwd[i - 1];
            const bal_stage *st = &pl->stage[e.dir == 0 ? i : i - 1];
            l->busy = 0;
            push(&S, now + st->lat_s, EV_ARRIVE, e.dir == 0 ? i + 1 : i - 1, e.dir, e.mb);
            link_kick(&S, l, i, e.dir, now);
        } else {
            if (e.dir == 0)
                S.act[(size_t)i * M + e.mb] = now;
            else
                S.grad[(size_t)i * M + e.mb] = now;
            kick(&S, S.res[i], now);
        }
    }
    int stuck = 0;
    for (int i = 0; i < p; i++)
        stuck |= !S.done[i];
    sim_free(&S);
    if (stuck) { /* cannot happen with the orders above; a guard, not a path */
        bal_timeline_free(tl);
        sl_err_set(err, SL_EINTERNAL, "simulate: the schedule deadlocked");
        return NULL;
    }
    double idle = 0;
    for (int i = 0; i < p; i++) {
        bal_stage_stats *s = &tl->stage[i];
        if (s->end_s > tl->iteration_s)
            tl->iteration_s = s->end_s;
    }
    for (int i = 0; i < p; i++) {
        bal_stage_stats *s = &tl->stage[i];
        s->idle_s = tl->iteration_s - s->fwd_s - s->bwd_s - s->optim_s;
        if (s->idle_s < 0)
            s->idle_s = 0;
        idle += s->idle_s;
        s->peak_mem_bytes = pl->stage[i].static_bytes +
                            (uint64_t)s->peak_inflight * pl->stage[i].stash_bytes;
    }
    tl->bubble = tl->iteration_s > 0 ? idle / (p * tl->iteration_s) : 0;
    return tl;
}

void bal_timeline_free(bal_timeline *tl)
{
    if (!tl)
        return;
    free(tl->stage);
    free(tl->seg);
    free(tl);
}
