#!/usr/bin/env bash
# Compressed links: the demo model (configs/bert-tiny.json) trained as a job
# on three device processes for 300 steps with int8 activations and fp16
# gradients ends within 2% of the loss of the same job with codec none, and
# its activation links carry about a quarter of the raw bytes.
set -u
SK="$1"; src="$2"
CL=$(mktemp -d /tmp/skyloom-codec-XXXXXX)
. "$src/scripts/cluster.sh"
fail=0
check() { local desc="$1"; shift; if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi; }
trap 'cl_stop; [ -n "${KEEP:-}" ] || rm -rf "$CL"' EXIT
d=$CL
config="$src/configs/bert-tiny.json"
V=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$config")
"$src/scripts/demo-corpus.sh" "$d/corpus.txt" || exit 1
"$SK" -q data vocab --corpus "$d/corpus.txt" --size "$V" --out "$d/vocab.txt" >/dev/null
"$SK" -q data prepare --vocab "$d/vocab.txt" --in "$d/corpus.txt" --out "$d/demo.shard" --seq 64 >/dev/null

cl_start || exit 1
cl_device dev1 lab-a --threads 1 --data "fortunes=$d/demo.shard" || exit 1; OWNER=$CL_ID
cl_device dev2 lab-b --threads 1 || exit 1; B=$CL_ID
cl_device dev3 lab-b --threads 1 || exit 1; C=$CL_ID
cl_wait_online 3 || exit 1

run() { # run NAME CODEC-ARGS...: a 300-step job; its metrics.csv in $d/NAME.csv
  local name=$1; shift
  local out job
  out=$(cl_job submit --config "$config" --data "$OWNER:fortunes" --steps 300 --batch 8 \
        --micro-batches 4 --lr 1e-3 --algo even --checkpoint-every 0 --devices "$OWNER,$B,$C" \
        --json "$@" 2>&1) || { echo "$out"; return 1; }
  echo "$out" > "$d/$name.submit"
  job=$(grep -o '"job_id": "j[0-9a-f]*"' <<<"$out" | cut -d'"' -f4)
  cl_job watch "$job" >/dev/null || return 1
  cp "$d/coord/jobs/$job/metrics.csv" "$d/$name.csv"
}
run none || fail=1
run int8 --codec-act int8 --codec-grad fp16 || fail=1
last() { awk -F, 'NR>1 {l[NR]=$3} END {s=0; for (i=NR-19; i<=NR; i++) s+=l[i]; printf "%.4f", s/20}' "$1"; }
a=$(last "$d/none.csv"); b=$(last "$d/int8.csv")
echo "     mean loss of steps 281-300: codec none $a, int8 activations + fp16 gradients $b"
check "int8/fp16 links: the loss after 300 steps within 2% of codec none's" \
    awk -v a="$a" -v b="$b" 'BEGIN { d = (b - a) / a; if (d < 0) d = -d; exit !(a > 0 && d <= 0.02) }'
check "the loss fell (the runs learned)" \
    awk -F, 'NR==2 {f=$3} END {exit !(f - $3 > 0.5)}' "$d/int8.csv"
# raw and wire bytes of the first link (stage 0 -> 1) in the last step
ratio=$(tail -1 "$d/int8.csv" | awk -F, '{split($10,r,";"); split($11,w,";"); printf "%.3f", w[1]/r[1]}')
echo "     stage 0 -> 1 on the wire: $ratio of the raw bytes (activations int8, masks i32, sealed)"
check "int8 activations: at most a third of the raw bytes on the wire" awk -v r="$ratio" 'BEGIN{exit !(r > 0 && r < 0.34)}'
# the balancer plans the bytes the codecs send: int8 rows of H=128 with a
# 4-byte scale are (4 + 128) / (4 x 128) of fp32, fp16 half of it
link_ratio() { python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["plan"]["balancer"]["stages"][0]["link_next"]; print(s["activation_s"] / s["gradient_s"])' "$1"; }
check "the plan serializes what the codecs send (activation / gradient seconds: 1 without, 0.515625 with int8/fp16)" \
    python3 -c 'import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(not (abs(a - 1) < 1e-9 and abs(b - 0.515625) < 1e-9))' \
    "$(link_ratio "$d/none.submit")" "$(link_ratio "$d/int8.submit")"
exit $fail
