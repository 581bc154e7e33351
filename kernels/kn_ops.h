/* kn_ops.h - the tensor operations of BERT, forward and backward (fp32).
 *
 * Style follows llm.c: one function per op and direction, shapes in the
 * comment above, row-major contiguous tensors, no allocation inside an op.
 * Conventions:
 *   B batch (sequences in this micro-batch), T sequence length, C hidden size,
 *   NH heads, hs = C/NH head size, F intermediate size, V vocabulary size.
 *   Linear weights use torch's nn.Linear layout: w is (OC, IC), out = inp @ w^T + b.
 *   Every *backward ACCUMULATES (+=) into all its gradient outputs, parameter
 *   and input gradients alike (callers zero them once per flush/micro-batch),
 *   so residual branches and micro-batch accumulation need no extra code.
 *   (The exception: kn_crossentropy_backward, where the chain starts, writes.)
 *   A NULL bias or bias-gradient pointer means "no bias".
 * Dropout masks are never stored: they are recomputed from the counter-based
 * RNG (sl_rng.h) in backward, keyed so that element e of sequence s draws
 * index (seq0 + s) * per_seq + e — independent of micro-batch splitting.
 *
 * This header is the contract between kernels/, device/ and the CUDA port;
 * change it only together with its callers. */
#ifndef KN_OPS_H
#define KN_OPS_H

#include <stddef.h>
#include <stdint.h>

typedef struct kn_dropout {
    float p;          /* drop probability; 0 disables (then the op is the identity) */
    uint64_t seed;    /* run seed mixed with the step: sl_rng_stream(seed, step) */
    uint64_t stream;  /* which dropout site: sl_rng_stream(site, layer) */
    uint64_t seq0;    /* place in the batch of this micro-batch's first sequence */
} kn_dropout;

enum kn_gelu_kind { KN_GELU_ERF = 0, KN_GELU_TANH = 1 };

/* ---- embeddings -------------------------------------------------------
 * out (B,T,C) = wte[tok] + wpe[t] + wse[seg]; seg may be NULL (all 0). */
void kn_embed_forward(float *out, const int32_t *tok, const int32_t *seg, const float *wte,
                      const float *wpe, const float *wse, int B, int T, int C);
void kn_embed_backward(float *dwte, float *dwpe, float *dwse, const float *dout,
                       const int32_t *tok, const int32_t *seg, int B, int T, int C);

/* ---- layernorm --------------------------------------------------------
 * inp, out (N,C); w, b (C); mean, rstd (N) saved for backward. */
void kn_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                          const float *b, int N, int C, float eps);
void kn_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                           const float *w, const float *mean, const float *rstd, int N, int C);

/* ---- linear (CBLAS sgemm) ---------------------------------------------
 * inp (N,IC), w (OC,IC), b (OC) -> out (N,OC). */
void kn_matmul_forward(float *out, const float *inp, const float *w, const float *b, int N,
                       int IC, int OC);
void kn_matmul_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, int N, int IC, int OC);

/* ---- self-attention ---------------------------------------------------
 * qkv (B,T,3C): q, k, v concatenated per token (q = qkv[..., 0:C], ...).
 * valid (B,T): 1 for real tokens, 0 for padding (keys at padding get -inf).
 * att (B,NH,T,T): softmax probabilities BEFORE dropout, saved for backward.
 * out (B,T,C): heads concatenated. Scale 1/sqrt(hs). Attention-probability
 * dropout per kn_dropout with per_seq = NH*T*T. */
void kn_attention_forward(float *out, float *att, const float *qkv, const int32_t *valid,
                          int B, int T, int C, int NH, kn_dropout drop);
void kn_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                           int B, int T, int C, int NH, kn_dropout drop);

/* ---- elementwise ------------------------------------------------------ */
/* out = gelu(inp), N elements. */
void kn_gelu_forward(float *out, const float *inp, size_t N, int kind);
void kn_gelu_backward(float *dinp, const float *inp, const float *dout, size_t N, int kind);
/* out = tanh(inp), N elements (the pooler of a classification head). The
 * backward takes the forward's OUTPUT: dinp += dout * (1 - out^2). */
void kn_tanh_forward(float *out, const float *inp, size_t N);
void kn_tanh_backward(float *dinp, const float *out, const float *dout, size_t N);
/* out = a + b */
void kn_residual_forward(float *out, const float *a, const float *b, size_t N);
void kn_residual_backward(float *da, float *db, const float *dout, size_t N);
/* Hidden dropout on (B, per_seq) tensors: out = inp * mask / (1-p). In-place allowed. */
void kn_dropout_forward(float *out, const float *inp, int B, size_t per_seq, kn_dropout drop);
void kn_dropout_backward(float *dinp, const float *dout, int B, size_t per_seq, kn_dropout drop);

/* ---- rows -------------------------------------------------------------
 * gather: out (M,C) = x[idx[j]] for j < M (x has at least max(idx)+1 rows);
 * scatter: out[idx[j]] = x[j] (M,C); rows of out not in idx are untouched.
 * The MLM head runs only at the M masked positions of a micro-batch. */
void kn_gather_rows(float *out, const float *x, const int32_t *idx, int M, int C);
void kn_scatter_rows(float *out, const float *x, const int32_t *idx, int M, int C);

/* ---- MLM loss ---------------------------------------------------------
 * logits (M,V) for the M masked positions; targets (M).
 * losses (M) = -log softmax(logits)[target]; probs (M,V) saved; probs may
 * be logits itself (in place).
 * Backward: dlogits = (probs - onehot(target)) * scale, where scale is
 * 1 / (masked positions in the WHOLE batch), so that accumulating
 * micro-batches gives exactly the gradient of the batch's mean loss. Unlike
 * every other backward it WRITES dlogits (the loss starts the chain), so
 * dlogits may be probs itself; rows whose target is out of range get 0. */
void kn_crossentropy_forward(float *losses, float *probs, const float *logits,
                             const int32_t *targets, int M, int V);
void kn_crossentropy_backward(float *dlogits, const float *probs, const int32_t *targets, int M,
                              int V, float scale);

/* ---- optimizers (one tensor at a time, so per-tensor rules apply) ------
 * t is the 1-based step. AdamW with decoupled weight decay (torch.optim.AdamW).
 * LAMB (You et al. 2019): adam direction + wd*p, scaled per tensor by the trust
 * ratio ||p|| / ||update|| (1 when either norm is 0). AdamW scales g by
 * gscale first (written back when not 1) and, with w16, writes the updated
 * parameters' bf16 copy in the same pass. */
void kn_adamw_update(float *p, float *g, float *m, float *v, size_t n, float lr, float beta1,
                     float beta2, float eps, float wd, int t, float gscale, uint16_t *w16);
void kn_lamb_update(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                    float beta2, float eps, float wd, int t);
/* AdamW with m and v stored as bf16 (half the optimizer memory), stochastic
 * rounding keyed by (seed, stream, element index): give every tensor its
 * own stream and every step its own seed. The step itself is computed in
 * fp32 as kn_adamw_update does. */
void kn_adamw_update_bf16(float *p, float *g, uint16_t *m, uint16_t *v, size_t n, float lr,
                          float beta1, float beta2, float eps, float wd, int t, uint64_t seed,
                          uint64_t stream, float gscale, uint16_t *w16);
/* ---- bf16 compute (mixed precision) -------------------------------------
 * uint16_t tensors (names ending in 16) hold bf16 values: the top half of an
 * fp32, rounded to nearest even (sl_float.h). Products take bf16 operands
 * and accumulate in fp32; everything else (LayerNorm, softmax, GELU, the
 * loss, gradients, the optimizer) stays in fp32. On the CPU the products
 * are oneDNN's and need AVX512_BF16 or AMX (kn_cpu_bf16_check); a failure
 * inside the product library is reported by the backend's sync. */
/* out16 = bf16(inp), n elements. */
void kn_to_bf16(uint16_t *out16, const float *inp, size_t n);
/* kn_layernorm_forward that also writes its output rounded to bf16 into
 * out16 (the products' copy: bit for bit kn_to_bf16 of out). */
void kn_layernorm_forward_bf16(float *out, uint16_t *out16, float *mean, float *rstd,
                               const float *inp, const float *w, const float *b, int N, int C,
                               float eps);
/* inp16 (N,IC), w16 (OC,IC), b (OC) fp32 -> inp16 @ w16^T + b (N,OC): into
 * out (fp32; out16 NULL) or, rounded once after the bias, into out16 (bf16;
 * out NULL). */
void kn_matmul_forward_bf16(float *out, uint16_t *out16, const uint16_t *inp16,
                            const uint16_t *w16, const float *b, int N, int IC, int OC);
/* With dout16 = bf16(dout) (rounded inside): dinp (N,IC) += dout16 @ w16;
 * dw (OC,IC) += dout16^T @ inp16; db (OC) += the column sums of dout (fp32).
 * Any of dinp, dw, db may be NULL. */
void kn_matmul_backward_bf16(float *dinp, float *dw, float *db, const float *dout,
                             const uint16_t *inp16, const uint16_t *w16, int N, int IC, int OC);
/* Attention on bf16 q, k, v (qkv16 (B,T,3C)): scores and softmax in fp32;
 * att16 (B,NH,T,T) keeps the probabilities rounded to bf16 (before
 * dropout); the product with v takes bf16(att16 * dropout multiplier);
 * out16 (B,T,C) bf16. */
void kn_attention_forward_bf16(uint16_t *out16, uint16_t *att16, const uint16_t *qkv16,
                               const int32_t *valid, int B, int T, int C, int NH,
                               kn_dropout drop);
/* dqkv (B,T,3C) fp32 += the gradient, given dout16 (B,T,C). */
void kn_attention_backward_bf16(float *dqkv, const uint16_t *dout16, const uint16_t *qkv16,
                                const uint16_t *att16, int B, int T, int C, int NH,
                                kn_dropout drop);
/* out16 = bf16(gelu(inp16)); dinp (fp32) += gelu'(inp16) * dout and, when
 * out16 is not NULL, out16 = bf16(gelu(inp16)) again (bit for bit the
 * forward's: a backward that needs the value recomputes it in the same
 * pass). */
void kn_gelu_forward_bf16(uint16_t *out16, const uint16_t *inp16, size_t N, int kind);
void kn_gelu_backward_bf16(float *dinp, uint16_t *out16, const uint16_t *inp16, const float *dout,
                           size_t N, int kind);

/* Sum of squares (double accumulation) for global-norm clipping. */
double kn_sumsq(const float *x, size_t n);
void kn_scale(float *x, size_t n, float s);

#endif
