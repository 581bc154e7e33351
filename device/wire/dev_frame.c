/* dev_frame.c - frame header, sealing, key schedule and receive window. */
#include "dev_frame.h"

#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev_codec_hd.h"
#include "sl_mem.h"

static const char *const reason_names[DEV_FR_NREASONS] = {
    "ok", "truncated", "bad magic", "bad version", "bad header", "bad shape", "oversized",
    "length mismatch", "seal mismatch", "misrouted", "tampered header", "tampered payload",
    "replay", "too old", "bad payload", "capacity", "other epoch", "queue full",
};

const char *dev_frame_reason_name(int reason)
{
    return reason >= 0 && reason < DEV_FR_NREASONS ? reason_names[reason] : "?";
}

static int reason_code(int reason)
{
    switch (reason) {
    case DEV_FR_SEAL_MISMATCH:
    case DEV_FR_MISROUTED:
    case DEV_FR_EPOCH:
    case DEV_FR_TAMPERED_HEADER:
    case DEV_FR_TAMPERED_PAYLOAD:
    case DEV_FR_REPLAY:
    case DEV_FR_TOO_OLD:
        return SL_EAUTH;
    case DEV_FR_CAPACITY:
        return SL_EINVAL;
    default:
        return SL_ECORRUPT;
    }
}

/* Sets *reason and err ("frame refused (why): ..."); returns -1. */
__attribute__((format(printf, 4, 5))) static int refuse(int *reason, int why, sl_err *err,
                                                        const char *fmt, ...)
{
    if (reason)
        *reason = why;
    if (err) {
        char detail[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(detail, sizeof(detail), fmt, ap);
        va_end(ap);
        sl_err_set(err, reason_code(why), "frame refused (%s): %s", reason_names[why], detail);
    }
    return -1;
}

/* ---- keys ---- */

static int sodium_ready(sl_err *err)
{
    if (sodium_init() < 0)
        return sl_err_set(err, SL_EINTERNAL, "libsodium failed to initialise");
    return 0;
}

int dev_kx_keypair_generate(dev_kx_keypair *kp, sl_err *err)
{
    if (sodium_ready(err) < 0)
        return -1;
    crypto_box_keypair(kp->pk, kp->sk);
    return 0;
}

int dev_kx_keypair_from_seed(dev_kx_keypair *kp, const uint8_t seed[32], sl_err *err)
{
    if (sodium_ready(err) < 0)
        return -1;
    crypto_box_seed_keypair(kp->pk, kp->sk, seed);
    return 0;
}

/* key || hdr_key = BLAKE2b-512 keyed with X25519(self, peer) over
 * "skyloom frame v1" || sender_pk || receiver_pk || job_id || epoch ||
 * from_stage || to_stage. The sender's key comes first, so the two
 * directions between the same pair of devices never share a key. */
static int derive_keys(const dev_link_cfg *cfg, const dev_kx_keypair *self, const uint8_t peer_pk[32],
                       int sending, uint8_t key[32], uint8_t hdr_key[32], sl_err *err)
{
    static const char label[16] = "skyloom frame v1";
    uint8_t shared[crypto_scalarmult_BYTES], out[64], params[16];
    if (!self || !peer_pk)
        return sl_err_set(err, SL_EINVAL, "sealed link needs this end's key pair and the peer's public key");
    if (sodium_ready(err) < 0)
        return -1;
    if (crypto_scalarmult(shared, self->sk, peer_pk) != 0)
        return sl_err_set(err, SL_EAUTH, "peer public key is a low-order point");
    dev_st64(params, cfg->job_id);
    dev_st32(params + 8, cfg->epoch);
    dev_st16(params + 12, cfg->from_stage);
    dev_st16(params + 14, cfg->to_stage);
    crypto_generichash_state st;
    crypto_generichash_init(&st, shared, sizeof(shared), sizeof(out));
    crypto_generichash_update(&st, (const uint8_t *)label, sizeof(label));
    crypto_generichash_update(&st, sending ? self->pk : peer_pk, 32);
    crypto_generichash_update(&st, sending ? peer_pk : self->pk, 32);
    crypto_generichash_update(&st, params, sizeof(params));
    crypto_generichash_final(&st, out, sizeof(out));
    memcpy(key, out, 32);
    memcpy(hdr_key, out + 32, 32);
    sodium_memzero(shared, sizeof(shared));
    sodium_memzero(out, sizeof(out));
    sodium_memzero(&st, sizeof(st));
    return 0;
}

static int check_cfg(const dev_link_cfg *cfg, sl_err *err)
{
    if (cfg->sealed != 0 && cfg->sealed != 1)
        return sl_err_set(err, SL_EINVAL, "link: sealed must be 0 or 1");
    if (cfg->from_stage == cfg->to_stage)
        return sl_err_set(err, SL_EINVAL, "link: from and to stage are both %u", cfg->from_stage);
    return 0;
}

/* The part of tx and rx set-up they share: checked cfg and, when sealed,
 * the keys of the direction (sending: self -> peer, else peer -> self) and
 * the cipher context. On failure nothing is left to free or wipe. */
static int link_setup(dev_link_cfg *dst, uint8_t key[32], uint8_t hdr_key[32], dev_aead *aead,
                      const dev_link_cfg *cfg, const dev_kx_keypair *self,
                      const uint8_t peer_pk[32], int sending, sl_err *err)
{
    if (check_cfg(cfg, err) < 0)
        return -1;
    *dst = *cfg;
    if (dst->max_payload == 0)
        dst->max_payload = DEV_FRAME_DEFAULT_MAX_PAYLOAD;
    if (!cfg->sealed)
        return 0;
    if (derive_keys(cfg, self, peer_pk, sending, key, hdr_key, err) < 0)
        return -1;
    if (dev_aead_init(aead, err) < 0) {
        sodium_memzero(key, 32);
        sodium_memzero(hdr_key, 32);
        return sl_err_wrap(err, "link");
    }
    return 0;
}

int dev_link_tx_init(dev_link_tx *tx, const dev_link_cfg *cfg, const dev_kx_keypair *self,
                     const uint8_t peer_pk[32], sl_err *err)
{
    memset(tx, 0, sizeof(*tx));
    return link_setup(&tx->cfg, tx->key, tx->hdr_key, &tx->aead, cfg, self, peer_pk, 1, err);
}

int dev_link_rx_init(dev_link_rx *rx, const dev_link_cfg *cfg, const dev_kx_keypair *self,
                     const uint8_t peer_pk[32], sl_err *err)
{
    memset(rx, 0, sizeof(*rx));
    return link_setup(&rx->cfg, rx->key, rx->hdr_key, &rx->aead, cfg, self, peer_pk, 0, err);
}

void dev_link_tx_free(dev_link_tx *tx)
{
    dev_aead_free(&tx->aead);
    sodium_memzero(tx, sizeof(*tx));
}

void dev_link_rx_free(dev_link_rx *rx)
{
    dev_aead_free(&rx->aead);
    free(rx->scratch);
    sodium_memzero(rx, sizeof(*rx));
}

/* ---- header ---- */

size_t dev_frame_dtype_size(int dtype)
{
    switch (dtype) {
    case DEV_DTYPE_F32:
    case DEV_DTYPE_I32:
        return 4;
    case DEV_DTYPE_F64:
        return 8;
    case DEV_DTYPE_U8:
        return 1;
    }
    return 0;
}

static const char *dtype_name(int dtype)
{
    static const char *const names[] = {"?", "f32", "i32", "f64", "u8"};
    return dtype > 0 && dtype <= DEV_DTYPE_U8 ? names[dtype] : "?";
}

#define DIR_LAST DEV_DIR_SYNC
#define CODEC_BIT(c) (1u << (c))
#define CODECS_ALL ((1u << DEV_CODEC_COUNT) - 1)

/* What each direction may carry: its dtype, the codecs allowed, and whether
 * aux must be 0. */
static const struct dir_rule {
    const char *name;
    uint8_t dtype;
    uint8_t codecs;
    uint8_t aux_zero;
} dir_rules[DIR_LAST + 1] = {
    [DEV_DIR_ACTIVATION] = {"activation", DEV_DTYPE_F32, CODECS_ALL & ~CODEC_BIT(DEV_CODEC_TOPK), 1},
    [DEV_DIR_GRADIENT] = {"gradient", DEV_DTYPE_F32, CODECS_ALL, 1},
    [DEV_DIR_MASK] = {"mask", DEV_DTYPE_I32, CODEC_BIT(DEV_CODEC_NONE), 1},
    [DEV_DIR_LABELS] = {"labels", DEV_DTYPE_I32, CODEC_BIT(DEV_CODEC_NONE), 0},
    [DEV_DIR_TIED] = {"tied", DEV_DTYPE_F32, CODECS_ALL & ~CODEC_BIT(DEV_CODEC_TOPK), 1},
    [DEV_DIR_GATHER] = {"gather", DEV_DTYPE_F64, CODEC_BIT(DEV_CODEC_NONE), 0},
    [DEV_DIR_GATHER_RESULT] = {"gather result", DEV_DTYPE_F64, CODEC_BIT(DEV_CODEC_NONE), 0},
    [DEV_DIR_ABORT] = {"abort", DEV_DTYPE_U8, CODEC_BIT(DEV_CODEC_NONE), 1},
    [DEV_DIR_SYNC] = {"sync", DEV_DTYPE_U8, CODEC_BIT(DEV_CODEC_NONE), 0},
};

/* 1 if p[0..n) is well-formed UTF-8 (RFC 3629: shortest forms, no
 * surrogates, nothing above U+10FFFF). */
static int utf8_valid(const uint8_t *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t c = p[i], min;
        size_t len;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            len = 2, c &= 0x1f, min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            len = 3, c &= 0x0f, min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            len = 4, c &= 0x07, min = 0x10000;
        } else {
            return 0;
        }
        if (n - i < len)
            return 0;
        for (size_t j = 1; j < len; j++) {
            if ((p[i + j] & 0xc0) != 0x80)
                return 0;
            c = c << 6 | (p[i + j] & 0x3f);
        }
        if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
            return 0;
        i += len;
    }
    return 1;
}

size_t dev_frame_elems(const dev_frame_hdr *h)
{
    uint64_t n = 1;
    if (h->ndim == 0 || h->ndim > DEV_FRAME_MAX_DIMS)
        return 0;
    for (int i = 0; i < h->ndim; i++) {
        if (h->dims[i] == 0 || n * h->dims[i] > DEV_FRAME_MAX_ELEMS)
            return 0; /* n <= 2^28 and dims < 2^32: the product fits in 64 bits */
        n *= h->dims[i];
    }
    return (size_t)n;
}

int dev_frame_hdr_equal(const dev_frame_hdr *a, const dev_frame_hdr *b)
{
    return a->version == b->version && a->flags == b->flags && a->direction == b->direction &&
           a->codec == b->codec && a->dtype == b->dtype && a->ndim == b->ndim &&
           a->from_stage == b->from_stage && a->to_stage == b->to_stage &&
           a->microbatch == b->microbatch && a->job_id == b->job_id && a->step == b->step &&
           a->seq == b->seq && memcmp(a->dims, b->dims, sizeof(a->dims)) == 0 && a->k == b->k &&
           a->payload_len == b->payload_len && a->epoch == b->epoch && a->aux == b->aux;
}

static void put_fields(uint8_t *p, const dev_frame_hdr *h)
{
    dev_st32(p + 0, DEV_FRAME_MAGIC);
    p[4] = h->version;
    p[5] = h->flags;
    p[6] = h->direction;
    p[7] = h->codec;
    p[8] = h->dtype;
    p[9] = h->ndim;
    dev_st16(p + 10, h->from_stage);
    dev_st16(p + 12, h->to_stage);
    dev_st16(p + 14, h->microbatch);
    dev_st64(p + 16, h->job_id);
    dev_st64(p + 24, h->step);
    dev_st64(p + 32, h->seq);
    for (int i = 0; i < DEV_FRAME_MAX_DIMS; i++)
        dev_st32(p + 40 + 4 * i, h->dims[i]);
    dev_st32(p + 56, h->k);
    dev_st32(p + 60, h->payload_len);
    dev_st32(p + 64, h->epoch);
    dev_st32(p + 68, 0);
    dev_st64(p + 72, h->aux);
}

/* Payload bytes without the AEAD tag: the codec's for f32, the elements
 * as they are for the other dtypes (codec none only). -1 if invalid. */
static int plain_len(const dev_frame_hdr *h, size_t n, size_t *len)
{
    if (h->dtype == DEV_DTYPE_F32)
        return dev_codec_payload_len(h->codec, n, h->dims[h->ndim - 1], h->k, len, NULL);
    size_t size = dev_frame_dtype_size(h->dtype);
    if (size == 0 || h->codec != DEV_CODEC_NONE)
        return -1;
    *len = n * size; /* n <= 2^28: no overflow */
    return 0;
}

/* Checks the fields that do not depend on the bytes present; on success
 * *plain is the payload length without the AEAD tag. */
static int check_fields(const dev_frame_hdr *h, uint32_t max_payload, size_t *plain, int *reason,
                        sl_err *err)
{
    if (h->flags & ~DEV_FRAME_FLAG_SEALED)
        return refuse(reason, DEV_FR_BAD_HEADER, err, "unknown flags 0x%02x", h->flags);
    if (h->direction == 0 || h->direction > DIR_LAST)
        return refuse(reason, DEV_FR_BAD_HEADER, err, "direction %u", h->direction);
    if (h->codec >= DEV_CODEC_COUNT)
        return refuse(reason, DEV_FR_BAD_HEADER, err, "codec %u", h->codec);
    const struct dir_rule *r = &dir_rules[h->direction];
    if (h->dtype != r->dtype)
        return refuse(reason, DEV_FR_BAD_HEADER, err, "dtype %u (%s) on a %s frame, which carries %s",
                      h->dtype, dtype_name(h->dtype), r->name, dtype_name(r->dtype));
    if (!(r->codecs & CODEC_BIT(h->codec)))
        return refuse(reason, DEV_FR_BAD_HEADER, err, "codec %s on a %s frame",
                      dev_codec_name(h->codec), r->name);
    if (r->aux_zero && h->aux != 0)
        return refuse(reason, DEV_FR_BAD_HEADER, err, "aux %llu on a %s frame, which has none",
                      (unsigned long long)h->aux, r->name);
    if (h->ndim == 0 || h->ndim > DEV_FRAME_MAX_DIMS)
        return refuse(reason, DEV_FR_BAD_SHAPE, err, "ndim %u", h->ndim);
    if (h->direction == DEV_DIR_ABORT && h->ndim != 1)
        return refuse(reason, DEV_FR_BAD_SHAPE, err, "abort frame of ndim %u, not 1", h->ndim);
    uint64_t n = 1;
    for (int i = 0; i < DEV_FRAME_MAX_DIMS; i++) {
        if (i >= h->ndim) {
            if (h->dims[i] != 0)
                return refuse(reason, DEV_FR_BAD_SHAPE, err, "dims[%d] = %u beyond ndim %u", i,
                              h->dims[i], h->ndim);
            continue;
        }
        if (h->dims[i] == 0)
            return refuse(reason, DEV_FR_BAD_SHAPE, err, "dims[%d] is 0", i);
        n *= h->dims[i];
        if (n > DEV_FRAME_MAX_ELEMS)
            return refuse(reason, DEV_FR_OVERSIZED, err, "tensor of more than %u elements",
                          DEV_FRAME_MAX_ELEMS);
    }
    if (h->direction == DEV_DIR_ABORT && n > DEV_FRAME_ABORT_MAX)
        return refuse(reason, DEV_FR_OVERSIZED, err, "abort reason of %llu bytes, at most %d",
                      (unsigned long long)n, DEV_FRAME_ABORT_MAX);
    if (h->codec == DEV_CODEC_TOPK ? h->k == 0 || h->k > n : h->k != 0)
        return refuse(reason, DEV_FR_BAD_SHAPE, err, "k = %u for codec %s and %llu elements",
                      h->k, dev_codec_name(h->codec), (unsigned long long)n);
    if (h->payload_len > max_payload)
        return refuse(reason, DEV_FR_OVERSIZED, err, "payload of %u bytes, limit %u",
                      h->payload_len, max_payload);
    size_t len;
    if (plain_len(h, (size_t)n, &len) < 0)
        return refuse(reason, DEV_FR_BAD_SHAPE, err, "shape does not fit codec %s",
                      dev_codec_name(h->codec));
    size_t want = len + ((h->flags & DEV_FRAME_FLAG_SEALED) ? DEV_FRAME_TAG_LEN : 0);
    if (h->payload_len != want)
        return refuse(reason, DEV_FR_LENGTH_MISMATCH, err,
                      "payload_len %u, %s codec %s with this shape needs %zu", h->payload_len,
                      dtype_name(h->dtype), dev_codec_name(h->codec), want);
    *plain = len;
    return 0;
}

int dev_frame_parse_header(const uint8_t *in, size_t len, uint32_t max_payload, dev_frame_hdr *h,
                           int *reason, sl_err *err)
{
    size_t plain;
    if (max_payload == 0)
        max_payload = DEV_FRAME_DEFAULT_MAX_PAYLOAD;
    memset(h, 0, sizeof(*h));
    if (len < DEV_FRAME_HDR_LEN)
        return refuse(reason, DEV_FR_TRUNCATED, err, "%zu bytes, a header is %d", len,
                      DEV_FRAME_HDR_LEN);
    if (dev_ld32(in) != DEV_FRAME_MAGIC)
        return refuse(reason, DEV_FR_BAD_MAGIC, err, "magic 0x%08x", dev_ld32(in));
    if (in[4] != DEV_FRAME_VERSION)
        return refuse(reason, DEV_FR_BAD_VERSION, err, "version %u, this build speaks %d", in[4],
                      DEV_FRAME_VERSION);
    h->version = in[4];
    h->flags = in[5];
    h->direction = in[6];
    h->codec = in[7];
    h->dtype = in[8];
    h->ndim = in[9];
    h->from_stage = dev_ld16(in + 10);
    h->to_stage = dev_ld16(in + 12);
    h->microbatch = dev_ld16(in + 14);
    h->job_id = dev_ld64(in + 16);
    h->step = dev_ld64(in + 24);
    h->seq = dev_ld64(in + 32);
    for (int i = 0; i < DEV_FRAME_MAX_DIMS; i++)
        h->dims[i] = dev_ld32(in + 40 + 4 * i);
    h->k = dev_ld32(in + 56);
    h->payload_len = dev_ld32(in + 60);
    h->epoch = dev_ld32(in + 64);
    h->aux = dev_ld64(in + 72);
    if (dev_ld32(in + 68) != 0)
        return refuse(reason, DEV_FR_BAD_HEADER, err, "reserved bytes 68..71 are 0x%08x",
                      dev_ld32(in + 68));
    if (check_fields(h, max_payload, &plain, reason, err) < 0)
        return -1;
    if (!(h->flags & DEV_FRAME_FLAG_SEALED)) {
        uint8_t any = 0;
        for (int i = DEV_FRAME_FIELDS_LEN; i < DEV_FRAME_HDR_LEN; i++)
            any |= in[i];
        if (any)
            return refuse(reason, DEV_FR_BAD_HEADER, err, "header tag set on a plain frame");
    }
    if (len - DEV_FRAME_HDR_LEN < h->payload_len)
        return refuse(reason, DEV_FR_TRUNCATED, err, "header claims %u payload bytes, %zu arrived",
                      h->payload_len, len - DEV_FRAME_HDR_LEN);
    if (len - DEV_FRAME_HDR_LEN > h->payload_len)
        return refuse(reason, DEV_FR_LENGTH_MISMATCH, err, "%zu bytes after the payload",
                      len - DEV_FRAME_HDR_LEN - h->payload_len);
    if (reason)
        *reason = DEV_FR_OK;
    return 0;
}

size_t dev_frame_max_len(const dev_frame_hdr *h)
{
    dev_frame_hdr t = *h;
    size_t n = dev_frame_elems(h), len;
    if (n == 0)
        return 0;
    if (t.dtype == 0)
        t.dtype = DEV_DTYPE_F32;
    if (t.codec != DEV_CODEC_TOPK)
        t.k = 0;
    if (plain_len(&t, n, &len) < 0)
        return 0;
    return len + DEV_FRAME_HDR_LEN + DEV_FRAME_TAG_LEN;
}

/* ---- receive window (RFC 6479 ring, as in WireGuard) ---- */

static int window_check(const dev_link_rx *rx, uint64_t seq)
{
    if (!rx->have_top || seq > rx->top)
        return DEV_FR_OK;
    if (rx->top - seq >= DEV_WINDOW_SIZE)
        return DEV_FR_TOO_OLD;
    if ((rx->window[(seq >> 6) % DEV_WINDOW_WORDS] >> (seq & 63)) & 1u)
        return DEV_FR_REPLAY;
    return DEV_FR_OK;
}

static void window_update(dev_link_rx *rx, uint64_t seq)
{
    if (!rx->have_top) {
        memset(rx->window, 0, sizeof(rx->window));
        rx->have_top = 1;
        rx->top = seq;
    } else if (seq > rx->top) {
        uint64_t cur = rx->top >> 6, steps = (seq >> 6) - cur;
        if (steps > DEV_WINDOW_WORDS)
            steps = DEV_WINDOW_WORDS;
        for (uint64_t i = 1; i <= steps; i++)
            rx->window[(cur + i) % DEV_WINDOW_WORDS] = 0;
        rx->top = seq;
    }
    rx->window[(seq >> 6) % DEV_WINDOW_WORDS] |= (uint64_t)1 << (seq & 63);
}

/* ---- encode / decode ---- */

/* On a little-endian host a none payload is the elements' bytes as they are
 * in memory, so a sealed none frame is sealed straight from the caller's
 * tensor and opened straight into it: one pass over the data each way
 * instead of a copy plus an in-place pass. The bytes are the same. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define NONE_IS_MEMORY 1
#else
#define NONE_IS_MEMORY 0
#endif

/* n elements of a dtype other than f32 to and from their little-endian
 * bytes; src and dst may be the same buffer. */
static void raw_put(int dtype, const void *src, size_t n, uint8_t *out)
{
    size_t size = dev_frame_dtype_size(dtype);
    const uint8_t *p = src;
    if (NONE_IS_MEMORY || size == 1) {
        memmove(out, p, n * size);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (size == 4) {
            uint32_t v;
            memcpy(&v, p + 4 * i, 4);
            dev_st32(out + 4 * i, v);
        } else {
            uint64_t v;
            memcpy(&v, p + 8 * i, 8);
            dev_st64(out + 8 * i, v);
        }
    }
}

static void raw_get(int dtype, const uint8_t *in, size_t n, void *dst)
{
    size_t size = dev_frame_dtype_size(dtype);
    uint8_t *p = dst;
    if (NONE_IS_MEMORY || size == 1) {
        memmove(p, in, n * size);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (size == 4) {
            uint32_t v = dev_ld32(in + 4 * i);
            memcpy(p + 4 * i, &v, 4);
        } else {
            uint64_t v = dev_ld64(in + 8 * i);
            memcpy(p + 8 * i, &v, 8);
        }
    }
}

/* seq and epoch, so that no nonce repeats across epochs even where keys
 * would (the key derivation binds the epoch too). */
static void make_nonce(uint8_t nonce[DEV_AEAD_NONCE_LEN], uint64_t seq, uint32_t epoch)
{
    memset(nonce, 0, DEV_AEAD_NONCE_LEN);
    dev_st64(nonce, seq);
    dev_st32(nonce + 8, epoch);
}

int dev_frame_encode_any(dev_link_tx *tx, dev_frame_hdr *h, const void *data, dev_topk_ef *ef,
                         uint8_t *out, size_t cap, size_t *outlen, sl_err *err)
{
    size_t plain, total;
    int why;
    h->version = DEV_FRAME_VERSION;
    h->flags = tx->cfg.sealed ? DEV_FRAME_FLAG_SEALED : 0;
    h->epoch = tx->cfg.epoch;
    h->job_id = tx->cfg.job_id;
    h->from_stage = tx->cfg.from_stage;
    h->to_stage = tx->cfg.to_stage;
    h->seq = tx->next_seq;
    if (h->codec != DEV_CODEC_TOPK)
        h->k = 0;
    size_t n = dev_frame_elems(h);
    /* payload_len is checked against its exact value below; compute it first. */
    h->payload_len = 0;
    if (n > 0 && plain_len(h, n, &plain) == 0 && plain + DEV_FRAME_TAG_LEN <= UINT32_MAX)
        h->payload_len = (uint32_t)(plain + (tx->cfg.sealed ? DEV_FRAME_TAG_LEN : 0));
    if (check_fields(h, tx->cfg.max_payload, &plain, &why, err) < 0)
        return sl_err_wrap(err, "encode");
    if (h->direction == DEV_DIR_ABORT && !utf8_valid(data, n))
        return sl_err_set(err, SL_EINVAL, "encode: the abort reason is not UTF-8");
    if (tx->next_seq == UINT64_MAX)
        return sl_err_set(err, SL_ESTATE, "encode: link sequence numbers exhausted; set up a new epoch");
    total = DEV_FRAME_HDR_LEN + (size_t)h->payload_len;
    if (cap < total)
        return sl_err_set(err, SL_EINVAL, "encode: frame needs %zu bytes, buffer holds %zu", total, cap);
    put_fields(out, h);
    memset(out + DEV_FRAME_FIELDS_LEN, 0, DEV_FRAME_HDR_LEN - DEV_FRAME_FIELDS_LEN);
    uint8_t *payload = out + DEV_FRAME_HDR_LEN;
    const uint8_t *plaintext = payload;
    if (NONE_IS_MEMORY && tx->cfg.sealed && h->codec == DEV_CODEC_NONE)
        plaintext = data;
    else if (h->dtype != DEV_DTYPE_F32)
        raw_put(h->dtype, data, n, payload);
    else if (dev_codec_encode(h->codec, data, n, h->dims[h->ndim - 1], h->k, ef, payload, err) < 0)
        return sl_err_wrap(err, "encode");
    if (tx->cfg.sealed) {
        uint8_t nonce[DEV_AEAD_NONCE_LEN];
        make_nonce(nonce, h->seq, h->epoch);
        crypto_generichash(out + DEV_FRAME_FIELDS_LEN, 16, out, DEV_FRAME_FIELDS_LEN, tx->hdr_key,
                           sizeof(tx->hdr_key));
        if (dev_aead_seal(&tx->aead, payload, payload + plain, plaintext, plain, out,
                          DEV_FRAME_FIELDS_LEN, nonce, tx->key, err) < 0) {
            tx->next_seq++; /* keystream was made under this seq: never use it again */
            return sl_err_wrap(err, "encode");
        }
    }
    tx->next_seq++;
    tx->frames++;
    tx->bytes += total;
    *outlen = total;
    return 0;
}

int dev_frame_encode(dev_link_tx *tx, dev_frame_hdr *h, const float *data, dev_topk_ef *ef,
                     uint8_t *out, size_t cap, size_t *outlen, sl_err *err)
{
    h->dtype = DEV_DTYPE_F32;
    return dev_frame_encode_any(tx, h, data, ef, out, cap, outlen, err);
}

static int rx_refuse(dev_link_rx *rx, int why, sl_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int rx_refuse(dev_link_rx *rx, int why, sl_err *err, const char *fmt, ...)
{
    char detail[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    rx->last = why;
    rx->refused[why]++;
    return refuse(NULL, why, err, "%s", detail);
}

/* dev_frame_decode_any, or dev_frame_decode with f32_only set. */
static int decode(dev_link_rx *rx, const uint8_t *in, size_t len, dev_frame_hdr *h, void *data,
                  size_t cap_bytes, int f32_only, sl_err *err)
{
    int why;
    if (dev_frame_parse_header(in, len, rx->cfg.max_payload, h, &why, err) < 0) {
        rx->last = why;
        rx->refused[why]++;
        return -1;
    }
    if (f32_only && h->dtype != DEV_DTYPE_F32)
        return rx_refuse(rx, DEV_FR_BAD_HEADER, err, "dtype %s where f32 was expected",
                         dtype_name(h->dtype));
    int sealed = (h->flags & DEV_FRAME_FLAG_SEALED) != 0;
    if (sealed != rx->cfg.sealed)
        return rx_refuse(rx, DEV_FR_SEAL_MISMATCH, err, "%s frame on a %s link",
                         sealed ? "sealed" : "plain", rx->cfg.sealed ? "sealed" : "plain");
    if (h->job_id != rx->cfg.job_id || h->from_stage != rx->cfg.from_stage ||
        h->to_stage != rx->cfg.to_stage)
        return rx_refuse(rx, DEV_FR_MISROUTED, err,
                         "job %llu stage %u->%u on the link of job %llu stage %u->%u",
                         (unsigned long long)h->job_id, h->from_stage, h->to_stage,
                         (unsigned long long)rx->cfg.job_id, rx->cfg.from_stage, rx->cfg.to_stage);
    if (h->epoch != rx->cfg.epoch)
        return rx_refuse(rx, DEV_FR_EPOCH, err, "epoch %u on a link of epoch %u", h->epoch,
                         rx->cfg.epoch);
    if (sealed) {
        uint8_t tag[16];
        crypto_generichash(tag, sizeof(tag), in, DEV_FRAME_FIELDS_LEN, rx->hdr_key,
                           sizeof(rx->hdr_key));
        if (crypto_verify_16(tag, in + DEV_FRAME_FIELDS_LEN) != 0)
            return rx_refuse(rx, DEV_FR_TAMPERED_HEADER, err, "header tag of seq %llu does not verify",
                             (unsigned long long)h->seq);
    }
    why = window_check(rx, h->seq);
    if (why == DEV_FR_REPLAY)
        return rx_refuse(rx, why, err, "seq %llu was already received", (unsigned long long)h->seq);
    if (why == DEV_FR_TOO_OLD)
        return rx_refuse(rx, why, err, "seq %llu is %llu behind the newest (window %d)",
                         (unsigned long long)h->seq, (unsigned long long)(rx->top - h->seq),
                         DEV_WINDOW_SIZE);
    size_t n = dev_frame_elems(h), size = dev_frame_dtype_size(h->dtype);
    if (n * size > cap_bytes)
        return rx_refuse(rx, DEV_FR_CAPACITY, err, "tensor of %zu %s elements (%zu bytes), buffer holds %zu bytes",
                         n, dtype_name(h->dtype), n * size, cap_bytes);
    const uint8_t *payload = in + DEV_FRAME_HDR_LEN;
    size_t plain = h->payload_len - (sealed ? DEV_FRAME_TAG_LEN : 0);
    if (sealed) {
        uint8_t *dst;
        if (h->codec == DEV_CODEC_NONE) {
            dst = data; /* same size: open straight into the caller's buffer */
        } else {
            if (rx->scratch_cap < plain) {
                uint8_t *p = sl_try_malloc(plain);
                if (!p)
                    return rx_refuse(rx, DEV_FR_CAPACITY, err, "out of memory for %zu bytes", plain);
                free(rx->scratch);
                rx->scratch = p;
                rx->scratch_cap = plain;
            }
            dst = rx->scratch;
        }
        uint8_t nonce[DEV_AEAD_NONCE_LEN];
        sl_err aerr = {0};
        make_nonce(nonce, h->seq, h->epoch);
        if (dev_aead_open(&rx->aead, dst, payload, plain, payload + plain, in, DEV_FRAME_FIELDS_LEN,
                          nonce, rx->key, &aerr) < 0) {
            if (aerr.code == SL_EAUTH)
                return rx_refuse(rx, DEV_FR_TAMPERED_PAYLOAD, err,
                                 "payload tag of seq %llu does not verify", (unsigned long long)h->seq);
            /* the receiver failed, not the frame: like the scratch allocation above */
            return rx_refuse(rx, DEV_FR_CAPACITY, err, "%s", aerr.msg);
        }
        payload = dst;
    }
    sl_err cerr;
    int done = NONE_IS_MEMORY && sealed && h->codec == DEV_CODEC_NONE; /* opened into data */
    if (!done && h->dtype != DEV_DTYPE_F32)
        raw_get(h->dtype, payload, n, data);
    else if (!done &&
             dev_codec_decode(h->codec, payload, n, h->dims[h->ndim - 1], h->k, data, &cerr) < 0)
        return rx_refuse(rx, DEV_FR_BAD_PAYLOAD, err, "%s", cerr.msg);
    if (h->direction == DEV_DIR_ABORT && !utf8_valid(data, n))
        return rx_refuse(rx, DEV_FR_BAD_PAYLOAD, err, "abort reason of seq %llu is not UTF-8",
                         (unsigned long long)h->seq);
    window_update(rx, h->seq);
    rx->last = DEV_FR_OK;
    rx->frames++;
    rx->bytes += len;
    return 0;
}

int dev_frame_decode(dev_link_rx *rx, const uint8_t *in, size_t len, dev_frame_hdr *h, float *data,
                     size_t cap, sl_err *err)
{
    size_t cap_bytes = cap > SIZE_MAX / sizeof(float) ? SIZE_MAX : cap * sizeof(float);
    return decode(rx, in, len, h, data, cap_bytes, 1, err);
}

int dev_frame_decode_any(dev_link_rx *rx, const uint8_t *in, size_t len, dev_frame_hdr *h,
                         void *data, size_t cap_bytes, sl_err *err)
{
    return decode(rx, in, len, h, data, cap_bytes, 0, err);
}
