/* rpc_internal.h - what the rpc_ source files share (never included outside proto/). */
#ifndef RPC_INTERNAL_H
#define RPC_INTERNAL_H

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <pthread.h>
#include <stdatomic.h>

#include "rpc.h"

#define RPC_DEFAULT_MAX_MESSAGE (4u << 20)

/* Both ends of a streaming call use this; ops complete on the call's own
 * pluck queue so send and recv can block in different threads. */
struct rpc_stream {
    grpc_call *call;
    grpc_completion_queue *cq;
    int client;
    int got_initial_md; /* client: RECV_INITIAL_METADATA done */
    int failed;         /* an op failed: the call is over */
    int send_closed;    /* client: SEND_CLOSE_FROM_CLIENT done */
    int status_posted;  /* client: RECV_STATUS_ON_CLIENT is outstanding (tag_end) */
    char tag_send, tag_recv, tag_end;
    grpc_metadata_array initial_md;  /* client: received; server: request metadata */
    grpc_metadata_array trailing_md; /* client */
    grpc_status_code status;         /* client */
    grpc_slice status_details;       /* client */
    const char *error_string;        /* client */
    int cancelled;                   /* server: RECV_CLOSE_ON_SERVER result */
    _Atomic int64_t idle_ms; /* the longest wait for one op (either side); 0: none */
    /* server side */
    rpc_peer peer;      /* the caller, read when the call arrived */
    grpc_slice refusal; /* status details of a stream refused at the door */
    gpr_timespec deadline;
    struct rpc_server *srv;
    int method;
    pthread_t thread;
    int done; /* handler thread finished (joinable) */
    struct rpc_stream *next;
};

gpr_timespec rpc_deadline_ms(int64_t ms);
/* Reads a PEM file into a NUL-terminated malloc'd string (<= 1 MiB). */
char *rpc_read_pem(const char *path, sl_err *err);
/* The PEM texts of an rpc_tls_files: ca always; cert and key both or
 * neither (both required with need_pair). rpc_pems_free wipes the key. */
typedef struct rpc_pems {
    char *ca, *cert, *key;
} rpc_pems;
int rpc_pems_read(const rpc_tls_files *t, int need_pair, rpc_pems *p, sl_err *err);
void rpc_pems_free(rpc_pems *p);
/* Connection limits every server gets (docs/security.md). */
#define RPC_HANDSHAKE_TIMEOUT_MS 10000
#define RPC_MAX_STREAMS_PER_CONN 32
#define RPC_KEEPALIVE_MS 60000
#define RPC_KEEPALIVE_TIMEOUT_MS 20000
#define RPC_CONN_AGE_GRACE_MS 30000

/* The server's TLS credentials: from the PEM texts, or with o->reload_tls
 * from the files through gRPC's file watcher (pem only validated them). */
grpc_server_credentials *rpc_server_credentials(const rpc_server_opts *o, const rpc_pems *pem);
/* Channel args: message limits, keepalive, and an optional target name
 * override (clients) or the connection limits of a server. */
typedef struct rpc_args {
    grpc_arg a[16];
    grpc_channel_args args;
} rpc_args;
void rpc_args_init(rpc_args *ra, size_t max_message, const char *server_name);
void rpc_args_server(rpc_args *ra, const rpc_server_opts *o);
grpc_byte_buffer *rpc_bb_from_iov(const rpc_iov *iov, int n);
/* Moves bb's bytes into b and destroys bb. */
void rpc_buf_from_bb(grpc_byte_buffer *bb, rpc_buf *b);
void rpc_peer_from_call(grpc_call *call, rpc_peer *p);
/* Waits for `tag` on a pluck queue; returns its success flag. */
int rpc_pluck(grpc_completion_queue *cq, void *tag);
/* rpc_pluck for a stream op: a wait longer than the stream's idle limit
 * (rpc_stream_set_idle; on a server, the server's stream_idle_ms) cancels
 * the call (DEADLINE_EXCEEDED) and fails. */
int rpc_stream_wait(rpc_stream *s, void *tag);
/* Shuts down, drains and destroys a pluck queue. */
void rpc_cq_destroy_pluck(grpc_completion_queue *cq);
int rpc_batch(grpc_call *call, const grpc_op *ops, size_t n, void *tag, sl_err *err);
/* Opens the spare descriptor of rpc_accept.c (rpc_global_init). */
void rpc_accept_init(void);
long rpc_accept_dropped(void);

#endif
