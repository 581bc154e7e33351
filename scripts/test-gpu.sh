#!/usr/bin/env bash
# make test-gpu: everything that needs an NVIDIA GPU, in one run of under
# eight minutes on a machine that has one (docs/kernels.md):
#   1. a build with CUDA required, compiled for this GPU's architecture only;
#   2. the CUDA tests (meson suite `cuda`): every CUDA op against the CPU op,
#      fp32 and bf16 (test_kn_cuda), whole training runs on the GPU against
#      the CPU within tolerances, fp32 and bf16 (test_dev_cuda), the shadow
#      backend, and skyloom train --device cuda;
#   3. skyloom train on the GPU against the CPU end to end: 20 steps of a
#      small BERT, fp32 and bf16, the losses within tolerance;
#   4. a short benchmark: one training step of configs (b) and BERT-base,
#      fp32 and bf16, on the GPU and on the CPU (bench_train).
# Writes its report to $OUT/test-gpu.md (or BUILD/test-gpu.md) and exits
# non-zero when a test failed. Usage: scripts/test-gpu.sh [BUILD]
# (default build-gpu); env STEPS (benchmark steps, default 5).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build-gpu}
steps=${STEPS:-5}
export PATH="$PATH:/usr/local/cuda/bin"
t0=$(date +%s)
out=${OUT:-$build}
mkdir -p "$out"
report="$out/test-gpu.md"
log="$out/test-gpu.log"
: >"$log"
say() { echo "$*" | tee -a "$report"; }
: >"$report"
fail=0

say "# make test-gpu, $(date -u '+%Y-%m-%d %H:%M UTC')"
say ""
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  say "no GPU here (nvidia-smi finds none): nothing to run"
  exit 1
fi
gpu=$(nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader | head -1)
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
say "GPU: $gpu; CPU: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores)"
say "commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?')"

# 1. the build
say ""
say "## build (-Dcuda=enabled -Dgpu_arch=$cap)"
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$here" -Dcuda=enabled -Dgpu_arch="$cap" -Dbuildtype=debugoptimized >>"$log" 2>&1 ||
    { say "meson setup failed (see $log)"; exit 1; }
fi
if ! ninja -C "$build" >>"$log" 2>&1; then
  say "build failed:"
  grep -E "error" "$log" | head -20 | tee -a "$report"
  exit 1
fi
say "built in $(( $(date +%s) - t0 )) s"

# 2. the CUDA tests
say ""
say "## CUDA tests (meson test --suite cuda)"
meson test -C "$build" --suite cuda --print-errorlogs --num-processes 1 >>"$log" 2>&1 || fail=1
for t in kn_cuda dev_cuda dev_backend train_cli; do
  line=$(grep -E "^ *[0-9]+/[0-9]+ .*[ /]$t +" "$build/meson-logs/testlog.txt" | tail -1)
  [ -n "$line" ] || line=$(grep -E " $t " "$log" | grep -E "OK|FAIL|SKIP" | tail -1)
  say "- $t: $(sed -E 's/^ *[0-9]+\/[0-9]+ +[^ ]+ \/ [^ ]+ +//' <<<"$line")"
done
say ""
say "measured differences, GPU against CPU (rel = max error / max |reference|):"
say '```'
grep -E "^    .* rel [0-9]" "$build/meson-logs/testlog.txt" | sed 's/^ *//' | tee -a "$report" >/dev/null
grep -E "(bitwise equal|within tolerance|DIFFERENT) on cuda|not compared" "$build/meson-logs/testlog.txt" |
  sed 's/^ *//' | tee -a "$report" >/dev/null
say '```'

# 3. skyloom train on both, end to end
say ""
say "## skyloom train, GPU against CPU (20 steps, small BERT)"
sk="$build/cli/skyloom"
d=$(mktemp -d /tmp/skyloom-gpu-XXXXXX)
trap 'rm -rf "$d"' EXIT
cat "$here"/README.md "$here"/docs/*.md >"$d/corpus.txt"
"$sk" -q data vocab --corpus "$d/corpus.txt" --size 1000 --out "$d/vocab.txt" >>"$log" 2>&1
"$sk" -q data prepare --vocab "$d/vocab.txt" --in "$d/corpus.txt" --out "$d/text.shard" --seq 64 >>"$log" 2>&1
V=$(wc -l <"$d/vocab.txt")
cat >"$d/cfg.json" <<JSON
{"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512,
 "vocab_size": $V, "max_position_embeddings": 64}
JSON
for prec in fp32 bf16; do
  for dev in cpu cuda; do
    "$sk" -q train --config "$d/cfg.json" --data "$d/text.shard" --steps 20 --batch 16 --lr 1e-3 \
        --device "$dev" --precision "$prec" --metrics "$d/$prec-$dev.csv" --json \
        >"$d/$prec-$dev.json" 2>"$d/$prec-$dev.err" || true
  done
  if [ -s "$d/$prec-cpu.csv" ] && [ -s "$d/$prec-cuda.csv" ]; then
    tol=$([ $prec = fp32 ] && echo 1e-3 || echo 1e-2)
    if python3 - "$d/$prec-cpu.csv" "$d/$prec-cuda.csv" "$tol" <<'PY' | tee -a "$report"; then :; else fail=1; fi
import sys
a = [float(l.split(",")[1]) for l in open(sys.argv[1]).read().split()[1:]]
b = [float(l.split(",")[1]) for l in open(sys.argv[2]).read().split()[1:]]
tol = float(sys.argv[3])
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
ok = len(a) == len(b) == 20 and worst <= tol
print("- %s: step 1 loss cpu %.6f gpu %.6f, step 20 cpu %.6f gpu %.6f; worst relative difference over the 20 steps %.2e (bar %g) %s"
      % (sys.argv[1].rsplit("/", 1)[1].split("-")[0], a[0], b[0], a[-1], b[-1], worst, tol, "ok" if ok else "FAIL"))
sys.exit(0 if ok else 1)
PY
  else
    say "- $prec: a run failed: $(cat "$d"/$prec-*.err 2>/dev/null | head -2)"
    [ $prec = fp32 ] && fail=1
  fi
done

# 4. the benchmark
say ""
say "## one training step, GPU against CPU (bench_train, seq 128, batch 8, $steps steps after a warm-up)"
say ""
say "| config | device | precision | step | tokens/s | products' share | products' GFLOP/s | peak RSS |"
say "|---|---|---|---|---|---|---|---|"
for c in b b+p c c+p; do
  for dev in cuda cpu; do
    s=$steps
    [ "$dev" = cpu ] && [ "${c%%+*}" = c ] && s=2
    j=$(OMP_NUM_THREADS=$(nproc) timeout 120 "$build/bench/bench_train" "$c" "$s" "$(nproc)" "$dev" 2>>"$log")
    if [ -z "$j" ]; then
      say "| $c | $dev | | failed or over 120 s | | | | |"
      continue
    fi
    python3 - "$j" "$c" "$dev" <<'PY' | tee -a "$report"
import json, sys
r = json.loads(sys.argv[1])
print("| %s | %s | %s | %.4f s | %.0f | %.0f%% | %.0f | %.0f MiB |" % (
    {"b": "(b) L4 H256", "c": "(c) BERT-base"}[sys.argv[2][0]], sys.argv[3],
    "bf16" if "+p" in sys.argv[2] else "fp32", r["step_s"], r["tokens_per_s"],
    100 * r["sgemm_share"], r["sgemm_gflops"], r["peak_rss_mb"]))
PY
  done
done
say ""
say "(on the GPU the products' share and GFLOP/s are host time around asynchronous calls: not meaningful there)"
say ""
say "total $(( $(date +%s) - t0 )) s; $( [ $fail = 0 ] && echo 'all passed' || echo 'FAILURES: see above and test-gpu.log')"
exit $fail
