#!/usr/bin/env bash
# One-stage `skyloom train` of two builds side by side: what the stage runner
# costs when there is a single stage. Config (b) (L4 H256 A4 F1024 V8192),
# sequences of 128 tokens from the fortunes corpus, batch 8, one
# micro-batch, THREADS threads, the same shard, config, seed and options for
# both (only options the builds before the runner have too).
#
# Each round runs both, one after the other, the order swapped every round
# (B A, A B, ...) so neither always runs first. Per run: tokens/s = 8 x 128 /
# the median step after the first (metrics.csv), and the --json figure (the
# whole run, its first step included). Prints a JSON line per run and a
# summary: each build's median tokens/s over its runs, the ratio of medians
# AFTER/BEFORE and the per-round ratios as median [min, max].
# usage: bench_runner.sh BEFORE_SKYLOOM AFTER_SKYLOOM   env: ROUNDS (5), STEPS (20), THREADS (2)
set -euo pipefail
before=${1:?usage: bench_runner.sh BEFORE_SKYLOOM AFTER_SKYLOOM}
after=${2:?usage: bench_runner.sh BEFORE_SKYLOOM AFTER_SKYLOOM}
rounds=${ROUNDS:-5} steps=${STEPS:-20} threads=${THREADS:-2}
here=$(cd "$(dirname "$0")" && pwd)
d=$(mktemp -d /tmp/skyloom-bench-runner-XXXXXX)
trap 'rm -rf "$d"' EXIT

"$here/config_b.sh" "$after" "$d" 128

# one NAME EXE ROUND: a run, its JSON line appended to $d/runs
one() {
  "$2" -q train --config "$d/b.json" --data "$d/b.shard" --steps "$steps" --batch 8 \
      --micro-batches 1 --threads "$threads" --seed 1 --metrics "$d/m.csv" --json > "$d/out.json"
  python3 - "$1" "$3" "$d/out.json" "$d/m.csv" <<'PY' | tee -a "$d/runs"
import csv, json, statistics, sys
name, rnd, out, m = sys.argv[1], int(sys.argv[2]), json.load(open(sys.argv[3])), sys.argv[4]
dt = [float(r["seconds"]) for r in csv.DictReader(open(m))][1:]
print(json.dumps({"build": name, "round": rnd, "tokens_per_s": round(8 * 128 / statistics.median(dt), 1),
                  "json_tokens_per_s": round(out["tokens_per_s"], 1), "first_loss": out["first_loss"],
                  "last_loss": out["last_loss"], "load": open("/proc/loadavg").read().split()[0]}))
PY
}

for r in $(seq "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then
    one before "$before" "$r"; one after "$after" "$r"
  else
    one after "$after" "$r"; one before "$before" "$r"
  fi
done

python3 - "$d/runs" <<'PY'
import json, statistics as st, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
def of(b, k): return [r[k] for r in sorted(runs, key=lambda r: r["round"]) if r["build"] == b]
s = {"summary": True, "rounds": len(of("after", "round"))}
for k in ("tokens_per_s", "json_tokens_per_s"):
    a, b = of("after", k), of("before", k)
    rr = [x / y for x, y in zip(a, b)]
    s[k] = {"before": st.median(b), "after": st.median(a), "after_over_before": round(st.median(a) / st.median(b), 3),
            "per_round": [round(st.median(rr), 3), round(min(rr), 3), round(max(rr), 3)]}
s["same_losses"] = of("after", "first_loss") == of("before", "first_loss") and of("after", "last_loss") == of("before", "last_loss")
print(json.dumps(s))
PY
