/* dev_tok.h - BERT's tokenizer: BasicTokenizer then WordPiece, as in
 * google-research/bert tokenization.py.
 *
 * BasicTokenizer: drop NUL, U+FFFD and control characters (Cc, Cf; tab, CR and
 * LF count as whitespace), treat whitespace (Zs, U+2028, U+2029) as word
 * breaks, make every CJK ideograph its own word; when uncased, lower-case and
 * strip accents (NFD, drop Mn); then split every punctuation character (ASCII
 * 33-47, 58-64, 91-96, 123-126 and Unicode P*) into its own word.
 * WordPiece: greedy longest-match-first with "##" continuation pieces; a
 * word of more than 100 characters, or one with no segmentation, is [UNK].
 *
 * Input must be valid UTF-8: invalid bytes are an error with the byte offset,
 * never silently replaced (a corpus with a broken encoding should be fixed,
 * not half-trained on). */
#ifndef DEV_TOK_H
#define DEV_TOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dev_vocab.h"
#include "sl_err.h"

#define DEV_TOK_MAX_WORD_CHARS 100

/* Offset of the first invalid UTF-8 byte in s[0..n), or n if all valid. */
size_t dev_utf8_check(const char *s, size_t n);

/* Receives each word the BasicTokenizer produces: UTF-8 bytes (normalised
 * when uncased) and its length in characters. When nchars exceeds
 * DEV_TOK_MAX_WORD_CHARS only the first bytes are passed (the word is [UNK]
 * anyway). Return non-zero to stop. */
typedef int (*dev_tok_word_fn)(void *ctx, const char *word, size_t len, int nchars);

/* Runs the BasicTokenizer over text[0..len). Returns 0, -1 on invalid UTF-8
 * (message "invalid UTF-8 at byte offset N") or the callback's non-zero. */
int dev_tok_basic(const char *text, size_t len, bool cased, dev_tok_word_fn fn, void *ctx,
                  sl_err *err);

/* A growable array of token ids. */
typedef struct dev_ids {
    int32_t *v;
    size_t n, cap;
} dev_ids;
void dev_ids_push(dev_ids *a, int32_t id);
void dev_ids_free(dev_ids *a);

/* WordPiece of one basic-tokenizer word: appends its pieces' ids (or unk). */
void dev_tok_wordpiece(const dev_vocab *v, const char *word, size_t len, int nchars, dev_ids *out);

/* Both stages: appends the ids of text[0..len) to out. */
int dev_tok_encode(const dev_vocab *v, bool cased, const char *text, size_t len, dev_ids *out,
                   sl_err *err);

/* BERT's decoding for display: tokens joined by spaces, " ##" removed.
 * Returns a malloc'd string. */
char *dev_tok_decode(const dev_vocab *v, const int32_t *ids, size_t n);

#endif
