#include "dev_vocab_build.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev_tok.h"
#include "sl_mem.h"

/* ---- an open-addressing index over an array of items ----
 * Slots hold item numbers (-1: empty); items keep their hash, so the index
 * can grow without looking at the keys. */
typedef struct oindex {
    int32_t *slot;
    size_t mask;
} oindex;

static void oindex_init(oindex *x, size_t cap)
{
    x->slot = sl_xmalloc(cap * sizeof *x->slot);
    memset(x->slot, 0xff, cap * sizeof *x->slot);
    x->mask = cap - 1;
}

static void oindex_put(oindex *x, uint64_t h, int32_t k)
{
    size_t i = h & x->mask;
    while (x->slot[i] >= 0)
        i = (i + 1) & x->mask;
    x->slot[i] = k;
}

/* Before adding item number n: keeps the index at most half full. */
static void oindex_reserve(oindex *x, size_t n, const uint64_t *hash)
{
    if ((n + 1) * 2 <= x->mask + 1)
        return;
    size_t cap = (x->mask + 1) * 2;
    free(x->slot);
    oindex_init(x, cap);
    for (size_t k = 0; k < n; k++)
        oindex_put(x, hash[k], (int32_t)k);
}

/* ---- a string -> int64 map (keys copied) ---- */
typedef struct smap {
    char **key;
    uint32_t *klen;
    int64_t *val;
    uint64_t *hash;
    size_t n, cap;
    oindex ix;
} smap;

static uint64_t str_hash(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return h ^ (h >> 31);
}

static void smap_init(smap *m)
{
    memset(m, 0, sizeof *m);
    oindex_init(&m->ix, 1024);
}

static void smap_free(smap *m)
{
    for (size_t i = 0; i < m->n; i++)
        free(m->key[i]);
    free(m->key);
    free(m->klen);
    free(m->val);
    free(m->hash);
    free(m->ix.slot);
}

static int64_t smap_find_h(const smap *m, const char *s, size_t n, uint64_t h)
{
    for (size_t i = h & m->ix.mask;; i = (i + 1) & m->ix.mask) {
        int32_t e = m->ix.slot[i];
        if (e < 0)
            return -1;
        if (m->hash[e] == h && m->klen[e] == n && memcmp(m->key[e], s, n) == 0)
            return e;
    }
}

static int64_t smap_find(const smap *m, const char *s, size_t n)
{
    return smap_find_h(m, s, n, str_hash(s, n));
}

static size_t smap_add(smap *m, const char *s, size_t n);

static void smap_set(smap *m, const char *s, size_t n, int64_t v)
{
    size_t k = smap_add(m, s, n);
    m->val[k] = v;
}

static size_t smap_add(smap *m, const char *s, size_t n)
{
    uint64_t h = str_hash(s, n);
    int64_t f = smap_find_h(m, s, n, h);
    if (f >= 0)
        return (size_t)f;
    oindex_reserve(&m->ix, m->n, m->hash);
    if (m->n == m->cap) {
        m->cap = m->cap ? m->cap * 2 : 1024;
        m->key = sl_xrealloc(m->key, m->cap * sizeof *m->key);
        m->klen = sl_xrealloc(m->klen, m->cap * sizeof *m->klen);
        m->val = sl_xrealloc(m->val, m->cap * sizeof *m->val);
        m->hash = sl_xrealloc(m->hash, m->cap * sizeof *m->hash);
    }
    size_t k = m->n++;
    m->key[k] = sl_xmalloc(n + 1);
    memcpy(m->key[k], s, n);
    m->key[k][n] = '\0';
    m->klen[k] = (uint32_t)n;
    m->val[k] = 0;
    m->hash[k] = h;
    oindex_put(&m->ix, h, (int32_t)k);
    return k;
}

/* ---- word counts ---- */
struct dev_wordcount {
    bool cased;
    smap words;
};

dev_wordcount *dev_wordcount_new(bool cased)
{
    dev_wordcount *wc = sl_xcalloc(1, sizeof *wc);
    wc->cased = cased;
    smap_init(&wc->words);
    return wc;
}

void dev_wordcount_free(dev_wordcount *wc)
{
    if (!wc)
        return;
    smap_free(&wc->words);
    free(wc);
}

static int count_word(void *ctx, const char *word, size_t len, int nchars)
{
    dev_wordcount *wc = ctx;
    if (nchars > DEV_TOK_MAX_WORD_CHARS) /* [UNK] whatever the vocabulary */
        return 0;
    size_t k = smap_add(&wc->words, word, len);
    wc->words.val[k]++;
    return 0;
}

int dev_wordcount_add(dev_wordcount *wc, const char *text, size_t len, sl_err *err)
{
    return dev_tok_basic(text, len, wc->cased, count_word, wc, err);
}

size_t dev_wordcount_unique(const dev_wordcount *wc) { return wc->words.n; }

/* ---- pair statistics for the merges ---- */
typedef struct pair {
    int32_t a, b;
    int64_t count;
    int32_t *where; /* words that may contain the pair (stale entries allowed) */
    uint32_t nwhere, capwhere;
    bool touched;
} pair;

typedef struct ptab {
    pair *p;
    uint64_t *hash;
    size_t n, cap;
    oindex ix;
} ptab;

static uint64_t pkey_hash(int32_t a, int32_t b)
{
    uint64_t x = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static int64_t ptab_find(const ptab *t, int32_t a, int32_t b)
{
    for (size_t i = pkey_hash(a, b) & t->ix.mask;; i = (i + 1) & t->ix.mask) {
        int32_t e = t->ix.slot[i];
        if (e < 0)
            return -1;
        if (t->p[e].a == a && t->p[e].b == b)
            return e;
    }
}

static size_t ptab_get(ptab *t, int32_t a, int32_t b)
{
    int64_t f = ptab_find(t, a, b);
    if (f >= 0)
        return (size_t)f;
    oindex_reserve(&t->ix, t->n, t->hash);
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 4096;
        t->p = sl_xrealloc(t->p, t->cap * sizeof *t->p);
        t->hash = sl_xrealloc(t->hash, t->cap * sizeof *t->hash);
    }
    size_t k = t->n++;
    memset(&t->p[k], 0, sizeof t->p[k]);
    t->p[k].a = a;
    t->p[k].b = b;
    t->hash[k] = pkey_hash(a, b);
    oindex_put(&t->ix, t->hash[k], (int32_t)k);
    return k;
}

static void pair_add_where(pair *p, int32_t w)
{
    if (p->nwhere && p->where[p->nwhere - 1] == w)
        return;
    if (p->nwhere == p->capwhere) {
        p->capwhere = p->capwhere ? p->capwhere * 2 : 4;
        p->where = sl_xrealloc(p->where, p->capwhere * sizeof *p->where);
    }
    p->where[p->nwhere++] = w;
}

/* Max-heap of (count, a, b); ties go to the smaller ids. Entries go stale
 * and are checked against the table when popped. */
typedef struct hent {
    int64_t count;
    int32_t a, b;
} hent;
typedef struct heap {
    hent *e;
    size_t n, cap;
} heap;

static bool hbetter(const hent *x, const hent *y)
{
    if (x->count != y->count)
        return x->count > y->count;
    if (x->a != y->a)
        return x->a < y->a;
    return x->b < y->b;
}

static void heap_push(heap *h, int64_t count, int32_t a, int32_t b)
{
    if (h->n == h->cap) {
        h->cap = h->cap ? h->cap * 2 : 4096;
        h->e = sl_xrealloc(h->e, h->cap * sizeof *h->e);
    }
    size_t i = h->n++;
    h->e[i] = (hent){count, a, b};
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!hbetter(&h->e[i], &h->e[p]))
            break;
        hent t = h->e[i];
        h->e[i] = h->e[p];
        h->e[p] = t;
        i = p;
    }
}

static hent heap_pop(heap *h)
{
    hent top = h->e[0];
    h->e[0] = h->e[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && hbetter(&h->e[l], &h->e[m]))
            m = l;
        if (r < h->n && hbetter(&h->e[r], &h->e[m]))
            m = r;
        if (m == i)
            break;
        hent t = h->e[i];
        h->e[i] = h->e[m];
        h->e[m] = t;
        i = m;
    }
    return top;
}

typedef struct achar {
    const char *s; /* "c" or "##c" */
    uint32_t len;
    int64_t freq;
} achar;

static int achar_by_freq(const void *x, const void *y)
{
    const achar *a = x, *b = y;
    if (a->freq != b->freq)
        return a->freq > b->freq ? -1 : 1;
    return strcmp(a->s, b->s);
}

/* Word-initial characters first, then "##" ones; each by code point (UTF-8
 * byte order is code point order). */
static int achar_by_layout(const void *x, const void *y)
{
    const achar *a = x, *b = y;
    bool ca = a->len > 2 && a->s[0] == '#' && a->s[1] == '#' && a->len > 2;
    bool cb = b->len > 2 && b->s[0] == '#' && b->s[1] == '#' && b->len > 2;
    /* a lone "#" word start vs "##x": the prefix test above needs a third byte */
    if (ca != cb)
        return ca ? 1 : -1;
    return strcmp(a->s, b->s);
}

typedef struct toks {
    char **s;
    int n, cap;
} toks;

static void toks_add(toks *t, const char *s, size_t n)
{
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 1024;
        t->s = sl_xrealloc(t->s, (size_t)t->cap * sizeof *t->s);
    }
    char *c = sl_xmalloc(n + 1);
    memcpy(c, s, n);
    c[n] = '\0';
    t->s[t->n++] = c;
}

static size_t char_len(unsigned char c)
{
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

/* The initial symbol of the character at byte i of a word: "c" for the
 * first character, "##c" after it. Returns its length in buf. */
static size_t piece_at(const char *word, size_t i, char buf[8])
{
    size_t bl = 0, cl = char_len((unsigned char)word[i]);
    if (i > 0) {
        buf[0] = buf[1] = '#';
        bl = 2;
    }
    memcpy(buf + bl, word + i, cl);
    return bl + cl;
}

int dev_vocab_learn(const dev_wordcount *wc, int size, int min_freq, dev_vocab_learned *out,
                    sl_err *err)
{
    memset(out, 0, sizeof *out);
    int reserved = size >= DEV_VOCAB_BERT_LAYOUT_MIN ? 104 : 5;
    if (size < reserved + 1 || size > DEV_VOCAB_MAX_SIZE)
        return sl_err_set(err, SL_EINVAL, "vocabulary size %d: must be between %d and %d", size,
                          reserved + 1, DEV_VOCAB_MAX_SIZE);
    if (min_freq < 1)
        min_freq = 1;
    const smap *W = &wc->words;
    toks vt = {0};
    smap sym; /* token string -> id */
    smap_init(&sym);
    char name[32];
    if (reserved == 104) {
        toks_add(&vt, "[PAD]", 5);
        for (int i = 0; i < 99; i++) {
            int n = snprintf(name, sizeof name, "[unused%d]", i);
            toks_add(&vt, name, (size_t)n);
        }
    } else {
        toks_add(&vt, "[PAD]", 5);
    }
    toks_add(&vt, "[UNK]", 5);
    toks_add(&vt, "[CLS]", 5);
    toks_add(&vt, "[SEP]", 5);
    toks_add(&vt, "[MASK]", 6);

    /* Alphabet with frequencies. */
    smap alpha;
    smap_init(&alpha);
    char buf[8];
    for (size_t w = 0; w < W->n; w++)
        for (size_t i = 0; i < W->klen[w]; i += char_len((unsigned char)W->key[w][i])) {
            size_t k = smap_add(&alpha, buf, piece_at(W->key[w], i, buf));
            alpha.val[k] += W->val[w];
        }
    achar *ac = sl_xmalloc((alpha.n ? alpha.n : 1) * sizeof *ac);
    for (size_t i = 0; i < alpha.n; i++)
        ac[i] = (achar){alpha.key[i], alpha.klen[i], alpha.val[i]};
    size_t keep = alpha.n;
    if (keep > (size_t)(size - reserved)) {
        qsort(ac, alpha.n, sizeof *ac, achar_by_freq);
        keep = (size_t)(size - reserved);
    }
    qsort(ac, keep, sizeof *ac, achar_by_layout);
    for (int i = 0; i < vt.n; i++)
        smap_set(&sym, vt.s[i], strlen(vt.s[i]), i);
    for (size_t i = 0; i < keep; i++) {
        smap_set(&sym, ac[i].s, ac[i].len, vt.n);
        toks_add(&vt, ac[i].s, ac[i].len);
    }
    out->alphabet = (int)keep;
    out->dropped_chars = (int)(alpha.n - keep);
    free(ac);

    /* Words as symbol sequences (-1 for characters left out of the alphabet). */
    size_t nsym = 0;
    for (size_t w = 0; w < W->n; w++)
        nsym += W->klen[w];
    int32_t *seq = sl_xmalloc((nsym ? nsym : 1) * sizeof *seq);
    size_t *woff = sl_xmalloc((W->n + 1) * sizeof *woff);
    uint32_t *wlen = sl_xmalloc((W->n + 1) * sizeof *wlen);
    size_t pos = 0;
    for (size_t w = 0; w < W->n; w++) {
        woff[w] = pos;
        uint32_t n = 0;
        for (size_t i = 0; i < W->klen[w]; i += char_len((unsigned char)W->key[w][i])) {
            int64_t f = smap_find(&sym, buf, piece_at(W->key[w], i, buf));
            seq[pos + n++] = f >= 0 ? (int32_t)sym.val[f] : -1;
        }
        wlen[w] = n;
        pos += n;
    }

    ptab pt = {0};
    oindex_init(&pt.ix, 4096);
    for (size_t w = 0; w < W->n; w++) {
        const int32_t *q = seq + woff[w];
        for (uint32_t i = 0; i + 1 < wlen[w]; i++) {
            if (q[i] < 0 || q[i + 1] < 0)
                continue;
            size_t k = ptab_get(&pt, q[i], q[i + 1]);
            pt.p[k].count += W->val[w];
            pair_add_where(&pt.p[k], (int32_t)w);
        }
    }
    heap h = {0};
    for (size_t k = 0; k < pt.n; k++)
        heap_push(&h, pt.p[k].count, pt.p[k].a, pt.p[k].b);

    uint32_t *stamp = sl_xcalloc(W->n + 1, sizeof *stamp);
    size_t *touched = NULL, ntouched = 0, captouched = 0;
    uint32_t iter = 0;
    char *merged = NULL;
    size_t mcap = 0;
    while (vt.n < size && h.n > 0) {
        hent e = heap_pop(&h);
        int64_t pk = ptab_find(&pt, e.a, e.b);
        if (pk < 0)
            continue;
        if (pt.p[pk].count != e.count) {
            if (pt.p[pk].count > 0 && pt.p[pk].count < e.count)
                heap_push(&h, pt.p[pk].count, e.a, e.b);
            continue;
        }
        if (e.count < min_freq)
            break;
        int32_t a = e.a, b = e.b;
        const char *sa = vt.s[a], *sb = vt.s[b] + 2; /* b is always a "##" piece */
        size_t la = strlen(sa), lb = strlen(sb);
        if (la + lb + 1 > mcap) {
            mcap = (la + lb + 1) * 2;
            merged = sl_xrealloc(merged, mcap);
        }
        memcpy(merged, sa, la);
        memcpy(merged + la, sb, lb);
        int64_t cf = smap_find(&sym, merged, la + lb);
        int32_t c;
        if (cf >= 0) {
            c = (int32_t)sym.val[cf];
        } else {
            c = vt.n;
            smap_set(&sym, merged, la + lb, c);
            toks_add(&vt, merged, la + lb);
        }
        iter++;
        int32_t *wl = pt.p[pk].where;
        uint32_t nwl = pt.p[pk].nwhere;
        pt.p[pk].where = NULL;
        pt.p[pk].nwhere = pt.p[pk].capwhere = 0;
        for (uint32_t wi = 0; wi < nwl; wi++) {
            int32_t w = wl[wi];
            if (stamp[w] == iter)
                continue;
            stamp[w] = iter;
            int32_t *q = seq + woff[w];
            uint32_t n = wlen[w];
            bool has = false;
            for (uint32_t i = 0; i + 1 < n && !has; i++)
                has = q[i] == a && q[i + 1] == b;
            if (!has)
                continue;
            int64_t f = W->val[w];
            for (uint32_t i = 0; i + 1 < n; i++)
                if (q[i] >= 0 && q[i + 1] >= 0)
                    pt.p[ptab_find(&pt, q[i], q[i + 1])].count -= f;
            uint32_t o = 0;
            for (uint32_t i = 0; i < n;) {
                if (i + 1 < n && q[i] == a && q[i + 1] == b) {
                    q[o++] = c;
                    i += 2;
                } else {
                    q[o++] = q[i++];
                }
            }
            wlen[w] = n = o;
            for (uint32_t i = 0; i + 1 < n; i++) {
                if (q[i] < 0 || q[i + 1] < 0)
                    continue;
                size_t k = ptab_get(&pt, q[i], q[i + 1]);
                pt.p[k].count += f;
                if (q[i] == c || q[i + 1] == c) {
                    pair_add_where(&pt.p[k], w);
                    if (!pt.p[k].touched) {
                        pt.p[k].touched = true;
                        if (ntouched == captouched) {
                            captouched = captouched ? captouched * 2 : 256;
                            touched = sl_xrealloc(touched, captouched * sizeof *touched);
                        }
                        touched[ntouched++] = k;
                    }
                }
            }
        }
        free(wl);
        for (size_t t = 0; t < ntouched; t++) {
            pair *p = &pt.p[touched[t]];
            p->touched = false;
            if (p->count > 0)
                heap_push(&h, p->count, p->a, p->b);
        }
        ntouched = 0;
    }

    size_t tl = 0;
    for (int i = 0; i < vt.n; i++)
        tl += strlen(vt.s[i]) + 1;
    out->text = sl_xmalloc(tl + 1);
    size_t o = 0;
    for (int i = 0; i < vt.n; i++) {
        size_t l = strlen(vt.s[i]);
        memcpy(out->text + o, vt.s[i], l);
        out->text[o + l] = '\n';
        o += l + 1;
        free(vt.s[i]);
    }
    out->text[o] = '\0';
    out->len = o;
    out->ntokens = vt.n;

    free(vt.s);
    free(merged);
    free(touched);
    free(stamp);
    free(h.e);
    for (size_t k = 0; k < pt.n; k++)
        free(pt.p[k].where);
    free(pt.p);
    free(pt.hash);
    free(pt.ix.slot);
    free(seq);
    free(woff);
    free(wlen);
    smap_free(&alpha);
    smap_free(&sym);
    return 0;
}
