/* dev_order.c - the run's sequence order (dev_order.h). */
#include "dev_order.h"

#include "sl_rng.h"

int dev_order_init(dev_order *o, uint64_t total, uint64_t first, uint64_t count, uint64_t seed,
                   int shuffle, sl_err *err)
{
    if (first >= total)
        return sl_err_set(err, SL_EINVAL, "first sequence %llu is past the end of the shard (%llu sequences)",
                          (unsigned long long)first, (unsigned long long)total);
    if (count == 0)
        count = total - first;
    if (count > total - first)
        return sl_err_set(err, SL_EINVAL, "sequences %llu..%llu run past the shard's %llu",
                          (unsigned long long)first, (unsigned long long)(first + count - 1),
                          (unsigned long long)total);
    o->first = first;
    o->count = count;
    o->seed = seed;
    o->shuffle = shuffle;
    return 0;
}

/* A bijection of [0, 4^h) for h half-bits: 4 Feistel rounds, each round key
 * a hash of (seed, epoch, round). */
static uint64_t feistel(uint64_t x, int h, uint64_t key)
{
    uint64_t mask = (h >= 32) ? 0xffffffffull : ((1ull << h) - 1);
    uint64_t l = x >> h, r = x & mask;
    for (uint64_t round = 0; round < 4; round++) {
        uint64_t f = sl_rng_stream(sl_rng_stream(key, round), r) & mask;
        uint64_t t = l ^ f;
        l = r;
        r = t;
    }
    return (l << h) | r;
}

uint64_t dev_order_seq(const dev_order *o, uint64_t g, uint64_t *epoch)
{
    uint64_t e = g / o->count, i = g % o->count;
    if (epoch)
        *epoch = e;
    if (!o->shuffle || o->count < 2)
        return o->first + i;
    int h = 1; /* the smallest 4^h >= count: at most 4x too big, so the walk below
                * takes under 4 rounds on average */
    while (h < 32 && (1ull << (2 * h)) < o->count)
        h++;
    uint64_t key = sl_rng_stream(sl_rng_stream(o->seed, 0x5e9u), e);
    do /* cycle walking: a permutation's orbit from i returns into [0, count) */
        i = feistel(i, h, key);
    while (i >= o->count);
    return o->first + i;
}
