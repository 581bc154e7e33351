#!/usr/bin/python3
"""PyTorch side of bench/run.sh: one full training step (forward, backward,
clip_grad_norm_, AdamW) of BERT MLM, the same configs and batch as
bench_train.c, torch's best settings here: run with
LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp (see
/work/shared/notes/pytorch-reference.md), the MLM decoder computed only at the
masked positions. Prints one JSON line.
With precision bf16 the forward runs under torch.autocast("cpu", bfloat16)
(products in bf16 through oneDNN, master weights and optimizer in fp32);
under 1.13's autocast the head's LayerNorm gets its input cast back to fp32
(its weights are fp32 and it has no bf16 rule there).
Usage: torch_bert.py a|b|c [steps] [threads] [fp32|bf16]"""
import json
import math
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

which = sys.argv[1] if len(sys.argv) > 1 else "a"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
precision = sys.argv[4] if len(sys.argv) > 4 else "fp32"
if precision not in ("fp32", "bf16"):
    sys.exit("precision must be fp32 or bf16")
torch.set_num_threads(threads)
L, C, NH, FF, V = {"a": (2, 128, 2, 512, 8192), "b": (4, 256, 4, 1024, 8192),
                   "c": (12, 768, 12, 3072, 30522)}[which]
B, T, P = 8, 128, 512


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(C, 3 * C)
        self.o = nn.Linear(C, C)
        self.ln1 = nn.LayerNorm(C, eps=1e-12)
        self.fc = nn.Linear(C, FF)
        self.fo = nn.Linear(FF, C)
        self.ln2 = nn.LayerNorm(C, eps=1e-12)
        self.drop = nn.Dropout(0.1)

    def forward(self, x, mask):
        q, k, v = self.qkv(x).view(B, T, 3, NH, C // NH).permute(2, 0, 3, 1, 4)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(C // NH) + mask
        a = (self.drop(torch.softmax(s, -1)) @ v).transpose(1, 2).reshape(B, T, C)
        x = self.ln1(x + self.drop(self.o(a)))
        return self.ln2(x + self.drop(self.fo(F.gelu(self.fc(x)))))


class Bert(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe, self.wse = nn.Embedding(V, C), nn.Embedding(P, C), nn.Embedding(2, C)
        self.ln = nn.LayerNorm(C, eps=1e-12)
        self.drop = nn.Dropout(0.1)
        self.layers = nn.ModuleList([Layer() for _ in range(L)])
        self.dense = nn.Linear(C, C)
        self.hln = nn.LayerNorm(C, eps=1e-12)
        self.bias = nn.Parameter(torch.zeros(V))

    def forward(self, tok, seg, mask, sel, target):
        x = self.drop(self.ln(self.wte(tok) + self.wpe.weight[:T][None] + self.wse(seg)))
        for layer in self.layers:
            x = layer(x, mask)
        x = x.reshape(B * T, C)[sel]  # the decoder only at masked positions
        x = self.hln(F.gelu(self.dense(x)).float())
        return F.cross_entropy(x @ self.wte.weight.T + self.bias, target)


torch.manual_seed(0)
model = Bert()
with torch.no_grad():  # BERT's initialisation (the timing does not depend on it)
    for n, p in model.named_parameters():
        if p.dim() == 2:
            p.normal_(0, 0.02)
no_decay = [p for n, p in model.named_parameters() if "ln" in n or n.endswith("bias")]
decay = [p for n, p in model.named_parameters() if not ("ln" in n or n.endswith("bias"))]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                         {"params": no_decay, "weight_decay": 0.0}], lr=1e-4, eps=1e-6)
i = torch.arange(B * T)
tok = (5 + (i * 2654435761) % (V - 5)).view(B, T)
seg = torch.zeros(B, T, dtype=torch.long)
mask = torch.zeros(B, 1, 1, T)
r = i % 20
sel = (r == 0) | (r == 7) | (r == 13)
target = (5 + (i * 40503) % (V - 5))[sel]
times = []
for s in range(steps + 1):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss = model(tok, seg, mask, sel, target)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if s > 0:
        times.append(time.perf_counter() - t0)
times.sort()
step = times[len(times) // 2] if len(times) % 2 else 0.5 * (times[len(times) // 2 - 1] + times[len(times) // 2])
print(json.dumps({"impl": "torch", "config": which, "torch": torch.__version__,
                  "params": sum(p.numel() for p in model.parameters()), "step_s": round(step, 4),
                  "tokens_per_s": round(B * T / step, 1),
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                  "loss": round(loss.item(), 4), "steps": steps, "threads": threads,
                  "precision": precision}))
