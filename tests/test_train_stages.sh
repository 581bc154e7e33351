#!/usr/bin/env bash
# skyloom train --stages: a pipeline of stages on threads gives bit for bit
# the one-stage run (the same losses in metrics.csv, the same
# model.safetensors bytes) for any cut, either schedule, any micro-batch
# count, dropout on, AdamW and LAMB, bf16 moments, recomputation, bf16
# compute (--precision bf16); a checkpoint written by one cut resumes under
# another exactly, and one written in one precision resumes in the other; a
# bad SPEC is refused with one line naming the problem.
set -u
sk="$1"; src="$2"
fail=0
check() { local desc="$1"; shift; if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi; }
d=$(mktemp -d /tmp/skyloom-stages-XXXXXX)
trap 'rm -rf "$d"' EXIT
cat "$src"/README.md "$src"/docs/*.md > "$d/corpus.txt"
"$sk" -q data vocab --corpus "$d/corpus.txt" --size 400 --out "$d/vocab.txt" >/dev/null
"$sk" -q data prepare --vocab "$d/vocab.txt" --in "$d/corpus.txt" --out "$d/text.shard" --seq 24 >/dev/null
V=$(wc -l < "$d/vocab.txt")
# 3 layers (units 0..4), dropout on
cat > "$d/cfg.json" <<JSON
{"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2, "intermediate_size": 48,
 "vocab_size": $V, "max_position_embeddings": 24, "hidden_dropout_prob": 0.1,
 "attention_probs_dropout_prob": 0.1}
JSON
common=(--config "$d/cfg.json" --data "$d/text.shard" --batch 8 --lr 2e-3 --warmup 2 --clip 0.5)

# run NAME ARGS...: 6 steps saved at 3 and 6
run() {
  local name="$1"; shift
  "$sk" -q train "${common[@]}" --steps 6 --save "$d/$name" --save-every 3 "$@" >/dev/null 2>"$d/$name.err"
}
same() { # same A B: the losses and the final model bytes
  cmp -s "$d/$1/step-6/model.safetensors" "$d/$2/step-6/model.safetensors" &&
  [ "$(cut -d, -f1-4 "$d/$1/metrics.csv")" = "$(cut -d, -f1-4 "$d/$2/metrics.csv")" ]
}

variants=(
  "adamw|--micro-batches 4"
  "lamb|--micro-batches 4 --optimizer lamb"
  "bf16|--micro-batches 4 --optim-state bf16"
  "rec|--micro-batches 4 --recompute"
  "attn|--micro-batches 2 --recompute-attention"
)
# bf16 compute where the CPU has it (AVX512_BF16 or AMX); elsewhere the
# refusal is what there is to check
out=$("$sk" train "${common[@]}" --steps 1 --precision bf16 --save "$d/probe" 2>&1); rc=$?
if [ $rc -eq 0 ]; then
  have_bf16=1
  variants+=("prec|--micro-batches 4 --precision bf16"
             "precrec|--micro-batches 4 --precision bf16 --recompute --optim-state bf16")
else
  have_bf16=0
  check "--precision bf16 on a CPU without bf16: exit 1 naming the instructions" \
      bash -c 'test $0 -eq 1 && grep -q "AVX512_BF16" <<<"$1"' "$rc" "$out"
  echo "skip bf16 compute (this CPU has none): $out"
fi
for v in "${variants[@]}"; do
  name=${v%%|*}; read -r -a args <<<"${v#*|}"
  run "$name-1" "${args[@]}"
  check "$name: the one-stage reference runs" test -s "$d/$name-1/step-6/model.safetensors"
  cuts=("2" "0-0,1-4" "0-2,3-3,4-4")
  [ "$name" = adamw ] && cuts+=("4")
  [ "$name" = attn ] && cuts=("2" "0-3,4-4")
  [ "$name" = precrec ] && cuts=("0-2,3-3,4-4")
  for cut in "${cuts[@]}"; do
    for sched in 1f1b gpipe; do
      [ "$name" != adamw ] && [ "$sched" = gpipe ] && [ "$cut" != 2 ] && continue
      tag="$name-$(tr ',' '_' <<<"$cut")-$sched"
      run "$tag" "${args[@]}" --stages "$cut" --schedule "$sched" --stage-threads 1
      check "$name: --stages $cut --schedule $sched equals one stage (losses, model bytes)" same "$name-1" "$tag"
    done
  done
done

# Resume under another cut: 2 stages saved step 3, continued as 3 stages,
# equal to the uninterrupted one-stage run (fp32 and bf16 moments).
for v in "adamw|" "bf16|--optim-state bf16"; do
  name=${v%%|*}; read -r -a args <<<"${v#*|}"
  "$sk" -q train "${common[@]}" --micro-batches 4 --steps 6 --stages 0-1,2-4 --resume "$d/$name-1/step-3" \
      --save "$d/r-$name" --stage-threads 1 "${args[@]}" >/dev/null 2>&1
  check "$name: resumed from the one-stage run's step 3 as 2 stages: same model" \
      cmp -s "$d/$name-1/step-6/model.safetensors" "$d/r-$name/step-6/model.safetensors"
  "$sk" -q train "${common[@]}" --micro-batches 4 --steps 6 --stages 0-2,3-3,4-4 \
      --resume "$d/$name-2-1f1b/step-3" --save "$d/r3-$name" --stage-threads 1 "${args[@]}" >/dev/null 2>&1
  check "$name: 2 stages for 3 steps, then 3 stages with other cuts for 3 more: the 6-step one-stage model" \
      cmp -s "$d/$name-1/step-6/model.safetensors" "$d/r3-$name/step-6/model.safetensors"
  check "$name: ... and its steps 4-6 have the one-stage losses" \
      bash -c '[ "$(sed -n 5,7p "$0" | cut -d, -f1-4)" = "$(sed -n 2,4p "$1" | cut -d, -f1-4)" ]' \
      "$d/$name-1/metrics.csv" "$d/r3-$name/metrics.csv"
done
# A checkpoint written in one precision resumes in the other (weights and
# moments are fp32 in both): fp32's step 3 continued in bf16 and bf16's in
# fp32, in one stage and in 3 stages with the same bits, the losses of steps
# 4-6 within 1% of the uninterrupted run's in the checkpoint's precision.
if [ $have_bf16 = 1 ]; then
  for v in "adamw|bf16" "prec|fp32"; do
    from=${v%%|*} to=${v#*|}
    "$sk" -q train "${common[@]}" --micro-batches 4 --steps 6 --resume "$d/$from-1/step-3" \
        --save "$d/x-$from" --precision "$to" >/dev/null 2>"$d/x-$from.err"
    check "$from's checkpoint resumes in $to" test -s "$d/x-$from/step-6/model.safetensors"
    "$sk" -q train "${common[@]}" --micro-batches 4 --steps 6 --resume "$d/$from-1/step-3" \
        --save "$d/x3-$from" --precision "$to" --stages 0-2,3-3,4-4 --stage-threads 1 >/dev/null 2>&1
    check "... the same bits resumed as 3 stages" \
        cmp -s "$d/x-$from/step-6/model.safetensors" "$d/x3-$from/step-6/model.safetensors"
    check "... its steps 4-6 within 1% of the uninterrupted run's losses" \
        python3 -c 'import sys
a = [float(l.split(",")[1]) for l in open(sys.argv[1]).read().split()[1:]][3:]
b = [float(l.split(",")[1]) for l in open(sys.argv[2]).read().split()[1:]]  # steps 4-6
print("     losses 4-6: %s against %s" % (b, a))
sys.exit(not (len(a) == len(b) == 3 and all(abs(x - y) <= 0.01 * y for x, y in zip(b, a))))' \
        "$d/$from-1/metrics.csv" "$d/x-$from/metrics.csv"
  done
fi
check "a checkpoint of 2 stages is one model.safetensors and one optim.safetensors with a manifest" \
    bash -c 'test -s "$0/model.safetensors" && test -s "$0/optim.safetensors" && grep -q "\"blake2b\"" "$0/manifest.json"' "$d/adamw-2-1f1b/step-6"

# Bad SPECs: exit 2 and one line naming the problem.
bad() { # bad DESC PATTERN SPEC [ARGS]
  local desc="$1" pat="$2" spec="$3"; shift 3
  local out rc
  out=$("$sk" train "${common[@]}" --micro-batches 4 --steps 1 --stages "$spec" "$@" 2>&1); rc=$?
  check "--stages $spec: $desc" bash -c 'test $0 -eq 2 && [ $(wc -l <<<"$1") -eq 1 ] && grep -q "$2" <<<"$1"' "$rc" "$out" "$pat"
  echo "     $out"
}
bad "a unit left out" "unit 2 left out" "0-1,3-4"
bad "units left out at the end" "units 3-4 left out" "0-1,2-2"
bad "overlapping ranges" "overlaps" "0-2,2-4"
bad "out of range" "out of range" "0-2,3-7"
bad "not a range" "not a count or a range" "0-2,x"
bad "more stages than micro-batches" "need at least 5 micro-batches" "5"
bad "more stages than units" "at most 5 stages" "9" --micro-batches 8 --batch 8
out=$("$sk" train "${common[@]}" --steps 1 --precision fp16 2>&1); rc=$?
check "--precision fp16: exit 2 naming the choices" bash -c 'test $0 -eq 2 && grep -q "fp32 or bf16" <<<"$1"' "$rc" "$out"
out=$("$sk" train "${common[@]}" --micro-batches 4 --steps 1 --stages 2 --schedule zigzag 2>&1); rc=$?
check "--schedule zigzag: exit 2 naming it" bash -c 'test $0 -eq 2 && grep -q "1f1b or gpipe" <<<"$1"' "$rc" "$out"
out=$("$sk" train "${common[@]}" --micro-batches 4 --steps 1 --stages 2 --stage-device cpu,cpu,cpu 2>&1); rc=$?
check "--stage-device with 3 entries for 2 stages: refused" bash -c 'test $0 -ne 0 && grep -q "3 devices for 2 stages" <<<"$1"' "$rc" "$out"
out=$("$sk" train "${common[@]}" --micro-batches 4 --steps 1 --stages 2 --stage-device cpu,cuda 2>&1); rc=$?
if [ $rc -ne 0 ]; then
  check "--stage-device cpu,cuda without a GPU: refused with the reason" bash -c 'grep -q "stage 1: .*\(CUDA\|cuda\|GPU\)" <<<"$0"' "$out"
  echo "     $out"
fi
exit $fail
