#!/usr/bin/python3
"""What a curious middle device learns from what it receives (bench/privacy).

In a U-shaped job the data owner runs units 0..N (embeddings + N encoder
layers) and the MLM head; the middle device receives, for every micro-batch,
the boundary activation of unit N (B,T,C; after unit 0 that is
dropout(LN(word + position + type embeddings)), after a layer its output
LayerNorm), the valid mask (B,T), and, from the head, the gradient of the
loss with respect to the last encoder layer's output (zero except at the
masked positions). This script plays that middle device against a model
trained by `skyloom train`, in PyTorch (bench only, never the product).

Attacker: knows the architecture, the seed (so the initial weights, given
here as the safetensors of a run with learning rate 0), the vocabulary and
public text (a shard of text disjoint from the owner's); not the owner's
trained units 0..N nor its data. The "trained" rows give it the owner's
trained weights too: the worst case, where they leaked.

  attack   boundary attacks for each N: N=0 nearest-neighbour inversion
           against the embedding table, N>=1 a linear probe and a small MLP
           per position trained on public text through the attacker's copy of
           units 0..N; the gradient from the head against the labels; a
           most-frequent-token baseline. One JSON line per result.
  defence  the demo model trained here in PyTorch with and without Gaussian
           noise on the boundary activation of unit N, its held-out loss, and
           the same attacks on the noisy boundary. JSON lines.
  table    the markdown table of the JSON lines.

Every model runs in float32 on the CPU. Tokens are counted at the valid
positions other than [CLS] and [SEP]: "text" = the positions the MLM masking
left alone (the input token is the owner's token), "labels" = the masked ones
(the attack must give the original token, which the input no longer shows).
"""
import argparse
import json
import math
import os
import statistics
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


# ---------------------------------------------------------------- files

def read_shard(path):
    """A token shard (docs/data.md): sequences (list of int arrays), vocab, specials."""
    b = open(path, "rb").read()
    if b[:8] != b"SKYSHARD":
        raise SystemExit("%s: not a token shard" % path)
    hsz = struct.unpack_from("<I", b, 12)[0]
    V, T = struct.unpack_from("<II", b, 48)
    N, D, ntok, vbytes = struct.unpack_from("<QQQQ", b, 56)
    width = struct.unpack_from("<I", b, 88)[0]
    pad, unk, cls, sep, mask = struct.unpack_from("<5i", b, 96)
    off = hsz
    starts = np.frombuffer(b, "<u8", N + 1, off).astype(np.int64)
    off += 8 * (N + 1) + 8 * (D + 1)
    vocab = b[off:off + vbytes].decode("utf-8").split("\n")[:V]
    off += (vbytes + 7) // 8 * 8
    toks = np.frombuffer(b, "<u2" if width == 2 else "<u4", ntok, off).astype(np.int64)
    seqs = [toks[starts[i]:starts[i + 1]] for i in range(N)]
    return {"seqs": seqs, "T": T, "V": V, "vocab": vocab,
            "special": {"pad": pad, "unk": unk, "cls": cls, "sep": sep, "mask": mask}}


def st_read(path):
    """safetensors (F32) -> {name: float32 tensor}."""
    b = open(path, "rb").read()
    n = int.from_bytes(b[:8], "little")
    h = json.loads(b[8:8 + n])
    data = b[8 + n:]
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", k
        s, e = v["data_offsets"]
        out[k] = torch.from_numpy(np.frombuffer(data[s:e], dtype="<f4").reshape(v["shape"]).copy())
    return out


# ---------------------------------------------------------------- batches

def make_batch(seqs, sp, V, T, rng, mask_prob=0.15):
    """(tokens, original, valid) (B,T) int64 tensors, masked as docs/data.md says:
    k = max(1, round(p n)) of the n real positions other than [CLS]/[SEP]/[PAD],
    80% [MASK], 10% a random id over the whole vocabulary, 10% unchanged.
    selected (B,T) bool marks the masked positions."""
    B = len(seqs)
    tok = np.full((B, T), sp["pad"], np.int64)
    valid = np.zeros((B, T), np.int64)
    sel = np.zeros((B, T), bool)
    for i, s in enumerate(seqs):
        n = min(len(s), T)
        tok[i, :n] = s[:n]
        valid[i, :n] = 1
        cand = [t for t in range(n) if s[t] not in (sp["cls"], sp["sep"], sp["pad"])]
        if not cand or mask_prob <= 0:
            continue
        k = max(1, int(round(mask_prob * len(cand))))
        for t in rng.permutation(cand)[:k]:
            sel[i, t] = True
    orig = tok.copy()
    r = rng.random((B, T))
    rnd = rng.integers(0, V, (B, T))
    tok[sel & (r < 0.8)] = sp["mask"]
    m10 = sel & (r >= 0.8) & (r < 0.9)
    tok[m10] = rnd[m10]
    return torch.from_numpy(tok), torch.from_numpy(orig), torch.from_numpy(valid), torch.from_numpy(sel)


def counted(orig, valid, sp):
    """The positions that count: valid, not [CLS]/[SEP]."""
    return (valid == 1) & (orig != sp["cls"]) & (orig != sp["sep"])


# ---------------------------------------------------------------- the model

class Bert:
    """Our BERT (tests/ref/bert_ref.py's math, float32, with dropout): units
    0..N, the layers after, the head with the tied decoder."""

    def __init__(self, p, cfg):
        self.p, self.cfg = p, cfg
        self.C, self.NH = cfg["hidden_size"], cfg["num_attention_heads"]
        self.L = cfg["num_hidden_layers"]
        self.eps = cfg.get("layer_norm_eps", 1e-12)
        self.pd = cfg.get("hidden_dropout_prob", 0.1)
        self.pa = cfg.get("attention_probs_dropout_prob", 0.1)
        self.tanh = cfg.get("hidden_act", "gelu") in ("gelu_new", "gelu_pytorch_tanh")

    def gelu(self, x):
        return F.gelu(x, approximate="tanh" if self.tanh else "none")

    def ln(self, x, n):
        return F.layer_norm(x, (self.C,), self.p[n + ".weight"], self.p[n + ".bias"], self.eps)

    def lin(self, x, n):
        return x @ self.p[n + ".weight"].T + self.p[n + ".bias"]

    def embed(self, tok, train):
        e = "bert.embeddings."
        T = tok.shape[1]
        x = self.p[e + "word_embeddings.weight"][tok] + self.p[e + "position_embeddings.weight"][:T][None] \
            + self.p[e + "token_type_embeddings.weight"][0]
        return F.dropout(self.ln(x, e + "LayerNorm"), self.pd, train)

    def layer(self, l, x, valid, train):
        B, T, C = x.shape
        hs = C // self.NH
        n = "bert.encoder.layer.%d." % l

        def heads(t):
            return t.view(B, T, self.NH, hs).transpose(1, 2)
        q = heads(self.lin(x, n + "attention.self.query"))
        k = heads(self.lin(x, n + "attention.self.key"))
        v = heads(self.lin(x, n + "attention.self.value"))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
        s = s.masked_fill((valid == 0)[:, None, None, :], float("-inf"))
        a = F.dropout(torch.softmax(s, dim=-1), self.pa, train) @ v
        a = a.transpose(1, 2).reshape(B, T, C)
        x = self.ln(x + F.dropout(self.lin(a, n + "attention.output.dense"), self.pd, train),
                    n + "attention.output.LayerNorm")
        h = self.gelu(self.lin(x, n + "intermediate.dense"))
        return self.ln(x + F.dropout(self.lin(h, n + "output.dense"), self.pd, train), n + "output.LayerNorm")

    def units(self, tok, valid, N, train, start=None, first=0):
        """The output of unit N (0: the embeddings); from `start` (the output
        of unit first) when given."""
        x = self.embed(tok, train) if start is None else start
        for l in range(first, N):
            x = self.layer(l, x, valid, train)
        return x

    def logits(self, xm):
        c = "cls.predictions."
        t = self.ln(self.gelu(self.lin(xm, c + "transform.dense")), c + "transform.LayerNorm")
        return t @ self.p["bert.embeddings.word_embeddings.weight"].T + self.p[c + "bias"]


def load_model(path, cfg):
    return Bert(st_read(path), cfg)


# ---------------------------------------------------------------- attacks

def boundary(model, data, N, args, rng, noise=0.0, max_tokens=None):
    """Runs sequences through units 0..N in training mode (dropout as in
    training), with Gaussian noise of `noise` x the row's RMS when asked.
    Returns (features (n,C), input ids, original ids, selected) at the counted
    positions, over batches of args.batch sequences."""
    sp, V, T = data["special"], args.vocab_size, data["T"]
    seqs = data["seqs"]
    feats, inp, orig_l, sel_l = [], [], [], []
    total = 0
    with torch.no_grad():
        for i in range(0, len(seqs), args.batch):
            tok, orig, valid, sel = make_batch(seqs[i:i + args.batch], sp, V, T, rng)
            x = model.units(tok, valid, N, True)
            if noise > 0:
                x = add_noise(x, noise)
            m = counted(orig, valid, sp)
            feats.append(x[m])
            inp.append(tok[m])
            orig_l.append(orig[m])
            sel_l.append(sel[m])
            total += int(m.sum())
            if max_tokens and total >= max_tokens:
                break
    return torch.cat(feats), torch.cat(inp), torch.cat(orig_l), torch.cat(sel_l)


def add_noise(x, sigma, gen=None):
    """x + sigma * rms(row) * N(0, 1), per position (row of C)."""
    rms = x.pow(2).mean(-1, keepdim=True).sqrt()
    return x + sigma * rms * torch.randn(x.shape, generator=gen)


def nn_invert(owner, model, data, args, rng, N=0, noise=0.0):
    """Nearest-neighbour inversion: every row the owner's units 0..N produce
    against LN(word[v] + position[t] + type[0]) for every token v under the
    attacker's copy of unit 0. At N = 0 only the coordinates dropout kept
    count (a dropped coordinate arrives as an exact 0; the kept ones are
    x / (1 - p)); after a layer (N >= 1, a LayerNorm's output) all of them.
    Returns (predicted input ids, input ids, original ids, selected)."""
    sp, V, T = data["special"], args.vocab_size, data["T"]
    e = "bert.embeddings."
    W = model.p[e + "word_embeddings.weight"]
    P = model.p[e + "position_embeddings.weight"]
    S = model.p[e + "token_type_embeddings.weight"][0]
    dropped = N == 0 and noise == 0 and owner.pd > 0
    keep = 1 - owner.pd if dropped else 1.0
    xs_l, tok_l, orig_l, valid_l, sel_l = [], [], [], [], []
    with torch.no_grad():
        seqs = data["seqs"]
        for i in range(0, len(seqs), args.batch):
            tok, orig, valid, sel = make_batch(seqs[i:i + args.batch], sp, V, T, rng)
            x = owner.units(tok, valid, N, True)
            if noise > 0:
                x = add_noise(x, noise)
            for l, v in ((xs_l, x), (tok_l, tok), (orig_l, orig), (valid_l, valid), (sel_l, sel)):
                l.append(v)
        x, tok, orig, valid, sel = (torch.cat(l) for l in (xs_l, tok_l, orig_l, valid_l, sel_l))
        cnt = counted(orig, valid, sp)
        pred = torch.zeros_like(tok)
        lnw, lnb = model.p[e + "LayerNorm.weight"], model.p[e + "LayerNorm.bias"]
        for t in range(T):
            rows = cnt[:, t]
            if not rows.any():
                continue
            ct = F.layer_norm(W + P[t] + S, (model.C,), lnw, lnb, model.eps)  # (V,C)
            xt = x[rows, t] * keep
            if dropped:
                m = (x[rows, t] != 0).float()
                d = -2 * (m * xt) @ ct.T + m @ (ct * ct).T
            else:
                d = -2 * xt @ ct.T + (ct * ct).sum(1)
            pred[rows, t] = d.argmin(1)
    return pred[cnt], tok[cnt], orig[cnt], sel[cnt]


class Probe(torch.nn.Module):
    """Per position: a linear map C -> classes, or an MLP C -> H -> classes."""

    def __init__(self, C, K, hidden):
        super().__init__()
        self.net = (torch.nn.Linear(C, K) if hidden == 0 else
                    torch.nn.Sequential(torch.nn.Linear(C, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, K)))

    def forward(self, x):
        return self.net(x)


def train_probe(x, y, hidden, args, seed):
    """Fits a probe from features x (n,C) to ids y over the classes seen in y
    (an unseen id cannot be learned). Returns predict(x) -> ids."""
    torch.manual_seed(seed)
    classes = torch.unique(y)
    idx = torch.full((args.vocab_size,), -1, dtype=torch.long)
    idx[classes] = torch.arange(len(classes))
    yc = idx[y]
    mu, sd = x.mean(0), x.std(0) + 1e-6
    xs = (x - mu) / sd
    pr = Probe(x.shape[1], len(classes), hidden)
    opt = torch.optim.Adam(pr.parameters(), lr=args.probe_lr)
    n, bs = len(xs), 512
    steps = args.probe_epochs * ((n + bs - 1) // bs)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, args.probe_lr, total_steps=steps, pct_start=0.1)
    g = torch.Generator().manual_seed(seed)
    for _ in range(args.probe_epochs):
        perm = torch.randperm(n, generator=g)
        for i in range(0, n, bs):
            j = perm[i:i + bs]
            loss = F.cross_entropy(pr(xs[j]), yc[j])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()

    def predict(z):
        with torch.no_grad():
            out = []
            for i in range(0, len(z), 4096):
                out.append(classes[pr((z[i:i + 4096] - mu) / sd).argmax(1)])
            return torch.cat(out)
    return predict


def scores(pred, inp, orig, sel, sp):
    """Recovery at the text positions (input == owner's token) and at the masked
    ones (the label), and the [MASK] inputs found (recall, precision)."""
    text = ~sel
    ism = inp == sp["mask"]
    said = pred == sp["mask"]
    return {
        "text": 100.0 * float((pred[text] == orig[text]).float().mean()) if text.any() else float("nan"),
        "labels": 100.0 * float((pred[sel] == orig[sel]).float().mean()) if sel.any() else float("nan"),
        "mask_recall": 100.0 * float(said[ism].float().mean()) if ism.any() else float("nan"),
        "mask_precision": 100.0 * float(ism[said].float().mean()) if said.any() else float("nan"),
        "n_text": int(text.sum()), "n_labels": int(sel.sum()),
    }


def head_gradient(model, data, args, rng, max_tokens=None):
    """The gradient the head sends to the middle device: d loss / d (output of
    unit L) for micro-batches of args.batch sequences, the loss the mean over
    the masked positions as training has it. Returns (rows at the counted
    positions (n,C), original ids, selected, exact zeros outside the masked
    positions?)."""
    sp, V, T = data["special"], args.vocab_size, data["T"]
    seqs = data["seqs"]
    g_l, orig_l, sel_l = [], [], []
    zero_elsewhere = True
    total = 0
    for i in range(0, len(seqs), args.batch):
        tok, orig, valid, sel = make_batch(seqs[i:i + args.batch], sp, V, T, rng)
        with torch.no_grad():
            x = model.units(tok, valid, model.L, True)
        x.requires_grad_(True)
        lg = model.logits(x[sel])
        F.cross_entropy(lg, orig[sel]).backward()
        g = x.grad
        zero_elsewhere &= bool((g[~sel] == 0).all())
        m = counted(orig, valid, sp)
        g_l.append(g[m])
        orig_l.append(orig[m])
        sel_l.append(sel[m])
        total += int(sel.sum())
        if max_tokens and total >= max_tokens:
            break
    return torch.cat(g_l), torch.cat(orig_l), torch.cat(sel_l), zero_elsewhere


def unit_rows(g):
    return g / (g.norm(dim=1, keepdim=True) + 1e-30)


# ---------------------------------------------------------------- commands

def emit(out, **kw):
    line = json.dumps(kw)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def subset(data, idx):
    d = dict(data)
    d["seqs"] = [data["seqs"][i] for i in idx]
    return d


def split_owner(args, owner_data, seed):
    """The owner's held-out sequences (args.first..) this seed attacks."""
    rng = np.random.default_rng(1000 + seed)
    held = np.arange(args.first, len(owner_data["seqs"]))
    pick = rng.permutation(held)[:args.eval_seqs]
    return subset(owner_data, np.sort(pick))


def public_split(args, pub, seed):
    rng = np.random.default_rng(2000 + seed)
    return subset(pub, rng.permutation(len(pub["seqs"]))[:args.public_seqs])


def most_frequent(seqs, V, sp):
    cnt = np.bincount(np.concatenate(seqs), minlength=V)
    for s in sp.values():
        cnt[s] = 0
    return int(cnt.argmax())


def baseline(top, owner_eval, args, sp):
    """Guessing token `top` everywhere."""
    _, inp, orig, sel = collect_ids(owner_eval, args, np.random.default_rng(7))
    return scores(torch.full_like(inp, top), inp, orig, sel, sp)


def collect_ids(data, args, rng):
    sp, V, T = data["special"], args.vocab_size, data["T"]
    inp_l, orig_l, sel_l = [], [], []
    for i in range(0, len(data["seqs"]), args.batch):
        tok, orig, valid, sel = make_batch(data["seqs"][i:i + args.batch], sp, V, T, rng)
        m = counted(orig, valid, sp)
        inp_l.append(tok[m])
        orig_l.append(orig[m])
        sel_l.append(sel[m])
    return None, torch.cat(inp_l), torch.cat(orig_l), torch.cat(sel_l)


def cmd_attack(args):
    cfg = json.load(open(args.config))
    args.vocab_size = cfg["vocab_size"]
    L = cfg["num_hidden_layers"]
    owner_data = read_shard(args.owner)
    pub = read_shard(args.public)
    sp = owner_data["special"]
    if pub["vocab"] != owner_data["vocab"]:
        raise SystemExit("the public shard must be prepared with the owner's vocabulary")
    init = load_model(args.init, cfg)
    trained = load_model(args.trained, cfg)
    weights = {"init": init, "trained": trained}
    base = dict(config=args.name, steps=args.steps)
    t0 = time.time()

    ev = split_owner(args, owner_data, 0)
    for what, seqs in (("most frequent token of the public text", pub["seqs"]),
                       ("most frequent token of the owner's own text (an oracle)",
                        owner_data["seqs"][:args.first])):
        top = most_frequent(seqs, args.vocab_size, sp)
        emit(args.out, **base, N="any", attack=what, weights="-", seed=0, token=owner_data["vocab"][top],
             **baseline(top, ev, args, sp))

    for N in args.N:
        if N > L:
            continue
        for seed in range(args.seeds):
            ev = split_owner(args, owner_data, seed)
            # nearest neighbour against the attacker's table of unit 0's outputs
            for owner, wname, w in ((trained, "init", init), (trained, "trained", trained),
                                    (init, "init, owner at step 0", init)):
                torch.manual_seed(seed)
                pred, inp, orig, sel = nn_invert(owner, w, ev, args, np.random.default_rng(seed), N)
                emit(args.out, **base, N=N, attack="nearest neighbour", weights=wname, seed=seed,
                     **scores(pred, inp, orig, sel, sp))
            if N == 0 or seed >= args.probe_seeds:
                continue
            torch.manual_seed(seed)
            ev_x, ev_inp, ev_orig, ev_sel = boundary(trained, ev, N, args, np.random.default_rng(seed))
            torch.manual_seed(seed)
            ev0 = boundary(init, ev, N, args, np.random.default_rng(seed))
            for wname, w in weights.items():
                torch.manual_seed(100 + seed)
                px, pinp, _, _ = boundary(w, public_split(args, pub, seed), N, args,
                                          np.random.default_rng(100 + seed), max_tokens=args.public_tokens)
                for pname, hidden in (("linear probe", 0), ("MLP probe", args.hidden or cfg["hidden_size"])):
                    t1 = time.time()
                    predict = train_probe(px, pinp, hidden, args, seed)
                    emit(args.out, **base, N=N, attack=pname, weights=wname, seed=seed, train_tokens=len(px),
                         seconds=round(time.time() - t1, 1),
                         **scores(predict(ev_x), ev_inp, ev_orig, ev_sel, sp))
                    if wname == "init":
                        emit(args.out, **base, N=N, attack=pname, weights="init, owner at step 0", seed=seed,
                             train_tokens=len(px), **scores(predict(ev0[0]), *ev0[1:], sp))
    if args.grad:
        # the labels, from the gradient the head sends back (any N < L)
        for wname, w in weights.items():
            torch.manual_seed(300)
            px, porig, psel, _ = head_gradient(w, public_split(args, pub, 0), args, np.random.default_rng(300),
                                               max_tokens=args.public_tokens // 6)
            px, porig = unit_rows(px[psel]), porig[psel]
            torch.manual_seed(301)
            ev = split_owner(args, owner_data, 0)
            g, orig, sel, zero = head_gradient(trained, ev, args, np.random.default_rng(301))
            found = 100.0 * float(((g.abs().sum(1) != 0) == sel).float().mean())
            for pname, hidden in (("linear probe", 0), ("MLP probe", args.hidden or cfg["hidden_size"])):
                predict = train_probe(px, porig, hidden, args, 0)
                pred = torch.zeros_like(orig)
                pred[sel] = predict(unit_rows(g[sel]))
                s = scores(pred, orig, orig, sel, sp)
                emit(args.out, **base, N="<L", attack="head gradient, " + pname, weights=wname, seed=0,
                     labels=s["labels"], n_labels=s["n_labels"], masked_positions_found=found,
                     zero_outside_masked=zero, train_tokens=len(px))
    print("attack: %.0f s" % (time.time() - t0), file=sys.stderr)


def mlm_loss(model, tok, orig, valid, sel, N, sigma, train, gen=None):
    """The MLM loss of a batch, with Gaussian noise of sigma x the row's RMS
    added to the output of unit N (the boundary the middle device receives)."""
    x = model.units(tok, valid, N, train)
    if sigma > 0:
        x = add_noise(x, sigma, gen)
    x = model.units(tok, valid, model.L, train, start=x, first=N)
    return F.cross_entropy(model.logits(x[sel]), orig[sel])


def train_noisy(args, cfg, owner_data, sigma):
    """The owner's training as `skyloom train` runs it (AdamW, betas 0.9/0.999,
    eps 1e-6, weight decay on every matrix and embedding but not on biases and
    LayerNorm, linear warm-up over 10% of the steps then linear decay to 0,
    global gradient-norm clip 1.0, sequences 0..first-1 shuffled per epoch,
    masking and dropout drawn here), from the initial weights, with the noise
    on the boundary. Returns (model, per-step losses)."""
    p = {k: v.clone().requires_grad_(True) for k, v in st_read(args.init).items()}
    model = Bert(p, cfg)
    decay = [v for k, v in p.items() if v.ndim > 1]
    no_decay = [v for k, v in p.items() if v.ndim <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.999), eps=1e-6)
    warm = max(1, args.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s + 1 <= warm else max(0.0, (args.steps - s - 1) / (args.steps - warm)))
    rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    sp, V, T = owner_data["special"], cfg["vocab_size"], owner_data["T"]
    order, pos, losses = rng.permutation(args.first), 0, []
    for step in range(args.steps):
        if pos + args.batch > len(order):
            order, pos = rng.permutation(args.first), 0
        seqs = [owner_data["seqs"][i] for i in order[pos:pos + args.batch]]
        pos += args.batch
        tok, orig, valid, sel = make_batch(seqs, sp, V, T, rng)
        loss = mlm_loss(model, tok, orig, valid, sel, args.home, sigma, True, gen)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(p.values()), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss))
    for v in p.values():
        v.requires_grad_(False)
    return model, losses


def held_out_loss(model, owner_data, args, sigma):
    """Mean MLM loss over the evaluation sequences, dropout off, masking of a
    fixed seed; with the boundary noise when sigma > 0."""
    ev = split_owner(args, owner_data, 0)
    sp, V, T = ev["special"], args.vocab_size, ev["T"]
    rng = np.random.default_rng(5)
    gen = torch.Generator().manual_seed(5)
    tot, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(ev["seqs"]), args.batch):
            tok, orig, valid, sel = make_batch(ev["seqs"][i:i + args.batch], sp, V, T, rng)
            k = int(sel.sum())
            tot += float(mlm_loss(model, tok, orig, valid, sel, args.home, sigma, False, gen)) * k
            n += k
    return tot / n


def unigram_loss(owner_data, args):
    """held_out_loss's masked tokens scored by the token frequencies of the
    training sequences (add-0.5): the loss of a model that ignores its input."""
    sp = owner_data["special"]
    cnt = np.bincount(np.concatenate(owner_data["seqs"][:args.first]), minlength=args.vocab_size) + 0.5
    for t in ("pad", "cls", "sep", "mask"):  # never a label ([UNK] may be one)
        cnt[sp[t]] = 0
    with np.errstate(divide="ignore"):
        logp = np.log(cnt / cnt.sum())
    ev = split_owner(args, owner_data, 0)
    rng = np.random.default_rng(5)
    tot, n = 0.0, 0
    for i in range(0, len(ev["seqs"]), args.batch):
        _, orig, _, sel = make_batch(ev["seqs"][i:i + args.batch], sp, args.vocab_size, ev["T"], rng)
        tot -= float(logp[orig[sel].numpy()].sum())
        n += int(sel.sum())
    return tot / n


def cmd_defence(args):
    cfg = json.load(open(args.config))
    args.vocab_size = cfg["vocab_size"]
    owner_data = read_shard(args.owner)
    pub = read_shard(args.public)
    sp = owner_data["special"]
    init = load_model(args.init, cfg)
    base = dict(config=args.name, steps=args.steps)
    emit(args.out, **base, N="any", attack="unigram", weights="-", sigma=-1, seed=0,
         held_out=unigram_loss(owner_data, args))
    ev = split_owner(args, owner_data, 0)
    homes = sorted({N for N, _ in args.runs})
    # without noise the training is the same whatever N: one model, attacked at every N
    todo = [(None, 0.0)] + sorted({(N, sg) for N, sg in args.runs if sg > 0})
    for N, sigma in todo:
        t0 = time.time()
        args.home = N or 0
        model, losses = train_noisy(args, cfg, owner_data, sigma)
        k = min(20, len(losses))
        emit(args.out, **base, N="any" if N is None else N, attack="training", weights="-", sigma=sigma,
             seed=args.seed, first20=sum(losses[:k]) / k, last20=sum(losses[-k:]) / k,
             held_out=held_out_loss(model, owner_data, args, 0.0),
             held_out_noisy=held_out_loss(model, owner_data, args, sigma),
             seconds=round(time.time() - t0, 1))
        for n in (homes if N is None else [N]):
            for wname, w in (("init", init), ("trained", model)):
                torch.manual_seed(0)
                pred, inp, orig, sel = nn_invert(model, w, ev, args, np.random.default_rng(0), n, sigma)
                emit(args.out, **base, N=n, attack="nearest neighbour", weights=wname, sigma=sigma, seed=0,
                     **scores(pred, inp, orig, sel, sp))
                if not args.probes or (n == 0 and sigma == 0):
                    continue
                torch.manual_seed(0)
                ev_x, ev_inp, ev_orig, ev_sel = boundary(model, ev, n, args, np.random.default_rng(0), noise=sigma)
                torch.manual_seed(100)
                px, pinp, _, _ = boundary(w, public_split(args, pub, 0), n, args, np.random.default_rng(100),
                                          noise=sigma, max_tokens=args.public_tokens)
                # the linear probe only: with the same Gaussian noise on every token,
                # the best decoder of one position is linear in x when each token's
                # clean rows sit at one point (the classes then share a covariance)
                predict = train_probe(px, pinp, 0, args, 0)
                emit(args.out, **base, N=n, attack="linear probe", weights=wname, sigma=sigma, seed=0,
                     **scores(predict(ev_x), ev_inp, ev_orig, ev_sel, sp))


# ---------------------------------------------------------------- table

def cmd_table(args):
    rows = [json.loads(l) for f in args.files for l in open(f) if l.startswith("{")]

    def med(rs, k):
        v = [r[k] for r in rs if k in r and r[k] == r[k]]
        return statistics.median(v) if v else None

    def pct(x):
        return "–" if x is None else "%.1f%%" % x

    groups = {}
    for r in rows:
        if "sigma" not in r:
            groups.setdefault((r["config"], str(r["N"]), r["attack"], r["weights"]), []).append(r)
    print("| config (steps) | N | attack | attacker's weights | text tokens recovered | masked labels recovered | [MASK] inputs found (precision) | seeds |")
    print("|---|---|---|---|---:|---:|---:|---:|")
    order = {"nearest neighbour": 1, "linear probe": 2, "MLP probe": 3, "head gradient, linear probe": 4,
             "head gradient, MLP probe": 5}
    worder = {"init": 0, "trained": 1, "init, owner at step 0": 2}
    first = {}
    for r in rows:
        first.setdefault(r["config"], len(first))
    for key in sorted(groups, key=lambda k: (first[k[0]], k[1] == "<L", k[1] != "any", k[1], order.get(k[2], 0), k[2],
                                             worder.get(k[3], 9))):
        rs = groups[key]
        cfg, N, attack, w = key
        name = "%s (%s)" % (cfg, rs[0].get("steps", "?"))
        if attack.startswith("head gradient"):
            print("| %s | %s | %s | %s | – | %s | %s of the masked positions, exactly | %d |" % (
                name, N, attack, w, pct(med(rs, "labels")), pct(med(rs, "masked_positions_found")), len(rs)))
            continue
        mask = "–"
        if attack.startswith("most frequent"):
            attack += " ('%s')" % rs[0].get("token", "?")
        elif med(rs, "mask_recall") is not None:
            mask = "%s (%s)" % (pct(med(rs, "mask_recall")), pct(med(rs, "mask_precision")))
        print("| %s | %s | %s | %s | %s | %s | %s | %d |" % (
            name, N, attack, w, pct(med(rs, "text")), pct(med(rs, "labels")), mask, len(rs)))

    noisy = [r for r in rows if "sigma" in r and r["attack"] not in ("unigram", "training")]
    if not noisy:
        return
    uni = [r for r in rows if r.get("attack") == "unigram"]
    trained = {(str(r["N"]), r["sigma"]): r for r in rows if "sigma" in r and r["attack"] == "training"}
    cols = []
    for r in noisy:
        if (r["attack"], r["weights"]) not in cols:
            cols.append((r["attack"], r["weights"]))
    r0 = noisy[0]
    print()
    print("Defence: %s trained %s steps in PyTorch (bench/privacy/privacy.py defence) with Gaussian noise of "
          "σ × the row's RMS added to unit N's output (the boundary the middle device receives) in every "
          "training forward; the attacker knows σ; text tokens recovered at the noisy boundary. Held-out "
          "loss of a model that ignores its input (the training text's token frequencies): %s." % (
              r0["config"], r0["steps"], "%.3f" % uni[0]["held_out"] if uni else "–"))
    print()
    print("| N | σ | training loss, first 20 / last 20 steps | held-out loss (no noise) | held-out loss (with the noise) | "
          + " | ".join("%s (%s weights)" % c for c in cols) + " |")
    print("|---:|---:|---:|---:|---:|" + "---:|" * len(cols))
    for N, sigma in sorted({(str(r["N"]), r["sigma"]) for r in noisy}, key=lambda k: (k[1], k[0])):
        rs = [r for r in noisy if (str(r["N"]), r["sigma"]) == (N, sigma)]
        t = trained.get((N, sigma)) or trained.get(("any", sigma))
        tr = ("%.3f / %.3f" % (t["first20"], t["last20"]), "%.3f" % t["held_out"],
              "%.3f" % t["held_out_noisy"]) if t else ("–", "–", "–")
        cells = [pct(med([r for r in rs if (r["attack"], r["weights"]) == c], "text")) for c in cols]
        print("| %s | %g | %s | %s | %s | %s |" % (N, sigma, tr[0], tr[1], tr[2], " | ".join(cells)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("attack")
    a.add_argument("--name", required=True)
    a.add_argument("--config", required=True)
    a.add_argument("--init", required=True, help="the initial weights (safetensors)")
    a.add_argument("--trained", required=True, help="the owner's trained weights (safetensors)")
    a.add_argument("--steps", type=int, default=0, help="the steps it was trained (for the table)")
    a.add_argument("--owner", required=True, help="the owner's shard")
    a.add_argument("--first", type=int, required=True, help="the owner's held-out sequences start here")
    a.add_argument("--public", required=True, help="the attacker's public shard (owner's vocabulary)")
    a.add_argument("--N", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2, 4])
    a.add_argument("--seeds", type=int, default=3)
    a.add_argument("--probe-seeds", type=int, default=1)
    a.add_argument("--eval-seqs", type=int, default=400)
    a.add_argument("--public-seqs", type=int, default=6000)
    a.add_argument("--public-tokens", type=int, default=60000)
    a.add_argument("--probe-epochs", type=int, default=4)
    a.add_argument("--probe-lr", type=float, default=3e-3)
    a.add_argument("--hidden", type=int, default=0, help="the MLP's hidden width (default hidden_size)")
    a.add_argument("--batch", type=int, default=16)
    a.add_argument("--grad", action="store_true", help="also the head-gradient attack on the labels")
    a.add_argument("--threads", type=int, default=2)
    a.add_argument("--out")
    d = sub.add_parser("defence")
    for o in ("--name", "--config", "--init", "--owner", "--public"):
        d.add_argument(o, required=True)
    d.add_argument("--first", type=int, required=True)
    d.add_argument("--runs", type=lambda s: [(int(r.split(":")[0]), float(r.split(":")[1])) for r in s.split(",")],
                   default=[(1, 1.0), (1, 2.0)],
                   help="N:SIGMA,...: noise of SIGMA x the row's RMS on unit N's output (one model without noise too)")
    d.add_argument("--steps", type=int, default=300)
    d.add_argument("--lr", type=float, default=1e-3)
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--eval-seqs", type=int, default=400)
    d.add_argument("--public-seqs", type=int, default=6000)
    d.add_argument("--public-tokens", type=int, default=60000)
    d.add_argument("--probe-epochs", type=int, default=4)
    d.add_argument("--probe-lr", type=float, default=3e-3)
    d.add_argument("--probes", action="store_true", help="the linear probe too (N >= 1)")
    d.add_argument("--batch", type=int, default=16)
    d.add_argument("--threads", type=int, default=2)
    d.add_argument("--out")
    t = sub.add_parser("table")
    t.add_argument("files", nargs="+")
    args = ap.parse_args()
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    {"attack": cmd_attack, "defence": cmd_defence, "table": cmd_table}[args.cmd](args)


if __name__ == "__main__":
    main()
