/* vocab.txt loading (and its errors) and WordPiece vocabulary learning. */
#include <string.h>

#include "data_gen.h"
#include "dev_tok.h"
#include "dev_vocab.h"
#include "dev_vocab_build.h"
#include "sl_test.h"

static dev_vocab *load_text(const char *name, const char *text, sl_err *err)
{
    const char *p = tmp_path(name);
    write_bytes(p, text, strlen(text));
    return dev_vocab_load(p, err);
}

static void test_load_errors(void)
{
    sl_err err = {0};
    CHECK(dev_vocab_load(tmp_path("does-not-exist.txt"), &err) == NULL);
    CHECK(strstr(err.msg, "does-not-exist.txt") && strstr(err.msg, "No such file"));
    CHECK(err.code == SL_EIO);

    CHECK(load_text("empty.txt", "", &err) == NULL);
    CHECK(strstr(err.msg, "empty.txt") && strstr(err.msg, "empty vocabulary"));

    CHECK(load_text("dup.txt", "[PAD]\n[UNK]\nhello\nworld\nhello\n", &err) == NULL);
    CHECKF(strstr(err.msg, "duplicate token 'hello' on lines 3 and 5") != NULL, "%s", err.msg);

    CHECK(load_text("nounk.txt", "[PAD]\n[CLS]\nhello\n", &err) == NULL);
    CHECKF(strstr(err.msg, "no [UNK]") != NULL, "%s", err.msg);

    CHECK(load_text("blank.txt", "[UNK]\nhello\n\nworld\n", &err) == NULL);
    CHECKF(strstr(err.msg, "line 3 is empty") != NULL, "%s", err.msg);

    CHECK(load_text("badutf8.txt", "[UNK]\nhel\xfflo\n", &err) == NULL);
    CHECKF(strstr(err.msg, "line 2") && strstr(err.msg, "invalid UTF-8"), "%s", err.msg);

    CHECK(dev_vocab_load(tmp_dir, &err) == NULL); /* a directory */
    CHECK(strstr(err.msg, "not a regular file") != NULL);
}

static void test_load_ok(void)
{
    sl_err err = {0};
    dev_vocab *a = load_text("a.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n##lo\n", &err);
    dev_vocab *b = load_text("b.txt", "[PAD]\r\n[UNK]\r\n[CLS]\r\n[SEP]\r\n[MASK]\r\nhello\r\n##lo", &err);
    dev_vocab *c = load_text("c.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n##la\n", &err);
    CHECK(a && b && c);
    if (!a || !b || !c)
        return;
    CHECK(dev_vocab_size(a) == 7);
    dev_special sp = dev_vocab_special(a);
    CHECK(sp.pad == 0 && sp.unk == 1 && sp.cls == 2 && sp.sep == 3 && sp.mask == 4);
    CHECK(dev_vocab_id(a, "hello") == 5 && dev_vocab_id(a, "##lo") == 6);
    CHECK(dev_vocab_id(a, "lo") == -1 && dev_vocab_id(a, "hell") == -1);
    CHECK(dev_vocab_find_cont(a, "lo", 2) == 6 && dev_vocab_find_cont(a, "hello", 5) == -1);
    CHECK(strcmp(dev_vocab_token(a, 5), "hello") == 0);
    CHECK(dev_vocab_token(a, 7) == NULL && dev_vocab_token(a, -1) == NULL);
    uint8_t ha[32], hb[32], hc[32];
    dev_vocab_hash(a, ha);
    dev_vocab_hash(b, hb);
    dev_vocab_hash(c, hc);
    CHECK(memcmp(ha, hb, 32) == 0); /* CRLF and a missing final newline do not matter */
    CHECK(memcmp(ha, hc, 32) != 0);
    dev_vocab *d = load_text("d.txt", "[UNK]\nx\n", &err);
    CHECK(d && dev_vocab_special(d).pad == -1 && dev_vocab_special(d).mask == -1);
    dev_vocab_free(a);
    dev_vocab_free(b);
    dev_vocab_free(c);
    dev_vocab_free(d);
}

static dev_vocab *learn(const char *text, size_t len, int cased, int size, dev_vocab_learned *L)
{
    dev_wordcount *wc = dev_wordcount_new(cased);
    sl_err err = {0};
    CHECK(dev_wordcount_add(wc, text, len, &err) == 0);
    int rc = dev_vocab_learn(wc, size, 2, L, &err);
    CHECKF(rc == 0, "%s", err.msg);
    dev_wordcount_free(wc);
    if (rc)
        return NULL;
    dev_vocab *v = dev_vocab_parse(L->text, L->len, "learned", &err);
    CHECKF(v != NULL, "%s", err.msg); /* no duplicates, [UNK] present */
    return v;
}

static void test_learn(void)
{
    size_t len;
    char *text = gen_corpus(42, 300, &len);
    dev_vocab_learned L1, L2, L3;
    dev_vocab *v = learn(text, len, 0, 1000, &L1);
    dev_vocab *v2 = learn(text, len, 0, 1000, &L2);
    if (!v || !v2)
        return;
    /* deterministic: the same corpus gives the same file */
    CHECK(L1.len == L2.len && memcmp(L1.text, L2.text, L1.len) == 0);
    /* BERT's layout at size >= 1000 */
    CHECK(dev_vocab_size(v) <= 1000 && dev_vocab_size(v) > 300);
    dev_special sp = dev_vocab_special(v);
    CHECK(sp.pad == 0 && sp.unk == 100 && sp.cls == 101 && sp.sep == 102 && sp.mask == 103);
    CHECK(strcmp(dev_vocab_token(v, 1), "[unused0]") == 0);
    CHECK(strcmp(dev_vocab_token(v, 99), "[unused98]") == 0);
    /* frequent words become single tokens; uncased: no upper case anywhere */
    CHECK(dev_vocab_id(v, "the") >= 0);
    CHECK(dev_vocab_id(v, "Zu") < 0 && dev_vocab_id(v, "zu") >= 0);
    /* accents were stripped before learning: "élan" pieces have no é */
    CHECK(dev_vocab_id(v, "\xc3\xa9") < 0 && dev_vocab_id(v, "e") >= 0);
    /* the training corpus tokenizes without [UNK] */
    dev_ids ids = {0};
    CHECK(dev_tok_encode(v, 0, text, len, &ids, NULL) == 0);
    size_t unk = 0;
    for (size_t i = 0; i < ids.n; i++)
        unk += ids.v[i] == sp.unk;
    CHECK(ids.n > 1000 && unk == 0);
    dev_ids_free(&ids);

    /* compact layout for small sizes; exactly the size asked for */
    dev_vocab *s = learn(text, len, 1, 200, &L3);
    if (s) {
        sp = dev_vocab_special(s);
        CHECK(sp.pad == 0 && sp.unk == 1 && sp.cls == 2 && sp.sep == 3 && sp.mask == 4);
        CHECK(dev_vocab_size(s) == 200);
        CHECK(dev_vocab_id(s, "Z") >= 0); /* cased keeps capitals */
        dev_vocab_free(s);
        free(L3.text);
    }
    dev_vocab_free(v);
    dev_vocab_free(v2);
    free(L1.text);
    free(L2.text);

    /* too small for the alphabet: the rarest characters are left out */
    dev_vocab_learned L4;
    dev_vocab *t = learn(text, len, 0, 12, &L4);
    if (t) {
        CHECK(dev_vocab_size(t) == 12 && L4.alphabet == 7 && L4.dropped_chars > 0);
        dev_vocab_free(t);
        free(L4.text);
    }
    /* sizes that cannot work are refused */
    dev_wordcount *wc = dev_wordcount_new(0);
    sl_err err = {0};
    CHECK(dev_vocab_learn(wc, 5, 2, &L4, &err) == -1 && strstr(err.msg, "vocabulary size 5"));
    /* invalid UTF-8 while counting is an error with its offset */
    CHECK(dev_wordcount_add(wc, "ok \xc3", 4, &err) == -1 && strstr(err.msg, "byte offset 3"));
    dev_wordcount_free(wc);
    free(text);
}

int main(void)
{
    RUN(test_load_errors);
    RUN(test_load_ok);
    RUN(test_learn);
    tmp_cleanup();
    return sl_test_done();
}
