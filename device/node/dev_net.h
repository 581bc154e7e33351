/* dev_net.h - a job's links on one device, and the network port the stage
 * runner (dev_pipe.h) uses through them.
 *
 * For each pair of neighbouring stages (i, i+1), and for the first and last
 * stage when they differ (labels and the tied gradient), there is a link.
 * If both stages are on this device the link is in memory; otherwise the
 * device of the upstream stage opens one Stage/Exchange stream to the
 * device of the downstream one (mutual TLS, the peer's identity checked by
 * name): activations and masks flow down it, gradients come back on it.
 * The stream starts with a hello naming (job, epoch, from, to); the
 * downstream device routes it here (dev_net_accept) after checking that the
 * caller is the plan's device for `from`, and answers with the same hello.
 *
 * Every tensor crosses as a frame (device/wire/dev_frame.h): the job's
 * codecs, sealed with a key from both devices' X25519 keys (in the signed
 * plan) unless the job says otherwise, the epoch in header, key and nonce.
 * Frames are encoded by the thread that sends (the stage's), queued, and
 * written by the link's sender thread; received frames are queued by kind
 * and opened by the stage that takes them. A frame that fails any check is
 * refused, counted and the pipeline stops with the reason (a port call
 * fails; the runner aborts the others) — never a crash.
 *
 * A federation (replicas >= 2, docs/federation.md) is one chain per
 * replica, the stages numbered across all of them (replica r's follow
 * replica r-1's): the links above are within each replica's chain, and the
 * replica sync (dev_sync.h, dev_net_sync) adds sync links between stages of
 * different devices where one gives a tensor that the other receives for
 * its device (dev_exch_sync_flow). They are links like the others: opened
 * by the device of the lower stage, the same hello, keys and frames;
 * their frames are sync payloads (DEV_DIR_SYNC). */
#ifndef DEV_NET_H
#define DEV_NET_H

#include <stddef.h>
#include <stdint.h>

#include "dev_config.h"
#include "dev_frame.h"
#include "dev_port.h"
#include "dev_sync.h"
#include "rpc.h"
#include "sl_err.h"

typedef struct dev_net_stage {
    char device[32];     /* device id */
    char address[256];   /* where it serves Stage */
    uint8_t link_key[32]; /* its X25519 public key */
    /* a federation's: the stage's replica and units (else unread) */
    int replica, first_unit, last_unit;
} dev_net_stage;

typedef struct dev_net_cfg {
    uint64_t job;        /* the job's number: frames' job_id */
    uint32_t epoch;
    int stages;
    const dev_net_stage *stage; /* [stages] */
    const char *self_id;
    const dev_kx_keypair *self_kp;
    const char *state;   /* this device's identity files (TLS) */
    int codec_act, codec_grad; /* enum dev_codec */
    double topk;         /* codec_grad == topk: the fraction kept */
    int sealed;
    int depth;           /* the micro-batch count */
    size_t act_floats, mask_ints, label_ints, tied_floats, gather_max;
    int connect_timeout_ms; /* how long to keep trying a neighbour (0: 60 s) */
    /* a federation: replicas >= 2 (0 or 1: one chain), the model (the sync's
     * tensors) and the sync's weights and codec */
    int replicas;
    const dev_config *model;
    dev_sync_cfg sync;
} dev_net_cfg;

typedef struct dev_net dev_net;

dev_net *dev_net_open(const dev_net_cfg *c, sl_err *err);
/* The port of local stage i (owned by the net). In a federation its
 * index and stage count are those within the stage's replica. */
dev_port *dev_net_port(dev_net *n, int i);
/* A federation's replica sync of local stage i (owned by the net; NULL
 * outside a federation). Every local stage of the device calls it in each
 * round; the last to arrive sends this device's payloads to the devices
 * that receive them, takes the others' and combines every tensor of the
 * device (dev_sync_combine), so each payload crosses once per device. A
 * replica away at a round (sync.away_*: its owner is gone, the plan holds no
 * stage of it) is neither waited for nor sent to; the round averages the
 * replicas present (dev_sync_round_weights). */
dev_sync *dev_net_sync(dev_net *n, int i);
/* Starts the links this device opens (a thread each: connect with retries,
 * then send). Ports may be used before they are up: calls wait. */
int dev_net_start(dev_net *n, sl_err *err);
/* Serves a stream whose first message was the hello h (dev_exch.h): checks
 * it names a link this device serves and the caller is its other end
 * (dev_exch_hello_check), answers, then receives on this thread until the
 * link ends. Returns the stream's final status. */
struct dev_exch_hello;
int dev_net_accept(dev_net *n, const char *peer_id, const struct dev_exch_hello *h, rpc_stream *s,
                   rpc_status *st);
/* Every port call fails from now on with `why`; streams are cancelled. */
void dev_net_abort(dev_net *n, const char *why);
/* dev_net_abort naming `peer` as the cause (dev_net_lost_peer reports it
 * when it came first): a neighbour the coordinator revoked. */
void dev_net_abort_peer(dev_net *n, const char *peer, const char *why);
/* 1 if `peer` is the device at the other end of a link this device serves
 * (the only devices whose Exchange streams it takes for this net). */
int dev_net_serves_peer(dev_net *n, const char *peer);
/* The k-th (from 0) device this one has a network link with, either way:
 * 1 and its id in peer, 0 past the last. */
int dev_net_neighbour(dev_net *n, int k, char *peer, size_t cap);
/* Ends the links after the last step: sends what is queued, closes this
 * device's streams and waits (up to timeout_ms) for the others' to close;
 * past it the net is aborted, so it never waits on a neighbour for longer. */
int dev_net_close(dev_net *n, int timeout_ms, sl_err *err);
void dev_net_free(dev_net *n);
int dev_net_aborted(dev_net *n, char *why, size_t cap);
/* 1 and the peer's device id when the net stopped because its link to that
 * peer broke first (the peer may be gone, or may have stopped for a reason
 * of its own); 0 otherwise. */
int dev_net_lost_peer(dev_net *n, char *peer, size_t cap);

/* Bytes local stage i sent since the last call: to the next stage (down),
 * to the previous one (up), and between the first and the last stage when
 * they are not neighbours (side: labels, the tied gradient), before the
 * codec (raw) and as frames. */
typedef struct dev_net_bytes {
    uint64_t raw_down, wire_down, raw_up, wire_up, raw_side, wire_side;
    uint64_t raw_sync, wire_sync; /* on sync links to other replicas (a federation) */
} dev_net_bytes;
void dev_net_take_bytes(dev_net *n, int i, dev_net_bytes *b);
/* Frames refused on this device's links, per reason (DEV_FR_*). */
void dev_net_refused(dev_net *n, uint64_t out[DEV_FR_NREASONS]);
/* Tests: every frame kind (enum dev_direction) local stage i received. */
uint64_t dev_net_received(dev_net *n, int i, int kind);

#endif
