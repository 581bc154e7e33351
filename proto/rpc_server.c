/* rpc_server.c - the server side (the model is described in rpc.h).
 *
 * A unary call is a `pending` shared by the queue thread and a worker:
 * srv->mu guards its state and refs counts its holders (the call itself
 * until its reply batch completes, the method queue or the worker running
 * it). Whoever answers first (the worker, the deadline check, the shutdown)
 * posts the one reply; later answers are dropped. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/support/time.h>

#include "rpc_internal.h"
#include "sl_log.h"
#include "sl_mem.h"

#define MAX_METHODS 32
#define DEFAULT_MAX_QUEUE 64
#define TICK_MS 100

enum tag_kind { T_UNARY_REQ, T_UNARY_DONE, T_STREAM_REQ, T_GENERIC_REQ, T_GENERIC_DONE, T_SHUTDOWN };
enum call_state { P_NEW, P_QUEUED, P_RUNNING, P_ANSWERED };

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
    /* unary calls, under srv->mu */
    int state, refs;
    int64_t due_ms; /* monotonic: the answer is due by then */
    rpc_peer peer;
    rpc_buf req;
    struct pending *qnext;         /* the method's queue */
    struct pending *anext, *aprev; /* srv->active: queued or running */
} pending;

typedef struct method {
    char *name;
    void *handle; /* from grpc_server_register_method */
    int stream;
    rpc_unary_fn unary;
    rpc_stream_fn streamfn;
    void *ud;
    struct rpc_server *srv;
    int workers, max_queue;
    int64_t timeout_ms;
    rpc_stream_opts sopts; /* streams: who may hold one */
    pthread_t *threads;
    int n_threads;
    pending *qhead, *qtail; /* under srv->mu */
    int queued;
    pthread_cond_t cv; /* work for this method, or stopping */
} method;

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
    int started, port;
    int64_t call_timeout_ms, stream_idle_ms, grace_ms;
    int max_streams;
    atomic_int shutting_down; /* the loop posts no new requests */
    int shutdown_kind;
    pthread_t thread;
    /* the loop thread only */
    int shutdown_notified, cq_shut;
    rpc_stream *refused; /* refused streams whose status is on its way */
    /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t changed; /* a thread ended */
    int stopping, loop_done, workers_alive, running, n_streams;
    long outstanding; /* tags posted on cq and not yet seen */
    pending *active;
    rpc_stream *streams;
    rpc_stream_counts refused_counts;
    int64_t refusal_logged_ms; /* refusals are logged at most once a second */
    long refusals_unlogged;
};

/* Servers that rpc_server_destroy had to leave behind stay reachable here. */
static rpc_server *abandoned[8];
static atomic_int n_abandoned;

static int64_t mono_ms(gpr_timespec t)
{
    t = gpr_convert_clock_type(t, GPR_CLOCK_MONOTONIC);
    if (t.tv_sec >= INT64_MAX / 1000 - 1)
        return INT64_MAX;
    return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static int64_t now_ms(void) { return mono_ms(gpr_now(GPR_CLOCK_MONOTONIC)); }

rpc_server *rpc_server_create(const rpc_server_opts *o, sl_err *err)
{
    rpc_pems pem;
    if (rpc_pems_read(&o->tls, 1, &pem, err))
        return NULL;
    rpc_server *srv = sl_xcalloc(1, sizeof *srv);
    pthread_mutex_init(&srv->mu, NULL);
    pthread_cond_init(&srv->changed, NULL);
    srv->shutdown_kind = T_SHUTDOWN;
    srv->call_timeout_ms = o->call_timeout_ms > 0 ? o->call_timeout_ms : RPC_DEFAULT_CALL_TIMEOUT_MS;
    srv->stream_idle_ms = o->stream_idle_ms > 0 ? o->stream_idle_ms : RPC_DEFAULT_STREAM_IDLE_MS;
    srv->grace_ms = o->shutdown_grace_ms > 0 ? o->shutdown_grace_ms : RPC_DEFAULT_SHUTDOWN_GRACE_MS;
    srv->max_streams = o->max_streams > 0 ? o->max_streams : RPC_DEFAULT_MAX_STREAMS;
    rpc_args ra;
    rpc_args_server(&ra, o);
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

static int add_method(rpc_server *srv, const char *name, int stream, const rpc_unary_opts *uo,
                      const rpc_stream_opts *so, rpc_unary_fn u, rpc_stream_fn s, void *ud,
                      sl_err *err)
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
        m->name = NULL;
        return sl_err_set(err, SL_EINVAL, "cannot register method %s", name);
    }
    m->stream = stream;
    m->unary = u;
    m->streamfn = s;
    m->ud = ud;
    m->srv = srv;
    m->workers = uo && uo->workers > 0 ? uo->workers : 1;
    m->timeout_ms = uo && uo->timeout_ms > 0 ? uo->timeout_ms : srv->call_timeout_ms;
    m->max_queue = uo && uo->max_queue > 0 ? uo->max_queue : DEFAULT_MAX_QUEUE;
    if (so)
        m->sopts = *so;
    pthread_cond_init(&m->cv, NULL);
    srv->n_methods++;
    return 0;
}

int rpc_server_add_unary(rpc_server *srv, const char *name, rpc_unary_fn fn, void *ud, sl_err *err)
{
    return add_method(srv, name, 0, NULL, NULL, fn, NULL, ud, err);
}

int rpc_server_add_unary_opts(rpc_server *srv, const char *name, const rpc_unary_opts *uo,
                              rpc_unary_fn fn, void *ud, sl_err *err)
{
    return add_method(srv, name, 0, uo, NULL, fn, NULL, ud, err);
}

int rpc_server_add_stream(rpc_server *srv, const char *name, rpc_stream_fn fn, void *ud,
                          sl_err *err)
{
    return add_method(srv, name, 1, NULL, NULL, NULL, fn, ud, err);
}

int rpc_server_add_stream_opts(rpc_server *srv, const char *name, const rpc_stream_opts *so,
                               rpc_stream_fn fn, void *ud, sl_err *err)
{
    return add_method(srv, name, 1, NULL, so, NULL, fn, ud, err);
}

void rpc_server_stream_counts(rpc_server *srv, rpc_stream_counts *c)
{
    pthread_mutex_lock(&srv->mu);
    *c = srv->refused_counts;
    pthread_mutex_unlock(&srv->mu);
}

/* ---- accepting ------------------------------------------------------------- */

static void posted(rpc_server *srv)
{
    pthread_mutex_lock(&srv->mu);
    srv->outstanding++;
    pthread_mutex_unlock(&srv->mu);
}

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
    posted(srv);
}

static void request_stream(rpc_server *srv, int mi)
{
    stream_req *r = sl_xcalloc(1, sizeof *r);
    rpc_stream *s = sl_xcalloc(1, sizeof *s);
    r->kind = T_STREAM_REQ;
    r->s = s;
    s->srv = srv;
    s->method = mi;
    s->idle_ms = srv->stream_idle_ms;
    s->refusal = grpc_empty_slice();
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
    posted(srv);
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
    posted(srv);
}

/* The gRPC side of a call: released when its reply batch completes. */
static void release_call(pending *p)
{
    if (p->call)
        grpc_call_unref(p->call);
    p->call = NULL;
    if (p->payload)
        grpc_byte_buffer_destroy(p->payload);
    p->payload = NULL;
    if (p->reply)
        grpc_byte_buffer_destroy(p->reply);
    p->reply = NULL;
    grpc_slice_unref(p->status_details);
    p->status_details = grpc_empty_slice();
    grpc_metadata_array_destroy(&p->md);
    grpc_metadata_array_init(&p->md);
    if (p->kind == T_GENERIC_REQ || p->kind == T_GENERIC_DONE) {
        grpc_call_details_destroy(&p->details);
        grpc_call_details_init(&p->details);
    }
}

static void pending_free(pending *p)
{
    release_call(p);
    grpc_metadata_array_destroy(&p->md);
    rpc_buf_free(&p->req);
    free(p);
}

/* Drops one holder of a unary call; under srv->mu. */
static void unref_locked(pending *p)
{
    if (--p->refs == 0)
        pending_free(p);
}

static void active_remove(rpc_server *srv, pending *p)
{
    if (p->aprev)
        p->aprev->anext = p->anext;
    else if (srv->active == p)
        srv->active = p->anext;
    if (p->anext)
        p->anext->aprev = p->aprev;
    p->anext = p->aprev = NULL;
}

/* Sends the reply (message when code is OK) and the status in one batch.
 * Under srv->mu for unary calls (the loop thread alone for the others). */
static void post_reply(rpc_server *srv, pending *p, int code, const char *details)
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
        if (p->kind == T_UNARY_DONE) {
            release_call(p);
            unref_locked(p);
        } else {
            pending_free(p);
        }
        return;
    }
    srv->outstanding++;
}

/* Answers a unary call that has not been answered yet; under srv->mu. */
static void answer_locked(rpc_server *srv, pending *p, int code, const char *details,
                          const rpc_buf *resp)
{
    method *m = &srv->methods[p->method];
    if (code == RPC_OK) {
        rpc_iov iov = {resp ? resp->data : NULL, resp ? resp->len : 0};
        p->reply = rpc_bb_from_iov(&iov, 1);
    } else {
        sl_log_info("rpc: refused", "method=%s peer=%s identity=%s code=%s reason=\"%s\"", m->name,
                    p->peer.address, p->peer.identity[0] ? p->peer.identity : "-",
                    rpc_code_name(code), details);
    }
    active_remove(srv, p);
    p->state = P_ANSWERED;
    p->kind = T_UNARY_DONE;
    post_reply(srv, p, code, code == RPC_OK ? "" : details);
}

/* A unary call has arrived (loop thread): queue it for its method's workers. */
static void dispatch_unary(rpc_server *srv, pending *p)
{
    method *m = &srv->methods[p->method];
    rpc_peer_from_call(p->call, &p->peer);
    int have = p->payload != NULL;
    if (have) {
        rpc_buf_from_bb(p->payload, &p->req);
        p->payload = NULL;
    }
    int64_t now = now_ms(), due = mono_ms(p->deadline);
    p->due_ms = now > INT64_MAX - m->timeout_ms || now + m->timeout_ms > due ? due
                                                                               : now + m->timeout_ms;
    pthread_mutex_lock(&srv->mu);
    p->refs = 1;
    p->state = P_NEW;
    if (!have) {
        answer_locked(srv, p, RPC_INVALID_ARGUMENT, "no request message", NULL);
    } else if (srv->stopping) {
        answer_locked(srv, p, RPC_UNAVAILABLE, "the server is shutting down", NULL);
    } else if (m->queued >= m->max_queue) {
        char why[128];
        snprintf(why, sizeof why, "%d calls of this method are waiting already", m->queued);
        answer_locked(srv, p, RPC_RESOURCE_EXHAUSTED, why, NULL);
    } else {
        p->state = P_QUEUED;
        p->refs++;
        if (m->qtail)
            m->qtail->qnext = p;
        else
            m->qhead = p;
        m->qtail = p;
        m->queued++;
        p->anext = srv->active;
        if (srv->active)
            srv->active->aprev = p;
        srv->active = p;
        pthread_cond_signal(&m->cv);
    }
    pthread_mutex_unlock(&srv->mu);
}

static void *unary_worker(void *arg)
{
    method *m = arg;
    rpc_server *srv = m->srv;
    pthread_mutex_lock(&srv->mu);
    for (;;) {
        while (!m->qhead && !srv->stopping)
            pthread_cond_wait(&m->cv, &srv->mu);
        pending *p = m->qhead;
        if (!p)
            break;
        m->qhead = p->qnext;
        if (!m->qhead)
            m->qtail = NULL;
        m->queued--;
        if (p->state != P_QUEUED) { /* answered while it waited */
            unref_locked(p);
            continue;
        }
        if (now_ms() >= p->due_ms) {
            answer_locked(srv, p, RPC_DEADLINE_EXCEEDED, "the call waited past its deadline", NULL);
            unref_locked(p);
            continue;
        }
        p->state = P_RUNNING;
        srv->running++;
        pthread_mutex_unlock(&srv->mu);
        rpc_status st = {RPC_OK, ""};
        rpc_buf resp = {0};
        int code = m->unary(m->ud, &p->peer, p->req.data, p->req.len, &resp, &st);
        pthread_mutex_lock(&srv->mu);
        srv->running--;
        if (p->state == P_RUNNING)
            answer_locked(srv, p, code, st.details, &resp);
        else
            sl_log_warn("rpc: a late answer was dropped", "method=%s peer=%s code=%s", m->name,
                        p->peer.address, rpc_code_name(code));
        rpc_buf_free(&resp);
        unref_locked(p);
    }
    srv->workers_alive--;
    pthread_cond_broadcast(&srv->changed);
    pthread_mutex_unlock(&srv->mu);
    return NULL;
}

/* Answers every queued or running call past its deadline (loop thread). */
static void expire_calls(rpc_server *srv)
{
    int64_t now = now_ms();
    pthread_mutex_lock(&srv->mu);
    for (pending *p = srv->active, *next; p; p = next) {
        next = p->anext;
        if (now >= p->due_ms)
            answer_locked(srv, p, RPC_DEADLINE_EXCEEDED,
                          p->state == P_RUNNING ? "the handler did not answer before the deadline"
                                                : "the call waited past its deadline",
                          NULL);
    }
    pthread_mutex_unlock(&srv->mu);
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
    pthread_mutex_lock(&srv->mu);
    post_reply(srv, p, RPC_UNIMPLEMENTED, details);
    pthread_mutex_unlock(&srv->mu);
}

/* ---- streams (server side) ------------------------------------------------- */

static void stream_free(rpc_stream *s)
{
    if (s->call)
        grpc_call_unref(s->call);
    s->call = NULL;
    grpc_metadata_array_destroy(&s->initial_md);
    grpc_slice_unref(s->refusal);
    rpc_cq_destroy_pluck(s->cq);
}

static void *stream_main(void *arg)
{
    rpc_stream *s = arg;
    rpc_server *srv = s->srv;
    method *m = &srv->methods[s->method];
    rpc_peer peer = s->peer;
    grpc_op ops[1];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    int ok = rpc_batch(s->call, ops, 1, &s->tag_send, NULL) == 0 && rpc_stream_wait(s, &s->tag_send);
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
    if (rpc_batch(s->call, ops, 1, &s->tag_send, NULL) == 0 && !rpc_stream_wait(s, &s->tag_send))
        grpc_call_cancel(s->call, NULL);
    grpc_slice_unref(details);
    if (close_posted)
        rpc_pluck(s->cq, &s->tag_end);
    stream_free(s);
    pthread_mutex_lock(&srv->mu);
    s->done = 1;
    srv->n_streams--;
    pthread_cond_broadcast(&srv->changed);
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

/* Ends a stream at once with a status, without a thread; the loop frees it
 * when the status has gone out (reap_refused). */
static void refuse_stream(rpc_server *srv, rpc_stream *s, int code, const char *why)
{
    /* a flood of refused callers must not flood the log: the first refusal
     * of each second is logged, with how many went unlogged before it */
    int64_t now = now_ms();
    pthread_mutex_lock(&srv->mu);
    int log = now - srv->refusal_logged_ms >= 1000;
    long unlogged = srv->refusals_unlogged;
    if (log) {
        srv->refusal_logged_ms = now;
        srv->refusals_unlogged = 0;
    } else {
        srv->refusals_unlogged++;
    }
    pthread_mutex_unlock(&srv->mu);
    if (log)
        sl_log_warn("rpc: stream refused", "method=%s peer=%s identity=%s code=%s reason=\"%s\" "
                    "refused_unlogged=%ld", srv->methods[s->method].name, s->peer.address,
                    s->peer.identity[0] ? s->peer.identity : "-", rpc_code_name(code), why, unlogged);
    s->refusal = grpc_slice_from_copied_string(why);
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[1].data.send_status_from_server.status = (grpc_status_code)code;
    ops[1].data.send_status_from_server.status_details = &s->refusal;
    ops[2].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[2].data.recv_close_on_server.cancelled = &s->cancelled;
    if (rpc_batch(s->call, ops, 3, &s->tag_end, NULL) != 0) {
        grpc_call_cancel(s->call, NULL);
        stream_free(s);
        free(s);
        return;
    }
    s->next = srv->refused;
    srv->refused = s;
}

static void reap_refused(rpc_server *srv)
{
    for (rpc_stream **pp = &srv->refused; *pp;) {
        rpc_stream *s = *pp;
        grpc_event ev =
            grpc_completion_queue_pluck(s->cq, &s->tag_end, gpr_time_0(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type != GRPC_OP_COMPLETE) {
            pp = &s->next;
            continue;
        }
        *pp = s->next;
        stream_free(s);
        free(s);
    }
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
    method *m = &srv->methods[s->method];
    rpc_peer_from_call(s->call, &s->peer);
    /* who may hold a stream is decided before it counts against the limits */
    rpc_status ast = {RPC_OK, ""};
    int admit = RPC_OK;
    if (!atomic_load(&srv->shutting_down) && m->sopts.admit &&
        (admit = m->sopts.admit(m->sopts.admit_ud, &s->peer, &ast)) != RPC_OK) {
        pthread_mutex_lock(&srv->mu);
        srv->refused_counts.admit++;
        pthread_mutex_unlock(&srv->mu);
        refuse_stream(srv, s, admit, ast.details);
        return;
    }
    pthread_mutex_lock(&srv->mu);
    int mine = 0;
    if (m->sopts.max_per_peer > 0)
        for (rpc_stream *x = srv->streams; x; x = x->next)
            mine += !x->done && x->method == s->method && !strcmp(x->peer.identity, s->peer.identity);
    if (srv->stopping || srv->n_streams >= srv->max_streams ||
        (m->sopts.max_per_peer > 0 && mine >= m->sopts.max_per_peer)) {
        int n = srv->n_streams, stopping = srv->stopping;
        int full = !stopping && n >= srv->max_streams;
        if (full)
            srv->refused_counts.full++;
        else if (!stopping)
            srv->refused_counts.per_peer++;
        pthread_mutex_unlock(&srv->mu);
        char why[160];
        if (stopping)
            snprintf(why, sizeof why, "the server is shutting down");
        else if (full)
            snprintf(why, sizeof why, "too many streams at once (%d)", n);
        else
            snprintf(why, sizeof why, "%.40s holds %d streams of this method already (the most "
                     "one caller may)", s->peer.identity[0] ? s->peer.identity : "this caller", mine);
        refuse_stream(srv, s, stopping ? RPC_UNAVAILABLE : RPC_RESOURCE_EXHAUSTED, why);
        return;
    }
    s->next = srv->streams;
    srv->streams = s;
    srv->n_streams++;
    if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
        srv->streams = s->next;
        srv->n_streams--;
        pthread_mutex_unlock(&srv->mu);
        refuse_stream(srv, s, RPC_RESOURCE_EXHAUSTED, "cannot start a stream thread");
        return;
    }
    pthread_mutex_unlock(&srv->mu);
}

/* ---- the loop -------------------------------------------------------------- */

static void handle_event(rpc_server *srv, grpc_event *ev)
{
    int kind = *(int *)ev->tag;
    if (kind == T_SHUTDOWN) {
        srv->shutdown_notified = 1;
        return;
    }
    pthread_mutex_lock(&srv->mu);
    srv->outstanding--;
    pthread_mutex_unlock(&srv->mu);
    pending *p = ev->tag;
    switch (kind) {
    case T_UNARY_REQ:
        if (!ev->success) {
            pending_free(p);
            break;
        }
        if (!atomic_load(&srv->shutting_down))
            request_unary(srv, p->method);
        dispatch_unary(srv, p);
        break;
    case T_STREAM_REQ: {
        stream_req *r = ev->tag;
        int mi = r->s->method;
        if (ev->success && !atomic_load(&srv->shutting_down))
            request_stream(srv, mi);
        accept_stream(srv, r, ev->success);
        break;
    }
    case T_GENERIC_REQ:
        if (!ev->success) {
            pending_free(p);
            break;
        }
        if (!atomic_load(&srv->shutting_down))
            request_generic(srv);
        handle_generic(srv, p);
        break;
    case T_UNARY_DONE:
        pthread_mutex_lock(&srv->mu);
        release_call(p);
        unref_locked(p);
        pthread_mutex_unlock(&srv->mu);
        break;
    case T_GENERIC_DONE:
        pending_free(p);
        break;
    }
}

static void *server_main(void *arg)
{
    rpc_server *srv = arg;
    int64_t next_tick = now_ms() + TICK_MS;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(srv->cq, rpc_deadline_ms(TICK_MS), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type == GRPC_OP_COMPLETE)
            handle_event(srv, &ev);
        if (now_ms() >= next_tick) {
            expire_calls(srv);
            next_tick = now_ms() + TICK_MS;
        }
        reap_refused(srv);
        pthread_mutex_lock(&srv->mu);
        int done = srv->shutdown_notified && srv->outstanding == 0 && !srv->refused;
        pthread_mutex_unlock(&srv->mu);
        if (done && !srv->cq_shut) {
            srv->cq_shut = 1;
            grpc_completion_queue_shutdown(srv->cq);
        }
    }
    pthread_mutex_lock(&srv->mu);
    srv->loop_done = 1;
    pthread_cond_broadcast(&srv->changed);
    pthread_mutex_unlock(&srv->mu);
    return NULL;
}

int rpc_server_start(rpc_server *srv, sl_err *err)
{
    grpc_server_start(srv->server);
    srv->started = 1;
    for (int i = 0; i < srv->n_methods; i++) {
        method *m = &srv->methods[i];
        if (m->stream) {
            request_stream(srv, i);
            continue;
        }
        request_unary(srv, i);
        m->threads = sl_xcalloc((size_t)m->workers, sizeof *m->threads);
        for (; m->n_threads < m->workers; m->n_threads++) {
            if (pthread_create(&m->threads[m->n_threads], NULL, unary_worker, m) != 0)
                break;
            pthread_mutex_lock(&srv->mu);
            srv->workers_alive++;
            pthread_mutex_unlock(&srv->mu);
        }
    }
    request_generic(srv);
    if (pthread_create(&srv->thread, NULL, server_main, srv) != 0) {
        srv->started = 2; /* started, no thread: destroy drains inline */
        return sl_err_set(err, SL_EINTERNAL, "cannot start the server thread");
    }
    for (int i = 0; i < srv->n_methods; i++)
        if (!srv->methods[i].stream && srv->methods[i].n_threads < srv->methods[i].workers)
            return sl_err_set(err, SL_EINTERNAL, "cannot start the workers of %s",
                              srv->methods[i].name);
    return srv->port;
}

static int all_stopped_locked(rpc_server *srv)
{
    return srv->loop_done && srv->workers_alive == 0 && srv->n_streams == 0;
}

int rpc_server_destroy(rpc_server *srv)
{
    if (!srv)
        return 0;
    pthread_mutex_lock(&srv->mu);
    srv->stopping = 1;
    for (pending *p = srv->active, *next; p; p = next) {
        next = p->anext;
        answer_locked(srv, p, RPC_UNAVAILABLE, "the server is shutting down", NULL);
    }
    for (int i = 0; i < srv->n_methods; i++)
        pthread_cond_broadcast(&srv->methods[i].cv);
    pthread_mutex_unlock(&srv->mu);
    /* The loop sees this flag only after the notify tag below, or never
     * posts again when it is not running. */
    atomic_store(&srv->shutting_down, 1);
    grpc_server_shutdown_and_notify(srv->server, srv->cq, &srv->shutdown_kind);
    grpc_server_cancel_all_calls(srv->server);
    if (srv->started != 1)
        server_main(srv); /* never started: drains the queue here */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += srv->grace_ms / 1000;
    until.tv_nsec += (srv->grace_ms % 1000) * 1000000;
    if (until.tv_nsec >= 1000000000) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000;
    }
    pthread_mutex_lock(&srv->mu);
    while (!all_stopped_locked(srv))
        if (pthread_cond_timedwait(&srv->changed, &srv->mu, &until) == ETIMEDOUT)
            break;
    int clean = all_stopped_locked(srv), running = srv->running, streams = srv->n_streams;
    pthread_mutex_unlock(&srv->mu);
    if (!clean) {
        sl_log_error("rpc: handlers still running after the shutdown grace period; leaving them",
                     "grace_ms=%lld unary=%d streams=%d", (long long)srv->grace_ms, running,
                     streams);
        int k = atomic_fetch_add(&n_abandoned, 1);
        if (k < (int)(sizeof abandoned / sizeof abandoned[0]))
            abandoned[k] = srv;
        return -1;
    }
    if (srv->started == 1)
        pthread_join(srv->thread, NULL);
    for (int i = 0; i < srv->n_methods; i++) {
        method *m = &srv->methods[i];
        for (int k = 0; k < m->n_threads; k++)
            pthread_join(m->threads[k], NULL);
        free(m->threads);
        free(m->name);
        pthread_cond_destroy(&m->cv);
    }
    reap_streams(srv, 1);
    grpc_server_destroy(srv->server);
    grpc_completion_queue_destroy(srv->cq);
    pthread_cond_destroy(&srv->changed);
    pthread_mutex_destroy(&srv->mu);
    free(srv);
    return 0;
}
