/* coord_registry.c - the trust tables of the coordinator state: one-time
 * token hashes, enrolled devices and revocations. */
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

#include "coord_state.h"
#include "coord_state_internal.h"
#include "sl_mem.h"

static int db_err(coord_state *s, sl_err *err, const char *what)
{
    return sl_err_set(err, SL_EIO, "sqlite %s: %s", what, sqlite3_errmsg(coord_state_db(s)));
}

static sqlite3_stmt *prep(coord_state *s, const char *sql, sl_err *err)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(coord_state_db(s), sql, -1, &st, NULL) != SQLITE_OK) {
        db_err(s, err, "prepare");
        return NULL;
    }
    return st;
}

/* Runs a statement that returns no rows; finalizes it. */
static int run(coord_state *s, sqlite3_stmt *st, sl_err *err)
{
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : db_err(s, err, "step");
}

int coord_state_add_token(coord_state *s, const char *hash, const char *site, int64_t expires_at,
                          int64_t cert_seconds, sl_err *err)
{
    sqlite3_stmt *st = prep(s,
                            "INSERT OR IGNORE INTO tokens(hash, site, expires_at, cert_seconds)"
                            " VALUES(?,?,?,?)",
                            err);
    if (!st)
        return -1;
    sqlite3_bind_text(st, 1, hash, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, site, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, expires_at);
    sqlite3_bind_int64(st, 4, cert_seconds);
    return run(s, st, err);
}

int coord_state_add_revocation(coord_state *s, const char *id, int64_t at, sl_err *err)
{
    sqlite3_stmt *st =
        prep(s, "INSERT OR IGNORE INTO revocations(device_id, revoked_at) VALUES(?,?)", err);
    if (!st)
        return -1;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, at);
    return run(s, st, err);
}

static int exists(coord_state *s, const char *sql, const char *key, sl_err *err)
{
    sqlite3_stmt *st = prep(s, sql, err);
    if (!st)
        return -1;
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc == SQLITE_ROW)
        return 1;
    return rc == SQLITE_DONE ? 0 : db_err(s, err, "step");
}

int coord_state_is_revoked(coord_state *s, const char *id, sl_err *err)
{
    return exists(s, "SELECT 1 FROM revocations WHERE device_id=?", id, err);
}

int coord_state_device_known(coord_state *s, const char *id, sl_err *err)
{
    return exists(s, "SELECT 1 FROM devices WHERE id=?", id, err);
}

int coord_state_device_cert(coord_state *s, const char *id, char *site, char **cert_pem,
                            int64_t *cert_seconds, sl_err *err)
{
    *cert_pem = NULL;
    sqlite3_stmt *st = prep(s, "SELECT site, cert_pem, cert_seconds FROM devices WHERE id=?", err);
    if (!st)
        return -1;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st), res = 0;
    if (rc == SQLITE_DONE) {
        res = 1;
    } else if (rc != SQLITE_ROW) {
        res = db_err(s, err, "step");
    } else {
        const char *ds = (const char *)sqlite3_column_text(st, 0);
        const char *pem = (const char *)sqlite3_column_text(st, 1);
        snprintf(site, 65, "%s", ds ? ds : "");
        *cert_pem = sl_xstrdup(pem ? pem : "");
        *cert_seconds = sqlite3_column_int64(st, 2);
    }
    sqlite3_finalize(st);
    return res;
}

int coord_state_set_cert(coord_state *s, const char *id, const char *cert_pem, sl_err *err)
{
    sqlite3_stmt *st = prep(s, "UPDATE devices SET cert_pem=? WHERE id=?", err);
    if (!st)
        return -1;
    sqlite3_bind_text(st, 1, cert_pem, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC);
    if (run(s, st, err))
        return -1;
    return sqlite3_changes(coord_state_db(s)) == 1 ? 0 : 1;
}

int coord_state_check_token(coord_state *s, const char *hash, const char *site, int64_t now,
                            char *site_out, int64_t *cert_seconds, sl_err *err)
{
    sqlite3_stmt *st =
        prep(s, "SELECT site, expires_at, used_at, cert_seconds FROM tokens WHERE hash=?", err);
    if (!st)
        return -1;
    sqlite3_bind_text(st, 1, hash, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st), res;
    if (rc == SQLITE_DONE) {
        res = COORD_TOKEN_UNKNOWN;
    } else if (rc != SQLITE_ROW) {
        res = db_err(s, err, "step");
    } else {
        const char *tsite = (const char *)sqlite3_column_text(st, 0);
        snprintf(site_out, 65, "%s", tsite ? tsite : "");
        *cert_seconds = sqlite3_column_int64(st, 3);
        if (sqlite3_column_type(st, 2) != SQLITE_NULL)
            res = COORD_TOKEN_USED;
        else if (sqlite3_column_int64(st, 1) <= now)
            res = COORD_TOKEN_EXPIRED;
        else if (!tsite || strcmp(tsite, site) != 0)
            res = COORD_TOKEN_WRONG_SITE;
        else
            res = COORD_TOKEN_OK;
    }
    sqlite3_finalize(st);
    return res;
}

int coord_state_enroll(coord_state *s, const char *hash, const coord_device *d, int64_t now,
                       sl_err *err)
{
    sqlite3 *db = coord_state_db(s);
    if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
        return db_err(s, err, "begin");
    sqlite3_stmt *st =
        prep(s, "UPDATE tokens SET used_at=?, used_by=? WHERE hash=? AND used_at IS NULL", err);
    if (!st)
        goto fail;
    sqlite3_bind_int64(st, 1, now);
    sqlite3_bind_text(st, 2, d->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, hash, -1, SQLITE_STATIC);
    if (run(s, st, err))
        goto fail;
    if (sqlite3_changes(db) != 1) {
        sl_err_set(err, SL_EAUTH, "token already used");
        goto fail;
    }
    st = prep(s,
              "INSERT OR REPLACE INTO devices(id, site, name, enrolled_at, last_heartbeat,"
              " heartbeat_seq, profile, cert_pem, cert_seconds) VALUES(?,?,?,?,0,0,?,?,?)",
              err);
    if (!st)
        goto fail;
    sqlite3_bind_text(st, 1, d->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, d->site, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, d->name ? d->name : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, now);
    if (d->profile_len)
        sqlite3_bind_blob(st, 5, d->profile, (int)d->profile_len, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 5);
    sqlite3_bind_text(st, 6, d->cert_pem, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 7, d->cert_seconds);
    if (run(s, st, err))
        goto fail;
    if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
        db_err(s, err, "commit");
        goto fail;
    }
    return 0;
fail:
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    return -1;
}

int coord_state_heartbeat(coord_state *s, const char *id, uint64_t seq, const uint8_t *profile,
                          size_t profile_len, const char *stage_address, int64_t now, sl_err *err)
{
    sqlite3_stmt *st = prep(s,
                            "UPDATE devices SET last_heartbeat=?, heartbeat_seq=?,"
                            " profile=COALESCE(?, profile), stage_address=? WHERE id=?",
                            err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, now);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)seq);
    if (profile)
        sqlite3_bind_blob(st, 3, profile, (int)profile_len, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 3);
    sqlite3_bind_text(st, 4, stage_address ? stage_address : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, id, -1, SQLITE_STATIC);
    if (run(s, st, err))
        return -1;
    return sqlite3_changes(coord_state_db(s)) == 1 ? 0 : 1;
}

int coord_state_list_revoked(coord_state *s, int (*fn)(void *ud, const char *id), void *ud,
                             sl_err *err)
{
    sqlite3_stmt *st = prep(s, "SELECT device_id FROM revocations ORDER BY device_id", err);
    if (!st)
        return -1;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        if (fn(ud, (const char *)sqlite3_column_text(st, 0)))
            break;
    sqlite3_finalize(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : db_err(s, err, "step");
}

int coord_state_list_devices(coord_state *s, int (*fn)(void *ud, const coord_device *d), void *ud,
                             sl_err *err)
{
    sqlite3_stmt *st = prep(s,
                            "SELECT d.id, d.site, d.name, d.cert_pem, d.enrolled_at,"
                            " d.last_heartbeat, d.heartbeat_seq, d.profile,"
                            " r.device_id IS NOT NULL, d.stage_address FROM devices d"
                            " LEFT JOIN revocations r ON r.device_id = d.id ORDER BY d.id",
                            err);
    if (!st)
        return -1;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        coord_device d = {0};
        d.id = (const char *)sqlite3_column_text(st, 0);
        d.site = (const char *)sqlite3_column_text(st, 1);
        d.name = (const char *)sqlite3_column_text(st, 2);
        d.cert_pem = (const char *)sqlite3_column_text(st, 3);
        d.enrolled_at = sqlite3_column_int64(st, 4);
        d.last_heartbeat = sqlite3_column_int64(st, 5);
        d.heartbeat_seq = (uint64_t)sqlite3_column_int64(st, 6);
        d.profile = sqlite3_column_blob(st, 7);
        d.profile_len = (size_t)sqlite3_column_bytes(st, 7);
        d.revoked = sqlite3_column_int(st, 8);
        d.stage_address = (const char *)sqlite3_column_text(st, 9);
        if (fn(ud, &d))
            break;
    }
    sqlite3_finalize(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : db_err(s, err, "step");
}
