#!/usr/bin/env bash
# What a curious middle device learns (docs/security.md, "What a middle device
# learns"): the demo model (configs/bert-tiny.json, seq 64, batch 16, lr 1e-3)
# and config (b) (L4 H256, seq 128, batch 8, lr 5e-4) trained by `skyloom
# train` for STEPS steps on the first 90% of the fortunes corpus (the data
# owner's text), then bench/privacy/privacy.py plays the middle device
# against the held-out 10% for N = 0, 1, 2, 4 home layers: nearest-neighbour
# inversion, a linear probe and an MLP trained on public text (the GNU manuals
# and licence texts Debian ships, bench/privacy/public-corpus.sh), the
# gradient the head sends back, and a most-frequent-token baseline. Then the
# defence: the demo model trained DEFENCE_STEPS steps in PyTorch without
# noise and, for each N:SIGMA of DEFENCE, with Gaussian noise of SIGMA x the
# row's RMS on the output of unit N; their held-out loss and the attacks on
# the noisy boundary. Prints the machine, the settings and markdown tables.
# Everything it writes goes to a temporary directory, removed at the end.
# usage: bench/privacy/run.sh SKYLOOM
# env: STEPS (300), SEEDS (3: nearest-neighbour seeds of the demo; the probes
#      and config (b) run one), DEFENCE_STEPS (1500; 0: no defence), DEFENCE
#      (0:1,1:1,1:2), THREADS (2), PYTHON (/usr/bin/python3), QUICK (1: a
#      smoke run of every part on little data, its numbers meaningless)
set -euo pipefail
sk=${1:?usage: bench/privacy/run.sh SKYLOOM}
sk=$(cd "$(dirname "$sk")" && pwd)/$(basename "$sk")
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
steps=${STEPS:-300} seeds=${SEEDS:-3} dsteps=${DEFENCE_STEPS:-1500} defence=${DEFENCE:-0:1,1:1,1:2}
threads=${THREADS:-2} py=${PYTHON:-/usr/bin/python3}
small=()
[ "${QUICK:-0}" = 1 ] && small=(--eval-seqs 40 --public-tokens 3000 --probe-epochs 1)
if ! "$py" -c 'import torch' 2>/dev/null; then
  echo "privacy: PyTorch (python3-torch) not available: skipped"
  exit 0
fi
# the host is shared: OpenMP threads that spin while they wait slow everyone
# down (docs/jobs.md); torch runs on OpenBLAS's OpenMP build as bench/run.sh
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
d=$(mktemp -d /tmp/skyloom-privacy-XXXXXX)
trap 'rm -rf "$d"' EXIT
t0=$(date +%s)
log() { echo "privacy: $* ($(($(date +%s) - t0)) s)" >&2; }

# the owner's text (fortunes) and the attacker's (GNU manuals, licences)
"$root/scripts/demo-corpus.sh" "$d/corpus.txt"
"$here/public-corpus.sh" "$d/public.txt"
mkdir -p "$d/demo" "$d/b"
"$sk" -q data vocab --corpus "$d/corpus.txt" --size 4096 --out "$d/demo/vocab.txt" >/dev/null
"$sk" -q data prepare --vocab "$d/demo/vocab.txt" --in "$d/corpus.txt" --out "$d/demo/owner.shard" --seq 64 >/dev/null
cp "$root/configs/bert-tiny.json" "$d/demo/config.json"
"$here/../config_b.sh" "$sk" "$d/b" 128
mv "$d/b/b.shard" "$d/b/owner.shard"
mv "$d/b/b.json" "$d/b/config.json"
# the public text in the owner's vocabulary (the attacker is given it)
"$sk" -q data prepare --vocab "$d/demo/vocab.txt" --in "$d/public.txt" --out "$d/demo/public.shard" --seq 64 >/dev/null
"$sk" -q data prepare --vocab "$d/b/vocab.txt" --in "$d/public.txt" --out "$d/b/public.shard" --seq 128 >/dev/null

held() { "$sk" data inspect "$1" --json | "$py" -c 'import json,sys; print(json.load(sys.stdin)["sequences"] * 9 // 10)'; }
train() { # train NAME BATCH LR: the initial weights (one step at learning rate 0) and STEPS steps
  local c=$d/$1
  "$sk" -q train --config "$c/config.json" --data "$c/owner.shard" --steps 1 --lr 0 --batch "$2" \
      --threads "$threads" --save "$c/init" >/dev/null
  "$sk" -q train --config "$c/config.json" --data "$c/owner.shard" --steps "$steps" --batch "$2" --lr "$3" \
      --sequences "$(held "$c/owner.shard")" --threads "$threads" --save "$c/trained" --json >"$c/train.json"
  log "$1: trained $steps steps"
}
attack() { # attack NAME LABEL [options]
  local c=$d/$1 label=$2
  shift 2
  "$py" "$here/privacy.py" attack --name "$label" --config "$c/config.json" \
      --init "$c/init/step-1/model.safetensors" --trained "$c/trained/step-$steps/model.safetensors" \
      --steps "$steps" --owner "$c/owner.shard" --first "$(held "$c/owner.shard")" --public "$c/public.shard" \
      --threads "$threads" --grad --out "$d/results.jsonl" "$@" "${small[@]}" >/dev/null
  log "$1: attacked"
}

train demo 16 1e-3
attack demo demo --N 0,1,2 --seeds "$seeds"
train b 8 5e-4
attack b "(b)" --N 0,1,2,4 --seeds 1 --eval-seqs 200
if [ "$dsteps" -gt 0 ]; then
  "$py" "$here/privacy.py" defence --name demo --config "$d/demo/config.json" \
      --init "$d/demo/init/step-1/model.safetensors" --owner "$d/demo/owner.shard" \
      --first "$(held "$d/demo/owner.shard")" --public "$d/demo/public.shard" --runs "$defence" --probes \
      --steps "$dsteps" --eval-seqs 200 --threads "$threads" --out "$d/results.jsonl" "${small[@]}" >/dev/null
  log "defence trained and attacked"
fi

echo
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg); $(date -u '+%Y-%m-%d %H:%M UTC');" \
     "commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'); $(($(date +%s) - t0)) s"
echo "settings: STEPS=$steps SEEDS=$seeds DEFENCE_STEPS=$dsteps DEFENCE=$defence THREADS=$threads"
"$py" "$here/privacy.py" table "$d/results.jsonl"
