/* rpc_server.c - the server side: one completion-queue thread for accepting
 * calls and for unary calls, one thread per streaming call. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/support/time.h>

#include "rpc_internal.h"
#include "sl_log.h"
#include "sl_mem.h"

#define MAX_METHODS 32

enum tag_kind { T_UNARY_REQ, T_UNARY_DONE, T_STREAM_REQ, T_GENERIC_REQ, T_GENERIC_DONE, T_SHUTDOWN };

typedef struct method {
    char *name;
    void *handle; /* from grpc_server_register_method */
    int stream;
    rpc_unary_fn unary;
    rpc_stream_fn streamfn;
    void *ud;
} method;

/* One outstanding accept or reply; the tag of every event on the main queue
 * points at one of these (or at the stream waiting to be accepted). */
typedef struct pending {
    int kind;
    int method;
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array md;
    grpc_byte_buffer *payload;
    grpc_call_details details; /* generic */
    grpc_byte_buffer *reply;
    grpc_slice status_details;
    int cancelled;
} pending;

/* A stream waiting to be accepted sits behind this header in the tag. */
typedef struct stream_req {
    int kind; /* T_STREAM_REQ: must be first, like pending.kind */
    rpc_stream *s;
} stream_req;

struct rpc_server {
    grpc_server *server;
    grpc_completion_queue *cq;
    method methods[MAX_METHODS];
    int n_methods;
    int started, shutdown_notified, port;
    atomic_int shutting_down;
    long outstanding; /* tags posted on cq and not yet seen */
    int shutdown_kind;
    pthread_t thread;
    pthread_mutex_t mu; /* guards streams */
    rpc_stream *streams;
};

rpc_server *rpc_server_create(const rpc_server_opts *o, sl_err *err)
{
    rpc_pems pem;
    if (rpc_pems_read(&o->tls, 1, &pem, err))
        return NULL;
    rpc_server *srv = sl_xcalloc(1, sizeof *srv);
    pthread_mutex_init(&srv->mu, NULL);
    srv->shutdown_kind = T_SHUTDOWN;
    rpc_args ra;
    rpc_args_init(&ra, o->max_message, NULL);
    srv->server = grpc_server_create(&ra.args, NULL);
    srv->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(srv->server, srv->cq, NULL);
    grpc_server_credentials *creds = rpc_server_credentials(o, &pem);
    int port = creds ? grpc_server_add_http2_port(srv->server, o->listen, creds) : 0;
    if (creds)
        grpc_server_credentials_release(creds);
    rpc_pems_free(&pem);
    if (port <= 0) {
        sl_err_set(err, SL_EIO, "cannot listen on %s (address in use, bad address, or bad "
                   "certificate/key files)", o->listen);
        rpc_server_destroy(srv);
        return NULL;
    }
    srv->port = port;
    return srv;
}

static int add_method(rpc_server *srv, const char *name, int stream, rpc_unary_fn u,
                      rpc_stream_fn s, void *ud, sl_err *err)
{
    if (srv->started || srv->n_methods >= MAX_METHODS)
        return sl_err_set(err, SL_ESTATE, "cannot register %s now", name);
    method *m = &srv->methods[srv->n_methods];
    m->name = sl_xstrdup(name);
    m->handle = grpc_server_register_method(
        srv->server, m->name, NULL,
        stream ? GRPC_SRM_PAYLOAD_NONE : GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
    if (!m->handle) {
        free(m->name);
        return sl_err_set(err, SL_EINVAL, "cannot register method %s", name);
    }
    m->stream = stream;
    m->unary = u;
    m->streamfn = s;
    m->ud = ud;
    srv->n_methods++;
    return 0;
}

int rpc_server_add_unary(rpc_server *srv, const char *name, rpc_unary_fn fn, void *ud, sl_err *err)
{
    return add_method(srv, name, 0, fn, NULL, ud, err);
}

int rpc_server_add_stream(rpc_server *srv, const char *name, rpc_stream_fn fn, void *ud,
                          sl_err *err)
{
    return add_method(srv, name, 1, NULL, fn, ud, err);
}

/* ---- accepting ------------------------------------------------------------- */

static void request_unary(rpc_server *srv, int mi)
{
    pending *p = sl_xcalloc(1, sizeof *p);
    p->kind = T_UNARY_REQ;
    p->method = mi;
    grpc_metadata_array_init(&p->md);
    grpc_call_error e = grpc_server_request_registered_call(
        srv->server, srv->methods[mi].handle, &p->call, &p->deadline, &p->md, &p->payload,
        srv->cq, srv->cq, p);
    if (e != GRPC_CALL_OK) {
        sl_log_error("rpc: cannot request a call", "method=%s error=%s", srv->methods[mi].name,
                     grpc_call_error_to_string(e));
        grpc_metadata_array_destroy(&p->md);
        free(p);
        return;
    }
    srv->outstanding++;
}

static void request_stream(rpc_server *srv, int mi)
{
    stream_req *r = sl_xcalloc(1, sizeof *r);
    rpc_stream *s = sl_xcalloc(1, sizeof *s);
    r->kind = T_STREAM_REQ;
    r->s = s;
    s->srv = srv;
    s->method = mi;
    s->cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_metadata_array_init(&s->initial_md);
    grpc_call_error e = grpc_server_request_registered_call(
        srv->server, srv->methods[mi].handle, &s->call, &s->deadline, &s->initial_md, NULL,
        s->cq, srv->cq, r);
    if (e != GRPC_CALL_OK) {
        sl_log_error("rpc: cannot request a call", "method=%s error=%s", srv->methods[mi].name,
                     grpc_call_error_to_string(e));
        grpc_metadata_array_destroy(&s->initial_md);
        rpc_cq_destroy_pluck(s->cq);
        free(s);
        free(r);
        return;
    }
    srv->outstanding++;
}

static void request_generic(rpc_server *srv)
{
    pending *p = sl_xcalloc(1, sizeof *p);
    p->kind = T_GENERIC_REQ;
    grpc_metadata_array_init(&p->md);
    grpc_call_details_init(&p->details);
    grpc_call_error e =
        grpc_server_request_call(srv->server, &p->call, &p->details, &p->md, srv->cq, srv->cq, p);
    if (e != GRPC_CALL_OK) {
        sl_log_error("rpc: cannot request a generic call", "error=%s",
                     grpc_call_error_to_string(e));
        grpc_metadata_array_destroy(&p->md);
        grpc_call_details_destroy(&p->details);
        free(p);
        return;
    }
    srv->outstanding++;
}

static void pending_free(pending *p)
{
    if (p->call)
        grpc_call_unref(p->call);
    if (p->payload)
        grpc_byte_buffer_destroy(p->payload);
    if (p->reply)
        grpc_byte_buffer_destroy(p->reply);
    grpc_slice_unref(p->status_details);
    grpc_metadata_array_destroy(&p->md);
    if (p->kind == T_GENERIC_REQ || p->kind == T_GENERIC_DONE)
        grpc_call_details_destroy(&p->details);
    free(p);
}

/* Sends the reply (message when code is OK) and the status in one batch. */
static void reply(rpc_server *srv, pending *p, int code, const char *details)
{
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (code == RPC_OK && p->reply) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = p->reply;
    }
    p->status_details = grpc_slice_from_copied_string(details ? details : "");
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)code;
    ops[n++].data.send_status_from_server.status_details = &p->status_details;
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n++].data.recv_close_on_server.cancelled = &p->cancelled;
    if (rpc_batch(p->call, ops, n, p, NULL) != 0) {
        sl_log_error("rpc: cannot send a reply", "%s", "");
        pending_free(p);
        return;
    }
    srv->outstanding++;
}

static void handle_unary(rpc_server *srv, pending *p)
{
    method *m = &srv->methods[p->method];
    rpc_peer peer;
    rpc_peer_from_call(p->call, &peer);
    rpc_status st = {RPC_OK, ""};
    rpc_buf req = {0}, resp = {0};
    int code;
    if (!p->payload) {
        code = rpc_status_set(&st, RPC_INVALID_ARGUMENT, "no request message");
    } else {
        rpc_buf_from_bb(p->payload, &req);
        p->payload = NULL;
        code = m->unary(m->ud, &peer, req.data, req.len, &resp, &st);
        rpc_buf_free(&req);
    }
    if (code == RPC_OK) {
        rpc_iov iov = {resp.data, resp.len};
        p->reply = rpc_bb_from_iov(&iov, 1);
    } else {
        sl_log_info("rpc: refused", "method=%s peer=%s identity=%s code=%s reason=\"%s\"", m->name,
                    peer.address, peer.identity[0] ? peer.identity : "-", rpc_code_name(code),
                    st.details);
    }
    rpc_buf_free(&resp);
    p->kind = T_UNARY_DONE;
    reply(srv, p, code, code == RPC_OK ? "" : st.details);
}

static void handle_generic(rpc_server *srv, pending *p)
{
    char name[256];
    size_t n = GRPC_SLICE_LENGTH(p->details.method);
    if (n >= sizeof name)
        n = sizeof name - 1;
    memcpy(name, GRPC_SLICE_START_PTR(p->details.method), n);
    name[n] = 0;
    char details[320];
    snprintf(details, sizeof details, "method %s is not implemented", name);
    p->kind = T_GENERIC_DONE;
    reply(srv, p, RPC_UNIMPLEMENTED, details);
}

/* ---- streams (server side) ------------------------------------------------- */

static void stream_free(rpc_stream *s)
{
    if (s->call)
        grpc_call_unref(s->call);
    grpc_metadata_array_destroy(&s->initial_md);
    rpc_cq_destroy_pluck(s->cq);
}

static void *stream_main(void *arg)
{
    rpc_stream *s = arg;
    rpc_server *srv = s->srv;
    method *m = &srv->methods[s->method];
    rpc_peer peer;
    rpc_peer_from_call(s->call, &peer);
    grpc_op ops[1];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    int ok = rpc_batch(s->call, ops, 1, &s->tag_send, NULL) == 0 && rpc_pluck(s->cq, &s->tag_send);
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[0].data.recv_close_on_server.cancelled = &s->cancelled;
    int close_posted = rpc_batch(s->call, ops, 1, &s->tag_end, NULL) == 0;
    rpc_status st = {RPC_OK, ""};
    int code = ok ? m->streamfn(m->ud, &peer, s, &st) : RPC_UNAVAILABLE;
    if (code != RPC_OK)
        sl_log_info("rpc: stream ended", "method=%s peer=%s code=%s reason=\"%s\"", m->name,
                    peer.address, rpc_code_name(code), st.details);
    grpc_slice details = grpc_slice_from_copied_string(code == RPC_OK ? "" : st.details);
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[0].data.send_status_from_server.status = (grpc_status_code)code;
    ops[0].data.send_status_from_server.status_details = &details;
    if (rpc_batch(s->call, ops, 1, &s->tag_send, NULL) == 0)
        rpc_pluck(s->cq, &s->tag_send);
    grpc_slice_unref(details);
    if (close_posted)
        rpc_pluck(s->cq, &s->tag_end);
    stream_free(s);
    pthread_mutex_lock(&srv->mu);
    s->done = 1;
    pthread_mutex_unlock(&srv->mu);
    return NULL;
}

/* Joins stream threads that have finished (all of them when `all`). */
static void reap_streams(rpc_server *srv, int all)
{
    pthread_mutex_lock(&srv->mu);
    rpc_stream **pp = &srv->streams;
    while (*pp) {
        rpc_stream *s = *pp;
        if (s->done || all) {
            *pp = s->next;
            pthread_mutex_unlock(&srv->mu);
            pthread_join(s->thread, NULL);
            free(s);
            pthread_mutex_lock(&srv->mu);
        } else {
            pp = &s->next;
        }
    }
    pthread_mutex_unlock(&srv->mu);
}

static void accept_stream(rpc_server *srv, stream_req *r, int success)
{
    rpc_stream *s = r->s;
    free(r);
    if (!success) {
        stream_free(s);
        free(s);
        return;
    }
    reap_streams(srv, 0);
    pthread_mutex_lock(&srv->mu);
    s->next = srv->streams;
    srv->streams = s;
    if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
        srv->streams = s->next;
        pthread_mutex_unlock(&srv->mu);
        grpc_call_cancel(s->call, NULL);
        stream_free(s);
        free(s);
        sl_log_error("rpc: cannot start a stream thread", "%s", "");
        return;
    }
    pthread_mutex_unlock(&srv->mu);
}

/* ---- the loop -------------------------------------------------------------- */

static void *server_main(void *arg)
{
    rpc_server *srv = arg;
    for (;;) {
        grpc_event ev =
            grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        int kind = *(int *)ev.tag;
        if (kind == T_SHUTDOWN) {
            srv->shutdown_notified = 1;
        } else {
            srv->outstanding--;
            pending *p = ev.tag;
            switch (kind) {
            case T_UNARY_REQ:
                if (!ev.success) {
                    pending_free(p);
                    break;
                }
                if (!atomic_load(&srv->shutting_down))
                    request_unary(srv, p->method);
                handle_unary(srv, p);
                break;
            case T_STREAM_REQ: {
                stream_req *r = ev.tag;
                int mi = r->s->method;
                if (ev.success && !atomic_load(&srv->shutting_down))
                    request_stream(srv, mi);
                accept_stream(srv, r, ev.success);
                break;
            }
            case T_GENERIC_REQ:
                if (!ev.success) {
                    pending_free(p);
                    break;
                }
                if (!atomic_load(&srv->shutting_down))
                    request_generic(srv);
                handle_generic(srv, p);
                break;
            case T_UNARY_DONE:
            case T_GENERIC_DONE:
                pending_free(p);
                break;
            }
        }
        if (srv->shutdown_notified && srv->outstanding == 0)
            grpc_completion_queue_shutdown(srv->cq);
    }
    return NULL;
}

int rpc_server_start(rpc_server *srv, sl_err *err)
{
    grpc_server_start(srv->server);
    srv->started = 1;
    for (int i = 0; i < srv->n_methods; i++) {
        if (srv->methods[i].stream)
            request_stream(srv, i);
        else
            request_unary(srv, i);
    }
    request_generic(srv);
    if (pthread_create(&srv->thread, NULL, server_main, srv) != 0) {
        sl_err_set(err, SL_EINTERNAL, "cannot start the server thread");
        srv->started = 2; /* started, no thread: destroy drains inline */
        return -1;
    }
    return srv->port;
}

void rpc_server_destroy(rpc_server *srv)
{
    if (!srv)
        return;
    /* The loop sees this flag only after the notify tag below, or never
     * posts again when it is not running. */
    atomic_store(&srv->shutting_down, 1);
    grpc_server_shutdown_and_notify(srv->server, srv->cq, &srv->shutdown_kind);
    grpc_server_cancel_all_calls(srv->server);
    if (srv->started == 1)
        pthread_join(srv->thread, NULL);
    else
        server_main(srv); /* never started: drains the queue here */
    reap_streams(srv, 1);
    grpc_server_destroy(srv->server);
    grpc_completion_queue_destroy(srv->cq);
    for (int i = 0; i < srv->n_methods; i++)
        free(srv->methods[i].name);
    pthread_mutex_destroy(&srv->mu);
    free(srv);
}
