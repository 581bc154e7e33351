/* fuzz_exchange.c - libFuzzer target: what a device accepts on a Stage
 * Exchange stream (dev_exch.h), on the net of fuzz_exchange.h.
 *
 * The first byte chooses what the rest is:
 *   0  the first message of a stream, from the caller the second byte picks
 *      (A, B, C, or a device of no stage);
 *   1  a later message on the flow the second byte picks (a link, down or up);
 *   2  a hello built from the next bytes (this job or another, this epoch or
 *      another, stage indexes 0..6, a caller), so random inputs reach every
 *      check of dev_exch_hello_check;
 *   3  a valid frame of a direction from the next bytes on a flow, with its
 *      stages possibly swapped and one byte possibly changed.
 * Properties:
 *   - a hello is accepted only for a link the net has, that B serves, from
 *     the device of its first stage; every such hello is accepted;
 *   - an accepted hello is exactly the bytes dev_exch_hello_pack writes;
 *   - an accepted later message is a StageFrame holding exactly the frame
 *     returned, from and to the flow's stages, of a direction the flow may
 *     carry; every valid frame the flow may carry is accepted;
 *   - a refusal says why and has a reason;
 *   - no crash, no leak (ASan).
 * Built with -DFUZZ_EXCHANGE_SEEDS this file is `exchange_seeds DIR [--check]`:
 * it writes the seed corpus (tests/fuzz/corpus/exchange/: the hello of every
 * link and every frame each flow may carry, as the net sends them), and with
 * --check compares DIR with that (the test fuzz-seeds-exchange):
 *     build/tests/fuzz/exchange_seeds tests/fuzz/corpus/exchange */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev_exch.h"
#include "fuzz_exchange.h"
#include "rpc.h"
#include "sl_log.h"

#define REQUIRE(c) REQUIREF(c, "%s", "")
#define REQUIREF(c, ...)                                                                   \
    do {                                                                                   \
        if (!(c)) {                                                                        \
            fprintf(stderr, "fuzz_exchange: property failed at line %d: %s\n", __LINE__, #c); \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fputc('\n', stderr);                                                           \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

#define MSG_CAP 4096

static const char *const peers[] = {FX_A, FX_B, FX_C, "d00000000000000ff"};

static void check_hello(const dev_net_cfg *c, const char *peer, const uint8_t *msg, size_t len)
{
    dev_exch_hello h;
    sl_err err = {0};
    int r = dev_exch_hello_parse(msg, len, &h, &err);
    if (r) {
        REQUIRE(r == DEV_EXCH_NOT_HELLO && err.msg[0]);
        return;
    }
    rpc_buf again = {0};
    dev_exch_hello_pack(h.job, h.epoch, h.from, h.to, &again);
    REQUIRE(again.len == len && !memcmp(again.data, msg, len));
    rpc_buf_free(&again);
    int from = -2, to = -2;
    r = dev_exch_hello_check(c, peer, &h, &from, &to, &err);
    int link = h.from < FX_STAGES && h.to < FX_STAGES ? fx_link((int)h.from, (int)h.to) : -1;
    int ok = h.job == FX_JOB && h.epoch == FX_EPOCH && link >= 0 && fx_served[link] &&
             !strcmp(peer, fx_stage_dev[h.from]);
    REQUIREF(ok == (r == DEV_EXCH_OK), "hello %llx/%u %u-%u from %s: %d (%s)",
             (unsigned long long)h.job, h.epoch, h.from, h.to, peer, r, err.msg);
    if (r == DEV_EXCH_OK) {
        REQUIRE(from == (int)h.from && to == (int)h.to);
    } else {
        REQUIRE(from == -1 && to == -1 && err.msg[0]);
        REQUIRE(dev_exch_refusal_code(r) != RPC_OK);
    }
}

/* valid_dir: msg is a valid frame of that direction from and to the flow's
 * stages; -1: a valid frame between other stages; 0: anything. */
static void check_frame(int link, int down, const uint8_t *msg, size_t len, int valid_dir)
{
    int a = fx_links[link][0], b = fx_links[link][1];
    const uint8_t *fr = NULL;
    size_t n = 0;
    dev_frame_hdr h;
    sl_err err = {0};
    int r = dev_exch_frame(FX_STAGES, a, b, down, msg, len, &fr, &n, &h, &err);
    if (valid_dir < 0)
        REQUIREF(r != DEV_FR_OK, "a frame from stage %u to %u accepted %s link %d-%d",
                 h.from_stage, h.to_stage, down ? "down" : "up", a, b);
    if (valid_dir > 0)
        REQUIREF((r == DEV_FR_OK) == fx_may_carry(link, down, valid_dir),
                 "a valid %d frame %s link %d-%d: %d (%s)", valid_dir, down ? "down" : "up", a, b,
                 r, err.msg);
    if (r != DEV_FR_OK) {
        REQUIRE(r > 0 && r < DEV_FR_NREASONS && err.msg[0] && !fr && !n);
        return;
    }
    REQUIRE(fr && fr >= msg && fr + n == msg + len);
    uint8_t tag[11];
    size_t pre = rpc_frame_wrap(tag, n);
    REQUIRE(pre == len - n && !memcmp(tag, msg, pre));
    REQUIRE(fx_may_carry(link, down, h.direction));
    REQUIRE(h.from_stage == (down ? a : b) && h.to_stage == (down ? b : a));
    dev_frame_hdr again;
    REQUIRE(dev_frame_parse_header(fr, n, 0, &again, NULL, NULL) == 0 &&
            dev_frame_hdr_equal(&h, &again));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static dev_net_cfg c;
    if (!c.stages) {
        sl_log_set_level(SL_LOG_OFF);
        c = fx_cfg();
    }
    if (size < 2)
        return 0;
    const uint8_t *rest = data + 2;
    size_t nrest = size - 2;
    switch (data[0] % 4) {
    case 0:
        check_hello(&c, peers[data[1] % 4], rest, nrest);
        break;
    case 1:
        check_frame(data[1] % FX_NLINKS, data[1] / FX_NLINKS % 2, rest, nrest, 0);
        break;
    case 2: {
        if (nrest < 4)
            return 0;
        rpc_buf m = {0};
        dev_exch_hello_pack(rest[0] % 2 ? FX_JOB : FX_JOB ^ rest[0], rest[1] % 2 ? FX_EPOCH : rest[1],
                            rest[2] % 7, rest[3] % 7, &m);
        check_hello(&c, peers[data[1] % 4], m.data, m.len);
        rpc_buf_free(&m);
        break;
    }
    case 3: {
        if (nrest < 3)
            return 0;
        int link = data[1] % FX_NLINKS, down = data[1] / FX_NLINKS % 2, dir = 1 + rest[0] % 8;
        int a = fx_links[link][0], b = fx_links[link][1], swap = rest[1] & 1;
        int from = down != swap ? a : b, to = down != swap ? b : a;
        static uint8_t msg[MSG_CAP];
        size_t len = fx_frame_msg(from, to, dir, msg, sizeof msg);
        REQUIRE(len > 0);
        if (rest[1] & 2) {
            msg[rest[2] % len] ^= (uint8_t)(1 + (rest[1] >> 2));
            check_frame(link, down, msg, len, 0);
        } else {
            check_frame(link, down, msg, len, swap ? -1 : dir);
        }
        break;
    }
    }
    return 0;
}

#ifdef FUZZ_EXCHANGE_SEEDS
#include <errno.h>

static int nseeds, mismatches;

static void seed(const char *dir, int check, const char *name, uint8_t mode, uint8_t sel,
                 const uint8_t *body, size_t len)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    uint8_t *bytes = malloc(len + 2);
    REQUIRE(bytes);
    bytes[0] = mode;
    bytes[1] = sel;
    memcpy(bytes + 2, body, len);
    LLVMFuzzerTestOneInput(bytes, len + 2);
    nseeds++;
    if (check) {
        FILE *f = fopen(path, "rb");
        uint8_t *have = malloc(len + 3);
        size_t n = f && have ? fread(have, 1, len + 3, f) : 0;
        if (!f || n != len + 2 || memcmp(have, bytes, len + 2)) {
            fprintf(stderr, "exchange_seeds: %s differs from what it makes\n", path);
            mismatches++;
        }
        if (f)
            fclose(f);
        free(have);
    } else {
        FILE *f = fopen(path, "wb");
        REQUIREF(f && fwrite(bytes, 1, len + 2, f) == len + 2, "%s: %s", path, strerror(errno));
        fclose(f);
    }
    free(bytes);
}

int main(int argc, char **argv)
{
    if (argc < 2 || (argc == 3 && strcmp(argv[2], "--check")) || argc > 3) {
        fprintf(stderr, "usage: exchange_seeds DIR [--check]\n");
        return 2;
    }
    int check = argc == 3;
    static const char *const dir_names[] = {"?", "activation", "gradient", "mask", "labels",
                                            "tied", "gather", "gather-result", "abort"};
    char name[96];
    for (int i = 0; i < FX_NLINKS; i++) {
        int a = fx_links[i][0], b = fx_links[i][1];
        rpc_buf m = {0};
        dev_exch_hello_pack(FX_JOB, FX_EPOCH, (uint32_t)a, (uint32_t)b, &m);
        int peer = a == 0 ? 0 : a == 3 ? 2 : 1;
        snprintf(name, sizeof name, "hello-%d-%d", a, b);
        seed(argv[1], check, name, 0, (uint8_t)peer, m.data, m.len);
        rpc_buf_free(&m);
        for (int down = 0; down < 2; down++)
            for (int dir = DEV_DIR_ACTIVATION; dir <= DEV_DIR_GATHER_RESULT; dir++) {
                if (!fx_may_carry(i, down, dir))
                    continue;
                static uint8_t msg[MSG_CAP];
                size_t len = fx_frame_msg(down ? a : b, down ? b : a, dir, msg, sizeof msg);
                REQUIRE(len > 0);
                snprintf(name, sizeof name, "frame-%d-%d-%s-%s", a, b, down ? "down" : "up",
                         dir_names[dir]);
                seed(argv[1], check, name, 1, (uint8_t)(i + FX_NLINKS * down), msg, len);
            }
    }
    if (mismatches)
        fprintf(stderr, "exchange_seeds: write them again: exchange_seeds %s\n", argv[1]);
    else
        printf("%d seeds %s\n", nseeds, check ? "as committed" : "written");
    return mismatches ? 1 : 0;
}
#endif
