/* Fault injection for the data formats: thousands of seeded random
 * corruptions of a valid shard (half of them with the checksum recomputed, so
 * the structural checks behind it are exercised too), random bytes into the
 * tokenizer and the vocab.txt parser. Each input is either refused with a
 * reason or, if accepted, fully usable: every read stays in bounds (run it
 * under ASan to make "in bounds" mean something). */
#include <sodium.h>
#include <string.h>

#include "data_gen.h"
#include "sl_file.h"
#include "dev_mlm.h"
#include "dev_shard.h"
#include "dev_tok.h"
#include "dev_vocab.h"
#include "dev_vocab_build.h"
#include "sl_test.h"

static uint32_t rnd(uint64_t *k) { return sl_rng_u32(2024, 77, (*k)++); }

static int count_words(void *ctx, const char *w, size_t n, int nc)
{
    (void)w;
    (void)n;
    (void)nc;
    ++*(int *)ctx;
    return 0;
}

static void test_tokenizer_random_bytes(void)
{
    uint64_t k = 0;
    int bad = 0;
    char buf[512];
    for (int it = 0; it < 3000; it++) {
        size_t n = rnd(&k) % sizeof buf;
        for (size_t i = 0; i < n; i++) {
            uint32_t r = rnd(&k);
            /* mostly valid-looking text with some high bytes */
            buf[i] = (char)((r & 7) == 0 ? (r >> 8) : 32 + (r >> 8) % 95);
        }
        int words = 0;
        sl_err err = {0};
        int rc = dev_tok_basic(buf, n, it & 1, count_words, &words, &err);
        size_t off = dev_utf8_check(buf, n);
        if (off == n)
            bad += rc != 0;
        else {
            char want[48];
            snprintf(want, sizeof want, "byte offset %zu", off);
            bad += rc != -1 || !strstr(err.msg, want);
        }
    }
    CHECK(bad == 0);
}

static void test_vocab_random(void)
{
    uint64_t k = 1 << 20;
    int accepted = 0;
    char buf[256];
    for (int it = 0; it < 3000; it++) {
        /* lines drawn from a few tokens, some of them bad, some repeated */
        static const char *const piece[] = {"[UNK]", "a", "##a", "b", "\xc3\xa9", "##\xc3\xa9",
                                            "\xff", "", "x y", "[PAD]", "c", "##", "d\r"};
        size_t n = 0;
        int lines = (int)(rnd(&k) % 8);
        for (int l = 0; l < lines; l++) {
            const char *p = piece[rnd(&k) % 13];
            size_t pl = strlen(p);
            memcpy(buf + n, p, pl);
            n += pl;
            if (l + 1 < lines || rnd(&k) & 1)
                buf[n++] = '\n';
        }
        sl_err err = {0};
        dev_vocab *v = dev_vocab_parse(buf, n, "fuzz", &err);
        if (v) {
            accepted++;
            CHECK(dev_vocab_special(v).unk >= 0);
            for (int i = 0; i < dev_vocab_size(v); i++)
                CHECK(dev_vocab_id(v, dev_vocab_token(v, i)) == i);
            dev_vocab_free(v);
        } else {
            CHECK(err.msg[0] != '\0');
        }
    }
    CHECK(accepted > 0);
}

static void test_shard_corruption(void)
{
    size_t len;
    char *text = gen_corpus(3, 60, &len);
    dev_vocab *v = gen_vocab(text, len, false, 150);
    const char *path = tmp_path("f.shard");
    CHECK(v && gen_shard(v, text, len, 24, path, NULL) > 0);
    dev_vocab_free(v);
    free(text);
    sl_err err = {0};
    char *good;
    size_t n;
    if (sl_read_file(path, 1 << 30, &good, &n, &err))
        return;
    uint8_t *b = malloc(n);
    uint64_t k = 1 << 24;
    int accepted = 0, refused = 0, bad = 0;
    int32_t *tok = NULL;
    dev_mlm_batch mb;
    dev_mlm_batch_alloc(&mb, 3, 24);
    const char *bad_path = tmp_path("g.shard");
    for (int it = 0; it < 4000; it++) {
        memcpy(b, good, n);
        int edits = 1 + (int)(rnd(&k) % 4);
        for (int e = 0; e < edits; e++) {
            /* half the edits land in the header and offset tables */
            size_t at = (rnd(&k) & 1) ? rnd(&k) % (n < 600 ? n : 600) : rnd(&k) % n;
            uint32_t r = rnd(&k);
            b[at] = (r & 3) == 0 ? 0 : (r & 3) == 1 ? 0xff : (uint8_t)(b[at] ^ (1u << (r >> 8) % 8));
        }
        size_t m = n;
        if (rnd(&k) % 8 == 0)
            m = rnd(&k) % n; /* and sometimes truncate */
        int resigned = (rnd(&k) & 1) && m >= 32;
        if (resigned)
            crypto_generichash(b + m - 32, 32, b, m - 32, NULL, 0);
        int changed = m != n || memcmp(b, good, n) != 0;
        write_bytes(bad_path, b, m);
        dev_shard *s = dev_shard_open(bad_path, &err);
        if (!s) {
            refused++;
            bad += !strstr(err.msg, "refused");
            continue;
        }
        accepted++;
        bad += changed && !resigned; /* only a valid checksum can make a change acceptable */
        int V = dev_shard_vocab_size(s), T = dev_shard_seq_len(s);
        tok = realloc(tok, (size_t)T * sizeof *tok);
        for (uint64_t q = 0; q < dev_shard_count(s); q++) {
            int l = dev_shard_read(s, q, tok);
            bad += l < 2 || l > T;
            for (int t = 0; t < T; t++)
                bad += tok[t] < 0 || tok[t] >= V;
        }
        dev_special sp = dev_shard_special(s);
        if (T == 24)
            bad += dev_mlm_make_batch(s, &sp, V, 0.15f, 1, 0, 0, &mb, &err) != 0;
        dev_vocab *sv = dev_shard_vocab(s, &err);
        bad += sv == NULL;
        dev_vocab_free(sv);
        dev_shard_close(s);
    }
    printf("  %d corrupted shards refused, %d accepted (the edit left them valid)\n", refused,
           accepted);
    CHECK(bad == 0);
    CHECK(refused > 3000);
    dev_mlm_batch_free(&mb);
    free(tok);
    free(b);
    free(good);
}

int main(void)
{
    if (sodium_init() < 0)
        return 1;
    RUN(test_tokenizer_random_bytes);
    RUN(test_vocab_random);
    RUN(test_shard_corruption);
    tmp_cleanup();
    return sl_test_done();
}
