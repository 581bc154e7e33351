#!/usr/bin/env bash
# Tokenizer throughput on the demo corpus (Debian package fortunes); on
# generated text when the package is missing. usage: bench_tok.sh BENCH_TOK DEMO_CORPUS_SH
set -eu
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
if ! "$2" "$dir/demo.txt" 2>/dev/null; then
    echo "demo corpus not available (Debian package fortunes): using generated text"
    awk 'BEGIN { srand(1); for (i = 0; i < 400000; i++) printf "%s%s", substr("the quick brown fox jumps over lazy dogs", 1 + int(rand() * 30), 1 + int(rand() * 8)), (i % 12 ? " " : ".\n") }' > "$dir/demo.txt"
fi
exec "$1" "$dir/demo.txt" 7
