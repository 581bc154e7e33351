#!/usr/bin/env bash
# skyloom train / eval end to end on real text (this repository's own
# documentation as the corpus): a tiny BERT's loss falls within 300 steps,
# in fp32 and in bf16 alike; checkpoints are written atomically and resume;
# eval reads them, in either precision; bad input gives one line and the
# right exit status.
set -u
sk="$1"; src="$2"
fail=0
check() { local desc="$1"; shift; if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi; }
d=$(mktemp -d /tmp/skyloom-train-XXXXXX)
trap 'rm -rf "$d"' EXIT
cat "$src"/README.md "$src"/docs/*.md > "$d/corpus.txt"
"$sk" -q data vocab --corpus "$d/corpus.txt" --size 600 --out "$d/vocab.txt" >/dev/null
"$sk" -q data prepare --vocab "$d/vocab.txt" --in "$d/corpus.txt" --out "$d/text.shard" --seq 32 >/dev/null
check "a shard from real text" test -s "$d/text.shard"
V=$(wc -l < "$d/vocab.txt")
cat > "$d/tiny.json" <<JSON
{"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
 "vocab_size": $V, "max_position_embeddings": 32, "hidden_dropout_prob": 0.0,
 "attention_probs_dropout_prob": 0.0}
JSON
out=$("$sk" -q train --config "$d/tiny.json" --data "$d/text.shard" --steps 300 --batch 16 \
      --lr 3e-3 --warmup 20 --threads 1 --save "$d/run" --save-every 150 --json); rc=$?
check "train exits 0" test $rc -eq 0
check "metrics.csv has a header and 300 steps" bash -c '[ "$(head -1 "$0")" = "step,loss,masked,grad_norm,lr,seconds,tokens_per_s" ] && [ $(wc -l < "$0") -eq 301 ]' "$d/run/metrics.csv"
# mean loss of the first and the last 20 steps
read -r first last < <(awk -F, 'NR>1 && NR<=21 {a+=$2} NR>281 {b+=$2} END {printf "%.4f %.4f\n", a/20, b/20}' "$d/run/metrics.csv")
echo "     loss: first 20 steps $first, last 20 steps $last (ln V = $(awk -v v="$V" 'BEGIN{printf "%.2f", log(v)}'))"
check "loss falls by at least 0.5 on real text" awk -v a="$first" -v b="$last" 'BEGIN{exit !(b < a - 0.5)}'
check "the JSON summary names the checkpoint" grep -q "\"checkpoint\": \"$d/run/step-300\"" <<<"$out"
check "checkpoints at 150 and 300, latest names 300" bash -c 'test -s "$0/step-150/model.safetensors" && test -s "$0/step-300/optim.safetensors" && test -s "$0/step-300/manifest.json" && test -s "$0/step-300/config.json" && [ "$(cat "$0/latest")" = step-300 ]' "$d/run"
check "no temporary files left" bash -c '! ls "$0"/*.tmp* "$0"/*/*.tmp* 2>/dev/null | grep -q .' "$d/run"
ev=$("$sk" -q eval --config "$d/run/step-300/config.json" --model "$d/run/step-300/model.safetensors" --data "$d/text.shard" --batches 4 --json); rc=$?
check "eval exits 0 with a loss" bash -c 'test $0 -eq 0 && grep -q "\"loss\":" <<<"$1"' "$rc" "$ev"
check "a checkpoint records its learning-rate schedule (schedule.json, in the manifest)" bash -c 'grep -q "\"steps\": 300" "$0/schedule.json" && grep -q "schedule.json" "$0/manifest.json"' "$d/run/step-150"
# OpenMP's wait: a short spin unless the environment says otherwise (libgomp
# reads it when it loads, so train starts itself again with it)
spin_of() {  # spin_of ENV...: GOMP_SPINCOUNT and OMP_WAIT_POLICY of a running train
  env "$@" "$sk" -q train --config "$d/tiny.json" --data "$d/text.shard" --steps 1000000 --batch 4 \
      --threads 1 --log-every 1000000 >/dev/null 2>&1 & local p=$! n=0 e=""
  while [ $n -lt 100 ]; do
    e=$(tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -E '^(GOMP_SPINCOUNT|OMP_WAIT_POLICY)=' | sort | paste -sd' ')
    [ -n "$e" ] && break
    sleep 0.1; n=$((n + 1))
  done
  kill $p 2>/dev/null; wait $p 2>/dev/null
  echo "$e"
}
check "train without OpenMP settings spins 10000 before it sleeps" test "$(spin_of)" = "GOMP_SPINCOUNT=10000"
check "an explicit GOMP_SPINCOUNT is kept" test "$(spin_of GOMP_SPINCOUNT=500)" = "GOMP_SPINCOUNT=500"
check "an explicit OMP_WAIT_POLICY is kept, no spin count added" \
    test "$(spin_of OMP_WAIT_POLICY=active)" = "OMP_WAIT_POLICY=active"
"$sk" -q train --config "$d/tiny.json" --data "$d/text.shard" --steps 300 --batch 16 --lr 3e-3 --warmup 20 --threads 1 --stop-at 40 --save "$d/stop" >/dev/null; rc=$?
check "--stop-at: a run's first steps, saved at the stop, the same bytes and rates as the whole run's" \
    bash -c 'test $0 -eq 0 && [ "$(cat "$1/stop/latest")" = step-40 ] && [ $(wc -l < "$1/stop/metrics.csv") -eq 41 ] &&
             [ "$(sed -n 2,41p "$1/run/metrics.csv" | cut -d, -f1-5)" = "$(sed -n 2,41p "$1/stop/metrics.csv" | cut -d, -f1-5)" ]' "$rc" "$d"
"$sk" -q train --config "$d/tiny.json" --data "$d/text.shard" --steps 300 --batch 16 --lr 3e-3 --warmup 20 --threads 1 --resume "$d/stop/step-40" --stop-at 150 --save "$d/stop" >/dev/null; rc=$?
check "--stop-at, resumed: step 150 equals the whole run's byte for byte" \
    bash -c 'test $0 -eq 0 && cmp -s "$1/stop/step-150/model.safetensors" "$1/run/step-150/model.safetensors"' "$rc" "$d"
err=$("$sk" -q train --config "$d/tiny.json" --data "$d/text.shard" --steps 160 --batch 16 --lr 3e-3 --warmup 20 --threads 1 --resume "$d/run/step-150" --save "$d/run2" 2>&1); rc=$?
check "resuming with another --steps: exit 1, names the option, writes nothing" bash -c 'test $0 -eq 1 && grep -q "its run had steps=300, this one 160 (--steps).*--new-schedule" <<<"$1" && ! test -e "$2"' "$rc" "$err" "$d/run2"
err=$("$sk" -q train --config "$d/tiny.json" --data "$d/text.shard" --steps 300 --batch 16 --lr 1e-3 --warmup 20 --threads 1 --resume "$d/run/step-150" --save "$d/run2" 2>&1); rc=$?
check "resuming with another --lr: exit 1, names the option" bash -c 'test $0 -eq 1 && grep -q "lr=0.003.*this one 0.001.*(--lr)" <<<"$1"' "$rc" "$err"
err=$("$sk" -q train --config "$d/tiny.json" --data "$d/text.shard" --steps 160 --batch 16 --new-schedule 2>&1); rc=$?
check "--new-schedule without --resume: exit 2" bash -c 'test $0 -eq 2 && grep -q "resume only" <<<"$1"' "$rc" "$err"
"$sk" -q train --config "$d/tiny.json" --data "$d/text.shard" --steps 160 --batch 16 --lr 3e-3 --warmup 20 --threads 1 --resume "$d/run/step-150" --new-schedule --save "$d/run2" >/dev/null; rc=$?
check "resume continues at step 151" bash -c 'test $0 -eq 0 && [ "$(sed -n 2p "$1/metrics.csv" | cut -d, -f1)" = 151 ]' "$rc" "$d/run2"
check "a resumed step equals the original run's step" bash -c '[ "$(sed -n 152p "$0/run/metrics.csv" | cut -d, -f2)" = "$(sed -n 2p "$0/run2/metrics.csv" | cut -d, -f2)" ]' "$d"
check "--new-schedule: step 151 runs at the new schedule's rate, lower than the old one's" bash -c 'awk -v a="$(sed -n 152p "$0/run/metrics.csv" | cut -d, -f5)" -v b="$(sed -n 2p "$0/run2/metrics.csv" | cut -d, -f5)" "BEGIN{exit !(b < a / 2)}"' "$d"
out=$("$sk" -q train --config "$d/tiny.json" --data "$d/text.shard" --steps 3 --batch 16 --threads 1 --init "$d/run/step-300/model.safetensors" --metrics "$d/init.csv" --json); rc=$?
echo "     --init: first loss $(sed -n 2p "$d/init.csv" | cut -d, -f2) (rc $rc)"
check "--init starts from a trained model (lower first loss than a fresh one)" bash -c 'test $0 -eq 0 && awk -v a="$(sed -n 2p "$1" | cut -d, -f2)" -v b="$2" "BEGIN{exit !(a < b - 0.25)}"' "$rc" "$d/init.csv" "$first"
head -c 1000 "$d/run/step-300/model.safetensors" > "$d/cut.safetensors"
err=$("$sk" -q eval --config "$d/tiny.json" --model "$d/cut.safetensors" --data "$d/text.shard" 2>&1); rc=$?
check "a truncated model: exit 1, one line naming the problem" bash -c 'test $0 -eq 1 && [ $(wc -l <<<"$1") -eq 1 ] && grep -q "^skyloom eval: .*cut.safetensors" <<<"$1"' "$rc" "$err"
err=$("$sk" train --config "$d/tiny.json" --data "$d/text.shard" --steps 10 --batch 6 --micro-batches 4 2>&1); rc=$?
check "--batch not a multiple of --micro-batches: exit 2" bash -c 'test $0 -eq 2 && grep -q "multiple of --micro-batches" <<<"$1"' "$rc" "$err"
err=$("$sk" train --config "$d/tiny.json" --data "$d/text.shard" 2>&1); rc=$?
check "missing --steps: exit 2" test $rc -eq 2
sed 's/"vocab_size": [0-9]*/"vocab_size": 50/' "$d/tiny.json" > "$d/small.json"
err=$("$sk" -q train --config "$d/small.json" --data "$d/text.shard" --steps 1 2>&1); rc=$?
check "a vocabulary larger than the model's: exit 1, named" bash -c 'test $0 -eq 1 && grep -q "vocab_size is 50" <<<"$1"' "$rc" "$err"
# --optim-state bf16: the same run with AdamW's moments in bf16 (stochastic
# rounding) learns as well; its checkpoints resume exactly.
"$sk" -q train --config "$d/tiny.json" --data "$d/text.shard" --steps 300 --batch 16 \
      --lr 3e-3 --warmup 20 --threads 1 --optim-state bf16 --save "$d/bf" --save-every 150 >/dev/null; rc=$?
read -r bfirst blast < <(awk -F, 'NR>1 && NR<=21 {a+=$2} NR>281 {b+=$2} END {printf "%.4f %.4f\n", a/20, b/20}' "$d/bf/metrics.csv")
echo "     bf16 state: first 20 steps $bfirst, last 20 steps $blast (fp32: $first, $last)"
check "bf16 state: trains, and ends within 0.15 of fp32's loss" bash -c 'test $0 -eq 0 && awk -v a="$1" -v b="$2" "BEGIN{d=a-b; if (d<0) d=-d; exit !(d < 0.15)}"' "$rc" "$blast" "$last"
"$sk" -q train --config "$d/tiny.json" --data "$d/text.shard" --steps 300 --batch 16 --lr 3e-3 --warmup 20 --threads 1 --optim-state bf16 --resume "$d/bf/step-150" --save "$d/bf2" >/dev/null; rc=$?
check "bf16 state: resumed at 150, steps 151..300 repeat the original's losses" bash -c 'test $0 -eq 0 && [ "$(sed -n 152,301p "$1/bf/metrics.csv" | cut -d, -f2 | md5sum)" = "$(sed -n 2,151p "$1/bf2/metrics.csv" | cut -d, -f2 | md5sum)" ]' "$rc" "$d"
err=$("$sk" train --config "$d/tiny.json" --data "$d/text.shard" --steps 2 --optimizer lamb --optim-state bf16 2>&1); rc=$?
check "--optim-state bf16 with lamb: exit 2, named" bash -c 'test $0 -eq 2 && grep -q "adamw only" <<<"$1"' "$rc" "$err"
# the data range and order: errors name the range; the log says what is read;
# without a terminal, --log-every thins the step lines (the CSV keeps all)
nseq=$("$sk" data inspect "$d/text.shard" | sed -n 's/^sequences: *\([0-9]*\) .*/\1/p')
err=$("$sk" -q train --config "$d/tiny.json" --data "$d/text.shard" --steps 2 --first "$nseq" 2>&1); rc=$?
check "--first past the shard: exit 1, named" bash -c 'test $0 -eq 1 && [ $(wc -l <<<"$1") -eq 1 ] && grep -q "first sequence $2 is past" <<<"$1"' "$rc" "$err" "$nseq"
err=$("$sk" -q eval --config "$d/run/step-300/config.json" --model "$d/run/step-300/model.safetensors" --data "$d/text.shard" --first 999999999 2>&1); rc=$?
check "eval --first past the shard: exit 1, named like train's" bash -c 'test $0 -eq 1 && [ $(wc -l <<<"$1") -eq 1 ] && grep -q "first sequence 999999999 is past" <<<"$1"' "$rc" "$err"
# a name with control bytes in a file comes back escaped, never raw
hdr='{"\u001b[31mevil\u0007":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
{ printf "\\x$(printf %02x ${#hdr})\\x00\\x00\\x00\\x00\\x00\\x00\\x00"; printf '%s' "$hdr"; printf '\0\0\0\0'; } > "$d/evil.safetensors"
err=$("$sk" -q eval --config "$d/run/step-300/config.json" --model "$d/evil.safetensors" --data "$d/text.shard" 2>&1); rc=$?
check "control bytes from a file are escaped in the error" bash -c 'test $0 -eq 1 && grep -qF "tensor '"'"'\\x1b[31mevil\\x07'"'"'" <<<"$1" && ! grep -q "$(printf "\033")" <<<"$1"' "$rc" "$err"
err=$("$sk" train --config "$d/tiny.json" --data "$d/text.shard" --steps 2 --first 5 --sequences "$nseq" 2>&1); rc=$?
check "--sequences past the shard: exit 1, named" bash -c 'test $0 -eq 1 && grep -q "run past the shard" <<<"$1"' "$rc" "$err"
out=$("$sk" train --config "$d/tiny.json" --data "$d/text.shard" --steps 10 --batch 4 --threads 1 --first 5 --sequences 10 --no-shuffle --log-every 4 --metrics "$d/range.csv" 2>&1); rc=$?
check "the log names the range and order" bash -c 'test $0 -eq 0 && grep -q "sequences=5..14 order=shard" <<<"$1"' "$rc" "$out"
check "--log-every 4: step lines 1, 4, 8, 10; the CSV has all 10" bash -c '[ "$(grep -o "^step=[0-9]*" <<<"$0" | tr "\n" " ")" = "step=1 step=4 step=8 step=10 " ] && [ $(wc -l < "$1") -eq 11 ]' "$out" "$d/range.csv"
out=$("$sk" train --config "$d/tiny.json" --data "$d/text.shard" --steps 1 --batch 4 --threads 1 --metrics "$d/range.csv" 2>&1); rc=$?
check "shuffled by default" bash -c 'test $0 -eq 0 && grep -q "order=shuffled" <<<"$1"' "$rc" "$out"
check "a checkpoint records what its run read (data.json)" grep -q '"shuffle": true' "$d/run/step-150/data.json"
err=$("$sk" -q train --config "$d/tiny.json" --data "$d/text.shard" --steps 160 --batch 16 --threads 1 --resume "$d/run/step-150" --no-shuffle --save "$d/run3" 2>&1); rc=$?
check "resuming with another data order: exit 1, names the option" bash -c 'test $0 -eq 1 && grep -q "resuming .*shuffle=true, this one false (--no-shuffle)" <<<"$1"' "$rc" "$err"
err=$("$sk" -q train --config "$d/tiny.json" --data "$d/text.shard" --steps 160 --batch 8 --threads 1 --resume "$d/run/step-150" --save "$d/run3" 2>&1); rc=$?
check "resuming with another batch size: exit 1, names the option" bash -c 'test $0 -eq 1 && grep -q "batch=16, this one 8 (--batch)" <<<"$1"' "$rc" "$err"
head -c 20000 "$d/corpus.txt" > "$d/part.txt"
"$sk" -q data prepare --vocab "$d/vocab.txt" --in "$d/part.txt" --out "$d/part.shard" --seq 32 >/dev/null
err=$("$sk" -q train --config "$d/tiny.json" --data "$d/part.shard" --steps 160 --batch 16 --threads 1 --resume "$d/run/step-150" --save "$d/run3" 2>&1); rc=$?
check "resuming on another shard: exit 1, names it" bash -c 'test $0 -eq 1 && grep -q "its run read shard=.*(--data: another shard)" <<<"$1"' "$rc" "$err"
# --device: cpu always works; cuda is either used (a GPU here) or refused
# with the probe's reason, never silently replaced by the CPU.
out=$("$sk" -q train --config "$d/tiny.json" --data "$d/text.shard" --steps 2 --batch 4 --threads 1 --device cpu --metrics "$d/dev.csv" --json); rc=$?
check "--device cpu trains on the cpu" bash -c 'test $0 -eq 0 && grep -q "\"device\": \"cpu\"" <<<"$1"' "$rc" "$out"
out=$("$sk" -q train --config "$d/tiny.json" --data "$d/text.shard" --steps 2 --batch 4 --threads 1 --device cuda --metrics "$d/dev.csv" --json 2>&1); rc=$?
if [ $rc -eq 0 ]; then
  check "--device cuda with a GPU trains on it" grep -q '"device": "cuda"' <<<"$out"
else
  echo "     --device cuda here: $out"
  check "--device cuda without a GPU: exit 1, one line with the reason" bash -c 'test $0 -eq 1 && [ $(wc -l <<<"$1") -eq 1 ] && grep -q "^skyloom train: --device cuda: .*\(CUDA\|cuda\|GPU\)" <<<"$1"' "$rc" "$out"
fi
# --precision bf16 (where the CPU has AVX512_BF16 or AMX): the same 300
# steps within 1% (mean loss of the last 20), the same model evaluated in
# both precisions within 0.5%; a CPU (or a oneDNN limited by
# DNNL_MAX_CPU_ISA) without bf16 is refused with the instructions named
out=$("$sk" -q train --config "$d/tiny.json" --data "$d/text.shard" --steps 300 --batch 16 \
      --lr 3e-3 --warmup 20 --threads 1 --precision bf16 --metrics "$d/bf16.csv" --json 2>&1); rc=$?
if [ $rc -eq 0 ]; then
  check "train --precision bf16: the JSON summary says so" grep -q '"precision": "bf16"' <<<"$out"
  read -r last16 < <(awk -F, 'NR>281 {b+=$2} END {printf "%.4f\n", b/20}' "$d/bf16.csv")
  echo "     mean loss of the last 20 of 300 steps: fp32 $last, bf16 $last16"
  check "bf16 training: the last 20 steps' mean loss within 1% of fp32's" \
      awk -v a="$last" -v b="$last16" 'BEGIN{d=a-b; if (d<0) d=-d; exit !(d <= 0.01*a)}'
  e32=$("$sk" -q eval --config "$d/run/step-300/config.json" --model "$d/run/step-300/model.safetensors" --data "$d/text.shard" --batches 8 --json)
  e16=$("$sk" -q eval --config "$d/run/step-300/config.json" --model "$d/run/step-300/model.safetensors" --data "$d/text.shard" --batches 8 --json --precision bf16)
  l32=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["loss"])' "$e32")
  l16=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["loss"])' "$e16")
  echo "     eval of one model: fp32 $l32, bf16 $l16"
  check "eval in the two precisions within 0.5%" \
      awk -v a="$l32" -v b="$l16" 'BEGIN{d=a-b; if (d<0) d=-d; exit !(d <= 0.005*a)}'
  err=$(DNNL_MAX_CPU_ISA=AVX512_CORE "$sk" -q train --config "$d/tiny.json" --data "$d/text.shard" --steps 2 --batch 4 --threads 1 --precision bf16 --save "$d/nobf16" 2>&1); rc=$?
  check "--precision bf16 where oneDNN has no bf16: exit 1, one line naming AVX512_BF16 and AMX, nothing written" \
      bash -c 'test $0 -eq 1 && [ $(wc -l <<<"$1") -eq 1 ] && grep -q "^skyloom train: --precision bf16 on cpu: .*AVX512_BF16 or AMX" <<<"$1" && ! test -e "$2"' "$rc" "$err" "$d/nobf16"
  echo "     $err"
  err=$(DNNL_MAX_CPU_ISA=AVX512_CORE "$sk" -q eval --config "$d/run/step-300/config.json" --model "$d/run/step-300/model.safetensors" --data "$d/text.shard" --precision bf16 2>&1); rc=$?
  check "eval --precision bf16 there: exit 1 with the reason" bash -c 'test $0 -eq 1 && grep -q "AVX512_BF16" <<<"$1"' "$rc" "$err"
else
  echo "     --precision bf16 here: $out"
  check "--precision bf16 on a CPU without bf16: exit 1, one line naming AVX512_BF16" \
      bash -c 'test $0 -eq 1 && [ $(wc -l <<<"$1") -eq 1 ] && grep -q "AVX512_BF16" <<<"$1"' "$rc" "$out"
fi
err=$("$sk" -q eval --config "$d/run/step-300/config.json" --model "$d/run/step-300/model.safetensors" --data "$d/text.shard" --precision fp8 2>&1); rc=$?
check "eval --precision fp8: exit 2, named" bash -c 'test $0 -eq 2 && grep -q "fp32 or bf16" <<<"$1"' "$rc" "$err"
err=$("$sk" -q eval --config "$d/run/step-300/config.json" --model "$d/run/step-300/model.safetensors" --data "$d/text.shard" --device tpu 2>&1); rc=$?
check "--device tpu: exit 2, named" bash -c 'test $0 -eq 2 && grep -q "auto, cpu or cuda" <<<"$1"' "$rc" "$err"
"$sk" train --help | grep -q 'usage: skyloom train'; check "train --help" test $? -eq 0
"$sk" help eval | grep -q 'usage: skyloom eval'; check "help eval" test $? -eq 0
exit $fail
