/* dev_frame.h - frames between pipeline stages: a fixed little-endian header,
 * a payload (an f32 tensor compressed by dev_codec.h, or the elements of an
 * i32, f64 or u8 tensor as they are), sealing with XChaCha20-Poly1305 under
 * per-link keys from X25519, and a receive window against replays.
 *
 * Wire layout (all integers little-endian, encoded byte by byte):
 *
 *   off size field
 *     0   4  magic        "SLFR" (0x53 0x4c 0x46 0x52)
 *     4   1  version      2
 *     5   1  flags        bit 0: sealed; other bits must be 0
 *     6   1  direction    enum dev_direction: what the frame carries
 *     7   1  codec        enum dev_codec (f32 only; other dtypes: none)
 *     8   1  dtype        enum dev_dtype
 *     9   1  ndim         1..4
 *    10   2  from_stage
 *    12   2  to_stage
 *    14   2  microbatch
 *    16   8  job_id
 *    24   8  step
 *    32   8  seq          per link direction, strictly increasing on send
 *    40  16  dims[4]      u32 each; dims[i] >= 1 for i < ndim, 0 after
 *    56   4  k            topk: entries kept (1..n); other codecs: 0
 *    60   4  payload_len  bytes after the header (sealed: ciphertext + 16-byte tag)
 *    64   4  epoch        the plan epoch; must be the link's
 *    68   4  reserved     0
 *    72   8  aux          per direction, see below; 0 where it has none
 *    80  16  header tag   sealed: keyed BLAKE2b-128 of bytes 0..79; else zeros
 *    96      payload
 *
 * What each direction may carry (anything else is refused as a bad header):
 *
 *   activation      f32, codec none/fp16/bf16/int8               aux 0
 *   gradient        f32, any codec                               aux 0
 *   tied            f32, codec none/fp16/bf16/int8               aux 0
 *   mask            i32, none   aux: global index of the micro-batch's first sequence
 *   labels          i32, none   aux: the batch's masked-token count
 *   gather          f64, none   aux: free
 *   gather result   f64, none   aux: free
 *   abort           u8, none, ndim 1, 1..1024 bytes of UTF-8      aux 0
 *   sync            u8, none, ndim 1: a codec payload (dev_sync.h)
 *                   aux: FNV-1a 64 of the tensor's name
 *
 * The payload is sealed with XChaCha20-Poly1305 (dev_aead.h; bytes 0..79 as
 * associated data, nonce = seq || epoch). The separate header tag lets a
 * receiver tell a forged header from a forged payload and refuse the former
 * before any payload work.
 *
 * Usage (one dev_link_tx on the sender, one dev_link_rx on the receiver,
 * both made from the same dev_link_cfg and each end's own key pair plus the
 * other end's public key):
 *
 *   dev_frame_hdr h = {.direction = DEV_DIR_ACTIVATION, .codec = DEV_CODEC_INT8,
 *                      .step = s, .microbatch = mb, .ndim = 3, .dims = {B, T, H}};
 *   size_t cap = dev_frame_max_len(&h), len;
 *   dev_frame_encode(&tx, &h, x, NULL, buf, cap, &len, &err);   // buf[0..len) on the wire
 *   ...
 *   dev_frame_decode(&rx, buf, len, &h, y, n_elems, &err);      // -1: refused, rx.last says why
 *
 * Other dtypes: set h.dtype (and h.aux) and use dev_frame_encode_any /
 * dev_frame_decode_any, whose buffers are in bytes.
 *
 * Neither object is thread-safe: one thread per direction of a link. */
#ifndef DEV_FRAME_H
#define DEV_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "dev_aead.h"
#include "dev_codec.h"
#include "sl_err.h"

#define DEV_FRAME_MAGIC 0x52464C53u /* "SLFR" read as a little-endian u32 */
#define DEV_FRAME_VERSION 3
#define DEV_FRAME_FIELDS_LEN 80     /* the part covered by the tags */
#define DEV_FRAME_HDR_LEN 96        /* fields + header tag */
#define DEV_FRAME_TAG_LEN 16        /* AEAD tag at the end of a sealed payload */
#define DEV_FRAME_MAX_DIMS 4
#define DEV_FRAME_FLAG_SEALED 0x01u
/* Largest tensor a frame may describe (elements), whatever the codec. */
#define DEV_FRAME_MAX_ELEMS (1u << 28)
/* Longest reason an abort frame carries (bytes of UTF-8). */
#define DEV_FRAME_ABORT_MAX 1024
/* Default receive limit on payload_len; a link may set a smaller one. */
#define DEV_FRAME_DEFAULT_MAX_PAYLOAD (256u << 20)
/* Receive window: frames up to this many sequence numbers behind the newest
 * accepted one are still accepted once (WireGuard's scheme, RFC 6479). */
#define DEV_WINDOW_WORDS 16
#define DEV_WINDOW_SIZE ((DEV_WINDOW_WORDS - 1) * 64)

enum dev_direction {
    DEV_DIR_ACTIVATION = 1,    /* boundary activation, forward */
    DEV_DIR_GRADIENT = 2,      /* boundary gradient, backward */
    DEV_DIR_MASK = 3,          /* a micro-batch's valid mask */
    DEV_DIR_LABELS = 4,        /* a batch's labels */
    DEV_DIR_TIED = 5,          /* the tied word-embedding gradient */
    DEV_DIR_GATHER = 6,        /* a few doubles per stage (loss, norm partial sums) */
    DEV_DIR_GATHER_RESULT = 7, /* what the gather adds up to, sent back */
    DEV_DIR_ABORT = 8,         /* a stage stopped: the reason, UTF-8 */
    DEV_DIR_SYNC = 9,          /* a replica's sync payload of one tensor (dev_sync.h) */
};

/* Element type of the tensor, the same at both ends. */
enum dev_dtype { DEV_DTYPE_F32 = 1, DEV_DTYPE_I32 = 2, DEV_DTYPE_F64 = 3, DEV_DTYPE_U8 = 4 };

/* Bytes per element of dtype; 0 if unknown. */
size_t dev_frame_dtype_size(int dtype);

typedef struct dev_frame_hdr {
    uint8_t version, flags, direction, codec, dtype, ndim;
    uint16_t from_stage, to_stage, microbatch;
    uint64_t job_id, step, seq;
    uint32_t dims[DEV_FRAME_MAX_DIMS];
    uint32_t k;
    uint32_t payload_len;
    uint32_t epoch;
    uint64_t aux;
} dev_frame_hdr;

/* Why a frame was refused. Each has a counter in dev_link_rx. */
enum dev_frame_reason {
    DEV_FR_OK = 0,
    DEV_FR_TRUNCATED,       /* shorter than a header, or than the header says */
    DEV_FR_BAD_MAGIC,
    DEV_FR_BAD_VERSION,
    DEV_FR_BAD_HEADER,      /* unknown flag, direction, codec, dtype; a combination or aux
                               the direction does not allow; reserved bytes set */
    DEV_FR_BAD_SHAPE,       /* ndim, zero or stray dims, k out of range */
    DEV_FR_OVERSIZED,       /* payload_len or element count above the limit */
    DEV_FR_LENGTH_MISMATCH, /* payload_len disagrees with dtype+codec+shape, or extra bytes */
    DEV_FR_SEAL_MISMATCH,   /* sealed frame on a plain link or the reverse */
    DEV_FR_MISROUTED,       /* job or stages are not this link's */
    DEV_FR_TAMPERED_HEADER, /* header tag does not verify */
    DEV_FR_TAMPERED_PAYLOAD,/* AEAD tag does not verify */
    DEV_FR_REPLAY,          /* seq already received */
    DEV_FR_TOO_OLD,         /* seq behind the window */
    DEV_FR_BAD_PAYLOAD,     /* invalid codec data (bad scale, index), abort text not UTF-8 */
    DEV_FR_CAPACITY,        /* caller's buffer smaller than the tensor */
    DEV_FR_EPOCH,           /* the frame's plan epoch is not the link's */
    DEV_FR_QUEUE_FULL,      /* the receiver's queue for the link holds its most bytes already
                             * (dev_net; never from the decoders) */
    DEV_FR_NREASONS
};
const char *dev_frame_reason_name(int reason);

/* X25519 key pair for links. */
typedef struct dev_kx_keypair {
    uint8_t pk[32];
    uint8_t sk[32];
} dev_kx_keypair;
/* A fresh key pair from the system CSPRNG (libsodium). Use a fresh pair per
 * plan epoch: see dev_link_cfg. */
int dev_kx_keypair_generate(dev_kx_keypair *kp, sl_err *err);
/* Deterministic key pair from a 32-byte seed (tests, benchmarks). */
int dev_kx_keypair_from_seed(dev_kx_keypair *kp, const uint8_t seed[32], sl_err *err);

/* One direction of data flow between two stages. Both ends pass the same
 * values: from_stage is the sending stage, to_stage the receiving one.
 * The keys are bound to (both public keys in sender, receiver order, job_id,
 * epoch, from_stage, to_stage); every frame carries the epoch, which is also
 * in its nonce, and a receiver refuses frames of another epoch. Sequence
 * numbers start at 0 for every new dev_link_tx, so a (key pair, job_id,
 * epoch, stages) combination must never be set up twice on the sending side:
 * bump epoch on every re-plan/restart or use fresh key pairs. */
typedef struct dev_link_cfg {
    uint64_t job_id;
    uint32_t epoch;
    uint16_t from_stage, to_stage;
    int sealed;           /* 1: XChaCha20-Poly1305; 0: plaintext frames */
    uint32_t max_payload; /* receive limit on payload_len; 0 = default */
} dev_link_cfg;

typedef struct dev_link_tx {
    dev_link_cfg cfg;
    uint8_t key[32];      /* AEAD key, sender -> receiver */
    uint8_t hdr_key[32];  /* header tag key */
    dev_aead aead;        /* sealed links: the cipher context, made once */
    uint64_t next_seq;
    uint64_t frames, bytes; /* sent */
} dev_link_tx;

typedef struct dev_link_rx {
    dev_link_cfg cfg;
    uint8_t key[32];
    uint8_t hdr_key[32];
    dev_aead aead;                       /* sealed links: the cipher context, made once */
    int have_top;                        /* a frame has been accepted */
    uint64_t top;                        /* newest accepted seq */
    uint64_t window[DEV_WINDOW_WORDS];   /* ring bitmap of accepted seqs */
    uint8_t *scratch;                    /* opened payload */
    size_t scratch_cap;
    uint64_t frames, bytes;              /* accepted */
    uint64_t refused[DEV_FR_NREASONS];   /* refusals per reason */
    int last;                            /* reason of the last decode (DEV_FR_OK on success) */
} dev_link_rx;

/* self: this end's key pair; peer_pk: the other end's public key. With
 * cfg->sealed == 0 both may be NULL. */
int dev_link_tx_init(dev_link_tx *tx, const dev_link_cfg *cfg, const dev_kx_keypair *self,
                     const uint8_t peer_pk[32], sl_err *err);
int dev_link_rx_init(dev_link_rx *rx, const dev_link_cfg *cfg, const dev_kx_keypair *self,
                     const uint8_t peer_pk[32], sl_err *err);
/* Wipes keys, frees the cipher context and scratch; the object may be
 * initialised again. A failed init leaves nothing to free. */
void dev_link_tx_free(dev_link_tx *tx);
void dev_link_rx_free(dev_link_rx *rx);

/* 1 if all fields are equal (field by field: the struct has padding). */
int dev_frame_hdr_equal(const dev_frame_hdr *a, const dev_frame_hdr *b);
/* Elements of the tensor a header describes (product of dims). */
size_t dev_frame_elems(const dev_frame_hdr *h);
/* Upper bound on the wire size of a frame for h's dtype, codec, shape and k,
 * sealed or not (assumes sealed); 0 if h is invalid. dtype 0 counts as f32,
 * the dtype dev_frame_encode sets. */
size_t dev_frame_max_len(const dev_frame_hdr *h);

/* Encodes data (dev_frame_elems(h) floats, row-major) into out[0..cap) as an
 * f32 frame. The caller sets h->direction, codec, step, microbatch, ndim, dims,
 * aux where the direction has one and, for topk, k; the rest (version, flags,
 * dtype, epoch, job_id, stages, seq, payload_len) is filled in here, so h
 * afterwards is the header as sent. ef: topk error feedback for this stream
 * (NULL for none; ignored by other codecs). */
int dev_frame_encode(dev_link_tx *tx, dev_frame_hdr *h, const float *data, dev_topk_ef *ef,
                     uint8_t *out, size_t cap, size_t *outlen, sl_err *err);
/* The same for any dtype: the caller also sets h->dtype, and data holds
 * dev_frame_elems(h) elements of it (aligned for it). */
int dev_frame_encode_any(dev_link_tx *tx, dev_frame_hdr *h, const void *data, dev_topk_ef *ef,
                         uint8_t *out, size_t cap, size_t *outlen, sl_err *err);

/* Checks and parses the header of a received frame: everything that does not
 * need the link (magic, version, fields, what the direction allows, shape,
 * payload_len against dtype, codec and shape and against max_payload
 * (0 = default), the bytes present). Reason in *reason (may be NULL). Does
 * not authenticate: use it to size buffers. */
int dev_frame_parse_header(const uint8_t *in, size_t len, uint32_t max_payload, dev_frame_hdr *h,
                           int *reason, sl_err *err);

/* Checks, authenticates, opens and decodes a received f32 frame into data
 * (capacity cap floats); a frame of another dtype is refused as a bad
 * header. On refusal returns -1 with rx->last set, its counter incremented
 * and a message in err; data may have been written. A refusal for capacity
 * does not consume the frame. */
int dev_frame_decode(dev_link_rx *rx, const uint8_t *in, size_t len, dev_frame_hdr *h, float *data,
                     size_t cap, sl_err *err);
/* The same for any dtype: writes dev_frame_elems(h) elements of h->dtype
 * into data (capacity cap_bytes, aligned for the dtype). */
int dev_frame_decode_any(dev_link_rx *rx, const uint8_t *in, size_t len, dev_frame_hdr *h,
                         void *data, size_t cap_bytes, sl_err *err);

#endif
