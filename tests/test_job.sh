#!/usr/bin/env bash
# Federated jobs end to end on loopback: a coordinator and three device
# processes. A job of 3 stages (codec none, sealed) ends with the same
# model.safetensors bytes and losses as `skyloom train` with the same config,
# data, seed, batch and micro-batches; the device holding neither the data
# nor unit 0 or the head never receives labels; a job on a dataset the owner
# refuses fails at submit with the owner's reason; the plan is signed.
set -u
SK="$1"; src="$2"
CL=$(mktemp -d /tmp/skyloom-job-XXXXXX)
. "$src/scripts/cluster.sh"
fail=0
check() { local desc="$1"; shift; if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi; }
trap 'cl_stop; [ -n "${KEEP:-}" ] || rm -rf "$CL"' EXIT

d=$CL
cat "$src"/README.md "$src"/docs/*.md > "$d/corpus.txt"
"$SK" -q data vocab --corpus "$d/corpus.txt" --size 400 --out "$d/vocab.txt" >/dev/null
"$SK" -q data prepare --vocab "$d/vocab.txt" --in "$d/corpus.txt" --out "$d/text.shard" --seq 24 >/dev/null
V=$(wc -l < "$d/vocab.txt")
cat > "$d/cfg.json" <<JSON
{"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2, "intermediate_size": 48,
 "vocab_size": $V, "max_position_embeddings": 24, "hidden_dropout_prob": 0.1,
 "attention_probs_dropout_prob": 0.1}
JSON
sed "s/\"vocab_size\": $V/\"vocab_size\": 50/" "$d/cfg.json" > "$d/small.json"

cl_start || exit 1
cl_device dev1 lab-a --threads 1 --data "wiki=$d/text.shard" || exit 1; OWNER=$CL_ID
cl_device dev2 lab-b --threads 1 || exit 1; MID=$CL_ID
cl_device dev3 lab-b --threads 1 || exit 1; LAST=$CL_ID
cl_wait_online 3 || exit 1

# 3 stages, the data owner first (even: units 0-1, 2-3, 4)
out=$(cl_job submit --config "$d/cfg.json" --data "$OWNER:wiki" --steps 20 --batch 8 \
      --micro-batches 4 --algo even --checkpoint-every 10 --devices "$OWNER,$MID,$LAST" --lr 2e-3 --json 2>&1); rc=$?
JOB=$(grep -o '"job_id": "j[0-9a-f]*"' <<<"$out" | cut -d'"' -f4)
check "job submit: planned and running" bash -c 'test $0 -eq 0 && [ -n "$1" ] && grep -q "\"state\": \"running\"" <<<"$2"' "$rc" "$JOB" "$out"
check "the plan has 3 stages, stage 0 on the data owner" bash -c 'grep -B4 -A4 "\"index\": 0" <<<"$0" | grep -q "$1" && grep -q "\"index\": 2" <<<"$0" && ! grep -q "\"index\": 3" <<<"$0"' "$out" "$OWNER"
cl_job watch "$JOB" > "$d/watch.txt"; rc=$?
check "job watch follows it to done" bash -c 'test $0 -eq 0 && grep -q "step=20 " "$1" && grep -q "done after" "$1"' "$rc" "$d/watch.txt"
cl_job status "$JOB" --json > "$d/status.json"
check "job status --json: committed step 20, per-stage and per-link figures" \
    bash -c 'grep -q "\"committed_step\": 20" "$0" && grep -q "\"busy\"" "$0" && grep -q "\"wire_bytes\"" "$0"' "$d/status.json"
cl_job export "$JOB" --out "$d/export" >/dev/null; rc=$?
"$SK" -q train --config "$d/cfg.json" --data "$d/text.shard" --steps 20 --batch 8 --micro-batches 4 \
    --lr 2e-3 --save "$d/ref" >/dev/null 2>&1
check "export: the job's model.safetensors equals skyloom train's, byte for byte" \
    bash -c 'test $0 -eq 0 && cmp -s "$1/export/model.safetensors" "$1/ref/step-20/model.safetensors"' "$rc" "$d"
check "the job's per-step losses equal skyloom train's" \
    bash -c '[ "$(tail -n +2 "$0" | cut -d, -f1,3)" = "$(tail -n +2 "$1" | cut -d, -f1,2)" ]' \
    "$d/coord/jobs/$JOB/metrics.csv" "$d/ref/metrics.csv"
check "the exported model evaluates" \
    bash -c '"$0" -q eval --config "$1/export/config.json" --model "$1/export/model.safetensors" --data "$1/text.shard" --batches 2 >/dev/null' "$SK" "$d"
check "frames were sealed (wire bytes exceed raw bytes on every link)" \
    bash -c 'tail -1 "$0" | awk -F, "{n=split(\$10,r,\";\"); split(\$11,w,\";\"); for(i=1;i<=n;i++) if (w[i]+0 <= r[i]+0) exit 1}"' \
    "$d/coord/jobs/$JOB/metrics.csv"
recv=$(grep "job done here" "$d/dev2.log" | grep -o 'received=.*')
echo "     the middle device received: $recv"
check "the middle device received activations and masks but no labels" \
    bash -c 'grep -q "act:[1-9]" <<<"$0" && grep -q "labels:0," <<<"$0"' "$recv"
check "the device at the end received the labels (the head is its)" \
    bash -c 'grep "job done here" "$0" | grep -q "labels:[1-9]"' "$d/dev3.log"
check "no process or frame trouble: nothing refused, nothing stopped" \
    bash -c '! grep -q "frame refused\|pipeline stopped" "$0"/dev*.log' "$d"

# the owner refuses what it cannot train on: the reason reaches submit
out=$(cl_job submit --config "$d/small.json" --data "$OWNER:wiki" --steps 5 2>&1); rc=$?
echo "     $out" | tail -1
check "a shard whose vocabulary exceeds the config: submit fails with the owner's reason" \
    bash -c 'test $0 -eq 1 && grep -q "refused wiki: .*vocab_size is 50" <<<"$1"' "$rc" "$out"
out=$(cl_job submit --config "$d/cfg.json" --data "$OWNER:secret" --steps 5 2>&1); rc=$?
check "a dataset the owner does not declare: refused" \
    bash -c 'test $0 -eq 1 && grep -q "serves no dataset .secret." <<<"$1"' "$rc" "$out"
out=$(cl_job submit --config "$d/cfg.json" --data "$OWNER:../../etc/passwd" --steps 5 2>&1); rc=$?
check "a path instead of a dataset name: refused" bash -c 'test $0 -eq 1 && grep -q "DEVICE_ID:NAME" <<<"$1"' "$rc" "$out"
out=$(cl_job submit --config "$d/cfg.json" --data "$OWNER:wiki" --steps 5 --batch 6 --micro-batches 4 2>&1); rc=$?
check "bad options: refused naming them" bash -c 'test $0 -eq 1 && grep -q "multiple of micro_batches" <<<"$1"' "$rc" "$out"
cl_job list > "$d/list.txt"
check "job list shows the done job and the failed ones" bash -c 'grep -q "$1 *done" "$0" && grep -q "failed" "$0"' "$d/list.txt" "$JOB"

cl_stop
if cl_alive; then echo "FAIL every process stopped"; fail=1; else echo "ok   every process stopped"; fi

exit $fail
