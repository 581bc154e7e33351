/* test_coord_state.c - the coordinator's state and directories without a
 * network: refusals of state that is not what it claims, one coordinator per
 * directory, backups, the spool's refusals, and the handlers called from
 * many threads at once. */
#include <pthread.h>
#include <sys/stat.h>

#include "coord.h"
#include "coord_state.h"
#include "rpc.h"
#include "skyloom.pb-c.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_test.h"
#include "trust_util.h"

static char root[256], pki[512];

static const char *sub(const char *name)
{
    static char b[8][512];
    static int k;
    char *p = b[k++ & 7];
    snprintf(p, 512, "%s/%s", root, name);
    return p;
}

static int copy_file(const char *from, const char *to)
{
    char *buf;
    size_t n;
    if (sl_read_file(from, 1u << 26, &buf, &n, NULL))
        return -1;
    FILE *f = fopen(to, "wb");
    int rc = f && fwrite(buf, 1, n, f) == n ? 0 : -1;
    if (f)
        fclose(f);
    free(buf);
    return rc;
}

/* A state directory with one token in it. */
static void make_state(const char *dir)
{
    sl_err err = {0};
    coord_state *s = coord_state_open(dir, &err);
    CHECKF(s != NULL, "%s", err.msg);
    if (s)
        CHECK(coord_state_add_token(s, "aa", "lab", 1, 0, &err) == 0);
    coord_state_close(s);
}

static int refused(const char *dir, const char *want)
{
    sl_err err = {0};
    coord_state *s = coord_state_open(dir, &err);
    coord_state_close(s);
    if (s || !strstr(err.msg, want)) {
        fprintf(stderr, "  state %s: %s (wanted '%s')\n", dir, s ? "opened" : err.msg, want);
        return 0;
    }
    return 1;
}

static void test_state_refusals(void)
{
    const char *a = sub("sa"), *b = sub("sb");
    make_state(a);
    make_state(b);
    char p[600], q[600];
    /* a database from another state directory */
    snprintf(p, sizeof p, "%s/coordinator.db", a);
    snprintf(q, sizeof q, "%s/coordinator.db", b);
    CHECK(copy_file(p, q) == 0);
    CHECK(refused(b, "comes from another state directory"));
    /* the write-ahead log without its database */
    snprintf(q, sizeof q, "%s/coordinator.db-wal", b);
    FILE *f = fopen(q, "w");
    CHECK(f != NULL);
    if (f)
        fclose(f);
    snprintf(q, sizeof q, "%s/coordinator.db", b);
    unlink(q);
    snprintf(p, sizeof p, "%s/coordinator.id", b);
    unlink(p);
    CHECK(refused(b, "is missing but its write-ahead log"));
    /* a damaged marker */
    snprintf(q, sizeof q, "%s/coordinator.id", a);
    f = fopen(q, "w");
    if (f) {
        fputs("not an id\n", f);
        fclose(f);
    }
    CHECK(refused(a, "coordinator.id is damaged"));
    /* something else where the database should be */
    const char *c = sub("sc");
    CHECK(mkdir(c, 0700) == 0);
    snprintf(q, sizeof q, "%s/coordinator.db", c);
    CHECK(mkdir(q, 0700) == 0);
    CHECK(refused(c, "not a regular file"));
    /* an existing database without a marker (made before markers) is adopted */
    const char *d = sub("sd");
    make_state(d);
    snprintf(q, sizeof q, "%s/coordinator.id", d);
    CHECK(unlink(q) == 0);
    sl_err err = {0};
    coord_state *s = coord_state_open(d, &err);
    CHECKF(s != NULL, "%s", err.msg);
    coord_state_close(s);
    struct stat st;
    CHECK(stat(q, &st) == 0 && st.st_size == 33);
    /* and a state directory open to others is made private */
    CHECK(chmod(d, 0777) == 0);
    s = coord_state_open(d, &err);
    CHECK(s != NULL && stat(d, &st) == 0 && (st.st_mode & 0777) == 0700);
    coord_state_close(s);
}

static void test_one_coordinator_per_directory(void)
{
    sl_err err = {0};
    coord_opts o = {.listen = "127.0.0.1:0", .pki = pki, .state = sub("c1")};
    coord *c1 = coord_open(&o, &err);
    CHECKF(c1 != NULL, "%s", err.msg);
    char pid[32];
    snprintf(pid, sizeof pid, "(pid %ld)", (long)getpid());
    /* the same PKI with another state */
    coord_opts o2 = {.listen = "127.0.0.1:0", .pki = pki, .state = sub("c2")};
    CHECK(coord_open(&o2, &err) == NULL && strstr(err.msg, "PKI directory") &&
          strstr(err.msg, "in use by another coordinator") && strstr(err.msg, pid));
    coord_close(c1);
    /* the same state with another PKI */
    char pki2[512];
    tu_pki(root, "pki2", pki2, sizeof pki2);
    c1 = coord_open(&o, &err);
    o2.pki = pki2;
    o2.state = o.state;
    CHECK(c1 != NULL && coord_open(&o2, &err) == NULL && strstr(err.msg, "state directory") &&
          strstr(err.msg, "in use by another coordinator"));
    coord_close(c1);
    /* free again once the first one is closed; PKI and state may be one directory */
    o2.state = pki2;
    c1 = coord_open(&o2, &err);
    CHECKF(c1 != NULL, "%s", err.msg);
    coord_close(c1);
}

static void test_backup(void)
{
    const char *dir = sub("sb2");
    sl_err err = {0};
    coord_state *s = coord_state_open(dir, &err);
    CHECK(s != NULL);
    if (!s)
        return;
    coord_device d = {.id = "d0123456789abcdef", .site = "lab", .cert_pem = "x"};
    CHECK(coord_state_add_token(s, "t1", "lab", 4000000000, 0, &err) == 0);
    CHECK(coord_state_enroll(s, "t1", &d, 5, &err) == 0);
    /* the open connection keeps the enrollment in the -wal file: the backup has it */
    char out[600], wal[600];
    snprintf(out, sizeof out, "%s/copy.db", root);
    snprintf(wal, sizeof wal, "%s/coordinator.db-wal", dir);
    struct stat st;
    CHECK(stat(wal, &st) == 0 && st.st_size > 0);
    int64_t n = -1;
    CHECKF(coord_state_backup(dir, out, &n, &err) == 0, "%s", err.msg);
    CHECK(n == 1);
    CHECK(coord_state_backup(dir, out, &n, &err) == -1 && strstr(err.msg, "exists already"));
    coord_state_close(s);
    /* restored into a fresh directory, it opens and has the device */
    const char *r = sub("restored");
    CHECK(mkdir(r, 0700) == 0);
    char p[600];
    snprintf(p, sizeof p, "%s/coordinator.db", r);
    CHECK(copy_file(out, p) == 0);
    s = coord_state_open(r, &err);
    CHECKF(s != NULL, "%s", err.msg);
    if (s)
        CHECK(coord_state_device_known(s, "d0123456789abcdef", &err) == 1);
    coord_state_close(s);
    CHECK(coord_state_backup(sub("nothing"), sub("x.db"), &n, &err) == -1 &&
          strstr(err.msg, "no coordinator state"));
}

/* ---- the spool ---------------------------------------------------------------- */

typedef struct seen {
    int imported, bad;
    char why[8][128];
} seen;

static int on_entry(void *ud, int kind, const char *key, const char *site, int64_t t,
                    int64_t cert_s, sl_err *err)
{
    (void)kind;
    (void)site;
    (void)t;
    (void)cert_s;
    seen *s = ud;
    if (!strcmp(key, "dffffffffffffffff"))
        return sl_err_set(err, SL_EIO, "disk on fire");
    s->imported++;
    return 0;
}

static void on_bad(void *ud, const char *file, const char *why)
{
    seen *s = ud;
    if (s->bad < 8)
        snprintf(s->why[s->bad], sizeof s->why[0], "%s: %s", file, why);
    s->bad++;
}

static int has_why(const seen *s, const char *what)
{
    for (int i = 0; i < s->bad && i < 8; i++)
        if (strstr(s->why[i], what))
            return 1;
    return 0;
}

static void test_spool(void)
{
    char dir[512], sp[600], p[700];
    tu_pki(root, "spoolpki", dir, sizeof dir);
    snprintf(sp, sizeof sp, "%s/spool", dir);
    char hex[65];
    memset(hex, 'a', 64);
    hex[64] = 0;
    snprintf(p, sizeof p, "%s/token-%s", sp, hex);
    CHECK(mkfifo(p, 0600) == 0);
    hex[0] = 'b';
    snprintf(p, sizeof p, "%s/token-%s", sp, hex);
    CHECK(symlink("/etc/passwd", p) == 0);
    hex[0] = 'c';
    snprintf(p, sizeof p, "%s/token-%s", sp, hex);
    FILE *f = fopen(p, "w");
    for (int i = 0; f && i < 100; i++)
        fputs("lab 4000000000\n", f);
    if (f)
        fclose(f);
    hex[0] = 'd';
    snprintf(p, sizeof p, "%s/token-%sxyz", sp, hex);
    f = fopen(p, "w");
    if (f) {
        fputs("lab 4000000000\n", f);
        fclose(f);
    }
    hex[0] = 'e';
    snprintf(p, sizeof p, "%s/token-%s", sp, hex);
    f = fopen(p, "w");
    if (f) {
        fputs("lab 4000000000\n", f);
        fclose(f);
    }
    seen s = {0};
    int bad = 0;
    sl_err err = {0};
    CHECKF(cert_spool_drain(dir, on_entry, on_bad, &s, &bad, &err) == 0, "%s", err.msg);
    CHECK(s.imported == 1 && bad == 4 && s.bad == 4);
    CHECK(has_why(&s, "token-aaaa") && has_why(&s, "not a regular file"));
    CHECK(has_why(&s, "a symbolic link"));
    CHECK(has_why(&s, "too large"));
    CHECK(has_why(&s, "the name is not token-<64 hex>"));
    hex[0] = 'a';
    snprintf(p, sizeof p, "%s/token-%s.bad", sp, hex);
    struct stat st;
    CHECK(lstat(p, &st) == 0 && S_ISFIFO(st.st_mode));
    /* an import that fails names the entry and the cause, and keeps it */
    CHECK(cert_revoke(dir, "dffffffffffffffff", &err) == 0);
    memset(&s, 0, sizeof s);
    CHECK(cert_spool_drain(dir, on_entry, on_bad, &s, &bad, &err) == -1);
    CHECKF(strstr(err.msg, "revoke-dffffffffffffffff") && strstr(err.msg, "disk on fire"), "%s",
           err.msg);
    snprintf(p, sizeof p, "%s/revoke-dffffffffffffffff", sp);
    CHECK(stat(p, &st) == 0);
}

/* ---- handlers from many threads ------------------------------------------------- */

#define THREADS 6
#define ROUNDS 60

static coord *co;
static char dev_id[CERT_ID_LEN];

static int do_enroll(const char *tok_text, const char *keyname, char id[CERT_ID_LEN])
{
    sl_err err = {0};
    cert_token t;
    uint8_t *csr = NULL;
    size_t len = 0;
    const char *key = sub(keyname);
    if (cert_token_parse(tok_text, &t, &err) || cert_key_generate(key, &err) ||
        cert_key_device_id(key, id, &err) || cert_csr_create(key, id, &csr, &len, &err)) {
        fprintf(stderr, "  enroll setup: %s\n", err.msg);
        return -1;
    }
    Skyloom__V1__EnrollRequest req = SKYLOOM__V1__ENROLL_REQUEST__INIT;
    req.token = t.secret;
    req.csr_der.data = csr;
    req.csr_der.len = len;
    req.site = "lab";
    rpc_buf in, out = {0};
    rpc_pack(&req, &in);
    rpc_peer peer = {0};
    rpc_status st = {0};
    int code = coord_handle_enroll(co, &peer, in.data, in.len, &out, &st);
    if (code != RPC_OK)
        fprintf(stderr, "  enroll: %s: %s\n", rpc_code_name(code), st.details);
    rpc_buf_free(&in);
    rpc_buf_free(&out);
    free(csr);
    return code;
}

static void *hammer(void *arg)
{
    long k = (long)arg;
    long failures = 0;
    rpc_peer dev = {.authenticated = 1}, admin = {.authenticated = 1};
    snprintf(dev.identity, sizeof dev.identity, "%s", dev_id);
    snprintf(admin.identity, sizeof admin.identity, "%s", CERT_ADMIN_CN);
    for (int i = 0; i < ROUNDS; i++) {
        rpc_buf in, out = {0};
        rpc_status st = {0};
        int code;
        if ((i + k) % 3) {
            Skyloom__V1__HeartbeatRequest req = SKYLOOM__V1__HEARTBEAT_REQUEST__INIT;
            req.device_id = dev_id;
            req.seq = (uint64_t)i;
            rpc_pack(&req, &in);
            code = coord_handle_heartbeat(co, &dev, in.data, in.len, &out, &st);
        } else {
            Skyloom__V1__ListDevicesRequest req = SKYLOOM__V1__LIST_DEVICES_REQUEST__INIT;
            rpc_pack(&req, &in);
            code = coord_handle_list_devices(co, &admin, in.data, in.len, &out, &st);
        }
        if (code != RPC_OK) {
            fprintf(stderr, "  thread %ld: %s: %s\n", k, rpc_code_name(code), st.details);
            failures++;
        }
        rpc_buf_free(&in);
        rpc_buf_free(&out);
        if (i % 20 == 0) {
            /* enrollments and revocations arrive through the spool meanwhile */
            char tok[CERT_TOKEN_LEN], name[32], id[CERT_ID_LEN];
            sl_err err = {0};
            snprintf(name, sizeof name, "k%ld-%d.key", k, i);
            if (cert_token_create(pki, "lab", 3600, tok, &err) || do_enroll(tok, name, id) != RPC_OK)
                failures++;
        }
    }
    return (void *)failures;
}

static void test_handlers_in_parallel(void)
{
    coord_opts o = {.listen = "127.0.0.1:0", .pki = pki, .state = sub("par")};
    sl_err err = {0};
    co = coord_open(&o, &err);
    CHECKF(co != NULL, "%s", err.msg);
    if (!co)
        return;
    char tok[CERT_TOKEN_LEN];
    CHECK(cert_token_create(pki, "lab", 3600, tok, &err) == 0);
    CHECK(do_enroll(tok, "first.key", dev_id) == RPC_OK);
    pthread_t t[THREADS];
    for (long k = 0; k < THREADS; k++)
        CHECK(pthread_create(&t[k], NULL, hammer, (void *)k) == 0);
    long failures = 0;
    for (int k = 0; k < THREADS; k++) {
        void *r;
        pthread_join(t[k], &r);
        failures += (long)r;
    }
    CHECKF(failures == 0, "%ld calls failed", failures);
    /* every enrollment is there */
    rpc_peer admin = {.authenticated = 1};
    snprintf(admin.identity, sizeof admin.identity, "%s", CERT_ADMIN_CN);
    Skyloom__V1__ListDevicesRequest req = SKYLOOM__V1__LIST_DEVICES_REQUEST__INIT;
    rpc_buf in, out = {0};
    rpc_status st;
    rpc_pack(&req, &in);
    CHECK(coord_handle_list_devices(co, &admin, in.data, in.len, &out, &st) == RPC_OK);
    Skyloom__V1__ListDevicesResponse *r =
        rpc_unpack(&skyloom__v1__list_devices_response__descriptor, out.data, out.len);
    CHECK(r && r->n_devices == 1 + THREADS * ((ROUNDS + 19) / 20));
    rpc_unpacked_free(r);
    rpc_buf_free(&in);
    rpc_buf_free(&out);
    CHECK(coord_close(co) == 0);
}

int main(void)
{
    sl_log_set_level(SL_LOG_ERROR);
    tu_tmpdir(root, sizeof root, "coordstate");
    tu_pki(root, "pki", pki, sizeof pki);
    RUN(test_state_refusals);
    RUN(test_one_coordinator_per_directory);
    RUN(test_backup);
    RUN(test_spool);
    RUN(test_handlers_in_parallel);
    tu_rmtree(root);
    return sl_test_done();
}
