/* dev_stagesvc.h - the Stage service a device serves to its pipeline
 * neighbours (skyloom.v1.Stage), over mutual TLS with its own certificate.
 *
 * Every call must come from a device certificate of the project CA (the TLS
 * handshake refuses anything else); Ping additionally checks that the
 * device id it claims is the caller's. A caller checks the server's identity
 * by naming the device it expects (server_name = its id, which every device
 * certificate carries as a DNS name), so a neighbour cannot be impersonated
 * by another enrolled device.
 *
 * Exchange streams are admitted when they arrive, before they count against
 * the server's stream limit: only from a device that `admit` accepts (the
 * running plans' neighbours of this device), at most
 * DEV_STAGE_STREAMS_PER_PEER at once from one device. So no other device,
 * however many streams it opens, takes a neighbour's place. */
#ifndef DEV_STAGESVC_H
#define DEV_STAGESVC_H

#include <stddef.h>

#include "rpc.h"
#include "sl_err.h"

/* The Exchange stream of a caller whose identity passed the checks. */
typedef int (*dev_exchange_fn)(void *ud, const char *peer_id, rpc_stream *s, rpc_status *st);
/* Whether device peer_id may hold an Exchange stream now: RPC_OK, or the
 * refusal's code with st->details. Runs on the server's accepting thread:
 * it must not block. */
typedef int (*dev_admit_fn)(void *ud, const char *peer_id, rpc_status *st);

/* Exchange streams one device may hold at once on a Stage server: its links
 * to this device in one plan (at most three) while the previous epoch's
 * are closing, and room for a retry. */
#define DEV_STAGE_STREAMS_PER_PEER 8

typedef struct dev_stagesvc_opts {
    const char *listen;      /* "0.0.0.0:7500"; port 0 picks one */
    const char *state;       /* the device's state directory (device.crt, device.key, ca.crt) */
    size_t max_message;      /* 0: 64 MiB (frames of large tensors) */
    dev_exchange_fn exchange; /* NULL: Exchange answers FAILED_PRECONDITION */
    dev_admit_fn admit;       /* NULL: every device that passes the checks above */
    void *ud;                 /* of exchange and admit */
    /* Revocations the coordinator announced (dev_agent_is_revoked with the
     * agent); NULL: none are checked. */
    int (*revoked)(void *revoked_ud, const char *id);
    void *revoked_ud;
    /* Who may Ping (dev_agent_may_ping, with revoked_ud); NULL: every
     * device that passes the checks above */
    dev_admit_fn ping;
} dev_stagesvc_opts;

typedef struct dev_stagesvc dev_stagesvc;

dev_stagesvc *dev_stagesvc_start(const dev_stagesvc_opts *o, int *port, sl_err *err);
/* 0: stopped and freed; -1: a handler is still running after the grace
 * period (rpc_server_destroy): the process should exit. */
int dev_stagesvc_stop(dev_stagesvc *s);
/* Exchange streams refused when they arrived, since the start (rpc_). */
void dev_stagesvc_counts(dev_stagesvc *s, rpc_stream_counts *c);

/* The Ping handler (an rpc_unary_fn whose ud is the dev_stagesvc_opts),
 * callable without a network (fuzzers). */
int dev_stagesvc_handle_ping(void *opts, const rpc_peer *peer, const uint8_t *req, size_t len,
                             rpc_buf *resp, rpc_status *st);

/* A channel from this device (state dir) to the neighbour expected to be
 * device `peer_id` at target. */
rpc_channel *dev_stagesvc_connect(const char *state, const char *target, const char *peer_id,
                               size_t max_message, sl_err *err);
/* Ping: sends payload, expects it back; returns the rpc code. */
int dev_stagesvc_ping(rpc_channel *ch, const char *self_id, const void *payload, size_t len,
                   int64_t timeout_ms, rpc_status *st);

#endif
