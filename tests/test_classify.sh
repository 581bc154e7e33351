#!/usr/bin/env bash
# Sequence classification end to end:
#  - a classifier built by PyTorch under Hugging Face's names gives the same
#    logits, loss, accuracy, macro-F1 and confusion matrix in `skyloom eval
#    --task classify` and the same labels, scores and logits in `skyloom
#    predict` as BertForSequenceClassification and the text-classification
#    pipeline written in plain PyTorch (tests/ref/classify_ref.py);
#  - fine-tuning on the fortunes' subjects (each fortune file a label) beats
#    the majority class on held-out fortunes by a margin a broken head could
#    not reach;
#  - --stages gives bit for bit the one-stage run, and a checkpoint resumes
#    under another cut exactly; a federation of owners with one labels.txt
#    too, and owners of other labels are refused; in bf16 compute too, its
#    losses, held-out metrics and predictions close to fp32's;
#  - --init from an MLM checkpoint names the head it initialises, from a
#    classification checkpoint none;
#  - data prepare --labels refuses bad input naming the file and line, and
#    data inspect counts the sequences of each label;
#  - configs, shards and models that do not fit are refused by name.
# usage: test_classify.sh SKYLOOM SOURCE_ROOT
set -u
sk="$1"; src="$2"
py=/usr/bin/python3
fail=0
check() { local desc="$1"; shift; if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi; }
d=$(mktemp -d /tmp/skyloom-classify-XXXXXX)
trap 'rm -rf "$d"' EXIT

# ---- bad input to data prepare --labels: each names the file and line ------
"$src"/scripts/demo-corpus.sh "$d/corpus.txt" 2>/dev/null
"$sk" -q data vocab --corpus "$d/corpus.txt" --size 2048 --out "$d/vocab.txt" >/dev/null
prep() { "$sk" -q data prepare --labels --vocab "$d/vocab.txt" --seq 32 "$@"; }
bad() { # bad DESC WANT FILE-CONTENT [ARGS...]: the input refused, exit 1, the message
    local desc="$1" want="$2" content="$3"; shift 3
    printf '%b' "$content" > "$d/bad.in"
    local err rc
    err=$(prep --in "$d/bad.in" --out "$d/bad.shard" "$@" 2>&1); rc=$?
    check "bad input: $desc" bash -c 'test $0 -eq 1 && grep -qF -- "$1" <<<"$2" && ! test -e "$3"' \
        "$rc" "$want" "$err" "$d/bad.shard" || echo "     got: $err"
}
bad "a line without a tab" "bad.in:2: no tab between the label and the text" 'a\tfine\nb no tab\n'
bad "an empty text" "bad.in:3: empty text" 'a\tone\nb\ttwo\nb\t  \n'
bad "a text without tokens" "bad.in:2: empty text (no tokens)" 'a\tone\nb\t\x01\x02\n'
bad "an empty label" "bad.in:1: the label is empty" '\tone\nb\ttwo\n'
bad "bad JSON" "bad.in:2: bad JSON" '{"label": "a", "text": "one"}\n{"label": "b", "text": \n'
bad "JSON without a text" 'bad.in:1: no "text"' '{"label": "a", "txt": "one"}\n'
bad "a JSON label neither string nor integer" 'bad.in:1: "label" must be a string or an integer' '{"label": [1], "text": "one"}\n'
printf 'a\nb\n' > "$d/ab.txt"
bad "a label outside --label-vocab" "bad.in:2: label 'c' is not in $d/ab.txt (2 labels)" 'a\tone\nc\ttwo\n' --label-vocab "$d/ab.txt"
bad "a single label" "the input has 1 distinct label" 'a\tone\na\ttwo\n'
printf 'a\nb\na\n' > "$d/dup.txt"
bad "a duplicate in --label-vocab" "$d/dup.txt: duplicate label 'a' on lines 1 and 3" 'a\tone\nb\ttwo\n' --label-vocab "$d/dup.txt"
err=$("$sk" -q data prepare --vocab "$d/vocab.txt" --seq 32 --in "$d/ab.txt" --out "$d/x.shard" --label-vocab "$d/ab.txt" 2>&1); rc=$?
check "--label-vocab without --labels: exit 2" bash -c 'test $0 -eq 2 && grep -q "goes with --labels" <<<"$1"' $rc "$err"

# ---- the fortunes' subjects: a labelled corpus, held-out every fifth -------
"$src"/scripts/fortune-labels.sh "$d/all.tsv" 2>/dev/null
grep -P '^(food|linux|sports|startrek)\t' "$d/all.tsv" > "$d/sub.tsv"
awk 'NR % 5 != 0' "$d/sub.tsv" > "$d/train.tsv"
awk 'NR % 5 == 0' "$d/sub.tsv" > "$d/test.tsv"
# JSON lines too: the same held-out examples as {"label", "text"}
"$py" -c 'import json, sys
for line in open(sys.argv[1], encoding="utf-8"):
    l, t = line.rstrip("\n").split("\t", 1)
    print(json.dumps({"label": l, "text": t, "source": "fortunes"}))' "$d/test.tsv" > "$d/test.jsonl"
mkdir -p "$d/data"
prep --in "$d/train.tsv" --out "$d/data/train.shard" > "$d/prep.out"; rc=$?
check "prepare --labels: exit 0, labels.txt beside the shard" \
    bash -c 'test $0 -eq 0 && test "$(cat "$1/data/labels.txt")" = "$(printf "food\nlinux\nsports\nstartrek")"' $rc "$d"
prep --in "$d/test.jsonl" --out "$d/data/test.shard" --label-vocab "$d/data/labels.txt" > /dev/null; rc=$?
check "prepare --labels from JSON lines with --label-vocab: exit 0" test $rc -eq 0
prep --in "$d/test.tsv" --out "$d/data/test-tsv.shard" > /dev/null 2>&1; rc=$?
check "the same labels again beside the shard: labels.txt kept" test $rc -eq 0
"$sk" -q data inspect "$d/data/test.shard" --json --show 0 > "$d/inspect.json"
"$sk" -q data inspect "$d/data/test-tsv.shard" --json --show 0 > "$d/inspect-tsv.json"
want=$(cut -f1 "$d/test.tsv" | sort | uniq -c | awk '{printf "%s=%s ", $2, $1}')
got=$("$py" -c 'import json, sys
j = json.load(open(sys.argv[1]))["labels"]
print(" ".join("%s=%d" % (n, c) for n, c in zip(j["names"], j["sequences"])), end=" ")' "$d/inspect.json")
check "inspect --json: the sequences of each label ($got)" test "$got" = "$want"
check "JSON lines and LABEL<TAB>TEXT of the same examples: the same counts" \
    bash -c '"$0" -c "import json, sys; a, b = (json.load(open(p)) for p in sys.argv[1:]); sys.exit(a[\"labels\"] != b[\"labels\"] or a[\"tokens\"] != b[\"tokens\"])" "$1" "$2"' "$py" "$d/inspect.json" "$d/inspect-tsv.json"
out=$("$sk" -q data inspect "$d/data/train.shard" --show 1)
n_linux=$(grep -c $'^linux\t' "$d/train.tsv")
check "inspect: version 2, a line per label with its count" \
    bash -c 'grep -q "format:      version 2" <<<"$0" && grep -Eq "^ +1  linux +$1 " <<<"$0" && grep -q "label " <<<"$0"' "$out" "$n_linux"

# ---- fine-tuning: the held-out accuracy against the majority class ---------
cat > "$d/cfg.json" <<'JSON'
{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 256,
 "vocab_size": 2048, "max_position_embeddings": 32, "num_labels": 4}
JSON
"$sk" -q train --task classify --config "$d/cfg.json" --data "$d/data/train.shard" --steps 240 \
    --batch 16 --lr 1e-3 --save "$d/ft" --json > "$d/ft.json"; rc=$?
check "train --task classify: exit 0" test $rc -eq 0
m=(--config "$d/ft/step-240/config.json" --model "$d/ft/step-240/model.safetensors")
"$sk" -q eval --task classify "${m[@]}" --data "$d/data/test.shard" --json > "$d/eval.json"; rc=$?
check "eval --task classify on the held-out fortunes: exit 0" test $rc -eq 0
"$py" - "$d/eval.json" "$d/train.tsv" <<'PY'
import collections, json, sys
e = json.load(open(sys.argv[1]))
train = collections.Counter(l.split("\t", 1)[0] for l in open(sys.argv[2], encoding="utf-8"))
major = train.most_common(1)[0][0]  # the majority class of the training data
k = e["labels"].index(major)
support = [sum(r) for r in e["confusion"]]
base_acc = support[k] / e["sequences"]
# always predicting it: F1 2p/(1+p) for that class, 0 for the others
base_f1 = (2 * base_acc / (1 + base_acc)) / len(e["labels"])
print("     held-out: accuracy %.3f (majority '%s' %.3f), macro-F1 %.3f (majority %.3f), loss %.3f"
      % (e["accuracy"], major, base_acc, e["macro_f1"], base_f1, e["loss"]))
ok = e["accuracy"] >= base_acc + 0.15 and e["macro_f1"] >= base_f1 + 0.25 and e["loss"] < 1.3
sys.exit(0 if ok else 1)
PY
check "fine-tuned: held-out accuracy >= majority + 0.15, macro-F1 >= majority's + 0.25" test $? -eq 0
"$py" -c 'import json, sys
j = json.load(open(sys.argv[1]))
assert len(j["confusion"]) == 4 and all(len(r) == 4 for r in j["confusion"])
assert sum(map(sum, j["confusion"])) == j["sequences"]
assert [c["label"] for c in j["per_class"]] == j["labels"] == ["food", "linux", "sports", "startrek"]
assert all(0 <= c[k] <= 1 for c in j["per_class"] for k in ("precision", "recall", "f1"))' "$d/eval.json"
check "eval --json: per-class precision, recall and F1, the 4x4 confusion matrix" test $? -eq 0
"$py" -c 'import json, sys
c = json.load(open(sys.argv[1]))
assert c["architectures"] == ["BertForSequenceClassification"]
assert c["num_labels"] == 4 and c["problem_type"] == "single_label_classification"
assert c["id2label"] == {"0": "food", "1": "linux", "2": "sports", "3": "startrek"}
assert c["label2id"] == {"food": 0, "linux": 1, "sports": 2, "startrek": 3}' "$d/ft/step-240/config.json"
check "the checkpoint's config.json: id2label from the shard, label2id, problem_type" test $? -eq 0
out=$("$sk" -q predict "${m[@]}" --vocab "$d/vocab.txt" --text "The kernel panicked while booting Linux." --top-k 4)
check "predict: four labels with scores, best first" \
    bash -c 'test $(wc -l <<<"$0") -eq 4 && awk "{print \$1}" <<<"$0" | sort -rc 2>/dev/null' "$out"

# ---- --stages: bit for bit the one-stage run; resume under another cut ----
common=(--task classify --config "$d/cfg.json" --data "$d/data/train.shard" --steps 6 --batch 8
        --micro-batches 4 --lr 1e-3 --save-every 3)
"$sk" -q train "${common[@]}" --save "$d/s1" >/dev/null 2>&1
"$sk" -q train "${common[@]}" --save "$d/s3" --stages 0-0,1-2,3-3 >/dev/null 2>&1
"$sk" -q train "${common[@]}" --save "$d/s2" --stages 0-1,2-3 --schedule gpipe --recompute >/dev/null 2>&1
same() { cmp -s "$d/$1/step-6/model.safetensors" "$d/$2/step-6/model.safetensors" &&
         [ "$(cut -d, -f1-4 "$d/$1/metrics.csv")" = "$(cut -d, -f1-4 "$d/$2/metrics.csv")" ]; }
check "--stages 0-0,1-2,3-3: the one-stage model bytes and losses" same s1 s3
check "--stages 0-1,2-3, GPipe, --recompute: the same" same s1 s2
mkdir -p "$d/r"
cp -r "$d/s3/step-3" "$d/r/"
"$sk" -q train "${common[@]}" --save "$d/r" --resume "$d/r/step-3" --stages 0-2,3-3 >/dev/null 2>&1; rc=$?
check "resumed at step 3 under another cut: the one-stage model at step 6" \
    bash -c 'test $0 -eq 0 && cmp -s "$1/s1/step-6/model.safetensors" "$1/r/step-6/model.safetensors"' $rc "$d"

# ---- a federation of classifiers (docs/federation.md): two owners' shards of
# one labels.txt, each mostly other subjects; a federation of one is the
# plain run, the replicas' cuts change no bit, a run stopped mid-interval
# resumes under other cuts exactly; owners of other labels are refused
grep -P '^(food|linux)\t' "$d/train.tsv" > "$d/fa.tsv"
{ grep -P '^(sports|startrek)\t' "$d/train.tsv"; head -n 20 "$d/fa.tsv"; } > "$d/fb.tsv"
printf 'food\nlinux\nstartrek\nsports\n' > "$d/swapped.txt"
mkdir -p "$d/fa" "$d/fb" "$d/fc"
prep --in "$d/fa.tsv" --out "$d/fa/a.shard" --label-vocab "$d/data/labels.txt" >/dev/null
prep --in "$d/fb.tsv" --out "$d/fb/b.shard" --label-vocab "$d/data/labels.txt" >/dev/null
prep --in "$d/fb.tsv" --out "$d/fc/c.shard" --label-vocab "$d/swapped.txt" >/dev/null
"$sk" -q train "${common[@]}" --save "$d/one-fed" --sync step >/dev/null 2>&1
check "a federation of one (--sync step) is the plain run: the same model bytes and losses" same s1 one-fed
fed=(--task classify --config "$d/cfg.json" --data "$d/fa/a.shard" --data "$d/fb/b.shard"
     --owner-batch 8,4 --micro-batches 4 --lr 1e-3 --steps 6 --sync outer:2)
"$sk" -q train "${fed[@]}" --save "$d/f1" >/dev/null 2>&1
"$sk" -q train "${fed[@]}" --save "$d/f2" --replica-stages "0-1,2-3;0-0,1-2,3-3" --stop-at 3 >/dev/null 2>&1
"$sk" -q train "${fed[@]}" --save "$d/f2" --resume "$d/f2/step-3" --stages 2 >/dev/null 2>&1; rc=$?
check "federation: other cuts and a resume at step 3 give the model and federation state bytes" \
    bash -c 'test $0 -eq 0 && cmp -s "$1/f1/step-6/model.safetensors" "$1/f2/step-6/model.safetensors" && cmp -s "$1/f1/step-6/fed.safetensors" "$1/f2/step-6/fed.safetensors" && [ "$(cut -d, -f1-4 "$1/f1/metrics.csv")" = "$(cut -d, -f1-4 "$1/f2/metrics.csv")" ]' $rc "$d"
check "federation: the checkpoint's config.json names the shards' labels" \
    "$py" -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["id2label"] != {"0": "food", "1": "linux", "2": "sports", "3": "startrek"})' "$d/f1/step-6/config.json"
err=$("$sk" -q train "${fed[@]}" --data "$d/fc/c.shard" --owner-batch 8,4,4 2>&1); rc=$?
check "federation: an owner's shard of other labels refused by name, exit 1" \
    bash -c 'test $0 -eq 1 && grep -qF "$1/fc/c.shard has other labels than $1/fa/a.shard" <<<"$2"' $rc "$d" "$err"

# ---- bf16 compute, where the CPU has it: --stages bit for bit the one-stage
# bf16 run, its losses close to fp32's; eval and predict in bf16 close to fp32
out=$("$sk" -q train "${common[@]}" --precision bf16 --save "$d/b1" 2>&1); rc=$?
if [ $rc -eq 0 ]; then
    "$sk" -q train "${common[@]}" --precision bf16 --save "$d/b3" --stages 0-0,1-2,3-3 >/dev/null 2>&1
    check "bf16: --stages 0-0,1-2,3-3, the one-stage bf16 model bytes and losses" same b1 b3
    "$sk" -q train "${fed[@]}" --precision bf16 --save "$d/fb1" >/dev/null 2>&1
    "$sk" -q train "${fed[@]}" --precision bf16 --save "$d/fb2" --replica-stages "0-1,2-3;0-0,1-2,3-3" >/dev/null 2>&1
    check "bf16: a federation of classifiers under other cuts, the same model bytes and losses" same fb1 fb2
    check "bf16: each step's loss within 1% of fp32's, not equal to it" \
        awk -F, 'NR == FNR { if (FNR > 1) l[FNR] = $2; next }
                 FNR > 1 { d = $2 - l[FNR]; if (d < 0) d = -d; if (d > 0.01 * l[FNR]) bad = 1; if (d > 0) moved = 1 }
                 END { exit bad || !moved }' "$d/s1/metrics.csv" "$d/b1/metrics.csv"
    "$sk" -q eval --task classify "${m[@]}" --data "$d/data/test.shard" --precision bf16 --json > "$d/eval16.json"; rc=$?
    check "eval --task classify --precision bf16: exit 0, loss within 1% of fp32's, accuracy within 0.02" \
        "$py" -c 'import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
print("     held-out loss fp32 %.5f bf16 %.5f, accuracy %.4f and %.4f" % (a["loss"], b["loss"], a["accuracy"], b["accuracy"]))
sys.exit(not (b["precision"] == "bf16" and abs(a["loss"] - b["loss"]) < 0.01 * a["loss"] and abs(a["accuracy"] - b["accuracy"]) <= 0.02))' "$d/eval.json" "$d/eval16.json"
    p32=$("$sk" -q predict "${m[@]}" --vocab "$d/vocab.txt" --text "The kernel panicked while booting Linux." --json)
    p16=$("$sk" -q predict "${m[@]}" --vocab "$d/vocab.txt" --text "The kernel panicked while booting Linux." --json --precision bf16)
    check "predict --precision bf16: the same label, its score within 0.01 of fp32's" \
        "$py" -c 'import json, sys
a, b = (json.loads(t)[0] for t in sys.argv[1:])
sys.exit(not (a["label"] == b["label"] and abs(a["score"] - b["score"]) < 0.01))' "$p32" "$p16"
elif grep -q "AVX512_BF16" <<<"$out"; then
    echo "skip bf16 compute (this CPU has none): $out"
else
    check "train --task classify --precision bf16: exit 0" false
    echo "     got: $out"
fi

# ---- --init: from an MLM checkpoint (the head initialised, said), from a classifier
sed 's/, "num_labels": 4//' "$d/cfg.json" > "$d/mlm.json"
"$sk" -q data prepare --vocab "$d/vocab.txt" --in "$d/corpus.txt" --out "$d/text.shard" --seq 32 >/dev/null
"$sk" -q train --config "$d/mlm.json" --data "$d/text.shard" --steps 2 --batch 4 --save "$d/mlm" >/dev/null 2>&1
"$sk" train --task classify --config "$d/cfg.json" --data "$d/data/train.shard" --steps 2 --batch 4 \
    --init "$d/mlm/step-2/model.safetensors" --json > "$d/init.json" 2> "$d/init.err"; rc=$?
check "--init from an MLM checkpoint: exit 0, the log names the four tensors of the new head" \
    bash -c 'test $0 -eq 0 && grep -q "lacks the classification head" "$1" && grep -q "bert.pooler.dense.weight, bert.pooler.dense.bias, classifier.weight, classifier.bias" "$1"' $rc "$d/init.err"
check "--init from an MLM checkpoint: --json lists them" \
    "$py" -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["initialised"] != ["bert.pooler.dense.weight", "bert.pooler.dense.bias", "classifier.weight", "classifier.bias"])' "$d/init.json"
"$sk" -q train --task classify --config "$d/cfg.json" --data "$d/data/train.shard" --steps 2 --batch 4 \
    --init "$d/ft/step-240/model.safetensors" --json > "$d/init2.json" 2>&1; rc=$?
check "--init from a classification checkpoint: nothing initialised" \
    bash -c 'test $0 -eq 0 && "$1" -c "import json, sys; sys.exit(json.load(open(sys.argv[1]))[\"initialised\"] != [])" "$2"' $rc "$py" "$d/init2.json"

# ---- refusals ----------------------------------------------------------------
err=$("$sk" -q train --task classify --config "$d/cfg.json" --data "$d/text.shard" --steps 1 2>&1); rc=$?
check "classify on a shard without labels: exit 1, said" \
    bash -c 'test $0 -eq 1 && grep -q "the shard has no labels" <<<"$1"' $rc "$err"
sed 's/"num_labels": 4/"num_labels": 3/' "$d/cfg.json" > "$d/k3.json"
err=$("$sk" -q train --task classify --config "$d/k3.json" --data "$d/data/train.shard" --steps 1 2>&1); rc=$?
check "num_labels 3 for a shard of 4 labels: exit 1, both named" \
    bash -c 'test $0 -eq 1 && grep -q "the shard has 4 labels, the config.s num_labels is 3" <<<"$1"' $rc "$err"
sed 's/"num_labels": 4/"id2label": {"0": "food", "1": "sports", "2": "linux", "3": "startrek"}/' "$d/cfg.json" > "$d/names.json"
err=$("$sk" -q train --task classify --config "$d/names.json" --data "$d/data/train.shard" --steps 1 2>&1); rc=$?
check "id2label naming the classes in another order: exit 1" \
    bash -c 'test $0 -eq 1 && grep -q "gives class 1 the name .sports., the shard.s labels .linux." <<<"$1"' $rc "$err"
err=$("$sk" -q eval "${m[@]}" --data "$d/data/test.shard" 2>&1); rc=$?
check "eval (MLM) of a classifier: exit 1, the classification head named" \
    bash -c 'test $0 -eq 1 && grep -q "classifier.weight.: the file holds a classification head" <<<"$1"' $rc "$err"
err=$("$sk" -q eval --task classify --config "$d/cfg.json" --model "$d/mlm/step-2/model.safetensors" --data "$d/data/test.shard" 2>&1); rc=$?
check "eval --task classify of an MLM model: exit 1, the missing pooler named" \
    bash -c 'test $0 -eq 1 && grep -q "missing tensor .bert.pooler.dense.weight." <<<"$1"' $rc "$err"
err=$("$sk" -q predict "${m[@]}" --vocab "$d/vocab.txt" --text "x" --top-k 5 2>&1); rc=$?
check "predict --top-k beyond the labels: exit 2" bash -c 'test $0 -eq 2 && grep -q "exceeds the model.s 4 labels" <<<"$1"' $rc "$err"
err=$("$sk" -q train --task regress --config "$d/cfg.json" --data "$d/data/train.shard" --steps 1 2>&1); rc=$?
check "--task regress: exit 2" test $rc -eq 2
sed 's/"num_labels": 4/"num_labels": 4, "problem_type": "regression"/' "$d/cfg.json" > "$d/reg.json"
err=$("$sk" -q train --task classify --config "$d/reg.json" --data "$d/data/train.shard" --steps 1 2>&1); rc=$?
check "problem_type regression: exit 1, said" bash -c 'test $0 -eq 1 && grep -q "problem_type regression is not supported" <<<"$1"' $rc "$err"

# ---- against PyTorch: eval and predict of a classifier torch made ---------
if ! "$py" -c "import torch" 2>/dev/null; then
    echo "SKIP the PyTorch comparisons: python3-torch missing (make deps)"
    exit $fail
fi
t="$d/torch"; mkdir -p "$t"
"$py" "$src/tests/ref/classify_ref.py" make "$t" || { echo "FAIL the reference could not make a model"; exit 1; }
"$sk" -q data prepare --labels --vocab "$t/vocab.txt" --label-vocab "$t/labels.txt" --in "$t/data.tsv" \
    --out "$t/data.shard" --seq 16 >/dev/null
tm=(--config "$t/config.json" --model "$t/model.safetensors")
"$sk" -q eval --task classify "${tm[@]}" --data "$t/data.shard" --batch 5 --json --logits "$t/eval.f32" > "$t/eval.json"; rc=$?
check "eval --task classify of torch's model: exit 0" test $rc -eq 0
"$py" "$src/tests/ref/classify_ref.py" eval "$t" 16 "$t/eval.json" "$t/eval.f32"
check "eval: logits, loss, accuracy, macro-F1, confusion as PyTorch's" test $? -eq 0
texts=("the cat sat on the mat" "Paris is the capital of France [SEP] the king's house" "she ran")
# each case: top-k, then the texts; skyloom's outputs first, one PyTorch run for all
cases=("1|${texts[0]}|${texts[1]}|${texts[2]}" "2|${texts[0]}|${texts[1]}|${texts[2]}"
       "3|${texts[0]}|${texts[1]}|${texts[2]}" "2|a big red dog")
rcs=0
printf '[' > "$t/cases.json"
for i in "${!cases[@]}"; do
    IFS='|' read -r -a c <<<"${cases[$i]}"
    args=()
    for x in "${c[@]:1}"; do args+=(--text "$x"); done
    "$sk" -q predict "${tm[@]}" --vocab "$t/vocab.txt" "${args[@]}" --top-k "${c[0]}" --json \
        --logits "$t/p$i.f32" > "$t/p$i.json" || rcs=1
    "$py" -c 'import json, sys; print(json.dumps({"topk": int(sys.argv[1]), "texts": sys.argv[4:], "out": sys.argv[2], "logits": sys.argv[3]}))' \
        "${c[0]}" "$t/p$i.json" "$t/p$i.f32" "${c[@]:1}" >> "$t/cases.json"
    [ "$i" -lt $((${#cases[@]} - 1)) ] && printf ',' >> "$t/cases.json"
done
printf ']' >> "$t/cases.json"
check "predict: exit 0 for every case" test $rcs -eq 0
"$py" "$src/tests/ref/classify_ref.py" predict "$t" "$t/cases.json"
check "predict, three texts with top-k 1, 2, 3 and one text with top-k 2: as the PyTorch pipeline" test $? -eq 0
exit $fail
