#!/usr/bin/env bash
# The C tokenizer against bert_tokenization_ref.py (BERT's tokenization.py
# transcribed): the same words and WordPiece ids, cased and uncased, on
# random text from many Unicode blocks and on the demo corpus when present;
# skyloom data tokenize against the same reference, line by line.
# usage: test_tok_oracle.sh TOK_DUMP SKYLOOM REF_PY DEMO_CORPUS_SH
set -u
dump="$1"; sk="$2"; ref="$3"; demo="$4"
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3 || true)
if [ -z "$py" ]; then echo "SKIP: no python3"; exit 77; fi
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail=0
"$py" "$ref" --random "$dir/rand.txt" 7 80000 || exit 1
# an English-like corpus to learn a vocabulary from (generated, no package needed)
"$py" - "$dir/gen.txt" <<'PY'
import random, sys
r = random.Random(3)
syl = ["ka", "ro", "mi", "ten", "sha", "lo", "ver", "qu", "ing", "ed", "an", "the", "Zu", "Élan", "naïve"]
with open(sys.argv[1], "w", encoding="utf-8") as f:
    for d in range(400):
        for s in range(r.randrange(1, 6)):
            words = ["".join(r.choice(syl) for _ in range(r.randrange(1, 4))) for _ in range(r.randrange(3, 15))]
            f.write(" ".join(words) + r.choice([".", "!", "?", ",", "'s"]) + "\n")
        f.write("\n")
PY
texts=("$dir/rand.txt" "$dir/gen.txt")
if [ -d /usr/share/games/fortunes ] && "$demo" "$dir/demo_all.txt" 2>/dev/null; then
    head -n 8000 "$dir/demo_all.txt" > "$dir/demo.txt"  # the first ~270 KB keeps this quick
    texts+=("$dir/demo.txt")
else
    echo "note: demo corpus not available (package fortunes), generated text only"
fi
for mode in uncased cased; do
    flag=; [ $mode = cased ] && flag=--cased
    "$sk" -q data vocab --corpus "$dir/gen.txt" --size 1200 --out "$dir/v_$mode.txt" $flag >/dev/null || { echo "FAIL vocab"; exit 1; }
    for t in "${texts[@]}"; do
        name=$(basename "$t")
        "$dump" "$t" $mode "$dir/v_$mode.txt" > "$dir/c.txt" && "$py" "$ref" "$t" $mode "$dir/v_$mode.txt" > "$dir/p.txt"
        if cmp -s "$dir/c.txt" "$dir/p.txt"; then echo "ok   words and wordpiece ids, $mode, $name ($(wc -l < "$dir/p.txt") words)"
        else echo "FAIL $mode $name: first differences (word<TAB>ids, C then Python):"; diff "$dir/c.txt" "$dir/p.txt" | head -6; fail=1; fi
        # skyloom data tokenize: the same ids, one line per input line
        "$sk" -q data tokenize --vocab "$dir/v_$mode.txt" $flag "$t" > "$dir/c.txt" &&
            "$py" "$ref" --lines "$t" $mode "$dir/v_$mode.txt" > "$dir/p.txt"
        if cmp -s "$dir/c.txt" "$dir/p.txt"; then echo "ok   data tokenize, $mode, $name ($(wc -l < "$dir/p.txt") lines)"
        else echo "FAIL data tokenize $mode $name: first differences (C then Python):"; diff "$dir/c.txt" "$dir/p.txt" | head -6; fail=1; fi
    done
done
exit $fail
