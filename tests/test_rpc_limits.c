/* test_rpc_limits.c - the rpc_ server under pressure.
 *
 * - A connection flood: a child process serves under a low descriptor
 *   limit; the parent opens more connections than the child has
 *   descriptors, checks that a connection made before the flood is served
 *   during it, closes the flood and checks that a new connection is served
 *   again within a few seconds.
 * - Per-method workers: a handler blocked in one method does not delay
 *   another method; the method's queue is bounded.
 * - Deadlines: a handler that does not answer in its method's time gets its
 *   call answered DEADLINE_EXCEEDED.
 * - Streams: at most max_streams at once; an idle stream is cancelled.
 * - Who may hold a stream: callers an admit function refuses are turned
 *   away at the door and take no one's place; a cap per caller; a client's
 *   own idle limit bounds its receive and its finish against a server that
 *   never answers; an opening stream can be interrupted.
 * - Shutdown with a handler blocked for good (in a child process, since the
 *   server is then left behind): rpc_server_destroy returns within its grace
 *   period instead of waiting. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>

#include "rpc.h"
#include "sl_file.h"
#include "sl_test.h"
#include "trust_util.h"

#define LIMIT 128 /* the flood child's descriptor limit */
#define FLOOD (3 * LIMIT)
#define T_MS 60000 /* deadline of calls expected to succeed */

static char root[256], pki[512], portfile[512], logfile[512];
static pid_t flood_child = -1, stop_child = -1;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_ms(int ms) { poll(NULL, 0, ms); }

/* ---- handlers ---------------------------------------------------------------- */

static int echo(void *ud, const rpc_peer *peer, const uint8_t *req, size_t len, rpc_buf *resp,
                rpc_status *st)
{
    (void)ud;
    (void)peer;
    (void)st;
    resp->data = malloc(len ? len : 1);
    memcpy(resp->data, req, len);
    resp->len = len;
    return RPC_OK;
}

/* A gate that blocked handlers wait at (at most `limit_s`, so that a broken
 * test cannot hang); `inside` counts the handlers waiting. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open, inside, limit_s;
} gate;

static gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 60};

static void gate_set(int open)
{
    pthread_mutex_lock(&g.mu);
    g.open = open;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
}

static int gate_inside(void)
{
    pthread_mutex_lock(&g.mu);
    int n = g.inside;
    pthread_mutex_unlock(&g.mu);
    return n;
}

/* Waits at the gate (at most g.limit_s). */
static void gate_wait(void)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += g.limit_s;
    pthread_mutex_lock(&g.mu);
    g.inside++;
    pthread_cond_broadcast(&g.cv);
    while (!g.open)
        if (pthread_cond_timedwait(&g.cv, &g.mu, &until) == ETIMEDOUT)
            break;
    g.inside--;
    pthread_mutex_unlock(&g.mu);
}

static int blocked(void *ud, const rpc_peer *peer, const uint8_t *req, size_t len, rpc_buf *resp,
                   rpc_status *st)
{
    gate_wait();
    return echo(ud, peer, req, len, resp, st);
}

/* Waits (a few seconds at most) until n handlers are at the gate. */
static int wait_inside(int n)
{
    for (double end = now_s() + 20; now_s() < end; sleep_ms(5))
        if (gate_inside() >= n)
            return 1;
    return 0;
}

static int stream_echo(void *ud, const rpc_peer *peer, rpc_stream *s, rpc_status *st)
{
    (void)ud;
    (void)peer;
    for (;;) {
        rpc_buf m;
        int r = rpc_stream_recv(s, &m, NULL);
        if (r == 0)
            return RPC_OK;
        if (r < 0)
            return rpc_status_set(st, RPC_CANCELLED, "receive failed");
        int rc = rpc_stream_send(s, m.data, m.len, NULL);
        rpc_buf_free(&m);
        if (rc)
            return rpc_status_set(st, RPC_CANCELLED, "send failed");
    }
}

/* A stream handler that neither reads nor ends until the gate opens. */
static int stream_hang(void *ud, const rpc_peer *peer, rpc_stream *s, rpc_status *st)
{
    (void)ud;
    (void)peer;
    (void)s;
    (void)st;
    gate_wait();
    return RPC_OK;
}

/* Admits every caller but the admin certificate. */
static int admit_not_admin(void *ud, const rpc_peer *peer, rpc_status *st)
{
    (void)ud;
    if (!strcmp(peer->identity, "skyloom-admin"))
        return rpc_status_set(st, RPC_PERMISSION_DENIED, "%s may not hold a stream here",
                              peer->identity);
    return RPC_OK;
}

/* ---- clients ------------------------------------------------------------------ */

static rpc_server *start(rpc_server_opts *o, const rpc_unary_opts *slow, int *port)
{
    o->listen = "127.0.0.1:0";
    o->tls = (rpc_tls_files){tu_path(pki, "ca.crt"), tu_path(pki, "coordinator.crt"),
                             tu_path(pki, "coordinator.key")};
    o->client_auth = RPC_CLIENT_CERT_OPTIONAL;
    sl_err err = {0};
    rpc_server *s = rpc_server_create(o, &err);
    CHECKF(s != NULL, "%s", err.msg);
    if (!s)
        exit(1);
    CHECK(rpc_server_add_unary(s, "/t.T/Echo", echo, NULL, &err) == 0);
    CHECK(rpc_server_add_unary_opts(s, "/t.T/Slow", slow, blocked, NULL, &err) == 0);
    CHECK(rpc_server_add_stream(s, "/t.T/Stream", stream_echo, NULL, &err) == 0);
    rpc_stream_opts so = {.admit = admit_not_admin, .max_per_peer = 2};
    CHECK(rpc_server_add_stream_opts(s, "/t.T/Guarded", &so, stream_echo, NULL, &err) == 0);
    CHECK(rpc_server_add_stream(s, "/t.T/Hang", stream_hang, NULL, &err) == 0);
    *port = rpc_server_start(s, &err);
    CHECKF(*port > 0, "%s", err.msg);
    return s;
}

static rpc_channel *dial_as(int port, const char *who)
{
    char target[64], crt[64], key[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
    snprintf(crt, sizeof crt, "%s.crt", who);
    snprintf(key, sizeof key, "%s.key", who);
    rpc_channel_opts o = {.target = target,
                          .tls = {tu_path(pki, "ca.crt"), tu_path(pki, crt), tu_path(pki, key)}};
    sl_err err = {0};
    rpc_channel *c = rpc_channel_create(&o, &err);
    CHECKF(c != NULL, "%s", err.msg);
    return c;
}

static rpc_channel *dial(int port) { return dial_as(port, "admin"); }

static int call(rpc_channel *c, const char *method, int64_t timeout_ms, rpc_status *st)
{
    rpc_buf r;
    rpc_status tmp;
    if (!st)
        st = &tmp;
    int code = rpc_call_unary(c, method, "ping", 4, timeout_ms, &r, st);
    if (code == RPC_OK) {
        code = r.len == 4 && !memcmp(r.data, "ping", 4) ? RPC_OK : RPC_DATA_LOSS;
        rpc_buf_free(&r);
    }
    return code;
}

/* A call on a thread of its own. */
typedef struct bg_call {
    pthread_t t;
    rpc_channel *c;
    const char *method;
    int code;
    rpc_status st;
} bg_call;

static void *bg_main(void *arg)
{
    bg_call *b = arg;
    b->code = call(b->c, b->method, T_MS, &b->st);
    return NULL;
}

static void bg_start(bg_call *b, rpc_channel *c, const char *method)
{
    b->c = c;
    b->method = method;
    b->code = -1;
    if (pthread_create(&b->t, NULL, bg_main, b) != 0) {
        perror("pthread_create");
        exit(1);
    }
}

/* ---- the flood ------------------------------------------------------------------ */

/* The flood server: runs until SIGTERM, its stderr in logfile. */
static void flood_serve(void)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = open(logfile, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        dup2(fd, 2);
        close(fd);
    }
    struct rlimit rl = {LIMIT, LIMIT};
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
        perror("setrlimit");
        _exit(1);
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    rpc_global_init();
    rpc_server_opts o = {.listen = "127.0.0.1:0",
                         .tls = {tu_path(pki, "ca.crt"), tu_path(pki, "coordinator.crt"),
                                 tu_path(pki, "coordinator.key")},
                         .client_auth = RPC_CLIENT_CERT_OPTIONAL};
    sl_err err = {0};
    rpc_server *s = rpc_server_create(&o, &err);
    int port = -1;
    if (s && rpc_server_add_unary(s, "/t.T/Echo", echo, NULL, &err) == 0)
        port = rpc_server_start(s, &err);
    char line[16];
    snprintf(line, sizeof line, "%d\n", port);
    if (port <= 0 || sl_write_file_atomic(portfile, line, strlen(line), &err)) {
        fprintf(stderr, "server: %s\n", err.msg);
        _exit(1);
    }
    int sig;
    sigwait(&set, &sig);
    int rc = rpc_server_destroy(s);
    rpc_global_shutdown();
    _exit(rc == 0 ? 0 : 1);
}

static int wait_port(void)
{
    for (double end = now_s() + 30; now_s() < end; sleep_ms(20)) {
        FILE *f = fopen(portfile, "r");
        int port = 0;
        if (f) {
            int ok = fscanf(f, "%d", &port) == 1;
            fclose(f);
            if (ok && port > 0)
                return port;
        }
        int status;
        if (waitpid(flood_child, &status, WNOHANG) == flood_child) {
            flood_child = -1;
            return -1;
        }
    }
    return -1;
}

static int log_has(const char *what)
{
    char *buf;
    size_t n;
    if (sl_read_file(logfile, 1u << 24, &buf, &n, NULL))
        return 0;
    int found = strstr(buf, what) != NULL;
    free(buf);
    return found;
}

/* Retries on fresh channels until a call succeeds or `seconds` pass. */
static int served_within(int port, double seconds)
{
    for (double end = now_s() + seconds; now_s() < end; sleep_ms(100)) {
        rpc_channel *c = dial(port);
        int code = call(c, "/t.T/Echo", 2000, NULL);
        rpc_channel_destroy(c);
        if (code == RPC_OK)
            return 1;
    }
    return 0;
}

static void test_flood(void)
{
    int port = wait_port();
    CHECKF(port > 0, "the server did not start (log: %s)", logfile);
    if (port <= 0)
        return;
    rpc_channel *before = dial(port);
    CHECK(call(before, "/t.T/Echo", T_MS, NULL) == RPC_OK);
    int fds[FLOOD], n = 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (int i = 0; i < FLOOD; i++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            break;
        if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            close(fd);
            continue;
        }
        fds[n++] = fd;
    }
    CHECKF(n > LIMIT, "only %d connections made", n);
    /* The server has run into its limit once it says so (gRPC's own words
     * on an unprotected listener, ours otherwise). */
    int hit = 0;
    for (double end = now_s() + 30; now_s() < end && !hit; sleep_ms(50))
        hit = log_has("descriptor limit") || log_has("accept4");
    CHECKF(hit, "the server never reached its descriptor limit (log: %s)", logfile);
    /* A peer that was connected before keeps being served. */
    CHECK(call(before, "/t.T/Echo", T_MS, NULL) == RPC_OK);
    for (int i = 0; i < n; i++)
        close(fds[i]);
    /* The flood is over: a new connection is served again. */
    CHECKF(served_within(port, 15), "no call succeeded within 15 s after the flood (log: %s)",
           logfile);
    CHECK(call(before, "/t.T/Echo", T_MS, NULL) == RPC_OK);
    rpc_channel_destroy(before);
}

/* ---- workers, queues, deadlines --------------------------------------------------- */

static void test_methods_do_not_wait_for_each_other(void)
{
    int port;
    rpc_server_opts o = {0};
    rpc_unary_opts slow = {.workers = 1, .max_queue = 1};
    rpc_server *s = start(&o, &slow, &port);
    rpc_channel *c = dial(port);
    gate_set(0);
    bg_call b1, b2;
    bg_start(&b1, c, "/t.T/Slow");
    CHECK(wait_inside(1));
    /* Slow's only worker is blocked: Echo is answered all the same. */
    for (int i = 0; i < 5; i++)
        CHECK(call(c, "/t.T/Echo", 10000, NULL) == RPC_OK);
    /* Slow's queue holds one call (b2's or, if it came first, one of these);
     * the next one is refused at once. */
    bg_start(&b2, c, "/t.T/Slow");
    rpc_status st = {0};
    int code = -1;
    for (double end = now_s() + 20; now_s() < end && code != RPC_RESOURCE_EXHAUSTED; sleep_ms(20))
        code = call(c, "/t.T/Slow", 2000, &st);
    CHECKF(code == RPC_RESOURCE_EXHAUSTED, "code %s: %s", rpc_code_name(code), st.details);
    CHECKF(strstr(st.details, "waiting") != NULL, "%s", st.details);
    gate_set(1);
    pthread_join(b1.t, NULL);
    pthread_join(b2.t, NULL);
    CHECK(b1.code == RPC_OK);
    CHECK(b2.code == RPC_OK || b2.code == RPC_RESOURCE_EXHAUSTED);
    rpc_channel_destroy(c);
    CHECK(rpc_server_destroy(s) == 0);
}

static void test_deadline(void)
{
    int port;
    rpc_server_opts o = {0};
    rpc_unary_opts slow = {.workers = 1, .timeout_ms = 300};
    rpc_server *s = start(&o, &slow, &port);
    rpc_channel *c = dial(port);
    gate_set(0);
    rpc_status st = {0};
    /* the client would wait a minute; the server answers when the method's time is up */
    CHECK(call(c, "/t.T/Slow", T_MS, &st) == RPC_DEADLINE_EXCEEDED);
    CHECKF(strstr(st.details, "deadline") != NULL, "%s", st.details);
    /* the worker is still blocked: the next call waits in the queue past its
     * deadline and is answered without running */
    CHECK(gate_inside() == 1);
    CHECK(call(c, "/t.T/Slow", T_MS, &st) == RPC_DEADLINE_EXCEEDED);
    gate_set(1);
    /* the late answer was dropped; the worker serves again */
    CHECK(call(c, "/t.T/Slow", T_MS, &st) == RPC_OK);
    CHECK(call(c, "/t.T/Echo", T_MS, &st) == RPC_OK);
    rpc_channel_destroy(c);
    CHECK(rpc_server_destroy(s) == 0);
}

/* ---- streams ------------------------------------------------------------------- */

static void test_stream_limits(void)
{
    int port;
    rpc_server_opts o = {.max_streams = 2, .stream_idle_ms = 2000};
    rpc_unary_opts slow = {0};
    rpc_server *s = start(&o, &slow, &port);
    rpc_channel *c = dial(port);
    sl_err err = {0};
    rpc_stream *st[3];
    for (int i = 0; i < 2; i++) {
        st[i] = rpc_stream_open(c, "/t.T/Stream", T_MS, &err);
        rpc_buf m;
        CHECK(st[i] && rpc_stream_send(st[i], "x", 1, &err) == 0 &&
              rpc_stream_recv(st[i], &m, &err) == 1);
        if (st[i])
            rpc_buf_free(&m);
    }
    /* two streams are running: a third is refused */
    st[2] = rpc_stream_open(c, "/t.T/Stream", T_MS, &err);
    rpc_status fs = {0};
    CHECK(st[2] != NULL && rpc_stream_finish(st[2], &fs) == RPC_RESOURCE_EXHAUSTED);
    CHECKF(strstr(fs.details, "too many streams") != NULL, "%s", fs.details);
    /* the two stay quiet longer than the idle limit: the server cancels them */
    for (int i = 0; i < 2; i++) {
        rpc_buf m;
        CHECK(st[i] && rpc_stream_recv(st[i], &m, &err) != 1);
        CHECK(st[i] && rpc_stream_finish(st[i], &fs) == RPC_DEADLINE_EXCEEDED);
        CHECKF(strstr(fs.details, "no stream message") != NULL, "%s", fs.details);
    }
    /* and a new stream is accepted once they are gone */
    int ok = 0;
    for (double end = now_s() + 20; now_s() < end && !ok; sleep_ms(20)) {
        rpc_stream *n = rpc_stream_open(c, "/t.T/Stream", T_MS, &err);
        rpc_buf m;
        ok = n && rpc_stream_send(n, "y", 1, &err) == 0 && rpc_stream_recv(n, &m, &err) == 1;
        if (ok)
            rpc_buf_free(&m);
        if (n)
            ok &= rpc_stream_finish(n, &fs) == RPC_OK;
    }
    CHECK(ok);
    rpc_channel_destroy(c);
    CHECK(rpc_server_destroy(s) == 0);
}

/* Callers the admit function refuses never count against max_streams; one
 * caller holds at most max_per_peer streams of a method. */
static void test_stream_admission(void)
{
    int port;
    rpc_server_opts o = {.max_streams = 3};
    rpc_unary_opts slow = {0};
    rpc_server *s = start(&o, &slow, &port);
    rpc_channel *admin = dial(port), *coord = dial_as(port, "coordinator");
    sl_err err = {0};
    rpc_status fs = {0};
    /* the refused caller opens more streams than the server has room for */
    for (int i = 0; i < 10; i++) {
        rpc_stream *x = rpc_stream_open(admin, "/t.T/Guarded", T_MS, &err);
        CHECK(x != NULL && rpc_stream_finish(x, &fs) == RPC_PERMISSION_DENIED);
        CHECKF(strstr(fs.details, "may not hold a stream") != NULL, "%s", fs.details);
    }
    /* an admitted caller gets its two; a third is over its cap */
    rpc_stream *st[2];
    for (int i = 0; i < 2; i++) {
        st[i] = rpc_stream_open(coord, "/t.T/Guarded", T_MS, &err);
        rpc_buf m;
        CHECK(st[i] && rpc_stream_send(st[i], "x", 1, &err) == 0 &&
              rpc_stream_recv(st[i], &m, &err) == 1);
        if (st[i])
            rpc_buf_free(&m);
    }
    rpc_stream *x = rpc_stream_open(coord, "/t.T/Guarded", T_MS, &err);
    CHECK(x != NULL && rpc_stream_finish(x, &fs) == RPC_RESOURCE_EXHAUSTED);
    CHECKF(strstr(fs.details, "holds 2 streams") != NULL, "%s", fs.details);
    /* the cap is per method: another method still has room */
    x = rpc_stream_open(coord, "/t.T/Stream", T_MS, &err);
    rpc_buf m;
    CHECK(x && rpc_stream_send(x, "y", 1, &err) == 0 && rpc_stream_recv(x, &m, &err) == 1);
    if (x) {
        rpc_buf_free(&m);
        CHECK(rpc_stream_finish(x, &fs) == RPC_OK);
    }
    rpc_stream_counts n;
    rpc_server_stream_counts(s, &n);
    CHECKF(n.admit == 10 && n.per_peer == 1 && n.full == 0, "admit %ld per_peer %ld full %ld",
           n.admit, n.per_peer, n.full);
    for (int i = 0; i < 2; i++)
        CHECK(st[i] && rpc_stream_finish(st[i], &fs) == RPC_OK);
    rpc_channel_destroy(admin);
    rpc_channel_destroy(coord);
    CHECK(rpc_server_destroy(s) == 0);
}

/* A client's own idle limit: a receive from a server that sends nothing and
 * a finish against one that never ends the call come back; a stream being
 * opened can be interrupted from another thread. */
static void test_client_bounds(void)
{
    int port;
    rpc_server_opts o = {0};
    rpc_unary_opts slow = {0};
    rpc_server *s = start(&o, &slow, &port);
    rpc_channel *c = dial(port);
    sl_err err = {0};
    rpc_status fs = {0};
    g.limit_s = 60;
    gate_set(0);
    rpc_stream *x = rpc_stream_open(c, "/t.T/Hang", T_MS, &err);
    CHECK(x != NULL);
    if (x) {
        CHECK(rpc_stream_set_idle(x, 300) == 0);
        rpc_buf m;
        CHECK(rpc_stream_recv(x, &m, &err) == -1);
        CHECK(rpc_stream_finish(x, &fs) == RPC_DEADLINE_EXCEEDED);
        CHECKF(strstr(fs.details, "no stream message for 300 ms") != NULL, "%s", fs.details);
    }
    /* finish alone: the server neither reads the half-close nor ends */
    x = rpc_stream_open(c, "/t.T/Hang", T_MS, &err);
    CHECK(x != NULL && rpc_stream_send(x, "z", 1, &err) == 0);
    if (x) {
        rpc_stream_set_idle(x, 300);
        CHECK(rpc_stream_finish(x, &fs) == RPC_DEADLINE_EXCEEDED);
    }
    gate_set(1);
    /* interrupted before it started */
    x = rpc_stream_new(c, "/t.T/Stream", T_MS, &err);
    CHECK(x != NULL);
    if (x) {
        rpc_stream_interrupt(x);
        CHECK(rpc_stream_start(x, &err) == -1);
        rpc_stream_cancel(x);
    }
    /* and started normally in two halves */
    x = rpc_stream_new(c, "/t.T/Stream", T_MS, &err);
    rpc_buf m;
    CHECK(x && rpc_stream_start(x, &err) == 0 && rpc_stream_send(x, "w", 1, &err) == 0 &&
          rpc_stream_recv(x, &m, &err) == 1);
    if (x) {
        rpc_buf_free(&m);
        CHECK(rpc_stream_finish(x, &fs) == RPC_OK);
    }
    rpc_channel_destroy(c);
    CHECK(rpc_server_destroy(s) == 0);
}

/* ---- shutdown with a handler blocked for good (child process) ---------------------- */

static void stopper(void)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    rpc_global_init();
    int port;
    rpc_unary_opts slow = {.workers = 1};
    /* A handler that returns within the grace period is waited for. */
    rpc_server_opts o = {.shutdown_grace_ms = 30000};
    rpc_server *s = start(&o, &slow, &port);
    rpc_channel *c = dial(port);
    g.limit_s = 1;
    gate_set(0);
    bg_call b;
    bg_start(&b, c, "/t.T/Slow");
    CHECK(wait_inside(1));
    CHECK(rpc_server_destroy(s) == 0);
    CHECK(gate_inside() == 0);
    pthread_join(b.t, NULL);
    CHECKF(b.code == RPC_UNAVAILABLE || b.code == RPC_CANCELLED, "code %s: %s",
           rpc_code_name(b.code), b.st.details);
    rpc_channel_destroy(c);
    /* One blocked for good: destroy gives up after the grace period. */
    g.limit_s = 3600;
    o.shutdown_grace_ms = 300;
    s = start(&o, &slow, &port);
    c = dial(port);
    bg_start(&b, c, "/t.T/Slow");
    CHECK(wait_inside(1));
    double t0 = now_s();
    CHECK(rpc_server_destroy(s) == -1);
    CHECKF(now_s() - t0 < 20, "destroy took %.1f s", now_s() - t0);
    CHECK(gate_inside() == 1);
    pthread_join(b.t, NULL);
    CHECKF(b.code == RPC_UNAVAILABLE || b.code == RPC_CANCELLED, "code %s: %s",
           rpc_code_name(b.code), b.st.details);
    /* the server is left behind on purpose: no gRPC teardown, exit now */
    fflush(NULL);
    _exit(sl_test_failures ? 1 : 0);
}

static void test_shutdown_with_blocked_handler(void)
{
    int status = 0;
    CHECK(waitpid(stop_child, &status, 0) == stop_child);
    stop_child = -1;
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0,
           "the stopper child failed (status 0x%x; its messages are above)", status);
}

static void kill_children(void)
{
    pid_t *kids[2] = {&flood_child, &stop_child};
    for (int i = 0; i < 2; i++)
        if (*kids[i] > 0) {
            kill(*kids[i], SIGKILL);
            waitpid(*kids[i], NULL, 0);
            *kids[i] = -1;
        }
}

int main(void)
{
    tu_tmpdir(root, sizeof root, "rpclimits");
    tu_pki(root, "pki", pki, sizeof pki);
    snprintf(portfile, sizeof portfile, "%s/port", root);
    snprintf(logfile, sizeof logfile, "%s/server.log", root);
    /* gRPC does not survive a fork: the children start before it does. */
    fflush(NULL);
    if ((flood_child = fork()) == 0)
        flood_serve();
    if ((stop_child = fork()) == 0)
        stopper();
    atexit(kill_children);
    if (flood_child < 0 || stop_child < 0) {
        perror("fork");
        return 1;
    }
    rpc_global_init();
    RUN(test_flood);
    RUN(test_methods_do_not_wait_for_each_other);
    RUN(test_deadline);
    RUN(test_stream_limits);
    RUN(test_stream_admission);
    RUN(test_client_bounds);
    RUN(test_shutdown_with_blocked_handler);
    rpc_global_shutdown();
    if (flood_child > 0) {
        kill(flood_child, SIGTERM);
        int status = 0;
        waitpid(flood_child, &status, 0);
        flood_child = -1;
        CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "flood server exit status 0x%x",
               status);
    }
    tu_rmtree(root);
    return sl_test_done();
}
