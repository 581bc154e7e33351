/* BERT tokenizer golden cases, written from the behaviour of
 * google-research/bert tokenization.py (BasicTokenizer + WordpieceTokenizer)
 * and its unit tests. Words are joined with '|' for comparison. */
#include <stdlib.h>
#include <string.h>

#include "dev_tok.h"
#include "dev_vocab.h"
#include "sl_test.h"

typedef struct joined {
    char s[4096];
    size_t n;
} joined;

static int join_word(void *ctx, const char *w, size_t len, int nchars)
{
    joined *j = ctx;
    (void)nchars;
    if (j->n && j->n < sizeof j->s - 1)
        j->s[j->n++] = '|';
    if (j->n + len < sizeof j->s - 1) {
        memcpy(j->s + j->n, w, len);
        j->n += len;
    }
    j->s[j->n] = '\0';
    return 0;
}

static int basic_ok(const char *text, int cased, const char *want)
{
    joined j = {.n = 0};
    j.s[0] = '\0';
    sl_err err = {0};
    int rc = dev_tok_basic(text, strlen(text), cased, join_word, &j, &err);
    if (rc != 0 || strcmp(j.s, want) != 0) {
        fprintf(stderr, "  basic(%s, %s): got '%s' (rc %d %s), want '%s'\n", text,
                cased ? "cased" : "uncased", j.s, rc, err.msg, want);
        return 0;
    }
    return 1;
}
#define BASIC(text, cased, want) CHECK(basic_ok(text, cased, want))

static void test_bert_examples(void)
{
    /* tokenization_test.py: test_basic_tokenizer_lower / _no_lower / test_chinese */
    BASIC(" \tHeLLo!how  \n Are yoU?  ", 0, "hello|!|how|are|you|?");
    BASIC("H\xc3\xa9llo", 0, "hello");
    BASIC(" \tHeLLo!how  \n Are yoU?  ", 1, "HeLLo|!|how|Are|yoU|?");
    BASIC("ah\xe5\x8d\x9a\xe6\x8e\xa8zz", 0, "ah|\xe5\x8d\x9a|\xe6\x8e\xa8|zz");
    BASIC("", 0, "");
    BASIC("   \t\n ", 0, "");
}

static void test_accents(void)
{
    BASIC("H\xc3\xa9llo", 1, "H\xc3\xa9llo");
    /* Ångström Café naïve ÉCOLE */
    BASIC("\xc3\x85ngstr\xc3\xb6m Caf\xc3\xa9 na\xc3\xafve \xc3\x89""COLE", 0,
          "angstrom|cafe|naive|ecole");
    BASIC("\xc3\x85ngstr\xc3\xb6m", 1, "\xc3\x85ngstr\xc3\xb6m");
    /* already decomposed: e + U+0301 */
    BASIC("Cafe\xcc\x81", 0, "cafe");
    /* İstanbul: U+0130 lower-cases to i (+ U+0307, stripped) */
    BASIC("\xc4\xb0stanbul", 0, "istanbul");
    /* Greek: final sigma, accent on alpha */
    BASIC("\xce\x9f\xce\x94\xce\x9f\xce\xa3 \xce\xa3 \xce\xa3\xce\x91", 0,
          "\xce\xbf\xce\xb4\xce\xbf\xcf\x82|\xcf\x83|\xcf\x83\xce\xb1");
    BASIC("\xce\x86\xce\xbb\xcf\x86\xce\xb1", 0, "\xce\xb1\xce\xbb\xcf\x86\xce\xb1");
    /* Korean: NFD splits syllables into conjoining jamo (Lo, kept) */
    BASIC("\xed\x95\x9c\xea\xb5\xad", 0,
          "\xe1\x84\x92\xe1\x85\xa1\xe1\x86\xab\xe1\x84\x80\xe1\x85\xae\xe1\x86\xa8");
    BASIC("\xed\x95\x9c\xea\xb5\xad", 1, "\xed\x95\x9c\xea\xb5\xad");
}

static void test_punctuation(void)
{
    BASIC("Wait...what?!", 0, "wait|.|.|.|what|?|!");
    BASIC("Don't you're I'm", 0, "don|'|t|you|'|re|i|'|m");
    BASIC("Don't", 1, "Don|'|t");
    BASIC("3.14 1,000,000 $5 -2 50%", 0, "3|.|14|1|,|000|,|000|$|5|-|2|50|%");
    /* ASCII ranges count even where Unicode says symbol: $ + ^ ` _ ~ | < */
    BASIC("a+b x^2 under_score `q` ~|<", 0, "a|+|b|x|^|2|under|_|score|`|q|`|~|||<");
    /* Unicode P*: « » — ¿ ; but € × ❤ are symbols, not split */
    BASIC("\xc2\xab""Hola\xc2\xbb \xe2\x80\x94 \xc2\xbfqu\xc3\xa9?", 0,
          "\xc2\xab|hola|\xc2\xbb|\xe2\x80\x94|\xc2\xbf|que|?");
    BASIC("\xc2\xab""Hola\xc2\xbb \xc2\xbfqu\xc3\xa9?", 1,
          "\xc2\xab|Hola|\xc2\xbb|\xc2\xbf|qu\xc3\xa9|?");
    BASIC("5\xe2\x82\xac 3\xc3\x97""4", 0, "5\xe2\x82\xac|3\xc3\x97""4");
}

static void test_cjk_and_scripts(void)
{
    /* 我爱北京 */
    BASIC("\xe6\x88\x91\xe7\x88\xb1\xe5\x8c\x97\xe4\xba\xac", 1,
          "\xe6\x88\x91|\xe7\x88\xb1|\xe5\x8c\x97|\xe4\xba\xac");
    /* 日本語とひらがな: kana are not CJK ideographs, they stay one word */
    BASIC("\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xa8\xe3\x81\xb2\xe3\x82\x89", 0,
          "\xe6\x97\xa5|\xe6\x9c\xac|\xe8\xaa\x9e|\xe3\x81\xa8\xe3\x81\xb2\xe3\x82\x89");
    /* U+F900 (compatibility ideograph) is NFD-mapped to U+8C48 only when uncased */
    BASIC("x\xef\xa4\x80y", 0, "x|\xe8\xb1\x88|y");
    BASIC("x\xef\xa4\x80y", 1, "x|\xef\xa4\x80|y");
    /* mixed scripts: Latin, Cyrillic, Arabic, Hebrew, CJK */
    BASIC("Hello \xd0\x9f\xd0\xa0\xd0\x98\xd0\x92\xd0\x95\xd0\xa2 \xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 "
          "\xd7\xa9\xd7\x9c\xd7\x95\xd7\x9d\xe4\xb8\xad",
          0,
          "hello|\xd0\xbf\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82|\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7|"
          "\xd7\xa9\xd7\x9c\xd7\x95\xd7\x9d|\xe4\xb8\xad");
    /* fullwidth Latin lower-cases but is not folded (NFD is canonical only) */
    BASIC("\xef\xbc\xa1\xef\xbc\xa2", 0, "\xef\xbd\x81\xef\xbd\x82");
}

static void test_emoji(void)
{
    /* ❤️ is U+2764 U+FE0F: the variation selector is Mn, stripped when uncased */
    BASIC("I \xe2\x9d\xa4\xef\xb8\x8f \xf0\x9f\xa4\x97!", 0, "i|\xe2\x9d\xa4|\xf0\x9f\xa4\x97|!");
    BASIC("I \xe2\x9d\xa4\xef\xb8\x8f \xf0\x9f\xa4\x97!", 1,
          "I|\xe2\x9d\xa4\xef\xb8\x8f|\xf0\x9f\xa4\x97|!");
    /* emoji are So, not punctuation: no split inside a word */
    BASIC("hi\xf0\x9f\xa4\x97there", 0, "hi\xf0\x9f\xa4\x97there");
}

static void test_control_and_space(void)
{
    /* NUL, U+0001, zero-width space (Cf), U+FFFD and DEL are dropped, not spaces */
    BASIC("a\x01""b\xe2\x80\x8b""c\xef\xbf\xbd""d\x7f""e", 0, "abcde");
    {
        const char t[] = "a\0b";
        joined j = {.n = 0};
        j.s[0] = '\0';
        CHECK(dev_tok_basic(t, 3, 0, join_word, &j, NULL) == 0 && strcmp(j.s, "ab") == 0);
    }
    /* tab/CR/LF are whitespace; VT (Cc) is dropped; NEL (Cc) is dropped */
    BASIC("x\ty\r\nz\x0bw v\xc2\x85u", 0, "x|y|zw|vu");
    /* NBSP, ideographic space (Zs) and U+2028 split words */
    BASIC("a\xc2\xa0""b\xe3\x80\x80""c\xe2\x80\xa8""d", 0, "a|b|c|d");
    /* backspace overstrike as in old text files: the BS is dropped */
    BASIC("_\x08h_\x08i", 0, "_|h|_|i");
}

static void test_invalid_utf8(void)
{
    static const struct {
        const char *s;
        size_t off;
    } bad[] = {{"ab\xff""cd", 2}, {"ok \xe2\x82", 3}, {"\xed\xa0\x80", 0}, {"x\xc0\xaf", 1},
               {"\xf4\x90\x80\x80", 0}, {"caf\xc3", 3}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        joined j = {.n = 0};
        sl_err err = {0};
        CHECK(dev_tok_basic(bad[i].s, strlen(bad[i].s), 0, join_word, &j, &err) == -1);
        char want[64];
        snprintf(want, sizeof want, "byte offset %zu", bad[i].off);
        CHECKF(strstr(err.msg, want) != NULL, "'%s' lacks '%s'", err.msg, want);
        CHECK(dev_utf8_check(bad[i].s, strlen(bad[i].s)) == bad[i].off);
    }
    const char *good = "plain ascii, \xc3\xa9, \xe4\xb8\xad, \xf0\x9f\xa4\x97";
    CHECK(dev_utf8_check(good, strlen(good)) == strlen(good));
}

static dev_vocab *vocab_of(const char *const *toks, int n)
{
    char buf[8192];
    size_t len = 0;
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%s\n", toks[i]);
    sl_err err = {0};
    dev_vocab *v = dev_vocab_parse(buf, len, "test", &err);
    if (!v)
        fprintf(stderr, "vocab: %s\n", err.msg);
    return v;
}

static int pieces_ok(const dev_vocab *v, int cased, const char *text, const char *want)
{
    dev_ids ids = {0};
    sl_err err = {0};
    char got[4096] = "";
    size_t n = 0;
    int rc = dev_tok_encode(v, cased, text, strlen(text), &ids, &err);
    for (size_t i = 0; i < ids.n && n < sizeof got - 64; i++)
        n += (size_t)snprintf(got + n, sizeof got - n, "%s%s", i ? " " : "",
                              dev_vocab_token(v, ids.v[i]));
    dev_ids_free(&ids);
    if (rc || strcmp(got, want)) {
        fprintf(stderr, "  encode(%s): got '%s', want '%s'\n", text, got, want);
        return 0;
    }
    return 1;
}
#define PIECES(v, cased, text, want) CHECK(pieces_ok(v, cased, text, want))

static void test_wordpiece(void)
{
    /* tokenization_test.py: test_wordpiece_tokenizer and test_full_tokenizer */
    static const char *const t[] = {"[UNK]", "[CLS]", "[SEP]", "want", "##want", "##ed", "wa",
                                    "un", "runn", "##ing", ",", "low", "lowest"};
    dev_vocab *v = vocab_of(t, 13);
    CHECK(v != NULL);
    if (!v)
        return;
    PIECES(v, 0, "", "");
    PIECES(v, 0, "unwanted running", "un ##want ##ed runn ##ing");
    PIECES(v, 0, "unwantedX running", "[UNK] runn ##ing");
    PIECES(v, 0, "UNwant\xc3\xa9""d,running", "un ##want ##ed , runn ##ing");
    /* cased: "UNwanted" has no pieces at all */
    PIECES(v, 1, "UNwanted running", "[UNK] runn ##ing");
    /* a word with a prefix but no continuation is one [UNK], not "wa [UNK]" */
    PIECES(v, 0, "wax lowest low", "[UNK] lowest low");
    dev_vocab_free(v);

    /* longest match first, even when a shorter start would cover the rest */
    static const char *const g[] = {"[UNK]", "a", "ab", "##b", "##bc", "##c"};
    v = vocab_of(g, 6);
    PIECES(v, 0, "abc", "ab ##c");
    PIECES(v, 0, "abbc", "ab ##bc");
    dev_vocab_free(v);
}

static void test_long_words(void)
{
    static const char *const t[] = {"[UNK]", "a", "##a", "\xc3\xa9", "##\xc3\xa9"};
    dev_vocab *v = vocab_of(t, 5);
    char w[1024];
    memset(w, 'a', 101);
    w[100] = '\0';
    dev_ids ids = {0};
    CHECK(dev_tok_encode(v, 0, w, 100, &ids, NULL) == 0);
    CHECK(ids.n == 100 && ids.v[0] == 1 && ids.v[99] == 2); /* a ##a x 99 */
    ids.n = 0;
    memset(w, 'a', 101);
    CHECK(dev_tok_encode(v, 0, w, 101, &ids, NULL) == 0);
    CHECK(ids.n == 1 && ids.v[0] == 0); /* 101 characters: [UNK] */
    /* the limit counts characters, not bytes: 100 x é (200 bytes) is fine */
    for (int i = 0; i < 101; i++)
        memcpy(w + 2 * i, "\xc3\xa9", 2);
    ids.n = 0;
    CHECK(dev_tok_encode(v, 1, w, 200, &ids, NULL) == 0);
    CHECK(ids.n == 100 && ids.v[0] == 3 && ids.v[1] == 4);
    ids.n = 0;
    CHECK(dev_tok_encode(v, 1, w, 202, &ids, NULL) == 0);
    CHECK(ids.n == 1 && ids.v[0] == 0);
    /* a very long word (longer than any buffer) followed by a normal one */
    size_t big = 100000;
    char *b = malloc(big + 3);
    memset(b, 'a', big);
    memcpy(b + big, " a", 3);
    ids.n = 0;
    CHECK(dev_tok_encode(v, 0, b, big + 2, &ids, NULL) == 0);
    CHECK(ids.n == 2 && ids.v[0] == 0 && ids.v[1] == 1);
    free(b);
    /* dev_tok_wordpiece does not trust its caller's character count */
    memset(w, 'a', 101);
    ids.n = 0;
    dev_tok_wordpiece(v, w, 101, 3, &ids);
    CHECK(ids.n == 1 && ids.v[0] == 0);
    ids.n = 0;
    dev_tok_wordpiece(v, "\xa9\xa9", 2, 1, &ids); /* continuation bytes only */
    CHECK(ids.n == 1 && ids.v[0] == 0);
    ids.n = 0;
    dev_tok_wordpiece(v, "aa", 2, 2, &ids);
    CHECK(ids.n == 2 && ids.v[0] == 1 && ids.v[1] == 2);
    dev_ids_free(&ids);
    dev_vocab_free(v);
}

static void test_decode(void)
{
    static const char *const t[] = {"[UNK]", "un", "##want", "##ed", ",", "runn", "##ing"};
    dev_vocab *v = vocab_of(t, 7);
    int32_t ids[] = {1, 2, 3, 4, 5, 6};
    char *s = dev_tok_decode(v, ids, 6);
    CHECK(strcmp(s, "unwanted , running") == 0);
    free(s);
    dev_vocab_free(v);
}

int main(void)
{
    RUN(test_bert_examples);
    RUN(test_accents);
    RUN(test_punctuation);
    RUN(test_cjk_and_scripts);
    RUN(test_emoji);
    RUN(test_control_and_space);
    RUN(test_invalid_utf8);
    RUN(test_wordpiece);
    RUN(test_long_words);
    RUN(test_decode);
    return sl_test_done();
}
