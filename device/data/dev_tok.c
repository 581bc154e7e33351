#include "dev_tok.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "sl_mem.h"

/* ASCII character classes, following _clean_text, _is_whitespace,
 * _is_control and _is_punctuation in BERT's tokenization.py. */
enum { A_DROP, A_WS, A_PUNCT, A_UPPER, A_OTHER };
static const unsigned char ascii_class[128] = {
    /* 0-8 controls (NUL dropped too), 9-10 tab/LF, 11-12 VT/FF controls, 13 CR */
    A_DROP, A_DROP, A_DROP, A_DROP, A_DROP, A_DROP, A_DROP, A_DROP, A_DROP, A_WS, A_WS, A_DROP,
    A_DROP, A_WS, A_DROP, A_DROP, A_DROP, A_DROP, A_DROP, A_DROP, A_DROP, A_DROP, A_DROP, A_DROP,
    A_DROP, A_DROP, A_DROP, A_DROP, A_DROP, A_DROP, A_DROP, A_DROP,
    /* 32 space, 33-47 punctuation */
    A_WS, A_PUNCT, A_PUNCT, A_PUNCT, A_PUNCT, A_PUNCT, A_PUNCT, A_PUNCT, A_PUNCT, A_PUNCT,
    A_PUNCT, A_PUNCT, A_PUNCT, A_PUNCT, A_PUNCT, A_PUNCT,
    /* 48-57 digits, 58-64 punctuation */
    A_OTHER, A_OTHER, A_OTHER, A_OTHER, A_OTHER, A_OTHER, A_OTHER, A_OTHER, A_OTHER, A_OTHER,
    A_PUNCT, A_PUNCT, A_PUNCT, A_PUNCT, A_PUNCT, A_PUNCT, A_PUNCT,
    /* 65-90 upper case, 91-96 punctuation */
    A_UPPER, A_UPPER, A_UPPER, A_UPPER, A_UPPER, A_UPPER, A_UPPER, A_UPPER, A_UPPER, A_UPPER,
    A_UPPER, A_UPPER, A_UPPER, A_UPPER, A_UPPER, A_UPPER, A_UPPER, A_UPPER, A_UPPER, A_UPPER,
    A_UPPER, A_UPPER, A_UPPER, A_UPPER, A_UPPER, A_UPPER,
    A_PUNCT, A_PUNCT, A_PUNCT, A_PUNCT, A_PUNCT, A_PUNCT,
    /* 97-122 lower case, 123-126 punctuation, 127 DEL */
    A_OTHER, A_OTHER, A_OTHER, A_OTHER, A_OTHER, A_OTHER, A_OTHER, A_OTHER, A_OTHER, A_OTHER,
    A_OTHER, A_OTHER, A_OTHER, A_OTHER, A_OTHER, A_OTHER, A_OTHER, A_OTHER, A_OTHER, A_OTHER,
    A_OTHER, A_OTHER, A_OTHER, A_OTHER, A_OTHER, A_OTHER,
    A_PUNCT, A_PUNCT, A_PUNCT, A_PUNCT, A_DROP};

size_t dev_utf8_check(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        utf8proc_int32_t cp;
        utf8proc_ssize_t r = utf8proc_iterate(p + i, (utf8proc_ssize_t)(n - i), &cp);
        if (r <= 0)
            return i;
        i += (size_t)r;
    }
    return n;
}

/* _is_chinese_char: the CJK Unified Ideographs blocks (not Hangul, kana). */
static inline bool is_cjk(int32_t cp)
{
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
           (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
           (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

static inline bool is_punct(int32_t cp)
{
    if (cp < 128)
        return ascii_class[cp] == A_PUNCT;
    int c = utf8proc_category(cp);
    return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

/* Cased and case-ignorable as Python's str.lower() uses them for the
 * final-sigma rule (Unicode 3.13, D135 and D136). */
static bool is_cased(int32_t cp)
{
    int c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

static bool is_case_ignorable(int32_t cp)
{
    switch (cp) {
    case 0x27: case 0x2E: case 0x3A: case 0x5E: case 0x60: case 0xA8: case 0xAD: case 0xAF:
    case 0xB4: case 0xB7: case 0xB8: case 0x387: case 0x5F4: case 0x2018: case 0x2019:
    case 0x2024: case 0x2027: case 0xFE13: case 0xFE52: case 0xFE55: case 0xFF07: case 0xFF0E:
    case 0xFF1A:
        return true;
    }
    int c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_ME || c == UTF8PROC_CATEGORY_CF ||
           c == UTF8PROC_CATEGORY_LM || c == UTF8PROC_CATEGORY_SK;
}

/* Characters _clean_text removes: NUL, U+FFFD, Cc and Cf except tab/LF/CR. */
static inline bool is_dropped(int32_t cp)
{
    if (cp < 128)
        return ascii_class[cp] == A_DROP;
    if (cp == 0xFFFD)
        return true;
    int c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_CC || c == UTF8PROC_CATEGORY_CF;
}

/* _is_whitespace plus what Python's str.split() also splits on after
 * cleaning (U+2028 and U+2029; the other such characters are Cc). */
static inline bool is_ws(int32_t cp)
{
    if (cp < 128)
        return ascii_class[cp] == A_WS;
    return cp == 0x2028 || cp == 0x2029 || utf8proc_category(cp) == UTF8PROC_CATEGORY_ZS;
}

typedef struct wstate {
    char buf[DEV_TOK_MAX_WORD_CHARS * 4 + 8];
    size_t len;
    int nchars;
    dev_tok_word_fn fn;
    void *ctx;
    int rc;
} wstate;

static inline void flush(wstate *w)
{
    if (w->nchars && !w->rc)
        w->rc = w->fn(w->ctx, w->buf, w->len, w->nchars);
    w->len = 0;
    w->nchars = 0;
}

static inline void put_cp(wstate *w, int32_t cp)
{
    if (++w->nchars <= DEV_TOK_MAX_WORD_CHARS)
        w->len += (size_t)utf8proc_encode_char(cp, (utf8proc_uint8_t *)w->buf + w->len);
}

static inline void put_char(wstate *w, int32_t cp)
{
    if (is_punct(cp)) {
        flush(w);
        put_cp(w, cp);
        flush(w);
    } else {
        put_cp(w, cp);
    }
}

/* Final sigma: Σ lower-cases to ς unless a cased letter follows within the
 * same whitespace-delimited token (case-ignorable characters skipped). */
static bool sigma_is_final(const unsigned char *p, size_t i, size_t n)
{
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t r = utf8proc_iterate(p + i, (utf8proc_ssize_t)(n - i), &cp);
        if (r <= 0)
            return true;
        i += (size_t)r;
        if (is_dropped(cp) || is_case_ignorable(cp))
            continue;
        if (is_ws(cp) || is_cjk(cp))
            return true;
        return !is_cased(cp);
    }
    return true;
}

/* Lower-case, NFD, drop Mn (BasicTokenizer's uncased path for one char). */
static void put_uncased(wstate *w, int32_t cp, bool final_sigma)
{
    cp = (cp == 0x3A3 && final_sigma) ? 0x3C2 : utf8proc_tolower(cp);
    utf8proc_int32_t d[32];
    utf8proc_ssize_t nd = utf8proc_decompose_char(cp, d, 32, UTF8PROC_DECOMPOSE, NULL);
    if (nd < 0 || nd > 32) {
        d[0] = cp;
        nd = 1;
    }
    for (utf8proc_ssize_t k = 0; k < nd; k++) {
        if (d[k] >= 128 && utf8proc_category(d[k]) == UTF8PROC_CATEGORY_MN)
            continue;
        put_char(w, d[k]);
    }
}

int dev_tok_basic(const char *text, size_t len, bool cased, dev_tok_word_fn fn, void *ctx,
                  sl_err *err)
{
    const unsigned char *p = (const unsigned char *)text;
    wstate *w = sl_xmalloc(sizeof *w);
    w->len = 0;
    w->nchars = 0;
    w->fn = fn;
    w->ctx = ctx;
    w->rc = 0;
    bool prev_cased = false; /* for the final-sigma rule */
    size_t i = 0;
    while (i < len && !w->rc) {
        unsigned c = p[i];
        if (c < 0x80) {
            i++;
            switch (ascii_class[c]) {
            case A_DROP:
                break;
            case A_WS:
                flush(w);
                prev_cased = false;
                break;
            case A_PUNCT:
                flush(w);
                put_cp(w, (int32_t)c);
                flush(w);
                if (c != '\'' && c != '.' && c != ':' && c != '^' && c != '`')
                    prev_cased = false;
                break;
            case A_UPPER:
                if (!cased)
                    c += 32;
                /* fall through */
            default:
                if (++w->nchars <= DEV_TOK_MAX_WORD_CHARS)
                    w->buf[w->len++] = (char)c;
                prev_cased = (c | 32) >= 'a' && (c | 32) <= 'z';
            }
            continue;
        }
        utf8proc_int32_t cp;
        utf8proc_ssize_t r = utf8proc_iterate(p + i, (utf8proc_ssize_t)(len - i), &cp);
        if (r <= 0) {
            free(w);
            return sl_err_set(err, SL_EINVAL, "invalid UTF-8 at byte offset %zu", i);
        }
        i += (size_t)r;
        if (is_dropped(cp))
            continue;
        if (is_ws(cp)) {
            flush(w);
            prev_cased = false;
            continue;
        }
        if (is_cjk(cp)) {
            flush(w);
            if (cased)
                put_cp(w, cp);
            else
                put_uncased(w, cp, false);
            flush(w);
            prev_cased = false;
            continue;
        }
        if (cased)
            put_char(w, cp);
        else
            put_uncased(w, cp, cp == 0x3A3 && prev_cased && sigma_is_final(p, i, len));
        if (!is_case_ignorable(cp))
            prev_cased = is_cased(cp);
    }
    flush(w);
    int rc = w->rc;
    free(w);
    return rc;
}

void dev_ids_push(dev_ids *a, int32_t id)
{
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 256;
        a->v = sl_xrealloc(a->v, a->cap * sizeof *a->v);
    }
    a->v[a->n++] = id;
}

void dev_ids_free(dev_ids *a)
{
    free(a->v);
    a->v = NULL;
    a->n = a->cap = 0;
}

void dev_tok_wordpiece(const dev_vocab *v, const char *word, size_t len, int nchars, dev_ids *out)
{
    int unk = dev_vocab_special(v).unk;
    if (nchars > DEV_TOK_MAX_WORD_CHARS || nchars <= 0 || len > 4 * DEV_TOK_MAX_WORD_CHARS) {
        dev_ids_push(out, unk);
        return;
    }
    /* Byte offset of each character boundary (counted here, not trusted
     * from nchars, so a bad caller cannot overrun off[]). */
    uint16_t off[DEV_TOK_MAX_WORD_CHARS + 1];
    int nc = 0;
    for (size_t b = 0; b < len; b++)
        if (((unsigned char)word[b] & 0xC0) != 0x80) {
            if (nc == DEV_TOK_MAX_WORD_CHARS) { /* a 101st character */
                dev_ids_push(out, unk);
                return;
            }
            off[nc++] = (uint16_t)b;
        }
    off[nc] = (uint16_t)len;
    if (nc == 0 || off[0] != 0) { /* empty, or starts inside a character */
        dev_ids_push(out, unk);
        return;
    }
    size_t max_init, max_cont;
    dev_vocab_max_len(v, &max_init, &max_cont);
    size_t mark = out->n;
    int s = 0;
    while (s < nc) {
        size_t maxl = s == 0 ? max_init : max_cont;
        int e = nc, id = -1;
        while (e > s && (size_t)(off[e] - off[s]) > maxl)
            e--;
        for (; e > s; e--) {
            id = s == 0 ? dev_vocab_find(v, word, off[e])
                        : dev_vocab_find_cont(v, word + off[s], (size_t)(off[e] - off[s]));
            if (id >= 0)
                break;
        }
        if (id < 0) {
            out->n = mark;
            dev_ids_push(out, unk);
            return;
        }
        dev_ids_push(out, id);
        s = e;
    }
}

typedef struct enc_ctx {
    const dev_vocab *v;
    dev_ids *out;
} enc_ctx;

static int enc_word(void *ctx, const char *word, size_t len, int nchars)
{
    enc_ctx *e = ctx;
    dev_tok_wordpiece(e->v, word, len, nchars, e->out);
    return 0;
}

int dev_tok_encode(const dev_vocab *v, bool cased, const char *text, size_t len, dev_ids *out,
                   sl_err *err)
{
    enc_ctx e = {v, out};
    return dev_tok_basic(text, len, cased, enc_word, &e, err);
}

char *dev_tok_decode(const dev_vocab *v, const int32_t *ids, size_t n)
{
    size_t cap = 64, len = 0;
    char *s = sl_xmalloc(cap);
    for (size_t i = 0; i < n; i++) {
        const char *t = dev_vocab_token(v, ids[i]);
        if (!t)
            t = "[?]";
        size_t tl = strlen(t);
        bool cont = tl > 2 && t[0] == '#' && t[1] == '#' && i > 0;
        if (cont) {
            t += 2;
            tl -= 2;
        }
        if (len + tl + 2 > cap) {
            cap = (len + tl + 2) * 2;
            s = sl_xrealloc(s, cap);
        }
        if (i > 0 && !cont)
            s[len++] = ' ';
        memcpy(s + len, t, tl);
        len += tl;
    }
    s[len] = '\0';
    return s;
}
