/* dev_vocab.h - a BERT vocabulary: the standard vocab.txt, one token per
 * line, line number = id, "##" marking word-continuation pieces.
 *
 * Loading is strict: a missing or empty file, an empty line, a duplicate
 * token, invalid UTF-8 or no [UNK] is an error naming the file and line.
 * The vocabulary hash is BLAKE2b-256 over the tokens, each followed by '\n'
 * (so a CRLF file hashes like its LF twin); shards record it so a model is
 * never fed ids from another vocabulary. */
#ifndef DEV_VOCAB_H
#define DEV_VOCAB_H

#include <stddef.h>
#include <stdint.h>

#include "sl_err.h"

/* Longest token a vocabulary may hold, in bytes. */
#define DEV_VOCAB_MAX_TOKEN 1024
/* Largest vocabulary accepted (ids must fit the shard's 32-bit width). */
#define DEV_VOCAB_MAX_SIZE (1 << 24)

typedef struct dev_vocab dev_vocab;

dev_vocab *dev_vocab_load(const char *path, sl_err *err); /* standard vocab.txt */
/* The same from a buffer holding a vocab.txt image; `name` is used in messages. */
dev_vocab *dev_vocab_parse(const char *buf, size_t len, const char *name, sl_err *err);
void dev_vocab_free(dev_vocab *v);
int dev_vocab_size(const dev_vocab *v);
int dev_vocab_id(const dev_vocab *v, const char *token); /* -1 if absent */
const char *dev_vocab_token(const dev_vocab *v, int id); /* NULL if out of range */
void dev_vocab_hash(const dev_vocab *v, uint8_t out[32]); /* BLAKE2b-256 of the token list */

typedef struct dev_special {
    int pad, unk, cls, sep, mask; /* -1 when the vocabulary lacks the token */
} dev_special;
dev_special dev_vocab_special(const dev_vocab *v);

/* The canonical token list ("tok\n" per token) that the hash covers. */
const char *dev_vocab_text(const dev_vocab *v, size_t *len);

/* Lookup of a byte string (not NUL-terminated) as a word-initial token, and
 * of "##" + s as a continuation piece: -1 if absent. Used by WordPiece. */
int dev_vocab_find(const dev_vocab *v, const char *s, size_t n);
int dev_vocab_find_cont(const dev_vocab *v, const char *s, size_t n);
/* Longest word-initial token and longest continuation piece (without "##"), in bytes. */
void dev_vocab_max_len(const dev_vocab *v, size_t *initial, size_t *cont);

/* 64 hex digits + NUL. */
void dev_hash_hex(const uint8_t h[32], char out[65]);

#endif
