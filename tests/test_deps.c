/* Each dependency initialised and used once for real. */
#include <cblas.h>
#include <grpc/grpc.h>
#include <hwloc.h>
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sodium.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coord_state.h"
#include "dev_profile.h"
#include "kn_backend.h"
#include "rpc.h"
#include "skyloom.pb-c.h"
#include "sl_config.h"
#include "sl_test.h"

static void test_grpc(void)
{
    rpc_global_init();
    CHECK(grpc_is_initialized());
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    CHECK(cq != NULL);
    grpc_completion_queue_shutdown(cq);
    grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    CHECK(ev.type == GRPC_QUEUE_SHUTDOWN);
    grpc_completion_queue_destroy(cq);
    CHECK(strlen(rpc_grpc_version()) > 0);
    rpc_global_shutdown();
}

static void test_protobuf(void)
{
    Skyloom__V1__DeviceProfile p = SKYLOOM__V1__DEVICE_PROFILE__INIT;
    p.cores = 6;
    p.memory_bytes = 24ull << 30;
    p.cpu_model = "test cpu";
    p.cuda = 1;
    size_t n = skyloom__v1__device_profile__get_packed_size(&p);
    uint8_t *buf = malloc(n);
    CHECK(skyloom__v1__device_profile__pack(&p, buf) == n);
    Skyloom__V1__DeviceProfile *q = skyloom__v1__device_profile__unpack(NULL, n, buf);
    CHECK(q != NULL);
    if (q) {
        CHECK(q->cores == 6 && q->memory_bytes == (24ull << 30) && q->cuda);
        CHECK(strcmp(q->cpu_model, "test cpu") == 0);
        skyloom__v1__device_profile__free_unpacked(q, NULL);
    }
    /* A truncated message is refused, not misread. */
    CHECK(skyloom__v1__device_profile__unpack(NULL, n - 3, buf) == NULL);
    free(buf);
}

static void test_sodium_aead(void)
{
    CHECK(sodium_init() >= 0);
    unsigned char key[crypto_aead_xchacha20poly1305_ietf_KEYBYTES];
    unsigned char nonce[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES];
    crypto_aead_xchacha20poly1305_ietf_keygen(key);
    randombytes_buf(nonce, sizeof nonce);
    const unsigned char msg[] = "activation tensor bytes";
    const unsigned char ad[] = "frame header";
    unsigned char ct[sizeof msg + crypto_aead_xchacha20poly1305_ietf_ABYTES], pt[sizeof msg];
    unsigned long long ctlen, ptlen;
    crypto_aead_xchacha20poly1305_ietf_encrypt(ct, &ctlen, msg, sizeof msg, ad, sizeof ad, NULL,
                                               nonce, key);
    CHECK(ctlen == sizeof ct);
    CHECK(crypto_aead_xchacha20poly1305_ietf_decrypt(pt, &ptlen, NULL, ct, ctlen, ad, sizeof ad,
                                                     nonce, key) == 0);
    CHECK(ptlen == sizeof msg && memcmp(pt, msg, sizeof msg) == 0);
    ct[3] ^= 1;
    CHECK(crypto_aead_xchacha20poly1305_ietf_decrypt(pt, &ptlen, NULL, ct, ctlen, ad, sizeof ad,
                                                     nonce, key) != 0);
}

static void test_hwloc(void)
{
    dev_profile p;
    sl_err err = {0};
    CHECK(dev_profile_probe(&p, &err) == 0);
    CHECK(p.cores >= 1);
    CHECK(p.pus >= p.cores);
    CHECK(p.memory_bytes > (64u << 20));
}

static int put(const char *dir, const char *file, const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    int rc = fputs(text, f) < 0;
    rc |= fclose(f) != 0;
    return rc ? -1 : 0;
}

/* The cpu pool a device reports, and the lock its profiling takes. */
static void test_cpu_pool(void)
{
    dev_cpu_pool a, b;
    dev_cpu_pool_probe(&a, 1);
    dev_cpu_pool_probe(&b, 100000);
    CHECKF((!strncmp(a.name, "m-", 2) || !strncmp(a.name, "h-", 2)) && strlen(a.name) > 2,
           "%s", a.name);
    CHECK(!strcmp(a.name, b.name));
    CHECKF(!strncmp(a.net_ns, "net:[", 5) && !strcmp(a.net_ns, b.net_ns), "%s", a.net_ns);
    CHECK(a.pool_cpus == (double)sysconf(_SC_NPROCESSORS_ONLN));
    CHECK(a.cpus > 0 && a.cpus <= 1 && b.cpus <= b.pool_cpus && b.cpus >= a.cpus);
    /* an affinity of one CPU caps a two-thread device at one core */
    pid_t pid = fork();
    if (pid == 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(sched_getcpu() >= 0 ? sched_getcpu() : 0, &one);
        dev_cpu_pool c;
        int ok = sched_setaffinity(0, sizeof one, &one) == 0;
        dev_cpu_pool_probe(&c, 2);
        _exit(ok && c.cpus == 1 ? 0 : 1);
    }
    int st = -1;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* a CPU quota of half a core caps a two-thread device at 0.5 */
    char cg[128];
    int v1 = access("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", F_OK) == 0;
    snprintf(cg, sizeof cg, "%s/skyloom-test-%d", v1 ? "/sys/fs/cgroup/cpu" : "/sys/fs/cgroup",
             (int)getpid());
    if (mkdir(cg, 0755) != 0) {
        printf("  cgroup quota not checked: cannot create %s (%s)\n", cg, strerror(errno));
    } else {
        int ok = v1 ? put(cg, "cpu.cfs_period_us", "100000") == 0 &&
                          put(cg, "cpu.cfs_quota_us", "50000") == 0
                    : put(cg, "cpu.max", "50000 100000") == 0;
        if (!ok) {
            printf("  cgroup quota not checked: cannot set the quota of %s\n", cg);
        } else {
            pid = fork();
            if (pid == 0) {
                char me[32];
                snprintf(me, sizeof me, "%d", (int)getpid());
                dev_cpu_pool c;
                int in = put(cg, "cgroup.procs", me) == 0;
                dev_cpu_pool_probe(&c, 2);
                if (!in || fabs(c.cpus - 0.5) >= 1e-9 || c.quota_unknown)
                    _exit(1);
                /* the same process where a sysfs of its own hides the cgroup
                 * filesystem, as `ip netns exec` mounts it: the quota is
                 * unknown, and said to be */
                if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) ||
                    umount2("/sys", MNT_DETACH) || mount("sysfs", "/sys", "sysfs", 0, NULL))
                    _exit(3);
                dev_cpu_pool_probe(&c, 2);
                _exit(c.quota_unknown && c.cpus > 0.5 ? 0 : 2);
            }
            st = -1;
            CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st));
            if (WIFEXITED(st) && WEXITSTATUS(st) == 3)
                printf("  cgroup hidden by another sysfs not checked: cannot mount one\n");
            else
                CHECKF(WEXITSTATUS(st) == 0, "quota probe: exit %d (1: the quota, 2: hidden)",
                       WEXITSTATUS(st));
        }
        CHECK(rmdir(cg) == 0);
    }
    /* one holder at a time (another test's devices may hold it a while) */
    int fd = dev_machine_lock(120);
    CHECK(fd >= 0);
    CHECK(dev_machine_lock(0.05) == -1);
    dev_machine_unlock(fd);
    fd = dev_machine_lock(120);
    CHECK(fd >= 0);
    dev_machine_unlock(fd);
}

static void test_sqlite(void)
{
    char dir[] = "/tmp/skyloom-test-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    sl_err err = {0};
    coord_state *s = coord_state_open(dir, &err);
    CHECKF(s != NULL, "%s", err.msg);
    if (!s)
        return;
    CHECK(strcmp(coord_state_journal_mode(s), "wal") == 0);
    CHECK(coord_state_schema_version(s) >= 1);
    coord_state_close(s);
    /* Reopening keeps the schema and does not migrate twice. */
    s = coord_state_open(dir, &err);
    CHECK(s != NULL && coord_state_schema_version(s) >= 1);
    coord_state_close(s);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

static void test_sgemm(void)
{
    enum { M = 7, K = 13, N = 5 };
    float a[M * K], b[K * N], c[M * N], ref[M * N];
    for (int i = 0; i < M * K; i++)
        a[i] = (float)((i * 7) % 11) - 5.0f;
    for (int i = 0; i < K * N; i++)
        b[i] = (float)((i * 3) % 5) * 0.5f;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = 0;
            for (int k = 0; k < K; k++)
                s += a[i * K + k] * b[k * N + j];
            ref[i * N + j] = s;
        }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a, K, b, N, 0.0f, c, N);
    for (int i = 0; i < M * N; i++)
        CHECK_NEAR(c[i], ref[i], 1e-4);
    CHECK(kn_blas_threads() >= 1);
    CHECK(strstr(kn_blas_name(), "OpenBLAS") != NULL);
}

static void test_cuda_probe(void)
{
    const kn_cuda_info *ci = kn_cuda_probe();
    CHECK(ci->compiled == (HAVE_CUDA == 1));
    char why[200];
    if (ci->device_count <= 0) {
        /* The no-GPU path: a reason, no count, and a selftest that refuses. */
        CHECK(strlen(ci->reason) > 0);
        CHECK(kn_cuda_selftest(why, sizeof why) == -1);
        CHECK(strcmp(why, ci->reason) == 0);
        if (ci->compiled)
            CHECK(strstr(ci->reason, "CUDA driver missing") != NULL ||
                  strstr(ci->reason, "cudaGetDeviceCount returned") != NULL ||
                  strstr(ci->reason, "CUDA module not loadable") != NULL);
        else
            CHECK(strstr(ci->reason, "not compiled in") != NULL);
        printf("no GPU: %s\n", ci->reason);
    } else {
        CHECKF(kn_cuda_selftest(why, sizeof why) == 0, "%s", why);
    }
    /* The probe is cached and stable. */
    CHECK(kn_cuda_probe() == ci);
    /* Without the driver the CUDA module (and with it cuBLAS, ~210 MiB) is
     * never mapped: a CPU machine pays nothing for a CUDA build. */
    if (strstr(ci->reason, "libcuda.so.1 not loadable")) {
        FILE *f = fopen("/proc/self/maps", "r");
        char line[512];
        int mapped = 0;
        while (f && fgets(line, sizeof line, f))
            mapped |= strstr(line, "libcublas") != NULL || strstr(line, "libskyloom_cuda") != NULL;
        if (f)
            fclose(f);
        CHECKF(!mapped, "cuBLAS or the CUDA module is mapped although the driver is missing");
        printf("no driver: the CUDA module was not loaded\n");
    }
}

int main(void)
{
    RUN(test_grpc);
    RUN(test_protobuf);
    RUN(test_sodium_aead);
    RUN(test_hwloc);
    RUN(test_cpu_pool);
    RUN(test_sqlite);
    RUN(test_sgemm);
    RUN(test_cuda_probe);
    return sl_test_done();
}
