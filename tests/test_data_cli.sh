#!/usr/bin/env bash
# skyloom data vocab / prepare / inspect end to end: on generated text always,
# and on the demo corpus (Debian package fortunes) when it is installed.
# usage: test_data_cli.sh SKYLOOM DEMO_CORPUS_SH
set -u
sk="$1"; demo="$2"
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail=0
check() { # check DESC CMD... : CMD must succeed
    local desc="$1"; shift
    if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi
}
# Generated corpus: two files in a directory, documents separated by blank lines.
mkdir -p "$dir/corpus/sub"
awk 'BEGIN { srand(11); split("the cat sat on a mat and ran far away from home today Zürich café naïve", w, " ");
  for (d = 0; d < 300; d++) { for (l = 0; l < 1 + d % 4; l++) { s = "";
    for (k = 0; k < 5 + (d * 7 + l) % 20; k++) s = s (k ? " " : "") w[1 + int(rand() * 16)];
    print s "." } print "" } }' > "$dir/corpus/a.txt"
head -n 200 "$dir/corpus/a.txt" > "$dir/corpus/sub/b.txt"

out=$("$sk" data vocab --corpus "$dir/corpus" --size 120 --out "$dir/v.txt" 2>&1); rc=$?
check "vocab exits 0" test $rc -eq 0
check "vocab reports what it wrote" grep -q "wrote $dir/v.txt: [0-9]* tokens" <<<"$out"
check "vocab.txt starts [PAD] [UNK] [CLS] [SEP] [MASK] (compact layout)" \
    test "$(head -n 5 "$dir/v.txt" | tr '\n' ' ')" = "[PAD] [UNK] [CLS] [SEP] [MASK] "
check "vocab has ## pieces" grep -q '^##' "$dir/v.txt"
"$sk" data vocab --corpus "$dir/corpus" --size 120 --out "$dir/v2.txt" >/dev/null 2>&1
check "vocab is deterministic" cmp -s "$dir/v.txt" "$dir/v2.txt"
json=$("$sk" data vocab --corpus "$dir/corpus/a.txt" --size 1000 --out "$dir/vb.txt" --json); rc=$?
check "vocab --json" bash -c 'test $0 -eq 0 && grep -q "\"vocab_hash\"" <<<"$1"' $rc "$json"
check "BERT layout at 1000: [UNK] on line 101" test "$(sed -n 101p "$dir/vb.txt")" = "[UNK]"

out=$("$sk" data prepare --vocab "$dir/v.txt" --in "$dir/corpus" --out "$dir/s.shard" --seq 32 2>&1); rc=$?
check "prepare exits 0" test $rc -eq 0
check "prepare reports sequences" grep -q "wrote $dir/s.shard: [0-9]* sequences" <<<"$out"
json=$("$sk" data inspect "$dir/s.shard" --json); rc=$?
check "inspect --json exits 0" test $rc -eq 0
docs=$(grep -o '"documents": [0-9]*' <<<"$json" | grep -o '[0-9]*$')
paras=$(( $(awk 'BEGIN { RS = "" } END { print NR }' "$dir/corpus/a.txt") + $(awk 'BEGIN { RS = "" } END { print NR }' "$dir/corpus/sub/b.txt") ))
check "inspect counts one document per paragraph ($paras)" test "$docs" = "$paras"
check "inspect decodes text" grep -q '"text": "\[CLS\] the\|"text": "\[CLS\] [a-z]' <<<"$json"
vh=$(grep -o '"vocab_hash": "[0-9a-f]*"' <<<"$json" | grep -o '[0-9a-f]\{64\}')
ph=$(grep -o 'vocabulary hash [0-9a-f]*' <<<"$out" | grep -o '[0-9a-f]\{64\}')
check "inspect shows the vocabulary hash prepare printed" test -n "$vh" -a "$vh" = "$ph"
out=$("$sk" data inspect "$dir/s.shard"); rc=$?
check "inspect text shows header and sequences" bash -c 'test $0 -eq 0 && grep -q "^sequences:" <<<"$1" && grep -q "^sequence 0" <<<"$1"' $rc "$out"

# damage: each refused with exit 1 and a reason
size=$(stat -c %s "$dir/s.shard")
head -c $((size - 10)) "$dir/s.shard" > "$dir/t.shard"
err=$("$sk" data inspect "$dir/t.shard" 2>&1); rc=$?
check "truncated shard refused" bash -c 'test $0 -eq 1 && grep -q "skyloom data inspect: shard .* refused: truncated" <<<"$1"' $rc "$err"
cp "$dir/s.shard" "$dir/c.shard"
printf '\x55' | dd of="$dir/c.shard" bs=1 seek=$((size / 2)) conv=notrunc status=none
cmp -s "$dir/s.shard" "$dir/c.shard" || true
err=$("$sk" data inspect "$dir/c.shard" 2>&1); rc=$?
check "corrupted shard refused" bash -c 'test $0 -eq 1 && grep -q "checksum mismatch" <<<"$1"' $rc "$err"

# input errors
printf 'good line\nbad \xff byte\n' > "$dir/bad.txt"
err=$("$sk" data prepare --vocab "$dir/v.txt" --in "$dir/bad.txt" --out "$dir/x.shard" --seq 32 2>&1); rc=$?
check "invalid UTF-8: exit 1, file and byte offset named" bash -c 'test $0 -eq 1 && grep -q "bad.txt: invalid UTF-8 at byte offset 14 (line 2)" <<<"$1"' $rc "$err"
check "no shard left behind after a failure" test ! -e "$dir/x.shard"
err=$("$sk" data prepare --vocab "$dir/nope.txt" --in "$dir/corpus" --out "$dir/x.shard" --seq 32 2>&1); rc=$?
check "missing vocab: exit 1" bash -c 'test $0 -eq 1 && grep -q "nope.txt" <<<"$1"' $rc "$err"
printf '[PAD]\n[UNK]\nx\nx\n' > "$dir/dup.txt"
err=$("$sk" data prepare --vocab "$dir/dup.txt" --in "$dir/corpus" --out "$dir/x.shard" --seq 32 2>&1); rc=$?
check "duplicate token in vocab: exit 1" bash -c 'test $0 -eq 1 && grep -q "duplicate token" <<<"$1"' $rc "$err"
err=$("$sk" data prepare --vocab "$dir/v.txt" --in "$dir/corpus" --out "$dir/x.shard" --seq 1 2>&1); rc=$?
check "--seq 1: usage error (exit 2)" bash -c 'test $0 -eq 2 && grep -q "\-\-seq must be between" <<<"$1"' $rc "$err"
err=$("$sk" data vocab --corpus "$dir/corpus" --out "$dir/x.txt" 2>&1); rc=$?
check "vocab without --size: exit 2" test $rc -eq 2
err=$("$sk" data frob 2>&1); rc=$?
check "unknown subcommand: exit 2" bash -c 'test $0 -eq 2 && grep -q "unknown subcommand" <<<"$1"' $rc "$err"
"$sk" data --help | grep -q 'skyloom data vocab'; check "data --help" test $? -eq 0
"$sk" help data | grep -q 'skyloom data prepare'; check "help data" test $? -eq 0

# tokenize: one line of ids per input line, with a hand-written vocabulary
printf '[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\ncat\nsat\n.\nun\n##able\n##s\ncafe\nCafe\n' > "$dir/tv.txt"
printf 'The cat sat.\n\nunable unables xyz\r\nCAFÉ cat' > "$dir/t1.txt"
printf 'sat\n' > "$dir/t2.txt"
out=$("$sk" data tokenize --vocab "$dir/tv.txt" "$dir/t1.txt" "$dir/t2.txt"); rc=$?
check "tokenize: ids per line, empty line kept, CRLF, unknown word, accents stripped, files in order" \
    test $rc -eq 0 -a "$out" = "$(printf '5 6 7 8\n\n9 10 9 10 11 1\n12 6\n7')"
check "tokenize: standard input gives the same" test "$("$sk" data tokenize --vocab "$dir/tv.txt" < "$dir/t1.txt")" = "$("$sk" data tokenize --vocab "$dir/tv.txt" "$dir/t1.txt")"
check "tokenize: '-' is standard input" test "$("$sk" data tokenize --vocab "$dir/tv.txt" "$dir/t1.txt" - < "$dir/t2.txt")" = "$out"
out=$(printf 'Cafe cat\n' | "$sk" -q data tokenize --vocab "$dir/tv.txt" --cased); rc=$?
check "tokenize --cased keeps case" test $rc -eq 0 -a "$out" = "13 6"
printf 'cat\nsat \xc3 the\n' > "$dir/tbad.txt"
err=$("$sk" data tokenize --vocab "$dir/tv.txt" "$dir/t2.txt" "$dir/tbad.txt" 2>&1 >/dev/null); rc=$?
check "tokenize: invalid UTF-8 refused with file, offset and line" bash -c 'test $0 -eq 1 && grep -q "skyloom data tokenize: .*tbad.txt: invalid UTF-8 at byte offset 8 (line 2)" <<<"$1"' $rc "$err"
err=$("$sk" data tokenize "$dir/t1.txt" 2>&1); rc=$?
check "tokenize without --vocab: exit 2" bash -c 'test $0 -eq 2 && grep -q "\-\-vocab is required" <<<"$1"' $rc "$err"
err=$("$sk" data tokenize --vocab "$dir/tv.txt" "$dir/none.txt" 2>&1); rc=$?
check "tokenize: a missing file is refused" bash -c 'test $0 -eq 1 && grep -q "cannot open .*none.txt" <<<"$1"' $rc "$err"
err=$("$sk" data tokenize --vocab "$dir/tv.txt" --frob 2>&1); rc=$?
check "tokenize: unknown option: exit 2" test $rc -eq 2
"$sk" data tokenize --help | grep -q 'skyloom data tokenize'; check "data tokenize --help" test $? -eq 0

# the demo corpus, when its package is installed
if [ -d /usr/share/games/fortunes ] && "$demo" "$dir/demo.txt" 2>/dev/null; then
    "$sk" -q data vocab --corpus "$dir/demo.txt" --size 4096 --out "$dir/dv.txt" >/dev/null; rc=$?
    check "demo corpus: vocab" test $rc -eq 0
    "$sk" -q data prepare --vocab "$dir/dv.txt" --in "$dir/demo.txt" --out "$dir/d.shard" --seq 128 >/dev/null; rc=$?
    check "demo corpus: prepare" test $rc -eq 0
    n=$("$sk" data inspect "$dir/d.shard" --json | grep -o '"sequences": [0-9]*' | grep -o '[0-9]*$')
    check "demo corpus: more than 10000 sequences" test "${n:-0}" -gt 10000
else
    echo "note: demo corpus not available (Debian package fortunes); generated text only"
fi
exit $fail
