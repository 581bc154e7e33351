#!/usr/bin/python3
"""PyTorch reference for tests/test_kn_ops.c (run by the test, never committed output).

Usage: kn_ref.py DIR. DIR holds dims.txt ("name value" lines) and raw
little-endian float32 / int32 inputs written by the test; this writes the
reference outputs next to them as float32 ("*.ref"). Everything is computed
in float64 from the float32 inputs, so the comparison measures the C
kernels' own rounding. Dropout masks come from the test (the C side's
Philox RNG) as float multipliers 0 or 1/(1-p).
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

D = sys.argv[1]
torch.set_grad_enabled(True)
dims = {}
with open(os.path.join(D, "dims.txt")) as f:
    for line in f:
        k, v = line.split()
        dims[k] = float(v) if "." in v or "e" in v else int(v)


def f32(name, *shape):
    a = np.fromfile(os.path.join(D, name), dtype="<f4")
    return torch.tensor(a.astype(np.float64)).reshape(*shape)


def i32(name, *shape):
    a = np.fromfile(os.path.join(D, name), dtype="<i4")
    return torch.tensor(a.astype(np.int64)).reshape(*shape)


def put(name, t):
    t.detach().cpu().numpy().astype("<f4").tofile(os.path.join(D, name + ".ref"))


def leaf(t):
    return t.clone().requires_grad_(True)


B, T, C, NH, Fh, V, M, TP = (dims[k] for k in ("B", "T", "C", "NH", "F", "V", "M", "TP"))
N = B * T
eps = dims["eps"]

# embeddings
tok, seg = i32("emb.tok", B, T), i32("emb.seg", B, T)
wte, wpe, wse = leaf(f32("emb.wte", V, C)), leaf(f32("emb.wpe", TP, C)), leaf(f32("emb.wse", 2, C))
out = wte[tok] + wpe[torch.arange(T)][None] + wse[seg]
out.backward(f32("emb.dout", B, T, C))
put("emb.out", out), put("emb.dwte", wte.grad), put("emb.dwpe", wpe.grad), put("emb.dwse", wse.grad)

# layernorm
x, w, b = leaf(f32("ln.x", N, C)), leaf(f32("ln.w", C)), leaf(f32("ln.b", C))
out = F.layer_norm(x, (C,), w, b, eps)
out.backward(f32("ln.dout", N, C))
put("ln.out", out), put("ln.dx", x.grad), put("ln.dw", w.grad), put("ln.db", b.grad)
xd = x.detach()
put("ln.mean", xd.mean(-1)), put("ln.rstd", 1.0 / torch.sqrt(xd.var(-1, unbiased=False) + eps))

# linear (nn.Linear layout), with and without bias
x, w, b = leaf(f32("mm.x", N, C)), leaf(f32("mm.w", Fh, C)), leaf(f32("mm.b", Fh))
out = F.linear(x, w, b)
out.backward(f32("mm.dout", N, Fh))
put("mm.out", out), put("mm.dx", x.grad), put("mm.dw", w.grad), put("mm.db", b.grad)
put("mm.out_nb", F.linear(x.detach(), w.detach()))

# attention, without and with dropout on the probabilities
hs = C // NH
for tag in ("att0", "att1"):
    qkv = leaf(f32(tag + ".qkv", B, T, 3 * C))
    valid = i32(tag + ".valid", B, T)
    q, k, v = qkv.split(C, dim=2)
    q, k, v = (z.reshape(B, T, NH, hs).transpose(1, 2) for z in (q, k, v))
    s = (q @ k.transpose(-2, -1)) / (hs ** 0.5)
    s = s.masked_fill(valid[:, None, None, :] == 0, float("-inf"))
    p = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)
    pd = p * f32(tag + ".mask", B, NH, T, T)
    out = (pd @ v).transpose(1, 2).reshape(B, T, C)
    out.backward(f32(tag + ".dout", B, T, C))
    put(tag + ".out", out), put(tag + ".att", p), put(tag + ".dqkv", qkv.grad)

# gelu, both forms
x = f32("ge.x", N, Fh)
dout = f32("ge.dout", N, Fh)
for kind, approx in (("erf", "none"), ("tanh", "tanh")):
    xl = leaf(x)
    out = F.gelu(xl, approximate=approx)
    out.backward(dout)
    put("ge.out_" + kind, out), put("ge.dx_" + kind, xl.grad)
xl = leaf(x)  # tanh (the classification head's pooler), same inputs
out = torch.tanh(xl)
out.backward(dout)
put("th.out", out), put("th.dx", xl.grad)

# residual
a, b = leaf(f32("res.a", N, C)), leaf(f32("res.b", N, C))
out = a + b
out.backward(f32("res.dout", N, C))
put("res.out", out), put("res.da", a.grad), put("res.db", b.grad)

# hidden dropout with the C side's mask
x = leaf(f32("do.x", B, T * C))
out = x * f32("do.mask", B, T * C)
out.backward(f32("do.dout", B, T * C))
put("do.out", out), put("do.dx", x.grad)

# cross-entropy over masked positions (ignore index -100), gradient scale
logits = leaf(f32("xe.logits", M, V))
tgt = i32("xe.tgt", M)
loss = F.cross_entropy(logits, tgt, reduction="none", ignore_index=-100)
(loss.sum() * dims["xe_scale"]).backward()
put("xe.loss", loss), put("xe.probs", torch.softmax(logits.detach(), -1)), put("xe.dlogits", logits.grad)

# AdamW: torch.optim.AdamW, several steps
n, steps = dims["opt_n"], dims["opt_steps"]
lr, b1, b2, oeps, wd = (dims[k] for k in ("opt_lr", "opt_b1", "opt_b2", "opt_eps", "opt_wd"))
p0 = f32("opt.p", n)
g = f32("opt.g", steps, n)
p = p0.clone().requires_grad_(True)
opt = torch.optim.AdamW([p], lr=lr, betas=(b1, b2), eps=oeps, weight_decay=wd)
for s in range(steps):
    p.grad = g[s].clone()
    opt.step()
st = opt.state[p]
put("adam.dp", p.detach() - p0), put("adam.m", st["exp_avg"]), put("adam.v", st["exp_avg_sq"])

# LAMB (You et al. 2019, Algorithm 2) written out, bias-corrected moments,
# per-tensor trust ratio ||p|| / ||u|| (1 if either is 0).
p, m, v = p0.clone(), torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
for s in range(steps):
    t = s + 1
    m = b1 * m + (1 - b1) * g[s]
    v = b2 * v + (1 - b2) * g[s] * g[s]
    u = (m / (1 - b1 ** t)) / (torch.sqrt(v / (1 - b2 ** t)) + oeps) + wd * p
    pn, un = p.norm(), u.norm()
    r = pn / un if pn > 0 and un > 0 else torch.tensor(1.0, dtype=torch.float64)
    p = p - lr * r * u
put("lamb.dp", p - p0), put("lamb.m", m), put("lamb.v", v)
