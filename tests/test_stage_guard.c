/* test_stage_guard.c - a device's Stage server against devices that are not
 * its neighbours and against neighbours that misbehave, over real gRPC with
 * mutual TLS in one process. Device A serves stage 1 of a two-stage net whose
 * stage 0 is device B; C is another enrolled device. A routes Exchange
 * streams as a device does (dev_jobs): admitted only from the net's
 * neighbours, a hello within DEV_EXCH_HELLO_MS, then dev_net_accept.
 *
 *  - C opening a hundred streams takes no place of B's: each is refused at
 *    the door, and B's link carries its frames; a revoked B is refused too.
 *  - B opening streams without a hello: at most DEV_STAGE_STREAMS_PER_PEER
 *    get in, and each is closed when the hello's time is up.
 *  - B running ahead of the plan: frames over A's queue bound for their kind
 *    are refused and counted (queue full), the ones that fit are taken intact.
 *  - A stopping B's link (a revocation) closes B's stream.
 *  - A's net freed while it is connecting to a device that never answers the
 *    hello, and closed against one that never ends its stream: neither waits
 *    for the peer (a regression here hangs until the test's timeout).
 *  - A federation of two replicas, B's and A's, each one stage of the whole
 *    model: their replica sync over the sync link gives both the same
 *    result, dev_sync_combine's; a replica whose payloads are of another
 *    length (another codec) fails the round on both sides, naming the
 *    tensor, and neither waits; in a federation of three whose replica 1's
 *    owner is away (no stage of it in the plan), B's and A's round averages
 *    theirs alone, renormalised. */
#include <poll.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>

#include "cert.h"
#include "dev_exch.h"
#include "dev_frame.h"
#include "dev_model.h"
#include "dev_net.h"
#include "dev_stagesvc.h"
#include "rpc.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_mem.h"
#include "sl_test.h"
#include "trust_util.h"

#define T_MS 60000
#define JOB 0x5eed0000000000a1ull
#define BM 2
#define T 4
#define H 8
#define DEPTH 2

static char root[256], pki[512];

typedef struct dev {
    char dir[512];
    char id[CERT_ID_LEN];
    dev_kx_keypair kp;
    char addr[64]; /* its Stage server, if it serves one */
} dev;
static dev A, B, C;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_ms(int ms) { poll(NULL, 0, ms); }

/* A device's identity files, issued by the test PKI's CA. */
static void make_device(dev *d, const char *name)
{
    snprintf(d->dir, sizeof d->dir, "%s/%s", root, name);
    sl_err err = {0};
    uint8_t *csr = NULL;
    size_t len = 0;
    char *pem = NULL, *ca_pem = NULL;
    size_t ca_len = 0;
    cert_ca *ca = NULL;
    int ok = mkdir(d->dir, 0700) == 0 && cert_key_generate(tu_path(d->dir, "device.key"), &err) == 0 &&
             cert_csr_create(tu_path(d->dir, "device.key"), "x", &csr, &len, &err) == 0 &&
             (ca = cert_ca_load(pki, &err)) != NULL &&
             cert_ca_sign_csr(ca, csr, len, "lab", 30, d->id, &pem, &err) == 0 &&
             sl_write_file_atomic(tu_path(d->dir, "device.crt"), pem, strlen(pem), &err) == 0 &&
             sl_read_file(tu_path(pki, "ca.crt"), 1 << 20, &ca_pem, &ca_len, &err) == 0 &&
             sl_write_file_atomic(tu_path(d->dir, "ca.crt"), ca_pem, ca_len, &err) == 0 &&
             dev_kx_keypair_generate(&d->kp, &err) == 0;
    if (!ok) {
        fprintf(stderr, "device %s: %s\n", name, err.msg);
        exit(1);
    }
    cert_ca_free(ca);
    free(csr);
    free(pem);
    free(ca_pem);
}

/* ---- device A: its Stage server routes streams to its current net --------- */

typedef struct router {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dev_net *net;
    int refs;
    uint64_t no_hello, bad_hello;
    const char *revoked; /* a device id A has been told is revoked */
} router;
static router R = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0, 0, NULL};

static int r_admit(void *ud, const char *peer, rpc_status *st)
{
    (void)ud;
    pthread_mutex_lock(&R.mu);
    int ok = R.net && dev_net_serves_peer(R.net, peer);
    pthread_mutex_unlock(&R.mu);
    return ok ? RPC_OK
              : rpc_status_set(st, RPC_FAILED_PRECONDITION, "device %s is not a neighbour", peer);
}

static int r_revoked(void *ud, const char *id)
{
    (void)ud;
    pthread_mutex_lock(&R.mu);
    int r = R.revoked && !strcmp(R.revoked, id);
    pthread_mutex_unlock(&R.mu);
    return r;
}

static int r_exchange(void *ud, const char *peer, rpc_stream *s, rpc_status *st)
{
    (void)ud;
    dev_exch_hello h;
    sl_err err = {0};
    int bad = dev_exch_read_hello(s, DEV_EXCH_HELLO_MS, &h, &err);
    pthread_mutex_lock(&R.mu);
    if (bad)
        ++*(bad == DEV_EXCH_NO_HELLO ? &R.no_hello : &R.bad_hello);
    dev_net *n = bad ? NULL : R.net;
    if (n)
        R.refs++;
    pthread_mutex_unlock(&R.mu);
    if (bad)
        return rpc_status_set(st, dev_exch_refusal_code(bad), "%s", err.msg);
    if (!n)
        return rpc_status_set(st, RPC_FAILED_PRECONDITION, "no net");
    int code = dev_net_accept(n, peer, &h, s, st);
    pthread_mutex_lock(&R.mu);
    R.refs--;
    pthread_cond_broadcast(&R.cv);
    pthread_mutex_unlock(&R.mu);
    return code;
}

/* Takes the router's net away, waits for its handlers, frees it. */
static void router_clear(void)
{
    pthread_mutex_lock(&R.mu);
    dev_net *n = R.net;
    R.net = NULL;
    if (n)
        dev_net_abort(n, "test over");
    while (R.refs > 0)
        pthread_cond_wait(&R.cv, &R.mu);
    pthread_mutex_unlock(&R.mu);
    dev_net_free(n);
}

/* ---- nets ------------------------------------------------------------------ */

static dev_net_stage stages[2];

/* The net of `self` for epoch e: stage 0 on first, stage 1 on second. */
static dev_net *net_of(const dev *self, const dev *first, const dev *second, uint32_t e,
                       int connect_ms)
{
    const dev *d[2] = {first, second};
    for (int i = 0; i < 2; i++) {
        snprintf(stages[i].device, sizeof stages[i].device, "%s", d[i]->id);
        snprintf(stages[i].address, sizeof stages[i].address, "%s", d[i]->addr);
        memcpy(stages[i].link_key, d[i]->kp.pk, 32);
    }
    dev_net_cfg c = {.job = JOB, .epoch = e, .stages = 2, .stage = stages, .self_id = self->id,
                     .self_kp = &self->kp, .state = self->dir, .codec_act = DEV_CODEC_NONE,
                     .codec_grad = DEV_CODEC_NONE, .sealed = 1, .depth = DEPTH,
                     .act_floats = BM * T * H, .mask_ints = BM * T, .label_ints = DEPTH * BM * T,
                     .tied_floats = 100, .gather_max = 16, .connect_timeout_ms = connect_ms};
    sl_err err = {0};
    dev_net *n = dev_net_open(&c, &err);
    CHECKF(n != NULL, "%s", err.msg);
    if (!n)
        exit(1);
    return n;
}

/* A's net of epoch e (B at stage 0), installed in the router. */
static void serve_epoch(uint32_t e)
{
    dev_net *n = net_of(&A, &B, &A, e, T_MS);
    pthread_mutex_lock(&R.mu);
    R.net = n;
    pthread_mutex_unlock(&R.mu);
}

static rpc_channel *dial_as(const dev *from, const dev *to)
{
    sl_err err = {0};
    rpc_channel *c = dev_stagesvc_connect(from->dir, to->addr, to->id, 0, &err);
    CHECKF(c != NULL, "%s", err.msg);
    return c;
}

static void fill(float *x, int32_t *v, int mb)
{
    for (int i = 0; i < BM * T * H; i++)
        x[i] = (float)(mb * 1000 + i) * 0.5f;
    for (int i = 0; i < BM * T; i++)
        v[i] = (i + mb) % 3 != 0;
}

/* B's net sends micro-batches 0 and 1 of step 1; A's port takes them. */
static int carries_frames(dev_net *bn)
{
    dev_port *pb = dev_net_port(bn, 0);
    pthread_mutex_lock(&R.mu);
    dev_port *pa = R.net ? dev_net_port(R.net, 1) : NULL;
    pthread_mutex_unlock(&R.mu);
    if (!pb || !pa)
        return 0;
    sl_err err = {0};
    float x[BM * T * H], y[BM * T * H];
    int32_t v[BM * T], w[BM * T];
    int ok = pb->ops->begin(pb, 1, &err) == 0 && pa->ops->begin(pa, 1, &err) == 0;
    for (int mb = 0; ok && mb < 2; mb++) {
        fill(x, v, mb);
        ok = pb->ops->send_act(pb, mb, x, BM * T * H, v, BM * T, &err) == 0 &&
             pa->ops->recv_act(pa, mb, y, BM * T * H, w, BM * T, &err) == 0 &&
             !memcmp(x, y, sizeof x) && !memcmp(v, w, sizeof v);
    }
    if (!ok)
        fprintf(stderr, "  frames: %s\n", err.msg);
    return ok;
}

/* ---- outsiders ------------------------------------------------------------- */

static void test_outsiders_take_no_place(void)
{
    serve_epoch(1);
    rpc_channel *cc = dial_as(&C, &A);
    sl_err err = {0};
    enum { FLOOD = 100 };
    rpc_stream *st[FLOOD];
    for (int i = 0; i < FLOOD; i++)
        st[i] = rpc_stream_open(cc, RPC_M_STAGE_EXCHANGE, T_MS, &err);
    /* B connects while C holds its streams open */
    dev_net *bn = net_of(&B, &B, &A, 1, T_MS);
    CHECKF(dev_net_start(bn, &err) == 0, "%s", err.msg);
    CHECK(carries_frames(bn));
    int refused = 0;
    rpc_status fs = {0};
    for (int i = 0; i < FLOOD; i++)
        if (st[i]) {
            int code = rpc_stream_finish(st[i], &fs);
            refused += code == RPC_FAILED_PRECONDITION && strstr(fs.details, "not a neighbour");
        }
    CHECKF(refused == FLOOD, "%d of %d refused at the door (last: %s)", refused, FLOOD, fs.details);
    dev_net_free(bn);
    router_clear();
    rpc_channel_destroy(cc);

    /* a neighbour the coordinator revoked is refused at the door as well */
    serve_epoch(2);
    pthread_mutex_lock(&R.mu);
    R.revoked = B.id;
    pthread_mutex_unlock(&R.mu);
    rpc_channel *bc = dial_as(&B, &A);
    rpc_stream *x = rpc_stream_open(bc, RPC_M_STAGE_EXCHANGE, T_MS, &err);
    CHECK(x != NULL && rpc_stream_finish(x, &fs) == RPC_UNAUTHENTICATED);
    CHECKF(strstr(fs.details, "revoked") != NULL, "%s", fs.details);
    pthread_mutex_lock(&R.mu);
    R.revoked = NULL;
    pthread_mutex_unlock(&R.mu);
    rpc_channel_destroy(bc);
    router_clear();
}

/* ---- a neighbour without hellos ------------------------------------------- */

typedef struct waiter {
    pthread_t t;
    rpc_stream *s;
    int code;
    rpc_status st;
} waiter;

/* Waits for the server to end the stream (it never sends), then its status. */
static void *wait_end(void *arg)
{
    waiter *w = arg;
    rpc_buf m;
    if (rpc_stream_recv(w->s, &m, NULL) == 1)
        rpc_buf_free(&m);
    w->code = rpc_stream_finish(w->s, &w->st);
    return NULL;
}

static void test_neighbour_without_hello(void)
{
    serve_epoch(3);
    rpc_channel *bc = dial_as(&B, &A);
    sl_err err = {0};
    /* one more stream than a peer may hold: the server admits them as they
     * arrive, so one of them (the last, unless a busy server takes them out
     * of order) finds the others in, each waiting for its hello */
    enum { N = DEV_STAGE_STREAMS_PER_PEER + 1 };
    waiter w[N];
    for (int i = 0; i < N; i++) {
        w[i].s = rpc_stream_open(bc, RPC_M_STAGE_EXCHANGE, T_MS, &err);
        CHECK(w[i].s != NULL);
        if (!w[i].s)
            exit(1);
    }
    for (int i = 0; i < N; i++)
        pthread_create(&w[i].t, NULL, wait_end, &w[i]);
    int closed = 0, over = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(w[i].t, NULL);
        closed += w[i].code == RPC_DEADLINE_EXCEEDED;
        if (w[i].code == RPC_RESOURCE_EXHAUSTED) {
            over++;
            CHECKF(strstr(w[i].st.details, "holds 8 streams") != NULL, "%s", w[i].st.details);
        } else if (w[i].code != RPC_DEADLINE_EXCEEDED) {
            CHECKF(0, "stream %d: %s: %s", i, rpc_code_name(w[i].code), w[i].st.details);
        }
    }
    CHECKF(closed == DEV_STAGE_STREAMS_PER_PEER && over == 1,
           "%d closed for want of a hello, %d over the cap", closed, over);
    /* the server may end a stream (its idle limit) just before its handler
     * counts it: the count is waited for, with a deadline */
    uint64_t no_hello = 0;
    for (int ms = 0; ms < 10000; ms += 10) {
        pthread_mutex_lock(&R.mu);
        no_hello = R.no_hello;
        pthread_mutex_unlock(&R.mu);
        if (no_hello >= DEV_STAGE_STREAMS_PER_PEER)
            break;
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    CHECKF(no_hello == DEV_STAGE_STREAMS_PER_PEER, "no_hello %llu", (unsigned long long)no_hello);
    /* and B's own link gets in afterwards */
    dev_net *bn = net_of(&B, &B, &A, 3, T_MS);
    CHECKF(dev_net_start(bn, &err) == 0, "%s", err.msg);
    CHECK(carries_frames(bn));
    dev_net_free(bn);
    rpc_channel_destroy(bc);
    router_clear();
}

/* ---- a neighbour running ahead --------------------------------------------- */

/* Encodes and sends one frame as B on link 0-1 (down). */
static int send_frame(rpc_stream *s, dev_link_tx *tx, int dir, int mb, const void *data)
{
    dev_frame_hdr h;
    memset(&h, 0, sizeof h);
    h.direction = (uint8_t)dir;
    h.codec = DEV_CODEC_NONE;
    h.step = 1;
    h.microbatch = (uint16_t)mb;
    if (dir == DEV_DIR_MASK) {
        h.dtype = DEV_DTYPE_I32;
        h.ndim = 1;
        h.dims[0] = BM * T;
    } else {
        h.dtype = DEV_DTYPE_F32;
        h.ndim = 2;
        h.dims[0] = BM * T;
        h.dims[1] = H;
    }
    size_t cap = dev_frame_max_len(&h), len = 0;
    uint8_t *buf = malloc(cap + 11);
    sl_err err = {0};
    int rc = dev_frame_encode_any(tx, &h, data, NULL, buf + 11, cap, &len, &err);
    uint8_t pre[11];
    size_t np = rpc_frame_wrap(pre, len);
    rpc_iov iov[2] = {{pre, np}, {buf + 11, len}};
    if (!rc)
        rc = rpc_stream_sendv(s, iov, 2, &err);
    free(buf);
    return rc;
}

static void test_queue_bound(void)
{
    serve_epoch(4);
    rpc_channel *bc = dial_as(&B, &A);
    sl_err err = {0};
    rpc_stream *s = rpc_stream_open(bc, RPC_M_STAGE_EXCHANGE, T_MS, &err);
    rpc_buf hello = {0}, ack = {0};
    dev_exch_hello_pack(JOB, 4, 0, 1, &hello);
    CHECK(s && rpc_stream_send(s, hello.data, hello.len, &err) == 0 &&
          rpc_stream_recv(s, &ack, &err) == 1);
    rpc_buf_free(&hello);
    rpc_buf_free(&ack);
    dev_link_cfg lc = {.job_id = JOB, .epoch = 4, .from_stage = 0, .to_stage = 1, .sealed = 1};
    dev_link_tx tx;
    CHECKF(dev_link_tx_init(&tx, &lc, &B.kp, A.kp.pk, &err) == 0, "%s", err.msg);
    float x[2][BM * T * H];
    int32_t v[2][BM * T];
    fill(x[0], v[0], 0);
    fill(x[1], v[1], 1);
    /* a step's worth fits: the masks and activations of its DEPTH micro-batches */
    int rc = 0;
    for (int mb = 0; mb < DEPTH; mb++)
        rc |= send_frame(s, &tx, DEV_DIR_MASK, mb, v[mb]) | send_frame(s, &tx, DEV_DIR_ACTIVATION, mb, x[mb]);
    /* then 8 activations and 4 masks more than the plan lets B send */
    enum { EXTRA_ACT = 8, EXTRA_MASK = 4 };
    for (int mb = DEPTH; mb < DEPTH + EXTRA_ACT; mb++)
        rc |= send_frame(s, &tx, DEV_DIR_ACTIVATION, mb, x[0]);
    for (int mb = DEPTH; mb < DEPTH + EXTRA_MASK; mb++)
        rc |= send_frame(s, &tx, DEV_DIR_MASK, mb, v[0]);
    CHECK(rc == 0);
    uint64_t refused[DEV_FR_NREASONS] = {0};
    for (double end = now_s() + 30; now_s() < end; sleep_ms(10)) {
        pthread_mutex_lock(&R.mu);
        dev_net_refused(R.net, refused);
        pthread_mutex_unlock(&R.mu);
        if (refused[DEV_FR_QUEUE_FULL] >= EXTRA_ACT + EXTRA_MASK)
            break;
    }
    CHECKF(refused[DEV_FR_QUEUE_FULL] == EXTRA_ACT + EXTRA_MASK, "%llu refused as queue full",
           (unsigned long long)refused[DEV_FR_QUEUE_FULL]);
    CHECK(!strcmp(dev_frame_reason_name(DEV_FR_QUEUE_FULL), "queue full"));
    /* what fit is taken intact, in order */
    pthread_mutex_lock(&R.mu);
    dev_port *pa = dev_net_port(R.net, 1);
    pthread_mutex_unlock(&R.mu);
    float y[BM * T * H];
    int32_t w[BM * T];
    CHECK(pa->ops->begin(pa, 1, &err) == 0);
    for (int mb = 0; mb < DEPTH; mb++) {
        CHECKF(pa->ops->recv_act(pa, mb, y, BM * T * H, w, BM * T, &err) == 0, "%s", err.msg);
        CHECK(!memcmp(y, x[mb], sizeof y) && !memcmp(w, v[mb], sizeof w));
    }
    dev_link_tx_free(&tx);
    rpc_stream_cancel(s);
    rpc_channel_destroy(bc);
    router_clear();
}

/* ---- a revoked neighbour's stream ------------------------------------------ */

static void test_revoked_link_closed(void)
{
    serve_epoch(5);
    sl_err err = {0};
    dev_net *bn = net_of(&B, &B, &A, 5, T_MS);
    CHECKF(dev_net_start(bn, &err) == 0, "%s", err.msg);
    CHECK(carries_frames(bn));
    pthread_mutex_lock(&R.mu);
    dev_net_abort_peer(R.net, B.id, "the coordinator revoked it");
    char lost[64] = "";
    CHECK(dev_net_lost_peer(R.net, lost, sizeof lost) == 1 && !strcmp(lost, B.id));
    pthread_mutex_unlock(&R.mu);
    /* B's side sees its stream end: waiting for a gradient fails instead */
    dev_port *pb = dev_net_port(bn, 0);
    float g[BM * T * H];
    CHECK(pb->ops->begin(pb, 2, &err) == 0);
    CHECK(pb->ops->recv_grad(pb, 0, g, BM * T * H, &err) == -1);
    CHECKF(strstr(err.msg, "ended") != NULL, "%s", err.msg);
    char lost_b[64] = "";
    CHECK(dev_net_lost_peer(bn, lost_b, sizeof lost_b) == 1 && !strcmp(lost_b, A.id));
    dev_net_free(bn);
    router_clear();
}

/* ---- peers that never answer ----------------------------------------------- */

/* C's Stage server: reads the hello, answers it (or not), then holds the
 * stream until the gate opens (10 minutes at most). */
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int gate_open, in_hole, answer_hello;

static int black_hole(void *ud, const rpc_peer *peer, rpc_stream *s, rpc_status *st)
{
    (void)ud;
    (void)peer;
    rpc_buf m;
    if (rpc_stream_recv(s, &m, NULL) != 1)
        return rpc_status_set(st, RPC_CANCELLED, "no hello");
    if (answer_hello)
        rpc_stream_send(s, m.data, m.len, NULL);
    rpc_buf_free(&m);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 600;
    pthread_mutex_lock(&gate_mu);
    in_hole++;
    while (!gate_open)
        if (pthread_cond_timedwait(&gate_cv, &gate_mu, &until) != 0)
            break;
    pthread_mutex_unlock(&gate_mu);
    return RPC_OK;
}

static int holes(void)
{
    pthread_mutex_lock(&gate_mu);
    int n = in_hole;
    pthread_mutex_unlock(&gate_mu);
    return n;
}

static void test_close_and_free_never_wait(void)
{
    sl_err err = {0};
    rpc_server_opts o = {.listen = "127.0.0.1:0",
                         .tls = {tu_path(C.dir, "ca.crt"), tu_path(C.dir, "device.crt"),
                                 tu_path(C.dir, "device.key")},
                         .client_auth = RPC_CLIENT_CERT_REQUIRED,
                         .shutdown_grace_ms = 2000};
    rpc_server *srv = rpc_server_create(&o, &err);
    int port = srv && rpc_server_add_stream(srv, RPC_M_STAGE_EXCHANGE, black_hole, NULL, &err) == 0
                   ? rpc_server_start(srv, &err)
                   : -1;
    CHECKF(port > 0, "%s", err.msg);
    if (port <= 0)
        return;
    snprintf(C.addr, sizeof C.addr, "127.0.0.1:%d", port);
    /* (1) the hello is never answered: A keeps trying for ten minutes, and
     * freeing its net interrupts the attempt */
    answer_hello = 0;
    dev_net *an = net_of(&A, &A, &C, 6, 600000);
    CHECKF(dev_net_start(an, &err) == 0, "%s", err.msg);
    for (double end = now_s() + 30; now_s() < end && holes() < 1; sleep_ms(10))
        ;
    CHECK(holes() >= 1);
    dev_net_free(an);
    /* (2) the link is up but C never ends its stream: closing gives up */
    answer_hello = 1;
    int before = holes();
    an = net_of(&A, &A, &C, 7, 600000);
    CHECKF(dev_net_start(an, &err) == 0, "%s", err.msg);
    for (double end = now_s() + 30; now_s() < end && holes() <= before; sleep_ms(10))
        ;
    CHECK(holes() > before);
    CHECK(dev_net_close(an, 500, &err) == -1 && strstr(err.msg, "did not close in time"));
    dev_net_free(an);
    pthread_mutex_lock(&gate_mu);
    gate_open = 1;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
    CHECK(rpc_server_destroy(srv) == 0);
}

/* ---- a federation's replica sync ------------------------------------------- */

static dev_config fcfg;

/* The federation's net of `self` in epoch e: replica 0 is B (stage 0),
 * replica 1 is A (stage 1), each the whole model; payloads of `codec`. */
static dev_net *fed_net_of_away(const dev *self, uint32_t e, int codec, int away);
static dev_net *fed_net_of(const dev *self, uint32_t e, int codec)
{
    return fed_net_of_away(self, e, codec, 0);
}

/* away: a federation of three whose replica 1's owner is away (no stage);
 * B's replica is 0 and A's 2, batches 4, 3 and 2. */
static dev_net *fed_net_of_away(const dev *self, uint32_t e, int codec, int away)
{
    static dev_net_stage st[2];
    const dev *d[2] = {&B, &A};
    for (int i = 0; i < 2; i++) {
        snprintf(st[i].device, sizeof st[i].device, "%.31s", d[i]->id);
        snprintf(st[i].address, sizeof st[i].address, "%s", d[i]->addr);
        memcpy(st[i].link_key, d[i]->kp.pk, 32);
        st[i].replica = away ? 2 * i : i;
        st[i].first_unit = 0;
        st[i].last_unit = dev_unit_head(&fcfg);
    }
    dev_net_cfg c = {.job = JOB, .epoch = e, .stages = 2, .stage = st, .self_id = self->id,
                     .self_kp = &self->kp, .state = self->dir, .codec_act = DEV_CODEC_NONE,
                     .codec_grad = DEV_CODEC_NONE, .sealed = 1, .depth = DEPTH,
                     .act_floats = BM * T * H, .mask_ints = BM * T, .label_ints = DEPTH * BM * T,
                     .tied_floats = 100, .gather_max = 16, .connect_timeout_ms = T_MS,
                     .replicas = away ? 3 : 2, .model = &fcfg};
    int batch[2] = {4, 2}, batch3[3] = {4, 3, 2};
    if (away) {
        dev_sync_weights(&c.sync, batch3, 3);
        c.sync.away_from[1] = 1;
        c.sync.away_to[1] = UINT64_MAX;
    } else {
        dev_sync_weights(&c.sync, batch, 2);
    }
    c.sync.codec = codec;
    sl_err err = {0};
    dev_net *n = dev_net_open(&c, &err);
    CHECKF(n != NULL, "%s", err.msg);
    if (!n)
        exit(1);
    return n;
}

/* One replica's round: its stage's tensors (the tied copy by the word
 * embeddings' name, receive only), payloads of values keyed by `seed`. */
typedef struct side {
    dev_net *n;
    int stage;
    dev_sync_cfg c;
    dev_tensor *t;
    int nt;
    dev_sync_tensor *st;
    uint8_t **pay;
    float **out;
    int rc;
    sl_err err;
} side;

static void side_make(side *s, dev_net *n, int stage, int codec, float seed)
{
    memset(s, 0, sizeof *s);
    s->n = n;
    s->stage = stage;
    int batch[2] = {4, 2};
    dev_sync_weights(&s->c, batch, 2);
    s->c.codec = codec;
    size_t total;
    sl_err err = {0};
    CHECKF(dev_model_layout(&fcfg, 0, dev_unit_head(&fcfg), &s->t, &s->nt, &total, &err) == 0,
           "%s", err.msg);
    s->st = sl_xcalloc((size_t)s->nt, sizeof *s->st);
    s->pay = sl_xcalloc((size_t)s->nt, sizeof *s->pay);
    s->out = sl_xcalloc((size_t)s->nt, sizeof *s->out);
    for (int k = 0; k < s->nt; k++) {
        const dev_tensor *t = &s->t[k];
        size_t n = t->numel, cols = t->cols ? (size_t)t->cols : n;
        int tied = (t->flags & DEV_T_TIED) != 0;
        float *x = sl_xcalloc(n, sizeof *x);
        for (size_t i = 0; i < n; i++)
            x[i] = seed * (float)((int)((i * 7 + (size_t)k) % 13) - 6) / 8.0f;
        s->pay[k] = sl_xcalloc(dev_sync_payload_len(&s->c, n, cols) + 1, 1);
        CHECK(dev_codec_encode(codec, x, n, cols, 0, NULL, s->pay[k], &err) == 0);
        free(x);
        s->out[k] = sl_xcalloc(n, sizeof(float));
        s->st[k] = (dev_sync_tensor){.name = tied ? "bert.embeddings.word_embeddings.weight" : t->name,
                                     .n = n, .cols = cols, .payload = tied ? NULL : s->pay[k],
                                     .out = s->out[k]};
    }
}

static void side_free(side *s)
{
    for (int k = 0; k < s->nt; k++) {
        free(s->pay[k]);
        free(s->out[k]);
    }
    free(s->pay);
    free(s->out);
    free(s->st);
    free(s->t);
}

static void *side_reduce(void *arg)
{
    side *s = arg;
    dev_sync *y = dev_net_sync(s->n, s->stage);
    s->rc = y ? y->ops->reduce(y, 1, s->st, s->nt, &s->err)
              : sl_err_set(&s->err, SL_EINVAL, "no sync on stage %d", s->stage);
    return NULL;
}

/* B's and A's round, each on a thread of its own. */
static void round_of(side *b, side *a)
{
    pthread_t tb, ta;
    CHECK(pthread_create(&tb, NULL, side_reduce, b) == 0);
    CHECK(pthread_create(&ta, NULL, side_reduce, a) == 0);
    pthread_join(tb, NULL);
    pthread_join(ta, NULL);
}

static void test_sync(void)
{
    sl_err err = {0};
    CHECKF(dev_config_parse(&fcfg, "{\"hidden_size\": 8, \"num_hidden_layers\": 1, "
                            "\"num_attention_heads\": 2, \"intermediate_size\": 16, "
                            "\"vocab_size\": 20, \"max_position_embeddings\": 8}", &err) == 0,
           "%s", err.msg);
    /* the same codec on both sides: the same result, dev_sync_combine's */
    dev_net *an = fed_net_of(&A, 11, DEV_CODEC_NONE), *bn = fed_net_of(&B, 11, DEV_CODEC_NONE);
    pthread_mutex_lock(&R.mu);
    R.net = an;
    pthread_mutex_unlock(&R.mu);
    CHECKF(dev_net_start(bn, &err) == 0, "%s", err.msg);
    side sa, sb;
    side_make(&sb, bn, 0, DEV_CODEC_NONE, 1.0f);
    side_make(&sa, an, 1, DEV_CODEC_NONE, -0.75f);
    round_of(&sb, &sa);
    CHECKF(sb.rc == 0 && sa.rc == 0, "B: %s; A: %s", sb.err.msg, sa.err.msg);
    int same = 1;
    float *want = NULL, *scratch = NULL;
    for (int k = 0; k < sa.nt && sa.rc == 0 && sb.rc == 0; k++) {
        size_t n = sa.st[k].n;
        /* the tied copy gets the word embeddings' result */
        int src = k;
        if (!sa.st[k].payload) {
            for (int j = 0; j < sa.nt; j++)
                if (sa.st[j].payload && !strcmp(sa.st[j].name, sa.st[k].name))
                    src = j;
        }
        const uint8_t *pl[2] = {sb.pay[src], sa.pay[src]};
        want = sl_xcalloc(n, sizeof *want);
        scratch = sl_xcalloc(2 * n, sizeof *scratch);
        CHECK(dev_sync_combine(&sa.c, pl, n, sa.st[k].cols, want, scratch, &err) == 0);
        int ok = !memcmp(want, sa.out[k], n * sizeof *want) && !memcmp(want, sb.out[k], n * sizeof *want);
        CHECKF(ok, "tensor %d '%s' (%s): %g %g %g", k, sa.st[k].name, sa.t[k].name, (double)want[0],
               (double)sa.out[k][0], (double)sb.out[k][0]);
        same &= ok;
        free(want);
        free(scratch);
    }
    CHECK(same);
    side_free(&sa);
    side_free(&sb);
    dev_net_free(bn);
    router_clear();
    /* B's payloads int8, A's none: each refuses the other's lengths */
    an = fed_net_of(&A, 12, DEV_CODEC_NONE);
    bn = fed_net_of(&B, 12, DEV_CODEC_INT8);
    pthread_mutex_lock(&R.mu);
    R.net = an;
    pthread_mutex_unlock(&R.mu);
    CHECKF(dev_net_start(bn, &err) == 0, "%s", err.msg);
    side_make(&sb, bn, 0, DEV_CODEC_INT8, 1.0f);
    side_make(&sa, an, 1, DEV_CODEC_NONE, -0.75f);
    round_of(&sb, &sa);
    /* whichever refuses first ends the link: the other may see it end
     * before the payload it would refuse has come */
    int a_len = strstr(sa.err.msg, "bytes of tensor 'bert.") && strstr(sa.err.msg, "whose payload is");
    int b_len = strstr(sb.err.msg, "bytes of tensor 'bert.") && strstr(sb.err.msg, "whose payload is");
    CHECKF(sa.rc == -1 && sb.rc == -1 && (a_len || b_len), "A: %s; B: %s", sa.err.msg, sb.err.msg);
    char why[320] = "", bwhy[320] = "";
    CHECKF((dev_net_aborted(an, why, sizeof why) && strstr(why, "replica sync of step 1")) ||
           (dev_net_aborted(bn, bwhy, sizeof bwhy) && strstr(bwhy, "replica sync of step 1")),
           "A aborted: %s; B aborted: %s", why, bwhy);
    side_free(&sa);
    side_free(&sb);
    dev_net_free(bn);
    router_clear();
    /* three replicas, replica 1's owner away: B's and A's round averages
     * theirs alone, weighted 4/6 and 2/6, and waits for no payload of it */
    an = fed_net_of_away(&A, 13, DEV_CODEC_NONE, 1);
    bn = fed_net_of_away(&B, 13, DEV_CODEC_NONE, 1);
    pthread_mutex_lock(&R.mu);
    R.net = an;
    pthread_mutex_unlock(&R.mu);
    CHECKF(dev_net_start(bn, &err) == 0, "%s", err.msg);
    side_make(&sb, bn, 0, DEV_CODEC_NONE, 1.0f);
    side_make(&sa, an, 1, DEV_CODEC_NONE, -0.75f);
    round_of(&sb, &sa);
    CHECKF(sb.rc == 0 && sa.rc == 0, "away: B: %s; A: %s", sb.err.msg, sa.err.msg);
    same = 1;
    for (int k = 0; k < sa.nt && sa.rc == 0 && sb.rc == 0; k++) {
        size_t n = sa.st[k].n;
        int src = k;
        if (!sa.st[k].payload)
            for (int j = 0; j < sa.nt; j++)
                if (sa.st[j].payload && !strcmp(sa.st[j].name, sa.st[k].name))
                    src = j;
        float *xb = sl_xcalloc(n, sizeof *xb), *xa = sl_xcalloc(n, sizeof *xa);
        CHECK(dev_codec_decode(DEV_CODEC_NONE, sb.pay[src], n, sa.st[k].cols, 0, xb, &err) == 0 &&
              dev_codec_decode(DEV_CODEC_NONE, sa.pay[src], n, sa.st[k].cols, 0, xa, &err) == 0);
        int ok = 1;
        for (size_t i = 0; i < n; i++) {
            float w = (float)(4.0 / 6.0 * (double)xb[i] + 2.0 / 6.0 * (double)xa[i]);
            ok &= w == sa.out[k][i] && w == sb.out[k][i];
        }
        CHECKF(ok, "away: tensor %d '%s' is not the present replicas' average", k, sa.st[k].name);
        same &= ok;
        free(xb);
        free(xa);
    }
    CHECK(same);
    side_free(&sa);
    side_free(&sb);
    dev_net_free(bn);
    router_clear();
}

int main(void)
{
    sl_log_set_level(SL_LOG_ERROR);
    tu_tmpdir(root, sizeof root, "stageguard");
    tu_pki(root, "pki", pki, sizeof pki);
    make_device(&A, "A");
    make_device(&B, "B");
    make_device(&C, "C");
    rpc_global_init();
    dev_stagesvc_opts so = {.listen = "127.0.0.1:0", .state = A.dir, .exchange = r_exchange,
                            .admit = r_admit, .revoked = r_revoked};
    sl_err err = {0};
    int port = 0;
    dev_stagesvc *svc = dev_stagesvc_start(&so, &port, &err);
    if (!svc) {
        fprintf(stderr, "Stage server: %s\n", err.msg);
        return 1;
    }
    snprintf(A.addr, sizeof A.addr, "127.0.0.1:%d", port);
    RUN(test_outsiders_take_no_place);
    RUN(test_neighbour_without_hello);
    RUN(test_queue_bound);
    RUN(test_revoked_link_closed);
    RUN(test_close_and_free_never_wait);
    RUN(test_sync);
    rpc_stream_counts sc;
    dev_stagesvc_counts(svc, &sc);
    CHECKF(sc.admit >= 101 && sc.per_peer == 1, "admit %ld per_peer %ld", sc.admit, sc.per_peer);
    CHECK(dev_stagesvc_stop(svc) == 0);
    rpc_global_shutdown();
    tu_rmtree(root);
    return sl_test_done();
}
