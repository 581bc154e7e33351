/* dev_sync.h - how a stage runner (dev_pipe.h) reaches the same tensors in
 * the other replicas of a federation (docs/federation.md).
 *
 * A federation trains one model as R replicas, each a pipeline of its own
 * around its data owner, each cut as it likes. Replicas meet only here:
 *
 *   reduce these named tensors across the replicas, weighted, in replica
 *   order, and put the result into every replica's buffer.
 *
 * Tensors are matched by NAME (dev_tensor.name, ours: the fused qkv), never
 * by stage: a stage of replica 0 holding units 0..2 reduces with whichever
 * stages of replica 1 hold those tensors, whatever their cuts. The head's
 * copy of the word embeddings (DEV_T_TIED) goes by the embeddings' name and
 * only receives: in every replica the stage holding unit 0 gives that
 * tensor's contribution, and both copies get the result.
 *
 * One round (a step's gradients under --sync step, an outer step under
 * --sync outer:H; `round` is that step's number): every participant (each
 * stage of each replica) calls reduce once, with every tensor it holds.
 * For each tensor it gives
 *   - its replica's contribution as a codec payload (dev_codec.h: the
 *     federation's codec over n floats in rows of `cols`, exactly
 *     dev_codec_payload_len bytes), or NULL when it only receives;
 *   - `out`, n floats that receive the result
 *         out[i] = (float) sum_{r = 0..R-1} w_r * decode(payload_r)[i]
 *     summed in double, r ascending (dev_sync_combine).
 * Every participant computes the sum itself from all R payloads, in replica
 * order, with dev_sync_combine: the result's bits depend neither on who
 * finished first nor on the order payloads arrived in, and every replica
 * holds the same bytes.
 *
 * Who sends what to whom (a port over the network, one stage per device):
 * the device that gives replica r's payload of tensor X sends it to every
 * device holding X in each other replica (the tied copy's holder included),
 * and receives theirs from the devices giving X in the other replicas; once
 * it holds all R payloads of each of its tensors it combines them. Nothing
 * is summed on the way (no reduce tree, no coordinator): bytes out per
 * holder per round are (R - 1) payloads of each tensor it gives, and a
 * receive-only holder sends nothing. Payloads are what dev_codec encodes,
 * so they may travel as the frames' tensors (dev_frame.h) on the replicas'
 * sealed links. A round's messages are tagged with (round, tensor name,
 * replica); a port must refuse a payload of another length than
 * dev_codec_payload_len or one that does not decode (dev_sync_combine
 * refuses it and the round fails).
 *
 * Calls block until the round is complete. A failed call returns -1 with
 * err set; after any failure, or abort from another thread, every blocked
 * and later call fails too (as dev_port does), so no replica waits forever
 * for another that is gone. */
#ifndef DEV_SYNC_H
#define DEV_SYNC_H

#include <stddef.h>
#include <stdint.h>

#include "sl_err.h"

#define DEV_SYNC_MAX_REPLICAS 16

/* What every participant of a federation agrees on. */
typedef struct dev_sync_cfg {
    int replicas;                          /* R */
    double weight[DEV_SYNC_MAX_REPLICAS];  /* w_r = b_r / sum(b): each owner's sequences per step */
    int batch[DEV_SYNC_MAX_REPLICAS];      /* b_r */
    int codec;                             /* enum dev_codec of the payloads */
    double topk;                           /* topk: the fraction of each tensor sent */
    /* An owner away: replica r gives nothing to the rounds away_from[r] ..
     * away_to[r] (0 .. 0: it is never away); the rounds average the
     * replicas present, each weighted b_r / (the present ones' sum of b). */
    uint64_t away_from[DEV_SYNC_MAX_REPLICAS], away_to[DEV_SYNC_MAX_REPLICAS];
} dev_sync_cfg;

/* The weights of owner batches b[0..R): b_r / sum(b), in double. */
void dev_sync_weights(dev_sync_cfg *c, const int *batch, int replicas);
/* 1 if replica r gives its payloads to round `round`. */
int dev_sync_present(const dev_sync_cfg *c, int r, uint64_t round);
/* The weights of round `round`: those of the replicas present, renormalised
 * over them (0 for the others); with every replica present, c->weight. */
void dev_sync_round_weights(const dev_sync_cfg *c, uint64_t round, double *w);
/* Elements a topk payload of n floats holds (0 for other codecs). */
size_t dev_sync_k(const dev_sync_cfg *c, size_t n);
/* Bytes of one payload of n floats in rows of cols. */
size_t dev_sync_payload_len(const dev_sync_cfg *c, size_t n, size_t cols);
/* out[0..n) = (float) sum_r w_r * decode(payload[r])[i] in double, r
 * ascending, over the replicas whose payload is not NULL (an owner away:
 * c->weight must then be the round's, dev_sync_round_weights); scratch
 * holds R * n floats. Refuses a payload that does not decode (naming its
 * replica). The one definition of a reduce's result. */
int dev_sync_combine(const dev_sync_cfg *c, const uint8_t *const *payload, size_t n, size_t cols,
                     float *out, float *scratch, sl_err *err);

typedef struct dev_sync_tensor {
    const char *name;       /* the tensor's name (the tied copy: the word embeddings') */
    size_t n, cols;         /* elements, and the row length the codec's rows follow */
    const uint8_t *payload; /* this replica's contribution; NULL: receive only */
    float *out;             /* n floats: the result */
} dev_sync_tensor;

typedef struct dev_sync dev_sync;

typedef struct dev_sync_ops {
    /* One round: t[0..n) are every tensor this participant holds. */
    int (*reduce)(dev_sync *s, uint64_t round, const dev_sync_tensor *t, int n, sl_err *err);
    /* Makes every blocked and later call fail with `why`. */
    void (*abort)(dev_sync *s, const char *why);
    void (*free)(dev_sync *s);
} dev_sync_ops;

struct dev_sync {
    const dev_sync_ops *ops;
    dev_sync_cfg c;
    int replica, stage; /* this participant: a stage of one replica */
};

static inline void dev_sync_abort(dev_sync *s, const char *why)
{
    if (s)
        s->ops->abort(s, why);
}
static inline void dev_sync_free(dev_sync *s)
{
    if (s)
        s->ops->free(s);
}

/* ---- in process: every replica's stages on threads of this process ---- */

typedef struct dev_sync_hub dev_sync_hub;

/* stages[r]: the participants (stages) of replica r. */
dev_sync_hub *dev_sync_hub_create(const dev_sync_cfg *c, const int *stages, sl_err *err);
/* Stage i of replica r (owned by the hub; dev_sync_free does nothing). */
dev_sync *dev_sync_hub_member(dev_sync_hub *h, int replica, int stage);
/* Clears an abort and a round left halfway: the next round can run. */
void dev_sync_hub_reset(dev_sync_hub *h);
void dev_sync_hub_free(dev_sync_hub *h);

#endif
