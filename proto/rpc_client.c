/* rpc_client.c - channels, unary calls and the stream operations (both sides). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "rpc_internal.h"
#include "sl_mem.h"

struct rpc_channel {
    grpc_channel *ch;
};

rpc_channel *rpc_channel_create(const rpc_channel_opts *o, sl_err *err)
{
    rpc_pems pem;
    if (rpc_pems_read(&o->tls, 0, &pem, err))
        return NULL;
    grpc_ssl_pem_key_cert_pair pair = {pem.key, pem.cert};
    grpc_channel_credentials *creds =
        grpc_ssl_credentials_create_ex(pem.ca, pem.cert ? &pair : NULL, NULL, NULL);
    rpc_pems_free(&pem);
    if (!creds) {
        sl_err_set(err, SL_EINVAL, "cannot build TLS credentials from %s", o->tls.ca);
        return NULL;
    }
    rpc_args ra;
    rpc_args_init(&ra, o->max_message, o->server_name);
    grpc_channel *ch = grpc_channel_create(o->target, creds, &ra.args);
    grpc_channel_credentials_release(creds);
    if (!ch) {
        sl_err_set(err, SL_EINVAL, "cannot create a channel to %s", o->target);
        return NULL;
    }
    rpc_channel *c = sl_xcalloc(1, sizeof *c);
    c->ch = ch;
    return c;
}

void rpc_channel_destroy(rpc_channel *c)
{
    if (!c)
        return;
    grpc_channel_destroy(c->ch);
    free(c);
}

static void status_from_core(rpc_status *st, grpc_status_code code, grpc_slice details,
                             const char *error_string)
{
    size_t n = GRPC_SLICE_LENGTH(details);
    if (n >= sizeof st->details)
        n = sizeof st->details - 1;
    st->code = (int)code;
    memcpy(st->details, GRPC_SLICE_START_PTR(details), n);
    st->details[n] = 0;
    if (n == 0 && error_string)
        snprintf(st->details, sizeof st->details, "%s", error_string);
}

int rpc_call_unary(rpc_channel *c, const char *method, const void *req, size_t len,
                   int64_t timeout_ms, rpc_buf *resp, rpc_status *st)
{
    memset(resp, 0, sizeof *resp);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_slice m = grpc_slice_from_static_string(method);
    grpc_call *call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, m, NULL,
                                               rpc_deadline_ms(timeout_ms), NULL);
    rpc_iov iov = {req, len};
    grpc_byte_buffer *send = rpc_bb_from_iov(&iov, 1), *recv = NULL;
    grpc_metadata_array imd, tmd;
    grpc_metadata_array_init(&imd);
    grpc_metadata_array_init(&tmd);
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    const char *error_string = NULL;
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &imd;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &tmd;
    ops[5].data.recv_status_on_client.status = &code;
    ops[5].data.recv_status_on_client.status_details = &details;
    ops[5].data.recv_status_on_client.error_string = &error_string;
    char tag;
    sl_err e = {0};
    if (rpc_batch(call, ops, 6, &tag, &e) != 0) {
        rpc_status_set(st, RPC_INTERNAL, "%s", e.msg);
    } else {
        rpc_pluck(cq, &tag); /* success=1 even when the RPC failed: read the status */
        status_from_core(st, code, details, error_string);
        if (st->code == RPC_OK) {
            if (recv) {
                rpc_buf_from_bb(recv, resp);
                recv = NULL;
            } else {
                rpc_status_set(st, RPC_INTERNAL, "server sent no reply message");
            }
        }
    }
    if (recv)
        grpc_byte_buffer_destroy(recv);
    grpc_byte_buffer_destroy(send);
    grpc_slice_unref(details);
    gpr_free((void *)error_string);
    grpc_metadata_array_destroy(&imd);
    grpc_metadata_array_destroy(&tmd);
    grpc_call_unref(call);
    rpc_cq_destroy_pluck(cq);
    return st->code;
}

/* ---- streams --------------------------------------------------------------- */

static void client_free(rpc_stream *s)
{
    grpc_call_unref(s->call);
    rpc_cq_destroy_pluck(s->cq);
    grpc_metadata_array_destroy(&s->initial_md);
    grpc_metadata_array_destroy(&s->trailing_md);
    grpc_slice_unref(s->status_details);
    gpr_free((void *)s->error_string);
    free(s);
}

rpc_stream *rpc_stream_new(rpc_channel *c, const char *method, int64_t timeout_ms, sl_err *err)
{
    rpc_stream *s = sl_xcalloc(1, sizeof *s);
    s->client = 1;
    s->cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_slice m = grpc_slice_from_static_string(method);
    s->call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, s->cq, m, NULL,
                                       rpc_deadline_ms(timeout_ms), NULL);
    grpc_metadata_array_init(&s->initial_md);
    grpc_metadata_array_init(&s->trailing_md);
    s->status_details = grpc_empty_slice();
    grpc_op ops[1];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[0].data.recv_status_on_client.trailing_metadata = &s->trailing_md;
    ops[0].data.recv_status_on_client.status = &s->status;
    ops[0].data.recv_status_on_client.status_details = &s->status_details;
    ops[0].data.recv_status_on_client.error_string = &s->error_string;
    if (rpc_batch(s->call, ops, 1, &s->tag_end, err) != 0) {
        sl_err_set(err, SL_EIO, "cannot open stream %s", method);
        client_free(s);
        return NULL;
    }
    s->status_posted = 1;
    return s;
}

int rpc_stream_start(rpc_stream *s, sl_err *err)
{
    grpc_op ops[1];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (rpc_batch(s->call, ops, 1, &s->tag_send, err) != 0 || !rpc_stream_wait(s, &s->tag_send)) {
        s->failed = 1;
        return sl_err_set(err, SL_EIO, "cannot open the stream: the call is over");
    }
    return 0;
}

rpc_stream *rpc_stream_open(rpc_channel *c, const char *method, int64_t timeout_ms, sl_err *err)
{
    rpc_stream *s = rpc_stream_new(c, method, timeout_ms, err);
    if (s && rpc_stream_start(s, err)) {
        sl_err_set(err, SL_EIO, "cannot open stream %s", method);
        rpc_stream_cancel(s);
        return NULL;
    }
    return s;
}

void rpc_msg_alloc(rpc_msg *m, size_t cap)
{
    grpc_slice *sl = sl_xmalloc(sizeof *sl);
    *sl = grpc_slice_malloc_large(cap ? cap : 1);
    m->slice_ = sl;
    m->data = GRPC_SLICE_START_PTR(*sl);
    m->cap = cap;
}

void rpc_msg_free(rpc_msg *m)
{
    if (!m->slice_)
        return;
    grpc_slice_unref(*(grpc_slice *)m->slice_);
    free(m->slice_);
    memset(m, 0, sizeof *m);
}

static int send_bb(rpc_stream *s, grpc_byte_buffer *bb, sl_err *err);

int rpc_stream_send_msg(rpc_stream *s, rpc_msg *m, size_t off, size_t len, sl_err *err)
{
    if (off > m->cap || len > m->cap - off) {
        rpc_msg_free(m);
        return sl_err_set(err, SL_EINVAL, "message range outside its buffer");
    }
    grpc_slice sub = grpc_slice_sub(*(grpc_slice *)m->slice_, off, off + len);
    rpc_msg_free(m);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sub, 1);
    grpc_slice_unref(sub);
    return send_bb(s, bb, err);
}

int rpc_stream_close_send(rpc_stream *s, sl_err *err)
{
    if (!s->client || s->send_closed)
        return 0;
    if (s->failed)
        return sl_err_set(err, SL_EIO, "stream is closed");
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    s->send_closed = 1;
    if (rpc_batch(s->call, &op, 1, &s->tag_send, err) != 0)
        return -1;
    if (!rpc_stream_wait(s, &s->tag_send)) {
        s->failed = 1;
        return sl_err_set(err, SL_EIO, "half-close failed: the call is over");
    }
    return 0;
}

int rpc_stream_sendv(rpc_stream *s, const rpc_iov *iov, int n, sl_err *err)
{
    if (s->failed) /* checked before the copy */
        return sl_err_set(err, SL_EIO, "stream is closed");
    return send_bb(s, rpc_bb_from_iov(iov, n), err);
}

static int send_bb(rpc_stream *s, grpc_byte_buffer *bb, sl_err *err)
{
    if (s->failed || s->send_closed) {
        grpc_byte_buffer_destroy(bb);
        return sl_err_set(err, SL_EIO, "stream is closed for sending");
    }
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = bb;
    int ok = rpc_batch(s->call, &op, 1, &s->tag_send, err) == 0;
    if (ok && !rpc_stream_wait(s, &s->tag_send)) {
        ok = 0;
        s->failed = 1;
        sl_err_set(err, SL_EIO, "stream send failed: the call is over");
    }
    grpc_byte_buffer_destroy(bb);
    return ok ? 0 : -1;
}

int rpc_stream_send(rpc_stream *s, const void *data, size_t len, sl_err *err)
{
    rpc_iov iov = {data, len};
    return rpc_stream_sendv(s, &iov, 1, err);
}

int rpc_stream_recv(rpc_stream *s, rpc_buf *msg, sl_err *err)
{
    memset(msg, 0, sizeof *msg);
    if (s->failed)
        return sl_err_set(err, SL_EIO, "stream is closed");
    grpc_byte_buffer *bb = NULL;
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (s->client && !s->got_initial_md) {
        ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[n++].data.recv_initial_metadata.recv_initial_metadata = &s->initial_md;
        s->got_initial_md = 1;
    }
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n++].data.recv_message.recv_message = &bb;
    if (rpc_batch(s->call, ops, n, &s->tag_recv, err) != 0)
        return -1;
    if (!rpc_stream_wait(s, &s->tag_recv)) {
        if (bb)
            grpc_byte_buffer_destroy(bb);
        s->failed = 1;
        return sl_err_set(err, SL_EIO, "stream receive failed: the call is over");
    }
    if (!bb)
        return 0;
    rpc_buf_from_bb(bb, msg);
    return 1;
}

int rpc_stream_finish(rpc_stream *s, rpc_status *st)
{
    rpc_stream_close_send(s, NULL);
    /* Unread messages would hold the status back behind flow control. */
    rpc_buf b;
    while (!s->failed && rpc_stream_recv(s, &b, NULL) == 1)
        rpc_buf_free(&b);
    rpc_stream_wait(s, &s->tag_end);
    rpc_status tmp;
    if (!st)
        st = &tmp;
    status_from_core(st, s->status, s->status_details, s->error_string);
    int code = st->code;
    client_free(s);
    return code;
}

void rpc_stream_interrupt(rpc_stream *s)
{
    if (s)
        grpc_call_cancel(s->call, NULL);
}

void rpc_stream_cancel(rpc_stream *s)
{
    if (!s)
        return;
    grpc_call_cancel(s->call, NULL);
    if (s->status_posted)
        rpc_pluck(s->cq, &s->tag_end);
    client_free(s);
}
