#!/usr/bin/python3
"""PyTorch reference of DiLoCo's outer step for tests/test_fed.c; nothing it
writes is committed.

Usage: diloco_ref.py DIR. DIR/outer.in (little-endian): int32 n, R, rounds;
float64 weights[R], lr, momentum; float32 theta_outer[n] at the start; then
for each round, each replica's parameters before that outer step
(float32[R][n]). Per round, as DiLoCo does: the pseudo-gradient
sum_r w_r (theta_outer - theta_r) is set as the outer parameters' .grad and
torch.optim.SGD(lr, momentum, nesterov=True) steps. Writes DIR/outer.out:
float32 theta_outer[n] after every round, one after another.
"""
import os
import struct
import sys

import numpy as np
import torch

D = sys.argv[1]
raw = open(os.path.join(D, "outer.in"), "rb").read()
n, R, rounds = struct.unpack_from("<3i", raw, 0)
off = 12
w = np.frombuffer(raw, "<f8", R, off); off += 8 * R
lr, mu = struct.unpack_from("<2d", raw, off); off += 16
theta = torch.tensor(np.frombuffer(raw, "<f4", n, off).copy()); off += 4 * n
p = torch.nn.Parameter(theta.clone())
opt = torch.optim.SGD([p], lr=lr, momentum=mu, nesterov=True)
out = []
for k in range(rounds):
    reps = [torch.tensor(np.frombuffer(raw, "<f4", n, off + 4 * n * r).copy()) for r in range(R)]
    off += 4 * n * R
    g = torch.zeros(n, dtype=torch.float64)
    for r in range(R):
        g += float(w[r]) * (p.detach().double() - reps[r].double())
    p.grad = g.float()
    opt.step()
    out.append(p.detach().numpy().astype("<f4").tobytes())
open(os.path.join(D, "outer.out"), "wb").write(b"".join(out))
