/* coord_auth.c - who may make a call after enrollment, and the database
 * connections and PKI spool it reads: every post-enrollment call checks, in
 * this order, that the peer presented a certificate from the project CA,
 * that its identity is a device (or the admin certificate where allowed)
 * and equals the device the request claims, that the device is not revoked
 * and is enrolled here. Handlers take a connection each from a small pool
 * (the database is WAL: readers do not wait for writers); the spool is
 * imported one thread at a time. */
#include <stdlib.h>
#include <string.h>

#include "coord_internal.h"
#include "sl_log.h"

/* ---- database connections ------------------------------------------------------ */

coord_state *coord_db_get(coord *c, sl_err *err)
{
    coord_state *s = NULL;
    pthread_mutex_lock(&c->mu);
    if (c->n_pool)
        s = c->pool[--c->n_pool];
    pthread_mutex_unlock(&c->mu);
    return s ? s : coord_state_attach(c->state, err);
}

void coord_db_put(coord *c, coord_state *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&c->mu);
    if (c->n_pool < COORD_POOL_MAX) {
        c->pool[c->n_pool++] = s;
        s = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    coord_state_close(s);
}

/* ---- the spool ------------------------------------------------------------------ */

typedef struct import_ctx {
    coord *c;
    coord_state *db;
} import_ctx;

static int import_one(void *ud, int kind, const char *key, const char *site, int64_t t,
                      int64_t cert_s, sl_err *err)
{
    import_ctx *x = ud;
    int rc = kind == CERT_SPOOL_TOKEN ? coord_state_add_token(x->db, key, site, t, cert_s, err)
                                      : coord_state_add_revocation(x->db, key, t, err);
    if (rc)
        return -1;
    if (kind == CERT_SPOOL_REVOKE) {
        sl_log_info("coordinator: device revoked", "device=%s", key);
        coord_jobs_revoked(x->c->jobs, key);
    }
    else
        sl_log_info("coordinator: enrollment token imported", "site=%s", site);
    return 0;
}

static void import_bad(void *ud, const char *file, const char *why)
{
    (void)ud;
    sl_log_warn("coordinator: spool entry refused, renamed to .bad", "entry=%s reason=\"%s\"", file,
                why);
}

/* Tokens and revocations written by `skyloom certs` since the last call. */
int coord_import_spool(coord *c, coord_state *db, sl_err *err)
{
    int bad = 0;
    import_ctx x = {c, db};
    pthread_mutex_lock(&c->spool_mu);
    int rc = cert_spool_drain(c->pki, import_one, import_bad, &x, &bad, err);
    pthread_mutex_unlock(&c->spool_mu);
    if (rc)
        sl_log_error("coordinator: spool import failed", "reason=\"%s\"", err ? err->msg : "");
    return rc;
}

/* ---- authorization ----------------------------------------------------------- */

/* Checks a post-enrollment call; returns RPC_OK or the refusal. */
int coord_authorize_on(coord *c, coord_state *db, const rpc_peer *peer, const char *claimed,
                       int allow, rpc_status *st)
{
    if (!peer->authenticated)
        return rpc_status_set(st, RPC_UNAUTHENTICATED,
                              "a client certificate from the project CA is required (enroll first)");
    const char *id = peer->identity;
    if (!strcmp(id, CERT_ADMIN_CN)) {
        if ((allow & COORD_ALLOW_ADMIN) && !*claimed)
            return RPC_OK;
        return rpc_status_set(st, RPC_PERMISSION_DENIED,
                              "the admin certificate may not act as device '%s'", claimed);
    }
    if (!cert_valid_device_id(id))
        return rpc_status_set(st, RPC_PERMISSION_DENIED,
                              "certificate identity '%s' is not a device", id);
    if (!(allow & COORD_ALLOW_DEVICE))
        return rpc_status_set(st, RPC_PERMISSION_DENIED, "devices may not make this call");
    if (strcmp(id, claimed) != 0)
        return rpc_status_set(st, RPC_PERMISSION_DENIED,
                              "certificate is for device %s but the request claims device '%s'",
                              id, claimed);
    sl_err err = {0};
    if (coord_import_spool(c, db, &err))
        return rpc_status_set(st, RPC_INTERNAL, "%s", err.msg);
    int r = coord_state_is_revoked(db, id, &err);
    if (r < 0)
        return rpc_status_set(st, RPC_INTERNAL, "%s", err.msg);
    if (r)
        return rpc_status_set(st, RPC_UNAUTHENTICATED, "device %s is revoked", id);
    r = coord_state_device_known(db, id, &err);
    if (r < 0)
        return rpc_status_set(st, RPC_INTERNAL, "%s", err.msg);
    if (!r)
        return rpc_status_set(st, RPC_PERMISSION_DENIED, "device %s is not enrolled here", id);
    return RPC_OK;
}

int coord_authorize(coord *c, const rpc_peer *peer, const char *claimed, int allow, rpc_status *st)
{
    sl_err err = {0};
    coord_state *db = coord_db_get(c, &err);
    int code = db ? coord_authorize_on(c, db, peer, claimed, allow, st)
                  : rpc_status_set(st, RPC_INTERNAL, "%s", err.msg);
    coord_db_put(c, db);
    return code;
}

