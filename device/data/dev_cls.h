/* dev_cls.h - sequence-classification batches from a labelled shard.
 *
 * Row b is shard sequence seq[b] as it is stored ([CLS] text [SEP], then
 * padding, which `valid` marks), segments 0, and labels -100 everywhere but
 * position 0, which holds the sequence's class: the head reads the class
 * there, and a pipeline carries it with the labels as it carries masked
 * positions. Nothing is drawn: no masking, no randomness. */
#ifndef DEV_CLS_H
#define DEV_CLS_H

#include <stdint.h>

#include "dev_mlm.h"
#include "dev_shard.h"
#include "sl_err.h"

/* out->T must be the shard's T; the shard must have labels, and seq[b] be
 * inside it. */
int dev_cls_make_rows(const dev_shard *s, const uint64_t *seq, dev_mlm_batch *out, sl_err *err);

#endif
