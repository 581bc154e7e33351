#!/usr/bin/env bash
# skyloom fill-mask against Hugging Face's fill-mask pipeline written in plain
# PyTorch (tests/ref/fill_mask_ref.py) on a small random BERT that torch made
# and saved: the same logits (1e-4 relative), top-k, scores, token strings and
# filled sequences; one mask and several, cased and uncased; in bf16, the
# same top 5 and logits near fp32's; and the errors.
# usage: test_fill_mask.sh SKYLOOM SOURCE_ROOT
set -u
sk="$1"; src="$2"
py=/usr/bin/python3
if ! "$py" -c "import torch" 2>/dev/null; then echo "SKIP: python3-torch missing (make deps)"; exit 77; fi
ref="$src/tests/ref/fill_mask_ref.py"
dir=$(mktemp -d /tmp/skyloom-fillmask-XXXXXX); trap 'rm -rf "$dir"' EXIT
fail=0
check() { # check DESC CMD...
    local desc="$1"; shift
    if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi
}
"$py" "$ref" make "$dir" || { echo "FAIL the reference could not make a model"; exit 1; }
m=(--config "$dir/config.json" --model "$dir/model.safetensors" --vocab "$dir/vocab.txt")

compare() { # compare DESC TEXT TOPK [--cased]
    local desc="$1" text="$2" k="$3" mode=uncased; shift 3
    [ "${1:-}" = --cased ] && mode=cased
    rm -f "$dir/out.json" "$dir/l.f32"
    "$sk" -q fill-mask "${m[@]}" --text "$text" --top-k "$k" --json --logits "$dir/l.f32" "$@" > "$dir/out.json"
    check "$desc: exits 0" test $? -eq 0
    "$py" "$ref" check "$dir" "$text" "$k" $mode "$dir/out.json" "$dir/l.f32"
    check "$desc: as the PyTorch pipeline" test $? -eq 0
}
compare "one mask" "Paris is the [MASK] of France." 5
compare "two masks, contractions, top 10" "The king's [MASK] sat on the [MASK]!" 10
compare "a mask against text and punctuation" "the cat[MASK], a dog ran." 3
compare "cased, accents kept, [UNK] and [SEP] written in the text" "Café [UNK] [MASK] the river [SEP] a house" 4 --cased
compare "the whole vocabulary" "[MASK]" 52

# --precision bf16 (where the CPU has it): the products in bf16, the logits
# within 3e-2 of the largest (a bf16 operand is within 2^-9 of its value;
# measured 1.2e-2), the same three best tokens at each mask
rm -f "$dir/l16.f32" "$dir/l32.f32"
"$sk" -q fill-mask "${m[@]}" --text "The king's [MASK] sat on the [MASK]!" --top-k 5 --json --logits "$dir/l32.f32" > "$dir/o32.json"
if "$sk" -q fill-mask "${m[@]}" --text "The king's [MASK] sat on the [MASK]!" --top-k 5 --json --logits "$dir/l16.f32" --precision bf16 > "$dir/o16.json" 2>"$dir/e16.txt"; then
  check "--precision bf16: logits within 3e-2 of fp32's, the same top 3" "$py" -c '
import json, sys
import numpy as np
a, b = np.fromfile(sys.argv[1], "<f4"), np.fromfile(sys.argv[2], "<f4")
rel = float(np.abs(a - b).max() / np.abs(a).max())
print("     bf16 logits against fp32: rel %.3g" % rel)
ta = [[c["token"] for c in m[:3]] for m in json.load(open(sys.argv[3]))]
tb = [[c["token"] for c in m[:3]] for m in json.load(open(sys.argv[4]))]
sys.exit(0 if rel <= 3e-2 and ta == tb else 1)' "$dir/l32.f32" "$dir/l16.f32" "$dir/o32.json" "$dir/o16.json"
else
  check "--precision bf16 without bf16 instructions: refused naming them" grep -q "AVX512_BF16" "$dir/e16.txt"
fi
err=$("$sk" fill-mask "${m[@]}" --text "[MASK]" --precision half 2>&1); rc=$?
check "--precision half: exit 2" bash -c 'test $0 -eq 2 && grep -q "fp32 or bf16" <<<"$1"' $rc "$err"

out=$("$sk" -q fill-mask "${m[@]}" --text "Paris is the [MASK] of France." --top-k 3); rc=$?
check "text output: three lines of score, token, id, sequence" \
    bash -c 'test $0 -eq 0 && test $(wc -l <<<"$1") -eq 3 && grep -Eq "^ *0\.[0-9]{4}  \S+ +[0-9]+  paris is the .* of france\.$" <<<"$1"' $rc "$out"
out=$("$sk" -q fill-mask "${m[@]}" --text "the [MASK] sat on the [MASK]." --top-k 2); rc=$?
check "text output with two masks: a header per mask" \
    bash -c 'test $0 -eq 0 && grep -q "^\[MASK\] 1 of 2 (token 2):" <<<"$1" && grep -q "^\[MASK\] 2 of 2 (token 6):" <<<"$1"' $rc "$out"

err=$("$sk" fill-mask "${m[@]}" --text "no mask here" 2>&1); rc=$?
check "a text without [MASK]: exit 2" bash -c 'test $0 -eq 2 && grep -q "skyloom fill-mask: --text has no \[MASK\]" <<<"$1"' $rc "$err"
long=$(printf 'the %.0s' $(seq 40))
err=$("$sk" fill-mask "${m[@]}" --text "$long [MASK]" 2>&1); rc=$?
check "a text longer than max_position_embeddings: exit 1" bash -c 'test $0 -eq 1 && grep -q "more than the model.s max_position_embeddings (32)" <<<"$1"' $rc "$err"
head -n 40 "$dir/vocab.txt" > "$dir/v40.txt"
err=$("$sk" fill-mask --config "$dir/config.json" --model "$dir/model.safetensors" --vocab "$dir/v40.txt" --text "[MASK]" 2>&1); rc=$?
check "a vocabulary of another size: exit 1" bash -c 'test $0 -eq 1 && grep -q "has 40 tokens but the model.s vocab_size is 52" <<<"$1"' $rc "$err"
err=$("$sk" fill-mask "${m[@]}" --text "[MASK]" --top-k 53 2>&1); rc=$?
check "--top-k beyond the vocabulary: exit 2" test $rc -eq 2
err=$("$sk" fill-mask "${m[@]}" --text "$(printf 'a \xff [MASK]')" 2>&1); rc=$?
check "invalid UTF-8 in --text: exit 2" bash -c 'test $0 -eq 2 && grep -q "invalid UTF-8" <<<"$1"' $rc "$err"
head -c 1000 "$dir/model.safetensors" > "$dir/cut.safetensors"
err=$("$sk" fill-mask --config "$dir/config.json" --model "$dir/cut.safetensors" --vocab "$dir/vocab.txt" --text "[MASK]" 2>&1); rc=$?
check "a truncated model: exit 1 with a reason" bash -c 'test $0 -eq 1 && test $(wc -l <<<"$1") -eq 1 && grep -q "^skyloom fill-mask: " <<<"$1"' $rc "$err"
err=$("$sk" fill-mask --text "[MASK]" 2>&1); rc=$?
check "missing options: exit 2" test $rc -eq 2
"$sk" fill-mask --help | grep -q "usage: skyloom fill-mask"; check "fill-mask --help" test $? -eq 0
"$sk" help fill-mask | grep -q "usage: skyloom fill-mask"; check "help fill-mask" test $? -eq 0
exit $fail
