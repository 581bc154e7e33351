/* Tokenizer throughput, single thread: BasicTokenizer alone and the full
 * BERT tokenizer (Basic + WordPiece), uncased and cased, on one corpus file.
 * Prints the median of several runs in MB/s (10^6 bytes of input text).
 * usage: bench_tok CORPUS [RUNS] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "sl_file.h"
#include "dev_tok.h"
#include "dev_vocab.h"
#include "dev_vocab_build.h"
#include "sl_time.h"

#include <time.h>

/* This thread's CPU time: unlike wall time it does not count the time other
 * processes on a shared machine hold the core. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int count_word(void *ctx, const char *w, size_t n, int nc)
{
    (void)w;
    (void)n;
    (void)nc;
    ++*(size_t *)ctx;
    return 0;
}

static dev_vocab *learn(const char *text, size_t len, int cased, int size, double *secs)
{
    double t0 = sl_now_s();
    dev_wordcount *wc = dev_wordcount_new(cased);
    dev_wordcount_add(wc, text, len, NULL);
    dev_vocab_learned L;
    sl_err err = {0};
    if (dev_vocab_learn(wc, size, 2, &L, &err)) {
        fprintf(stderr, "bench_tok: %s\n", err.msg);
        exit(1);
    }
    *secs = sl_now_s() - t0;
    dev_wordcount_free(wc);
    dev_vocab *v = dev_vocab_parse(L.text, L.len, "learned", &err);
    free(L.text);
    return v;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_tok CORPUS [RUNS]\n");
        return 2;
    }
    int runs = argc > 2 ? atoi(argv[2]) : 7;
    if (runs < 1 || runs > 100)
        runs = 7;
    char *text;
    size_t len;
    sl_err err = {0};
    if (sl_read_file(argv[1], (uint64_t)1 << 32, &text, &len, &err)) {
        fprintf(stderr, "bench_tok: %s\n", err.msg);
        return 1;
    }
    double mb = (double)len / 1e6, t[100], c[100];
    printf("corpus %s: %.2f MB, single thread, median of %d runs, MB/s by wall clock "
           "(by thread CPU time)\n",
           argv[1], mb, runs);
    for (int cased = 0; cased <= 1; cased++) {
        size_t words = 0;
        for (int r = 0; r < runs; r++) {
            words = 0;
            double t0 = sl_now_s(), c0 = cpu_s();
            dev_tok_basic(text, len, cased, count_word, &words, NULL);
            t[r] = sl_now_s() - t0;
            c[r] = cpu_s() - c0;
        }
        printf("basic tokenizer   %-7s %7.1f (%5.1f) MB/s  (%zu words)\n",
               cased ? "cased" : "uncased", mb / bench_median(t, runs), mb / bench_median(c, runs), words);
    }
    static const int sizes[] = {8192, 30522};
    for (int cased = 0; cased <= 1; cased++)
        for (int si = 0; si < 2; si++) {
            double ls;
            dev_vocab *v = learn(text, len, cased, sizes[si], &ls);
            dev_ids ids = {0};
            size_t unk = 0;
            for (int r = 0; r < runs; r++) {
                ids.n = 0;
                double t0 = sl_now_s(), c0 = cpu_s();
                dev_tok_encode(v, cased, text, len, &ids, NULL);
                t[r] = sl_now_s() - t0;
                c[r] = cpu_s() - c0;
            }
            for (size_t i = 0; i < ids.n; i++)
                unk += ids.v[i] == dev_vocab_special(v).unk;
            printf("basic + wordpiece %-7s %7.1f (%5.1f) MB/s  (vocab %d learned in %.2f s, "
                   "%zu tokens, %zu [UNK])\n",
                   cased ? "cased" : "uncased", mb / bench_median(t, runs), mb / bench_median(c, runs),
                   dev_vocab_size(v), ls, ids.n, unk);
            dev_ids_free(&ids);
            dev_vocab_free(v);
        }
    free(text);
    return 0;
}
