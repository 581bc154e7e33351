/* data_gen.h - generated English-like text and temporary files for the data
 * tests, so they run without the demo corpus. */
#ifndef DATA_GEN_H
#define DATA_GEN_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dev_shard.h"
#include "dev_tok.h"
#include "dev_vocab.h"
#include "dev_vocab_build.h"
#include "sl_mem.h"
#include "sl_rng.h"

/* ndocs documents of 1-6 lines of words made of syllables, blank line
 * between documents. A pure function of seed. Caller frees. */
static inline char *gen_corpus(uint64_t seed, int ndocs, size_t *len)
{
    static const char *const syl[] = {"the", "ka", "ro", "mi", "ten", "sha", "lo", "ver", "qu",
                                      "ing", "ed", "an", "Zu", "str", "o", "pe", "\xc3\xa9l",
                                      "na\xc3\xafve", "x", "y"};
    static const char *const punct[] = {".", "!", "?", ",", "'s", ";"};
    size_t cap = 1 << 16, n = 0;
    char *s = sl_xmalloc(cap);
    uint64_t k = 0;
    for (int d = 0; d < ndocs; d++) {
        int lines = 1 + (int)(sl_rng_u32(seed, 1, k++) % 6);
        for (int l = 0; l < lines; l++) {
            int words = 3 + (int)(sl_rng_u32(seed, 1, k++) % 14);
            for (int w = 0; w < words; w++) {
                int ns = 1 + (int)(sl_rng_u32(seed, 1, k++) % 3);
                if (n + 64 > cap)
                    s = sl_xrealloc(s, cap *= 2);
                for (int q = 0; q < ns; q++) {
                    const char *p = syl[sl_rng_u32(seed, 1, k++) % 20];
                    size_t pl = strlen(p);
                    memcpy(s + n, p, pl);
                    n += pl;
                }
                s[n++] = w + 1 < words ? ' ' : 0;
                if (w + 1 == words) {
                    n--;
                    const char *p = punct[sl_rng_u32(seed, 1, k++) % 6];
                    memcpy(s + n, p, strlen(p));
                    n += strlen(p);
                }
            }
            s[n++] = '\n';
        }
        s[n++] = '\n';
    }
    s[n] = '\0';
    *len = n;
    return s;
}

static char tmp_dir[64];


static inline const char *tmp_path(const char *name)
{
    static char p[8][256];
    static int i;
    if (!tmp_dir[0]) {
        /* tmpfs when there is one: shards are fsynced, and a busy disk makes
         * that slow without testing anything more */
        strcpy(tmp_dir, access("/dev/shm", W_OK) == 0 ? "/dev/shm/skyloom-test-XXXXXX"
                                                      : "/tmp/skyloom-test-XXXXXX");
        if (!mkdtemp(tmp_dir)) {
            perror("mkdtemp");
            exit(1);
        }
    }
    i = (i + 1) % 8;
    snprintf(p[i], sizeof p[i], "%s/%s", tmp_dir, name);
    return p[i];
}

static inline void write_bytes(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n) {
        perror(path);
        exit(1);
    }
    fclose(f);
}

static inline void tmp_cleanup(void)
{
    if (tmp_dir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", tmp_dir);
    }
}

/* A vocabulary of `size` tokens learned from text (NULL on failure). */
static inline dev_vocab *gen_vocab(const char *text, size_t len, bool cased, int size)
{
    dev_wordcount *wc = dev_wordcount_new(cased);
    dev_vocab_learned L;
    dev_vocab *v = NULL;
    if (dev_wordcount_add(wc, text, len, NULL) == 0 && dev_vocab_learn(wc, size, 2, &L, NULL) == 0) {
        v = dev_vocab_parse(L.text, L.len, "learned", NULL);
        free(L.text);
    }
    dev_wordcount_free(wc);
    return v;
}

/* Writes text as a shard the way skyloom data prepare does: a line is a
 * sentence, an empty line ends a document. If fed is not NULL it receives
 * every sentence's ids back to back. Returns the number of non-empty documents, or -1. */
static inline int gen_shard(const dev_vocab *v, const char *text, size_t len, int T,
                            const char *path, dev_ids *fed)
{
    dev_shard_writer *w = dev_shard_writer_new(v, T, false, NULL);
    if (!w)
        return -1;
    dev_ids ids = {0};
    int docs = 0, doc_has = 0;
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(text + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - text) : len;
        if (e == i) {
            dev_shard_writer_end_doc(w);
            docs += doc_has;
            doc_has = 0;
        } else {
            ids.n = 0;
            dev_tok_encode(v, false, text + i, e - i, &ids, NULL);
            dev_shard_writer_sentence(w, ids.v, ids.n);
            for (size_t k = 0; fed && k < ids.n; k++)
                dev_ids_push(fed, ids.v[k]);
            doc_has |= ids.n > 0;
        }
        i = e + 1;
    }
    docs += doc_has;
    sl_err err = {0};
    int rc = dev_shard_writer_finish(w, path, &err);
    if (rc)
        fprintf(stderr, "gen_shard: %s\n", err.msg);
    dev_shard_writer_free(w);
    dev_ids_free(&ids);
    return rc ? -1 : docs;
}

#endif
