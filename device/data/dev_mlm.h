/* dev_mlm.h - BERT's masked-language-model batches from a shard.
 *
 * For each sequence, k = max(1, round(p * n)) of its n non-special positions
 * (everything but [CLS], [SEP], [PAD]) are chosen uniformly; of those 80%
 * become [MASK], 10% a random id drawn uniformly from the whole vocabulary
 * (as BERT and Hugging Face do), 10% stay. Labels hold the original id at the
 * chosen positions and -100 elsewhere.
 *
 * Every draw comes from sl_rng keyed by (seed, epoch, global sequence index
 * first_seq + b), so a sequence is masked the same way whatever batch or
 * micro-batch it lands in, on any device. */
#ifndef DEV_MLM_H
#define DEV_MLM_H

#include <stdint.h>

#include "dev_shard.h"
#include "dev_vocab.h"
#include "sl_err.h"

#define DEV_MLM_IGNORE (-100)

typedef struct dev_mlm_batch {
    int B, T;
    int32_t *tokens;   /* (B,T) input ids after masking */
    int32_t *labels;   /* (B,T) original id at chosen positions, -100 elsewhere */
    int32_t *valid;    /* (B,T) 1 real token, 0 padding */
    int32_t *segments; /* (B,T) token type ids (0) */
} dev_mlm_batch;

int dev_mlm_batch_alloc(dev_mlm_batch *b, int B, int T);
void dev_mlm_batch_free(dev_mlm_batch *b);

/* Fills batch with sequences first_seq .. first_seq+B-1 (mod shard count),
 * masked with rng keyed by (seed, epoch, global sequence index). out->T must
 * equal the shard's T; vocab_size must cover the shard's ids. */
int dev_mlm_make_batch(const dev_shard *s, const dev_special *sp, int vocab_size, float mask_prob,
                       uint64_t seed, uint64_t epoch, uint64_t first_seq, dev_mlm_batch *out,
                       sl_err *err);

/* Fills row b with shard sequence seq[b], masked with rng keyed by (seed,
 * epoch[b], seq[b]) (a run's order: dev_order.h). A sequence past the shard
 * is an error. */
int dev_mlm_make_rows(const dev_shard *s, const dev_special *sp, int vocab_size, float mask_prob,
                      uint64_t seed, const uint64_t *seq, const uint64_t *epoch,
                      dev_mlm_batch *out, sl_err *err);

/* Masks one sequence in place (tok[0..len), the rest padding): the body
 * dev_mlm_make_batch runs per row. labels gets T entries. Returns the number
 * of positions chosen. */
int dev_mlm_mask_seq(int32_t *tok, int32_t *labels, int len, int T, const dev_special *sp,
                     int vocab_size, float mask_prob, uint64_t seed, uint64_t epoch,
                     uint64_t seq_index);

#endif
