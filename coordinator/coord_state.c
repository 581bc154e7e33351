#include "coord_state.h"

#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "coord_state_internal.h"
#include "sl_file.h"
#include "sl_mem.h"

struct coord_state {
    sqlite3 *db;
    char journal[16];
};

/* Migrations run in order; index i brings the schema to version i + 1. */
static const char *const migrations[] = {
    "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);",
    /* 2: trust (issue #6): tokens are stored only as SHA-256 of the secret. */
    "CREATE TABLE tokens(hash TEXT PRIMARY KEY, site TEXT NOT NULL,"
    "  expires_at INTEGER NOT NULL, used_at INTEGER, used_by TEXT);"
    "CREATE TABLE devices(id TEXT PRIMARY KEY, site TEXT NOT NULL, name TEXT NOT NULL DEFAULT '',"
    "  enrolled_at INTEGER NOT NULL, last_heartbeat INTEGER NOT NULL DEFAULT 0,"
    "  heartbeat_seq INTEGER NOT NULL DEFAULT 0, profile BLOB, cert_pem TEXT NOT NULL);"
    "CREATE TABLE revocations(device_id TEXT PRIMARY KEY, revoked_at INTEGER NOT NULL);",
    /* 3: where each device serves Stage, from its heartbeats */
    "ALTER TABLE devices ADD COLUMN stage_address TEXT NOT NULL DEFAULT '';",
    /* 4: the lifetime of a device's certificates, set by its token (0: the
     * PKI's default) and kept across renewals */
    "ALTER TABLE tokens ADD COLUMN cert_seconds INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE devices ADD COLUMN cert_seconds INTEGER NOT NULL DEFAULT 0;",
};
#define N_MIGRATIONS (int)(sizeof migrations / sizeof migrations[0])

static int exec(coord_state *s, const char *sql, sl_err *err)
{
    char *msg = NULL;
    if (sqlite3_exec(s->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        sl_err_set(err, SL_EIO, "sqlite: %s", msg ? msg : sqlite3_errmsg(s->db));
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

static int migrate(coord_state *s, sl_err *err)
{
    int v = coord_state_schema_version(s);
    if (v > N_MIGRATIONS)
        return sl_err_set(err, SL_ESTATE,
                          "state database has schema version %d, newer than this skyloom (%d)", v,
                          N_MIGRATIONS);
    for (; v < N_MIGRATIONS; v++) {
        char pragma[64];
        snprintf(pragma, sizeof pragma, "PRAGMA user_version=%d;", v + 1);
        if (exec(s, "BEGIN IMMEDIATE;", err) || exec(s, migrations[v], err) ||
            exec(s, pragma, err) || exec(s, "COMMIT;", err)) {
            exec(s, "ROLLBACK;", NULL);
            return sl_err_wrap(err, "migrating state to version %d", v + 1);
        }
    }
    return 0;
}

coord_state *coord_state_open(const char *dir, sl_err *err)
{
    if (sl_mkdir(dir, 0700, err)) {
        sl_err_wrap(err, "coordinator state");
        return NULL;
    }
    char path[4096];
    if (snprintf(path, sizeof path, "%s/coordinator.db", dir) >= (int)sizeof path) {
        sl_err_set(err, SL_EINVAL, "state directory path too long");
        return NULL;
    }
    coord_state *s = sl_xcalloc(1, sizeof *s);
    if (sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) != SQLITE_OK) {
        sl_err_set(err, SL_EIO, "cannot open %s: %s", path, sqlite3_errmsg(s->db));
        coord_state_close(s);
        return NULL;
    }
    sqlite3_busy_timeout(s->db, 5000);
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(s->db, "PRAGMA journal_mode=WAL;", -1, &st, NULL) == SQLITE_OK) {
        if (sqlite3_step(st) == SQLITE_ROW)
            snprintf(s->journal, sizeof s->journal, "%s", (const char *)sqlite3_column_text(st, 0));
        sqlite3_finalize(st);
    }
    if (strcmp(s->journal, "wal") != 0) {
        sl_err_set(err, SL_EIO, "%s: cannot switch to WAL journal (got '%s')", path, s->journal);
        coord_state_close(s);
        return NULL;
    }
    if (exec(s, "PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;", err) || migrate(s, err)) {
        sl_err_wrap(err, "%s", path);
        coord_state_close(s);
        return NULL;
    }
    return s;
}

void coord_state_close(coord_state *s)
{
    if (!s)
        return;
    sqlite3_close(s->db);
    free(s);
}

int coord_state_schema_version(coord_state *s)
{
    sqlite3_stmt *st;
    int v = -1;
    if (sqlite3_prepare_v2(s->db, "PRAGMA user_version;", -1, &st, NULL) == SQLITE_OK) {
        if (sqlite3_step(st) == SQLITE_ROW)
            v = sqlite3_column_int(st, 0);
        sqlite3_finalize(st);
    }
    return v;
}

const char *coord_state_journal_mode(coord_state *s) { return s->journal; }

sqlite3 *coord_state_db(coord_state *s) { return s->db; }
