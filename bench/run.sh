#!/usr/bin/env bash
# Side-by-side training-step benchmark, skyloom vs PyTorch (bench_train.c,
# torch_bert.py): for each config, ROUNDS alternating runs of each (the host
# is shared, so alternate and take medians), then a markdown table.
# Usage: bench/run.sh BENCH_TRAIN_EXE [configs...]   (default configs: a b;
# a config with a suffix +FLAGS runs skyloom with r --recompute, a
# --recompute-attention, b --optim-state bf16, p --precision bf16 (e.g.
# c+ab), against torch's plain run of the base config, under bf16 autocast
# when p is among the flags;
# env ROUNDS (3), STEPS (10), THREADS (2), PYTHON (/usr/bin/python3))
set -euo pipefail
exe=${1:?usage: run.sh BENCH_TRAIN_EXE [a b c]}
shift
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(a b)
rounds=${ROUNDS:-3} steps=${STEPS:-10} threads=${THREADS:-2} py=${PYTHON:-/usr/bin/python3}
here=$(cd "$(dirname "$0")" && pwd)
blas=/usr/lib/x86_64-linux-gnu/openblas-openmp
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for c in "${configs[@]}"; do
  s=$steps base=${c%%+*} prec=fp32
  case "$c" in *+*p*) prec=bf16 ;; esac
  [ "$base" = c ] && s=$(( steps < 5 ? steps : 5 ))
  for r in $(seq "$rounds"); do
    OMP_NUM_THREADS=$threads "$exe" "$c" "$s" "$threads" >>"$out"
    if "$py" -c 'import torch' 2>/dev/null; then
      LD_LIBRARY_PATH=$blas OMP_NUM_THREADS=$threads "$py" "$here/torch_bert.py" "$base" "$s" "$threads" "$prec" |
        sed "s/\"config\": \"$base\"/\"config\": \"$c\"/" >>"$out"
    fi
  done
done
"$py" - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def med(impl, cfg, key):
    v = [r[key] for r in rows if r["impl"] == impl and r["config"] == cfg and key in r]
    return statistics.median(v) if v else float("nan")
names = {"a": "L2 H128 A2 F512 V8192", "b": "L4 H256 A4 F1024 V8192", "c": "BERT-base"}
flag = {"r": "--recompute", "a": "--recompute-attention", "b": "--optim-state bf16",
        "p": "--precision bf16"}
def name(cfg):
    base, _, fl = cfg.partition("+")
    return ", ".join([names.get(base, base)] + [flag.get(f, f) for f in fl])
def round_ratios(cfg):
    """skyloom/torch tokens/s of each round: the two runs of a round are
    adjacent in time, so their ratio is robust to the host's load drifting."""
    s = [r["tokens_per_s"] for r in rows if r["impl"] == "skyloom" and r["config"] == cfg]
    t = [r["tokens_per_s"] for r in rows if r["impl"] == "torch" and r["config"] == cfg]
    return [a / b for a, b in zip(s, t)]
print("| config | skyloom tok/s | torch tok/s | ratio of medians | per-round ratio: median [min–max] | skyloom step | torch step | GEMM share | GEMM GFLOP/s in the step (plain) | skyloom RSS | torch RSS |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for cfg in sorted({r["config"] for r in rows}):
    st, tt = med("skyloom", cfg, "tokens_per_s"), med("torch", cfg, "tokens_per_s")
    rr = round_ratios(cfg) or [float("nan")]
    # plain: the same products in a loop, fp32 sgemm; in bf16 the step's own
    # kn_bgemm calls replayed (its buffers, bias and outputs), then the same
    # shapes on buffers that stay in cache ("hot"), then one oneDNN call per
    # product on its own threads ("whole")
    bf16 = "p" in cfg.partition("+")[2]
    plain = ("%.0f; hot %.0f, whole %.0f; sgemm %.0f" % (med("skyloom", cfg, "replay_bgemm_gflops"),
             med("skyloom", cfg, "plain_bgemm_gflops"), med("skyloom", cfg, "dnnl_whole_gflops"),
             med("skyloom", cfg, "plain_sgemm_gflops"))
             if bf16 else "%.0f" % med("skyloom", cfg, "plain_sgemm_gflops"))
    print("| %s | %.0f | %.0f%s | %.2f× | %.2f× [%.2f–%.2f] | %.3f s | %.3f s | %.0f%% | %.0f (%s) | %.0f MiB | %.0f MiB |" % (
        name(cfg), st, tt, " (bf16 autocast)" if bf16 else "", st / tt, statistics.median(rr),
        min(rr), max(rr), med("skyloom", cfg, "step_s"), med("torch", cfg, "step_s"),
        100 * med("skyloom", cfg, "sgemm_share"), med("skyloom", cfg, "sgemm_gflops"), plain,
        med("skyloom", cfg, "peak_rss_mb"), med("torch", cfg, "peak_rss_mb")))
print("(medians of %d alternating runs each; every run's own figure is the median of its steps)" %
      max(1, len([r for r in rows if r["impl"] == "skyloom"]) // max(1, len({r["config"] for r in rows}))))
PY
