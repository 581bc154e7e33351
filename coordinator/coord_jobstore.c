/* coord_jobstore.c - jobs, profiles and events in SQLite (coord_jobstore.h).
 * Every call takes the store's mutex: the connection is opened without
 * SQLite's own (NOMUTEX), and calls come from the handlers, the effects and
 * the engine. */
#include "coord_jobstore.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cert.h"
#include "coord_state_internal.h"
#include "sl_mem.h"

struct coord_jobstore {
    coord_state *db;
    pthread_mutex_t mu;
};

static const char *const schema =
    "CREATE TABLE IF NOT EXISTS jobs(id TEXT PRIMARY KEY, num INTEGER NOT NULL,"
    "  state TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', config TEXT NOT NULL,"
    "  options TEXT NOT NULL, owner TEXT NOT NULL, dataset TEXT NOT NULL,"
    "  data_info TEXT NOT NULL DEFAULT '', epoch INTEGER NOT NULL DEFAULT 0,"
    "  plan TEXT NOT NULL DEFAULT '', plan_sig BLOB, step INTEGER NOT NULL DEFAULT 0,"
    "  committed_step INTEGER NOT NULL DEFAULT 0, loss REAL NOT NULL DEFAULT 0,"
    "  created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,"
    "  meta TEXT NOT NULL DEFAULT '');"
    "CREATE TABLE IF NOT EXISTS job_profiles(job TEXT NOT NULL, device TEXT NOT NULL,"
    "  result TEXT NOT NULL, at INTEGER NOT NULL, PRIMARY KEY(job, device));"
    "CREATE TABLE IF NOT EXISTS job_events(job TEXT NOT NULL, at_ms INTEGER NOT NULL,"
    "  epoch INTEGER NOT NULL, step INTEGER NOT NULL, committed_step INTEGER NOT NULL,"
    "  kind TEXT NOT NULL, device TEXT NOT NULL DEFAULT '', detail TEXT NOT NULL DEFAULT '');"
    "CREATE INDEX IF NOT EXISTS job_events_job ON job_events(job, at_ms);";

static sqlite3 *conn(coord_jobstore *s) { return coord_state_db(s->db); }

static int failed(coord_jobstore *s, sl_err *err)
{
    return sl_err_set(err, SL_EIO, "sqlite: %s", sqlite3_errmsg(conn(s)));
}

coord_jobstore *coord_jobstore_open(coord_state *first, sl_err *err)
{
    coord_jobstore *s = sl_xcalloc(1, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    if (!(s->db = coord_state_attach(first, err))) {
        coord_jobstore_close(s);
        return NULL;
    }
    char *msg = NULL;
    if (sqlite3_exec(conn(s), schema, NULL, NULL, &msg) != SQLITE_OK) {
        sl_err_set(err, SL_EIO, "sqlite: %s", msg ? msg : "?");
        sqlite3_free(msg);
        coord_jobstore_close(s);
        return NULL;
    }
    /* a state written before jobs had a meta column (name, tags) */
    sqlite3_stmt *probe = NULL;
    int has_meta = sqlite3_prepare_v2(conn(s), "SELECT meta FROM jobs LIMIT 0", -1, &probe, NULL) ==
                   SQLITE_OK;
    sqlite3_finalize(probe);
    if (!has_meta && sqlite3_exec(conn(s), "ALTER TABLE jobs ADD COLUMN meta TEXT NOT NULL DEFAULT ''",
                                  NULL, NULL, &msg) != SQLITE_OK) {
        sl_err_set(err, SL_EIO, "sqlite: adding jobs.meta: %s", msg ? msg : "?");
        sqlite3_free(msg);
        coord_jobstore_close(s);
        return NULL;
    }
    return s;
}

void coord_jobstore_close(coord_jobstore *s)
{
    if (!s)
        return;
    coord_state_close(s->db);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

void coord_jobrow_free(coord_jobrow *r)
{
    free(r->id);
    free(r->state);
    free(r->reason);
    free(r->config);
    free(r->options);
    free(r->owner);
    free(r->dataset);
    free(r->data_info);
    free(r->plan);
    free(r->sig);
    free(r->meta);
    memset(r, 0, sizeof *r);
}

static const char *or_empty(const char *s) { return s ? s : ""; }

int coord_jobstore_save(coord_jobstore *s, const coord_jobrow *r, int64_t now, sl_err *err)
{
    static const char *const sql =
        "INSERT OR REPLACE INTO jobs(id, num, state, reason, config, options, owner, dataset,"
        " data_info, epoch, plan, plan_sig, step, committed_step, loss, created_at, updated_at,"
        " meta) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)";
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *st = NULL;
    int rc = -1;
    if (sqlite3_prepare_v2(conn(s), sql, -1, &st, NULL) != SQLITE_OK) {
        failed(s, err);
        goto out;
    }
    sqlite3_bind_text(st, 1, r->id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)r->num);
    sqlite3_bind_text(st, 3, r->state, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, or_empty(r->reason), -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, r->config, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 6, r->options ? r->options : "{}", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 7, r->owner, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 8, r->dataset, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 9, or_empty(r->data_info), -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 10, r->epoch);
    sqlite3_bind_text(st, 11, or_empty(r->plan), -1, SQLITE_STATIC);
    if (r->sig)
        sqlite3_bind_blob(st, 12, r->sig, (int)r->sig_len, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 12);
    sqlite3_bind_int(st, 13, r->step);
    sqlite3_bind_int(st, 14, r->committed);
    sqlite3_bind_double(st, 15, r->loss);
    sqlite3_bind_int64(st, 16, r->created);
    sqlite3_bind_int64(st, 17, now);
    sqlite3_bind_text(st, 18, or_empty(r->meta), -1, SQLITE_STATIC);
    rc = sqlite3_step(st) == SQLITE_DONE ? 0 : failed(s, err);
out:
    sqlite3_finalize(st);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int coord_jobstore_set_committed(coord_jobstore *s, const char *id, int committed, int64_t now,
                                 sl_err *err)
{
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *st = NULL;
    int rc = -1;
    if (sqlite3_prepare_v2(conn(s), "UPDATE jobs SET committed_step = ?, updated_at = ? WHERE id = ?",
                           -1, &st, NULL) != SQLITE_OK) {
        failed(s, err);
    } else {
        sqlite3_bind_int(st, 1, committed);
        sqlite3_bind_int64(st, 2, now);
        sqlite3_bind_text(st, 3, id, -1, SQLITE_STATIC);
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : failed(s, err);
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int coord_jobstore_event(coord_jobstore *s, const char *job, int64_t at_ms, int epoch, int step,
                         int committed, const char *kind, const char *device, const char *detail,
                         sl_err *err)
{
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *st = NULL;
    int rc = -1;
    if (sqlite3_prepare_v2(conn(s), "INSERT INTO job_events(job, at_ms, epoch, step, committed_step,"
                           " kind, device, detail) VALUES(?,?,?,?,?,?,?,?)", -1, &st, NULL) != SQLITE_OK) {
        failed(s, err);
    } else {
        sqlite3_bind_text(st, 1, job, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, at_ms);
        sqlite3_bind_int(st, 3, epoch);
        sqlite3_bind_int(st, 4, step);
        sqlite3_bind_int(st, 5, committed);
        sqlite3_bind_text(st, 6, kind, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 7, or_empty(device), -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 8, or_empty(detail), -1, SQLITE_STATIC);
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : failed(s, err);
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

char *coord_jobstore_events(coord_jobstore *s, const char *job)
{
    json_t *a = json_array();
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(conn(s), "SELECT at_ms, epoch, step, committed_step, kind, device, detail"
                           " FROM job_events WHERE job = ? ORDER BY at_ms, rowid", -1, &st,
                           NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, job, -1, SQLITE_STATIC);
        while (sqlite3_step(st) == SQLITE_ROW)
            json_array_append_new(
                a, json_pack("{s:I, s:i, s:i, s:i, s:s, s:s, s:s}", "at_ms",
                             (json_int_t)sqlite3_column_int64(st, 0), "epoch",
                             sqlite3_column_int(st, 1), "step", sqlite3_column_int(st, 2),
                             "committed_step", sqlite3_column_int(st, 3), "kind",
                             or_empty((const char *)sqlite3_column_text(st, 4)), "device",
                             or_empty((const char *)sqlite3_column_text(st, 5)), "detail",
                             or_empty((const char *)sqlite3_column_text(st, 6))));
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&s->mu);
    char *t = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    return t ? t : sl_xstrdup("[]");
}

int coord_jobstore_profile(coord_jobstore *s, const char *job, const char *device,
                           const char *result, int64_t at, sl_err *err)
{
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *st = NULL;
    int rc = -1;
    if (sqlite3_prepare_v2(conn(s), "INSERT OR REPLACE INTO job_profiles(job, device, result, at) "
                           "VALUES(?,?,?,?)", -1, &st, NULL) != SQLITE_OK) {
        failed(s, err);
    } else {
        sqlite3_bind_text(st, 1, job, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, device, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, result, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 4, at);
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : failed(s, err);
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static char *col(sqlite3_stmt *st, int k)
{
    const char *t = (const char *)sqlite3_column_text(st, k);
    return sl_xstrdup(t ? t : "");
}

int coord_jobstore_load(coord_jobstore *s, int (*fn)(void *ud, coord_jobrow *r), void *ud,
                        sl_err *err)
{
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *st = NULL;
    int rc = 0;
    if (sqlite3_prepare_v2(conn(s), "SELECT id, num, state, reason, config, options, owner, dataset,"
                           " data_info, epoch, plan, plan_sig, step, committed_step, loss, created_at,"
                           " updated_at, meta FROM jobs ORDER BY created_at", -1, &st, NULL) != SQLITE_OK) {
        rc = failed(s, err);
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    while (!rc && sqlite3_step(st) == SQLITE_ROW) {
        coord_jobrow r = {0};
        r.id = col(st, 0);
        r.num = (uint64_t)sqlite3_column_int64(st, 1);
        r.state = col(st, 2);
        r.reason = col(st, 3);
        r.config = col(st, 4);
        r.options = col(st, 5);
        r.owner = col(st, 6);
        r.dataset = col(st, 7);
        r.data_info = col(st, 8);
        r.epoch = sqlite3_column_int(st, 9);
        r.plan = col(st, 10);
        int n = sqlite3_column_bytes(st, 11);
        r.sig = sl_xmalloc((size_t)n + 1);
        if (n)
            memcpy(r.sig, sqlite3_column_blob(st, 11), (size_t)n);
        r.sig_len = (size_t)n;
        r.step = sqlite3_column_int(st, 12);
        r.committed = sqlite3_column_int(st, 13);
        r.loss = sqlite3_column_double(st, 14);
        r.created = sqlite3_column_int64(st, 15);
        r.updated = sqlite3_column_int64(st, 16);
        r.meta = col(st, 17);
        rc = fn(ud, &r);
        coord_jobrow_free(&r);
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int coord_jobstore_load_profiles(coord_jobstore *s, const char *job, const char *owner,
                                 int (*fn)(void *ud, const char *device, const char *result),
                                 void *ud, sl_err *err)
{
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *st = NULL;
    int rc = 0;
    if (sqlite3_prepare_v2(conn(s), "SELECT device, result FROM job_profiles WHERE job = ?"
                           " ORDER BY device != ?, at, device", -1, &st, NULL) != SQLITE_OK) {
        rc = failed(s, err);
    } else {
        sqlite3_bind_text(st, 1, job, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
        while (!rc && sqlite3_step(st) == SQLITE_ROW) {
            const char *dev = (const char *)sqlite3_column_text(st, 0),
                       *res = (const char *)sqlite3_column_text(st, 1);
            if (dev && res && cert_valid_device_id(dev))
                rc = fn(ud, dev, res);
        }
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

typedef struct sites_ctx {
    char (*ids)[CERT_ID_LEN];
    char (*sites)[CERT_SITE_MAX + 1];
    int n;
} sites_ctx;

static int take_site(void *ud, const coord_device *d)
{
    sites_ctx *x = ud;
    for (int i = 0; i < x->n; i++)
        if (!strcmp(x->ids[i], d->id))
            snprintf(x->sites[i], CERT_SITE_MAX + 1, "%s", d->site);
    return 0;
}

int coord_jobstore_sites(coord_jobstore *s, char (*ids)[CERT_ID_LEN], char (*sites)[CERT_SITE_MAX + 1],
                        int n, sl_err *err)
{
    sites_ctx x = {ids, sites, n};
    for (int i = 0; i < n; i++)
        sites[i][0] = 0;
    pthread_mutex_lock(&s->mu);
    int rc = coord_state_list_devices(s->db, take_site, &x, err);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int coord_jobstore_devices_seen(coord_jobstore *s)
{
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *st = NULL;
    int seen = sqlite3_prepare_v2(conn(s), "SELECT 1 FROM devices WHERE last_heartbeat > 0 LIMIT 1",
                                  -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW;
    sqlite3_finalize(st);
    pthread_mutex_unlock(&s->mu);
    return seen;
}

int coord_jobstore_latest_profile(coord_state *db, const char *device, char **job, char **result,
                                  int64_t *at, char **options, char **data_info, sl_err *err)
{
    sqlite3 *s = coord_state_db(db);
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s, "SELECT p.job, p.result, p.at, j.options, j.data_info"
                           " FROM job_profiles p LEFT JOIN jobs j ON j.id = p.job"
                           " WHERE p.device = ? ORDER BY p.at DESC, p.rowid DESC LIMIT 1",
                           -1, &st, NULL) != SQLITE_OK)
        return sl_err_set(err, SL_EIO, "sqlite: %s", sqlite3_errmsg(s));
    sqlite3_bind_text(st, 1, device, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        sqlite3_finalize(st);
        return rc == SQLITE_DONE ? 0 : sl_err_set(err, SL_EIO, "sqlite: %s", sqlite3_errmsg(s));
    }
    *job = col(st, 0);
    *result = col(st, 1);
    *at = sqlite3_column_int64(st, 2);
    *options = col(st, 3);
    *data_info = col(st, 4);
    sqlite3_finalize(st);
    return 1;
}
