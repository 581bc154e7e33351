#!/usr/bin/python3
"""PyTorch reference BERT (MLM, or sequence classification) for tests/test_model.c;
nothing it writes is committed.

Usage: bert_ref.py DIR. DIR holds dims.txt ("name value" lines; "task 1" and
"K" for BertForSequenceClassification with K classes), the model our C code
exported (model.safetensors, Hugging Face names) and the batch as raw
little-endian int32 (tokens, segments, valid, labels; labels -100 = not
masked; to classify, a sequence's class at its position 0). A minimal BERT
with HF parameter names is built here in float64 (transformers is not
installed), dropout 0. Writes:
  loss.txt                 mean MLM loss over the masked tokens (or mean
                           cross-entropy over the labelled sequences)
  logits.f64               the (M, V) logits at the masked positions, in position
                           order, or the (B, K) logits of every sequence (raw
                           little-endian float64)
  grads.safetensors        the gradient of every parameter, HF names (the word
                           embeddings' gradient includes the tied decoder's)
  torch_model.safetensors  a model initialised by torch (float32), as a torch
                           user would save it: decoder.weight and pooler included
  torch_loss.txt           that model's loss on the same batch
safetensors is read and written by hand (the python package is not in Debian 12).
"""
import json
import math
import os
import sys

import numpy as np
import torch

D = sys.argv[1]
dims = {}
with open(os.path.join(D, "dims.txt")) as f:
    for line in f:
        k, v = line.split()
        dims[k] = float(v) if ("." in v or "e" in v) else int(v)
C, L, NH, FF, V = dims["C"], dims["L"], dims["NH"], dims["F"], dims["V"]
TASK, K = dims.get("task", 0), dims.get("K", 0)
P, TV, B, T, EPS, GELU = dims["P"], dims["TV"], dims["B"], dims["T"], dims["eps"], dims["gelu"]


def st_read(path):
    with open(path, "rb") as f:
        b = f.read()
    n = int.from_bytes(b[:8], "little")
    h = json.loads(b[8:8 + n])
    data = b[8 + n:]
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", k
        s, e = v["data_offsets"]
        out[k] = np.frombuffer(data[s:e], dtype="<f4").reshape(v["shape"])
    return out


def st_write(path, tensors):
    header, off, blobs = {}, 0, []
    for k, a in tensors.items():
        a = np.ascontiguousarray(a, dtype="<f4")
        header[k] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
        blobs.append(a.tobytes())
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for blob in blobs:
            f.write(blob)


def i32(name):
    a = np.fromfile(os.path.join(D, name), dtype="<i4").astype(np.int64)
    return torch.tensor(a).reshape(B, T)


tok, seg, valid, labels = i32("tokens"), i32("segments"), i32("valid"), i32("labels")


def gelu(x):
    if GELU == 1:
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def ln(x, w, b):
    return torch.nn.functional.layer_norm(x, (C,), w, b, EPS)


def lin(x, p, name):
    return x @ p[name + ".weight"].T + p[name + ".bias"]


def bert_loss(p):
    """The loss of BERT with parameters p (HF names -> float64 tensors) and its
    logits: MLM at the masked positions, or classification of every sequence."""
    x = encode(p)
    return classify(p, x) if TASK == 1 else mlm(p, x)


def classify(p, x):
    """BertForSequenceClassification: pooler on [CLS], classifier, mean
    cross-entropy over the labelled sequences (dropout 0)."""
    pooled = torch.tanh(lin(x[:, 0], p, "bert.pooler.dense"))
    logits = lin(pooled, p, "classifier")
    return torch.nn.functional.cross_entropy(logits, labels[:, 0], ignore_index=-100), logits


def encode(p):
    """The encoder's last hidden states (B, T, C)."""
    e = "bert.embeddings."
    x = p[e + "word_embeddings.weight"][tok] + p[e + "position_embeddings.weight"][:T][None] \
        + p[e + "token_type_embeddings.weight"][seg]
    x = ln(x, p[e + "LayerNorm.weight"], p[e + "LayerNorm.bias"])
    hs = C // NH
    keymask = (valid == 0)[:, None, None, :]  # (B,1,1,T): padding keys
    for l in range(L):
        n = "bert.encoder.layer.%d." % l

        def heads(t):
            return t.view(B, T, NH, hs).transpose(1, 2)
        q = heads(lin(x, p, n + "attention.self.query"))
        k = heads(lin(x, p, n + "attention.self.key"))
        v = heads(lin(x, p, n + "attention.self.value"))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
        s = s.masked_fill(keymask, float("-inf"))
        a = torch.softmax(s, dim=-1) @ v
        a = a.transpose(1, 2).reshape(B, T, C)
        x = ln(x + lin(a, p, n + "attention.output.dense"),
               p[n + "attention.output.LayerNorm.weight"], p[n + "attention.output.LayerNorm.bias"])
        h = gelu(lin(x, p, n + "intermediate.dense"))
        x = ln(x + lin(h, p, n + "output.dense"),
               p[n + "output.LayerNorm.weight"], p[n + "output.LayerNorm.bias"])
    return x


def mlm(p, x):
    """The MLM head at the masked positions: loss and logits."""
    e = "bert.embeddings."
    m = labels.reshape(-1) != -100
    xm = x.reshape(B * T, C)[m]  # the decoder only at masked positions
    c = "cls.predictions."
    t = ln(gelu(lin(xm, p, c + "transform.dense")),
           p[c + "transform.LayerNorm.weight"], p[c + "transform.LayerNorm.bias"])
    logits = t @ p[e + "word_embeddings.weight"].T + p[c + "bias"]
    return torch.nn.functional.cross_entropy(logits, labels.reshape(-1)[m]), logits


# 1. Our exported weights: loss and every gradient.
ours = st_read(os.path.join(D, "model.safetensors"))
p = {k: torch.tensor(v.astype(np.float64), requires_grad=True) for k, v in ours.items()}
loss, logits = bert_loss(p)
loss.backward()
logits.detach().numpy().astype("<f8").tofile(os.path.join(D, "logits.f64"))
with open(os.path.join(D, "loss.txt"), "w") as f:
    f.write("%.17g\n" % loss.item())
st_write(os.path.join(D, "grads.safetensors"), {k: t.grad.numpy() for k, t in p.items()})

# 2. A model made by torch, saved as a torch user would (tied decoder written out,
#    pooler included), and its loss: our loader must give the same.
torch.manual_seed(1234)
tw = {}
for k, v in ours.items():
    if k.endswith("LayerNorm.weight"):
        tw[k] = 1 + 0.1 * torch.randn(v.shape)
    elif v.ndim == 1:
        tw[k] = 0.05 * torch.randn(v.shape)
    else:
        tw[k] = 0.05 * torch.randn(v.shape)
tw = {k: t.float() for k, t in tw.items()}
saved = dict(tw)
if TASK == 0:
    saved["cls.predictions.decoder.weight"] = tw["bert.embeddings.word_embeddings.weight"]
    saved["bert.pooler.dense.weight"] = torch.zeros(C, C)
    saved["bert.pooler.dense.bias"] = torch.zeros(C)
st_write(os.path.join(D, "torch_model.safetensors"), {k: t.numpy() for k, t in saved.items()})
with torch.no_grad():
    tl, _ = bert_loss({k: t.double() for k, t in tw.items()})
with open(os.path.join(D, "torch_loss.txt"), "w") as f:
    f.write("%.17g\n" % tl.item())
