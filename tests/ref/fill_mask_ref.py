#!/usr/bin/python3
"""Hugging Face's fill-mask pipeline in plain PyTorch, the reference for
tests/test_fill_mask.sh (transformers is not installed; python3-torch is).

  fill_mask_ref.py make DIR
      writes DIR/config.json, DIR/vocab.txt and DIR/model.safetensors: a small
      random BERT initialised by torch and saved as a torch user would (the tied
      decoder weight, its bias and the pooler included).
  fill_mask_ref.py check DIR TEXT TOPK cased|uncased OUT.json LOGITS.f32
      tokenizes TEXT as BertTokenizer does (special tokens written in the text
      are those tokens; the rest through BERT's BasicTokenizer and WordPiece,
      tests/bert_tokenization_ref.py), runs the model in float64 with dropout 0
      and compares with what `skyloom fill-mask --json --logits` wrote: the
      logits within 1e-4 of the largest (relative), the top-k ids (ties within
      1e-5 may swap), scores within 1e-5, token strings and filled sequences
      decoded as the pipeline decodes them. Exit 1 on any difference.
"""
import json
import math
import os
import re
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bert_tokenization_ref as tok  # noqa: E402

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ("the a cat dog sat ran on mat is of paris france capital city big small red "
         "house river king queen man woman café he she it was in to and s ' . , ! ? "
         "##s ##ed ##ing ##er ##ly ##a ##e ##t ##n ##r").split()


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
        for b in blobs:
            f.write(b)


def st_read(path):
    with open(path, "rb") as f:
        b = f.read()
    n = int.from_bytes(b[:8], "little")
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        out[k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype="<f4").reshape(v["shape"])
    return out


def make(d):
    vocab = SPECIAL + WORDS
    with open(os.path.join(d, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(vocab) + "\n")
    cfg = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 96, "vocab_size": len(vocab), "max_position_embeddings": 32,
           "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu",
           "model_type": "bert", "architectures": ["BertForMaskedLM"]}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    C, V, F, L = 64, len(vocab), 96, 2
    g = torch.Generator().manual_seed(17)

    def r(*shape, sd=0.2):
        return (sd * torch.randn(*shape, generator=g)).float()
    t = {}
    e = "bert.embeddings."
    t[e + "word_embeddings.weight"] = r(V, C, sd=0.6)  # spread logits: a clear top-k
    t[e + "position_embeddings.weight"] = r(32, C)
    t[e + "token_type_embeddings.weight"] = r(2, C)
    t[e + "LayerNorm.weight"] = 1 + r(C, sd=0.1)
    t[e + "LayerNorm.bias"] = r(C, sd=0.1)
    for layer in range(L):
        n = "bert.encoder.layer.%d." % layer
        for name, o, i in (("attention.self.query", C, C), ("attention.self.key", C, C),
                           ("attention.self.value", C, C), ("attention.output.dense", C, C),
                           ("intermediate.dense", F, C), ("output.dense", C, F)):
            t[n + name + ".weight"] = r(o, i)
            t[n + name + ".bias"] = r(o, sd=0.05)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[n + name + ".weight"] = 1 + r(C, sd=0.1)
            t[n + name + ".bias"] = r(C, sd=0.1)
    c = "cls.predictions."
    t[c + "transform.dense.weight"] = r(C, C)
    t[c + "transform.dense.bias"] = r(C, sd=0.05)
    t[c + "transform.LayerNorm.weight"] = 1 + r(C, sd=0.1)
    t[c + "transform.LayerNorm.bias"] = r(C, sd=0.1)
    t[c + "bias"] = r(V, sd=0.5)
    t[c + "decoder.weight"] = t[e + "word_embeddings.weight"]
    t[c + "decoder.bias"] = t[c + "bias"]
    t["bert.pooler.dense.weight"] = r(C, C)
    t["bert.pooler.dense.bias"] = r(C)
    st_write(os.path.join(d, "model.safetensors"), {k: v.numpy() for k, v in t.items()})


def encode(text, vocab, lower):
    """BertTokenizer: special tokens in the text are never split."""
    ids = [vocab["[CLS]"]]
    for part in re.split(r"(\[MASK\]|\[CLS\]|\[SEP\]|\[PAD\]|\[UNK\])", text):
        if part in SPECIAL:
            ids.append(vocab[part])
            continue
        for w in tok.basic_tokenize(part, lower):
            ids += tok.wordpiece(w, vocab)
    return ids + [vocab["[SEP]"]]


def logits_at_masks(d, ids, mask_id):
    cfg = json.load(open(os.path.join(d, "config.json")))
    C, L, NH = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
    p = {k: torch.tensor(v.astype(np.float64)) for k, v in st_read(os.path.join(d, "model.safetensors")).items()}
    T = len(ids)
    x0 = torch.tensor(ids)

    def ln(x, n):
        return torch.nn.functional.layer_norm(x, (C,), p[n + ".weight"], p[n + ".bias"], 1e-12)

    def lin(x, n):
        return x @ p[n + ".weight"].T + p[n + ".bias"]

    def gelu(x):
        return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    e = "bert.embeddings."
    x = p[e + "word_embeddings.weight"][x0] + p[e + "position_embeddings.weight"][:T] \
        + p[e + "token_type_embeddings.weight"][0]
    x = ln(x, e + "LayerNorm")
    hs = C // NH
    for layer in range(L):
        n = "bert.encoder.layer.%d." % layer

        def heads(t):
            return t.view(T, NH, hs).transpose(0, 1)
        q, k, v = (heads(lin(x, n + "attention.self." + w)) for w in ("query", "key", "value"))
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hs), dim=-1) @ v
        x = ln(x + lin(a.transpose(0, 1).reshape(T, C), n + "attention.output.dense"),
               n + "attention.output.LayerNorm")
        x = ln(x + lin(gelu(lin(x, n + "intermediate.dense")), n + "output.dense"),
               n + "output.LayerNorm")
    c = "cls.predictions."
    xm = x[x0 == mask_id]
    t = ln(gelu(lin(xm, c + "transform.dense")), c + "transform.LayerNorm")
    return t @ p[e + "word_embeddings.weight"].T + p[c + "bias"]


def decode(inv, ids):
    """convert_tokens_to_string, then clean_up_tokenization."""
    s = " ".join(inv[i] for i in ids).replace(" ##", "").strip()
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                 (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        s = s.replace(a, b)
    return s


def check(d, text, topk, mode, out_json, out_logits):
    vocab = tok.load_vocab(os.path.join(d, "vocab.txt"))
    inv = {i: t for t, i in vocab.items()}
    special_ids = {vocab[s] for s in SPECIAL}
    mask = vocab["[MASK]"]
    ids = encode(text, vocab, mode == "uncased")
    ref = logits_at_masks(d, ids, mask)
    M, V = ref.shape
    fail = []
    ours = np.fromfile(out_logits, dtype="<f4")
    if ours.size != M * V:
        print("FAIL logits: %d values, the reference has %d x %d" % (ours.size, M, V))
        return 1
    ours = torch.tensor(ours.astype(np.float64)).reshape(M, V)
    rel = ((ours - ref).abs().max() / ref.abs().max()).item()
    print("     logits (%d masks x %d): max error / max |logit| = %.3g" % (M, V, rel))
    if not rel <= 1e-4:
        fail.append("logits rel error %.3g > 1e-4" % rel)
    got = json.load(open(out_json))
    if M == 1:
        got = [got]
    probs = torch.softmax(ref, dim=-1)
    positions = [i for i, x in enumerate(ids) if x == mask]
    for j in range(M):
        order = sorted(range(V), key=lambda k: (-probs[j, k].item(), k))[:topk]
        if len(got[j]) != topk:
            fail.append("mask %d: %d candidates, want %d" % (j, len(got[j]), topk))
            continue
        for r, (g, k) in enumerate(zip(got[j], order)):
            if g["token"] != k and abs(probs[j, g["token"]].item() - probs[j, k].item()) > 1e-5:
                fail.append("mask %d rank %d: token %d, want %d" % (j, r, g["token"], k))
                continue
            k = g["token"]
            if abs(g["score"] - probs[j, k].item()) > 1e-5:
                fail.append("mask %d rank %d: score %.9f, want %.9f" % (j, r, g["score"], probs[j, k].item()))
            if g["token_str"] != decode(inv, [k]):
                fail.append("mask %d rank %d: token_str %r, want %r" % (j, r, g["token_str"], decode(inv, [k])))
            filled = list(ids)
            filled[positions[j]] = k
            keep = [x for x in filled if x != vocab["[PAD]"] and not (M == 1 and x in special_ids)]
            if g["sequence"] != decode(inv, keep):
                fail.append("mask %d rank %d: sequence %r, want %r" % (j, r, g["sequence"], decode(inv, keep)))
    for f in fail[:10]:
        print("FAIL " + f)
    return 1 if fail else 0


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        sys.exit(check(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6], sys.argv[7]))
