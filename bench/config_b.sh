#!/usr/bin/env bash
# Config (b) (L4 H256 A4 F1024 V8192) and a shard for it, as the benchmarks
# use them: DIR/b.json and DIR/b.shard (sequences of SEQ tokens from the
# fortunes corpus, or generated text where the fortunes package is missing,
# an 8192-token vocabulary in DIR/vocab.txt).
# usage: config_b.sh SKYLOOM DIR SEQ
set -euo pipefail
sk=${1:?usage: config_b.sh SKYLOOM DIR SEQ} dir=${2:?usage: config_b.sh SKYLOOM DIR SEQ}
seq=${3:?usage: config_b.sh SKYLOOM DIR SEQ}
here=$(cd "$(dirname "$0")" && pwd)
if ! "$here/../scripts/demo-corpus.sh" "$dir/corpus.txt" 2>/dev/null; then
  echo "demo corpus not available (Debian package fortunes): using generated text" >&2
  awk 'BEGIN { srand(1); for (i = 0; i < 400000; i++) printf "%s%s", substr("the quick brown fox jumps over lazy dogs", 1 + int(rand() * 30), 1 + int(rand() * 8)), (i % 12 ? " " : ".\n") }' > "$dir/corpus.txt"
fi
"$sk" -q data vocab --corpus "$dir/corpus.txt" --size 8192 --out "$dir/vocab.txt" >/dev/null
"$sk" -q data prepare --vocab "$dir/vocab.txt" --in "$dir/corpus.txt" --out "$dir/b.shard" --seq "$seq" >/dev/null
cp "$here/../configs/bert-b.json" "$dir/b.json"
