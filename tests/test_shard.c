/* Token shards: round trip, packing rules, and every kind of damage refused
 * with a message that says which. */
#include <signal.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "data_gen.h"
#include "sl_file.h"
#include "dev_shard.h"
#include "dev_tok.h"
#include "dev_vocab.h"
#include "dev_vocab_build.h"
#include "sl_test.h"

static dev_vocab *vocab;

static void test_round_trip(void)
{
    size_t len;
    char *text = gen_corpus(7, 200, &len);
    const int T = 32;
    const char *path = tmp_path("a.shard");
    dev_ids fed = {0};
    int docs = gen_shard(vocab, text, len, T, path, &fed);
    CHECK(docs > 0);
    if (docs <= 0)
        return;
    sl_err err = {0};
    dev_shard *s = dev_shard_open(path, &err);
    CHECKF(s != NULL, "%s", err.msg);
    if (!s)
        return;
    CHECK(dev_shard_seq_len(s) == T);
    CHECK(dev_shard_vocab_size(s) == dev_vocab_size(vocab));
    CHECK(dev_shard_doc_count(s) == (uint64_t)docs);
    uint8_t h1[32], h2[32];
    dev_shard_vocab_hash(s, h1);
    dev_vocab_hash(vocab, h2);
    CHECK(memcmp(h1, h2, 32) == 0);
    CHECK(dev_shard_check_vocab(s, h2, dev_vocab_size(vocab), &err) == 0);
    dev_special sp = dev_shard_special(s), vs = dev_vocab_special(vocab);
    CHECK(memcmp(&sp, &vs, sizeof sp) == 0);
    /* sequences are [CLS] ... [SEP] padded with [PAD]; their insides, back
     * to back, are exactly the sentences fed in */
    int32_t tok[64];
    size_t pos = 0, real = 0;
    int ok = 1, full = 0;
    for (uint64_t i = 0; i < dev_shard_count(s); i++) {
        int n = dev_shard_read(s, i, tok);
        ok &= n >= 3 && n <= T && tok[0] == sp.cls && tok[n - 1] == sp.sep;
        for (int t = n; t < T; t++)
            ok &= tok[t] == sp.pad;
        for (int t = 1; t < n - 1; t++)
            ok &= pos < fed.n && tok[t] == fed.v[pos++];
        full += n == T;
        real += (size_t)n;
    }
    CHECK(ok);
    CHECK(pos == fed.n);
    CHECK(full > 0); /* long documents fill sequences */
    CHECK(real == dev_shard_token_count(s));
    CHECK(dev_shard_read(s, dev_shard_count(s), tok) == -1);
    /* documents never share a sequence: each document starts a new one, so
     * there are at least as many sequences as documents */
    CHECK(dev_shard_count(s) >= dev_shard_doc_count(s));
    CHECK(dev_shard_doc_start(s, 0) == 0);
    CHECK(dev_shard_doc_start(s, dev_shard_doc_count(s)) == dev_shard_count(s));
    /* the stored vocabulary is the one it was made with */
    dev_vocab *sv = dev_shard_vocab(s, &err);
    CHECK(sv && dev_vocab_size(sv) == dev_vocab_size(vocab));
    if (sv) {
        uint8_t h3[32];
        dev_vocab_hash(sv, h3);
        CHECK(memcmp(h3, h2, 32) == 0);
        dev_vocab_free(sv);
    }
    dev_shard_close(s);
    dev_ids_free(&fed);
    free(text);
}

static void test_packing(void)
{
    /* Documents kept apart; a sentence longer than T-2 is cut; sentences
     * that fit share a sequence. T = 6, so 4 tokens inside. */
    sl_err err = {0};
    dev_shard_writer *w = dev_shard_writer_new(vocab, 6, false, &err);
    int32_t a[] = {200, 201}, b[] = {202, 203, 204}, c[] = {205, 206, 207, 208, 209, 210, 211, 212, 213};
    dev_shard_writer_sentence(w, a, 2);
    dev_shard_writer_sentence(w, a, 2); /* fits: [a a] */
    dev_shard_writer_sentence(w, b, 3); /* does not: new sequence */
    dev_shard_writer_end_doc(w);
    dev_shard_writer_end_doc(w); /* empty document: ignored */
    dev_shard_writer_sentence(w, c, 9); /* 4 + 4 + 1 */
    dev_shard_writer_sentence(w, a, 2); /* joins the last piece */
    const char *path = tmp_path("p.shard");
    CHECK(dev_shard_writer_finish(w, path, &err) == 0);
    dev_shard_writer_free(w);
    dev_shard *s = dev_shard_open(path, &err);
    CHECKF(s != NULL, "%s", err.msg);
    if (!s)
        return;
    static const int want[5][6] = {{200, 201, 200, 201}, {202, 203, 204}, {205, 206, 207, 208},
                                   {209, 210, 211, 212}, {213, 200, 201}};
    static const int wlen[5] = {4, 3, 4, 4, 3};
    CHECK(dev_shard_count(s) == 5 && dev_shard_doc_count(s) == 2);
    CHECK(dev_shard_doc_start(s, 1) == 2);
    dev_special sp = dev_shard_special(s);
    int32_t tok[6];
    for (int i = 0; i < 5 && dev_shard_count(s) == 5; i++) {
        int n = dev_shard_read(s, (uint64_t)i, tok);
        CHECK(n == wlen[i] + 2 && tok[0] == sp.cls && tok[n - 1] == sp.sep);
        for (int k = 0; k < wlen[i]; k++)
            CHECK(tok[1 + k] == want[i][k]);
    }
    dev_shard_close(s);
    /* nothing to write is an error, not an empty shard */
    w = dev_shard_writer_new(vocab, 8, false, &err);
    CHECK(dev_shard_writer_finish(w, tmp_path("empty.shard"), &err) == -1);
    CHECK(strstr(err.msg, "no text") != NULL);
    dev_shard_writer_free(w);
    /* a vocabulary without [CLS]/[SEP]/[PAD]/[MASK] cannot make shards */
    dev_vocab *bare = dev_vocab_parse("[UNK]\na\n", 8, "bare", &err);
    CHECK(dev_shard_writer_new(bare, 8, false, &err) == NULL && strstr(err.msg, "[PAD]"));
    CHECK(dev_shard_writer_new(vocab, 2, false, &err) == NULL);
    dev_vocab_free(bare);
}

/* The writer spills tokens to $TMPDIR: an unusable TMPDIR is refused when
 * the writer is made, and a spill that cannot be written (here: a file size
 * limit) fails finish() with the reason and leaves no output file. */
static void test_spill_faults(void)
{
    sl_err err = {0};
    const char *old = getenv("TMPDIR");
    char *saved = old ? strdup(old) : NULL;
    setenv("TMPDIR", "/nonexistent-skyloom-dir", 1);
    CHECK(dev_shard_writer_new(vocab, 8, false, &err) == NULL && strstr(err.msg, "spill file") &&
          strstr(err.msg, "/nonexistent-skyloom-dir"));
    if (saved)
        setenv("TMPDIR", saved, 1);
    else
        unsetenv("TMPDIR");
    free(saved);

    dev_shard_writer *w = dev_shard_writer_new(vocab, 64, false, &err);
    CHECKF(w != NULL, "%s", err.msg);
    if (!w)
        return;
    struct rlimit lim, small;
    getrlimit(RLIMIT_FSIZE, &lim);
    small = lim;
    small.rlim_cur = 4096;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &small);
    int32_t ids[62];
    for (int i = 0; i < 62; i++)
        ids[i] = 200 + i;
    for (int k = 0; k < 100; k++) /* 100 x 64 tokens x 2 bytes > 4096 */
        dev_shard_writer_sentence(w, ids, 62);
    const char *path = tmp_path("spill.shard");
    int rc = dev_shard_writer_finish(w, path, &err);
    setrlimit(RLIMIT_FSIZE, &lim);
    signal(SIGXFSZ, prev);
    CHECKF(rc == -1 && strstr(err.msg, "writing the tokens to the spill file"), "rc %d: %s", rc, err.msg);
    CHECK(access(path, F_OK) != 0);
    dev_shard_writer_free(w);
}

/* ---- damage ---- */
static uint8_t *good;
static size_t good_len;

static int refused(const void *bytes, size_t n, const char *want, int *code)
{
    const char *p = tmp_path("bad.shard");
    write_bytes(p, bytes, n);
    sl_err err = {0};
    dev_shard *s = dev_shard_open(p, &err);
    if (s) {
        dev_shard_close(s);
        fprintf(stderr, "  accepted a damaged shard (want '%s')\n", want ? want : "any");
        return 0;
    }
    if (code)
        *code = err.code;
    if (!strstr(err.msg, "refused") || (want && !strstr(err.msg, want))) {
        fprintf(stderr, "  message '%s' lacks '%s'\n", err.msg, want ? want : "refused");
        return 0;
    }
    return 1;
}

static void resign(uint8_t *b, size_t n)
{
    crypto_generichash(b + n - 32, 32, b, n - 32, NULL, 0);
}

static void test_damage(void)
{
    sl_err err = {0};
    char *buf;
    if (sl_read_file(tmp_path("a.shard"), 1 << 30, &buf, &good_len, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    good = (uint8_t *)buf;
    dev_shard *s = dev_shard_open(tmp_path("a.shard"), &err); /* sanity: the good one opens */
    CHECK(s != NULL);
    dev_shard_close(s);
    uint8_t *b = malloc(good_len + 64);

    /* truncated anywhere */
    size_t cuts[] = {0, 1, 7, 8, 100, 128, 159, 160, good_len / 2, good_len - 33, good_len - 32,
                     good_len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++)
        CHECKF(refused(good, cuts[i], "truncated", NULL), "cut at %zu", cuts[i]);
    /* trailing bytes */
    memcpy(b, good, good_len);
    b[good_len] = 0;
    CHECK(refused(b, good_len + 1, "trailing", NULL));
    /* one flipped bit anywhere: refused (checksum, or the header check that
     * comes first) */
    int all = 1, by_sum = 0, flips = 0;
    for (size_t i = 0; i < good_len; i += (i < 256 ? 1 : 13), flips++) {
        memcpy(b, good, good_len);
        b[i] ^= 0x10;
        int code = 0;
        if (!refused(b, good_len, NULL, &code) || (code != SL_ECORRUPT && code != SL_ENOTSUP)) {
            all = 0;
            fprintf(stderr, "  flip at byte %zu\n", i);
        }
        if (i >= 128) {
            sl_err e2 = {0};
            dev_shard *s = dev_shard_open(tmp_path("bad.shard"), &e2);
            by_sum += !s && strstr(e2.msg, "checksum mismatch") != NULL;
            dev_shard_close(s);
        }
    }
    CHECK(all);
    CHECKF(flips > 1000 && by_sum > 100, "%d flips, %d caught by the checksum", flips, by_sum);
    /* each header field by name */
    memcpy(b, good, good_len);
    memcpy(b, "NOTSHARD", 8);
    CHECK(refused(b, good_len, "bad magic", NULL));
    memcpy(b, good, good_len);
    b[8] = 2; /* version */
    CHECK(refused(b, good_len, "version 2", NULL));
    memcpy(b, good, good_len);
    b[88] = 3; /* token width */
    CHECK(refused(b, good_len, "token width 3", NULL));
    memcpy(b, good, good_len);
    b[52] = 2; b[53] = 0; /* T = 2 */
    CHECK(refused(b, good_len, "sequence length", NULL));
    memcpy(b, good, good_len);
    b[63] = 0x40; /* absurd sequence count */
    CHECK(refused(b, good_len, "truncated", NULL));
    memcpy(b, good, good_len);
    b[120] = 1; /* reserved */
    CHECK(refused(b, good_len, "reserved", NULL));

    /* a valid checksum over inconsistent contents (a buggy or hostile writer) */
    uint64_t n = 0, d = 0, vb = 0;
    memcpy(&n, good + 56, 8);
    memcpy(&d, good + 64, 8);
    memcpy(&vb, good + 80, 8);
    size_t off_doc = 128 + 8 * (n + 1), off_voc = off_doc + 8 * (d + 1);
    size_t off_tok = off_voc + ((vb + 7) & ~(uint64_t)7);
    memcpy(b, good, good_len);
    b[off_tok + 2] = 0xff; /* second token of sequence 0 := id >= vocab size */
    b[off_tok + 3] = 0xff;
    resign(b, good_len);
    CHECK(refused(b, good_len, "inconsistent: token 1 has id 65535", NULL));
    memcpy(b, good, good_len);
    b[128 + 8] += 1; /* sequence 1 starts one token later */
    resign(b, good_len);
    CHECK(refused(b, good_len, "inconsistent", NULL));
    /* with T at its largest, sequence n-2 runs past the end of the tokens
     * (and of the file): refused before any token beyond them is read */
    uint64_t a_last, ntok;
    memcpy(&a_last, good + 128 + 8 * (n - 2), 8);
    memcpy(&ntok, good + 72, 8);
    uint32_t t_max = DEV_SHARD_MAX_SEQ;
    uint64_t past = a_last + t_max;
    CHECK(n >= 2 && past > ntok);
    memcpy(b, good, good_len);
    memcpy(b + 52, &t_max, 4);
    memcpy(b + 128 + 8 * (n - 1), &past, 8);
    resign(b, good_len);
    CHECK(refused(b, good_len, "inconsistent: sequence", NULL) &&
          refused(b, good_len, "ends at token", NULL));
    memcpy(b, good, good_len);
    b[off_doc + 8] = 0; /* document 0 empty */
    b[off_doc + 9] = 0;
    resign(b, good_len);
    CHECK(refused(b, good_len, "inconsistent: document 0", NULL));
    memcpy(b, good, good_len);
    b[off_voc] ^= 1; /* vocabulary text no longer matches its hash */
    resign(b, good_len);
    CHECK(refused(b, good_len, "vocabulary does not match", NULL));
    memcpy(b, good, good_len);
    b[off_tok] = b[off_tok + 2]; /* sequence 0 does not start with [CLS] */
    b[off_tok + 1] = b[off_tok + 3];
    resign(b, good_len);
    CHECK(refused(b, good_len, "[CLS]", NULL));
    memcpy(b, good, good_len);
    b[96] = 0xff; /* [PAD] id out of the vocabulary */
    b[97] = 0xff;
    resign(b, good_len);
    CHECK(refused(b, good_len, "special token", NULL));
    /* special ids swapped, equal, or pointing at ordinary tokens */
    uint32_t ids[5];
    memcpy(ids, good + 96, 20);
    memcpy(b, good, good_len);
    memcpy(b + 112, &ids[3], 4); /* [MASK] := [SEP] */
    resign(b, good_len);
    CHECK(refused(b, good_len, "[SEP] and [MASK] have the same id", NULL));
    memcpy(b, good, good_len);
    memcpy(b + 100, &ids[0], 4); /* [UNK] := [PAD] */
    resign(b, good_len);
    CHECK(refused(b, good_len, "[PAD] and [UNK] have the same id", NULL));
    memcpy(b, good, good_len);
    uint32_t ordinary = 7;
    memcpy(b + 112, &ordinary, 4); /* [MASK] := an ordinary token */
    resign(b, good_len);
    CHECK(refused(b, good_len, "the header gives [MASK] id 7, which is", NULL));
    memcpy(b, good, good_len);
    memcpy(b + 96, &ids[1], 4); /* [PAD] and [UNK] swapped */
    memcpy(b + 100, &ids[0], 4);
    resign(b, good_len);
    CHECK(refused(b, good_len, "the header gives [PAD] id", NULL));

    /* not a file */
    CHECK(dev_shard_open(tmp_dir, &err) == NULL && strstr(err.msg, "not a regular file"));
    CHECK(dev_shard_open(tmp_path("missing.shard"), &err) == NULL && err.code == SL_EIO);
    free(b);
    free(good);
}

static void test_vocab_mismatch(void)
{
    sl_err err = {0};
    dev_shard *s = dev_shard_open(tmp_path("a.shard"), &err);
    if (!s)
        return;
    dev_vocab *other = dev_vocab_parse("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nx\n", 33, "o", &err);
    uint8_t h[32];
    dev_vocab_hash(other, h);
    CHECK(dev_shard_check_vocab(s, h, dev_vocab_size(other), &err) == -1);
    CHECKF(strstr(err.msg, "refused") && strstr(err.msg, "made with vocabulary") &&
               strstr(err.msg, "(6 tokens)"),
           "%s", err.msg);
    /* same hash, different size (a config that disagrees) */
    dev_vocab_hash(vocab, h);
    CHECK(dev_shard_check_vocab(s, h, dev_vocab_size(vocab) + 1, &err) == -1);
    dev_vocab_free(other);
    dev_shard_close(s);
}

static void test_wide_tokens(void)
{
    /* more than 65536 tokens: 4-byte ids */
    size_t cap = 80000 * 12, n = 0;
    char *t = malloc(cap);
    n += (size_t)sprintf(t, "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n");
    for (int i = 0; i < 70000; i++)
        n += (size_t)sprintf(t + n, "w%d\n", i);
    sl_err err = {0};
    dev_vocab *v = dev_vocab_parse(t, n, "big", &err);
    CHECK(v && dev_vocab_size(v) == 70005);
    dev_shard_writer *w = dev_shard_writer_new(v, 16, true, &err);
    int32_t ids[3] = {70004, 5, 66000};
    dev_shard_writer_sentence(w, ids, 3);
    CHECK(dev_shard_writer_finish(w, tmp_path("wide.shard"), &err) == 0);
    dev_shard_writer_free(w);
    dev_shard *s = dev_shard_open(tmp_path("wide.shard"), &err);
    CHECKF(s != NULL, "%s", err.msg);
    if (s) {
        int32_t tok[16];
        CHECK(dev_shard_read(s, 0, tok) == 5 && tok[1] == 70004 && tok[3] == 66000);
        CHECK(dev_shard_cased(s));
        dev_shard_close(s);
    }
    dev_vocab_free(v);
    free(t);
}

/* labels.txt: names by line, the strict checks with file and line, lookup,
 * the hash over "name\n" (a CRLF copy hashes like its LF twin), sorting. */
static void test_labels(void)
{
    sl_err err = {0};
    dev_labels *l = dev_labels_parse("neg\npos\nmixed\n", 14, "labels.txt", &err);
    CHECKF(l != NULL, "%s", err.msg);
    dev_labels *crlf = dev_labels_parse("neg\r\npos\r\nmixed", 15, "crlf.txt", &err);
    CHECKF(crlf != NULL, "%s", err.msg);
    if (l && crlf) {
        CHECK(dev_labels_count(l) == 3 && !strcmp(dev_labels_name(l, 2), "mixed"));
        CHECK(dev_labels_find(l, "pos", 3) == 1 && dev_labels_find(l, "po", 2) == -1 &&
              dev_labels_name(l, 3) == NULL);
        uint8_t a[32], b[32];
        dev_labels_hash(l, a);
        dev_labels_hash(crlf, b);
        CHECK(memcmp(a, b, 32) == 0);
    }
    dev_labels_free(l);
    dev_labels_free(crlf);
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"", "empty label file"},
        {"a\n\nb\n", "line 2 is empty"},
        {"a\nb\na\n", "duplicate label 'a' on lines 1 and 3"},
        {"only\n", "1 labels; a classification needs 2"},
        {"a\nb\tc\n", "line 2: the label holds a tab"},
        {"a\n b\n", "line 2: the label starts or ends with a space"},
        {"a\n\xff\n", "line 2: the label is not valid UTF-8"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sl_err e = {0};
        dev_labels *x = dev_labels_parse(bad[i].text, strlen(bad[i].text), "labels.txt", &e);
        CHECKF(!x && strstr(e.msg, "labels.txt") && strstr(e.msg, bad[i].want), "case %zu: '%s'",
               i, e.msg);
        dev_labels_free(x);
    }
    /* from a set: numbers in numeric order, else byte order */
    const char *nums[] = {"10", "2", "1"}, *words[] = {"pos", "Neg", "neg"};
    l = dev_labels_from(nums, 3, 1, "data", &err);
    CHECK(l && !strcmp(dev_labels_name(l, 0), "1") && !strcmp(dev_labels_name(l, 2), "10"));
    dev_labels_free(l);
    l = dev_labels_from(words, 3, 1, "data", &err);
    CHECK(l && !strcmp(dev_labels_name(l, 0), "Neg") && !strcmp(dev_labels_name(l, 2), "pos"));
    dev_labels_free(l);
}

/* A labelled shard (version 2): one example per sequence and document, cut
 * to T with its [SEP] kept, classes and label vocabulary read back; damage
 * to the label parts refused by name; and an unlabelled shard is still
 * version 1. */
static void test_labelled(void)
{
    sl_err err = {0};
    dev_labels *l = dev_labels_parse("sports\nscience\narts\n", 20, "labels.txt", &err);
    CHECKF(l != NULL, "%s", err.msg);
    if (!l)
        return;
    dev_shard_writer *w = dev_shard_writer_labelled(vocab, 6, false, l, &err);
    CHECKF(w != NULL, "%s", err.msg);
    int32_t a[] = {200, 201}, c[] = {205, 206, 207, 208, 209, 210};
    CHECK(dev_shard_writer_example(w, a, 2, 2) == 0);
    CHECK(dev_shard_writer_example(w, c, 6, 0) == 1); /* cut to 4 */
    CHECK(dev_shard_writer_example(w, a, 1, 1) == 0);
    const char *path = tmp_path("l.shard");
    CHECKF(dev_shard_writer_finish(w, path, &err) == 0, "%s", err.msg);
    dev_shard_writer_free(w);
    dev_shard *s = dev_shard_open(path, &err);
    CHECKF(s != NULL, "%s", err.msg);
    if (s) {
        CHECK(dev_shard_version(s) == 2 && dev_shard_count(s) == 3 && dev_shard_doc_count(s) == 3);
        const dev_labels *sl = dev_shard_labels(s);
        CHECK(sl && dev_labels_count(sl) == 3 && !strcmp(dev_labels_name(sl, 1), "science"));
        CHECK(dev_shard_label(s, 0) == 2 && dev_shard_label(s, 1) == 0 &&
              dev_shard_label(s, 2) == 1 && dev_shard_label(s, 3) == -1);
        int32_t tok[6];
        dev_special sp = dev_shard_special(s);
        CHECK(dev_shard_read(s, 1, tok) == 6 && tok[0] == sp.cls && tok[4] == 208 &&
              tok[5] == sp.sep);
        CHECK(dev_shard_read(s, 2, tok) == 3 && tok[3] == sp.pad);
        dev_shard_close(s);
    }
    s = dev_shard_open(tmp_path("p.shard"), &err); /* test_packing's, without labels */
    CHECK(s && dev_shard_version(s) == 1 && !dev_shard_labels(s) && dev_shard_label(s, 0) == -1);
    dev_shard_close(s);
    /* a writer given sentences cannot finish a labelled shard */
    w = dev_shard_writer_labelled(vocab, 6, false, l, &err);
    dev_shard_writer_sentence(w, a, 2);
    CHECK(dev_shard_writer_finish(w, tmp_path("x.shard"), &err) == -1 &&
          strstr(err.msg, "examples only"));
    dev_shard_writer_free(w);
    dev_labels_free(l);

    char *buf;
    size_t n;
    if (sl_read_file(path, 1 << 20, &buf, &n, &err))
        return;
    uint8_t *b = malloc(n);
    uint64_t nseq, ndoc, vb, lb;
    memcpy(&nseq, buf + 56, 8);
    memcpy(&ndoc, buf + 64, 8);
    memcpy(&vb, buf + 80, 8);
    memcpy(&lb, buf + 120, 8);
    size_t off_lab = 160 + 8 * (nseq + 1) + 8 * (ndoc + 1) + ((vb + 7) & ~(uint64_t)7);
    size_t off_cls = off_lab + ((lb + 7) & ~(uint64_t)7);
    memcpy(b, buf, n);
    b[off_cls] = 3; /* sequence 0's class := 3, with 3 labels */
    resign(b, n);
    CHECK(refused(b, n, "sequence 0 has class 3, there are 3 labels", NULL));
    memcpy(b, buf, n);
    b[off_lab] ^= 1; /* label text no longer matches its hash */
    resign(b, n);
    CHECK(refused(b, n, "labels do not match the header's hash", NULL));
    memcpy(b, buf, n);
    b[116] = 1; /* one label */
    resign(b, n);
    CHECK(refused(b, n, "label count 1", NULL));
    memcpy(b, buf, n);
    b[12] = 128; /* version 2 with version 1's header */
    CHECK(refused(b, n, "header size 128, version 2 has 160", NULL));
    memcpy(b, buf, n);
    b[off_cls + 4] ^= 1;
    CHECK(refused(b, n, "checksum mismatch", NULL));
    free(b);
    free(buf);
}

int main(void)
{
    if (sodium_init() < 0)
        return 1;
    size_t len;
    char *text = gen_corpus(1, 400, &len);
    vocab = gen_vocab(text, len, false, 300);
    free(text);
    CHECK(vocab != NULL);
    if (!vocab)
        return sl_test_done();
    RUN(test_round_trip);
    RUN(test_packing);
    RUN(test_spill_faults);
    RUN(test_damage);
    RUN(test_vocab_mismatch);
    RUN(test_wide_tokens);
    RUN(test_labels);
    RUN(test_labelled);
    dev_vocab_free(vocab);
    tmp_cleanup();
    return sl_test_done();
}
