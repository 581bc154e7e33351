#include "dev_shard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dev_hashed.h"
#include "sl_file.h"
#include "dev_tok.h"
#include "sl_mem.h"

static const char MAGIC[8] = {'S', 'K', 'Y', 'S', 'H', 'A', 'R', 'D'};

/* Header field offsets. */
enum {
    H_MAGIC = 0, H_VERSION = 8, H_HEADER_BYTES = 12, H_VOCAB_HASH = 16, H_VOCAB_SIZE = 48,
    H_SEQ_LEN = 52, H_SEQ_COUNT = 56, H_DOC_COUNT = 64, H_TOKEN_COUNT = 72, H_VOCAB_BYTES = 80,
    H_TOKEN_WIDTH = 88, H_FLAGS = 92, H_PAD = 96, H_UNK = 100, H_CLS = 104, H_SEP = 108,
    H_MASK = 112, H_RESERVED = 116,
    /* version 2 (labelled): where version 1 has its reserved bytes, and after */
    H_LABEL_COUNT = 116, H_LABEL_BYTES = 120, H_LABEL_HASH = 128
};

static inline uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t rd64(const uint8_t *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static inline void wr32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}
static inline void wr64(uint8_t *p, uint64_t v)
{
    wr32(p, (uint32_t)v);
    wr32(p + 4, (uint32_t)(v >> 32));
}
static inline uint64_t pad8(uint64_t n) { return (n + 7) & ~(uint64_t)7; }

struct dev_shard {
    char *path;
    const uint8_t *map;
    size_t size;
    uint64_t n, d, ntok, vocab_bytes;
    int T, vocab_size, width, version;
    bool cased;
    uint8_t hash[32];
    dev_special sp;
    const uint8_t *seq, *doc, *vocab, *tok;
    /* version 2: the label vocabulary and each sequence's class */
    uint64_t label_bytes;
    uint32_t nlabels;
    const uint8_t *lab, *cls;
    dev_labels *labels;
};

static inline uint32_t tok_at(const dev_shard *s, uint64_t i)
{
    if (s->width == 2) {
        const uint8_t *p = s->tok + 2 * i;
        return (uint32_t)p[0] | (uint32_t)p[1] << 8;
    }
    return rd32(s->tok + 4 * i);
}

void dev_shard_close(dev_shard *s)
{
    if (!s)
        return;
    if (s->map)
        munmap((void *)s->map, s->size);
    dev_labels_free(s->labels);
    free(s->path);
    free(s);
}

static dev_shard *fail(dev_shard *s, sl_err *err, int code, const char *why)
{
    sl_err_set(err, code, "shard %s refused: %s", s->path, why);
    dev_shard_close(s);
    return NULL;
}

#define REFUSE(code, ...)                                                                   \
    do {                                                                                    \
        char why_[400];                                                                     \
        snprintf(why_, sizeof why_, __VA_ARGS__);                                           \
        return fail(s, err, code, why_);                            \
    } while (0)

dev_shard *dev_shard_open(const char *path, sl_err *err)
{
    dev_shard *s = sl_xcalloc(1, sizeof *s);
    s->path = sl_xstrdup(path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        REFUSE(SL_EIO, "%s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        REFUSE(SL_EIO, "not a regular file");
    }
    s->size = (size_t)st.st_size;
    if (s->size < 8) {
        close(fd);
        REFUSE(SL_ECORRUPT, "truncated: %zu bytes, not even a magic number", s->size);
    }
    void *m = mmap(NULL, s->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        REFUSE(SL_EIO, "mmap: %s", strerror(errno));
    s->map = m;
    const uint8_t *h = s->map;
    if (memcmp(h + H_MAGIC, MAGIC, 8) != 0)
        REFUSE(SL_ECORRUPT, "not a Skyloom shard (bad magic)");
    if (s->size < DEV_SHARD_HEADER_BYTES + 32)
        REFUSE(SL_ECORRUPT, "truncated: %zu bytes, shorter than the %d-byte header and checksum",
               s->size, DEV_SHARD_HEADER_BYTES + 32);
    uint32_t version = rd32(h + H_VERSION);
    if (version != DEV_SHARD_VERSION && version != DEV_SHARD_VERSION_LABELLED)
        REFUSE(SL_ENOTSUP, "format version %u, this build reads versions %d and %d", version,
               DEV_SHARD_VERSION, DEV_SHARD_VERSION_LABELLED);
    s->version = (int)version;
    int labelled = version == DEV_SHARD_VERSION_LABELLED;
    uint32_t hbytes = labelled ? DEV_SHARD_HEADER_BYTES_LABELLED : DEV_SHARD_HEADER_BYTES;
    if (rd32(h + H_HEADER_BYTES) != hbytes)
        REFUSE(SL_ECORRUPT, "header size %u, version %u has %u", rd32(h + H_HEADER_BYTES),
               version, hbytes);
    if (s->size < hbytes + 32)
        REFUSE(SL_ECORRUPT, "truncated: %zu bytes, shorter than the %u-byte header and checksum",
               s->size, hbytes + 32);
    s->vocab_size = (int)rd32(h + H_VOCAB_SIZE);
    s->T = (int)rd32(h + H_SEQ_LEN);
    s->n = rd64(h + H_SEQ_COUNT);
    s->d = rd64(h + H_DOC_COUNT);
    s->ntok = rd64(h + H_TOKEN_COUNT);
    s->vocab_bytes = rd64(h + H_VOCAB_BYTES);
    s->width = (int)rd32(h + H_TOKEN_WIDTH);
    uint32_t flags = rd32(h + H_FLAGS);
    s->cased = flags & 1;
    memcpy(s->hash, h + H_VOCAB_HASH, 32);
    s->sp.pad = (int)rd32(h + H_PAD);
    s->sp.unk = (int)rd32(h + H_UNK);
    s->sp.cls = (int)rd32(h + H_CLS);
    s->sp.sep = (int)rd32(h + H_SEP);
    s->sp.mask = (int)rd32(h + H_MASK);
    for (int i = H_RESERVED; !labelled && i < DEV_SHARD_HEADER_BYTES; i++)
        if (h[i])
            REFUSE(SL_ECORRUPT, "reserved header byte %d is not zero", i);
    if (labelled) {
        s->nlabels = rd32(h + H_LABEL_COUNT);
        s->label_bytes = rd64(h + H_LABEL_BYTES);
        if (s->nlabels < 2 || s->nlabels > DEV_LABELS_MAX)
            REFUSE(SL_ECORRUPT, "label count %u out of range 2..%d", s->nlabels, DEV_LABELS_MAX);
        if (s->label_bytes > s->size)
            REFUSE(SL_ECORRUPT, "truncated: the header's %llu bytes of labels are more than the "
                   "file's %zu", (unsigned long long)s->label_bytes, s->size);
    }
    if (flags & ~1u)
        REFUSE(SL_ECORRUPT, "unknown flags 0x%x", flags);
    if (s->width != 2 && s->width != 4)
        REFUSE(SL_ECORRUPT, "token width %d, expected 2 or 4", s->width);
    if ((uint32_t)s->vocab_size == 0 || (uint32_t)s->vocab_size > DEV_VOCAB_MAX_SIZE)
        REFUSE(SL_ECORRUPT, "vocabulary size %u out of range", (uint32_t)s->vocab_size);
    if (s->width == 2 && s->vocab_size > 65536)
        REFUSE(SL_ECORRUPT, "2-byte tokens with a vocabulary of %d", s->vocab_size);
    if ((uint32_t)s->T < 3 || (uint32_t)s->T > DEV_SHARD_MAX_SEQ)
        REFUSE(SL_ECORRUPT, "sequence length %u out of range 3..%d", (uint32_t)s->T,
               DEV_SHARD_MAX_SEQ);
    /* Section sizes; each bounded by the file size first so nothing overflows. */
    if (s->n >= s->size / 8 || s->d >= s->size / 8 || s->ntok > s->size ||
        s->vocab_bytes > s->size)
        REFUSE(SL_ECORRUPT, "truncated: the header's counts (%llu sequences, %llu documents, "
                            "%llu tokens) need more than the file's %zu bytes",
               (unsigned long long)s->n, (unsigned long long)s->d, (unsigned long long)s->ntok,
               s->size);
    uint64_t off_seq = hbytes;
    uint64_t off_doc = off_seq + 8 * (s->n + 1);
    uint64_t off_voc = off_doc + 8 * (s->d + 1);
    uint64_t off_lab = off_voc + pad8(s->vocab_bytes);
    uint64_t off_cls = off_lab + (labelled ? pad8(s->label_bytes) : 0);
    uint64_t off_tok = off_cls + (labelled ? pad8(4 * s->n) : 0);
    uint64_t off_sum = off_tok + pad8(s->ntok * (uint64_t)s->width);
    uint64_t want = off_sum + 32;
    if (s->size < want)
        REFUSE(SL_ECORRUPT, "truncated: the header promises %llu bytes, the file has %zu",
               (unsigned long long)want, s->size);
    if (s->size > want)
        REFUSE(SL_ECORRUPT, "%zu bytes of trailing data after the %llu the header promises",
               s->size - (size_t)want, (unsigned long long)want);
    if (sodium_init() < 0)
        REFUSE(SL_EINTERNAL, "libsodium failed to initialise");
    uint8_t sum[32], vh[32];
    crypto_generichash(sum, 32, s->map, off_sum, NULL, 0);
    if (memcmp(sum, s->map + off_sum, 32) != 0)
        REFUSE(SL_ECORRUPT, "checksum mismatch: the file is corrupted");
    s->seq = s->map + off_seq;
    s->doc = s->map + off_doc;
    s->vocab = s->map + off_voc;
    s->tok = s->map + off_tok;
    if (labelled) {
        s->lab = s->map + off_lab;
        s->cls = s->map + off_cls;
        crypto_generichash(vh, 32, s->lab, s->label_bytes, NULL, 0);
        if (memcmp(vh, h + H_LABEL_HASH, 32) != 0)
            REFUSE(SL_ECORRUPT, "inconsistent: the stored labels do not match the header's hash");
        sl_err lerr = {0};
        if (!(s->labels = dev_labels_parse((const char *)s->lab, s->label_bytes, "labels", &lerr)))
            REFUSE(SL_ECORRUPT, "inconsistent: the stored labels: %.200s", lerr.msg);
        if (dev_labels_count(s->labels) != (int)s->nlabels)
            REFUSE(SL_ECORRUPT, "inconsistent: %d stored labels, header says %u",
                   dev_labels_count(s->labels), s->nlabels);
        for (uint64_t i = 0; i < s->n; i++)
            if (rd32(s->cls + 4 * i) >= s->nlabels)
                REFUSE(SL_ECORRUPT, "inconsistent: sequence %llu has class %u, there are %u labels",
                       (unsigned long long)i, rd32(s->cls + 4 * i), s->nlabels);
    }

    /* The checksum says the bytes are as written; these say the writer was sane. */
    crypto_generichash(vh, 32, s->vocab, s->vocab_bytes, NULL, 0);
    if (memcmp(vh, s->hash, 32) != 0)
        REFUSE(SL_ECORRUPT, "inconsistent: the stored vocabulary does not match the header's hash");
    uint64_t lines = 0;
    for (uint64_t i = 0; i < s->vocab_bytes; i++)
        lines += s->vocab[i] == '\n';
    if (lines != (uint64_t)s->vocab_size || !s->vocab_bytes || s->vocab[s->vocab_bytes - 1] != '\n')
        REFUSE(SL_ECORRUPT, "inconsistent: %llu vocabulary lines, header says %d",
               (unsigned long long)lines, s->vocab_size);
    int spv[5] = {s->sp.pad, s->sp.unk, s->sp.cls, s->sp.sep, s->sp.mask};
    static const char *const spname[5] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    for (int i = 0; i < 5; i++) {
        if (spv[i] < 0 || spv[i] >= s->vocab_size)
            REFUSE(SL_ECORRUPT, "inconsistent: special token id %d outside the vocabulary", spv[i]);
        for (int j = 0; j < i; j++)
            if (spv[i] == spv[j])
                REFUSE(SL_ECORRUPT, "inconsistent: %s and %s have the same id %d", spname[j],
                       spname[i], spv[i]);
    }
    /* Each id must name its token in the stored vocabulary. */
    const char *line[5] = {0};
    size_t line_len[5] = {0};
    int id = 0;
    for (uint64_t i = 0, start = 0; i < s->vocab_bytes; i++) {
        if (s->vocab[i] != '\n')
            continue;
        for (int k = 0; k < 5; k++)
            if (spv[k] == id) {
                line[k] = (const char *)s->vocab + start;
                line_len[k] = (size_t)(i - start);
            }
        id++;
        start = i + 1;
    }
    for (int k = 0; k < 5; k++)
        if (line_len[k] != strlen(spname[k]) || memcmp(line[k], spname[k], line_len[k]) != 0)
            REFUSE(SL_ECORRUPT, "inconsistent: the header gives %s id %d, which is '%.*s' in the "
                   "stored vocabulary", spname[k], spv[k], line_len[k] > 32 ? 32 : (int)line_len[k],
                   line[k] ? line[k] : "");
    if (s->n == 0)
        REFUSE(SL_ECORRUPT, "no sequences");
    if (rd64(s->seq) != 0 || rd64(s->seq + 8 * s->n) != s->ntok)
        REFUSE(SL_ECORRUPT, "inconsistent: sequence offsets do not cover the %llu tokens",
               (unsigned long long)s->ntok);
    for (uint64_t i = 0; i < s->n; i++) {
        uint64_t a = rd64(s->seq + 8 * i), b = rd64(s->seq + 8 * (i + 1));
        if (b < a + 2 || b - a > (uint64_t)s->T)
            REFUSE(SL_ECORRUPT, "inconsistent: sequence %llu has length %lld (must be 2..%d)",
                   (unsigned long long)i, (long long)(b - a), s->T);
        if (b > s->ntok)
            REFUSE(SL_ECORRUPT, "inconsistent: sequence %llu ends at token %llu, past the %llu "
                   "tokens", (unsigned long long)i, (unsigned long long)b,
                   (unsigned long long)s->ntok);
        if (tok_at(s, a) != (uint32_t)s->sp.cls || tok_at(s, b - 1) != (uint32_t)s->sp.sep)
            REFUSE(SL_ECORRUPT, "inconsistent: sequence %llu is not [CLS] ... [SEP]",
                   (unsigned long long)i);
    }
    if (rd64(s->doc) != 0 || rd64(s->doc + 8 * s->d) != s->n)
        REFUSE(SL_ECORRUPT, "inconsistent: document boundaries do not cover the %llu sequences",
               (unsigned long long)s->n);
    for (uint64_t i = 0; i < s->d; i++)
        if (rd64(s->doc + 8 * (i + 1)) <= rd64(s->doc + 8 * i))
            REFUSE(SL_ECORRUPT, "inconsistent: document %llu is empty or out of order",
                   (unsigned long long)i);
    for (uint64_t i = 0; i < s->ntok; i++)
        if (tok_at(s, i) >= (uint32_t)s->vocab_size)
            REFUSE(SL_ECORRUPT, "inconsistent: token %llu has id %u, vocabulary size is %d",
                   (unsigned long long)i, tok_at(s, i), s->vocab_size);
    return s;
}

uint64_t dev_shard_count(const dev_shard *s) { return s->n; }
int dev_shard_version(const dev_shard *s) { return s->version; }
const dev_labels *dev_shard_labels(const dev_shard *s) { return s->labels; }
int dev_shard_label(const dev_shard *s, uint64_t idx)
{
    return s->cls && idx < s->n ? (int)rd32(s->cls + 4 * idx) : -1;
}
int dev_shard_seq_len(const dev_shard *s) { return s->T; }
void dev_shard_checksum(const dev_shard *s, uint8_t out[32])
{
    memcpy(out, s->map + s->size - 32, 32);
}

void dev_shard_vocab_hash(const dev_shard *s, uint8_t out[32]) { memcpy(out, s->hash, 32); }
int dev_shard_vocab_size(const dev_shard *s) { return s->vocab_size; }
dev_special dev_shard_special(const dev_shard *s) { return s->sp; }
uint64_t dev_shard_doc_count(const dev_shard *s) { return s->d; }
uint64_t dev_shard_doc_start(const dev_shard *s, uint64_t doc)
{
    return doc <= s->d ? rd64(s->doc + 8 * doc) : s->n;
}
uint64_t dev_shard_token_count(const dev_shard *s) { return s->ntok; }
bool dev_shard_cased(const dev_shard *s) { return s->cased; }

int dev_shard_read(const dev_shard *s, uint64_t idx, int32_t *tok)
{
    if (idx >= s->n)
        return -1;
    uint64_t a = rd64(s->seq + 8 * idx), b = rd64(s->seq + 8 * (idx + 1));
    int len = (int)(b - a);
    for (int t = 0; t < len; t++)
        tok[t] = (int32_t)tok_at(s, a + (uint64_t)t);
    for (int t = len; t < s->T; t++)
        tok[t] = s->sp.pad;
    return len;
}

dev_vocab *dev_shard_vocab(const dev_shard *s, sl_err *err)
{
    dev_vocab *v = dev_vocab_parse((const char *)s->vocab, s->vocab_bytes, s->path, err);
    if (v && dev_vocab_size(v) != s->vocab_size) {
        dev_vocab_free(v);
        sl_err_set(err, SL_ECORRUPT, "%s: stored vocabulary has the wrong size", s->path);
        return NULL;
    }
    return v;
}

int dev_shard_check_vocab(const dev_shard *s, const uint8_t hash[32], int vocab_size, sl_err *err)
{
    if (memcmp(hash, s->hash, 32) == 0 && vocab_size == s->vocab_size)
        return 0;
    char a[65], b[65];
    dev_hash_hex(s->hash, a);
    dev_hash_hex(hash, b);
    return sl_err_set(err, SL_EINVAL,
                      "shard %s refused: it was made with vocabulary %.16s (%d tokens), the model "
                      "uses vocabulary %.16s (%d tokens)",
                      s->path, a, s->vocab_size, b, vocab_size);
}

/* ---- writer ----
 * The tokens go to an anonymous spill file in $TMPDIR (else /tmp) at their
 * final width as they come; memory holds only the sequence and document
 * offsets (8 bytes each). finish() streams the file out, hashing as it
 * writes: a corpus larger than memory can be prepared. */
struct dev_shard_writer {
    char *vocab_text;
    size_t vocab_len;
    uint8_t hash[32];
    int vocab_size, T, width;
    bool cased;
    dev_special sp;
    dev_ids cur;
    FILE *spill;
    int spill_errno; /* first write error on the spill file, 0 if none */
    uint64_t ntok;
    uint64_t *seq, *doc;
    size_t nseq, capseq, ndoc, capdoc;
    dev_labels *labels; /* a labelled shard's: then cls[i] is sequence i's class */
    uint32_t *cls;
    size_t ncls, capcls;
};

static FILE *open_spill(sl_err *err)
{
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir)
        dir = "/tmp";
    char path[4096];
    if (snprintf(path, sizeof path, "%s/skyloom-shard-XXXXXX", dir) >= (int)sizeof path) {
        sl_err_set(err, SL_EINVAL, "TMPDIR too long");
        return NULL;
    }
    int fd = mkstemp(path);
    if (fd < 0) {
        sl_err_set(err, SL_EIO, "cannot create a spill file in %s (set TMPDIR): %s", dir,
                   strerror(errno));
        return NULL;
    }
    unlink(path); /* anonymous: gone when closed, whatever happens */
    FILE *f = fdopen(fd, "w+b");
    if (!f) {
        sl_err_set(err, SL_EIO, "spill file: %s", strerror(errno));
        close(fd);
    }
    return f;
}

dev_shard_writer *dev_shard_writer_new(const dev_vocab *v, int seq_len, bool cased, sl_err *err)
{
    dev_special sp = dev_vocab_special(v);
    const char *miss = sp.pad < 0 ? "[PAD]" : sp.cls < 0 ? "[CLS]" : sp.sep < 0 ? "[SEP]"
                     : sp.mask < 0 ? "[MASK]" : NULL;
    if (miss) {
        sl_err_set(err, SL_EINVAL, "the vocabulary has no %s token", miss);
        return NULL;
    }
    if (seq_len < 3 || seq_len > DEV_SHARD_MAX_SEQ) {
        sl_err_set(err, SL_EINVAL, "sequence length %d: must be between 3 and %d", seq_len,
                   DEV_SHARD_MAX_SEQ);
        return NULL;
    }
    FILE *spill = open_spill(err);
    if (!spill)
        return NULL;
    dev_shard_writer *w = sl_xcalloc(1, sizeof *w);
    w->spill = spill;
    size_t len;
    const char *text = dev_vocab_text(v, &len);
    w->vocab_text = sl_xmalloc(len);
    memcpy(w->vocab_text, text, len);
    w->vocab_len = len;
    dev_vocab_hash(v, w->hash);
    w->vocab_size = dev_vocab_size(v);
    w->width = w->vocab_size <= 65536 ? 2 : 4;
    w->T = seq_len;
    w->cased = cased;
    w->sp = sp;
    w->capdoc = 64;
    w->doc = sl_xmalloc(w->capdoc * sizeof *w->doc);
    w->doc[w->ndoc++] = 0;
    return w;
}

static void put_tok(dev_shard_writer *w, int32_t id)
{
    uint8_t b[4];
    wr32(b, (uint32_t)id);
    if (fwrite(b, (size_t)w->width, 1, w->spill) != 1 && !w->spill_errno)
        w->spill_errno = errno ? errno : EIO;
    w->ntok++;
}

static void emit_seq(dev_shard_writer *w, const int32_t *ids, size_t n)
{
    if (w->nseq == w->capseq) {
        w->capseq = w->capseq ? w->capseq * 2 : 1024;
        w->seq = sl_xrealloc(w->seq, w->capseq * sizeof *w->seq);
    }
    w->seq[w->nseq++] = w->ntok;
    put_tok(w, w->sp.cls);
    for (size_t i = 0; i < n; i++)
        put_tok(w, ids[i]);
    put_tok(w, w->sp.sep);
}

void dev_shard_writer_sentence(dev_shard_writer *w, const int32_t *ids, size_t n)
{
    size_t budget = (size_t)w->T - 2;
    if (w->cur.n + n <= budget) {
        for (size_t i = 0; i < n; i++)
            dev_ids_push(&w->cur, ids[i]);
        return;
    }
    if (w->cur.n) {
        emit_seq(w, w->cur.v, w->cur.n);
        w->cur.n = 0;
    }
    while (n > budget) {
        emit_seq(w, ids, budget);
        ids += budget;
        n -= budget;
    }
    for (size_t i = 0; i < n; i++)
        dev_ids_push(&w->cur, ids[i]);
}

void dev_shard_writer_end_doc(dev_shard_writer *w)
{
    if (w->cur.n) {
        emit_seq(w, w->cur.v, w->cur.n);
        w->cur.n = 0;
    }
    if (w->nseq > w->doc[w->ndoc - 1]) {
        if (w->ndoc == w->capdoc) {
            w->capdoc *= 2;
            w->doc = sl_xrealloc(w->doc, w->capdoc * sizeof *w->doc);
        }
        w->doc[w->ndoc++] = w->nseq;
    }
}

dev_shard_writer *dev_shard_writer_labelled(const dev_vocab *v, int seq_len, bool cased,
                                            const dev_labels *labels, sl_err *err)
{
    size_t len;
    const char *text = dev_labels_text(labels, &len);
    dev_labels *copy = dev_labels_parse(text, len, "labels", err);
    dev_shard_writer *w = copy ? dev_shard_writer_new(v, seq_len, cased, err) : NULL;
    if (!w) {
        dev_labels_free(copy);
        return NULL;
    }
    w->labels = copy;
    return w;
}

int dev_shard_writer_example(dev_shard_writer *w, const int32_t *ids, size_t n, int label)
{
    size_t budget = (size_t)w->T - 2;
    dev_shard_writer_end_doc(w); /* whatever came before is a document of its own */
    emit_seq(w, ids, n < budget ? n : budget);
    if (w->ncls == w->capcls) {
        w->capcls = w->capcls ? 2 * w->capcls : 1024;
        w->cls = sl_xrealloc(w->cls, w->capcls * sizeof *w->cls);
    }
    w->cls[w->ncls++] = (uint32_t)label;
    dev_shard_writer_end_doc(w);
    return n > budget;
}

uint64_t dev_shard_writer_count(const dev_shard_writer *w) { return w->nseq; }

/* u64 little-endian values, a buffer at a time. */
static void hput_u64s(dev_hashed *o, const uint64_t *v, size_t n, uint64_t last)
{
    uint8_t buf[8 * 512];
    size_t k = 0;
    for (size_t i = 0; i <= n; i++) {
        wr64(buf + 8 * k++, i < n ? v[i] : last);
        if (k == 512 || i == n) {
            dev_hashed_write(o, buf, 8 * k);
            k = 0;
        }
    }
}

static void hput_zeros(dev_hashed *o, size_t n)
{
    static const uint8_t z[8];
    dev_hashed_write(o, z, n);
}

int dev_shard_writer_finish(dev_shard_writer *w, const char *path, sl_err *err)
{
    dev_shard_writer_end_doc(w);
    if (w->nseq == 0)
        return sl_err_set(err, SL_EINVAL, "no text to write: the input has no tokens");
    if (fflush(w->spill) != 0 && !w->spill_errno)
        w->spill_errno = errno ? errno : EIO;
    if (w->spill_errno)
        return sl_err_set(err, SL_EIO, "writing the tokens to the spill file: %s (set TMPDIR "
                          "to a disk with room)", strerror(w->spill_errno));
    if (w->labels && w->ncls != w->nseq)
        return sl_err_set(err, SL_EINVAL, "a labelled shard takes examples only: %zu sequences, "
                          "%zu classes", w->nseq, w->ncls);
    uint64_t n = w->nseq, d = w->ndoc - 1, ntok = w->ntok, tbytes = ntok * (uint64_t)w->width;
    uint8_t hd[DEV_SHARD_HEADER_BYTES_LABELLED] = {0};
    size_t hbytes = w->labels ? DEV_SHARD_HEADER_BYTES_LABELLED : DEV_SHARD_HEADER_BYTES;
    size_t lbytes = 0;
    const char *ltext = w->labels ? dev_labels_text(w->labels, &lbytes) : NULL;
    memcpy(hd + H_MAGIC, MAGIC, 8);
    wr32(hd + H_VERSION, w->labels ? DEV_SHARD_VERSION_LABELLED : DEV_SHARD_VERSION);
    wr32(hd + H_HEADER_BYTES, (uint32_t)hbytes);
    memcpy(hd + H_VOCAB_HASH, w->hash, 32);
    wr32(hd + H_VOCAB_SIZE, (uint32_t)w->vocab_size);
    wr32(hd + H_SEQ_LEN, (uint32_t)w->T);
    wr64(hd + H_SEQ_COUNT, n);
    wr64(hd + H_DOC_COUNT, d);
    wr64(hd + H_TOKEN_COUNT, ntok);
    wr64(hd + H_VOCAB_BYTES, w->vocab_len);
    wr32(hd + H_TOKEN_WIDTH, (uint32_t)w->width);
    wr32(hd + H_FLAGS, w->cased ? 1 : 0);
    wr32(hd + H_PAD, (uint32_t)w->sp.pad);
    wr32(hd + H_UNK, (uint32_t)w->sp.unk);
    wr32(hd + H_CLS, (uint32_t)w->sp.cls);
    wr32(hd + H_SEP, (uint32_t)w->sp.sep);
    wr32(hd + H_MASK, (uint32_t)w->sp.mask);
    if (w->labels) {
        wr32(hd + H_LABEL_COUNT, (uint32_t)dev_labels_count(w->labels));
        wr64(hd + H_LABEL_BYTES, lbytes);
        dev_labels_hash(w->labels, hd + H_LABEL_HASH);
    }
    dev_hashed o;
    if (dev_hashed_open(&o, path, err))
        return -1;
    dev_hashed_write(&o, hd, hbytes);
    hput_u64s(&o, w->seq, n, ntok);    /* seq_start[0..n], the last = token count */
    hput_u64s(&o, w->doc, d, w->doc[d]); /* doc_start[0..d] */
    dev_hashed_write(&o, w->vocab_text, w->vocab_len);
    hput_zeros(&o, pad8(w->vocab_len) - w->vocab_len);
    if (w->labels) {
        dev_hashed_write(&o, ltext, lbytes);
        hput_zeros(&o, pad8(lbytes) - lbytes);
        uint8_t b[4 * 1024];
        for (size_t i = 0, k = 0; i < n; i++) {
            wr32(b + 4 * k++, w->cls[i]);
            if (k == 1024 || i + 1 == n) {
                dev_hashed_write(&o, b, 4 * k);
                k = 0;
            }
        }
        hput_zeros(&o, pad8(4 * n) - 4 * n);
    }
    rewind(w->spill);
    uint8_t *buf = sl_xmalloc(1 << 16);
    uint64_t left = tbytes;
    while (left > 0) {
        size_t want = left < (1 << 16) ? (size_t)left : (1 << 16);
        if (fread(buf, 1, want, w->spill) != want) {
            free(buf);
            sl_atomic_abort(&o.a);
            return sl_err_set(err, SL_EIO, "reading the spill file back: %s",
                              ferror(w->spill) ? strerror(errno) : "short");
        }
        dev_hashed_write(&o, buf, want);
        left -= want;
    }
    free(buf);
    hput_zeros(&o, pad8(tbytes) - tbytes);
    return dev_hashed_commit(&o, err);
}

void dev_shard_writer_free(dev_shard_writer *w)
{
    if (!w)
        return;
    free(w->vocab_text);
    if (w->spill)
        fclose(w->spill);
    dev_ids_free(&w->cur);
    free(w->seq);
    free(w->doc);
    dev_labels_free(w->labels);
    free(w->cls);
    free(w);
}
