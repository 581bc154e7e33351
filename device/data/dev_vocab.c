#include "dev_vocab.h"

#include <sodium.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "sl_file.h"
#include "sl_mem.h"

/* Open-addressing table of token ids, keyed by bytes. A slot keeps 32 bits
 * of the hash (most misses never touch token text) and where the key's bytes
 * are, so a hit costs two memory accesses: the slot and the text. */
typedef struct vslot {
    uint32_t tag;
    int32_t id;   /* -1: empty */
    uint32_t off; /* key bytes at names + off */
    uint32_t len;
} vslot;
typedef struct vtab {
    vslot *slot;
    size_t mask;
} vtab;

struct dev_vocab {
    int n;
    char *text;        /* "tok\n" per token: what the hash covers */
    size_t text_len;
    char *names;       /* the same with '\n' -> '\0'; tok[] points into it */
    const char **tok;
    uint32_t *len;
    vtab init, cont;   /* all tokens; "##" tokens keyed without the prefix */
    size_t max_init, max_cont;
    uint8_t hash[32];
    dev_special sp;
};

static inline uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++)
        w |= (uint64_t)(unsigned char)s[i] << (8 * i);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    h *= 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 32);
}

static void vtab_init(vtab *t, int n)
{
    size_t cap = 16;
    while (cap < (size_t)n * 2)
        cap <<= 1;
    t->slot = sl_xmalloc(cap * sizeof *t->slot);
    for (size_t i = 0; i < cap; i++)
        t->slot[i] = (vslot){0, -1, 0, 0};
    t->mask = cap - 1;
}

static inline bool same(const dev_vocab *v, vslot e, uint32_t tag, const char *s, size_t n)
{
    return e.tag == tag && e.len == n && memcmp(v->names + e.off, s, n) == 0;
}

/* Returns the existing id for the key, or inserts id and returns -1. */
static int vtab_put(vtab *t, const dev_vocab *v, const char *s, size_t n, size_t skip, int id)
{
    uint64_t h = hash_bytes(s, n);
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = h & t->mask;; i = (i + 1) & t->mask) {
        vslot e = t->slot[i];
        if (e.id < 0) {
            t->slot[i] = (vslot){tag, id, (uint32_t)(v->tok[id] + skip - v->names), (uint32_t)n};
            return -1;
        }
        if (same(v, e, tag, s, n))
            return e.id;
    }
}

static inline int vtab_get(const vtab *t, const dev_vocab *v, const char *s, size_t n)
{
    uint64_t h = hash_bytes(s, n);
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = h & t->mask;; i = (i + 1) & t->mask) {
        vslot e = t->slot[i];
        if (e.id < 0)
            return -1;
        if (same(v, e, tag, s, n))
            return e.id;
    }
}

void dev_vocab_free(dev_vocab *v)
{
    if (!v)
        return;
    free(v->text);
    free(v->names);
    free(v->tok);
    free(v->len);
    free(v->init.slot);
    free(v->cont.slot);
    free(v);
}

dev_vocab *dev_vocab_parse(const char *buf, size_t len, const char *name, sl_err *err)
{
    if (len == 0) {
        sl_err_set(err, SL_EINVAL, "%s: empty vocabulary", name);
        return NULL;
    }
    /* Count lines and validate each before allocating per-token arrays. */
    size_t lines = 0;
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(buf + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - buf) : len;
        size_t tl = e - i;
        if (tl > 0 && buf[e - 1] == '\r')
            tl--;
        lines++;
        if (tl == 0) {
            sl_err_set(err, SL_EINVAL, "%s: line %zu is empty (a token per line expected)", name, lines);
            return NULL;
        }
        if (tl > DEV_VOCAB_MAX_TOKEN) {
            sl_err_set(err, SL_EINVAL, "%s: line %zu: token longer than %d bytes", name, lines,
                       DEV_VOCAB_MAX_TOKEN);
            return NULL;
        }
        for (size_t k = 0; k < tl;) {
            utf8proc_int32_t cp;
            utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)buf + i + k,
                                                  (utf8proc_ssize_t)(tl - k), &cp);
            if (r <= 0 || cp == 0) {
                sl_err_set(err, SL_EINVAL, "%s: line %zu: %s at byte offset %zu", name, lines,
                           r <= 0 ? "invalid UTF-8" : "NUL byte", i + k);
                return NULL;
            }
            k += (size_t)r;
        }
        if (lines > DEV_VOCAB_MAX_SIZE) {
            sl_err_set(err, SL_EINVAL, "%s: more than %d tokens", name, DEV_VOCAB_MAX_SIZE);
            return NULL;
        }
        i = e + 1;
    }
    dev_vocab *v = sl_xcalloc(1, sizeof *v);
    v->n = (int)lines;
    v->text = sl_xmalloc(len + 1);
    v->names = sl_xmalloc(len + 1);
    v->tok = sl_xmalloc(lines * sizeof *v->tok);
    v->len = sl_xmalloc(lines * sizeof *v->len);
    size_t tp = 0, id = 0;
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(buf + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - buf) : len;
        size_t tl = e - i;
        if (buf[e - 1] == '\r')
            tl--;
        memcpy(v->text + tp, buf + i, tl);
        memcpy(v->names + tp, buf + i, tl);
        v->text[tp + tl] = '\n';
        v->names[tp + tl] = '\0';
        v->tok[id] = v->names + tp;
        v->len[id] = (uint32_t)tl;
        tp += tl + 1;
        id++;
        i = e + 1;
    }
    v->text_len = tp;
    vtab_init(&v->init, v->n);
    vtab_init(&v->cont, v->n);
    for (int k = 0; k < v->n; k++) {
        int prev = vtab_put(&v->init, v, v->tok[k], v->len[k], 0, k);
        if (prev >= 0) {
            sl_err_set(err, SL_EINVAL, "%s: duplicate token '%s' on lines %d and %d", name,
                       v->tok[k], prev + 1, k + 1);
            dev_vocab_free(v);
            return NULL;
        }
        if (v->len[k] > v->max_init)
            v->max_init = v->len[k];
        if (v->len[k] > 2 && v->tok[k][0] == '#' && v->tok[k][1] == '#') {
            vtab_put(&v->cont, v, v->tok[k] + 2, v->len[k] - 2, 2, k);
            if (v->len[k] - 2 > v->max_cont)
                v->max_cont = v->len[k] - 2;
        }
    }
    v->sp.pad = dev_vocab_id(v, "[PAD]");
    v->sp.unk = dev_vocab_id(v, "[UNK]");
    v->sp.cls = dev_vocab_id(v, "[CLS]");
    v->sp.sep = dev_vocab_id(v, "[SEP]");
    v->sp.mask = dev_vocab_id(v, "[MASK]");
    if (v->sp.unk < 0) {
        sl_err_set(err, SL_EINVAL, "%s: no [UNK] token (BERT vocabularies need one)", name);
        dev_vocab_free(v);
        return NULL;
    }
    if (sodium_init() < 0) {
        sl_err_set(err, SL_EINTERNAL, "libsodium failed to initialise");
        dev_vocab_free(v);
        return NULL;
    }
    crypto_generichash(v->hash, 32, (const unsigned char *)v->text, v->text_len, NULL, 0);
    return v;
}

dev_vocab *dev_vocab_load(const char *path, sl_err *err)
{
    char *buf;
    size_t len;
    if (sl_read_file(path, (uint64_t)1 << 30, &buf, &len, err))
        return NULL;
    dev_vocab *v = dev_vocab_parse(buf, len, path, err);
    free(buf);
    return v;
}

int dev_vocab_size(const dev_vocab *v) { return v->n; }

int dev_vocab_id(const dev_vocab *v, const char *token)
{
    return vtab_get(&v->init, v, token, strlen(token));
}

const char *dev_vocab_token(const dev_vocab *v, int id)
{
    return id >= 0 && id < v->n ? v->tok[id] : NULL;
}

void dev_vocab_hash(const dev_vocab *v, uint8_t out[32]) { memcpy(out, v->hash, 32); }

dev_special dev_vocab_special(const dev_vocab *v) { return v->sp; }

const char *dev_vocab_text(const dev_vocab *v, size_t *len)
{
    *len = v->text_len;
    return v->text;
}

int dev_vocab_find(const dev_vocab *v, const char *s, size_t n)
{
    return vtab_get(&v->init, v, s, n);
}

int dev_vocab_find_cont(const dev_vocab *v, const char *s, size_t n)
{
    return vtab_get(&v->cont, v, s, n);
}

void dev_vocab_max_len(const dev_vocab *v, size_t *initial, size_t *cont)
{
    *initial = v->max_init;
    *cont = v->max_cont;
}

void dev_hash_hex(const uint8_t h[32], char out[65])
{
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        out[2 * i] = hx[h[i] >> 4];
        out[2 * i + 1] = hx[h[i] & 15];
    }
    out[64] = '\0';
}
