/* tok_dump FILE cased|uncased [VOCAB]: the C tokenizer's words (one per line;
 * with VOCAB followed by a tab and their WordPiece ids), in the format of
 * bert_tokenization_ref.py. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sl_file.h"
#include "dev_tok.h"

static const dev_vocab *vocab;

static int put_word(void *ctx, const char *w, size_t n, int nchars)
{
    (void)ctx;
    fwrite(w, 1, n, stdout);
    if (vocab) {
        putchar('\t');
        dev_ids ids = {0};
        dev_tok_wordpiece(vocab, w, n, nchars, &ids);
        for (size_t i = 0; i < ids.n; i++)
            printf(i ? " %d" : "%d", ids.v[i]);
        dev_ids_free(&ids);
    }
    putchar('\n');
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    char *buf;
    size_t n;
    sl_err err = {0};
    dev_vocab *v = NULL;
    if (argc > 3 && !(v = dev_vocab_load(argv[3], &err))) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    vocab = v;
    if (sl_read_file(argv[1], (uint64_t)1 << 32, &buf, &n, &err) ||
        dev_tok_basic(buf, n, strcmp(argv[2], "cased") == 0, put_word, NULL, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    free(buf);
    dev_vocab_free(v);
    return 0;
}
