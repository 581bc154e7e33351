/* bench_sync - the CPU of a federation's sync round (dev_fed.c, dev_sync.c)
 * per parameter and per payload byte: the reference-core costs the balancer
 * charges a round (bal_codec_cost, bal_fed_sync_round; docs/balancer.md),
 * beside the AdamW step of the same parameters for scale.
 *
 * Per codec, on one tensor of N floats in rows of 256:
 *   give     the replica's contribution: error feedback added, encoded,
 *            decoded, the residual kept (lossy codecs); encoded (none)
 *   combine  one payload decoded and summed in double (dev_sync_combine of
 *            two payloads, halved)
 *   seal     sealing and opening the payload (dev_aead), per payload byte
 * Each figure is the median over REPS rounds of the process's CPU time (the
 * optimizer's threads included); the rows are the inner loop so load
 * elsewhere hits them alike.
 *
 *   bench_sync [reps]      (default 9, at most 64) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "dev_aead.h"
#include "dev_codec.h"
#include "dev_sync.h"
#include "kn_ops.h"
#include "sl_mem.h"
#include "sl_rng.h"

#define N ((size_t)1 << 21)
#define COLS 256
#define MAX_REPS 64

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, const sl_err *err)
{
    fprintf(stderr, "bench_sync: %s: %s\n", what, err->msg);
    exit(1);
}

static const struct {
    const char *name;
    int codec;
    double topk;
} codecs[] = {{"none", DEV_CODEC_NONE, 0},
              {"fp16", DEV_CODEC_FP16, 0},
              {"bf16", DEV_CODEC_BF16, 0},
              {"int8", DEV_CODEC_INT8, 0},
              {"topk:0.01", DEV_CODEC_TOPK, 0.01}};
enum { NC = sizeof(codecs) / sizeof(codecs[0]) };

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 9;
    if (reps < 1 || reps > MAX_REPS)
        reps = 9;
    sl_err err = {0};
    float *p = sl_xaligned_alloc(N * sizeof(float)), *g = sl_xaligned_alloc(N * sizeof(float));
    float *m = sl_xcalloc(N, sizeof(float)), *v = sl_xcalloc(N, sizeof(float));
    float *resid = sl_xcalloc(N, sizeof(float)), *dec = sl_xaligned_alloc(N * sizeof(float));
    float *out = sl_xaligned_alloc(N * sizeof(float));
    float *scratch = sl_xaligned_alloc(2 * N * sizeof(float));
    for (size_t i = 0; i < N; i++) {
        p[i] = sl_rng_normal(1, 1, i) * 0.02f;
        g[i] = sl_rng_normal(1, 2, i) * 1e-3f;
    }
    uint8_t *payload[NC], *other[NC], *sealed[NC];
    size_t len[NC];
    dev_sync_cfg sc[NC];
    for (int c = 0; c < NC; c++) {
        int batch[2] = {16, 16};
        memset(&sc[c], 0, sizeof sc[c]);
        dev_sync_weights(&sc[c], batch, 2);
        sc[c].codec = codecs[c].codec;
        sc[c].topk = codecs[c].topk;
        len[c] = dev_sync_payload_len(&sc[c], N, COLS);
        payload[c] = sl_xmalloc(len[c]);
        other[c] = sl_xmalloc(len[c]);
        sealed[c] = sl_xmalloc(len[c]);
    }
    dev_aead aead;
    if (dev_aead_init(&aead, &err))
        die("aead", &err);
    uint8_t key[DEV_AEAD_KEY_LEN] = {7}, nonce[DEV_AEAD_NONCE_LEN] = {0}, tag[DEV_AEAD_TAG_LEN];

    static double t_adamw[MAX_REPS], t_give[NC][MAX_REPS], t_comb[NC][MAX_REPS],
        t_seal[NC][MAX_REPS];
    for (int r = 0; r < reps; r++) {
        double t0 = cpu_s();
        kn_adamw_update(p, g, m, v, N, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, r + 1, 1.0f, NULL);
        t_adamw[r] = cpu_s() - t0;
        for (int c = 0; c < NC; c++) {
            int lossy = codecs[c].codec != DEV_CODEC_NONE;
            size_t k = dev_sync_k(&sc[c], N);
            t0 = cpu_s();
            for (size_t i = 0; lossy && i < N; i++)
                resid[i] += g[i];
            if (dev_codec_encode(sc[c].codec, lossy ? resid : g, N, COLS, k, NULL, payload[c],
                                 &err))
                die(codecs[c].name, &err);
            if (lossy && dev_codec_decode(sc[c].codec, payload[c], N, COLS, k, dec, &err))
                die(codecs[c].name, &err);
            for (size_t i = 0; lossy && i < N; i++)
                resid[i] -= dec[i];
            t_give[c][r] = cpu_s() - t0;
            memcpy(other[c], payload[c], len[c]);
            const uint8_t *both[2] = {payload[c], other[c]};
            t0 = cpu_s();
            if (dev_sync_combine(&sc[c], both, N, COLS, out, scratch, &err))
                die(codecs[c].name, &err);
            t_comb[c][r] = (cpu_s() - t0) / 2;
            t0 = cpu_s();
            if (dev_aead_seal(&aead, sealed[c], tag, payload[c], len[c], NULL, 0, nonce, key,
                              &err) ||
                dev_aead_open(&aead, other[c], sealed[c], len[c], tag, NULL, 0, nonce, key, &err))
                die("seal", &err);
            t_seal[c][r] = cpu_s() - t0;
        }
    }
    double adamw = bench_median(t_adamw, reps);
    printf("%zu parameters in rows of %d, process CPU, median of %d rounds\n\n", N,
           COLS, reps);
    printf("AdamW step: %.2f ns per parameter\n\n", adamw / (double)N * 1e9);
    printf("| codec | payload bytes per parameter | give ns/param | combine ns/param per payload "
           "| seal+open ns per payload byte |\n");
    printf("|---|---:|---:|---:|---:|\n");
    for (int c = 0; c < NC; c++) {
        double give = bench_median(t_give[c], reps), comb = bench_median(t_comb[c], reps),
               seal = bench_median(t_seal[c], reps);
        printf("| %s | %.4f | %.2f | %.2f | %.3f |\n", codecs[c].name, (double)len[c] / (double)N,
               give / (double)N * 1e9, comb / (double)N * 1e9, seal / (double)len[c] * 1e9);
    }
    dev_aead_free(&aead);
    return 0;
}
