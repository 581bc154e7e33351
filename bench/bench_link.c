/* bench_link - two processes on loopback, mutual TLS, streaming 4 MiB
 * activation tensors (8 x 128 x 1024 f32) over the Stage Exchange stream:
 * raw gRPC bytes first, then frames with each codec, plain and sealed.
 *
 * Goodput is in MB/s of the f32 tensor (4.19 MB per tensor) delivered and,
 * for frames, decoded on the receiver; every cell is the median of REPS runs
 * of TENSORS tensors each, configurations interleaved within a run so load
 * from elsewhere hits all rows alike. Both ends pipeline: the sender encodes
 * tensor i+1 while gRPC sends tensor i, the receiver decodes tensor i while
 * gRPC receives tensor i+1. "wire bytes" is the gRPC message per tensor (frame
 * plus its 4..6-byte StageFrame prefix; the raw row sends the f32 bytes as
 * they are); TLS and HTTP/2 framing add the same small share to every row.
 * Each stream starts with WARM untimed tensors of its own kind and waits for
 * the receiver to confirm them, so that every timed run starts from the
 * steady state (HTTP/2 flow-control windows grown) whatever ran before.
 *
 *   bench_link [reps] [tensors]     (default 5 and 24)
 *
 * CPU per tensor is split into the threads that encode (sender) and decode
 * (receiver) and the rest of each process (gRPC, HTTP/2, TLS); "free-core
 * bound" is the goodput if each of the four parts had a core of its own
 * (one tensor per slowest part): a model, for machines with spare cores.
 *
 * The receiver checks every frame (tags, window, codec) and the sender that
 * all were accepted; a refusal or a short count fails the benchmark. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "cert.h"
#include "dev_codec.h"
#include "dev_frame.h"
#include "rpc.h"
#include "sl_mem.h"
#include "sl_rng.h"
#include "sl_time.h"

#define D0 8
#define D1 128
#define D2 1024
#define N ((size_t)D0 * D1 * D2)
#define TENSOR_BYTES (N * sizeof(float))
#define MAX_REPS 32
#define MAX_MSG (16u << 20)
#define PREFIX 11 /* room for the StageFrame tag and length */
#define WARM 2
#define SUMMARY 40 /* the receiver's reply: counts, bytes, checksum, CPU seconds */

enum { MODE_RAW = 0, MODE_FRAME = 1 };

typedef struct config {
    uint8_t mode, codec, sealed;
    uint32_t count, epoch;
} config;

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "bench_link: %s: %s\n", what, msg);
    exit(1);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* CPU seconds (user + system) of this process, all threads. */
static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

static void link_keys(dev_kx_keypair *snd, dev_kx_keypair *rcv)
{
    uint8_t s1[32], s2[32];
    memset(s1, 1, sizeof s1);
    memset(s2, 2, sizeof s2);
    sl_err err = {0};
    if (dev_kx_keypair_from_seed(snd, s1, &err) || dev_kx_keypair_from_seed(rcv, s2, &err))
        die("keys", err.msg);
}

static dev_link_cfg link_cfg(const config *c)
{
    dev_link_cfg lc = {.job_id = 1, .epoch = c->epoch, .from_stage = 0, .to_stage = 1,
                       .sealed = c->sealed};
    return lc;
}

/* ---- a two-slot hand-over between a producer and a consumer thread -------- */

typedef struct slot {
    rpc_buf buf;  /* receiver: a message */
    rpc_msg msg;  /* sender: a message built in place */
    size_t off, len;
} slot;

typedef struct queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    slot s[2];
    unsigned head, tail; /* head - tail = filled slots */
} queue;

static void q_init(queue *q)
{
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
}
static void q_destroy(queue *q)
{
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
}
static slot *q_free_slot(queue *q)
{
    pthread_mutex_lock(&q->mu);
    while (q->head - q->tail == 2)
        pthread_cond_wait(&q->cv, &q->mu);
    slot *s = &q->s[q->head & 1];
    pthread_mutex_unlock(&q->mu);
    return s;
}
static void q_push(queue *q)
{
    pthread_mutex_lock(&q->mu);
    q->head++;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}
static slot *q_front(queue *q)
{
    pthread_mutex_lock(&q->mu);
    while (q->head == q->tail)
        pthread_cond_wait(&q->cv, &q->mu);
    slot *s = &q->s[q->tail & 1];
    pthread_mutex_unlock(&q->mu);
    return s;
}
static void q_pop(queue *q)
{
    pthread_mutex_lock(&q->mu);
    q->tail++;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

/* ---- receiver (the child process) ------------------------------------------ */

typedef struct rx_job {
    queue q;
    rpc_stream *st;
    config c;
    dev_link_rx rx;
    float *y;
    uint32_t accepted, refused;
    uint64_t bytes;
    double checksum;
    double cpu0, cpu1; /* CPU seconds at READY and at the end */
    double work;       /* CPU seconds of this thread decoding the timed tensors */
} rx_job;

static void *decoder(void *arg)
{
    rx_job *j = arg;
    for (;;) {
        slot *s = q_front(&j->q);
        if (!s->buf.data && s->len == 1) { /* end marker */
            j->cpu1 = cpu_s();
            q_pop(&j->q);
            return NULL;
        }
        j->bytes += s->buf.len;
        int timed = j->accepted + j->refused >= WARM;
        double w0 = timed ? bench_thread_cpu_s() : 0;
        if (j->c.mode == MODE_RAW) {
            j->accepted += s->buf.len == TENSOR_BYTES;
            j->refused += s->buf.len != TENSOR_BYTES;
        } else {
            const uint8_t *f;
            size_t n;
            dev_frame_hdr h;
            if (rpc_frame_unwrap(s->buf.data, s->buf.len, &f, &n) != 0 ||
                dev_frame_decode(&j->rx, f, n, &h, j->y, N, NULL) != 0) {
                j->refused++;
            } else {
                j->accepted++;
                j->checksum += j->y[N / 2];
            }
        }
        if (timed)
            j->work += bench_thread_cpu_s() - w0;
        rpc_buf_free(&s->buf);
        q_pop(&j->q);
        if (j->accepted + j->refused == WARM) {
            j->cpu0 = cpu_s();
            rpc_stream_send(j->st, "READY", 5, NULL); /* timing starts at the sender */
        }
    }
}

static int exchange(void *ud, const rpc_peer *peer, rpc_stream *st, rpc_status *status)
{
    (void)ud;
    (void)peer;
    static float *y; /* one stream at a time */
    rpc_buf m;
    if (rpc_stream_recv(st, &m, NULL) != 1 || m.len != 16 || memcmp(m.data, "SLBN", 4)) {
        if (m.data)
            rpc_buf_free(&m);
        return rpc_status_set(status, RPC_INVALID_ARGUMENT, "expected a bench config");
    }
    rx_job *j = sl_xcalloc(1, sizeof *j);
    j->st = st;
    j->c.mode = m.data[4];
    j->c.codec = m.data[5];
    j->c.sealed = m.data[6];
    j->c.count = get32(m.data + 8);
    j->c.epoch = get32(m.data + 12);
    rpc_buf_free(&m);
    if (!y)
        y = sl_xaligned_alloc(TENSOR_BYTES);
    j->y = y;
    dev_kx_keypair snd, rcv;
    link_keys(&snd, &rcv);
    dev_link_cfg lc = link_cfg(&j->c);
    sl_err err = {0};
    if (dev_link_rx_init(&j->rx, &lc, &rcv, snd.pk, &err))
        die("rx init", err.msg);
    q_init(&j->q);
    pthread_t t;
    pthread_create(&t, NULL, decoder, j);
    int code = RPC_OK;
    for (;;) {
        slot *s = q_free_slot(&j->q);
        int r = rpc_stream_recv(st, &s->buf, NULL);
        if (r != 1) {
            memset(&s->buf, 0, sizeof s->buf);
            s->len = 1;
            q_push(&j->q);
            if (r < 0)
                code = rpc_status_set(status, RPC_CANCELLED, "receive failed");
            break;
        }
        s->len = 0;
        q_push(&j->q);
    }
    pthread_join(t, NULL);
    uint8_t sum[SUMMARY];
    double cpu = j->cpu1 - j->cpu0;
    put32(sum, j->accepted);
    put32(sum + 4, j->refused);
    memcpy(sum + 8, &j->bytes, 8);
    memcpy(sum + 16, &j->checksum, 8);
    memcpy(sum + 24, &cpu, 8);
    memcpy(sum + 32, &j->work, 8);
    if (code == RPC_OK && rpc_stream_send(st, sum, sizeof sum, NULL) != 0)
        code = rpc_status_set(status, RPC_CANCELLED, "send failed");
    dev_link_rx_free(&j->rx);
    q_destroy(&j->q);
    free(j);
    return code;
}

static void serve(const char *pki, int port_fd, int ctl_fd)
{
    rpc_global_init();
    rpc_server_opts o = {.listen = "127.0.0.1:0",
                         .tls = {NULL, NULL, NULL},
                         .client_auth = RPC_CLIENT_CERT_REQUIRED,
                         .max_message = MAX_MSG};
    char ca[512], crt[512], key[512];
    snprintf(ca, sizeof ca, "%s/ca.crt", pki);
    snprintf(crt, sizeof crt, "%s/coordinator.crt", pki);
    snprintf(key, sizeof key, "%s/coordinator.key", pki);
    o.tls.ca = ca;
    o.tls.cert = crt;
    o.tls.key = key;
    sl_err err = {0};
    rpc_server *srv = rpc_server_create(&o, &err);
    if (!srv || rpc_server_add_stream(srv, RPC_M_STAGE_EXCHANGE, exchange, NULL, &err))
        die("server", err.msg);
    int port = rpc_server_start(srv, &err);
    if (port < 0)
        die("server start", err.msg);
    if (write(port_fd, &port, sizeof port) != sizeof port)
        die("server", "cannot report the port");
    close(port_fd);
    char c;
    while (read(ctl_fd, &c, 1) > 0) /* until the parent closes the pipe */
        ;
    rpc_server_destroy(srv);
    rpc_global_shutdown();
    _exit(0);
}

/* ---- sender ------------------------------------------------------------------ */

typedef struct tx_job {
    queue q;
    config c;
    const float *x;
    dev_link_tx tx;
    dev_topk_ef ef;
    size_t cap;
    size_t wire; /* bytes of the last message */
    double work; /* CPU seconds of this thread encoding the timed tensors */
} tx_job;

static void *encoder(void *arg)
{
    tx_job *j = arg;
    for (uint32_t i = 0; i < WARM + j->c.count; i++) {
        slot *s = q_free_slot(&j->q);
        rpc_msg_alloc(&s->msg, PREFIX + j->cap);
        double w0 = bench_thread_cpu_s();
        if (j->c.mode == MODE_RAW) {
            memcpy(s->msg.data, j->x, TENSOR_BYTES);
            s->off = 0;
            s->len = TENSOR_BYTES;
        } else {
            int topk = j->c.codec == DEV_CODEC_TOPK;
            dev_frame_hdr h = {.direction = topk ? DEV_DIR_GRADIENT : DEV_DIR_ACTIVATION,
                               .codec = j->c.codec, .step = i, .ndim = 3,
                               .dims = {D0, D1, D2}, .k = topk ? (uint32_t)dev_topk_k(N, 0.01) : 0};
            size_t len;
            sl_err err = {0};
            if (dev_frame_encode(&j->tx, &h, j->x, topk ? &j->ef : NULL, s->msg.data + PREFIX,
                                 j->cap, &len, &err))
                die("encode", err.msg);
            uint8_t hdr[11];
            size_t hl = rpc_frame_wrap(hdr, len);
            memcpy(s->msg.data + PREFIX - hl, hdr, hl);
            s->off = PREFIX - hl;
            s->len = hl + len;
        }
        if (i >= WARM)
            j->work += bench_thread_cpu_s() - w0;
        q_push(&j->q);
    }
    return NULL;
}

/* CPU seconds over the timed part of one run: each process, and within it
 * the thread that encodes (sender) or decodes (receiver) the tensors. */
enum { CPU_SND, CPU_RCV, CPU_ENC, CPU_DEC, CPU_PARTS };

/* One stream of c->count tensors; returns seconds, wire bytes per tensor in
 * *wire, CPU seconds in cpu[CPU_PARTS]. */
static double run(rpc_channel *ch, const config *c, const float *x, size_t *wire, double *cpu)
{
    sl_err err = {0};
    rpc_stream *st = rpc_stream_open(ch, RPC_M_STAGE_EXCHANGE, 120000, &err);
    if (!st)
        die("open", err.msg);
    uint8_t cfgmsg[16] = {'S', 'L', 'B', 'N', c->mode, c->codec, c->sealed, 0};
    put32(cfgmsg + 8, c->count);
    put32(cfgmsg + 12, c->epoch);
    if (rpc_stream_send(st, cfgmsg, sizeof cfgmsg, &err))
        die("send", err.msg);
    tx_job *j = sl_xcalloc(1, sizeof *j);
    j->c = *c;
    j->x = x;
    dev_kx_keypair snd, rcv;
    link_keys(&snd, &rcv);
    dev_link_cfg lc = link_cfg(c);
    if (dev_link_tx_init(&j->tx, &lc, &snd, rcv.pk, &err) || dev_topk_ef_init(&j->ef, N, &err))
        die("tx init", err.msg);
    dev_frame_hdr h = {.direction = DEV_DIR_ACTIVATION, .codec = DEV_CODEC_NONE, .ndim = 3,
                       .dims = {D0, D1, D2}};
    j->cap = c->mode == MODE_RAW ? TENSOR_BYTES : dev_frame_max_len(&h);
    q_init(&j->q);
    pthread_t t;
    pthread_create(&t, NULL, encoder, j);
    double t0 = 0;
    rpc_buf m;
    for (uint32_t i = 0; i < WARM + c->count; i++) {
        if (i == WARM) {
            if (rpc_stream_recv(st, &m, &err) != 1 || m.len != 5)
                die("warm-up", "the receiver did not confirm");
            rpc_buf_free(&m);
            t0 = sl_now_s();
            cpu[CPU_SND] = -cpu_s();
        }
        slot *s = q_front(&j->q);
        *wire = s->len;
        if (rpc_stream_send_msg(st, &s->msg, s->off, s->len, &err))
            die("send", err.msg);
        q_pop(&j->q);
    }
    pthread_join(t, NULL);
    if (rpc_stream_close_send(st, &err))
        die("close", err.msg);
    if (rpc_stream_recv(st, &m, &err) != 1 || m.len != SUMMARY)
        die("summary", "the receiver sent no summary");
    double secs = sl_now_s() - t0;
    cpu[CPU_SND] += cpu_s();
    memcpy(&cpu[CPU_RCV], m.data + 24, 8);
    memcpy(&cpu[CPU_DEC], m.data + 32, 8);
    cpu[CPU_ENC] = j->work;
    uint32_t accepted = get32(m.data), refused = get32(m.data + 4);
    rpc_buf_free(&m);
    rpc_status status;
    if (rpc_stream_finish(st, &status) != RPC_OK)
        die("stream", status.details);
    if (accepted != WARM + c->count || refused)
        die("receiver", "frames were refused or lost");
    dev_link_tx_free(&j->tx);
    dev_topk_ef_free(&j->ef);
    q_destroy(&j->q);
    free(j);
    return secs;
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    int count = argc > 2 ? atoi(argv[2]) : 24;
    if (reps < 1 || reps > MAX_REPS)
        reps = 5;
    if (count < 2 || count > 1000)
        count = 24;
    char root[] = "/tmp/skyloom-bench-XXXXXX", pki[64];
    if (!mkdtemp(root))
        die("mkdtemp", "failed");
    snprintf(pki, sizeof pki, "%s/pki", root);
    sl_err err = {0};
    if (cert_pki_init(pki, NULL, NULL, &err))
        die("pki", err.msg);
    /* Fork before gRPC exists in this process. */
    int port_pipe[2], ctl_pipe[2];
    if (pipe(port_pipe) || pipe(ctl_pipe))
        die("pipe", "failed");
    pid_t child = fork();
    if (child < 0)
        die("fork", "failed");
    if (child == 0) {
        close(port_pipe[0]);
        close(ctl_pipe[1]);
        serve(pki, port_pipe[1], ctl_pipe[0]);
    }
    close(port_pipe[1]);
    close(ctl_pipe[0]);
    int port = 0;
    if (read(port_pipe[0], &port, sizeof port) != sizeof port || port <= 0) {
        kill(child, SIGTERM);
        die("receiver", "did not start");
    }
    close(port_pipe[0]);

    rpc_global_init();
    char target[64], ca[128], crt[128], key[128];
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
    snprintf(ca, sizeof ca, "%s/ca.crt", pki);
    snprintf(crt, sizeof crt, "%s/admin.crt", pki);
    snprintf(key, sizeof key, "%s/admin.key", pki);
    rpc_channel_opts co = {.target = target, .tls = {ca, crt, key}, .max_message = MAX_MSG};
    rpc_channel *ch = rpc_channel_create(&co, &err);
    if (!ch)
        die("channel", err.msg);

    float *x = sl_xaligned_alloc(TENSOR_BYTES);
    for (size_t i = 0; i < N; i++)
        x[i] = sl_rng_normal(1, 2, i);
    enum { NCFG = 11 };
    config cfg[NCFG];
    cfg[0] = (config){MODE_RAW, 0, 0, (uint32_t)count, 0};
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < 5; k++)
            cfg[1 + s * 5 + k] = (config){MODE_FRAME, (uint8_t)k, (uint8_t)s, (uint32_t)count, 0};
    static double secs[NCFG][MAX_REPS], cpu[NCFG][CPU_PARTS][MAX_REPS], total[NCFG][MAX_REPS];
    double one[CPU_PARTS];
    size_t wire[NCFG];
    uint32_t epoch = 1;
    config warm = cfg[6];
    warm.count = 2;
    warm.epoch = epoch++;
    run(ch, &warm, x, &wire[0], one); /* connection, TLS handshake, first allocations */
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < NCFG; k++) {
            cfg[k].epoch = epoch++; /* fresh keys' nonces: never reuse (key, epoch) */
            secs[k][r] = run(ch, &cfg[k], x, &wire[k], one);
            for (int i = 0; i < CPU_PARTS; i++)
                cpu[k][i][r] = one[i] / count;
            total[k][r] = (one[CPU_SND] + one[CPU_RCV]) / count;
            /* what is not encoding or decoding: gRPC, HTTP/2, TLS, the hand-over */
            cpu[k][CPU_SND][r] -= cpu[k][CPU_ENC][r];
            cpu[k][CPU_RCV][r] -= cpu[k][CPU_DEC][r];
        }

    printf("bench_link: %d x %zu-byte tensors (8 x 128 x 1024 f32) per run, median of %d runs\n\n",
           count, TENSOR_BYTES, reps);
    printf("| stream | wire bytes/tensor | fewer bytes than raw | goodput MB/s | vs raw | "
           "CPU ms/tensor (both ends) | encode / decode ms | gRPC+TLS send / recv ms | "
           "free-core bound MB/s | vs raw |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    double raw = 0, raw_bound = 0;
    for (int k = 0; k < NCFG; k++) {
        double m = bench_median(secs[k], reps);
        double gp = (double)count * TENSOR_BYTES / m / 1e6;
        if (k == 0)
            raw = gp;
        char name[48];
        if (k == 0)
            snprintf(name, sizeof name, "raw gRPC bytes");
        else
            snprintf(name, sizeof name, "frames %s%s, %s", dev_codec_name(cfg[k].codec),
                     cfg[k].codec == DEV_CODEC_TOPK ? " 1%" : "",
                     cfg[k].sealed ? "sealed" : "plain");
        double part[CPU_PARTS], slowest = 0;
        for (int i = 0; i < CPU_PARTS; i++) {
            part[i] = bench_median(cpu[k][i], reps);
            slowest = part[i] > slowest ? part[i] : slowest;
        }
        /* Each part on a core of its own, each taking its CPU time: the
         * pipeline moves one tensor per slowest part. */
        double bound = TENSOR_BYTES / slowest / 1e6;
        if (k == 0)
            raw_bound = bound;
        printf("| %s | %zu | %.2fx | %.0f | %.0f%% | %.1f | %.1f / %.1f | %.1f / %.1f | %.0f | "
               "%.0f%% |\n",
               name, wire[k], (double)wire[0] / (double)wire[k], gp, 100.0 * gp / raw,
               1e3 * bench_median(total[k], reps), 1e3 * part[CPU_ENC], 1e3 * part[CPU_DEC],
               1e3 * part[CPU_SND], 1e3 * part[CPU_RCV], bound, 100.0 * bound / raw_bound);
    }
    rpc_channel_destroy(ch);
    rpc_global_shutdown();
    sl_aligned_free(x);
    close(ctl_pipe[1]);
    int status = 0;
    waitpid(child, &status, 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_link: could not remove %s\n", root);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
