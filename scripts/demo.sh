#!/usr/bin/env bash
# make demo: a federated BERT run on this machine. A CA, a coordinator and
# four devices at two sites (one with two threads, three with one) on
# loopback, enrolled by token; the data owner at lab-a serves the fortune
# corpus (Debian package `fortunes`); the devices profile themselves, the
# balancer plans the job (the data owner holds the first and last units),
# and they train about two minutes with int8 activations over sealed links.
# At the end: the plan, each stage's busy share, measured against predicted
# step time, bytes on the wire per link against raw fp32, the loss from start
# to end, and the held-out loss of the exported model. Nothing is downloaded;
# every process stops at the end (or on Ctrl-C).
# Usage: scripts/demo.sh [BUILD_DIR]   env: DEMO_SECONDS (120)
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
SK="$build/cli/skyloom"
[ -x "$SK" ] || { echo "demo: $SK not found: run make build first" >&2; exit 1; }
SK=$(cd "$(dirname "$SK")" && pwd)/$(basename "$SK")
secs=${DEMO_SECONDS:-120}
dir="$build/demo"
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
config="$root/configs/bert-tiny.json"
vocab_size=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$config")
seq=64 batch=16 micro=4
held=20000 # sequences 0..19999 train (shuffled every epoch); the rest are held out

echo "== corpus, vocabulary and shard"
[ -s "$dir/corpus.txt" ] || "$root/scripts/demo-corpus.sh" "$dir/corpus.txt"
[ -s "$dir/vocab.txt" ] || "$SK" -q data vocab --corpus "$dir/corpus.txt" --size "$vocab_size" --out "$dir/vocab.txt"
[ -s "$dir/demo.shard" ] || "$SK" -q data prepare --vocab "$dir/vocab.txt" --in "$dir/corpus.txt" --out "$dir/demo.shard" --seq "$seq"
"$SK" data inspect "$dir/demo.shard" | sed -n '1,4p'

CL="$dir/cluster"
rm -rf "$CL"
. "$root/scripts/cluster.sh"
trap 'cl_stop' EXIT
trap 'echo; echo "demo: interrupted"; exit 130' INT TERM

echo
echo "== a CA and a coordinator on 127.0.0.1, four devices at two sites, enrolled by token"
cl_start
[ -n "$CL_HTTP" ] && echo "   dashboard: http://$CL_HTTP/ (Prometheus metrics: http://$CL_HTTP/metrics)"
cl_device owner lab-a --threads 1 --data "fortunes=$dir/demo.shard"; OWNER=$CL_ID
cl_device a2 lab-a --threads 2
cl_device b1 lab-b --threads 1
cl_device b2 lab-b --threads 1
cl_wait_online 4
"$SK" status --coordinator "$CL_ADDR" --pki "$CL/pki"

# how many steps fit: a few steps of the same model in one process, and the
# job at about three quarters of that speed (its devices share this machine's
# cores, and pay for framing, sealing and the links)
tps=$("$SK" -q train --config "$config" --data "$dir/demo.shard" --steps 6 --batch "$batch" \
      --micro-batches "$micro" --metrics "$dir/calibrate.csv" --json |
      sed -n 's/.*"tokens_per_s": *\([0-9.]*\).*/\1/p')
steps=$(awk -v t="$tps" -v s="$secs" -v n=$((batch * seq)) 'BEGIN { k = int(0.75 * t * s / n); print (k < 20 ? 20 : k) }')

echo
echo "== the job: $steps steps of $batch x $seq tokens, $micro micro-batches, int8 activations, sealed"
echo "   (the data owner checks its shard, every device profiles itself and its links, the balancer plans)"
cl_job submit --config "$config" --data "$OWNER:fortunes" --steps "$steps" --batch "$batch" \
    --micro-batches "$micro" --codec-act int8 --lr 1e-3 --sequences "$held" \
    --checkpoint-every 100 > "$dir/submit.txt"
cat "$dir/submit.txt"
JOB=$(head -1 "$dir/submit.txt")

echo
echo "== training (skyloom job watch; stopped after $((secs + secs / 2)) s if slower than expected)"
( sleep $((secs + secs / 2)); cl_job stop "$JOB" >/dev/null 2>&1 ) &
stopper=$!
cl_job watch "$JOB" | awk '/^step=1 / || /done|failed|stopped/ || NR % 50 == 0' || true
kill "$stopper" 2>/dev/null || true
wait "$stopper" 2>/dev/null || true

echo
echo "== result"
cl_job status "$JOB"
m="$CL/coord/jobs/$JOB/metrics.csv"
cl_job status "$JOB" --json > "$dir/status.json"
python3 - "$m" "$dir/status.json" <<'PY'
import csv, json, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
st = json.load(open(sys.argv[2]))
if not rows:
    sys.exit("demo: no step finished")
n = len(rows); k = 10 if n >= 40 else max(1, n // 4)
loss = [float(r["loss"]) for r in rows]
steady = rows[min(5, n - 1):]
meas = statistics.median(float(r["step_s"]) for r in steady)
pred = (st.get("plan") or {}).get("predicted_iteration_s", 0) or 0
print(f"loss (mean of {k} steps): start {sum(loss[:k])/k:.3f} -> end {sum(loss[-k:])/k:.3f} after {n} steps")
print(f"step time: measured {meas:.3f} s (median after warm-up), predicted {pred:.3f} s"
      + (f" (measured/predicted {meas/pred:.2f})" if pred else ""))
busy = [list(map(float, r["stage_busy"].split(";"))) for r in steady]
print("busy share per stage: " + ", ".join(f"stage {i} {100*statistics.median(b[i] for b in busy):.0f}%"
                                            for i in range(len(busy[0]))))
raw = [sum(int(x) for x in r["link_raw_bytes"].split(";") if x) for r in steady]
wire = [sum(int(x) for x in r["link_wire_bytes"].split(";") if x) for r in steady]
last = steady[-1]
for i, (r, w) in enumerate(zip(last["link_raw_bytes"].split(";"), last["link_wire_bytes"].split(";"))):
    if r:
        print(f"link {i}->{i+1}: {int(w)} B on the wire per step against {int(r)} B raw fp32 ({int(w)/int(r):.2f})")
PY
rm -rf "$dir/model"
cl_job export "$JOB" --out "$dir/model"
printf 'held-out '
"$SK" -q eval --config "$dir/model/config.json" --model "$dir/model/model.safetensors" \
    --data "$dir/demo.shard" --first "$held" --batches 20 --batch 16
echo "model:   $dir/model (model.safetensors with Hugging Face BERT names, config.json)"
echo "metrics: $m"
cl_job trace "$JOB" --svg "$dir/timeline.svg" >/dev/null 2>&1 &&
  echo "timeline: $dir/timeline.svg (a recent step as the devices measured it: skyloom job trace)"
cl_stop
echo "all processes stopped"
