/* fuzz_vocab.c - libFuzzer target: vocab.txt and the tokenizer on
 * arbitrary bytes. The input up to the first NUL is a vocabulary; the rest
 * is text, tokenized cased and uncased with that vocabulary when it loads
 * and with a small fixed one otherwise. Properties: ids are inside the
 * vocabulary, tokenizing twice gives the same ids, every token a
 * vocabulary lists is found again by its id, and decoding never fails. */
#include "dev_tok.h"
#include "dev_vocab.h"
#include "fuzz_util.h"

static const char base_text[] = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n##s\na\n##b\n.\n,\n"
                                "\xe4\xb8\xad\ncafe\n##\xc3\xa9\nrun\n##ning\n";
static dev_vocab *base;

static void tokenize(const dev_vocab *v, const char *text, size_t len)
{
    for (int cased = 0; cased < 2; cased++) {
        dev_ids a = {0}, b = {0};
        sl_err e1 = {0}, e2 = {0};
        int r1 = dev_tok_encode(v, cased, text, len, &a, &e1);
        int r2 = dev_tok_encode(v, cased, text, len, &b, &e2);
        REQUIRE(r1 == r2 && a.n == b.n);
        REQUIRE(a.n == 0 || !memcmp(a.v, b.v, a.n * sizeof *a.v));
        if (r1 == 0)
            REQUIRE(dev_utf8_check(text, len) == len);
        else
            REQUIRE(e1.msg[0]);
        for (size_t i = 0; i < a.n; i++)
            REQUIRE(a.v[i] >= 0 && a.v[i] < dev_vocab_size(v));
        char *d = dev_tok_decode(v, a.v, a.n);
        REQUIRE(d != NULL);
        free(d);
        dev_ids_free(&a);
        dev_ids_free(&b);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!base) {
        sl_log_set_level(SL_LOG_OFF);
        base = dev_vocab_parse(base_text, sizeof base_text - 1, "base", NULL);
        if (!base)
            fu_die("base vocabulary", "does not parse");
    }
    const uint8_t *nul = memchr(data, 0, size);
    size_t vl = nul ? (size_t)(nul - data) : size;
    const char *text = nul ? (const char *)nul + 1 : "";
    size_t tl = nul ? size - vl - 1 : 0;
    sl_err err = {0};
    dev_vocab *v = dev_vocab_parse((const char *)data, vl, "fuzz", &err);
    if (v) {
        int n = dev_vocab_size(v);
        REQUIRE(n > 0 && dev_vocab_special(v).unk >= 0);
        for (int i = 0; i < n; i++) {
            const char *t = dev_vocab_token(v, i);
            REQUIRE(t && dev_vocab_id(v, t) == i);
        }
        REQUIRE(dev_vocab_token(v, n) == NULL && dev_vocab_token(v, -1) == NULL);
        tokenize(v, text, tl);
        dev_vocab_free(v);
    } else {
        REQUIRE(err.msg[0]);
        tokenize(base, (const char *)data, size);
    }
    return 0;
}
