/* dev_stagesvc.c - the Stage service of a device and its client side. */
#include <stdlib.h>
#include <string.h>

#include "cert.h"
#include "dev_agent.h"
#include "dev_stagesvc.h"
#include "skyloom.pb-c.h"
#include "sl_mem.h"

#define STAGE_DEFAULT_MAX_MESSAGE (64u << 20)

struct dev_stagesvc {
    dev_stagesvc_opts o;
    rpc_server *srv;
};

/* The caller must be a device the coordinator has not revoked. */
static int check_peer(const dev_stagesvc_opts *o, const rpc_peer *peer, rpc_status *st)
{
    if (!cert_valid_device_id(peer->identity))
        return rpc_status_set(st, RPC_PERMISSION_DENIED,
                              "certificate identity '%s' is not a device", peer->identity);
    if (o->revoked && o->revoked(o->revoked_ud, peer->identity))
        return rpc_status_set(st, RPC_UNAUTHENTICATED, "device %s is revoked", peer->identity);
    return RPC_OK;
}

int dev_stagesvc_handle_ping(void *opts, const rpc_peer *peer, const uint8_t *req, size_t len,
                             rpc_buf *resp, rpc_status *st)
{
    Skyloom__V1__PingRequest *r = rpc_unpack(&skyloom__v1__ping_request__descriptor, req, len);
    if (!r)
        return rpc_status_set(st, RPC_INVALID_ARGUMENT, "malformed PingRequest");
    int code = check_peer(opts, peer, st);
    if (code == RPC_OK && strcmp(peer->identity, r->device_id) != 0)
        code = rpc_status_set(st, RPC_PERMISSION_DENIED,
                              "certificate is for device %s but the request claims device '%s'",
                              peer->identity, r->device_id);
    const dev_stagesvc_opts *o = opts;
    if (code == RPC_OK && o->ping)
        code = o->ping(o->revoked_ud, peer->identity, st);
    if (code == RPC_OK) {
        Skyloom__V1__PingResponse out = SKYLOOM__V1__PING_RESPONSE__INIT;
        out.payload = r->payload;
        rpc_pack(&out, resp);
    }
    rpc_unpacked_free(r);
    return code;
}

/* Who may open an Exchange stream, asked before the stream counts: a
 * device, not revoked, that the jobs admit. */
static int admit(void *ud, const rpc_peer *peer, rpc_status *st)
{
    dev_stagesvc *d = ud;
    int code = check_peer(&d->o, peer, st);
    if (code == RPC_OK && d->o.admit)
        code = d->o.admit(d->o.ud, peer->identity, st);
    return code;
}

static int exchange(void *ud, const rpc_peer *peer, rpc_stream *s, rpc_status *st)
{
    dev_stagesvc *d = ud;
    int code = check_peer(&d->o, peer, st);
    if (code != RPC_OK)
        return code;
    if (!d->o.exchange)
        return rpc_status_set(st, RPC_FAILED_PRECONDITION, "this device has no stage assigned");
    return d->o.exchange(d->o.ud, peer->identity, s, st);
}

dev_stagesvc *dev_stagesvc_start(const dev_stagesvc_opts *o, int *port, sl_err *err)
{
    dev_identity_files f;
    if (dev_identity_files_init(&f, o->state, err))
        return NULL;
    dev_stagesvc *d = sl_xcalloc(1, sizeof *d);
    d->o = *o;
    rpc_stream_opts xo = {.admit = admit, .admit_ud = d, .max_per_peer = DEV_STAGE_STREAMS_PER_PEER};
    rpc_server_opts so = {.listen = o->listen,
                          .tls = {f.ca, f.crt, f.key},
                          .client_auth = RPC_CLIENT_CERT_REQUIRED,
                          .max_message = o->max_message ? o->max_message : STAGE_DEFAULT_MAX_MESSAGE,
                          .reload_tls = 1}; /* a renewed certificate serves new neighbours */
    if (!(d->srv = rpc_server_create(&so, err)) ||
        rpc_server_add_unary(d->srv, RPC_M_STAGE_PING, dev_stagesvc_handle_ping, &d->o, err) ||
        rpc_server_add_stream_opts(d->srv, RPC_M_STAGE_EXCHANGE, &xo, exchange, d, err) ||
        (*port = rpc_server_start(d->srv, err)) < 0) {
        dev_stagesvc_stop(d);
        return NULL;
    }
    return d;
}

void dev_stagesvc_counts(dev_stagesvc *d, rpc_stream_counts *c)
{
    rpc_server_stream_counts(d->srv, c);
}

int dev_stagesvc_stop(dev_stagesvc *d)
{
    if (!d)
        return 0;
    if (rpc_server_destroy(d->srv) != 0)
        return -1;
    free(d);
    return 0;
}

rpc_channel *dev_stagesvc_connect(const char *state, const char *target, const char *peer_id,
                               size_t max_message, sl_err *err)
{
    dev_identity_files f;
    if (dev_identity_files_init(&f, state, err))
        return NULL;
    if (!cert_valid_device_id(peer_id)) {
        sl_err_set(err, SL_EINVAL, "'%s' is not a device id", peer_id);
        return NULL;
    }
    rpc_channel_opts co = {.target = target,
                           .tls = {f.ca, f.crt, f.key},
                           .server_name = peer_id,
                           .max_message = max_message ? max_message : STAGE_DEFAULT_MAX_MESSAGE};
    return rpc_channel_create(&co, err);
}

int dev_stagesvc_ping(rpc_channel *ch, const char *self_id, const void *payload, size_t len,
                   int64_t timeout_ms, rpc_status *st)
{
    Skyloom__V1__PingRequest req = SKYLOOM__V1__PING_REQUEST__INIT;
    req.device_id = (char *)self_id;
    req.payload.data = (uint8_t *)payload;
    req.payload.len = len;
    Skyloom__V1__PingResponse *r = NULL;
    int code = rpc_call_pb(ch, RPC_M_STAGE_PING, &req, &skyloom__v1__ping_response__descriptor,
                           (void **)&r, timeout_ms, st);
    if (code == RPC_OK && (r->payload.len != len || (len && memcmp(r->payload.data, payload, len))))
        code = rpc_status_set(st, RPC_DATA_LOSS, "ping payload came back changed");
    rpc_unpacked_free(r);
    return code;
}
