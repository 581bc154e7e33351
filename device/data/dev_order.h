/* dev_order.h - which shard sequence a training run reads at each position.
 *
 * A run trains on sequences [first, first + count) of a shard. Its position g
 * (step s reads positions (s-1)B .. sB-1) lies in epoch e = g / count at
 * offset i = g % count, and reads sequence
 *     first + (shuffle ? perm(seed, e, i) : i)
 * where perm(seed, e, .) is a bijection of [0, count): a new order every
 * epoch, the same for the same seed. It is computed, not stored (a keyed
 * Feistel network over the next power of four, walked until it lands inside
 * the range), so it takes no memory for any shard size, and any position can
 * be found alone: a resumed run, or a data-owning site of a pipeline, reads
 * exactly what an uninterrupted run would. */
#ifndef DEV_ORDER_H
#define DEV_ORDER_H

#include <stdint.h>

#include "sl_err.h"

typedef struct dev_order {
    uint64_t first, count; /* the range of shard sequences */
    uint64_t seed;
    int shuffle;
} dev_order;

/* Checks the range against a shard of `total` sequences (count 0 = to the
 * end) and fills *o. */
int dev_order_init(dev_order *o, uint64_t total, uint64_t first, uint64_t count, uint64_t seed,
                   int shuffle, sl_err *err);
/* The shard sequence at run position g; *epoch gets g / count. */
uint64_t dev_order_seq(const dev_order *o, uint64_t g, uint64_t *epoch);

#endif
