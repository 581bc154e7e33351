#!/usr/bin/python3
"""PyTorch references for tests/test_kn_ops_bf16.c (run by the test).

Usage: kn_ref_bf16.py DIR. DIR holds dims.txt and raw float32 / int32 /
bfloat16 (uint16) inputs; this writes two references per output as float32:
  NAME.emu  the op as kn_ops.h specifies it, in float64 from the same bf16
            operands, rounding to bf16 exactly where the op does (torch's
            .bfloat16() rounds to nearest even, as sl_f32_to_bf16 does);
  NAME.tch  what torch itself computes in bf16 on the same inputs: its ops
            on bfloat16 tensors, as torch.autocast runs them, gradients by
            autograd through them.
Dropout masks come from the test (the C side's Philox) as multipliers.
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

D = sys.argv[1]
dims = {}
with open(os.path.join(D, "dims.txt")) as f:
    for line in f:
        k, v = line.split()
        dims[k] = int(v)
B, T, C, NH, Fh, N = (dims[k] for k in ("B", "T", "C", "NH", "F", "N"))
hs = C // NH


def f32(name, *shape):
    return torch.from_numpy(np.fromfile(os.path.join(D, name), dtype="<f4").copy()).reshape(*shape)


def bf(name, *shape):
    """uint16 bf16 bits -> float32 tensor (exact)"""
    u = np.fromfile(os.path.join(D, name), dtype="<u2").astype(np.uint32) << 16
    return torch.from_numpy(u.view(np.float32).copy()).reshape(*shape)


def i32(name, *shape):
    return torch.from_numpy(np.fromfile(os.path.join(D, name), dtype="<i4").astype(np.int64)).reshape(*shape)


def put(name, t):
    t.detach().float().cpu().numpy().astype("<f4").tofile(os.path.join(D, name))


def r16(t):
    """round to bf16 (nearest even), back in float64"""
    return t.float().bfloat16().double()


# ---- rounding: float32 -> bf16 bits, for the bitwise check of kn_to_bf16
x = f32("cv.x", N * C)
put("cv.out.tch", x.bfloat16().float())

# ---- linear: out = x16 w16^T + b (fp32 out), and rounded once (bf16 out);
# backward: dout rounded, dx = dout16 w16, dw = dout16^T x16, db = sum dout
x16, w16 = bf("mm.x16", N, C), bf("mm.w16", Fh, C)
b, dout = f32("mm.b", Fh), f32("mm.dout", N, Fh)
acc = x16.double() @ w16.double().T + b.double()
put("mm.out.emu", acc)
put("mm.out16.emu", r16(acc))
d16 = r16(dout)
put("mm.dx.emu", d16 @ w16.double())
put("mm.dw.emu", d16.T @ x16.double())
put("mm.db.emu", dout.double().sum(0))
xl = x16.bfloat16().requires_grad_(True)
wl = w16.bfloat16().requires_grad_(True)
bl = b.bfloat16().requires_grad_(True)
o = F.linear(xl, wl, bl)
o.backward(dout.bfloat16())
put("mm.out.tch", o)
put("mm.dx.tch", xl.grad), put("mm.dw.tch", wl.grad), put("mm.db.tch", bl.grad)

# ---- attention on bf16 qkv, without and with dropout
valid = i32("att.valid", B, T)
for tag in ("att0", "att1"):
    qkv = bf("att.qkv16", B, T, 3 * C)
    mask = f32(tag + ".mask", B, NH, T, T).double()
    dO16 = bf("att.dout16", B, T, C).double()
    # emulation: fp64 scores and softmax, P rounded, P*mult rounded, fp64 products
    q, k, v = (z.reshape(B, T, NH, hs).transpose(1, 2).double() for z in qkv.split(C, dim=2))
    s = (q @ k.transpose(-2, -1)) / (hs ** 0.5)
    s = s.masked_fill(valid[:, None, None, :] == 0, float("-inf"))
    p = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)
    a16 = r16(p)
    pd16 = r16(a16 * mask)
    out = pd16 @ v
    put(tag + ".att.emu", a16)
    put(tag + ".out.emu", r16(out.transpose(1, 2).reshape(B, T, C)))
    dOh = dO16.reshape(B, T, NH, hs).transpose(1, 2)
    dv = pd16.transpose(-2, -1) @ dOh
    dp = (dOh @ v.transpose(-2, -1)) * mask
    ds = r16(a16 * (dp - (a16 * dp).sum(-1, keepdim=True)) / (hs ** 0.5))
    dq, dk = ds @ k, ds.transpose(-2, -1) @ q
    dqkv = torch.cat([z.transpose(1, 2).reshape(B, T, C) for z in (dq, dk, dv)], dim=2)
    put(tag + ".dqkv.emu", dqkv)
    # torch in bf16, as autocast runs BERT's attention
    ql = qkv.bfloat16().requires_grad_(True)
    q, k, v = (z.reshape(B, T, NH, hs).transpose(1, 2) for z in ql.split(C, dim=2))
    s = (q @ k.transpose(-2, -1)) / (hs ** 0.5)
    s = s.masked_fill(valid[:, None, None, :] == 0, float("-inf"))
    p = torch.softmax(s, dim=-1)
    out = ((p * mask.bfloat16()) @ v).transpose(1, 2).reshape(B, T, C)
    out.backward(dO16.bfloat16())
    put(tag + ".att.tch", p), put(tag + ".out.tch", out), put(tag + ".dqkv.tch", ql.grad)

# ---- GELU on bf16 input: forward rounded, backward fp32
h16 = bf("ge.x16", N, Fh)
dout = f32("ge.dout", N, Fh)
for kind, approx in (("erf", "none"), ("tanh", "tanh")):
    xd = h16.double().requires_grad_(True)
    g = F.gelu(xd, approximate=approx)
    g.backward(dout.double())
    put("ge.out_%s.emu" % kind, r16(g)), put("ge.dx_%s.emu" % kind, xd.grad)
    xl = h16.bfloat16().requires_grad_(True)
    g = F.gelu(xl, approximate=approx)
    g.backward(dout.bfloat16())
    put("ge.out_%s.tch" % kind, g), put("ge.dx_%s.tch" % kind, xl.grad)
