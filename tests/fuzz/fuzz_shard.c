/* fuzz_shard.c - libFuzzer target: opening a token shard, then reading all
 * of it. The first byte's bit 0 re-signs the BLAKE2b trailer and bit 1
 * rewrites the header's vocabulary hash over the vocabulary section the
 * header points at (and, in a labelled shard's header, the label hash over
 * the labels' section), so the consistency checks behind them are reached.
 * Properties: every sequence of an opened shard is [CLS] ... [SEP] within
 * T tokens, every id is inside the vocabulary, the special ids are
 * distinct, the stored vocabulary parses to the header's size, and in a
 * labelled shard every class is below the label count. */
#include "dev_shard.h"
#include "fuzz_util.h"

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!size)
        return 0;
    size_t n = size - 1;
    uint8_t *b = malloc(n ? n : 1);
    memcpy(b, data + 1, n);
    if ((data[0] & 2) && n >= DEV_SHARD_HEADER_BYTES_LABELLED) {
        int labelled = (rd64(b + 8) & 0xffffffffu) == DEV_SHARD_VERSION_LABELLED;
        uint64_t ns = rd64(b + 56), nd = rd64(b + 64), vb = rd64(b + 80);
        uint64_t off = (labelled ? DEV_SHARD_HEADER_BYTES_LABELLED : DEV_SHARD_HEADER_BYTES) +
                       8 * (ns + 1) + 8 * (nd + 1);
        if (ns < n && nd < n && vb <= n && off <= n && vb <= n - off) {
            crypto_generichash(b + 16, 32, b + off, vb, NULL, 0);
            uint64_t lb = rd64(b + 120), loff = off + ((vb + 7) & ~(uint64_t)7);
            if (labelled && lb <= n && loff <= n && lb <= n - loff)
                crypto_generichash(b + 128, 32, b + loff, lb, NULL, 0);
        }
    }
    if (data[0] & 1)
        fu_resign(b, n, 32);
    const char *path = fu_path("t.shard");
    fu_write(path, b, n);
    free(b);
    sl_err err = {0};
    dev_shard *s = dev_shard_open(path, &err);
    if (!s) {
        REQUIRE(err.msg[0]);
        return 0;
    }
    int T = dev_shard_seq_len(s), V = dev_shard_vocab_size(s);
    dev_special sp = dev_shard_special(s);
    int ids[5] = {sp.pad, sp.unk, sp.cls, sp.sep, sp.mask};
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < i; j++)
            REQUIRE(ids[i] != ids[j]);
    int32_t *tok = malloc((size_t)T * sizeof *tok);
    uint64_t count = dev_shard_count(s);
    for (uint64_t i = 0; i < count; i++) {
        int len = dev_shard_read(s, i, tok);
        REQUIREF(len >= 2 && len <= T, "sequence %llu has length %d", (unsigned long long)i, len);
        REQUIRE(tok[0] == sp.cls && tok[len - 1] == sp.sep);
        for (int t = 0; t < T; t++)
            REQUIRE(tok[t] >= 0 && tok[t] < V);
    }
    REQUIRE(dev_shard_read(s, count, tok) == -1);
    const dev_labels *labels = dev_shard_labels(s);
    REQUIRE(!labels == (dev_shard_version(s) == DEV_SHARD_VERSION));
    for (uint64_t i = 0; labels && i < count; i++)
        REQUIRE(dev_shard_label(s, i) >= 0 && dev_shard_label(s, i) < dev_labels_count(labels));
    for (uint64_t d = 0; d + 1 <= dev_shard_doc_count(s); d++)
        REQUIRE(dev_shard_doc_start(s, d) < dev_shard_doc_start(s, d + 1));
    free(tok);
    dev_vocab *v = dev_shard_vocab(s, &err);
    if (v) {
        REQUIRE(dev_vocab_size(v) == V);
        dev_vocab_free(v);
    }
    dev_shard_close(s);
    return 0;
}
