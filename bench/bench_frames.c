/* bench_frames - single-thread throughput of the frame codecs and of
 * sealing/opening on one 4 MiB activation tensor (8 x 128 x 1024 f32), and
 * the bytes each codec puts on the wire; then the cost per frame of the
 * small side frames (mask, labels, gather, abort). Prints Markdown tables;
 * every time is the median of REPS runs. Throughput is in MB/s of the f32
 * tensor (4.19 MB), whatever the codec, so rows compare directly.
 *
 *   bench_frames [reps]      (default 15, at most 64) */
#include <openssl/crypto.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "dev_aead.h"
#include "dev_codec.h"
#include "dev_frame.h"
#include "sl_mem.h"
#include "sl_rng.h"
#include "sl_time.h"

#define D0 8
#define D1 128
#define D2 1024
#define N ((size_t)D0 * D1 * D2)
#define MAX_REPS 64

static double mbps(double seconds)
{
    return (double)(N * sizeof(float)) / seconds / 1e6;
}

static void die(const char *what, const sl_err *err)
{
    fprintf(stderr, "bench_frames: %s: %s\n", what, err->msg);
    exit(1);
}

/* The side frames a stage sends per micro-batch or per step: microseconds
 * per sealed frame, where the fixed costs (two BLAKE2b, HChaCha20, Poly1305
 * set-up) dominate. */
static void small_frames(int reps, const dev_kx_keypair *ka, const dev_kx_keypair *kb,
                         uint8_t *wire, size_t cap, uint8_t *out)
{
    enum { FRAMES = 2000 };
    static const char reason[] = "stage 2 stopped: CUDA out of memory in the attention backward";
    static const struct {
        const char *name;
        uint8_t dir, dtype, ndim;
        uint32_t dims[2];
    } kinds[] = {
        {"mask 8 x 128 i32", DEV_DIR_MASK, DEV_DTYPE_I32, 2, {D0, D1}},
        {"labels 8 x 128 i32", DEV_DIR_LABELS, DEV_DTYPE_I32, 2, {D0, D1}},
        {"gather 4 f64", DEV_DIR_GATHER, DEV_DTYPE_F64, 1, {4}},
        {"abort, 61-byte reason", DEV_DIR_ABORT, DEV_DTYPE_U8, 1, {sizeof(reason) - 1}},
    };
    enum { KINDS = sizeof(kinds) / sizeof(kinds[0]) };
    static double t[KINDS][2][MAX_REPS];
    static int32_t ints[D0 * D1];
    double doubles[4] = {2.5, 1e-3, 7.0, 0.0};
    size_t wire_len[KINDS] = {0};
    sl_err err;
    for (int i = 0; i < D0 * D1; i++)
        ints[i] = i % 7 ? i : -100;
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < KINDS; k++) {
            dev_link_cfg cfg = {.job_id = 1, .epoch = (uint32_t)r + 1, .from_stage = 0,
                                .to_stage = 1, .sealed = 1};
            dev_link_tx tx;
            dev_link_rx rx;
            if (dev_link_tx_init(&tx, &cfg, ka, kb->pk, &err) < 0 ||
                dev_link_rx_init(&rx, &cfg, kb, ka->pk, &err) < 0)
                die("link", &err);
            const void *data = kinds[k].dtype == DEV_DTYPE_I32   ? (const void *)ints
                             : kinds[k].dtype == DEV_DTYPE_F64 ? (const void *)doubles
                                                               : (const void *)reason;
            double enc = 0, dec = 0;
            for (int f = 0; f < FRAMES; f++) {
                dev_frame_hdr h = {.direction = kinds[k].dir, .dtype = kinds[k].dtype,
                                   .ndim = kinds[k].ndim, .dims = {kinds[k].dims[0], kinds[k].dims[1]},
                                   .step = (uint64_t)f};
                uint64_t t0 = sl_now_ns();
                if (dev_frame_encode_any(&tx, &h, data, NULL, wire, cap, &wire_len[k], &err) < 0)
                    die("encode", &err);
                uint64_t t1 = sl_now_ns();
                if (dev_frame_decode_any(&rx, wire, wire_len[k], &h, out, cap, &err) < 0)
                    die("decode", &err);
                uint64_t t2 = sl_now_ns();
                enc += (double)(t1 - t0);
                dec += (double)(t2 - t1);
            }
            t[k][0][r] = enc * 1e-3 / FRAMES;
            t[k][1][r] = dec * 1e-3 / FRAMES;
            dev_link_tx_free(&tx);
            dev_link_rx_free(&rx);
        }
    printf("\nsmall sealed frames, microseconds per frame (median of %d runs of %d frames)\n\n",
           reps, FRAMES);
    printf("| frame | wire bytes | encode+seal us | open+decode us |\n|---|---:|---:|---:|\n");
    for (int k = 0; k < KINDS; k++)
        printf("| %s | %zu | %.2f | %.2f |\n", kinds[k].name, wire_len[k],
               bench_median(t[k][0], reps), bench_median(t[k][1], reps));
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 15;
    if (reps < 1 || reps > MAX_REPS)
        reps = 15;
    float *x = sl_xaligned_alloc(N * sizeof(float)), *y = sl_xaligned_alloc(N * sizeof(float));
    for (size_t i = 0; i < N; i++)
        x[i] = sl_rng_normal(1, 2, i);
    size_t cap = DEV_FRAME_HDR_LEN + N * sizeof(float) + DEV_FRAME_TAG_LEN;
    uint8_t *wire = sl_xaligned_alloc(cap), *payload = sl_xaligned_alloc(cap);
    sl_err err;

    dev_kx_keypair ka, kb;
    uint8_t seed[32] = {1};
    if (dev_kx_keypair_from_seed(&ka, seed, &err) < 0)
        die("keys", &err);
    seed[0] = 2;
    if (dev_kx_keypair_from_seed(&kb, seed, &err) < 0)
        die("keys", &err);

    /* Per codec: a plain and a sealed link and its topk state. The repetitions
     * are the outer loop, so a burst of load elsewhere on the machine hits
     * every codec alike and the ratios between rows stay fair. */
    enum { M_ENC, M_DEC, M_SEAL, M_OPEN, M_PENC, M_PDEC, M_COUNT };
    static double t[DEV_CODEC_COUNT][M_COUNT][MAX_REPS];
    dev_link_tx tx[DEV_CODEC_COUNT][2];
    dev_link_rx rx[DEV_CODEC_COUNT][2];
    dev_topk_ef ef;
    size_t wire_len[DEV_CODEC_COUNT] = {0};
    if (dev_topk_ef_init(&ef, N, &err) < 0)
        die("topk state", &err);
    for (int codec = 0; codec < DEV_CODEC_COUNT; codec++)
        for (int sealed = 0; sealed <= 1; sealed++) {
            dev_link_cfg cfg = {.job_id = 1, .epoch = 1, .from_stage = 0, .to_stage = 1,
                                .sealed = sealed};
            if (dev_link_tx_init(&tx[codec][sealed], &cfg, &ka, kb.pk, &err) < 0 ||
                dev_link_rx_init(&rx[codec][sealed], &cfg, &kb, ka.pk, &err) < 0)
                die("link", &err);
        }
    for (int r = 0; r < reps; r++) {
        for (int codec = 0; codec < DEV_CODEC_COUNT; codec++) {
            int dir = codec == DEV_CODEC_TOPK ? DEV_DIR_GRADIENT : DEV_DIR_ACTIVATION;
            uint32_t k = codec == DEV_CODEC_TOPK ? (uint32_t)dev_topk_k(N, 0.01) : 0;
            dev_topk_ef *efp = codec == DEV_CODEC_TOPK ? &ef : NULL;
            uint64_t t0 = sl_now_ns();
            if (dev_codec_encode(codec, x, N, D2, k, efp, payload, &err) < 0)
                die("codec encode", &err);
            uint64_t t1 = sl_now_ns();
            if (dev_codec_decode(codec, payload, N, D2, k, y, &err) < 0)
                die("codec decode", &err);
            uint64_t t2 = sl_now_ns();
            t[codec][M_ENC][r] = (double)(t1 - t0) * 1e-9;
            t[codec][M_DEC][r] = (double)(t2 - t1) * 1e-9;
            for (int sealed = 0; sealed <= 1; sealed++) {
                dev_frame_hdr h = {.direction = (uint8_t)dir, .codec = (uint8_t)codec, .ndim = 3,
                                   .dims = {D0, D1, D2}, .k = k};
                t0 = sl_now_ns();
                if (dev_frame_encode(&tx[codec][sealed], &h, x, efp, wire, cap, &wire_len[codec],
                                     &err) < 0)
                    die("encode", &err);
                t1 = sl_now_ns();
                if (dev_frame_decode(&rx[codec][sealed], wire, wire_len[codec], &h, y, N, &err) < 0)
                    die("decode", &err);
                t2 = sl_now_ns();
                t[codec][sealed ? M_SEAL : M_PENC][r] = (double)(t1 - t0) * 1e-9;
                t[codec][sealed ? M_OPEN : M_PDEC][r] = (double)(t2 - t1) * 1e-9;
            }
        }
    }
    printf("tensor %d x %d x %d f32 (%.2f MB), single thread, median of %d runs\n\n", D0, D1, D2,
           N * sizeof(float) / 1e6, reps);
    printf("| codec | wire bytes | vs none | encode MB/s | decode MB/s | frame+seal MB/s | "
           "open+frame MB/s | plain frame MB/s (enc / dec) |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int codec = 0; codec < DEV_CODEC_COUNT; codec++) {
        printf("| %s%s | %zu | %.2fx | %.0f | %.0f | %.0f | %.0f | %.0f / %.0f |\n",
               dev_codec_name(codec), codec == DEV_CODEC_TOPK ? " 1%" : "", wire_len[codec],
               (double)wire_len[DEV_CODEC_NONE] / (double)wire_len[codec],
               mbps(bench_median(t[codec][M_ENC], reps)), mbps(bench_median(t[codec][M_DEC], reps)),
               mbps(bench_median(t[codec][M_SEAL], reps)), mbps(bench_median(t[codec][M_OPEN], reps)),
               mbps(bench_median(t[codec][M_PENC], reps)), mbps(bench_median(t[codec][M_PDEC], reps)));
        for (int sealed = 0; sealed <= 1; sealed++) {
            dev_link_tx_free(&tx[codec][sealed]);
            dev_link_rx_free(&rx[codec][sealed]);
        }
    }
    dev_topk_ef_free(&ef);

    /* The AEAD alone on 4 MiB, for reference: dev_aead (what frames use:
     * OpenSSL's ChaCha20-Poly1305 under an HChaCha20 subkey) and libsodium's
     * XChaCha20-Poly1305, the same construction, interleaved per run. */
    uint8_t key[32] = {3}, nonce[24] = {0}, tag[16];
    double t_aead[2][2][MAX_REPS]; /* [dev_aead, libsodium][seal, open] */
    dev_aead aead;
    if (dev_aead_init(&aead, &err) < 0)
        die("aead", &err);
    memcpy(payload, x, N * sizeof(float));
    for (int r = 0; r < reps; r++) {
        nonce[0] = (uint8_t)r;
        for (int lib = 0; lib < 2; lib++) {
            int bad;
            uint64_t t0 = sl_now_ns(), t1, t2;
            if (lib == 0) {
                if (dev_aead_seal(&aead, payload, tag, payload, N * sizeof(float), wire,
                                  DEV_FRAME_FIELDS_LEN, nonce, key, &err) < 0)
                    die("seal", &err);
                t1 = sl_now_ns();
                bad = dev_aead_open(&aead, payload, payload, N * sizeof(float), tag, wire,
                                    DEV_FRAME_FIELDS_LEN, nonce, key, &err) != 0;
            } else {
                crypto_aead_xchacha20poly1305_ietf_encrypt_detached(
                    payload, tag, NULL, payload, N * sizeof(float), wire, DEV_FRAME_FIELDS_LEN,
                    NULL, nonce, key);
                t1 = sl_now_ns();
                bad = crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
                          payload, NULL, payload, N * sizeof(float), tag, wire,
                          DEV_FRAME_FIELDS_LEN, nonce, key) != 0;
            }
            t2 = sl_now_ns();
            if (bad) {
                fprintf(stderr, "bench_frames: AEAD self-check failed\n");
                return 1;
            }
            t_aead[lib][0][r] = (double)(t1 - t0) * 1e-9;
            t_aead[lib][1][r] = (double)(t2 - t1) * 1e-9;
        }
    }
    dev_aead_free(&aead);
    printf("\nXChaCha20-Poly1305 alone on 4 MiB: dev_aead (%s) seal %.0f MB/s, open %.0f MB/s; "
           "libsodium %s seal %.0f MB/s, open %.0f MB/s\n",
           OpenSSL_version(OPENSSL_VERSION), mbps(bench_median(t_aead[0][0], reps)),
           mbps(bench_median(t_aead[0][1], reps)), sodium_version_string(),
           mbps(bench_median(t_aead[1][0], reps)), mbps(bench_median(t_aead[1][1], reps)));
    small_frames(reps, &ka, &kb, wire, cap, payload);
    sl_aligned_free(x);
    sl_aligned_free(y);
    sl_aligned_free(wire);
    sl_aligned_free(payload);
    return 0;
}
