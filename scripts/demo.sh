#!/usr/bin/env bash
# make demo: trains a small BERT on real text on this machine for about two
# minutes, then prints the loss at the start and the end and where the
# checkpoint is. The corpus is the fortune-cookie files (scripts/demo-corpus.sh,
# Debian package `fortunes`), tokenized with a WordPiece vocabulary learned on
# it. Later issues turn this into the federated run.
# Usage: scripts/demo.sh [BUILD_DIR]   env: DEMO_SECONDS (120), THREADS (all cores)
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
sk="$build/cli/skyloom"
[ -x "$sk" ] || { echo "demo: $sk not found: run make build first" >&2; exit 1; }
secs=${DEMO_SECONDS:-120}
threads=${THREADS:-$(nproc)}
dir="$build/demo"
mkdir -p "$dir"
config="$root/configs/bert-tiny.json"
vocab_size=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$config")
seq=64 batch=16
held=20000 # sequences 0..19999 train (shuffled every epoch); the rest are held out

echo "== corpus, vocabulary and shard"
[ -s "$dir/corpus.txt" ] || "$root/scripts/demo-corpus.sh" "$dir/corpus.txt"
[ -s "$dir/vocab.txt" ] || "$sk" -q data vocab --corpus "$dir/corpus.txt" --size "$vocab_size" --out "$dir/vocab.txt"
[ -s "$dir/demo.shard" ] || "$sk" -q data prepare --vocab "$dir/vocab.txt" --in "$dir/corpus.txt" --out "$dir/demo.shard" --seq "$seq"
"$sk" data inspect "$dir/demo.shard" | sed -n '1,6p'

echo "== model: $config (batch $batch x $seq tokens, $threads threads)"
# Calibrate: how many steps fit in the time budget on this machine now (80%
# of the measured speed, so the learning-rate schedule usually completes;
# --max-time stops a run that is slower than measured).
tps=$("$sk" -q train --config "$config" --data "$dir/demo.shard" --steps 8 --batch "$batch" \
      --threads "$threads" --metrics "$dir/calibrate.csv" --json |
      sed -n 's/.*"tokens_per_s": *\([0-9.]*\).*/\1/p')
steps=$(awk -v t="$tps" -v s="$secs" -v n=$((batch * seq)) 'BEGIN { k = int(0.8 * t * s / n); print (k < 20 ? 20 : k) }')
echo "== training: about $secs s at ~${tps%.*} tokens/s -> $steps steps"
rm -rf "$dir/run"
"$sk" -q train --config "$config" --data "$dir/demo.shard" --steps "$steps" --batch "$batch" \
    --lr 1e-3 --threads "$threads" --save "$dir/run" --save-every 500 --max-time $((secs + secs / 4)) \
    --sequences "$held"
ckpt="$dir/run/$(cat "$dir/run/latest")"
n=$(($(wc -l < "$dir/run/metrics.csv") - 1))
k=$(( n < 40 ? n / 4 + 1 : 10 ))
read -r first last < <(awk -F, -v k="$k" -v n="$n" 'NR>1 && NR<=k+1 {a+=$2} NR>n+1-k {b+=$2} END {printf "%.3f %.3f\n", a/k, b/k}' "$dir/run/metrics.csv")
echo
echo "== result"
echo "loss (mean of $k steps): start $first -> end $last after $n steps (ln vocab = $(awk -v v="$vocab_size" 'BEGIN{printf "%.2f", log(v)}'))"
printf 'held-out '
"$sk" -q eval --config "$ckpt/config.json" --model "$ckpt/model.safetensors" --data "$dir/demo.shard" \
    --first "$held" --batches 20 --batch 16
echo "checkpoint: $ckpt (model.safetensors with Hugging Face BERT names, optim.bin, config.json, data.json)"
echo "metrics:    $dir/run/metrics.csv"
