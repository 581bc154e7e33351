#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/support/alloc.h>
#include <grpc/support/log.h>
#include <protobuf-c/protobuf-c.h>
#include <grpc/support/time.h>

#include "rpc_internal.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_mem.h"

/* gRPC core's own log lines ("E1129 ... ssl_transport_security.cc ...
 * Handshake failed") go through our logger at debug level: every failure
 * they describe reaches the caller as a call's status, which the commands
 * put in words. An assertion that is about to abort the process stays an
 * error. */
static void grpc_log_line(gpr_log_func_args *a)
{
    const char *m = a->message ? a->message : "";
    int level = strncmp(m, "assertion failed", 16) == 0 ? SL_LOG_ERROR : SL_LOG_DEBUG;
    const char *file = a->file ? strrchr(a->file, '/') : NULL;
    sl_log(level, "grpc", "severity=%s at=%s:%d message=\"%s\"", gpr_log_severity_string(a->severity),
           file ? file + 1 : a->file ? a->file : "?", a->line, m);
}

void rpc_global_init(void)
{
    rpc_accept_init();
    gpr_set_log_function(grpc_log_line);
    grpc_init();
}
void rpc_global_shutdown(void) { grpc_shutdown(); }
const char *rpc_grpc_version(void) { return grpc_version_string(); }
long rpc_connections_dropped(void) { return rpc_accept_dropped(); }

const char *rpc_code_name(int code)
{
    static const char *const names[] = {
        "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
        "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
        "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
        "UNAUTHENTICATED"};
    static _Thread_local char buf[32];
    if (code >= 0 && code < (int)(sizeof names / sizeof names[0]))
        return names[code];
    snprintf(buf, sizeof buf, "CODE_%d", code);
    return buf;
}

int rpc_status_set(rpc_status *st, int code, const char *fmt, ...)
{
    if (!st)
        return code;
    st->code = code;
    char raw[sizeof st->details];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    sl_escape_ctl(st->details, sizeof st->details, raw);
    return code;
}

void rpc_buf_free(rpc_buf *b)
{
    if (!b)
        return;
    if (b->owner_) {
        grpc_slice_unref(*(grpc_slice *)b->owner_);
        free(b->owner_);
    } else {
        free(b->data);
    }
    b->data = NULL;
    b->len = 0;
    b->owner_ = NULL;
}

grpc_server_credentials *rpc_server_credentials(const rpc_server_opts *o, const rpc_pems *pem)
{
    grpc_ssl_client_certificate_request_type req =
        o->client_auth == RPC_CLIENT_CERT_REQUIRED
            ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
            : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
    if (!o->reload_tls) {
        grpc_ssl_pem_key_cert_pair pair = {pem->key, pem->cert};
        return grpc_ssl_server_credentials_create_ex(pem->ca, &pair, 1, req, NULL);
    }
    /* gRPC re-reads the files every second and hands new handshakes the
     * latest pair; established connections keep theirs. */
    grpc_tls_certificate_provider *prov =
        grpc_tls_certificate_provider_file_watcher_create(o->tls.key, o->tls.cert, o->tls.ca, 1);
    if (!prov)
        return NULL;
    grpc_tls_credentials_options *opts = grpc_tls_credentials_options_create();
    grpc_tls_credentials_options_set_certificate_provider(opts, prov);
    grpc_tls_certificate_provider_release(prov);
    grpc_tls_credentials_options_watch_root_certs(opts);
    grpc_tls_credentials_options_watch_identity_key_cert_pairs(opts);
    grpc_tls_credentials_options_set_cert_request_type(opts, req);
    return grpc_tls_server_credentials_create(opts);
}

gpr_timespec rpc_deadline_ms(int64_t ms)
{
    if (ms <= 0)
        ms = 1;
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

char *rpc_read_pem(const char *path, sl_err *err)
{
    char *s;
    size_t n;
    if (sl_read_file(path, 1u << 20, &s, &n, err))
        return NULL;
    if (n == 0) {
        free(s);
        sl_err_set(err, SL_EIO, "%s: empty file", path);
        return NULL;
    }
    return s;
}

int rpc_pems_read(const rpc_tls_files *t, int need_pair, rpc_pems *p, sl_err *err)
{
    memset(p, 0, sizeof *p);
    if (need_pair && (!t->cert || !t->key))
        return sl_err_set(err, SL_EINVAL, "a server needs a certificate and a key");
    if ((t->cert != NULL) != (t->key != NULL))
        return sl_err_set(err, SL_EINVAL, "a client certificate needs its key and the other way round");
    if (!(p->ca = rpc_read_pem(t->ca, err)) ||
        (t->cert && (!(p->cert = rpc_read_pem(t->cert, err)) || !(p->key = rpc_read_pem(t->key, err))))) {
        rpc_pems_free(p);
        return -1;
    }
    return 0;
}

void rpc_pems_free(rpc_pems *p)
{
    if (p->key)
        memset(p->key, 0, strlen(p->key));
    free(p->key);
    free(p->cert);
    free(p->ca);
    memset(p, 0, sizeof *p);
}

static void arg_int(rpc_args *ra, const char *key, int64_t v)
{
    grpc_arg *a = &ra->a[ra->args.num_args++];
    a->type = GRPC_ARG_INTEGER;
    a->key = (char *)key;
    a->value.integer = v > 0x7fffffff ? 0x7fffffff : (int)v;
}

static void args_common(rpc_args *ra, size_t max_message)
{
    if (max_message == 0)
        max_message = RPC_DEFAULT_MAX_MESSAGE;
    memset(ra, 0, sizeof *ra);
    ra->args.args = ra->a;
    arg_int(ra, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, (int64_t)max_message);
    arg_int(ra, GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, (int64_t)max_message);
    arg_int(ra, GRPC_ARG_KEEPALIVE_TIME_MS, RPC_KEEPALIVE_MS);
    arg_int(ra, GRPC_ARG_KEEPALIVE_TIMEOUT_MS, RPC_KEEPALIVE_TIMEOUT_MS);
}

void rpc_args_init(rpc_args *ra, size_t max_message, const char *server_name)
{
    args_common(ra, max_message);
    if (server_name) {
        grpc_arg *a = &ra->a[ra->args.num_args++];
        a->type = GRPC_ARG_STRING;
        a->key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        a->value.string = (char *)server_name;
    }
}

void rpc_args_server(rpc_args *ra, const rpc_server_opts *o)
{
    args_common(ra, o->max_message);
    arg_int(ra, GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, RPC_HANDSHAKE_TIMEOUT_MS);
    arg_int(ra, GRPC_ARG_MAX_CONCURRENT_STREAMS, RPC_MAX_STREAMS_PER_CONN);
    /* Clients' keepalive pings (every RPC_KEEPALIVE_MS during calls) are welcome. */
    arg_int(ra, GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, RPC_KEEPALIVE_MS / 2);
    arg_int(ra, GRPC_ARG_MAX_CONNECTION_IDLE_MS,
            o->conn_idle_ms > 0 ? o->conn_idle_ms : RPC_DEFAULT_CONN_IDLE_MS);
    if (o->conn_age_ms > 0) {
        arg_int(ra, GRPC_ARG_MAX_CONNECTION_AGE_MS, o->conn_age_ms);
        arg_int(ra, GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, RPC_CONN_AGE_GRACE_MS);
    }
}

grpc_byte_buffer *rpc_bb_from_iov(const rpc_iov *iov, int n)
{
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += iov[i].len;
    grpc_slice s = grpc_slice_malloc(total);
    uint8_t *p = GRPC_SLICE_START_PTR(s);
    for (int i = 0; i < n; i++) {
        if (iov[i].len)
            memcpy(p, iov[i].data, iov[i].len);
        p += iov[i].len;
    }
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

void rpc_buf_from_bb(grpc_byte_buffer *bb, rpc_buf *b)
{
    grpc_byte_buffer_reader r;
    grpc_slice *s = sl_xmalloc(sizeof *s);
    if (grpc_byte_buffer_reader_init(&r, bb)) {
        *s = grpc_byte_buffer_reader_readall(&r);
        grpc_byte_buffer_reader_destroy(&r);
    } else {
        *s = grpc_empty_slice();
    }
    grpc_byte_buffer_destroy(bb);
    /* Inlined slices keep their bytes inside the struct: take the pointer
     * from the heap copy. */
    b->owner_ = s;
    b->data = GRPC_SLICE_START_PTR(*s);
    b->len = GRPC_SLICE_LENGTH(*s);
}

static void copy_prop(const grpc_auth_property *p, char *dst, size_t cap)
{
    size_t n = p->value_length < cap - 1 ? p->value_length : cap - 1;
    memcpy(dst, p->value, n);
    dst[n] = 0;
}

void rpc_peer_from_call(grpc_call *call, rpc_peer *p)
{
    memset(p, 0, sizeof *p);
    char *addr = grpc_call_get_peer(call);
    if (addr) {
        snprintf(p->address, sizeof p->address, "%s", addr);
        gpr_free(addr);
    }
    grpc_auth_context *ctx = grpc_call_auth_context(call);
    if (!ctx)
        return;
    p->authenticated = grpc_auth_context_peer_is_authenticated(ctx) != 0;
    if (p->authenticated) {
        grpc_auth_property_iterator it =
            grpc_auth_context_find_properties_by_name(ctx, GRPC_X509_CN_PROPERTY_NAME);
        const grpc_auth_property *prop = grpc_auth_property_iterator_next(&it);
        if (prop)
            copy_prop(prop, p->identity, sizeof p->identity);
        /* A name with a NUL inside cannot be anyone's identity. */
        if (prop && strlen(p->identity) != prop->value_length)
            p->identity[0] = 0;
    }
    grpc_auth_context_release(ctx);
}

int rpc_pluck(grpc_completion_queue *cq, void *tag)
{
    grpc_event ev = grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    return ev.type == GRPC_OP_COMPLETE && ev.success;
}

int rpc_stream_wait(rpc_stream *s, void *tag)
{
    int64_t idle = atomic_load(&s->idle_ms);
    if (idle <= 0)
        return rpc_pluck(s->cq, tag);
    grpc_event ev = grpc_completion_queue_pluck(s->cq, tag, rpc_deadline_ms(idle), NULL);
    if (ev.type == GRPC_OP_COMPLETE)
        return ev.success;
    char why[96];
    snprintf(why, sizeof why, "no stream message for %lld ms", (long long)idle);
    grpc_call_cancel_with_status(s->call, GRPC_STATUS_DEADLINE_EXCEEDED, why, NULL);
    rpc_pluck(s->cq, tag);
    return 0;
}

int64_t rpc_stream_set_idle(rpc_stream *s, int64_t ms)
{
    return atomic_exchange(&s->idle_ms, ms > 0 ? ms : 0);
}

void rpc_cq_destroy_pluck(grpc_completion_queue *cq)
{
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
}

int rpc_batch(grpc_call *call, const grpc_op *ops, size_t n, void *tag, sl_err *err)
{
    grpc_call_error e = grpc_call_start_batch(call, ops, n, tag, NULL);
    if (e != GRPC_CALL_OK)
        return sl_err_set(err, SL_EINTERNAL, "grpc_call_start_batch: %s", grpc_call_error_to_string(e));
    return 0;
}

size_t rpc_frame_wrap(uint8_t hdr[11], size_t n)
{
    size_t k = 0;
    hdr[k++] = 0x0a; /* field 1, wire type 2 (length-delimited) */
    uint64_t v = n;
    do {
        uint8_t b = v & 0x7f;
        v >>= 7;
        hdr[k++] = (uint8_t)(b | (v ? 0x80 : 0));
    } while (v);
    return k;
}

int rpc_frame_unwrap(const uint8_t *msg, size_t len, const uint8_t **frame, size_t *n)
{
    if (len == 0) { /* proto3 leaves an empty bytes field out */
        *frame = msg;
        *n = 0;
        return 0;
    }
    if (msg[0] != 0x0a)
        return -1;
    uint64_t v = 0;
    size_t i = 1;
    for (int shift = 0; shift < 64; shift += 7) {
        if (i >= len)
            return -1;
        uint8_t b = msg[i++];
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            break;
        if (shift + 7 >= 64)
            return -1;
    }
    if (v != len - i)
        return -1;
    *frame = msg + i;
    *n = (size_t)v;
    return 0;
}

void rpc_pack(const void *msg, rpc_buf *out)
{
    const ProtobufCMessage *m = msg;
    size_t n = protobuf_c_message_get_packed_size(m);
    out->owner_ = NULL;
    out->data = sl_xmalloc(n ? n : 1);
    out->len = protobuf_c_message_pack(m, out->data);
}

void *rpc_unpack(const void *descriptor, const uint8_t *data, size_t len)
{
    return protobuf_c_message_unpack(descriptor, NULL, len, data);
}

void rpc_unpacked_free(void *msg)
{
    if (msg)
        protobuf_c_message_free_unpacked(msg, NULL);
}

int rpc_call_pb(rpc_channel *ch, const char *method, const void *req, const void *resp_descriptor,
                void **resp, int64_t timeout_ms, rpc_status *st)
{
    *resp = NULL;
    rpc_buf in, out;
    rpc_pack(req, &in);
    int code = rpc_call_unary(ch, method, in.data, in.len, timeout_ms, &out, st);
    rpc_buf_free(&in);
    if (code != RPC_OK)
        return code;
    *resp = rpc_unpack(resp_descriptor, out.data, out.len);
    rpc_buf_free(&out);
    if (!*resp)
        return rpc_status_set(st, RPC_INTERNAL, "malformed reply to %s", method);
    return RPC_OK;
}
