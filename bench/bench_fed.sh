#!/usr/bin/env bash
# Federation in the trainer (docs/federation.md): what replicas exchange per
# step and the loss after the same tokens, for --sync step with codec none,
# int8 and topk:0.01, and outer:50 with int8, on the demo model
# (configs/bert-tiny.json) and two owners of the fortunes corpus split by
# subject (humanities / computing and science), 16 sequences of 64 tokens
# each per step. Every run reads the same tokens; each ends with the
# held-out loss of its model on each owner's sequences it never trained on.
#
# Usage: bench/bench_fed.sh SKYLOOM [STEPS] (default 300; STEPS a multiple
# of 50). Prints a markdown table.
# env: CONFIG (configs/bert-tiny.json; configs/bert-b.json is config (b)),
#      SEQ (64), BATCH (16 sequences per owner per step), LR (1e-3),
#      VARIANTS ("SYNC|CODEC[|MOMENTUM] ..."; MOMENTUM the outer momentum
#      of an outer run, DiLoCo's 0.9 when left out), OUTER (more options
#      for the outer runs: "--outer-lr X"), SVG (a file: every run's training
#      loss per step, a moving average of 10 steps, in one SVG)
set -euo pipefail
sk=${1:?usage: bench/bench_fed.sh SKYLOOM [STEPS]}
steps=${2:-300}
src=$(cd "$(dirname "$0")/.." && pwd)
d=$(mktemp -d /tmp/skyloom-bench-fed-XXXXXX)
trap 'rm -rf "$d"' EXIT
"$src/scripts/fed-corpus.sh" "$d" 2>/dev/null
cat "$d/hum.txt" "$d/tech.txt" > "$d/all.txt"
config=${CONFIG:-$src/configs/bert-tiny.json}
seq=${SEQ:-64} batch=${BATCH:-16} lr=${LR:-1e-3}
variants=${VARIANTS:-"step|none step|int8 step|topk:0.01 outer:50|int8 outer:50|none outer:50|int8|0.5 outer:50|none|0.5"}
V=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$config")
"$sk" -q data vocab --corpus "$d/all.txt" --size "$V" --out "$d/vocab.txt" >/dev/null
for o in hum tech; do
  "$sk" -q data prepare --vocab "$d/vocab.txt" --in "$d/$o.txt" --out "$d/$o.shard" --seq "$seq" >/dev/null
done
count() { "$sk" data inspect "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["sequences"])'; }
nh=$(count "$d/hum.shard") nt=$(count "$d/tech.shard")
# each owner trains on its first 90% and is evaluated on the rest
kh=$((nh * 9 / 10)) kt=$((nt * 9 / 10))
echo "owners: humanities $nh sequences (train $kh), computing/science $nt (train $kt); $(nproc) cores"
echo "config $(basename "$config"), $seq tokens per sequence, $batch sequences per owner per step, lr $lr${OUTER:+; outer: $OUTER}"
common=(--config "$config" --steps "$steps" --owner-batch "$batch,$batch" --micro-batches 4 --lr "$lr"
        --data "$d/hum.shard" --data "$d/tech.shard" --log-every 1000000)
echo
echo "| run | sync bytes per step | against step/none | mean train loss, last 20 steps | held-out loss humanities | held-out loss computing | seconds |"
echo "|---|---|---|---|---|---|---|"
base="" nrun=0
for v in $variants; do
  IFS='|' read -r sync codec mom <<<"$v"
  name="$(tr ':' '_' <<<"$sync")-$(tr ':' '_' <<<"$codec")${mom:+-m$mom}"
  t0=$(date +%s.%N)
  # --sequences limits every owner's shard alike: the smaller owner's 90%
  outer=() label="$sync / $codec"
  if [ "${sync%%:*}" = outer ]; then
    read -ra outer <<<"${OUTER:-}"
    outer+=(--outer-momentum "${mom:-0.9}")
    label+=", momentum ${mom:-0.9}"
  fi
  "$sk" -q train "${common[@]}" --sync "$sync" --codec-sync "$codec" "${outer[@]}" \
      --sequences $((kh < kt ? kh : kt)) --save "$d/$name" >/dev/null
  t1=$(date +%s.%N)
  per=$(awk -F, 'NR > 1 { s += $NF; n++ } END { printf "%.0f", s / n }' "$d/$name/metrics.csv")
  last=$(awk -F, 'NR > 1 { a[NR] = $2 } END { s = 0; for (i = NR - 19; i <= NR; i++) s += a[i]; printf "%.4f", s / 20 }' "$d/$name/metrics.csv")
  ev() { "$sk" -q eval --config "$config" --model "$d/$name/step-$steps/model.safetensors" \
             --data "$1" --first "$2" --batches 20 --batch "$batch" --json |
         python3 -c 'import json,sys; print("%.4f" % json.load(sys.stdin)["loss"])'; }
  eh=$(ev "$d/hum.shard" "$kh") et=$(ev "$d/tech.shard" "$kt")
  [ -z "$base" ] && base=$per
  nrun=$((nrun + 1)) && tag=$(printf '%02d' "$nrun")
  mkdir -p "$d/curves" && cp "$d/$name/metrics.csv" "$d/curves/$tag-$name.csv"
  echo "$label" > "$d/curves/$tag-$name.label"
  echo "| $label | $per | $(awk -v a="$base" -v b="$per" 'BEGIN { printf "%.1fx less", a / b }') | $last | $eh | $et | $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", b - a }') |"
done
[ -n "${SVG:-}" ] || exit 0
python3 - "$d/curves" "$SVG" "$(basename "$config") $steps steps" <<'PY'
import csv, glob, os, sys
src, out, title = sys.argv[1], sys.argv[2], sys.argv[3]
runs = []
for f in sorted(glob.glob(os.path.join(src, "*.csv"))):
    loss = [float(r["loss"]) for r in csv.DictReader(open(f))]
    avg = [sum(loss[max(0, i - 9):i + 1]) / len(loss[max(0, i - 9):i + 1]) for i in range(len(loss))]
    runs.append((open(f[:-4] + ".label").read().strip(), avg))
W, H, L, R, T, B = 760, 420, 60, 250, 30, 40
n = max(len(a) for _, a in runs)
lo = min(min(a[n // 10:] or a) for _, a in runs)
hi = max(max(a[n // 10:] or a) for _, a in runs)
lo, hi = lo - 0.02 * (hi - lo), hi + 0.02 * (hi - lo)
x = lambda i: L + (W - L - R) * i / max(1, n - 1)
y = lambda v: T + (H - T - B) * (hi - min(max(v, lo), hi)) / (hi - lo)
colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
     f'<rect width="{W}" height="{H}" fill="white"/>',
     f'<text x="{L}" y="18">training loss (moving average of 10 steps), {title}</text>',
     f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
     f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>']
for k in range(5):
    v = lo + (hi - lo) * k / 4
    o.append(f'<text x="{L - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    s = round((n - 1) * k / 4)
    o.append(f'<text x="{x(s):.1f}" y="{H - B + 16}" text-anchor="middle">{s + 1}</text>')
o.append(f'<text x="{(L + W - R) / 2}" y="{H - 6}" text-anchor="middle">step</text>')
for j, (label, a) in enumerate(runs):
    c = colors[j % len(colors)]
    pts = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(a) if i >= n // 10)
    o.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.3" points="{pts}"/>')
    o.append(f'<line x1="{W - R + 12}" y1="{T + 18 * j}" x2="{W - R + 32}" y2="{T + 18 * j}" stroke="{c}" stroke-width="2"/>')
    o.append(f'<text x="{W - R + 38}" y="{T + 18 * j + 4}">{label}</text>')
o.append("</svg>")
open(out, "w").write("\n".join(o) + "\n")
PY
