#include "coord_state.h"

#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coord_state_internal.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_mem.h"

struct coord_state {
    sqlite3 *db;
    char journal[16];
    char path[4096];
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
    ("ALTER TABLE tokens ADD COLUMN cert_seconds INTEGER NOT NULL DEFAULT 0;"
     "ALTER TABLE devices ADD COLUMN cert_seconds INTEGER NOT NULL DEFAULT 0;"),
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

#define DB_FILE "coordinator.db"
#define ID_FILE "coordinator.id"
#define ID_HEX 32

static int path_in(char *out, size_t cap, const char *dir, const char *file, sl_err *err)
{
    if (snprintf(out, cap, "%s/%s", dir, file) >= (int)cap)
        return sl_err_set(err, SL_EINVAL, "state directory path too long");
    return 0;
}

/* -1 missing, else the size of a regular file; -2 something else is there. */
static int64_t file_size(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return -1;
    return S_ISREG(st.st_mode) ? (int64_t)st.st_size : -2;
}

/* The state id in DIR/coordinator.id: 1 read, 0 absent, -1 unreadable. */
static int read_marker(const char *path, char id[ID_HEX + 1], sl_err *err)
{
    if (file_size(path) == -1)
        return 0;
    char *buf;
    size_t n;
    if (sl_read_file(path, 256, &buf, &n, err))
        return -1;
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        n--;
    int ok = n == ID_HEX;
    for (size_t i = 0; ok && i < n; i++)
        ok = (buf[i] >= '0' && buf[i] <= '9') || (buf[i] >= 'a' && buf[i] <= 'f');
    if (ok) {
        memcpy(id, buf, ID_HEX);
        id[ID_HEX] = 0;
    }
    free(buf);
    if (!ok)
        return sl_err_set(err, SL_ECORRUPT, "%s is damaged (32 hex digits expected)", path);
    return 1;
}

static int new_id(char id[ID_HEX + 1], sl_err *err)
{
    uint8_t b[ID_HEX / 2];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b)
        return sl_err_set(err, SL_EIO, "getrandom: %s", strerror(errno));
    for (size_t i = 0; i < sizeof b; i++)
        snprintf(id + 2 * i, 3, "%02x", b[i]);
    return 0;
}

/* A single-value query; the first column of the first row into out. */
static int query_text(coord_state *s, const char *sql, char *out, size_t cap, sl_err *err)
{
    sqlite3_stmt *st;
    out[0] = 0;
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK)
        return sl_err_set(err, SL_ECORRUPT, "%s", sqlite3_errmsg(s->db));
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW && sqlite3_column_text(st, 0))
        snprintf(out, cap, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return sl_err_set(err, SL_ECORRUPT, "%s", sqlite3_errmsg(s->db));
    return rc == SQLITE_ROW;
}

/* The database file as SQLite expects it, before SQLite touches it. */
static int check_header(const char *path, sl_err *err)
{
    char head[16];
    FILE *f = fopen(path, "rb");
    if (!f)
        return sl_err_set(err, SL_EIO, "%s: %s", path, strerror(errno));
    size_t n = fread(head, 1, sizeof head, f);
    fclose(f);
    if (n != sizeof head || memcmp(head, "SQLite format 3", 16) != 0)
        return sl_err_set(err, SL_ECORRUPT,
                          "%s is not an SQLite database (its first page is damaged or it is "
                          "another file): restore it from a backup (skyloom coordinator backup)",
                          path);
    return 0;
}

static coord_state *open_db(const char *path, int create, sl_err *err)
{
    coord_state *s = sl_xcalloc(1, sizeof *s);
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | (create ? SQLITE_OPEN_CREATE : 0);
    if (sqlite3_open_v2(path, &s->db, flags, NULL) != SQLITE_OK) {
        sl_err_set(err, SL_EIO, "cannot open %s: %s", path, sqlite3_errmsg(s->db));
        coord_state_close(s);
        return NULL;
    }
    sqlite3_busy_timeout(s->db, 5000);
    char mode[16];
    int q = query_text(s, "PRAGMA journal_mode=WAL;", mode, sizeof mode, err);
    snprintf(s->journal, sizeof s->journal, "%s", mode);
    if (q < 0 || strcmp(mode, "wal") != 0) {
        if (q >= 0)
            sl_err_set(err, SL_EIO, "cannot switch to the WAL journal (got '%s')", mode);
        sl_err_wrap(err, "%s", path);
        coord_state_close(s);
        return NULL;
    }
    if (exec(s, "PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;", err)) {
        sl_err_wrap(err, "%s", path);
        coord_state_close(s);
        return NULL;
    }
    return s;
}

/* Ties the database to the directory's marker (and writes a missing one). */
static int check_id(coord_state *s, const char *idpath, const char *marker, sl_err *err)
{
    char id[64];
    int have = query_text(s, "SELECT value FROM meta WHERE key='state_id'", id, sizeof id, err);
    if (have < 0)
        return -1;
    if (have && strlen(id) != ID_HEX)
        return sl_err_set(err, SL_ECORRUPT, "the state id in the database is damaged");
    if (have && marker && strcmp(id, marker) != 0)
        return sl_err_set(err, SL_ECORRUPT,
                          "coordinator.db belongs to state %s but %s says %s: this database "
                          "comes from another state directory",
                          id, idpath, marker);
    if (!have) {
        if (marker)
            snprintf(id, sizeof id, "%s", marker);
        else if (new_id(id, err))
            return -1;
        char sql[128];
        snprintf(sql, sizeof sql, "INSERT INTO meta(key, value) VALUES('state_id', '%s');", id);
        if (exec(s, sql, err))
            return -1;
    }
    if (marker)
        return 0;
    char line[80];
    snprintf(line, sizeof line, "%s\n", id);
    return sl_write_file_atomic(idpath, line, strlen(line), err);
}

coord_state *coord_state_open(const char *dir, sl_err *err)
{
    mode_t old;
    int r = sl_private_dir(dir, &old, err);
    if (r < 0) {
        sl_err_wrap(err, "coordinator state");
        return NULL;
    }
    if (r > 0)
        sl_log_warn("coordinator: the state directory was open to group or others; made it "
                    "private", "dir=%s old_mode=%04o mode=0700", dir, (unsigned)old);
    char path[4096], wal[4200], idpath[4200], marker[ID_HEX + 1];
    if (path_in(path, sizeof path, dir, DB_FILE, err) ||
        path_in(wal, sizeof wal, dir, DB_FILE "-wal", err) ||
        path_in(idpath, sizeof idpath, dir, ID_FILE, err))
        return NULL;
    int had = read_marker(idpath, marker, err);
    if (had < 0)
        return NULL;
    int64_t size = file_size(path);
    if (size == -2) {
        sl_err_set(err, SL_EIO, "%s is not a regular file", path);
        return NULL;
    }
    if (size <= 0 && had) {
        sl_err_set(err, SL_ECORRUPT,
                   "%s is %s, but %s shows this directory held a coordinator's state: restore "
                   "the database from a backup (skyloom coordinator backup), or start with a "
                   "new --state directory",
                   path, size < 0 ? "missing" : "empty (0 bytes)", idpath);
        return NULL;
    }
    if (size == 0) {
        sl_err_set(err, SL_ECORRUPT,
                   "%s is empty (0 bytes): a damaged state; restore it from a backup, or "
                   "remove it to start an empty registry",
                   path);
        return NULL;
    }
    if (size < 0 && file_size(wal) >= 0) {
        sl_err_set(err, SL_ECORRUPT,
                   "%s is missing but its write-ahead log %s is there: the state is incomplete",
                   path, wal);
        return NULL;
    }
    if (size > 0 && check_header(path, err))
        return NULL;
    coord_state *s = open_db(path, size < 0, err);
    if (!s) {
        if (size > 0 && err) {
            char m[sizeof err->msg];
            snprintf(m, sizeof m, "%s", err->msg);
            sl_err_set(err, err->code, "%.400s (a damaged or truncated state: restore it from a "
                       "backup)", m);
        }
        return NULL;
    }
    char verdict[256];
    if (size > 0) {
        int q = query_text(s, "PRAGMA quick_check;", verdict, sizeof verdict, err);
        if (q < 0 || strcmp(verdict, "ok") != 0) {
            if (q >= 0)
                sl_err_set(err, SL_ECORRUPT, "%s", verdict);
            sl_err_wrap(err, "%s failed its integrity check; restore it from a backup", path);
            coord_state_close(s);
            return NULL;
        }
    }
    if (migrate(s, err) || check_id(s, idpath, had ? marker : NULL, err)) {
        sl_err_wrap(err, "%s", path);
        coord_state_close(s);
        return NULL;
    }
    snprintf(s->path, sizeof s->path, "%s", path);
    return s;
}

coord_state *coord_state_attach(const coord_state *first, sl_err *err)
{
    coord_state *s = open_db(first->path, 0, err);
    if (s)
        snprintf(s->path, sizeof s->path, "%s", first->path);
    return s;
}

int coord_state_backup(const char *dir, const char *out, int64_t *devices, sl_err *err)
{
    char path[4096], tmp[4200];
    if (path_in(path, sizeof path, dir, DB_FILE, err))
        return -1;
    if (file_size(path) <= 0)
        return sl_err_set(err, SL_EIO, "%s: no coordinator state there", path);
    if (file_size(out) != -1)
        return sl_err_set(err, SL_EIO, "%s exists already: refusing to overwrite it", out);
    if (check_header(path, err))
        return -1;
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", out, (long)getpid());
    sqlite3 *src = NULL, *dst = NULL;
    int rc = -1;
    if (sqlite3_open_v2(path, &src, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        sl_err_set(err, SL_EIO, "cannot open %s: %s", path, sqlite3_errmsg(src));
        goto out;
    }
    sqlite3_busy_timeout(src, 5000);
    unlink(tmp);
    if (sqlite3_open_v2(tmp, &dst, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) != SQLITE_OK) {
        sl_err_set(err, SL_EIO, "cannot create %s: %s", tmp, sqlite3_errmsg(dst));
        goto out;
    }
    /* One step copies everything under one read transaction: a consistent
     * snapshot that includes what is still only in the -wal file. */
    sqlite3_backup *b = sqlite3_backup_init(dst, "main", src, "main");
    if (!b) {
        sl_err_set(err, SL_EIO, "backup of %s: %s", path, sqlite3_errmsg(dst));
        goto out;
    }
    int step;
    for (int tries = 0; (step = sqlite3_backup_step(b, -1)) == SQLITE_BUSY ||
                        step == SQLITE_LOCKED;
         tries++) {
        if (tries == 100)
            break;
        sqlite3_sleep(50);
    }
    sqlite3_backup_finish(b);
    if (step != SQLITE_DONE) {
        sl_err_set(err, SL_EIO, "backup of %s: %s", path, sqlite3_errstr(step));
        goto out;
    }
    coord_state chk = {.db = dst};
    char verdict[256], count[32];
    if (query_text(&chk, "PRAGMA quick_check;", verdict, sizeof verdict, err) < 0 ||
        strcmp(verdict, "ok") != 0) {
        if (!err || !err->msg[0] || strcmp(verdict, "ok") != 0)
            sl_err_set(err, SL_ECORRUPT, "the copy failed its integrity check: %s", verdict);
        goto out;
    }
    if (query_text(&chk, "SELECT count(*) FROM devices;", count, sizeof count, err) < 0)
        goto out;
    if (devices)
        *devices = atoll(count);
    if (sqlite3_close(dst) != SQLITE_OK) {
        sl_err_set(err, SL_EIO, "closing %s: %s", tmp, sqlite3_errmsg(dst));
        goto out;
    }
    dst = NULL;
    /* fsync the copy before it takes its name */
    int fd = open(tmp, O_RDONLY | O_CLOEXEC);
    int synced = fd >= 0 && fsync(fd) == 0;
    if (fd >= 0)
        close(fd);
    if (!synced || link(tmp, out) != 0) {
        sl_err_set(err, SL_EIO, "%s: %s", out, strerror(errno));
        goto out;
    }
    rc = 0;
out:
    sqlite3_close(dst);
    sqlite3_close(src);
    unlink(tmp);
    return rc;
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
