#!/usr/bin/env bash
# bf16 against fp32 in training quality (docs/training.md): STEPS (300) steps
# of the demo model (configs/bert-tiny.json: seq 64, batch 16, lr 1e-3, as
# make demo trains it) and of config (b) (L4 H256 A4 F1024 V8192: seq 128,
# batch 8, lr 5e-4) on the fortunes corpus, each with --precision fp32 and
# --precision bf16 from the same seed, the same data; then the mean loss of
# the last 20 steps of each, and each final model evaluated on held-out
# sequences in both precisions. Prints a markdown table; exits 1 when a
# bf16 run's last-20 mean is not within 1% of fp32's, or an evaluation in
# the two precisions not within 0.5%.
# usage: bench_precision.sh SKYLOOM [STEPS]   (env THREADS, default 2)
set -euo pipefail
sk=${1:?usage: bench_precision.sh SKYLOOM [STEPS]}
steps=${2:-300}
threads=${THREADS:-2}
here=$(cd "$(dirname "$0")" && pwd)
d=$(mktemp -d /tmp/skyloom-precision-XXXXXX)
trap 'rm -rf "$d"' EXIT

# the demo model's data, as scripts/demo.sh makes it
"$here/../scripts/demo-corpus.sh" "$d/corpus.txt"
"$sk" -q data vocab --corpus "$d/corpus.txt" --size 4096 --out "$d/vocab4k.txt" >/dev/null
"$sk" -q data prepare --vocab "$d/vocab4k.txt" --in "$d/corpus.txt" --out "$d/demo.shard" --seq 64 >/dev/null
# config (b)'s, as the other benchmarks make it
"$here/config_b.sh" "$sk" "$d" 128

# train on the first 90% of a shard's sequences, evaluate on the rest
held() { "$sk" data inspect "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["sequences"] * 9 // 10)'; }
run() { # run NAME CONFIG SHARD BATCH LR PRECISION
  local name=$1 cfg=$2 shard=$3 batch=$4 lr=$5 prec=$6
  "$sk" -q train --config "$cfg" --data "$shard" --steps "$steps" --batch "$batch" --lr "$lr" \
      --sequences "$(held "$shard")" --threads "$threads" --precision "$prec" \
      --save "$d/$name-$prec" --json >"$d/$name-$prec.json"
}
for prec in fp32 bf16; do
  run demo "$here/../configs/bert-tiny.json" "$d/demo.shard" 16 1e-3 "$prec"
  run b "$d/b.json" "$d/b.shard" 8 5e-4 "$prec"
done

evals() { # evals NAME CONFIG SHARD: the fp32-trained model evaluated in fp32 and bf16
  local name=$1 cfg=$2 shard=$3
  for prec in fp32 bf16; do
    "$sk" -q eval --config "$cfg" --model "$d/$name-fp32/step-$steps/model.safetensors" \
        --data "$shard" --first "$(held "$shard")" --batches 20 --batch 16 --precision "$prec" --json \
        >"$d/eval-$name-$prec.json"
  done
}
evals demo "$here/../configs/bert-tiny.json" "$d/demo.shard"
evals b "$d/b.json" "$d/b.shard"

python3 - "$d" "$steps" <<'PY'
import json, sys
d, steps = sys.argv[1], int(sys.argv[2])
def losses(name):
    rows = open(f"{d}/{name}/metrics.csv").read().split()[1:]
    return [float(r.split(",")[1]) for r in rows]
def ev(name, prec):
    return json.load(open(f"{d}/eval-{name}-{prec}.json"))["loss"]
ok = True
print("| model | steps | fp32: first 20 / last 20 (mean loss) | bf16: first 20 / last 20 | last 20, bf16 against fp32 | tok/s fp32 / bf16 | held-out eval of the fp32 model: fp32 / bf16 precision | eval difference |")
print("|---|---|---|---|---|---|---|---|")
for name, label in (("demo", "demo (L2 H128, seq 64, batch 16)"), ("b", "(b) L4 H256 (seq 128, batch 8)")):
    a, b = losses(f"{name}-fp32"), losses(f"{name}-bf16")
    la, lb = sum(a[-20:]) / 20, sum(b[-20:]) / 20
    fa, fb = sum(a[:20]) / 20, sum(b[:20]) / 20
    ta = json.load(open(f"{d}/{name}-fp32.json"))["tokens_per_s"]
    tb = json.load(open(f"{d}/{name}-bf16.json"))["tokens_per_s"]
    e32, e16 = ev(name, "fp32"), ev(name, "bf16")
    rel, erel = (lb - la) / la, (e16 - e32) / e32
    ok &= abs(rel) <= 0.01 and abs(erel) <= 0.005
    print("| %s | %d | %.5f / %.5f | %.5f / %.5f | %+.3f%% | %.0f / %.0f | %.5f / %.5f | %+.4f%% |" % (
        label, steps, fa, la, fb, lb, 100 * rel, ta, tb, e32, e16, 100 * erel))
print("(bars: last-20 mean within 1%%, evaluation within 0.5%%: %s)" % ("met" if ok else "MISSED"))
sys.exit(0 if ok else 1)
PY
