/* rpc.h - the one layer that touches the gRPC C core API (rpc_ prefix).
 *
 * Everything here is bytes in, bytes out: callers encode and decode the
 * protobuf messages of skyloom.proto (skyloom.pb-c.h) themselves. Transport
 * security is always mutual TLS with the project CA as the only root.
 *
 * Server model. One thread runs gRPC's completion queue: it accepts calls,
 * answers unknown methods with UNIMPLEMENTED and never runs a handler. Each
 * unary method has its own queue and its own worker threads (1 by default,
 * rpc_unary_opts.workers), so a slow call of one method never delays
 * another method, and handlers of different methods (and the workers of one
 * method) run at the same time: handlers must be thread-safe. A method's
 * queue is bounded (RESOURCE_EXHAUSTED beyond it). Every unary call has a
 * deadline, the earlier of the client's and the method's timeout: a call
 * still queued at its deadline is not run, and a handler still running at
 * it gets its call answered DEADLINE_EXCEEDED (its late result is dropped;
 * the handler itself runs to its end, C cannot stop it). Each streaming call
 * runs its handler on a thread of its own with blocking send/recv, at most
 * max_streams at once; a stream whose next message takes longer than
 * stream_idle_ms either way is cancelled. To add a method, write an
 * rpc_unary_fn and register it: it gets these guarantees as is.
 *
 * rpc_server_destroy stops accepting, answers queued and running calls
 * UNAVAILABLE, cancels streams and waits up to shutdown_grace_ms for every
 * handler; a handler blocked past that (a hung disk) is left running and
 * the server is not freed, so the process can still exit on time.
 *
 * Connections: TLS handshakes must finish in 10 s, idle connections are
 * closed (conn_idle_ms), connections may be given a maximum age
 * (conn_age_ms), at most 32 concurrent calls per connection, keepalive pings
 * every 60 s during calls (20 s to answer). When the process runs short of
 * descriptors, new connections are closed at once instead of stopping the
 * listener (rpc_accept.c). docs/security.md lists the limits.
 *
 * Client model: blocking calls, each with a deadline; a channel may be used
 * from several threads. */
#ifndef RPC_H
#define RPC_H

#include <stddef.h>
#include <stdint.h>

#include "sl_err.h"

/* grpc_init(); call once before any other rpc_ function. */
void rpc_global_init(void);
/* grpc_shutdown(); call last, after every call, channel and server is gone. */
void rpc_global_shutdown(void);
/* The gRPC core version string ("29.0.0" on Debian 12's 1.51). */
const char *rpc_grpc_version(void);
/* Incoming connections closed at once because the process was at (or near)
 * its descriptor limit (see rpc_accept.c), since the start. */
long rpc_connections_dropped(void);

/* Full method names of skyloom.proto. */
#define RPC_M_ENROLL "/skyloom.v1.Coordinator/Enroll"
#define RPC_M_HEARTBEAT "/skyloom.v1.Coordinator/Heartbeat"
#define RPC_M_LIST_DEVICES "/skyloom.v1.Coordinator/ListDevices"
#define RPC_M_RENEW "/skyloom.v1.Coordinator/Renew"
#define RPC_M_SUBMIT_JOB "/skyloom.v1.Coordinator/SubmitJob"
#define RPC_M_LIST_JOBS "/skyloom.v1.Coordinator/ListJobs"
#define RPC_M_GET_JOB "/skyloom.v1.Coordinator/GetJob"
#define RPC_M_STOP_JOB "/skyloom.v1.Coordinator/StopJob"
#define RPC_M_RESUME_JOB "/skyloom.v1.Coordinator/ResumeJob"
#define RPC_M_FETCH_FILE "/skyloom.v1.Coordinator/FetchFile"
#define RPC_M_REPORT_TASK "/skyloom.v1.Coordinator/ReportTask"
#define RPC_M_GET_PLAN "/skyloom.v1.Coordinator/GetPlan"
#define RPC_M_REPORT_STEP "/skyloom.v1.Coordinator/ReportStep"
#define RPC_M_UPLOAD_CHUNK "/skyloom.v1.Coordinator/UploadChunk"
#define RPC_M_UPLOAD_INIT "/skyloom.v1.Coordinator/UploadInit"
#define RPC_M_STAGE_EXCHANGE "/skyloom.v1.Stage/Exchange"
#define RPC_M_STAGE_PING "/skyloom.v1.Stage/Ping"

/* Status codes: the numbers are gRPC's (google.rpc.Code). */
enum rpc_code {
    RPC_OK = 0,
    RPC_CANCELLED = 1,
    RPC_UNKNOWN = 2,
    RPC_INVALID_ARGUMENT = 3,
    RPC_DEADLINE_EXCEEDED = 4,
    RPC_NOT_FOUND = 5,
    RPC_ALREADY_EXISTS = 6,
    RPC_PERMISSION_DENIED = 7,
    RPC_RESOURCE_EXHAUSTED = 8,
    RPC_FAILED_PRECONDITION = 9,
    RPC_ABORTED = 10,
    RPC_OUT_OF_RANGE = 11,
    RPC_UNIMPLEMENTED = 12,
    RPC_INTERNAL = 13,
    RPC_UNAVAILABLE = 14,
    RPC_DATA_LOSS = 15,
    RPC_UNAUTHENTICATED = 16,
};

typedef struct rpc_status {
    int code;
    char details[384];
} rpc_status;

/* "PERMISSION_DENIED", ...; "CODE_<n>" for unknown numbers. */
const char *rpc_code_name(int code);
/* Sets code and details; returns code. */
int rpc_status_set(rpc_status *st, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A received message. Free with rpc_buf_free. */
typedef struct rpc_buf {
    uint8_t *data;
    size_t len;
    void *owner_; /* the gRPC slice that holds the bytes */
} rpc_buf;
void rpc_buf_free(rpc_buf *b);

/* PEM files: ca is the only trusted root; cert/key may be NULL on a client
 * that has no certificate yet (enrollment). A cert file may hold a chain
 * (leaf first). */
typedef struct rpc_tls_files {
    const char *ca;
    const char *cert;
    const char *key;
} rpc_tls_files;

/* Who is calling, from the TLS auth context. */
typedef struct rpc_peer {
    int authenticated;  /* presented a certificate that chains to our CA */
    char identity[128]; /* the certificate's common name ("" without one) */
    char address[128];  /* "ipv4:127.0.0.1:40000" */
} rpc_peer;

/* ---- server ---------------------------------------------------------------- */

enum rpc_client_auth {
    RPC_CLIENT_CERT_REQUIRED, /* the TLS handshake fails without a valid client cert */
    RPC_CLIENT_CERT_OPTIONAL, /* verified if presented; handlers check peer->authenticated */
};

#define RPC_DEFAULT_CALL_TIMEOUT_MS 30000
#define RPC_DEFAULT_MAX_STREAMS 64
#define RPC_DEFAULT_STREAM_IDLE_MS (10 * 60 * 1000)
#define RPC_DEFAULT_CONN_IDLE_MS (5 * 60 * 1000)
#define RPC_DEFAULT_SHUTDOWN_GRACE_MS 5000

typedef struct rpc_server_opts {
    const char *listen;      /* "127.0.0.1:0" picks a free port */
    rpc_tls_files tls;       /* cert and key required */
    int client_auth;         /* enum rpc_client_auth */
    size_t max_message;      /* receive and send limit in bytes; 0 = 4 MiB */
    int reload_tls;          /* 1: new connections get the cert/key files' latest pair
                              * (the files are checked every second); 0: read once */
    /* Limits; 0 takes the RPC_DEFAULT_ above. */
    int64_t call_timeout_ms;   /* unary calls without a method timeout of their own */
    int max_streams;           /* streaming calls at once; more get RESOURCE_EXHAUSTED */
    int64_t stream_idle_ms;    /* the longest wait for one stream message, either way */
    int64_t conn_idle_ms;      /* a connection without calls for this long is closed */
    int64_t conn_age_ms;       /* connections are closed after this (30 s grace for their
                                  calls); 0: no limit */
    int64_t shutdown_grace_ms; /* how long rpc_server_destroy waits for handlers */
} rpc_server_opts;

typedef struct rpc_server rpc_server;
typedef struct rpc_stream rpc_stream;

/* Unary handler: returns the status code (RPC_OK sends *resp). Fill resp with
 * malloc'd bytes (freed by rpc) or leave it empty; on failure set st->details. */
typedef int (*rpc_unary_fn)(void *ud, const rpc_peer *peer, const uint8_t *req, size_t len,
                            rpc_buf *resp, rpc_status *st);
/* Stream handler: runs on its own thread; returns the final status code
 * (details in st). The stream is closed by rpc after it returns. */
typedef int (*rpc_stream_fn)(void *ud, const rpc_peer *peer, rpc_stream *s, rpc_status *st);

rpc_server *rpc_server_create(const rpc_server_opts *o, sl_err *err);
/* method: "/skyloom.v1.Coordinator/Enroll". Register before rpc_server_start.
 * One worker thread, the server's call timeout, a queue of 64. */
int rpc_server_add_unary(rpc_server *srv, const char *method, rpc_unary_fn fn, void *ud,
                         sl_err *err);
typedef struct rpc_unary_opts {
    int workers;        /* threads running this method's handler; 0: 1 */
    int64_t timeout_ms; /* the answer is due this long after the call came; 0: the server's */
    int max_queue;      /* calls waiting for a worker before RESOURCE_EXHAUSTED; 0: 64 */
} rpc_unary_opts;
int rpc_server_add_unary_opts(rpc_server *srv, const char *method, const rpc_unary_opts *uo,
                              rpc_unary_fn fn, void *ud, sl_err *err);
int rpc_server_add_stream(rpc_server *srv, const char *method, rpc_stream_fn fn, void *ud,
                          sl_err *err);
/* Who may hold a stream of a method. admit runs on the server's loop thread
 * when a call arrives, before it counts against max_streams or gets a
 * thread: RPC_OK lets it in, any other code refuses it at once with
 * st->details (so callers it refuses never take anyone's place). It must
 * not block. max_per_peer: streams of this method one identity (the
 * certificate's common name) may hold at once; more are refused
 * RESOURCE_EXHAUSTED. */
typedef struct rpc_stream_opts {
    int (*admit)(void *admit_ud, const rpc_peer *peer, rpc_status *st);
    void *admit_ud;
    int max_per_peer; /* 0: no cap but max_streams */
} rpc_stream_opts;
int rpc_server_add_stream_opts(rpc_server *srv, const char *method, const rpc_stream_opts *so,
                               rpc_stream_fn fn, void *ud, sl_err *err);
/* Streams refused at the door since the server started, by why. */
typedef struct rpc_stream_counts {
    long admit;    /* admit said no */
    long per_peer; /* the caller held max_per_peer already */
    long full;     /* max_streams were running */
} rpc_stream_counts;
void rpc_server_stream_counts(rpc_server *srv, rpc_stream_counts *c);
/* Binds, starts serving on a background thread; returns the bound port or -1. */
int rpc_server_start(rpc_server *srv, sl_err *err);
/* Stops serving: answers or cancels every call in flight and waits up to
 * shutdown_grace_ms for the handlers. 0: everything is freed. -1: a handler
 * is still running (logged); the server stays allocated, so neither it nor
 * anything that handler uses may be freed, and rpc_global_shutdown must not
 * be called: exit the process instead. */
int rpc_server_destroy(rpc_server *srv);

/* ---- client ---------------------------------------------------------------- */

typedef struct rpc_channel rpc_channel;

typedef struct rpc_channel_opts {
    const char *target;      /* "127.0.0.1:7443", "host:port" */
    rpc_tls_files tls;       /* ca required; cert/key optional */
    const char *server_name; /* name to check in the server cert; NULL: from target */
    size_t max_message;      /* 0 = 4 MiB */
} rpc_channel_opts;

rpc_channel *rpc_channel_create(const rpc_channel_opts *o, sl_err *err);
void rpc_channel_destroy(rpc_channel *ch);

/* One unary call. Returns st->code (RPC_OK: *resp holds the reply, free it
 * with rpc_buf_free). A refused TLS handshake shows up as RPC_UNAVAILABLE. */
int rpc_call_unary(rpc_channel *ch, const char *method, const void *req, size_t len,
                   int64_t timeout_ms, rpc_buf *resp, rpc_status *st);

/* ---- protobuf-c helpers ----------------------------------------------------- */

/* Packs a protobuf-c message (any generated struct) into a malloc'd rpc_buf. */
void rpc_pack(const void *msg, rpc_buf *out);
/* Unpacks bytes as the message type of `descriptor` (a
 * ProtobufCMessageDescriptor); NULL when malformed. Free with rpc_unpacked_free. */
void *rpc_unpack(const void *descriptor, const uint8_t *data, size_t len);
void rpc_unpacked_free(void *msg);
/* A unary call with protobuf-c messages: packs req, unpacks the reply into
 * *resp (RPC_INTERNAL with a reason if the reply is malformed). */
int rpc_call_pb(rpc_channel *ch, const char *method, const void *req, const void *resp_descriptor,
                void **resp, int64_t timeout_ms, rpc_status *st);

/* ---- streams (both sides) -------------------------------------------------- */

/* Client: opens a bidirectional stream whose whole life has the deadline
 * (rpc_stream_new, then rpc_stream_start). */
rpc_stream *rpc_stream_open(rpc_channel *ch, const char *method, int64_t timeout_ms,
                            sl_err *err);
/* The two halves of rpc_stream_open, for a caller that must be able to
 * interrupt the opening from another thread (rpc_stream_interrupt): _new
 * makes the call without waiting for anything; _start waits until the call
 * is under way (the connection made), bounded by the stream's idle limit
 * when one is set. A stream whose start failed is freed with
 * rpc_stream_cancel (or rpc_stream_finish, for its status). */
rpc_stream *rpc_stream_new(rpc_channel *ch, const char *method, int64_t timeout_ms, sl_err *err);
int rpc_stream_start(rpc_stream *s, sl_err *err);
/* Either side: from now on every wait of one stream op (a send, a receive,
 * the start, the half-close, rpc_stream_finish's wait for the status) that
 * takes longer than ms cancels the call (DEADLINE_EXCEEDED) and fails;
 * 0 lifts the limit. Returns the previous limit. A server stream starts with
 * the server's stream_idle_ms, a client stream with none. */
int64_t rpc_stream_set_idle(rpc_stream *s, int64_t ms);
/* Sends one message made of n pieces (copied into one gRPC message); blocks
 * until gRPC has taken it. One sender and one receiver thread may work at
 * the same time. */
typedef struct rpc_iov {
    const void *data;
    size_t len;
} rpc_iov;
int rpc_stream_sendv(rpc_stream *s, const rpc_iov *iov, int n, sl_err *err);
int rpc_stream_send(rpc_stream *s, const void *data, size_t len, sl_err *err);
/* A message buffer owned by gRPC, to build a message in place (no copy on
 * send). Fill data[0..cap), then send a range of it with rpc_stream_send_msg,
 * which consumes the buffer; rpc_msg_free drops one that is not sent. */
typedef struct rpc_msg {
    uint8_t *data;
    size_t cap;
    void *slice_;
} rpc_msg;
void rpc_msg_alloc(rpc_msg *m, size_t cap);
void rpc_msg_free(rpc_msg *m);
int rpc_stream_send_msg(rpc_stream *s, rpc_msg *m, size_t off, size_t len, sl_err *err);
/* Client: half-closes (no more sends); replies can still be received. */
int rpc_stream_close_send(rpc_stream *s, sl_err *err);
/* 1: a message in *msg; 0: the peer closed its side; -1: the call failed. */
int rpc_stream_recv(rpc_stream *s, rpc_buf *msg, sl_err *err);
/* Client: half-closes, reads and drops replies until the server ends the
 * call (so a server that keeps sending is waited for, up to the deadline),
 * returns its status (details in st) and frees the stream. */
int rpc_stream_finish(rpc_stream *s, rpc_status *st);
/* Client: cancels the call and frees the stream. */
void rpc_stream_cancel(rpc_stream *s);
/* Either side: cancels the call without freeing anything, from any thread;
 * every send and receive in progress or to come fails. The owner still
 * ends the stream as usual (rpc_stream_cancel, or the handler returns). */
void rpc_stream_interrupt(rpc_stream *s);

/* Wire helper for StageFrame { bytes frame = 1; }: writes the field tag and
 * length for a frame of n bytes into hdr (at most 11 bytes) and returns how
 * many; send hdr then the frame as two rpc_iov pieces. */
size_t rpc_frame_wrap(uint8_t hdr[11], size_t n);
/* Finds the frame inside a received StageFrame; -1 if it is not exactly one
 * field 1 of wire type 2 covering the whole message. */
int rpc_frame_unwrap(const uint8_t *msg, size_t len, const uint8_t **frame, size_t *n);

#endif
