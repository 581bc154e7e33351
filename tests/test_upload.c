/* coord_uploads: a model for --init, a piece at a time, then claimed by a
 * submit. Pieces in order, the checksum at the end, refusals that say why
 * and keep nothing damaged, a bounded number at once, a piece sent twice
 * taken once, uploads that go on across a restart (finished ones claimable,
 * unfinished ones resumable), stray markers removed. */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coord_upload.h"
#include "sl_file.h"
#include "sl_test.h"

static const char *g_dir;

static int piece(coord_uploads *u, const char *id, uint64_t off, const uint8_t *p, size_t n,
                 int last, uint64_t size, const uint8_t *sum, rpc_status *st)
{
    Skyloom__V1__UploadInitRequest r = SKYLOOM__V1__UPLOAD_INIT_REQUEST__INIT;
    r.upload_id = (char *)id;
    r.offset = off;
    r.data.data = (uint8_t *)p;
    r.data.len = n;
    r.last = last;
    r.size = size;
    r.blake2b.data = (uint8_t *)sum;
    r.blake2b.len = sum ? 32 : 0;
    memset(st, 0, sizeof *st);
    return coord_uploads_piece(u, &r, st);
}

static int exists(const char *id)
{
    char p[512];
    snprintf(p, sizeof p, "%s/uploads/%s.safetensors", g_dir, id);
    return access(p, F_OK) == 0;
}

static void id_of(int k, char *id)
{
    snprintf(id, 33, "%032x", k);
}

int main(void)
{
    char dir[] = "/tmp/skyloom-test-upload-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    g_dir = dir;
    CHECK(sodium_init() >= 0);
    char up[256], dest[256];
    snprintf(up, sizeof up, "%s/uploads", dir);
    snprintf(dest, sizeof dest, "%s/model.safetensors", dir);
    /* an upload an earlier run left goes on; a marker without its file is
     * removed; other files stay */
    sl_err err = {0};
    CHECK(sl_mkdir(up, 0700, &err) == 0);
    char old[320], keep[320], stray[320];
    snprintf(old, sizeof old, "%s/%032x.safetensors", up, 99);
    snprintf(stray, sizeof stray, "%s/%032x.done", up, 98);
    snprintf(keep, sizeof keep, "%s/notes.txt", up);
    CHECK(sl_write_file_atomic(old, "x", 1, &err) == 0 && sl_write_file_atomic(keep, "y", 1, &err) == 0 &&
          sl_write_file_atomic(stray, "", 0, &err) == 0);
    coord_uploads *u = coord_uploads_open(up, &err);
    CHECKF(u != NULL, "%s", err.msg);
    CHECK(access(old, F_OK) == 0 && access(keep, F_OK) == 0 && access(stray, F_OK) != 0);
    {
        uint8_t xyz[32];
        crypto_generichash(xyz, sizeof xyz, (const uint8_t *)"xyz", 3, NULL, 0);
        char oid[33];
        id_of(99, oid);
        rpc_status s0;
        CHECKF(piece(u, oid, 1, (const uint8_t *)"yz", 2, 1, 3, xyz, &s0) == RPC_OK, "%s", s0.details);
        CHECK(coord_uploads_claim(u, oid, dest, &s0) == RPC_OK);
        char *got = NULL;
        size_t len = 0;
        CHECK(sl_read_file(dest, 64, &got, &len, &err) == 0 && len == 3 && !memcmp(got, "xyz", 3));
        free(got);
    }

    enum { N = 3000 };
    uint8_t data[N], sum[32];
    for (int i = 0; i < N; i++)
        data[i] = (uint8_t)(i * 7 + 1);
    crypto_generichash(sum, sizeof sum, data, N, NULL, 0);
    char id[33];
    id_of(1, id);
    rpc_status st;
    /* three pieces, in order */
    CHECK(piece(u, id, 0, data, 1000, 0, 0, NULL, &st) == RPC_OK);
    CHECK(piece(u, id, 2000, data + 2000, 1000, 0, 0, NULL, &st) == RPC_OUT_OF_RANGE &&
          strstr(st.details, "expected 1000"));
    CHECK(piece(u, id, 1000, data + 1000, 1000, 0, 0, NULL, &st) == RPC_OK);
    /* not complete yet: a submit cannot claim it */
    CHECK(coord_uploads_claim(u, id, dest, &st) == RPC_FAILED_PRECONDITION &&
          strstr(st.details, "not complete"));
    CHECK(piece(u, id, 2000, data + 2000, 1000, 1, N, sum, &st) == RPC_OK);
    CHECK(piece(u, id, 3000, data, 1, 0, 0, NULL, &st) == RPC_FAILED_PRECONDITION &&
          strstr(st.details, "complete"));
    CHECK(coord_uploads_claim(u, id, dest, &st) == RPC_OK);
    char *got = NULL;
    size_t len = 0;
    CHECK(sl_read_file(dest, 1 << 20, &got, &len, &err) == 0 && len == N && !memcmp(got, data, N));
    free(got);
    CHECK(!exists(id));
    /* claimed once only */
    CHECK(coord_uploads_claim(u, id, dest, &st) == RPC_FAILED_PRECONDITION &&
          strstr(st.details, "unknown"));

    /* damaged: a wrong sum or size drops the upload and its file */
    uint8_t bad[32];
    memcpy(bad, sum, 32);
    bad[5] ^= 1;
    id_of(2, id);
    CHECK(piece(u, id, 0, data, N, 1, N, bad, &st) == RPC_DATA_LOSS && strstr(st.details, "damaged"));
    CHECK(!exists(id));
    CHECK(piece(u, id, 0, data, N, 1, N + 1, sum, &st) == RPC_DATA_LOSS && !exists(id));
    CHECK(piece(u, id, 0, data, N, 1, N, sum, &st) == RPC_OK && exists(id));
    /* a piece that does not start a known upload */
    id_of(3, id);
    CHECK(piece(u, id, 10, data, 10, 0, 0, NULL, &st) == RPC_FAILED_PRECONDITION &&
          strstr(st.details, "no such upload"));
    /* ids are 32 hex digits: nothing else names a file */
    CHECK(piece(u, "../../etc/passwd", 0, data, 1, 0, 0, NULL, &st) == RPC_INVALID_ARGUMENT);
    CHECK(piece(u, "0123456789ABCDEF0123456789abcdef", 0, data, 1, 0, 0, NULL, &st) == RPC_INVALID_ARGUMENT);
    CHECK(coord_uploads_claim(u, "x", dest, &st) == RPC_INVALID_ARGUMENT);

    /* eight at once (id 2 waits for its submit): the ninth waits its turn */
    for (int k = 10; k < 17; k++) {
        id_of(k, id);
        CHECK(piece(u, id, 0, data, 10, 0, 0, NULL, &st) == RPC_OK);
    }
    id_of(17, id);
    CHECK(piece(u, id, 0, data, 10, 0, 0, NULL, &st) == RPC_RESOURCE_EXHAUSTED &&
          strstr(st.details, "8 uploads"));
    coord_uploads_close(u);

    /* a restart: the finished upload (2) is claimed; an unfinished one (10,
     * 10 bytes in) goes on where it was; a piece sent again after its reply
     * was lost is taken once, other bytes there are refused */
    u = coord_uploads_open(up, &err);
    CHECK(u != NULL);
    if (!u)
        return sl_test_done();
    id_of(2, id);
    CHECKF(coord_uploads_claim(u, id, dest, &st) == RPC_OK, "%s", st.details);
    CHECK(sl_read_file(dest, 1 << 20, &got, &len, &err) == 0 && len == N && !memcmp(got, data, N));
    free(got);
    id_of(10, id);
    CHECK(piece(u, id, 0, data, 10, 0, 0, NULL, &st) == RPC_OK);
    uint8_t other[10] = {0};
    CHECK(piece(u, id, 0, other, 10, 0, 0, NULL, &st) == RPC_OUT_OF_RANGE && strstr(st.details, "expected 10"));
    CHECK(piece(u, id, 10, data + 10, N - 10, 1, N, sum, &st) == RPC_OK);
    CHECK(piece(u, id, 10, data + 10, N - 10, 1, N, sum, &st) == RPC_OK); /* the reply was lost */
    CHECKF(coord_uploads_claim(u, id, dest, &st) == RPC_OK, "%s", st.details);
    CHECK(sl_read_file(dest, 1 << 20, &got, &len, &err) == 0 && len == N && !memcmp(got, data, N));
    free(got);
    coord_uploads_close(u);

    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    return sl_test_done();
}
