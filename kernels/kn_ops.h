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
 * ratio ||p|| / ||update|| (1 when either norm is 0). */
void kn_adamw_update(float *p, const float *g, float *m, float *v, size_t n, float lr,
                     float beta1, float beta2, float eps, float wd, int t);
void kn_lamb_update(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                    float beta2, float eps, float wd, int t);
/* AdamW with m and v stored as bf16 (half the optimizer memory), stochastic
 * rounding keyed by (seed, stream, element index): give every tensor its
 * own stream and every step its own seed. The step itself is computed in
 * fp32 as kn_adamw_update does. */
void kn_adamw_update_bf16(float *p, const float *g, uint16_t *m, uint16_t *v, size_t n, float lr,
                          float beta1, float beta2, float eps, float wd, int t, uint64_t seed,
                          uint64_t stream);
/* Sum of squares (double accumulation) for global-norm clipping. */
double kn_sumsq(const float *x, size_t n);
void kn_scale(float *x, size_t n, float s);

#endif
