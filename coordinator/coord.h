/* coord.h - the coordinator: enrollment and the device registry over gRPC
 * (service skyloom.v1.Coordinator) with its state in SQLite.
 *
 * One port, mutual TLS with the client certificate optional at the TLS
 * level: Enroll is the only call served to a peer without a certificate;
 * every other call checks, in this order, that the peer presented a
 * certificate from the project CA (UNAUTHENTICATED), that its identity is a
 * device (or the admin certificate where allowed) and equals the device id
 * the request claims (PERMISSION_DENIED), that the device is not revoked
 * (UNAUTHENTICATED) and is enrolled here (PERMISSION_DENIED).
 *
 * On opening, a rotation of the coordinator's certificate that a crash
 * interrupted is finished first (cert_pair_recover). */
#ifndef COORD_H
#define COORD_H

#include <stddef.h>
#include <stdint.h>

#include "rpc.h"
#include "sl_err.h"

#define COORD_DEFAULT_MAX_MESSAGE (1u << 20)

typedef struct coord_opts {
    const char *listen;    /* "0.0.0.0:7443"; "127.0.0.1:0" picks a port */
    const char *pki;       /* the PKI directory of skyloom certs init */
    const char *state;     /* state directory (coordinator.db) */
    size_t max_message;    /* 0: COORD_DEFAULT_MAX_MESSAGE */
    unsigned heartbeat_ms; /* 0: 5000 */
    int cert_days;         /* device certificate lifetime for devices whose token named
                            * none; 0: the PKI's default (cert_pki_device_seconds) */
    int64_t shutdown_grace_ms; /* how long coord_close waits for handlers; 0: 5 s */
} coord_opts;

typedef struct coord coord;

/* Takes the PKI and state directories for this process (a second
 * coordinator on either is refused), makes them private, loads the CA,
 * opens and checks the state (coord_state_open) and imports the PKI spool.
 * Serves nothing yet. */
coord *coord_open(const coord_opts *o, sl_err *err);
/* Starts serving; returns the bound port or -1. Handlers run on worker
 * threads (rpc.h): Heartbeat has its own, so slow calls of other methods
 * never delay it. */
int coord_start(coord *c, sl_err *err);
/* Stops serving (if started) and closes everything: 0. -1 when a handler
 * is still blocked after the grace period: nothing was freed and the
 * process should exit without rpc_global_shutdown. */
int coord_close(coord *c);

/* The handlers, callable without a network (tests and fuzzers), from any
 * number of threads. They have the rpc_unary_fn signature with ud = the
 * coord. */
int coord_handle_enroll(void *c, const rpc_peer *peer, const uint8_t *req, size_t len,
                        rpc_buf *resp, rpc_status *st);
int coord_handle_heartbeat(void *c, const rpc_peer *peer, const uint8_t *req, size_t len,
                           rpc_buf *resp, rpc_status *st);
int coord_handle_list_devices(void *c, const rpc_peer *peer, const uint8_t *req, size_t len,
                              rpc_buf *resp, rpc_status *st);
/* Renew: a device's new certificate for a new key (authorized like Heartbeat,
 * so a revoked device cannot renew). */
int coord_handle_renew(void *c, const rpc_peer *peer, const uint8_t *req, size_t len,
                       rpc_buf *resp, rpc_status *st);

#endif
