/* dev_vocab_build.h - learning a WordPiece vocabulary from a corpus.
 *
 * Words come from BERT's BasicTokenizer (so the vocabulary matches what the
 * tokenizer will look up). Each word starts as its characters, the first as
 * itself and the rest as "##c" pieces; then the most frequent adjacent pair is
 * merged, again and again, until the vocabulary has `size` tokens or no pair
 * occurs min_freq times. This is the procedure Hugging Face's WordPiece
 * trainer uses (BPE merges written in WordPiece form); ties break on the
 * smaller symbol ids, so the result is a pure function of the word counts.
 *
 * Layout: with size >= DEV_VOCAB_BERT_LAYOUT_MIN, BERT's: [PAD]=0,
 * [unused0..98]=1..99, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103; below it
 * a compact one: [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4. Then the alphabet
 * (word-initial characters by code point, then "##" characters), then merges
 * in the order learned. */
#ifndef DEV_VOCAB_BUILD_H
#define DEV_VOCAB_BUILD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sl_err.h"

#define DEV_VOCAB_BERT_LAYOUT_MIN 1000

typedef struct dev_wordcount dev_wordcount;

dev_wordcount *dev_wordcount_new(bool cased);
void dev_wordcount_free(dev_wordcount *wc);
/* Adds the words of text[0..len) (invalid UTF-8 is an error with its offset). */
int dev_wordcount_add(dev_wordcount *wc, const char *text, size_t len, sl_err *err);
size_t dev_wordcount_unique(const dev_wordcount *wc);

typedef struct dev_vocab_learned {
    char *text;  /* vocab.txt image: "token\n" per token (malloc'd) */
    size_t len;
    int ntokens;
    int alphabet;    /* characters kept */
    int dropped_chars; /* rare characters left out because size was too small */
} dev_vocab_learned;

/* size: wanted vocabulary size (at least 5 + a useful alphabet). */
int dev_vocab_learn(const dev_wordcount *wc, int size, int min_freq, dev_vocab_learned *out,
                    sl_err *err);

#endif
