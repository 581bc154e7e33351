/* dev_shard.h - token shards: one site's corpus as packed sequences.
 *
 * File layout (all integers little-endian; docs/data.md has the table):
 *   header (128 bytes): magic "SKYSHARD", version, header size, vocabulary
 *     hash, vocabulary size, sequence length T, sequence count N, document
 *     count D, token count, vocabulary bytes, token width (2 or 4), flags
 *     (bit 0: cased), the ids of [PAD] [UNK] [CLS] [SEP] [MASK], zeros
 *   u64 seq_start[N+1]   offset of each sequence in the token array
 *   u64 doc_start[D+1]   first sequence of each document
 *   the vocabulary       its vocab.txt image ("tok\n" per token), padded to 8
 *   tokens               token_count ids of token_width bytes, padded to 8
 *   BLAKE2b-256          of everything before it
 * A shard carries its vocabulary, so it is self-contained: training needs
 * only the shard and a model config whose vocab_size matches.
 *
 * Version 2 is a labelled shard (sequence classification): one example per
 * sequence and document ([CLS] text [SEP], cut to T), and
 *   header (160 bytes): version 1's, then the label count K (u32 at 116),
 *     the label vocabulary's bytes (u64 at 120) and its BLAKE2b-256 (at 128)
 *   the label vocabulary  its labels.txt image ("name\n" per label), padded
 *                         to 8, after the vocabulary
 *   u32 class[N]          each sequence's class, padded to 8, before the tokens
 * A shard without labels is written as version 1, byte for byte as before;
 * both versions are read.
 *
 * Opening memory-maps the file and checks everything before returning:
 * size against the header (truncated / trailing bytes), checksum, then every
 * offset and id (the special tokens: distinct, and named so in the stored
 * vocabulary), so later reads need no checks. */
#ifndef DEV_SHARD_H
#define DEV_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dev_labels.h"
#include "dev_vocab.h"
#include "sl_err.h"

#define DEV_SHARD_VERSION 1          /* without labels */
#define DEV_SHARD_VERSION_LABELLED 2 /* with a class per sequence */
#define DEV_SHARD_HEADER_BYTES 128
#define DEV_SHARD_HEADER_BYTES_LABELLED 160
#define DEV_SHARD_MAX_SEQ 65536

typedef struct dev_shard dev_shard;

dev_shard *dev_shard_open(const char *path, sl_err *err); /* mmap + full validation */
void dev_shard_close(dev_shard *s);
uint64_t dev_shard_count(const dev_shard *s);             /* sequences */
int dev_shard_seq_len(const dev_shard *s);                /* T */
void dev_shard_vocab_hash(const dev_shard *s, uint8_t out[32]);
/* The shard's own BLAKE2b-256 (its trailer, verified when opened): names
 * the exact file content, e.g. in a checkpoint's data.json. */
void dev_shard_checksum(const dev_shard *s, uint8_t out[32]);
int dev_shard_vocab_size(const dev_shard *s);
/* Copies sequence idx into tok[0..T), padding with pad id; returns its real
 * length, or -1 if idx >= count. */
int dev_shard_read(const dev_shard *s, uint64_t idx, int32_t *tok);

dev_special dev_shard_special(const dev_shard *s);
uint64_t dev_shard_doc_count(const dev_shard *s);
uint64_t dev_shard_doc_start(const dev_shard *s, uint64_t doc); /* first sequence of doc */
uint64_t dev_shard_token_count(const dev_shard *s);
bool dev_shard_cased(const dev_shard *s);
/* The vocabulary stored in the shard (caller frees). */
dev_vocab *dev_shard_vocab(const dev_shard *s, sl_err *err);
/* Refuses a shard made with another vocabulary than the model's: compares
 * hash and size, with a message naming both. */
int dev_shard_check_vocab(const dev_shard *s, const uint8_t hash[32], int vocab_size, sl_err *err);
int dev_shard_version(const dev_shard *s);
/* A labelled shard's label vocabulary (owned by the shard), NULL without. */
const dev_labels *dev_shard_labels(const dev_shard *s);
/* The class of sequence idx in a labelled shard; -1 without labels or if
 * idx >= count. */
int dev_shard_label(const dev_shard *s, uint64_t idx);

/* Building a shard: documents of sentences (already token ids) are packed
 * into sequences [CLS] ... [SEP] of at most T tokens; a sequence never
 * spans two documents; a sentence longer than T-2 is cut into pieces. */
typedef struct dev_shard_writer dev_shard_writer;
dev_shard_writer *dev_shard_writer_new(const dev_vocab *v, int seq_len, bool cased, sl_err *err);
/* A labelled shard (version 2) with the label vocabulary `labels`
 * (copied): it takes examples only (dev_shard_writer_example). */
dev_shard_writer *dev_shard_writer_labelled(const dev_vocab *v, int seq_len, bool cased,
                                            const dev_labels *labels, sl_err *err);
void dev_shard_writer_sentence(dev_shard_writer *w, const int32_t *ids, size_t n);
/* One example of a labelled shard: [CLS] ids [SEP] as a sequence and a
 * document of its own, the ids cut to T-2; `label` its class (< K).
 * Returns 1 if the ids were cut, else 0. */
int dev_shard_writer_example(dev_shard_writer *w, const int32_t *ids, size_t n, int label);
void dev_shard_writer_end_doc(dev_shard_writer *w);
uint64_t dev_shard_writer_count(const dev_shard_writer *w);
/* Ends the last document and writes the file atomically. */
int dev_shard_writer_finish(dev_shard_writer *w, const char *path, sl_err *err);
void dev_shard_writer_free(dev_shard_writer *w);

#endif
