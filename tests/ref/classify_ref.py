#!/usr/bin/python3
"""Hugging Face's BertForSequenceClassification and its text-classification
pipeline in plain PyTorch, the reference for tests/test_classify.sh
(transformers is not installed; python3-torch is).

  classify_ref.py make DIR
      writes DIR/vocab.txt, DIR/labels.txt, DIR/config.json (num_labels,
      id2label, label2id, problem_type), DIR/model.safetensors (a small random
      classifier initialised by torch, Hugging Face's names: bert.* with the
      pooler, classifier.*) and DIR/data.tsv (labelled examples of those
      words, some longer than the shard's 16 tokens).
  classify_ref.py eval DIR T OUT.json LOGITS.f32
      reads DIR/data.tsv as `skyloom data prepare --labels --seq T` does
      (BertTokenizer: [CLS] text [SEP], cut to T with its [SEP]), runs the model
      in float64 with dropout 0 and compares with what `skyloom eval --task
      classify --json --logits` wrote: the logits within 1e-4 of the largest
      (relative), the mean cross-entropy within 1e-5 (relative), the accuracy
      and macro-F1 (scikit-learn's: classes true or predicted, an undefined
      ratio 0) and the confusion matrix exactly.
  classify_ref.py predict DIR CASES.json
      for each case {"topk", "texts", "out", "logits"} of CASES.json: the
      text-classification pipeline on the texts (each alone, unpadded) and what
      `skyloom predict --json --top-k TOPK --logits` wrote: logits within 1e-4,
      the same labels in the same order (ties within 1e-5 may swap), scores
      within 1e-5, and the pipeline's shape (one dict per text at top-k 1, a
      list of TOPK per text otherwise, unwrapped for one text).
Exit 1 on any difference.
"""
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fill_mask_ref as fm  # noqa: E402  (safetensors I/O, the vocabulary, BertTokenizer)

LABELS = ["neg", "pos", "mixed"]


def make(d):
    vocab = fm.SPECIAL + fm.WORDS
    with open(os.path.join(d, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(vocab) + "\n")
    with open(os.path.join(d, "labels.txt"), "w") as f:
        f.write("\n".join(LABELS) + "\n")
    C, V, F, L, K, P = 64, len(vocab), 96, 2, len(LABELS), 32
    cfg = {"architectures": ["BertForSequenceClassification"], "model_type": "bert",
           "hidden_size": C, "num_hidden_layers": L, "num_attention_heads": 4,
           "intermediate_size": F, "vocab_size": V, "max_position_embeddings": P,
           "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu",
           "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
           "classifier_dropout": None, "initializer_range": 0.02,
           "id2label": {str(i): n for i, n in enumerate(LABELS)},
           "label2id": {n: i for i, n in enumerate(LABELS)},
           "problem_type": "single_label_classification", "transformers_version": "4.40.0"}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    g = torch.Generator().manual_seed(23)

    def r(*shape, sd=0.2):
        return (sd * torch.randn(*shape, generator=g)).float()
    t = {}
    e = "bert.embeddings."
    t[e + "word_embeddings.weight"] = r(V, C, sd=0.6)
    t[e + "position_embeddings.weight"] = r(P, C)
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
    t["bert.pooler.dense.weight"] = r(C, C, sd=0.3)
    t["bert.pooler.dense.bias"] = r(C, sd=0.1)
    t["classifier.weight"] = r(K, C, sd=1.0)  # spread logits: clear predictions
    t["classifier.bias"] = r(K, sd=0.1)
    fm.st_write(os.path.join(d, "model.safetensors"), {k: v.numpy() for k, v in t.items()})
    words = [w for w in fm.WORDS if not w.startswith("##")]
    rng = np.random.default_rng(5)
    with open(os.path.join(d, "data.tsv"), "w", encoding="utf-8") as f:
        for i in range(37):
            n = int(rng.integers(1, 24))
            text = " ".join(words[int(j)] for j in rng.integers(0, len(words), n))
            f.write("%s\t%s\n" % (LABELS[int(rng.integers(0, K))], text))


def model(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    p = {k: torch.tensor(v.astype(np.float64))
         for k, v in fm.st_read(os.path.join(d, "model.safetensors")).items()}
    return cfg, p


def logits_of(cfg, p, ids):
    """BertForSequenceClassification's logits for one unpadded sequence."""
    C, L, NH = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
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
    pooled = torch.tanh(lin(x[0], "bert.pooler.dense"))
    return lin(pooled, "classifier")


def compare_logits(ours_path, ref, fail):
    ours = np.fromfile(ours_path, dtype="<f4")
    if ours.size != ref.numel():
        fail.append("logits: %d values, the reference has %d x %d" % (ours.size, *ref.shape))
        return
    ours = torch.tensor(ours.astype(np.float64)).reshape(ref.shape)
    rel = ((ours - ref).abs().max() / ref.abs().max()).item()
    print("     logits (%d x %d): max error / max |logit| = %.3g" % (*ref.shape, rel))
    if not rel <= 1e-4:
        fail.append("logits rel error %.3g > 1e-4" % rel)


def evaluate(d, T, out_json, out_logits):
    cfg, p = model(d)
    vocab = fm.tok.load_vocab(os.path.join(d, "vocab.txt"))
    K = len(LABELS)
    rows, classes = [], []
    for line in open(os.path.join(d, "data.tsv"), encoding="utf-8"):
        label, text = line.rstrip("\n").split("\t", 1)
        ids = fm.encode(text, vocab, True)
        if len(ids) > T:
            ids = ids[:T - 1] + [vocab["[SEP]"]]
        rows.append(logits_of(cfg, p, ids))
        classes.append(LABELS.index(label))
    ref = torch.stack(rows)
    y = torch.tensor(classes)
    loss = torch.nn.functional.cross_entropy(ref, y).item()
    pred = ref.argmax(dim=1)
    conf = [[0] * K for _ in range(K)]
    for a, b in zip(classes, pred.tolist()):
        conf[a][b] += 1
    f1s = []
    for c in range(K):
        tp = conf[c][c]
        sup, prd = sum(conf[c]), sum(conf[k][c] for k in range(K))
        pr = tp / prd if prd else 0.0
        rc = tp / sup if sup else 0.0
        if sup or prd:
            f1s.append(2 * pr * rc / (pr + rc) if pr + rc else 0.0)
    fail = []
    compare_logits(out_logits, ref, fail)
    got = json.load(open(out_json))
    print("     loss %.9f, torch %.9f; accuracy %.4f; macro-F1 %.4f" %
          (got["loss"], loss, (pred == y).double().mean().item(), sum(f1s) / len(f1s)))
    if abs(got["loss"] - loss) > 1e-5 * loss:
        fail.append("loss %.9f, want %.9f" % (got["loss"], loss))
    if abs(got["accuracy"] - (pred == y).double().mean().item()) > 1e-7:
        fail.append("accuracy %g" % got["accuracy"])
    if abs(got["macro_f1"] - sum(f1s) / len(f1s)) > 1e-7:
        fail.append("macro-F1 %g, want %g" % (got["macro_f1"], sum(f1s) / len(f1s)))
    if got["confusion"] != conf:
        fail.append("confusion %s, want %s" % (got["confusion"], conf))
    if got["labels"] != LABELS or got["sequences"] != len(classes):
        fail.append("labels %s, sequences %d" % (got["labels"], got["sequences"]))
    for f in fail[:10]:
        print("FAIL " + f)
    return 1 if fail else 0


def predict(d, topk, out_json, out_logits, texts):
    cfg, p = model(d)
    vocab = fm.tok.load_vocab(os.path.join(d, "vocab.txt"))
    names = [cfg["id2label"][str(i)] for i in range(len(cfg["id2label"]))]
    ref = torch.stack([logits_of(cfg, p, fm.encode(t, vocab, True)) for t in texts])
    fail = []
    compare_logits(out_logits, ref, fail)
    got = json.load(open(out_json))
    if topk == 1:
        want_shape = isinstance(got, list) and all(isinstance(g, dict) for g in got)
        per_text = [[g] for g in got] if want_shape else []
    elif len(texts) == 1:
        want_shape = isinstance(got, list) and all(isinstance(g, dict) for g in got)
        per_text = [got] if want_shape else []
    else:
        want_shape = isinstance(got, list) and all(isinstance(g, list) for g in got)
        per_text = got if want_shape else []
    if not want_shape or len(per_text) != len(texts):
        fail.append("output is not the pipeline's shape for %d texts, top-k %d: %s" %
                    (len(texts), topk, json.dumps(got)[:200]))
    probs = torch.softmax(ref, dim=-1)
    for j, row in enumerate(per_text):
        order = sorted(range(len(names)), key=lambda k: (-probs[j, k].item(), k))[:topk]
        if len(row) != topk:
            fail.append("text %d: %d labels, want %d" % (j, len(row), topk))
            continue
        for r, (g, k) in enumerate(zip(row, order)):
            if g.get("label") not in names:
                fail.append("text %d rank %d: label %r" % (j, r, g.get("label")))
                continue
            gk = names.index(g["label"])
            if gk != k and abs(probs[j, gk].item() - probs[j, k].item()) > 1e-5:
                fail.append("text %d rank %d: %s, want %s" % (j, r, g["label"], names[k]))
            if abs(g["score"] - probs[j, gk].item()) > 1e-5:
                fail.append("text %d rank %d: score %.9f, want %.9f" % (j, r, g["score"], probs[j, gk].item()))
    for f in fail[:10]:
        print("FAIL " + f)
    return 1 if fail else 0


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "make":
        make(sys.argv[2])
    elif cmd == "eval":
        sys.exit(evaluate(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]))
    else:
        bad = 0
        for case in json.load(open(sys.argv[3])):
            print("     top-k %d, %d text(s):" % (case["topk"], len(case["texts"])))
            bad |= predict(sys.argv[2], case["topk"], case["out"], case["logits"], case["texts"])
        sys.exit(bad)
