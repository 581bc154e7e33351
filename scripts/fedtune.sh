#!/usr/bin/env bash
# Federated fine-tuning on sites whose labels differ (docs/federation.md):
# the fortunes' subjects as a labelled task (scripts/fortune-labels.sh), six
# subjects, every fifth fortune of each held out for evaluation. A small BERT
# is pre-trained with MLM on the other fortunes' text, then fine-tuned on
# subject classification from it by:
#   - all data in one place (one site holding every training fortune);
#   - each of three sites alone; site s holds 80% of the training fortunes
#     of its two home subjects and 10% of each other site's (the label skew
#     of federated-learning papers: each site mostly sees two subjects);
#   - the three sites as a federation, --sync step (gradients averaged every
#     step) and --sync outer:H (DiLoCo);
# each for the same steps and sequences per step (sites alone: the same
# batch from their own shard). Every model is evaluated on the held-out set,
# which covers every subject; the majority class of the training data is
# the baseline. Prints a Markdown table, each row with the command that made
# its model.
# Usage: scripts/fedtune.sh SKYLOOM WORKDIR
# Environment: PRETRAIN_STEPS (default 1500), STEPS (fine-tuning, 400),
# H (outer:H, 20), MOMENTUM (the outer momentum of fed-outer, 0.9: DiLoCo's, as
# docs/federation.md measured it), THREADS (default: all cores).
set -euo pipefail
sk=${1:?usage: scripts/fedtune.sh SKYLOOM WORKDIR}
w=${2:?usage: scripts/fedtune.sh SKYLOOM WORKDIR}
src=$(cd "$(dirname "$0")/.." && pwd)
PRETRAIN_STEPS=${PRETRAIN_STEPS:-1500}
STEPS=${STEPS:-400}
H=${H:-20}
thr=()
[ -n "${THREADS:-}" ] && thr=(--threads "$THREADS")
subjects=(food linux sports startrek law education)
mkdir -p "$w"
cd "$w"

# ---- the data ------------------------------------------------------------------
"$src"/scripts/fortune-labels.sh all.tsv
pat=$(IFS='|'; echo "${subjects[*]}")
# at most 250 fortunes per subject, in file order; every fifth held out
LC_ALL=C awk -F'\t' -v pat="^($pat)\$" '$1 ~ pat && ++n[$1] <= 250' all.tsv > sub.tsv
awk -F'\t' '++n[$1] % 5 != 0' sub.tsv > train.tsv
awk -F'\t' '++n[$1] % 5 == 0' sub.tsv > test.tsv
# the sites: subjects 2s and 2s+1 are site s's home; of each subject's
# training fortunes, 8 in 10 go to its home site, 1 in 10 to each other
awk -F'\t' -v list="${subjects[*]}" '
  BEGIN { n = split(list, s, " "); for (i = 1; i <= n; i++) home[s[i]] = int((i - 1) / 2) }
  { k = ++c[$1] % 10; site = k < 8 ? home[$1] : (home[$1] + (k == 8 ? 1 : 2)) % 3
    print > ("site" site ".tsv") }' train.tsv
# pre-training text: every fortune that is not held out
awk -F'\t' 'NR == FNR { held[$0] = 1; next } !($0 in held) { print $2 }' test.tsv all.tsv > pretrain.txt
"$sk" -q data vocab --corpus pretrain.txt --size 4096 --out vocab.txt >/dev/null
mkdir -p data/all data/site0 data/site1 data/site2 data/test
prep() { "$sk" -q data prepare --labels --vocab vocab.txt --seq 64 "$@" >/dev/null; }
prep --in train.tsv --out data/all/train.shard
for s in 0 1 2; do prep --in site$s.tsv --out data/site$s/train.shard --label-vocab data/all/labels.txt; done
prep --in test.tsv --out data/test/test.shard --label-vocab data/all/labels.txt
"$sk" -q data prepare --vocab vocab.txt --seq 64 --in pretrain.txt --out data/pretrain.shard >/dev/null
V=$(wc -l < vocab.txt)
cat > mlm.json <<JSON
{"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 512,
 "vocab_size": $V, "max_position_embeddings": 64}
JSON
sed 's/}$/, "num_labels": 6}/' mlm.json > cls.json

# ---- pre-training ----------------------------------------------------------------
pre=("$sk" -q train --config mlm.json --data data/pretrain.shard --steps "$PRETRAIN_STEPS"
     --batch 32 --lr 1e-3 --save pretrained "${thr[@]}")
"${pre[@]}" --json > pretrained.json 2>/dev/null
init=pretrained/step-$PRETRAIN_STEPS/model.safetensors

# ---- fine-tuning -------------------------------------------------------------------
ft=(--task classify --config cls.json --steps "$STEPS" --lr 5e-4 --init "$init" "${thr[@]}")
declare -A cmd
cmd[central]="train ${ft[*]} --data data/all/train.shard --batch 24"
for s in 0 1 2; do
  cmd[site$s]="train ${ft[*]} --data data/site$s/train.shard --batch 24"
done
fed="train ${ft[*]} --data data/site0/train.shard --data data/site1/train.shard --data data/site2/train.shard --owner-batch 8,8,8"
cmd[fed-step]="$fed --sync step"
cmd[fed-outer]="$fed --sync outer:$H --outer-momentum ${MOMENTUM:-0.9}"
rows=(central site0 site1 site2 fed-step fed-outer)
for r in "${rows[@]}"; do
  # shellcheck disable=SC2086
  "$sk" -q ${cmd[$r]} --save "ft-$r" > "ft-$r.log" 2>&1 ||
      { echo "fedtune: $r failed: $(tail -1 "ft-$r.log")" >&2; exit 1; }
  "$sk" -q eval --task classify --model "ft-$r/step-$STEPS" --data data/test/test.shard --json > "eval-$r.json"
done

# ---- the table -----------------------------------------------------------------------
python3 - "$w" "$STEPS" "$PRETRAIN_STEPS" "${rows[@]}" <<'PY'
import collections, json, sys
w, steps, pre, rows = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
train = collections.Counter(l.split("\t", 1)[0] for l in open(w + "/train.tsv", encoding="utf-8"))
test = collections.Counter(l.split("\t", 1)[0] for l in open(w + "/test.tsv", encoding="utf-8"))
sites = []
for s in range(3):
    c = collections.Counter(l.split("\t", 1)[0] for l in open("%s/site%d.tsv" % (w, s), encoding="utf-8"))
    sites.append(c)
labels = json.load(open(w + "/eval-central.json"))["labels"]
major = train.most_common(1)[0][0]
n = sum(test.values())
base_acc = test[major] / n
base_f1 = (2 * base_acc / (1 + base_acc)) / len(labels)
print("held-out: %d fortunes (%s)" % (n, ", ".join("%s %d" % (l, test[l]) for l in labels)))
for s, c in enumerate(sites):
    print("site%d: %d fortunes (%s)" % (s, sum(c.values()), ", ".join("%s %d" % (l, c[l]) for l in labels)))
print()
print("| setting | accuracy | macro-F1 | held-out loss |")
print("|---|---|---|---|")
print("| majority class (%s) | %.3f | %.3f | |" % (major, base_acc, base_f1))
for r in rows:
    e = json.load(open("%s/eval-%s.json" % (w, r)))
    print("| %s | %.3f | %.3f | %.3f |" % (r, e["accuracy"], e["macro_f1"], e["loss"]))
PY
echo
echo "pre-training: skyloom ${pre[*]:2}"
for r in "${rows[@]}"; do echo "$r: skyloom ${cmd[$r]} --save ft-$r"; done
echo "each evaluated: skyloom eval --task classify --model ft-ROW/step-$STEPS --data data/test/test.shard --json"
