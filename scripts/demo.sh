#!/usr/bin/env bash
# make demo: a federation of two sites on this machine. A CA, a coordinator
# and four devices on loopback, enrolled by token. Each site is a data owner
# with its own part of the fortune corpus (Debian package `fortunes`), split
# by subject: lab-a holds the humanities files (literature, wisdom, people,
# politics, ...), lab-b the computing and science ones; each site also has a
# compute device. The devices profile themselves, the balancer places a
# replica of the model around each owner, and the replicas train together
# with --sync outer:10 (DiLoCo: each replica 10 steps alone, then int8
# pseudo-gradients with error feedback over sealed links and one outer step;
# DEMO_SYNC=step instead: every step's gradients averaged), int8 activations
# inside each replica. Neither owner's text leaves its site.
# At the end: the plan, each owner's held-out loss on its own subject and on
# the other's, for the federated model and for a model trained the same
# number of steps on that owner's data alone (skyloom train): what the
# federation buys each owner. Nothing is downloaded; every process stops at
# the end (or on Ctrl-C).
# Usage: scripts/demo.sh [BUILD_DIR]
# env: DEMO_SECONDS (60: the job's training), DEMO_SYNC (outer:10: DiLoCo's
#      outer steps every 10; outer:H; step: every step's gradients averaged)
set -euo pipefail
# every process of the demo shares this machine's cores: OpenMP threads that
# spin while they wait would slow the others down (devices set this themselves)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
SK="$build/cli/skyloom"
[ -x "$SK" ] || { echo "demo: $SK not found: run make build first" >&2; exit 1; }
SK=$(cd "$(dirname "$SK")" && pwd)/$(basename "$SK")
secs=${DEMO_SECONDS:-60}
dir="$build/demo"
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
config="$root/configs/bert-tiny.json"
vocab_size=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$config")
seq=64 ob=8 micro=2
sync=${DEMO_SYNC:-outer:10}
case $sync in
  step) H=10 ;;
  outer:[1-9]*) H=${sync#outer:} ;;
  *) echo "demo: DEMO_SYNC must be step or outer:H" >&2; exit 2 ;;
esac

echo "== two sites' corpora (fortunes by subject), one shared vocabulary, a shard per site"
if [ ! -s "$dir/tech.shard" ]; then
  "$root/scripts/fed-corpus.sh" "$dir"
  # the sites agree on one vocabulary (here made from both texts; a real
  # federation would use a public one): owners of one job must share it
  cat "$dir/hum.txt" "$dir/tech.txt" > "$dir/all.txt"
  "$SK" -q data vocab --corpus "$dir/all.txt" --size "$vocab_size" --out "$dir/vocab.txt"
  for o in hum tech; do
    "$SK" -q data prepare --vocab "$dir/vocab.txt" --in "$dir/$o.txt" --out "$dir/$o.shard" --seq "$seq"
  done
fi
count() { "$SK" data inspect "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["sequences"])'; }
nh=$(count "$dir/hum.shard") nt=$(count "$dir/tech.shard")
# each owner trains on its first 90% and is evaluated on the rest; --sequences
# limits every owner's shard alike, so the smaller owner's 90%
kh=$((nh * 9 / 10)) kt=$((nt * 9 / 10))
ktrain=$((kh < kt ? kh : kt))
echo "   lab-a (humanities): $nh sequences of $seq tokens; lab-b (computing and science): $nt"

CL="$dir/cluster"
rm -rf "$CL"
. "$root/scripts/cluster.sh"
trap 'cl_stop' EXIT
trap 'echo; echo "demo: interrupted"; exit 130' INT TERM

echo
echo "== a CA and a coordinator on 127.0.0.1, four devices at two sites, enrolled by token"
cl_start
[ -n "$CL_HTTP" ] && echo "   dashboard: http://$CL_HTTP/ (Prometheus metrics: http://$CL_HTTP/metrics)"
cl_device owner-a lab-a --threads 1 --data "humanities=$dir/hum.shard"; OA=$CL_ID
cl_device owner-b lab-b --threads 1 --data "computing=$dir/tech.shard"; OB=$CL_ID
cl_device a2 lab-a --threads 1
cl_device b2 lab-b --threads 1
cl_wait_online 4
"$SK" status --coordinator "$CL_ADDR" --pki "$CL/pki"

# how many steps fit: a few steps of the same federation in one process,
# and the job at about a third of that speed (its four devices share this
# machine's two cores, and pay for framing, sealing, the links and the sync)
fed=(--config "$config" --data "$dir/hum.shard" --data "$dir/tech.shard" --owner-batch "$ob,$ob"
     --micro-batches "$micro" --lr 1e-3 --sequences "$ktrain")
tps=$("$SK" -q train "${fed[@]}" --steps 6 --sync step --codec-sync int8 --threads 1 \
      --metrics "$dir/calibrate.csv" --json | sed -n 's/.*"tokens_per_s": *\([0-9.]*\).*/\1/p')
steps=$(awk -v t="$tps" -v s="$secs" -v n=$((2 * ob * seq)) -v h="$H" \
        'BEGIN { k = int(0.33 * t * s / n / h) * h; print (k < 3 * h ? 3 * h : k) }')

echo
if [ "$sync" = step ]; then what="every step's gradients averaged, int8"; else what="outer steps every $H with int8 pseudo-gradients"; fi
echo "== the job: $steps steps; each owner $ob x $seq tokens per step; $what;"
echo "   int8 activations; sealed (the owners check their shards, every device profiles itself"
echo "   and its links, the balancer places a replica around each owner)"
cl_job submit --config "$config" --data "$OA:humanities" --data "$OB:computing" \
    --owner-batch "$ob,$ob" --micro-batches "$micro" --sync "$sync" --codec-sync int8 \
    --codec-act int8 --lr 1e-3 --sequences "$ktrain" --steps "$steps" \
    --checkpoint-every "$H" --name demo-federation > "$dir/submit.txt"
cat "$dir/submit.txt"
JOB=$(head -1 "$dir/submit.txt")

echo
echo "== training (skyloom job watch; stopped after $((secs * 2)) s if slower than expected)"
( sleep $((secs * 2)); cl_job stop "$JOB" >/dev/null 2>&1 ) &
stopper=$!
cl_job watch "$JOB" | awk '/^step=1 / || /done|failed|stopped/ || NR % 50 == 0' || true
kill "$stopper" 2>/dev/null || true
wait "$stopper" 2>/dev/null || true

echo
echo "== result"
cl_job status "$JOB"
state=$(cl_jq "$JOB" 'j["state"]')
[ "$state" = done ] || { echo "demo: the job ended $state"; exit 1; }
rm -rf "$dir/model"
cl_job export "$JOB" --out "$dir/model" >/dev/null
cl_stop

echo
echo "== each owner alone: the same $steps steps of $ob sequences on its own shard (skyloom train)"
for o in hum tech; do
  rm -rf "$dir/alone-$o"
  "$SK" -q train --config "$config" --data "$dir/$o.shard" --batch "$ob" --micro-batches "$micro" \
      --lr 1e-3 --sequences "$ktrain" --steps "$steps" --threads 1 --save "$dir/alone-$o" >/dev/null
done
ev() { # ev MODEL SHARD FIRST: held-out loss
  "$SK" -q eval --config "$config" --model "$1" --data "$2" --first "$3" --batches 20 --batch 16 --json |
    python3 -c 'import json,sys; print("%.3f" % json.load(sys.stdin)["loss"])'
}
row() { printf '| %-34s | %10s | %10s |\n' "$1" "$(ev "$2" "$dir/hum.shard" "$kh")" "$(ev "$2" "$dir/tech.shard" "$kt")"; }
echo
echo "held-out masked-LM loss (lower is better) on each owner's unseen sequences:"
printf '| %-34s | %10s | %10s |\n' "model" "humanities" "computing"
echo "|------------------------------------|------------|------------|"
row "federated (both owners)" "$dir/model/model.safetensors"
row "lab-a alone (humanities data)" "$dir/alone-hum/step-$steps/model.safetensors"
row "lab-b alone (computing data)" "$dir/alone-tech/step-$steps/model.safetensors"
echo "model:   $dir/model (exported: model.safetensors, config.json, vocab.txt, training.json)"
echo "metrics: $CL/coord/jobs/$JOB/metrics.csv"
echo "all processes stopped"
