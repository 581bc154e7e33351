/* test_rpc.c - the rpc_ layer over mutual TLS on loopback: unary and
 * streaming calls, UNIMPLEMENTED for unknown methods, message limits on both
 * sides, peer identity, TLS refusals, and teardown with calls in flight. */
#include <pthread.h>

#include "rpc.h"
#include "sl_test.h"
#include "trust_util.h"

/* Deadline of every call: generous, so that slow runs (valgrind, loaded
 * machines) fail on what they check, not on time. */
#define T_MS 60000

static char root[256], pki[512], other[512];
static char seen_identity[128];
static int seen_authenticated = -1;

static int echo(void *ud, const rpc_peer *peer, const uint8_t *req, size_t len, rpc_buf *resp,
                rpc_status *st)
{
    (void)ud;
    snprintf(seen_identity, sizeof seen_identity, "%s", peer->identity);
    seen_authenticated = peer->authenticated;
    if (len == 4 && !memcmp(req, "fail", 4))
        return rpc_status_set(st, RPC_PERMISSION_DENIED, "told to fail");
    size_t n = len;
    if (len == 3 && !memcmp(req, "big", 3))
        n = 3u << 20; /* more than the client accepts */
    resp->data = calloc(1, n ? n : 1);
    if (n == len && len)
        memcpy(resp->data, req, len);
    resp->len = n;
    return RPC_OK;
}

/* Echoes every message back; ends OK when the client half-closes. */
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
        int bad = m.len == 4 && !memcmp(m.data, "stop", 4);
        int rc = bad ? -1 : rpc_stream_send(s, m.data, m.len, NULL);
        rpc_buf_free(&m);
        if (bad)
            return rpc_status_set(st, RPC_FAILED_PRECONDITION, "stop requested");
        if (rc)
            return rpc_status_set(st, RPC_CANCELLED, "send failed");
    }
}

static rpc_server *start(int auth, size_t max, int *port)
{
    rpc_server_opts o = {.listen = "127.0.0.1:0",
                         .tls = {tu_path(pki, "ca.crt"), tu_path(pki, "coordinator.crt"),
                                 tu_path(pki, "coordinator.key")},
                         .client_auth = auth,
                         .max_message = max};
    sl_err err = {0};
    rpc_server *s = rpc_server_create(&o, &err);
    CHECKF(s != NULL, "%s", err.msg);
    if (!s)
        exit(1);
    CHECK(rpc_server_add_unary(s, "/t.T/Echo", echo, NULL, &err) == 0);
    CHECK(rpc_server_add_stream(s, "/t.T/Stream", stream_echo, NULL, &err) == 0);
    *port = rpc_server_start(s, &err);
    CHECKF(*port > 0, "%s", err.msg);
    return s;
}

static rpc_channel *dial(int port, const char *dir, const char *who, size_t max)
{
    char target[64], crt[64], key[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
    snprintf(crt, sizeof crt, "%s.crt", who ? who : "");
    snprintf(key, sizeof key, "%s.key", who ? who : "");
    rpc_channel_opts o = {.target = target,
                          .tls = {tu_path(pki, "ca.crt"), who ? tu_path(dir, crt) : NULL,
                                  who ? tu_path(dir, key) : NULL},
                          .max_message = max};
    sl_err err = {0};
    rpc_channel *c = rpc_channel_create(&o, &err);
    CHECKF(c != NULL, "%s", err.msg);
    return c;
}

static void test_unary_and_identity(void)
{
    int port;
    rpc_server *s = start(RPC_CLIENT_CERT_REQUIRED, 0, &port);
    rpc_channel *c = dial(port, pki, "admin", 0);
    rpc_buf r;
    rpc_status st;
    CHECK(rpc_call_unary(c, "/t.T/Echo", "hello", 5, T_MS, &r, &st) == RPC_OK);
    CHECK(r.len == 5 && !memcmp(r.data, "hello", 5));
    rpc_buf_free(&r);
    CHECK(seen_authenticated == 1);
    CHECK(!strcmp(seen_identity, CERT_ADMIN_CN));
    CHECK(rpc_call_unary(c, "/t.T/Echo", "", 0, T_MS, &r, &st) == RPC_OK && r.len == 0);
    rpc_buf_free(&r);
    CHECK(rpc_call_unary(c, "/t.T/Echo", "fail", 4, T_MS, &r, &st) == RPC_PERMISSION_DENIED);
    CHECK(!strcmp(st.details, "told to fail"));
    CHECK(rpc_call_unary(c, "/t.T/Nope", "x", 1, T_MS, &r, &st) == RPC_UNIMPLEMENTED);
    CHECKF(strstr(st.details, "/t.T/Nope") != NULL, "%s", st.details);
    /* Unknown methods keep being answered: the generic request is re-armed. */
    CHECK(rpc_call_unary(c, "/other.Svc/Call", "x", 1, T_MS, &r, &st) == RPC_UNIMPLEMENTED);
    rpc_channel_destroy(c);
    rpc_server_destroy(s);
}

static void test_message_limits(void)
{
    int port;
    rpc_server *s = start(RPC_CLIENT_CERT_REQUIRED, 64 << 10, &port);
    rpc_channel *c = dial(port, pki, "admin", 8u << 20);
    size_t n = 100 << 10;
    uint8_t *big = calloc(1, n);
    rpc_buf r;
    rpc_status st;
    CHECK(rpc_call_unary(c, "/t.T/Echo", big, n, T_MS, &r, &st) == RPC_RESOURCE_EXHAUSTED);
    CHECK(rpc_call_unary(c, "/t.T/Echo", big, 60 << 10, T_MS, &r, &st) == RPC_OK);
    rpc_buf_free(&r);
    rpc_channel_destroy(c);
    rpc_server_destroy(s);
    /* The client's own receive limit: a 3 MiB reply to a 2 MiB-limited client. */
    s = start(RPC_CLIENT_CERT_REQUIRED, 8u << 20, &port);
    c = dial(port, pki, "admin", 2u << 20);
    CHECK(rpc_call_unary(c, "/t.T/Echo", "big", 3, T_MS, &r, &st) == RPC_RESOURCE_EXHAUSTED);
    /* and a 5 MiB message both sides accept (above gRPC's 4 MiB default) */
    rpc_channel_destroy(c);
    c = dial(port, pki, "admin", 8u << 20);
    free(big);
    n = 5u << 20;
    big = malloc(n);
    for (size_t i = 0; i < n; i++)
        big[i] = (uint8_t)(i * 7);
    CHECK(rpc_call_unary(c, "/t.T/Echo", big, n, T_MS, &r, &st) == RPC_OK);
    CHECK(r.len == n && !memcmp(r.data, big, n));
    rpc_buf_free(&r);
    free(big);
    rpc_channel_destroy(c);
    rpc_server_destroy(s);
}

static void test_tls_refusals(void)
{
    int port;
    rpc_server *s = start(RPC_CLIENT_CERT_REQUIRED, 0, &port);
    rpc_buf r;
    rpc_status st;
    /* no client certificate: the handshake fails */
    rpc_channel *c = dial(port, pki, NULL, 0);
    CHECK(rpc_call_unary(c, "/t.T/Echo", "x", 1, T_MS, &r, &st) == RPC_UNAVAILABLE);
    rpc_channel_destroy(c);
    /* a certificate from another CA */
    c = dial(port, other, "admin", 0);
    CHECK(rpc_call_unary(c, "/t.T/Echo", "x", 1, T_MS, &r, &st) == RPC_UNAVAILABLE);
    rpc_channel_destroy(c);
    rpc_server_destroy(s);
    /* optional client certificates: the call arrives, unauthenticated */
    s = start(RPC_CLIENT_CERT_OPTIONAL, 0, &port);
    c = dial(port, pki, NULL, 0);
    seen_authenticated = -1;
    CHECK(rpc_call_unary(c, "/t.T/Echo", "x", 1, T_MS, &r, &st) == RPC_OK);
    rpc_buf_free(&r);
    CHECK(seen_authenticated == 0 && seen_identity[0] == 0);
    rpc_channel_destroy(c);
    /* ... but a certificate that is presented must still verify */
    c = dial(port, other, "admin", 0);
    CHECK(rpc_call_unary(c, "/t.T/Echo", "x", 1, T_MS, &r, &st) == RPC_UNAVAILABLE);
    rpc_channel_destroy(c);
    rpc_server_destroy(s);
}

/* Bad TLS file sets are refused before any network work, with the reason. */
static void test_tls_files(void)
{
    sl_err err = {0};
    rpc_server_opts so = {.listen = "127.0.0.1:0",
                          .tls = {tu_path(pki, "ca.crt"), tu_path(pki, "coordinator.crt"), NULL}};
    CHECK(rpc_server_create(&so, &err) == NULL && strstr(err.msg, "needs a certificate and a key"));
    so.tls.key = tu_path(pki, "nonexistent.key");
    CHECK(rpc_server_create(&so, &err) == NULL && strstr(err.msg, "nonexistent.key"));
    rpc_channel_opts co = {.target = "127.0.0.1:1",
                           .tls = {tu_path(pki, "ca.crt"), tu_path(pki, "admin.crt"), NULL}};
    CHECK(rpc_channel_create(&co, &err) == NULL && strstr(err.msg, "needs its key"));
    co.tls.cert = NULL;
    co.tls.ca = tu_path(pki, "missing-ca.crt");
    CHECK(rpc_channel_create(&co, &err) == NULL && strstr(err.msg, "missing-ca.crt"));
}

static void test_stream(void)
{
    int port;
    rpc_server *s = start(RPC_CLIENT_CERT_REQUIRED, 4u << 20, &port);
    rpc_channel *c = dial(port, pki, "admin", 4u << 20);
    sl_err err = {0};
    rpc_stream *st = rpc_stream_open(c, "/t.T/Stream", T_MS, &err);
    CHECKF(st != NULL, "%s", err.msg);
    size_t n = 1u << 20;
    uint8_t *buf = malloc(n);
    int ok = 1;
    for (int k = 0; k < 8 && ok; k++) {
        memset(buf, k, n);
        uint8_t hdr[11];
        size_t h = rpc_frame_wrap(hdr, n - 16);
        rpc_iov iov[2] = {{hdr, h}, {buf, n - 16}};
        ok = rpc_stream_sendv(st, iov, 2, &err) == 0;
        rpc_buf m;
        ok = ok && rpc_stream_recv(st, &m, &err) == 1;
        const uint8_t *f;
        size_t fn;
        ok = ok && rpc_frame_unwrap(m.data, m.len, &f, &fn) == 0 && fn == n - 16 &&
             f[0] == k && f[fn - 1] == k;
        rpc_buf_free(&m);
    }
    CHECK(ok);
    /* a message built in place, sent from an offset; replies still arrive
     * after the half-close */
    rpc_msg msg;
    rpc_msg_alloc(&msg, 64);
    memcpy(msg.data + 10, "in-place", 8);
    CHECK(rpc_stream_send_msg(st, &msg, 10, 8, &err) == 0);
    CHECK(rpc_stream_close_send(st, &err) == 0);
    CHECK(rpc_stream_send(st, "late", 4, &err) == -1);
    rpc_buf echoed;
    CHECK(rpc_stream_recv(st, &echoed, &err) == 1 && echoed.len == 8 &&
          !memcmp(echoed.data, "in-place", 8));
    rpc_buf_free(&echoed);
    CHECK(rpc_stream_recv(st, &echoed, &err) == 0);
    rpc_msg_alloc(&msg, 8);
    CHECK(rpc_stream_send_msg(st, &msg, 4, 5, &err) == -1); /* outside the buffer: freed */
    rpc_status fs;
    CHECK(rpc_stream_finish(st, &fs) == RPC_OK);
    /* a handler's refusal reaches the client as the stream's status */
    st = rpc_stream_open(c, "/t.T/Stream", T_MS, &err);
    CHECK(rpc_stream_send(st, "stop", 4, &err) == 0);
    rpc_buf m;
    CHECK(rpc_stream_recv(st, &m, &err) == 0);
    CHECK(rpc_stream_finish(st, &fs) == RPC_FAILED_PRECONDITION);
    CHECK(!strcmp(fs.details, "stop requested"));
    /* an unknown streaming method */
    st = rpc_stream_open(c, "/t.T/NoStream", T_MS, &err);
    CHECK(st != NULL);
    CHECK(rpc_stream_recv(st, &m, &err) == 0);
    CHECK(rpc_stream_finish(st, &fs) == RPC_UNIMPLEMENTED);
    /* the server goes away while a stream is open: both sides come apart */
    st = rpc_stream_open(c, "/t.T/Stream", T_MS, &err);
    CHECK(rpc_stream_send(st, "a", 1, &err) == 0);
    CHECK(rpc_stream_recv(st, &m, &err) == 1);
    rpc_buf_free(&m);
    rpc_server_destroy(s);
    CHECK(rpc_stream_recv(st, &m, &err) != 1);
    CHECK(rpc_stream_finish(st, &fs) != RPC_OK);
    /* a cancelled stream frees everything */
    s = start(RPC_CLIENT_CERT_REQUIRED, 0, &port);
    rpc_channel_destroy(c);
    c = dial(port, pki, "admin", 0);
    st = rpc_stream_open(c, "/t.T/Stream", T_MS, &err);
    CHECK(rpc_stream_send(st, "b", 1, &err) == 0);
    rpc_stream_cancel(st);
    free(buf);
    rpc_channel_destroy(c);
    rpc_server_destroy(s);
}

static void test_frame_wrap(void)
{
    uint8_t hdr[11], msg[300];
    size_t sizes[] = {0, 1, 127, 128, 200, 16383, 16384, (size_t)1 << 40};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t h = rpc_frame_wrap(hdr, sizes[i]);
        CHECK(h >= 2 && h <= 11 && hdr[0] == 0x0a);
    }
    size_t h = rpc_frame_wrap(msg, 200);
    memset(msg + h, 5, 200);
    const uint8_t *f;
    size_t n;
    CHECK(rpc_frame_unwrap(msg, h + 200, &f, &n) == 0 && n == 200 && f == msg + h);
    CHECK(rpc_frame_unwrap(msg, h + 199, &f, &n) == -1); /* truncated */
    CHECK(rpc_frame_unwrap(msg, h + 201, &f, &n) == -1); /* trailing bytes */
    CHECK(rpc_frame_unwrap(msg, 1, &f, &n) == -1);
    msg[0] = 0x12;
    CHECK(rpc_frame_unwrap(msg, h + 200, &f, &n) == -1); /* another field */
    uint8_t endless[12];
    memset(endless, 0xff, sizeof endless);
    endless[0] = 0x0a;
    CHECK(rpc_frame_unwrap(endless, sizeof endless, &f, &n) == -1);
    CHECK(rpc_frame_unwrap(msg, 0, &f, &n) == 0 && n == 0);
}

int main(void)
{
    tu_tmpdir(root, sizeof root, "rpc");
    tu_pki(root, "pki", pki, sizeof pki);
    tu_pki(root, "other", other, sizeof other);
    rpc_global_init();
    RUN(test_frame_wrap);
    RUN(test_unary_and_identity);
    RUN(test_message_limits);
    RUN(test_tls_refusals);
    RUN(test_tls_files);
    RUN(test_stream);
    rpc_global_shutdown();
    tu_rmtree(root);
    return sl_test_done();
}
