/* fuzz_exchange.h - the net that fuzz_exchange.c and test_dev_exch.c check
 * Exchange messages against, and valid messages on it.
 *
 * Five stages on three devices, read by device B:
 *   stage   0  1  2  3  4
 *   device  A  B  B  C  B
 * Links 0-1, 1-2, 2-3, 3-4 and the side link 0-4. B serves 0-1 (A calls),
 * 3-4 (C calls) and 0-4 (A calls); 1-2 is within B; B calls C for 2-3.
 * fx_links and fx_served say so independently of dev_exch. */
#ifndef FUZZ_EXCHANGE_H
#define FUZZ_EXCHANGE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev_exch.h"
#include "dev_frame.h"
#include "dev_net.h"

#define FX_JOB 0x1234abcd5678ef01ull
#define FX_EPOCH 3u
#define FX_STAGES 5
#define FX_A "d00000000000000a1"
#define FX_B "d00000000000000b2"
#define FX_C "d00000000000000c3"

static const char *const fx_stage_dev[FX_STAGES] = {FX_A, FX_B, FX_B, FX_C, FX_B};
/* the links of the net: a, b */
static const int fx_links[][2] = {{0, 1}, {1, 2}, {2, 3}, {3, 4}, {0, 4}};
enum { FX_NLINKS = 5 };
/* 1 where B serves fx_links[i] */
static const int fx_served[FX_NLINKS] = {1, 0, 0, 1, 1};

static dev_net_stage fx_stages[FX_STAGES];

static inline dev_net_cfg fx_cfg(void)
{
    for (int i = 0; i < FX_STAGES; i++)
        snprintf(fx_stages[i].device, sizeof fx_stages[i].device, "%s", fx_stage_dev[i]);
    dev_net_cfg c = {.job = FX_JOB, .epoch = FX_EPOCH, .stages = FX_STAGES, .stage = fx_stages,
                     .self_id = FX_B, .depth = 1};
    return c;
}

/* The index in fx_links of a-b, or -1. */
static inline int fx_link(int a, int b)
{
    for (int i = 0; i < FX_NLINKS; i++)
        if (fx_links[i][0] == a && fx_links[i][1] == b)
            return i;
    return -1;
}

/* What each flow may carry, from dev_net's port calls: the chain's links
 * (i-(i+1)) activations, masks and the gather down, gradients and the
 * gather's result up; the side link (0-4) labels down, tied gradients
 * both ways. */
static inline int fx_may_carry(int link, int down, int dir)
{
    int side = link == 4;
    switch (dir) {
    case DEV_DIR_ACTIVATION:
    case DEV_DIR_MASK:
    case DEV_DIR_GATHER: return !side && down;
    case DEV_DIR_GRADIENT:
    case DEV_DIR_GATHER_RESULT: return !side && !down;
    case DEV_DIR_LABELS: return side && down;
    case DEV_DIR_TIED: return side;
    default: return 0;
    }
}

static inline int fx_dtype(int dir)
{
    switch (dir) {
    case DEV_DIR_MASK:
    case DEV_DIR_LABELS: return DEV_DTYPE_I32;
    case DEV_DIR_GATHER:
    case DEV_DIR_GATHER_RESULT: return DEV_DTYPE_F64;
    case DEV_DIR_ABORT: return DEV_DTYPE_U8;
    default: return DEV_DTYPE_F32;
    }
}

/* A plain frame of direction dir from stage `from` to `to` of the job, in a
 * StageFrame as dev_net sends it, into out (cap bytes). Its length, or 0. */
static inline size_t fx_frame_msg(int from, int to, int dir, uint8_t *out, size_t cap)
{
    sl_err err = {0};
    dev_link_cfg lc = {.job_id = FX_JOB, .epoch = FX_EPOCH, .from_stage = (uint16_t)from,
                       .to_stage = (uint16_t)to};
    dev_link_tx tx;
    if (dev_link_tx_init(&tx, &lc, NULL, NULL, &err))
        return 0;
    static const char text[] = "stage 1 stopped";
    float f[4] = {0.5f, -1.0f, 2.0f, 0.25f};
    int32_t i32[4] = {1, 2, 3, -100};
    double f64[4] = {1.5, 2.5, 0.0, -1.0};
    dev_frame_hdr h = {.direction = (uint8_t)dir, .codec = DEV_CODEC_NONE,
                       .dtype = (uint8_t)fx_dtype(dir), .step = 7, .ndim = 1, .dims = {4}};
    const void *data = f;
    if (h.dtype == DEV_DTYPE_I32)
        data = i32;
    else if (h.dtype == DEV_DTYPE_F64)
        data = f64;
    else if (h.dtype == DEV_DTYPE_U8)
        data = text, h.dims[0] = sizeof text - 1;
    if (dir == DEV_DIR_LABELS || dir == DEV_DIR_GATHER)
        h.aux = 1;
    uint8_t tag[11];
    size_t len = 0;
    if (cap < sizeof tag ||
        dev_frame_encode_any(&tx, &h, data, NULL, out + sizeof tag, cap - sizeof tag, &len, &err)) {
        dev_link_tx_free(&tx);
        return 0;
    }
    dev_link_tx_free(&tx);
    size_t pre = rpc_frame_wrap(tag, len);
    memmove(out + pre, out + sizeof tag, len);
    memcpy(out, tag, pre);
    return pre + len;
}

#endif
